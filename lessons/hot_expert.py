"""Step time follows the busiest GPU: an MoE layer at real size on symbolic ranks, timed on the clock, under
three routings at EP 4 and EP 8. Every GPU waits in the all-to-all for the slowest one, so the layer lasts
as long as the GPU whose experts got the most (token, expert) pairs takes.

Uniform routing spreads pairs about evenly; skewed routing sends half of the tokens to expert 0 first
(a hot expert); balanced routing spreads every token's picks evenly, as DeepSeek-V3's bias terms aim to.
The more GPUs share the experts, the fewer experts each holds, and the larger the hot expert's share of
its GPU's work: the same hot expert stalls more of the step at EP 8 than at EP 4.
"""
from __future__ import annotations

import numpy as np

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.estimate.hardware import GPUS
from parasim.estimate.kernels import gemm_efficiency
from parasim.lesson import Check, Lesson, Picture, Table, check
from parasim.render.plot_lessons import plot_hot_expert
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing

T = 4096  # tokens each GPU routes
D = 7168  # hidden size (DeepSeek-V3's)
E, K = 64, 8  # experts, picks per token
F = 2048  # an expert's width
WORLD, GPU = 8, "h200"
EPS = (4, 8)
ROUTINGS = ("uniform", "skewed:0.5", "balanced")
POLICIES = {r: Routing.parse(r) for r in ROUTINGS}  # one per run: each sender's draws made once


def phase(routing: str, ep: int) -> str:
    return f"{routing} routing, EP {ep}"


def program(ctx):
    out = {}
    for ep in EPS:
        groups = [ctx.new_group(range(first, first + ep), "ep") for first in range(0, WORLD, ep)]
        group = groups[ctx.rank // ep]
        for routing in ROUTINGS:
            ctx.phase(phase(routing, ep), ep=ep, routing=routing)
            tp = ParallelContext(ctx, None, ep_group=group, options=LayerOptions(routing=POLICIES[routing]))
            draw = ctx.shared_rng
            name = f"moe.{routing}.ep{ep}"
            experts = [{"w1": draw(f"{name}.{e}.w1").normal((D, F)), "w2": draw(f"{name}.{e}.w2").normal((F, D))}
                       for e in range(E)]
            moe = MoE(tp, group, draw(f"{name}.router").normal((D, E)), experts, K, name=name)
            saved = Saved()
            y, cache = moe.forward(ctx.shared_rng(f"x{ctx.rank}").normal((T, D)), saved)
            moe.backward(cache, y)
    return out


def pairs_by_hand(routing: str, ep: int) -> list[list[int]]:
    """(token, expert) pairs each expert of each GPU works on, from the policy's own draws: per GPU, its E/ep
    experts' counts."""
    policy, per = Routing.parse(routing), E // ep
    out = [[0] * per for _ in range(WORLD)]
    for first in range(0, WORLD, ep):
        for r in range(first, first + ep):
            picks = policy.choose(f"moe.{routing}.ep{ep}#0", r, (r - first) * T, T, E, K)
            for e, n in zip(*np.unique(picks, return_counts=True)):
                out[first + int(e) // per][int(e) % per] += int(n)
    return out


def product(m: int, n: int, k: int) -> float:
    """Seconds of one (m x k) @ (k x n) product on the GPU, at the share of peak the kernel table measures for
    its shape."""
    return 2 * m * n * k / (GPUS[GPU].peak_flops.value * gemm_efficiency(GPU, m, n, k).value)


def compute_by_hand(rows: list[int]) -> float:
    """A GPU's compute in one phase: the router (its scores forward, then the tokens' and its own gradients) and
    each of its experts on its rows (w1 and w2 forward; backward, each one's input gradient and weight gradient),
    each product at its own shape."""
    router = product(T, E, D) + product(T, D, E) + product(D, E, T)
    experts = sum(product(n, F, D) + product(n, D, F)  # forward: x w1, a w2
                  + product(n, F, D) + product(F, D, n)  # backward through w2: da, w2's gradient
                  + product(n, D, F) + product(D, F, n)  # backward through w1: dx, w1's gradient
                  for n in rows if n)
    return router + experts


def study(result) -> dict:
    trace = result.trace
    tl = simulate(trace, machine(GPU))
    rows = {}
    for ep in EPS:
        for routing in ROUTINGS:
            p = phase(routing, ep)
            per_rank = [by_phase(trace, tl, r)[p] for r in range(WORLD)]
            compute = [x["compute"] for x in per_rank]
            busiest = max(range(WORLD), key=lambda r: (compute[r], -r))
            experts = pairs_by_hand(routing, ep)
            rows[p] = {"compute": compute, "busiest": busiest, "time": max(x["end"] for x in per_rank)
                       - min(x["start"] for x in per_rank), "pairs": [sum(n) for n in experts], "experts": experts}
    return {"tl": tl, "rows": rows}


def tables(result, s) -> list[Table]:
    rows = []
    for ep in EPS:
        for routing in ROUTINGS:
            r = s["rows"][phase(routing, ep)]
            c = r["compute"]
            wait = max(c) - float(np.mean(c))
            rows.append((phase(routing, ep), [f"g{r['busiest']}", max(r["pairs"]), round(float(np.mean(r["pairs"]))),
                                              round(max(c) * 1e3, 2), round(float(np.mean(c)) * 1e3, 2),
                                              round(r["time"] * 1e3, 2), round(wait * 1e3, 2),
                                              f"{wait / r['time']:.1%}"]))
    return [Table(f"One MoE layer ({E} experts of width {F:,}, top {K}, d = {D:,}; {T:,} tokens per GPU), forward "
                  f"and backward, on {GPUS[GPU].name}s (ms = milliseconds on the clock)",
                  ["routing, EP", "busiest GPU", "its pairs", "mean pairs", "its compute (ms)", "mean compute (ms)",
                   "layer (ms)", "others wait (ms)", "of the layer"], rows,
                  notes=["pairs: (token, expert) pairs a GPU's experts work on, from the routing policy's own draws. "
                         "The layer ends when the last GPU has sent its experts' outputs back, so it lasts about as "
                         "long as the busiest GPU computes, plus the all-to-alls; the others wait the difference "
                         "between its compute and theirs (the mean's, here).",
                         "Balanced routing sends more bytes than uniform: it puts a token's picks on as many GPUs as "
                         "it can, and a token travels once to each GPU holding one of its picks, so its all-to-alls "
                         "take longer though nobody waits."])]


def checks(result, s) -> list[Check]:
    rows = s["rows"]
    skew = {ep: rows[phase("skewed:0.5", ep)] for ep in EPS}
    ratio = {ep: max(r["compute"]) / float(np.mean(r["compute"])) for ep, r in skew.items()}
    stall = {ep: (max(r["compute"]) - float(np.mean(r["compute"]))) / r["time"] for ep, r in skew.items()}
    return [
        check("the busiest GPU's compute on the clock in each phase, by hand: its router and each of its experts "
              "(w1 and w2, forward and backward), every product at the share of the peak the kernel table measures "
              "for its shape (and every other GPU's too)",
              [max(r["compute"]) for r in rows.values()],
              [max(compute_by_hand(n) for n in r["experts"]) for r in rows.values()], rtol=1e-9),
        check("... every GPU of every phase within a millionth", max(abs(c / compute_by_hand(n) - 1)
                                                                    for r in rows.values()
                                                                    for c, n in zip(r["compute"], r["experts"])) < 1e-6,
              True),
        check("under skewed routing the busiest GPU, at EP 4 then EP 8, is one that holds the hot expert 0 (at EP 4 "
              f"each EP group has its own: {' or '.join(_holder_names(4))}; at EP 8, {' or '.join(_holder_names(8))})",
              [f"g{skew[ep]['busiest']}" for ep in EPS],
              [f"g{skew[ep]['busiest']}" if f"g{skew[ep]['busiest']}" in _holder_names(ep)
               else " or ".join(_holder_names(ep)) for ep in EPS]),
        check("the layer lasts longer than the busiest GPU's compute (every GPU waits for it in the all-to-all)",
              all(r["time"] > max(r["compute"]) for r in rows.values()), True),
        check("balanced routing gives every GPU the same pairs (busiest / mean = 1 at EP 4 and EP 8)",
              [max(rows[phase("balanced", ep)]["pairs"]) / float(np.mean(rows[phase("balanced", ep)]["pairs"]))
               for ep in EPS], [1.0, 1.0]),
        check("under skewed routing the busiest GPU's time grows with EP (the hot expert's GPU holds fewer "
              "experts, so the hot one is more of its work), while the mean GPU's does not (at EP 8 each expert "
              "of a GPU gets more rows, and its larger products run nearer the peak)",
              [max(skew[8]["compute"]) > max(skew[4]["compute"]),
               float(np.mean(skew[8]["compute"])) <= float(np.mean(skew[4]["compute"]))], [True, True]),
        check("the hot expert stalls more of the step as EP grows: the busiest GPU's compute over the mean is "
              "larger at EP 8 than at EP 4", ratio[8] > ratio[4], True),
        check("... and the share of the layer the other GPUs spend waiting for it grows with EP",
              stall[8] > stall[4], True),
    ]



def _holder_names(ep: int) -> list[str]:
    """The GPUs that hold expert 0 at EP `ep` on the lesson's GPUs: the first of each EP group."""
    return [f"g{g * ep}" for g in range(WORLD // ep)]


def _holders(ep: int) -> str:
    """Which GPUs hold expert 0 at EP `ep` on the lesson's GPUs, in words: one per EP group."""
    groups = WORLD // ep
    if groups == 1:
        return "Here one EP group spans every GPU: g0 holds expert 0."
    names = _holder_names(ep)
    firsts = ", ".join(names[:-1]) + " and " + names[-1]
    return (f"Here {groups} EP groups of {ep} GPUs each hold their own experts, so expert 0 is on {firsts}; the "
            "table names the busier.")


NARRATIVE = {
    **{phase("uniform", ep): f"""
        {E} experts over EP {ep}: {E // ep} on each GPU. Every GPU routes its {T:,} tokens, {K} picks each, by
        uniform draws: about the same number of pairs lands on every GPU, and every GPU computes for about
        as long.""" for ep in EPS},
    **{phase("skewed:0.5", ep): f"""
        Half of the tokens put expert 0 first: a hot expert. The GPU that holds it works on far more
        pairs than the others, and the all-to-all that brings the outputs back cannot finish before it does.
        {_holders(ep)} At EP {ep} that GPU holds {E // ep} experts, so the hot one is
        {'a larger' if ep == 8 else 'a'} share of its work.""" for ep in EPS},
    **{phase("balanced", ep): """
        Every token's picks spread evenly over the experts, as DeepSeek-V3's per-expert bias terms steer its
        router to: every GPU gets the same pairs, and nobody waits.""" for ep in EPS},
}

LESSON = Lesson(
    name="hot-expert", title="Step time follows the busiest GPU: one hot expert at EP 4 and EP 8, on the clock",
    section="Expert parallelism: step time follows the busiest GPU (on the clock)",
    order=180,
    picture=Picture(plot_hot_expert, "each GPU's expert compute by routing and EP size, the busiest marked"),
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic",
    summary="An MoE layer at real size under uniform, skewed and balanced routing at EP 4 and 8: the busiest "
            "GPU sets the layer's time, and a hot expert costs more as EP grows",
)

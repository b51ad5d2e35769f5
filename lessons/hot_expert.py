"""Step time follows the busiest GPU: an MoE layer at real size on symbolic ranks, timed on the clock, under
three routings at EP 4 and EP 8. Every GPU waits in the all-to-all for the slowest one, so the layer lasts
as long as the GPU whose experts got the most (token, expert) pairs takes.

Uniform routing spreads pairs about evenly; skewed routing sends half of the tokens to expert 0 first
(a hot expert); balanced routing gives every expert the same pairs by spacing each token's picks E/k apart.
The more GPUs share the experts, the fewer experts each holds, and the larger the hot expert's share of
its GPU's work: the same hot expert stalls more of the step at EP 8 than at EP 4.

Balanced routing's even load has a price the table counts: its spaced picks put every token on every GPU of
its EP group, and a token is sent once to each GPU holding one of its picks, so its all-to-alls carry more
than uniform's, whose random picks often share a GPU. A fourth policy, biased:0.5 (DeepSeek-V3's per-expert
bias, nn/routing.py), is drawn but not timed: on the skewed tokens, it brings the hot expert back to the
mean load.
"""
from __future__ import annotations

from math import comb

import numpy as np

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.estimate.hardware import GPUS
from parasim.estimate.kernels import gemm_efficiency
from parasim.lesson import Check, Lesson, Picture, Table, check
from parasim.render.plot_lessons import plot_hot_expert
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing, learned_bias

T = 4096  # tokens each GPU routes
D = 7168  # hidden size (DeepSeek-V3's)
E, K = 64, 8  # experts, picks per token
F = 2048  # an expert's width
WORLD, GPU = 8, "h200"
EPS = (4, 8)
ROUTINGS = ("uniform", "skewed:0.5", "balanced")
POLICIES = {r: Routing.parse(r) for r in ROUTINGS}  # one per run: each sender's draws made once
EVENED = "biased:0.5"  # skewed:0.5's tokens under DeepSeek-V3's balancing bias: drawn, not run


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


def _draws(routing: str, ep: int):
    """(the EP group's first GPU, a GPU's place in it, its [T, K] picks) for every GPU, from the policy's draws:
    the key, tokens and experts the MoE layer asks it for."""
    policy = Routing.parse(routing)
    for first in range(0, WORLD, ep):
        for r in range(first, first + ep):
            yield first, r - first, policy.choose(f"moe.{routing}.ep{ep}#0", r, (r - first) * T, T, E, K)


def visits_by_hand(routing: str, ep: int) -> tuple[float, float]:
    """The GPUs a token's K picks land on, on average, and how many of them are not its own: a token is sent
    once to each GPU that holds one of its picks (the dispatch's rows), counted from the policy's draws."""
    per, gpus, away = E // ep, 0, 0
    for _, me, picks in _draws(routing, ep):
        on = np.sort(picks // per, axis=1)  # the place in the EP group of the GPU holding each pick
        distinct = 1 + (np.diff(on, axis=1) != 0).sum(axis=1)
        gpus += int(distinct.sum())
        away += int(distinct.sum() - (on == me).any(axis=1).sum())
    return gpus / (WORLD * T), away / (WORLD * T)


def loads_by_hand(routing: str, ep: int) -> tuple[list[int], list[int]]:
    """(token, expert) pairs of each expert, summed over every EP group, and of each GPU, from the draws."""
    experts, per = np.zeros(E, dtype=np.int64), E // ep
    gpus = np.zeros(WORLD, dtype=np.int64)
    for first, _, picks in _draws(routing, ep):
        n = np.bincount(picks.ravel(), minlength=E)
        experts += n
        gpus[first:first + ep] += n.reshape(ep, per).sum(axis=1)
    return [int(x) for x in experts], [int(x) for x in gpus]


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
            a2a = sum(m.sent for e in trace.events if e.phase == p and e.op == "all_to_all" for m in e.members)
            rows[p] = {"compute": compute, "busiest": busiest, "time": max(x["end"] for x in per_rank)
                       - min(x["start"] for x in per_rank), "pairs": [sum(n) for n in experts], "experts": experts,
                       "a2a": a2a, "visits": visits_by_hand(routing, ep)}
    evened = {}
    for routing in ("skewed:0.5", EVENED):
        for ep in EPS:
            experts, gpus = loads_by_hand(routing, ep)
            evened[(routing, ep)] = {"expert 0": experts[0] / float(np.mean(experts)),
                                     "busiest": max(gpus) / float(np.mean(gpus)),
                                     "visits": visits_by_hand(routing, ep)[0]}
    bias = learned_bias(POLICIES["skewed:0.5"].seed, Routing.parse(EVENED).hot, E, K)
    return {"tl": tl, "rows": rows, "evened": evened, "bias": (float(bias[0]), float(np.mean(bias[1:])))}


def tables(result, s) -> list[Table]:
    rows = []
    for ep in EPS:
        for routing in ROUTINGS:
            r = s["rows"][phase(routing, ep)]
            c = r["compute"]
            wait = max(c) - float(np.mean(c))
            rows.append((phase(routing, ep), [f"g{r['busiest']}", max(r["pairs"]), round(max(c) * 1e3, 2),
                                              round(float(np.mean(c)) * 1e3, 2), round(r["time"] * 1e3, 2),
                                              round(wait * 1e3, 2),
                                              f"{wait / r['time']:.1%}", round(r["visits"][0], 2),
                                              round(r["a2a"] / 1e9, 2)]))
    return [Table(f"One MoE layer ({E} experts of width {F:,}, top {K}, d = {D:,}; {T:,} tokens per GPU), forward "
                  f"and backward, on {GPUS[GPU].name}s (ms = milliseconds on the clock)",
                  ["routing, EP", "busiest GPU", "its pairs", "its compute (ms)", "mean compute (ms)",
                   "layer (ms)", "others wait (ms)", "of the layer", "GPUs a token visits", "sent (GB)"], rows,
                  notes=["pairs: (token, expert) pairs a GPU's experts work on, from the routing policy's own draws "
                         f"(the mean GPU's: {_mean_pairs(s['rows'])}). The layer ends when the last GPU has sent its "
                         "experts' outputs back, so it lasts about as long as the busiest GPU computes, plus the "
                         "all-to-alls; the others wait the difference "
                         "between its compute and theirs (the mean's, here).",
                         _why_balanced_sends_more(s["rows"]), _evened(s)])]


def _mean_pairs(rows: dict) -> str:
    """The mean GPU's pairs, said once where every phase has the same (T K tokens' picks over the GPUs)."""
    means = sorted({round(float(np.mean(r["pairs"]))) for r in rows.values()})
    return f"{means[0]:,} in every phase" if len(means) == 1 else f"{means[0]:,} to {means[-1]:,} by phase"


def _why_balanced_sends_more(rows: dict) -> str:
    """Balanced against uniform, at each EP: the layer's time, the GPUs a token visits, the all-to-all bytes."""
    said = []
    for ep in EPS:
        u, b = rows[phase("uniform", ep)], rows[phase("balanced", ep)]
        said.append(f"at EP {ep} ({E // ep} experts a GPU) a token visits {b['visits'][0]:g} GPUs against "
                    f"{u['visits'][0]:.2f} ({b['visits'][1]:g} against {u['visits'][1]:.2f} other than its own): "
                    f"{b['a2a'] / u['a2a']:.2f}x the bytes, {b['time'] * 1e3:.2f} ms against {u['time'] * 1e3:.2f}")
    return ("GPUs a token visits: a token is sent once to each GPU that holds one of its picks (counted from the "
            "policy's draws); sent: every GPU's bytes in the layer's four all-to-alls (the trace). Why balanced "
            f"routing is slower than uniform though nobody waits: it spaces a token's {K} picks {E // K} experts "
            "apart, so they land on every GPU of the EP group, where uniform's random picks often share a GPU; "
            + "; ".join(said) + ". 'Balanced' is this round-robin spreading, not load balancing in general: "
            f"{EVENED}, next, evens the load without it."
            )


def _evened(s: dict) -> str:
    """biased:0.5 against skewed:0.5, from the policies' draws: the hot expert's pairs, the busiest GPU's and
    the GPUs a token visits."""
    ev = s["evened"]
    hot, rest = s["bias"]
    busiest = " and ".join(f"{ev[(EVENED, ep)]['busiest']:.2f}x" + (" the mean pairs" if ep == EPS[0] else "")
                           + f" at EP {ep}" for ep in EPS)
    was = " and ".join(f"{ev[('skewed:0.5', ep)]['busiest']:.2f}x" for ep in EPS)
    visits = " and ".join(f"{ev[(EVENED, ep)]['visits']:.2f}" for ep in EPS)
    return (f"{EVENED} (drawn, not timed): skewed:0.5's tokens choosing after DeepSeek-V3's per-expert bias, "
            "trained by its rule (lowered while an expert is over the mean load, raised while under): it ends at "
            f"{hot:+.2f} for expert 0, {rest:+.2f} for the others on average. The busiest GPU gets "
            f"{busiest} (skewed: {was}); at EP 8 expert 0 gets {ev[(EVENED, 8)]['expert 0']:.2f}x the mean "
            f"expert's pairs (skewed: {ev[('skewed:0.5', 8)]['expert 0']:.2f}x). Each token still takes its own "
            f"best experts, so it visits {visits} GPUs at EP 4 and 8, as uniform's do, not balanced's all: the "
            "load is even without spreading any token's picks.")


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
        check("balanced routing's layer lasts longer than uniform's at EP 4 and EP 8, though no GPU waits for it",
              [rows[phase("balanced", ep)]["time"] > rows[phase("uniform", ep)]["time"] for ep in EPS], [True, True]),
        check("balanced routing's all-to-all bytes over uniform's, from the trace, at EP 4 then EP 8, are the "
              "GPUs other than its own that a token visits under each, counted from the policies' draws",
              [rows[phase("balanced", ep)]["a2a"] / rows[phase("uniform", ep)]["a2a"] for ep in EPS],
              [rows[phase("balanced", ep)]["visits"][1] / rows[phase("uniform", ep)]["visits"][1] for ep in EPS],
              rtol=1e-12),
        check(f"balanced routing's picks, {E // K} experts apart, reach every GPU of the EP group (min(k, EP)); "
              "uniform's about EP (1 - C(E - E/EP, k) / C(E, k)), the chance a GPU holds none of k random picks "
              "taken away", [round(rows[phase(r, ep)]["visits"][0], 2) for r in ("balanced", "uniform") for ep in EPS],
              [float(min(K, ep)) for ep in EPS]
              + [round(ep * (1 - comb(E - E // ep, K) / comb(E, K)), 2) for ep in EPS],
              atol=0.02),
        check(f"{EVENED}: DeepSeek-V3's per-expert bias brings the busiest GPU within 2% of the mean pairs at EP 4 "
              "and EP 8 (skewed:0.5 alone: far above)",
              [s["evened"][(r, ep)]["busiest"] < 1.02 for r in (EVENED, "skewed:0.5") for ep in EPS],
              [True, True, False, False]),
        check(f"... while each token keeps its own best picks: {EVENED} visits as many GPUs a token as uniform "
              "routing, within 0.05", [round(s["evened"][(EVENED, ep)]["visits"], 2) for ep in EPS],
              [round(rows[phase("uniform", ep)]["visits"][0], 2) for ep in EPS], atol=0.05),
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
    **{phase("balanced", ep): f"""
        Every token's picks spread round-robin over the experts, {E // K} apart: that spreading is all that
        'balanced' names here. Every GPU gets the same pairs and nobody waits, but a token's picks land on
        every GPU of its EP group, so it is sent to each of them. Evening the load does not need that:
        DeepSeek-V3's bias per expert ({EVENED} in the table's notes) evens it while each token keeps its own
        best experts, and so reaches no more GPUs than under uniform routing. The EP {EPS[-1]} phase shows
        what the spreading costs.""" for ep in EPS},
    phase("balanced", EPS[-1]): f"""
        Balanced again, now over {EPS[-1]} GPUs of {E // EPS[-1]} experts each. A token's {K} picks lie
        {E // K} experts apart, one on every GPU, so every token travels to all {EPS[-1]}: nobody waits, yet
        the layer takes longer than under uniform routing, whose random picks often share a GPU and so
        reach fewer. The table's last two columns count the GPUs and the bytes. Spacing the picks is not what
        DeepSeek-V3 does: its per-expert bias evens the experts' load while each token keeps its own best
        picks ({EVENED}, in the table's notes).""",
}

LESSON = Lesson(
    name="hot-expert", title="Step time follows the busiest GPU: one hot expert at EP 4 and EP 8, on the clock",
    section="Expert parallelism: step time follows the busiest GPU (on the clock)",
    order=180,
    picture=Picture(plot_hot_expert, "each GPU's expert compute by routing and EP size, the busiest marked, "
                    "and the layer's time on the clock"),
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic",
    # each phase's dispatch on its first EP group, the layer's other all-to-alls counted (the table has the bytes)
    events_shown=1,
    summary="An MoE layer at real size under uniform, skewed and balanced routing at EP 4 and 8: the busiest "
            "GPU sets the layer's time, and a hot expert costs more as EP grows",
)

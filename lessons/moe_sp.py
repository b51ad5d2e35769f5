"""Why an MoE layer under TP needs SP: without it both TP ranks hold the same tokens, route them the same
way and dispatch them twice, so the experts do the work twice. Measured on the second half of sequence A
("the contract was void") with its TP pair, the experts split over the same two GPUs."""
from __future__ import annotations

import numpy as np

from parasim.lesson import Check, Knob, Lesson, check
from parasim.examples.moe16 import SEQUENCES, SHAPE, embed, scripted
from parasim.nn import ParallelContext, Saved, Shard
from parasim.layout.placement import assemble
from parasim.nn.layer import expert_weights, layer_weights
from parasim.nn.moe import MoE

HALF = slice(4, 8)  # t5..t8, the CP half that g2 and g3 share in the 16-GPU example


def _block(ctx, tp: ParallelContext) -> MoE:
    """Layer 1's MoE block of the 16-GPU example, experts split over the TP pair."""
    w = layer_weights(ctx, SHAPE, "L0")
    return MoE(tp, tp.tp_group, w["router"], expert_weights(w, SHAPE), SHAPE.top_k, name="moe")


def _copies(saved: Saved) -> int:
    """(token, expert) pairs this rank's experts computed: the rows each expert ran on, summed."""
    return sum(n for _, name, n, _ in saved.items if name == "activation input") // SHAPE.ffn_size


def program(ctx):
    group = ctx.new_group(range(ctx.world), "tp")
    x = embed(ctx, "A")[HALF]  # [4, 1, h]: the tokens after attention's output projection
    out = {}
    for phase, sp in (("without SP", False), ("with SP", True)):
        ctx.phase(phase)
        tp = ParallelContext(ctx, group, sp=sp, ep_group=group)
        moe = _block(ctx, tp)
        n = x.shape[0] // ctx.world
        mine = x[ctx.rank * n:(ctx.rank + 1) * n] if sp else x  # SP: a reduce-scatter left each rank its share
        # --routing post: the post's drawn experts for 'the' and 'contract', the router's for the rest
        first = HALF.start + (ctx.rank * n if sp else 0)
        moe.gate.scripted = scripted("A", list(range(first, first + mine.shape[0])), ctx.knobs.get("routing", "post"))
        saved = Saved()
        y, _ = moe.forward(mine, saved)
        words = [SEQUENCES["A"][4 + (ctx.rank * n if sp else 0) + i] for i in range(mine.shape[0])]
        per = SHAPE.experts // ctx.world  # experts a GPU holds, in order: E1-E4 on g0 at --tp 2
        sends = "; ".join(f"'{w}' to " + ", ".join(f"E{e + 1} on g{e // per}" for e, _ in picks)
                          for w, picks in zip(words, moe.last_routing))
        ctx.note(f"routes {sends}; its experts computed {_copies(saved)} (token, expert) pairs")
        out[phase] = {"copies": _copies(saved), "y": y, "tokens": mine.shape[0]}
    return out


def checks(result) -> list[Check]:
    v, t = result.values, result.world
    n = v[0]["without SP"]["tokens"]  # tokens of the half, which without SP every rank holds
    copies = {p: sum(x[p]["copies"] for x in v) for p in ("without SP", "with SP")}
    # rows handed to the dispatch all-to-all, to every GPU including itself (the wire skips those)
    rows = {p: sum(c.shape[0] for e in result.trace.events if e.phase == p and "dispatch" in (e.label or "")
                   for m in e.members for c in m.ins) for p in copies}
    sent = {p: sum(m.sent for e in result.trace.events if e.op == "all_to_all" and e.phase == p for m in e.members)
            for p in copies}
    whole = v[0]["without SP"]["y"]
    shards = [x["with SP"]["y"] for x in v]
    return [
        check("token copies the experts work on, without SP and with it", [copies["without SP"], copies["with SP"]],
              [t * n * SHAPE.top_k, n * SHAPE.top_k]),
        check("rows dispatched (a token once per GPU owning one of its experts), without SP over with SP",
              rows["without SP"] / rows["with SP"], t),
        check(f"bytes that crossed between GPUs: {sent['without SP']:,} without SP, {sent['with SP']:,} with it "
              "(rows to a GPU's own experts stay put, so not exactly twice)", sent["without SP"] > sent["with SP"], True),
        check("every TP rank computed the same output without SP (duplicate work)",
              all(bool((abs(x["without SP"]["y"] - whole) <= 1e-14).all()) for x in v), True),
        check("with SP the two shares put together are that same output",
              float(np.abs(assemble([np.asarray(p) for p in shards], Shard(0), np) - np.asarray(whole)).max()) <= 1e-12,
              True),
    ]


NARRATIVE = {
    "without SP": """
        Attention's row-parallel output ends in an all-reduce when SP is off, so both GPUs of the TP pair hold
        all four tokens "the contract was void". Routing is per token, so each GPU routes all four, picks the
        same two experts for each, and dispatches them: every token reaches its experts twice, the experts do
        twice the work, and two identical results come back. With --tp 4 each of four GPUs does it: four
        times the work.""",
    "with SP": """
        With SP the all-reduce is a reduce-scatter instead: each GPU keeps its own share of the tokens (two of
        them on the pair), routes only those, and each token is dispatched once: the all-to-alls carry half the rows and the
        experts do half the work (a quarter at --tp 4), for the same answer. This is why Megatron refuses MoE with TP unless SP is on.""",
}

LESSON = Lesson(
    no_picture="its figure is a count of token copies; moe16 --plot draws a token's dispatch",
    name="moe-sp", title="MoE with TP needs SP: otherwise every token is dispatched t times",
                section="Expert parallelism: why MoE with TP needs SP",
                order=170,
                world=2, worlds=(2, 4), program=program, narrative=NARRATIVE, checks=checks,
                summary="the TP pair g2, g3 on 'the contract was void': token copies and bytes with and without SP",
                knobs={"tp": Knob(2, choices=(2, 4), world=True),
                       "routing": Knob("post", choices=("post", "learned"))})

"""Sequence parallelism: the parts of a layer that TP leaves whole (norms, dropout, residuals) split by tokens.

One transformer layer runs forward and backward three times on the same ranks: TP alone, TP with SP,
and TP with SP keeping the attention scores. Each run measures the bytes its collectives move and the
bytes each rank keeps for backward, in Korthikanti et al.'s units (2 per activation, 1 per dropout mask).
"""
from __future__ import annotations

import numpy as np

from parasim.figures import sent_in_phase
from parasim.lesson import Check, Knob, Lesson, Picture, check
from parasim.render.plot_sp import plot_sp
from parasim.nn import ParallelContext, Saved, Shard
from parasim.layout.placement import assemble
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec

S, B, H, HEADS = 16, 1, 16, 8  # a small layer: the ratios do not depend on h
RUNS = (("TP alone", False, True), ("TP + SP", True, True), ("TP + SP, scores kept", True, False))


def program(ctx):
    tp_group = ctx.new_group(range(ctx.world), "tp")
    out = {}
    for phase, sp, flash in RUNS:
        ctx.phase(phase)
        tp = ParallelContext(ctx, tp_group, sp=sp)
        shape = ModelSpec(hidden=H, heads=HEADS, dropout=0.1, flash=flash)
        layer = TransformerLayer(tp, shape, layer_weights(ctx, shape, "layer"), key="layer")
        x = ctx.shared_rng("x").normal((S, B, H))
        dy = ctx.shared_rng("dy").normal((S, B, H))
        if sp:
            x, dy = tp.shard(x, 0), tp.shard(dy, 0)
        saved = Saved(tag=phase)  # the layer marks its activations under the run's name, for parasim check
        y, cache = layer.forward(x, saved)
        dx = layer.backward(cache, dy)
        sbh = S * B * H
        ctx.note(f"keeps {saved.bytes():,} B for backward = {saved.bytes() / sbh:g} sbh"
                 + ("" if flash else f" (of which {_scores(saved):,} B are attention scores)"))
        shards = {"qkv": layer.attn.qkv.weight, "out": layer.attn.out.weight, "fc1": layer.mlp.fc1.weight,
                  "fc2": layer.mlp.fc2.weight}  # each weight's slice on this rank: the picture's labels
        out[phase] = {"saved": saved.bytes(), "scores": _scores(saved), "y": y, "dx": dx,
                      "shards": {k: [int(n) for n in w.shape] for k, w in shards.items()}}
    return out


def _scores(saved: Saved) -> int:
    return sum(v for k, v in saved.by_name().items() if "softmax" in k)


def _moved(result, phase: str, rank: int, ops: tuple[str, ...], skip: str = "") -> int:
    return sent_in_phase(result, phase, lambda e: e.op in ops and not (skip and skip in (e.label or "")), rank)


def checks(result) -> list[Check]:
    t, v = result.world, result.values
    sbh, scores = S * B * H, 5 * HEADS * S * S * B
    out = [
        check(f"TP alone keeps sbh(10 + 24/t) per rank, t = {t}", sorted({x["TP alone"]["saved"] for x in v}),
              [sbh * (10 + 24 / t)]),
        check("TP + SP keeps 34sbh/t per rank", sorted({x["TP + SP"]["saved"] for x in v}), [34 * sbh / t]),
        check("so SP keeps this many times less", round(v[0]["TP alone"]["saved"] / v[0]["TP + SP"]["saved"], 3),
              round((10 + 24 / t) / (34 / t), 3)),
        check("keeping the attention scores adds 5as²b/t: (34sbh + 5as²b)/t",
              sorted({x["TP + SP, scores kept"]["saved"] for x in v}), [(34 * sbh + scores) / t]),
    ]
    ar = _moved(result, "TP alone", 0, ("all_reduce",))
    agrs = _moved(result, "TP + SP", 0, ("all_gather", "reduce_scatter"), skip="again")
    out.append(check("all-gathers + reduce-scatters move the bytes of the all-reduces they replace (rank 0)",
                     agrs, ar))
    regather = _moved(result, "TP + SP", 0, ("all_gather",)) - _moved(result, "TP + SP", 0, ("all_gather",),
                                                                        skip="again")
    out.append(check("backward gathers the two saved input slices again: 2 all-gathers of s·b·h values",
                     regather, 2 * (t - 1) * sbh * 8 // t))
    # two norms' weights and biases and two row-parallel biases: 6 vectors of h, each all-reduced (ring bytes)
    out.append(check("the whole weights' gradients, summed over the SP ranks: 6 all-reduces of h values (rank 0)",
                     _moved(result, "TP + SP", 0, ("all_reduce",)), 6 * 2 * (t - 1) * H * 8 // t))
    for phase in ("TP + SP", "TP + SP, scores kept"):
        y = assemble([np.asarray(x[phase]["y"]) for x in v], Shard(0), np)  # SP: each rank a slice of the sequence
        diff = float(np.max(np.abs(y - np.asarray(v[0]["TP alone"]["y"]))))
        out.append(check(f"{phase}: the same output as TP alone (largest difference)", diff, 0.0, atol=1e-12))
    return out


def figures(result) -> dict:
    """What `parasim compare sp --tp 2,4,8` sets side by side: bytes rank 0 keeps for backward in each run,
    and what its all-reduces and its gathers and scatters moved."""
    v = result.values[0]
    return {**{f"bytes rank 0 keeps for backward: {phase}": v[phase]["saved"] for phase, _, _ in RUNS},
            "TP alone keeps this many times what TP + SP keeps": round(v["TP alone"]["saved"] / v["TP + SP"]["saved"], 3),
            "bytes rank 0 sent, TP alone (all-reduces)": _moved(result, "TP alone", 0, ("all_reduce",)),
            "bytes rank 0 sent, TP + SP (all-gathers, reduce-scatters)":
                _moved(result, "TP + SP", 0, ("all_gather", "reduce_scatter"))}


NARRATIVE = {
    "TP alone": """
        Tensor parallelism splits the matrix multiplies but leaves everything between them whole: after g's
        all-reduce every rank holds the full activation and runs LayerNorm, dropout and the residual add
        on all of it, so it also keeps all of it for backward. Per layer that is sbh(10 + 24/t) bytes: the
        10 never shrinks. (This run keeps no attention scores, as with FlashAttention.)""",
    "TP + SP": """
        Those operations treat each token alone, so rank i can run them on its own slice of the sequence.
        An all-reduce can be done as two halves, first a reduce-scatter, then an all-gather, and SP
        pulls those halves apart.
        A reduce-scatter after each row-parallel block leaves each rank its tokens; an all-gather before
        each column-parallel block gives every rank the whole sequence again. Each pair moves the bytes of
        the all-reduce it replaces, and now every kept activation is divided by t. SP's extra traffic is
        small but real: backward gathers the two saved input slices once more, and the weights every rank
        keeps whole (the norms' and the row-parallel blocks' biases) got their gradients from its own
        tokens only, so each is summed over the ranks by an all-reduce of h values.""",
    "TP + SP, scores kept": """
        Without FlashAttention the softmax output, its dropout mask and the dropped probabilities are kept
        too: 5as²b bytes per layer, split by heads over the TP ranks.""",
}

LESSON = Lesson(
    picture=Picture(plot_sp, "one layer's flow under SP: sequence slices, all-gather and reduce-scatter, forward "
                             "and backward, with the run's shapes"),
    name="sp",
    section="Sequence parallelism: the parts TP leaves behind",
    order=70,
    title="Sequence parallelism: TP's all-reduce split in two, activations divided by t",
    world=8,
    worlds=(1, 2, 4, 8),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="TP vs TP+SP on one layer: AG+RS bytes = all-reduce bytes; kept activations sbh(10+24/t) -> 34sbh/t",
    keep_values=0,
    knobs={"tp": Knob(8, choices=(1, 2, 4, 8), world=True,
                    limits="the layer's 8 heads and 16 tokens split into equal whole shares over the TP ranks")},
    figures=figures,
)

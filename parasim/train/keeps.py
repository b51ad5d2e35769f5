"""What a GPU keeps, read from its layers and optimizer: the example programs' (moe16, step) shared view."""

from __future__ import annotations

from math import prod
from typing import Any

from ..nn import Shard
from ..nn.layer import expert_weights
from ..layout.placement import local
from ..engine.context import Context


def stores(stage: Any, state: dict, tp: Any) -> dict[str, Any]:
    """What a GPU keeps, read from its layers' placements: values of the attention and MLP shards (split over
    TP), of whole copies (norms, router: whole on every TP rank), of its experts, of its optimizer share
    (master, m, v), and the positions it holds between matmuls and inside attention (its CP slice)."""
    counts = {"tp shards": 0, "whole copies": 0, "experts": 0}
    placements = stage.placements  # built from every layer when asked: once, not once per weight
    for name, w in stage.params().items():
        placed = placements[name]
        kind = "experts" if "ep" in placed else "tp shards" if isinstance(placed.get("tp"), Shard) else "whole copies"
        counts[kind] += prod(int(d) for d in w.shape)  # numpy or torch alike
    return {
        **counts,
        "optimizer": sum(v[0] for v in state.values()),
        "tokens between matmuls": [p + 1 for p in tp.token_positions()],
        "tokens in attention": [p + 1 for p in tp.cp_positions()],
    }


def held_experts(ctx: Context, layer: Any, weights: dict) -> list[int]:
    """The experts (0-based) whose weights this rank holds in `layer`, found from the weights themselves:
    each local expert's first matrix matched against every expert's in the whole layer's `weights`."""
    if not layer.shape.experts:
        return []
    if ctx.symbolic:  # no values to match: the block's own bookkeeping
        return list(range(layer.mlp.first, layer.mlp.first + layer.mlp.per))
    whole = expert_weights(weights, layer.shape)
    moe = layer.mlp  # under ETP a rank holds a column slice of each of its experts' w1: compare slices
    return [
        e
        for mine in moe.experts
        for e, w in enumerate(whole)
        if bool(ctx.xp.all(mine["w1"] == local(w["w1"], Shard(1), moe.local_experts.q, moe.local_experts.eme, ctx.xp)))
    ]


def vars_of(coords: Any) -> dict[str, int]:
    return {k: getattr(coords, k) for k in ("tp", "cp", "dp", "pp", "ep", "edp")}

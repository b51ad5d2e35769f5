"""One training step of any model on any layout: the same SPMD program on virtual ranks (small sizes, real
values) and on symbolic ones (real sizes, shapes and bytes only).

Each rank builds the layers of its pipeline stage (dense ones first where the model says so, MoE after),
runs 1F1B over m micro-batches of one sequence each (its CP slice, then its SP share of the tokens), then
ZeRO-1: gradients reduce-scattered over the groups their placements name, Adam on each share, the weights
all-gathered. MoE layers route by a stated policy (virtual ranks could use the router; symbolic ones
cannot). Not modelled: embeddings and the output layer, shared experts, MLA, gated MLPs (two matrices).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..dp.zero import zero1_step
from ..errors import UsageError
from ..layout import Layout, LayoutError, ModelSpec
from ..nn import ParallelContext
from ..nn.layer import TransformerLayer, layer_weights
from ..nn.routing import Routing
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import generate
from .moe16 import held_experts, stores, vars_of
from .pipeline import LayersStage

LR = 1e-3


def stage_layers(layers: int, pp: int, stage: int) -> range:
    """The layers of pipeline stage `stage`: as even as can be, the first stages one more when they do not
    divide (61 over 16: thirteen stages of 4, three of 3)."""
    cuts = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(layers), pp)])
    return range(int(cuts[stage]), int(cuts[stage + 1]))


def layer_shape(model: ModelSpec, i: int) -> ModelSpec:
    """Layer i's shape: a dense MLP for the model's leading dense layers, else the model's own."""
    return replace(model, experts=0, top_k=None, dense_layers=0) if model.experts and i < model.dense_layers \
        else model


def make_step(layout: Layout, m: int | None = None, routing: str = "balanced") -> Any:
    """The program of one step of `layout.model` on `layout` with `m` micro-batches (default: pp, the least
    1F1B fills), MoE routing by `routing` (uniform, balanced, skewed:F). Arrays are float64, as the layers'
    weights are drawn (held bytes are counted in the training dtypes all the same)."""
    model = layout.model
    if model is None or not model.seq:
        raise UsageError("a training step needs a layout with a model and its sequence length")
    m = layout.pp if m is None else m
    if m < layout.pp:
        raise LayoutError(f"1F1B over {layout.pp} stages needs at least {layout.pp} micro-batches, got {m}")
    if model.layers < layout.pp:
        raise LayoutError(f"{model.layers} layers cannot fill {layout.pp} pipeline stages")
    policy = Routing.parse(routing) if model.experts else None

    def program(ctx: Any) -> dict:
        ctx.use_layout(layout)
        c, g = ctx.coords, ctx.groups
        tp = ParallelContext.from_layout(ctx, layout, partial_sums="step", routing=policy)
        mine = tp.token_positions()
        h = model.hidden
        layers, experts = [], []
        for i in stage_layers(model.layers, layout.pp, c.pp):
            shape = layer_shape(model, i)
            weights = layer_weights(ctx, shape, f"L{i}")
            layers.append(TransformerLayer(tp, shape, weights, key=f"L{i}", name=f"layer {i + 1}"))
            experts.append(held_experts(ctx, layers[-1], weights))
        stage = LayersStage(layers)
        xp = ctx.xp
        idx = xp.asarray(mine, dtype=xp.int64)

        def inputs(mb: int) -> Any:  # the micro-batch's whole sequence, drawn alike everywhere; this rank's rows
            return xp.take(ctx.shared_rng(f"x.{c.dp}.{mb}").normal((model.seq, 1, h)), idx, axis=0)

        def loss(mb: int, y: Any) -> tuple[Any, Any]:
            target = xp.take(ctx.shared_rng(f"t.{c.dp}.{mb}").normal((model.seq, 1, h)), idx, axis=0)
            return float(xp.sum(y * target)), target
        ctx.phase("forward and backward", micro_batches=m)
        total = run_schedule(ctx, g["pp"], generate("1f1b", layout.pp, m), {c.pp: stage}, (len(mine), 1, h),
                             xp.float64, inputs, loss)
        ctx.phase("gradient sync and optimizer")
        new, share_sq, state = zero1_step(ctx, stage, LR, partials=True)
        stage.load(new)
        return {"loss": total, "layers": [layer.key for layer in layers], "coords": vars_of(c),
                "stores": stores(stage, state, tp), "experts": experts}
    return program

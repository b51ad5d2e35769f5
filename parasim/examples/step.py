"""One training step of any model on any layout: the same SPMD program on virtual ranks (small sizes, real
values) and on symbolic ones (real sizes, shapes and bytes only).

Each rank builds the layers of its pipeline stage (dense ones first where the model says so, MoE after),
runs 1F1B over m micro-batches of one sequence each (its CP slice, then its SP share of the tokens), then
ZeRO-1: gradients reduce-scattered over the groups their placements name, Adam on each share, the weights
all-gathered. It tells the trace what it keeps (weights, gradient buffers, its optimizer share, each
layer's activations from forward to backward), so `Trace.peak` gives each GPU's memory under the schedule. MoE layers route by a stated policy (virtual ranks could use the router; symbolic ones
cannot). Not modelled: embeddings and the output layer, shared experts, MLA, gated MLPs (two matrices).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ..dp.flat import FlatBuffer
from ..dp.held import GRAD_BYTES, STATE_BYTES, WEIGHT_BYTES, HeldActivations, Holdings, Recomputed
from ..dp.zero import zero1_step
from ..nn.placement import data_axes, grad_group
from ..errors import UsageError
from ..layout import Layout, LayoutError, ModelSpec
from ..nn import ParallelContext
from ..nn.layer import TransformerLayer, layer_weights
from ..nn.routing import Routing
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import generate
from .keeps import held_experts, stores, vars_of
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


def hold_state(ctx: Any, kept: Holdings, stage: Any) -> int:
    """Tell the trace the bytes a stage keeps all step long: its weights and gradient buffers, and its share
    of the optimizer state (master, m and v) over each weight's data-parallel group, padded as ZeRO-1 pads.
    Returns the share, in values."""
    params, placed = stage.params(), stage.placements
    n = sum(math.prod(w.shape) for w in params.values())
    by_group: dict[str, dict] = {}
    for k, w in params.items():
        by_group.setdefault(grad_group(placed[k], data_axes(placed[k])), {})[k] = w
    share = sum(FlatBuffer(ws, ctx.groups[g].size).padded // ctx.groups[g].size for g, ws in by_group.items())
    kept.hold("weights", n * WEIGHT_BYTES, "weights")
    kept.hold("gradients", n * GRAD_BYTES, "gradients")
    kept.hold("optimizer share (master, m, v)", 3 * share * STATE_BYTES, "optimizer")
    return share


def make_step(layout: Layout, m: int | None = None, routing: str = "balanced", recompute: str = "none") -> Any:
    """The program of one step of `layout.model` on `layout` with `m` micro-batches (default: pp, the least
    1F1B fills), MoE routing by `routing` (uniform, balanced, skewed:F), and `recompute` "full" to keep only
    each layer's input and run its forward again in backward. Arrays are float64, as the layers' weights are
    drawn (held bytes are counted in the training dtypes all the same)."""
    if recompute not in ("none", "full"):
        raise UsageError(f"recompute must be none or full, got {recompute!r}")
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
        # what the GPU keeps, told to the trace: its layers' activations from each forward to its backward,
        # and, all step long, its weights, whole gradient buffers and ZeRO-1 share of the optimizer state
        keep = Recomputed if recompute == "full" else HeldActivations
        stage = LayersStage([keep(ctx, layer) for layer in layers])
        kept = Holdings(ctx, "step")
        share = hold_state(ctx, kept, stage)
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
        if sum(v[0] for v in state.values()) != 3 * share:  # what was held is what the optimizers keep
            raise RuntimeError(f"rank {ctx.rank}: held an optimizer share of {share}, ZeRO-1 keeps {state}")
        stage.load(new)
        return {"loss": total, "layers": [layer.key for layer in layers], "coords": vars_of(c),
                "stores": stores(stage, state, tp), "experts": experts}
    return program

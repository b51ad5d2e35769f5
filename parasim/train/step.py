"""One training step: the one program every example's step runs, read top to bottom as nanoGPT's train loop
reads. `train_step` on each rank:

  1. the context from the layout: every group, SP, the CP split (SP's partial gradients left for the step);
  2. this rank's pipeline stage: its layers (dense ones first where the model says so, MoE after), the
     experts it holds, and, when asked, what it keeps told to the trace (each layer's activations from
     forward to backward; all step long its weights, gradient buffers and ZeRO-1 share of the optimizer);
  3. the pipeline schedule over the micro-batches: forward and backward (1F1B unless told otherwise);
  4. gradients summed over the groups their placements name and ZeRO-1's Adam on each share
     (dp/zero.py: reduce-scatter, Adam, all-gather), clipped by one global norm when asked;
  5. the new weights loaded.

What differs between its users comes in as arguments: each micro-batch's data and loss (`data`), the
stage's wrapper of its layers (`stage`: moe16's watching stage; by default a plain stack), and the options
(`StepOptions`: micro-batches, schedule, routing, recompute, learning rate, clipping, the trace's phases).
moe16 (examples/moe16.py: its sequences, a watched token) and `make_step` below (any model on any layout, on
virtual ranks at small sizes or symbolic ones at real sizes) are its users.

Not modelled: embeddings and the output layer, shared experts, MLA, gated MLPs (two matrices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any


from ..dp.flat import FlatBuffer
from ..dp.held import HeldActivations, Holdings, Recomputed
from ..dp.zero import zero1_step
from ..errors import UsageError
from ..layout import Layout, LayoutError, ModelSpec, stage_span
from ..nn import LayerOptions, ParallelContext
from ..nn.layer import TransformerLayer, layer_weights
from ..layout.placement import data_axes, grad_group
from ..nn.routing import Routing
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import ONE, SCHEDULES, generate, schedule_entry
from .keeps import held_experts, stores, vars_of
from .repeat import RepeatedLayer, repeats
from ..pipeline.stage import LayersStage
from .whole import dot_loss
from ..engine.context import Context

LR = 1e-3


@dataclass(frozen=True)
class Phases:
    """The phases the step tells the trace, around what the stage itself marks (None: no phase there)."""

    schedule: str | None = "forward and backward"  # before the schedule (it carries the micro-batch count)
    sync: str = "gradient sync and optimizer"  # before the gradient sums and ZeRO-1
    after: str | None = None  # once the new weights are loaded


@dataclass(frozen=True)
class StepOptions:
    """How the step runs: what is the same for every rank and is not the data."""

    micro_batches: int
    schedule: str = "1f1b"
    routing: Routing | None = None  # MoE routing by a stated policy (None: the router's own choice)
    recompute: str = "none"  # "full": keep only each layer's input, run its forward again in backward
    held: bool = True  # tell the trace what the GPU keeps (activations, weights, gradients, optimizer share)
    lr: float = LR
    max_norm: float | None = None  # clip by the global norm over both gradient groups before Adam
    phases: Phases = field(default_factory=Phases)

    def __post_init__(self) -> None:
        # the step drives one stage of layers on each rank: a schedule of several chunks a rank is refused here,
        # in one line, not inside the ranks once they run
        entry = schedule_entry(self.schedule)
        if entry.chunks != ONE:
            ones = ", ".join(e.name for e in SCHEDULES if e.chunks == ONE)
            raise UsageError(
                f"the training step holds one stage of layers on each rank; schedule {self.schedule} runs "
                f"{entry.chunks_words} chunks a rank: use one of {ones}"
            )


@dataclass(frozen=True)
class MicroBatches:
    """A rank's data for the schedule: the first stage's input of micro-batch mb (its own rows of the
    sequence), and the last stage's loss of it, (value, gradient of the output)."""

    inputs: Callable[[int], Any]
    loss: Callable[[int, Any], tuple[float, Any]]


# data(ctx, rows): this rank's micro-batches, given the sequence positions it holds between matmuls
Data = Callable[[Any, list], MicroBatches]
# stage(ctx, layers, first, rows): the stage the schedule drives, from its layers (first: the first one's index)
StageOf = Callable[[Any, list, int, list], Any]


def plain_stage(ctx: Context, layers: list, first: int, rows: list) -> LayersStage:
    """The stage as a plain stack of its layers."""
    return LayersStage(layers)


@dataclass
class StepRun:
    """What one rank's step did: its context, layers and stage, and what the schedule and ZeRO-1 returned."""

    par: Any  # the ParallelContext the layers were built with
    rows: list[int]  # the sequence positions the rank holds between matmuls
    layers: list[TransformerLayer]
    experts: list[list[int]]  # per layer, the experts (0-based) whose weights the rank holds
    stage: Any
    loss: float  # the sum of the micro-batch losses on the last stage, else 0
    new: dict[str, Any]  # the new weights (each whole over the data axes)
    share_sq: dict[str, float]  # each key's share of the summed gradient's sum of squares, before clipping
    state: dict[str, list[int]]  # {"dense"|"expert": [optimizer values kept here, of the whole state]}


def stage_range(model: ModelSpec, pp: int, stage: int) -> range:
    """The layers of pipeline stage `stage`, by the model's rule for its layers on stages (layout/stages.py:
    evenly, Megatron's first/last stage counts, a list, or as even as can be with the first stages one more
    where they do not divide: 61 over 16 is thirteen stages of 4, three of 3)."""
    start, n = (int(x) for x in stage_span(model, pp, stage))
    return range(start, start + n)


def layer_shape(model: ModelSpec, i: int) -> ModelSpec:
    """Layer i's shape: a dense MLP for the model's leading dense layers, else the model's own."""
    return replace(model, experts=0, top_k=None, dense_layers=0) if model.experts and i < model.dense_layers else model


def hold_state(ctx: Context, kept: Holdings, stage: Any) -> int:
    """Tell the trace the bytes a stage keeps all step long: its weights and gradient buffers, and its share
    of the optimizer state (master, m and v) over each weight's data-parallel group, padded as ZeRO-1 pads.
    Returns the share, in values."""
    params, placed = stage.params(), stage.placements
    n = sum(math.prod(w.shape) for w in params.values())
    by_group: dict[str, dict] = {}
    for k, w in params.items():
        by_group.setdefault(grad_group(placed[k], data_axes(placed[k])), {})[k] = w
    share = sum(FlatBuffer(ws, ctx.groups[g].size).padded // ctx.groups[g].size for g, ws in by_group.items())
    sizes = ctx.precision
    kept.hold("weights", n * sizes.weight_bytes, "weights")
    kept.hold("gradients", n * sizes.grad_bytes, "gradients")
    kept.hold("optimizer share (master, m, v)", share * sizes.optimizer_bytes, "optimizer")
    return share


def train_step(ctx: Context, layout: Layout, opts: StepOptions, data: Data, stage: StageOf = plain_stage) -> StepRun:
    """One training step of `layout.model` on `layout`, on this rank (see the module's text)."""
    model = layout.model
    # 1. the context from the layout; SP's partial gradients are summed once per step, by ZeRO-1's code
    ctx.use_layout(layout)
    c, g = ctx.coords, ctx.groups
    tp = ParallelContext.from_layout(ctx, layout, LayerOptions(partial_sums="step", routing=opts.routing))
    rows = tp.token_positions()  # the layers' own split: this rank's CP slice, then its SP share of that
    batches = data(ctx, rows)
    # 2. this rank's stage: its layers, the experts it holds, and what it keeps
    mine = stage_range(model, layout.pp, c.pp)
    plan = generate(opts.schedule, layout.pp, opts.micro_batches)
    layers, experts = [], []
    for i in mine:
        shape = layer_shape(model, i)
        weights = layer_weights(ctx, shape, f"L{i}")
        layers.append(TransformerLayer(tp, shape, weights, key=f"L{i}", name=f"layer {i + 1}"))
        experts.append(held_experts(ctx, layers[-1], weights))
    # on symbolic ranks each layer runs once per shape and its calls are repeated on the trace (train/repeat.py)
    split = any(a.kind == "I" for acts in plan for a in acts)
    inner = [RepeatedLayer(ctx, lay) for lay in layers] if repeats(ctx, model.experts, opts.routing, split) else layers
    share = None
    if opts.held:
        keep = Recomputed if opts.recompute == "full" else HeldActivations
        driven = stage(ctx, [keep(ctx, layer) for layer in inner], mine.start, rows)
        share = hold_state(ctx, Holdings(ctx, "step"), driven)
    else:
        driven = stage(ctx, inner, mine.start, rows)
    # 3. the pipeline schedule over the micro-batches: forward and backward
    if opts.phases.schedule is not None:
        ctx.phase(opts.phases.schedule, micro_batches=opts.micro_batches)
    loss = run_schedule(
        ctx,
        g["pp"],
        plan,
        {c.pp: driven},
        (len(rows), 1, model.hidden),
        ctx.dtype_for("activations"),
        batches.inputs,
        batches.loss,
    )
    # 4. gradients summed where copies saw different tokens (dense weights over dp-cp, experts over
    # expert-dp: their placements say which; SP's partial sums over tp first), ZeRO-1's Adam on each share
    ctx.phase(opts.phases.sync)
    new, share_sq, state = zero1_step(ctx, driven, opts.lr, partials=True, max_norm=opts.max_norm)
    if share is not None and sum(v[0] for v in state.values()) != 3 * share:  # held is what the optimizers keep
        raise RuntimeError(f"rank {ctx.rank}: held an optimizer share of {share}, ZeRO-1 keeps {state}")
    # 5. the new weights loaded
    driven.load(new)
    if opts.phases.after is not None:
        ctx.phase(opts.phases.after)
    return StepRun(tp, rows, layers, experts, driven, loss, new, share_sq, state)


def make_step(layout: Layout, m: int | None = None, routing: str = "balanced", recompute: str = "none") -> Any:
    """The program of one step of `layout.model` on `layout` with `m` micro-batches (default: pp, the least
    1F1B fills), MoE routing by `routing` (uniform, balanced, skewed:F), and `recompute` "full" to keep only
    each layer's input and run its forward again in backward. Each micro-batch is one sequence drawn alike
    on every rank of a DP replica. Arrays are the run's: float64 on virtual ranks (exact), the precision's
    dtypes on symbolic ones (held bytes are counted in the precision's dtypes either way)."""
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
    opts = StepOptions(micro_batches=m, routing=Routing.parse(routing) if model.experts else None, recompute=recompute)
    whole = (model.seq, 1, model.hidden)

    def data(ctx: Context, rows: list) -> MicroBatches:
        """The micro-batch's whole sequence, drawn alike on the ranks of a DP replica; this rank's rows."""
        xp, dp = ctx.xp, ctx.coords.dp
        idx = xp.asarray(rows, dtype=xp.int64)
        return MicroBatches(
            inputs=lambda mb: xp.take(ctx.shared_rng(f"x.{dp}.{mb}").normal(whole), idx, axis=0),
            loss=lambda mb, y: dot_loss(xp, y, xp.take(ctx.shared_rng(f"t.{dp}.{mb}").normal(whole), idx, axis=0)),
        )

    def program(ctx: Context) -> dict:
        run = train_step(ctx, layout, opts, data)
        return {
            "loss": run.loss,
            "layers": [layer.key for layer in run.layers],
            "coords": vars_of(ctx.coords),
            "stores": stores(run.stage, run.state, run.par),
            "experts": run.experts,
        }

    return program

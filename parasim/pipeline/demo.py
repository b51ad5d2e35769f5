"""A small pipeline run for lessons: one transformer layer per stage, m micro-batches, any schedule, plus the
same model on one rank for comparison. The slot table each rank notes is computed by the timing model."""
from __future__ import annotations

from fractions import Fraction
from typing import Any

from ..nn import Saved, TPContext
from ..nn.layer import LayerShape, Stack, TransformerLayer, layer_weights
from .executor import run_stage
from .schedules import generate
from .timing import simulate

SHAPE = LayerShape(hidden=8, heads=2, dropout=0.0)
SEQ, BATCH = 4, 1


class LayersStage:
    """A stage that is a stack of layers: what the executor drives."""

    def __init__(self, layers: list) -> None:
        self.stack = Stack(layers)

    def forward(self, x: Any) -> tuple[Any, Any]:
        return self.stack.forward(x, Saved())

    def backward(self, cache: Any, dy: Any) -> Any:
        return self.stack.backward(cache, dy)


def _layers(ctx: Any, first: int, count: int) -> list:
    tp = TPContext(ctx, None)
    return [TransformerLayer(tp, SHAPE, layer_weights(ctx, SHAPE, f"L{i}"), key=f"L{i}", name=f"L{i}")
            for i in range(first, first + count)]


def _data(ctx: Any, mb: int, what: str) -> Any:
    return ctx.shared_rng(f"{what}{mb}").normal((SEQ, BATCH, SHAPE.hidden))


def pipeline_run(ctx: Any, schedule: str, m: int) -> dict:
    """Run `schedule` with m micro-batches on ctx.world stages (one layer each)."""
    group = ctx.new_group(range(ctx.world), "pp")
    r, p = ctx.rank, ctx.world
    timing = simulate(generate(schedule, p, m))
    ctx.phase("the schedule")
    ctx.note("stage %d: %s" % (r + 1, " ".join(x or "." for x in timing.slots[r])))
    ctx.phase("running it")

    def loss(mb: int, y: Any) -> tuple[Any, Any]:
        target = _data(ctx, mb, "target")
        return float(ctx.xp.sum(y * target)), target
    actions = generate(schedule, p, m)[r]
    total = run_stage(ctx, group, actions, LayersStage(_layers(ctx, r, 1)), (SEQ, BATCH, SHAPE.hidden),
                      ctx.xp.float64, lambda mb: _data(ctx, mb, "x"), loss)
    return {"loss": total, "slots": timing.slots[r], "idle": timing.idle[r], "peak": timing.peak[r],
            "makespan": timing.makespan, "bubble": str(timing.bubble)}


def unsplit_loss(stages: int, m: int):
    """The same model, all layers on one rank: a program for parasim.run(..., 1)."""
    def program(ctx: Any) -> float:
        stack = Stack(_layers(ctx, 0, stages))
        total = 0.0
        for mb in range(m):
            y, _ = stack.forward(_data(ctx, mb, "x"), Saved())
            total += float(ctx.xp.sum(y * _data(ctx, mb, "target")))
        return total
    return program


def pipeline_checks(result: Any, schedule: str, peaks: list[int], M: int = 4) -> list:
    """The checks the pipeline lessons share, each against a formula or an unsplit run."""
    from ..engine import run
    from ..lesson import check
    v, p = result.values, result.world
    bubble = Fraction(p - 1, M + p - 1)
    ref = run(unsplit_loss(p, M), 1).values[0]
    sends = sum(1 for e in result.trace.events if e.op == "p2p")
    smallest = next(m for m in range(1, 1000) if simulate(generate(schedule, 8, m)).bubble < Fraction(1, 10))
    return [
        check("bubble = (p-1)/(m+p-1), measured from the slot table", v[0]["bubble"], str(bubble)),
        check("every stage is busy 2m slots", [x["makespan"] - x["idle"] for x in v], [2 * M] * p),
        check("micro-batches whose activations a stage holds at once", [x["peak"] for x in v], peaks),
        check("the last stage's loss equals the unsplit model's", v[-1]["loss"], ref, rtol=1e-12),
        check("point-to-point transfers: m activations and m gradients per stage boundary", sends, 2 * M * (p - 1)),
        check("bubbles with m = 16 and m = 32", [round(float(simulate(generate(schedule, p, m)).bubble), 3)
                                                  for m in (16, 32)],
              [round((p - 1) / (m + p - 1), 3) for m in (16, 32)]),
        check("smallest m with a bubble under 10% at p = 8", smallest, next(m for m in range(1, 1000)
                                                                             if 7 / (m + 7) < 0.1)),
    ]

"""A small pipeline run for lessons: one transformer layer per stage (or a few: pp-gpipe runs the post's two),
m micro-batches, any schedule, plus the same model on one rank for comparison. The slot table each rank notes is
computed by the timing model."""

from __future__ import annotations

from fractions import Fraction
from itertools import count
from typing import Any

from ..nn.layer import Stack
from ..layout import ModelSpec
from ..pipeline.executor import run_schedule
from ..pipeline.stage import LayersStage
from ..pipeline.schedules import generate
from ..pipeline.timing import time_schedule
from ..train.whole import dot_loss, forward_backward, whole_layers
from ..engine.context import Context

SHAPE = ModelSpec(hidden=8, heads=2, dropout=0.0)
SEQ, BATCH = 4, 1


def _layers(ctx: Context, first: int, count: int) -> list:
    return whole_layers(ctx, SHAPE, first, count, "L{i}")  # no TP: each stage's layers are whole


def _data(ctx: Context, mb: int, what: str) -> Any:
    return ctx.shared_rng(f"{what}{mb}").normal((SEQ, BATCH, SHAPE.hidden))


def pipeline_run(
    ctx: Context,
    schedule: str,
    m: int,
    chunks: int | None = None,
    group: Any = None,
    phases: tuple[str, str] = ("the schedule", "running it"),
    costs: dict | None = None,
    layers_per_stage: int = 1,
) -> dict:
    """Run `schedule` with m micro-batches on ctx.world ranks, `layers_per_stage` layers a stage (stage s holds
    layers s * n to s * n + n - 1, counted from 0). Each rank notes its row of the slot table (timed with
    `costs`) in the first phase and runs its actions in the second; with more than one layer a stage, the last
    rank then says which layers each GPU holds."""
    group = group or ctx.new_group(range(ctx.world), "pp")
    r, per = ctx.rank, layers_per_stage
    plan = generate(schedule, ctx.world, m, chunks)
    timing = time_schedule(plan, costs)
    ctx.phase(phases[0])
    cells = [x or "." for x in timing.slots[r]]
    ctx.note("GPU %d: %s" % (r + 1, " ".join(cells)), table_row=r + 1, cells=cells)
    if per > 1 and r == ctx.world - 1:  # the last rank, after its row: said under the whole table
        held = [sorted(s * per + i + 1 for s in {a.stage for a in acts} for i in range(per)) for acts in plan]
        ctx.note(layers_words(held, m), run=True, layers=held)
    ctx.phase(phases[1])

    def loss(mb: int, y: Any) -> tuple[Any, Any]:
        return dot_loss(ctx.xp, y, _data(ctx, mb, "target"))

    stages = {a.stage: LayersStage(_layers(ctx, a.stage * per, per)) for a in plan[r]}
    total = run_schedule(
        ctx,
        group,
        plan,
        stages,
        (SEQ, BATCH, SHAPE.hidden),
        ctx.xp.float64,
        lambda mb: _data(ctx, mb, "x"),
        loss,
        costs,
    )
    last = max(a.stage for acts in plan for a in acts)
    return {
        "loss": total,
        "has_loss": last in stages,
        "slots": timing.slots[r],
        "idle": timing.idle[r],
        "peak": timing.peak[r],
        "makespan": timing.makespan,
        "bubble": str(timing.bubble),
        # by layer (counted from 0; with one layer a stage, the stage's number)
        "grad_sq": {s * per + i: _grad_sq(ctx, x) for s, st in stages.items() for i, x in enumerate(st.stack.layers)},
        "stepped": {s * per + i: sgd_step(ctx, x) for s, st in stages.items() for i, x in enumerate(st.stack.layers)},
    }


def layers_words(held: list[list[int]], m: int) -> str:
    """Which layers (counted from 1) each GPU holds, in one line, and what a backward cell of the slot table
    then stands for: micro-batch m's backward on the last GPU but one, through that GPU's layers."""

    def span(layers: list[int]) -> str:
        return f"{layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else str(layers)

    p, n = len(held), sum(len(x) for x in held)
    each = ", ".join(f"GPU {r + 1} layers {span(x)}" for r, x in enumerate(held))
    g = max(1, p - 1)
    return (
        f"the model: {n} layers, {n // p} a GPU ({each}); a cell is a micro-batch through all of its GPU's "
        f"layers: B{m} on GPU {g} is micro-batch {m}'s backward through layers {span(held[g - 1])}"
    )


LR = 0.01


def sgd_step(ctx: Context, layer: Any, lr: float = LR) -> float:
    """The one optimizer step: w -= lr * grad for every weight of the layer (the gradients were summed over
    all micro-batches first). Returns the new weights' sum of squares, a fingerprint to compare."""
    grads = layer.grads
    new = {k: w - lr * grads[k] for k, w in layer.params().items()}
    layer.load(new)
    return float(sum(float(ctx.xp.sum(w * w)) for w in new.values()))


def _grad_sq(ctx: Context, layer: Any) -> float:
    """A fingerprint of a layer's weight gradients: the sum of their squares."""
    return float(sum(float(ctx.xp.sum(g * g)) for g in layer.grads.values()))


def unsplit_program(stages: int, m: int):
    """The same model, all layers on one rank, forward and backward: a program for parasim.run(..., 1)."""

    def program(ctx: Context) -> dict:
        stack = Stack(_layers(ctx, 0, stages))
        total = forward_backward(ctx, stack, ((_data(ctx, mb, "x"), _data(ctx, mb, "target")) for mb in range(m)))
        return {
            "loss": total,
            "grad_sq": {i: _grad_sq(ctx, layer) for i, layer in enumerate(stack.layers)},
            "stepped": {i: sgd_step(ctx, layer) for i, layer in enumerate(stack.layers)},
        }

    return program


def matches_unsplit(values: list[dict], stages: int, m: int) -> list:
    """Checks: the loss and every layer's gradients equal the unsplit model's."""
    from ..engine.runner import run
    from ..lesson import check

    ref = run(unsplit_program(stages, m), 1).values[0]
    last = next(x for x in values if x["has_loss"])
    got = {s: g for x in values for s, g in x["grad_sq"].items()}
    stepped = {s: g for x in values for s, g in x["stepped"].items()}
    return [
        check("the loss equals the unsplit model's", last["loss"], ref["loss"], rtol=1e-12),
        check(
            "each layer's gradients equal the unsplit model's (sum of squares)",
            [got[s] for s in sorted(got)],
            [ref["grad_sq"][s] for s in sorted(ref["grad_sq"])],
            rtol=1e-10,
        ),
        check(
            "after one SGD step, each layer's weights equal the unsplit model's (sum of squares)",
            [stepped[s] for s in sorted(stepped)],
            [ref["stepped"][s] for s in sorted(ref["stepped"])],
            rtol=1e-12,
        ),
    ]


def pipeline_figures(result: Any) -> dict:
    """What `parasim compare` lines up for a pipeline lesson beside every run's figures (its sends among
    them): the bubble measured from the slot table, the micro-batches stage 1 holds at once."""
    v = result.values
    return {"bubble (idle share of the step)": v[0]["bubble"], "micro-batches stage 1 holds at once": v[0]["peak"]}


# how many micro-batches stage 1 holds at once, and why, in words: by the schedule a quiz asks of
_STAGE_ONE_HOLDS = {
    "gpipe": "every forward runs before any backward, so stage 1 keeps all m: {m}",
    "1f1b": "stage 1 runs p forwards before its first backward, then one of each: min(p, m) = min({p}, {m}) = {held}",
}


def pipeline_quiz(result: Any, schedule: str) -> list:
    """The bubble at p and m, and the micro-batches stage 1 holds at once: asked first, answered by the run's
    slot table (examples/quiz.py)."""
    from fractions import Fraction

    from .quiz import Question

    v, p = result.values, result.world
    m = result.trace.meta.get("knobs", {}).get("m")
    bubble, held = Fraction(v[0]["bubble"]), v[0]["peak"]
    return [
        Question(
            f"{schedule.upper() if schedule == '1f1b' else 'GPipe'} with p = {p} stages and m = {m} micro-batches: "
            "what share of the step does each stage sit idle (the bubble)?",
            bubble,
            "of the step",
            f"each stage idles p - 1 slots of its m + p - 1: (p - 1)/(m + p - 1) = {p - 1}/{m + p - 1}",
        ),
        Question(
            "... and how many micro-batches' activations does stage 1 hold at once, at most?",
            held,
            "micro-batches",
            _STAGE_ONE_HOLDS[schedule].format(p=p, m=m, held=held),
        ),
    ]


def pipeline_checks(result: Any, schedule: str, peaks: list[int], M: int, layers_per_stage: int = 1) -> list:
    """The checks the pipeline lessons share, each against a formula or an unsplit run (of p x
    `layers_per_stage` layers)."""
    from ..lesson import check

    v, p = result.values, result.world
    bubble = Fraction(p - 1, M + p - 1)
    sends = sum(1 for e in result.trace.events if e.op == "p2p")
    smallest = next(m for m in count(1) if time_schedule(generate(schedule, 8, m)).bubble < Fraction(1, 10))
    return [
        check("bubble = (p-1)/(m+p-1), measured from the slot table", v[0]["bubble"], str(bubble)),
        check("every stage is busy 2m slots", [x["makespan"] - x["idle"] for x in v], [2 * M] * p),
        check("micro-batches whose activations a stage holds at once", [x["peak"] for x in v], peaks),
        check("point-to-point transfers: m activations and m gradients per stage boundary", sends, 2 * M * (p - 1)),
        check(
            "bubbles with m = 16 and m = 32",
            [round(float(time_schedule(generate(schedule, p, m)).bubble), 3) for m in (16, 32)],
            [round((p - 1) / (m + p - 1), 3) for m in (16, 32)],
        ),
        # (p-1)/(m+p-1) < 1/10 exactly when m > 9(p-1)
        check("smallest m with a bubble under 10% at p = 8", smallest, 9 * (8 - 1) + 1),
        *matches_unsplit(v, p * layers_per_stage, M),
    ]

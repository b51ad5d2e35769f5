"""GPipe on 4 stages and 4 micro-batches, the post's 8 layers two a stage: all forwards, then all backwards; the
bubble measured, and the bubble against m at the post's p = 4 and p = 8 from the same schedule code."""
from __future__ import annotations

from fractions import Fraction
from itertools import count

from parasim.lesson import Check, Knob, Lesson, Picture, Table, knob
from parasim.render.plot_moves import HANDOFF, plot_handoff
from parasim.examples.pipeline import pipeline_checks, pipeline_figures, pipeline_quiz, pipeline_run
from parasim.pipeline.schedules import generate
from parasim.pipeline.timing import time_schedule

M = 4
PER = 2  # layers a stage: the post's 8 layers on 4 GPUs
POST_P = (4, 8)  # the pipeline depths the post's bubble figures are given at
POST_M = (4, 16, 32, 63, 64)  # the post's m = 4, 16 and 32, and the two sides of 10% at p = 8


def program(ctx):
    return pipeline_run(ctx, "gpipe", ctx.knobs.get("m", M), layers_per_stage=PER)


def checks(result) -> list[Check]:
    m = knob(result, "m", M)
    return pipeline_checks(result, "gpipe", [m] * result.world, m, layers_per_stage=PER)


BACKWARD_TWICE = {"B": 2}  # slot costs with a backward twice a forward (the post's rough ratio)


def bubble(p: int, m: int, costs: dict | None = None) -> Fraction:
    """GPipe's bubble at p stages and m micro-batches, from the slot table the schedule code times."""
    return time_schedule(generate("gpipe", p, m), costs).bubble


def idle_cell(p: int, m: int) -> str:
    """A cell of the bubble table: the slots stage 1 idles of the step's, and that share."""
    timing = time_schedule(generate("gpipe", p, m))
    return f"{timing.idle[0]} of {timing.makespan} = {float(timing.bubble):.1%}"


def tables(result) -> list[Table]:
    """The bubble against m, at the post's p = 4 and p = 8 (and the run's p where it is neither), each cell
    timed from GPipe's slot table; the run's own m is among the rows."""
    p, m = result.world, knob(result, "m", M)
    depths = sorted({*POST_P, p})
    rows, ms = [], sorted({*POST_M, m})
    for n in ms:
        rows.append((f"m = {n}" + (" (this run)" if n == m else ""), [idle_cell(d, n) for d in depths]))
    under = next(n for n in count(1) if bubble(8, n) < Fraction(1, 10))  # the smallest m at p = 8
    same = all(bubble(d, n) == bubble(d, n, BACKWARD_TWICE) for d in depths for n in ms)
    twice = time_schedule(generate("gpipe", p, m), BACKWARD_TWICE)
    names = [f"p = {d}" + (" (this run)" if d == p else "") + ": idle slots" for d in depths]
    return [Table("GPipe's bubble against m, timed from the slot table", ["micro-batches", *names], rows, notes=[
        f"every stage idles 2(p-1) of the step's 2(m+p-1) slots, so more micro-batches shrink the bubble: at "
        f"p = 4, m = 16 leaves {float(bubble(4, 16)):.0%} idle and m = 32 leaves {float(bubble(4, 32)):.0%}; a "
        f"deeper pipeline needs more: at p = 8 the smallest m under 10% is {under} (m = {under - 1} gives "
        f"{float(bubble(8, under - 1)):.0%}, since (p-1)/(m+p-1) < 1/10 needs m > 9(p-1))",
        "a cell is one slot whether it is a forward or a backward; timed again with a backward two slots long, "
        f"this run's stage 1 idles {twice.idle[0]} of {twice.makespan}, and every share above comes out "
        + ("the same" if same else "otherwise")
        + " (the fill, the drain and the work all grow alike; pp-zero-bubble splits the backward to fill them)"])]


NARRATIVE = {
    "the schedule": """
        Pipeline parallelism gives each rank a block of layers; a batch is cut into micro-batches that flow
        through the stages. GPipe runs every forward first, then every backward (here in reverse order).
        The dots are the bubble: stage 1 waits for the others to fill and to drain. Each stage keeps the
        activations of all m micro-batches until their backward. The table gives a forward and a backward
        one slot each; in practice a backward costs about twice a forward, and pp-zero-bubble times them
        so. The line under the table says how this run's layers are dealt out.""",
    "running it": """
        The same schedule, executed: activations travel forward between stages by point-to-point
        transfers, gradients travel back, and each stage adds up its weight gradients over the
        micro-batches before one optimizer step.""",
}

LESSON = Lesson(name="pp-gpipe", title="Pipeline parallelism: the GPipe schedule and its bubble", world=4,
                section="Pipeline parallelism: split by layers",
                order=120,
                picture=Picture(plot_handoff, HANDOFF),
                min_world=2, max_world=16, program=program, narrative=NARRATIVE, checks=checks,
                summary="4 stages x 4 micro-batches: the slot table, the bubble, activations held, run for real",
                keep_values=0, knobs={"pp": Knob(4, world=True), "m": Knob(M)},
                tables=tables,
                figures=pipeline_figures, quiz=lambda result: pipeline_quiz(result, "gpipe"))

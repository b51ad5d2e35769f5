"""1F1B on 4 stages and 4 micro-batches: the same bubble as GPipe, but stage r (numbered 1 to p, as the post
numbers its GPUs) holds at most p - r + 1 micro-batches' activations."""
from __future__ import annotations

from parasim.lesson import Check, Knob, Lesson, Picture, Table, knob
from parasim.pipeline.schedules import generate
from parasim.pipeline.timing import time_schedule
from parasim.render.plot_moves import HANDOFF, plot_handoff
from parasim.examples.pipeline import pipeline_checks, pipeline_figures, pipeline_quiz, pipeline_run

M = 4


def program(ctx):
    return pipeline_run(ctx, "1f1b", ctx.knobs.get("m", M))


def checks(result) -> list[Check]:
    p, m = result.world, knob(result, "m", M)
    return pipeline_checks(result, "1f1b", [min(p - r + 1, m) for r in range(1, p + 1)], m)  # stage r = 1..p


def tables(result) -> list[Table]:
    """What each stage holds at once, 1F1B beside GPipe: this run's peaks, and both schedules' timed at the run's
    m and at twice it (each schedule's slot table, as the run's own is made)."""
    p, m = result.world, knob(result, "m", M)
    held = {(name, mm): time_schedule(generate(name, p, mm)).peak for name in ("1f1b", "gpipe") for mm in (m, 2 * m)}
    run = [x["peak"] for x in result.values]
    rows = [(f"stage {r + 1}", [run[r], held[("gpipe", m)][r], held[("1f1b", 2 * m)][r], held[("gpipe", 2 * m)][r]])
            for r in range(p)]
    return [Table(
        f"Micro-batches whose activations each stage holds at once, p = {p}",
        ["stage", f"1F1B, m = {m} (this run)", f"GPipe, m = {m}", f"1F1B, m = {2 * m}", f"GPipe, m = {2 * m}"], rows,
        notes=[f"GPipe keeps every micro-batch until its backward: m on every stage. 1F1B starts a backward as soon "
               f"as it can: stage r (1 to p) holds at most p - r + 1, whatever m. At m = p the first stage holds p "
               f"under both; "
               f"the later stages, and every stage once m grows past p, hold fewer under 1F1B. The bubble is the "
               f"same: {result.values[0]['bubble']} at m = {m}."])]


NARRATIVE = {
    "the schedule": """
        1F1B starts a backward as soon as one is possible. Number the stages r = 1 to p, as the GPUs
        below: after a warm-up of p - r forwards, stage r alternates one forward with one backward. The
        bubble is the same as GPipe's, but stage r never holds more than p - r + 1 micro-batches'
        activations (p on GPU 1, one on the last), which is what makes many micro-batches affordable.""",
    "running it": """
        Executed, a stage posts each send together with its next receive, as Megatron pairs
        send-forward with receive-backward: two neighbours that both have something to send never wait
        on each other.""",
}

LESSON = Lesson(name="pp-1f1b", title="Pipeline parallelism: 1F1B keeps the bubble and bounds the memory",
                section="Pipeline parallelism: shrinking the bubble (1F1B)",
                order=130,
                picture=Picture(plot_handoff, HANDOFF),
                world=4, min_world=2, max_world=16, program=program, narrative=NARRATIVE, checks=checks,
                summary="4 stages x 4 micro-batches: warm-up, one forward one backward, stage r holds p - r + 1",
                keep_values=0, knobs={"pp": Knob(4, world=True), "m": Knob(M)},
                figures=pipeline_figures, tables=tables, quiz=lambda result: pipeline_quiz(result, "1f1b"))

"""GPipe on 4 stages and 4 micro-batches: all forwards, then all backwards; the bubble measured."""
from __future__ import annotations

from parasim.lesson import Check, Knob, Lesson, Picture, knob
from parasim.render.plot_moves import HANDOFF, plot_handoff
from parasim.examples.pipeline import pipeline_checks, pipeline_figures, pipeline_quiz, pipeline_run

M = 4


def program(ctx):
    return pipeline_run(ctx, "gpipe", ctx.knobs.get("m", M))


def checks(result) -> list[Check]:
    m = knob(result, "m", M)
    return pipeline_checks(result, "gpipe", [m] * result.world, m)


NARRATIVE = {
    "the schedule": """
        Pipeline parallelism gives each rank a block of layers; a batch is cut into micro-batches that flow
        through the stages. GPipe runs every forward first, then every backward (here in reverse order).
        The dots are the bubble: stage 1 waits for the others to fill and to drain. Each stage keeps the
        activations of all m micro-batches until their backward.""",
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
                figures=pipeline_figures, quiz=lambda result: pipeline_quiz(result, "gpipe"))

"""1F1B on 4 stages and 4 micro-batches: the same bubble as GPipe, but each stage holds at most p - r
micro-batches' activations."""
from __future__ import annotations

from parasim.lesson import Check, Lesson
from parasim.examples.pipeline import pipeline_checks, pipeline_run

M = 4


def program(ctx):
    return pipeline_run(ctx, "1f1b", M)


def checks(result) -> list[Check]:
    p = result.world
    return pipeline_checks(result, "1f1b", [p - r for r in range(p)], M)


NARRATIVE = {
    "the schedule": """
        1F1B starts a backward as soon as one is possible: after a warm-up of p - r - 1 forwards, each stage
        alternates one forward with one backward. The bubble is the same as GPipe's, but a stage never
        holds more than p - r micro-batches' activations, which is what makes many micro-batches
        affordable.""",
    "running it": """
        Executed, a stage posts each send together with its next receive, as Megatron pairs
        send-forward with receive-backward: two neighbours that both have something to send never wait
        on each other.""",
}

LESSON = Lesson(name="pp-1f1b", title="Pipeline parallelism: 1F1B keeps the bubble and bounds the memory",
                world=4, worlds=(2, 4), program=program, narrative=NARRATIVE, checks=checks,
                summary="4 stages x 4 micro-batches: warm-up, one forward one backward, at most p - r held",
                keep_values=0)

"""Interleaved 1F1B: each rank holds two thin chunks of the model instead of one thick block, so the
pipeline fills in half the time; the bubble shrinks, at the price of more transfers."""
from __future__ import annotations

from fractions import Fraction

from parasim.engine import run
from parasim.lesson import Check, Knob, Lesson, Picture, check, knob
from parasim.render.plot_moves import HANDOFF, plot_handoff
from parasim.examples.pipeline import matches_unsplit, pipeline_figures, pipeline_run
from parasim.pipeline.schedules import generate
from parasim.pipeline.timing import time_schedule

M, V = 4, 2


def program(ctx):
    return pipeline_run(ctx, "interleaved", ctx.knobs.get("m", M), ctx.knobs.get("chunks", V))


def _p2p(result) -> tuple[int, int]:
    sends = [e for e in result.trace.events if e.op == "p2p"]
    return len(sends), sum(e.members[0].sent for e in sends)


def _stages(values: list[dict]) -> int:
    """Into how many pipeline stages a run cut its model: the stages whose layers its ranks held."""
    return len({s for x in values for s in x["grad_sq"]})


def checks(result) -> list[Check]:
    v, p = result.values, result.world
    m, vv = knob(result, "m", M), knob(result, "chunks", V)  # micro-batches, chunks per GPU
    plain = run(lambda ctx: pipeline_run(ctx, "1f1b", m), p)
    (n, nbytes), (n1, nbytes1) = _p2p(result), _p2p(plain)
    one = time_schedule(generate("1f1b", p, m))
    # the same layers as this run (one per chunk) under 1F1B: cut into as many stages as the 1F1B run's,
    # so each of its actions runs chunks/stages layers and takes that many one-layer slots
    chunks, stages = _stages(v), _stages(plain.values)
    thick = time_schedule(generate("1f1b", p, m), {"F": chunks // stages, "B": chunks // stages})
    formula = Fraction(p - 1, vv * m + p - 1)
    if m >= p:  # the post's formulas: a round of p micro-batches fills the pipeline, so only fill and drain idle
        shape = [
            check("interleaved bubble = (p-1)/(v*m+p-1), measured", v[0]["bubble"], str(formula)),
            check("idle slots per rank, interleaved and 1F1B (on its own run): the same 2(p-1)",
                  [[x["idle"] for x in v], [x["idle"] for x in plain.values]], [[2 * (p - 1)] * p] * 2),
            check("so each rank idles 1/v as long as under 1F1B on the same layers (idle time over 1F1B's, timed)",
                  [Fraction(x["idle"], t) for x, t in zip(v, thick.idle)], [Fraction(1, vv)] * p),
        ]
    else:  # fewer micro-batches than stages: a round cannot fill the pipeline, and the formulas do not hold
        shape = [
            check(f"m = {m} < p = {p}: the bubble is larger than (p-1)/(v*m+p-1) = {formula} (measured "
                  f"{v[0]['bubble']}): a round of m micro-batches leaves stages waiting in the middle of the step",
                  Fraction(v[0]["bubble"]) > formula, True),
            check("idle slots per rank: more than 1F1B's 2(p-1), which only filling and draining cost",
                  [x["idle"] > t for x, t in zip(v, [2 * (p - 1)] * p)], [True] * p),
        ]
    return [
        check("1F1B's bubble, measured from its slot table", str(one.bubble), str(Fraction(p - 1, m + p - 1))),
        *shape[:2],
        check("each slot 1/v as long: time per action over 1F1B's on the same layers (an action runs one of "
              "the run's p*v chunks, not one of p stages)", Fraction(stages, chunks), Fraction(1, vv)),
        *shape[2:],
        check("each rank is busy 2vm slots of 1/v size", [x["makespan"] - x["idle"] for x in v], [2 * vv * m] * p),
        check("transfers: every chunk boundary crosses ranks, (pv-1) instead of (p-1)", n,
              2 * m * (p * vv - 1)),
        check("extra point-to-point traffic over 1F1B, measured in bytes", Fraction(nbytes, nbytes1),
              Fraction(p * vv - 1, p - 1)),
        check("1F1B's transfers, measured on its own run", n1, 2 * m * (p - 1)),
        *matches_unsplit(v, p * vv, m),
    ]


NARRATIVE = {
    "the schedule": """
        Each GPU now holds two chunks of half the depth: with 4 GPUs and 8 layers, GPU 1 (rank 0) holds
        layers 1 and 5, GPU 2 holds layers 2 and 6, and so on. Upper case marks a GPU's first chunk, lower
        case its second; a micro-batch goes round the GPUs twice. Filling and draining the pipeline still
        leaves each GPU 2(p-1) idle slots, as many as 1F1B, but a slot now runs a half-depth chunk instead
        of a whole stage, so each is half as long: the idle time halves while the work does not change, and
        the bubble fraction goes from (p-1)/(m+p-1) to (p-1)/(v*m+p-1).""",
    "running it": """
        What it costs is communication. Every chunk boundary is now a hop between GPUs (GPU 4 hands the
        output of layer 4 back to GPU 1 for layer 5), so a micro-batch makes p*v - 1 hops each way instead
        of p - 1: roughly v times the point-to-point traffic, (pv-1)/(p-1) exactly. The run counts the
        transfers and their bytes, and its loss and gradients still equal one device's. The formulas assume
        at least as many micro-batches as GPUs: with -m below --pp a round cannot keep every GPU busy, and
        the run shows a bubble larger than (p-1)/(v*m+p-1).""",
}

LESSON = Lesson(name="pp-interleaved", title="Pipeline parallelism: interleaving chunks halves the idle time",
                section="Pipeline parallelism: shrinking the bubble (interleaved stages)",
                order=140,
                picture=Picture(plot_handoff, HANDOFF),
                world=4, min_world=2, max_world=8, program=program, narrative=NARRATIVE, checks=checks,
                summary="4 GPUs x 2 chunks x 4 micro-batches: a smaller bubble for more transfers", keep_values=0,
                knobs={"pp": Knob(4, world=True), "m": Knob(M), "chunks": Knob(V, choices=(2, 3, 4))},
                figures=pipeline_figures)

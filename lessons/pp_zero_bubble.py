"""Zero-bubble schedules: split each backward into the part the previous stage waits for (the input
gradient) and the part nobody waits for (the weight gradient), and fill the pipeline's holes with the
latter. ZB-H1 and DualPipeV against 1F1B on 4 GPUs and 8 micro-batches."""
from __future__ import annotations

import dataclasses
from fractions import Fraction

from parasim.lesson import Check, Knob, Lesson, NOT_IN_POST, Picture, Table, check, knob
from parasim.render.plot_lessons import plot_zero_bubble
from parasim.examples.pipeline import matches_unsplit, pipeline_run

M = 8
# time in half-stage units, so one-chunk and two-chunk schedules share a clock: a full stage's forward
# takes 2, its backward 4 (input 2 + weights 2); a half-size chunk of DualPipeV takes half of each
STAGE = {"F": 2, "B": 4, "I": 2, "W": 2}
CHUNK = {k: c // 2 for k, c in STAGE.items()}
RUNS = (("1F1B", "1f1b", None, STAGE), ("ZB-H1", "zb-h1", None, STAGE), ("DualPipeV", "dualpipev", 2, CHUNK))


def program(ctx):
    group = ctx.new_group(range(ctx.world), "pp")
    m = ctx.knobs.get("m", M)
    return {title: pipeline_run(ctx, name, m, v, group, (f"{title}: the schedule", f"{title}: running it"), costs)
            for title, name, v, costs in RUNS}


def checks(result) -> list[Check]:
    vals, p, m = result.values, result.world, knob(result, "m", M)
    runs = {title: [x[title] for x in vals] for title, *_ in RUNS}
    span = {t: xs[0]["makespan"] for t, xs in runs.items()}
    F, B, I, W = STAGE["F"], STAGE["B"], STAGE["I"], STAGE["W"]
    held = {t: [Fraction(x["peak"], v or 1) for x in runs[t]] for t, _, v, _ in RUNS}  # in whole-stage units
    out = [
        check("1F1B makespan = m(F+B) + (p-1)(F+B), half-stage units", span["1F1B"], m * (F + B) + (p - 1) * (F + B)),
        check("ZB-H1 idle per GPU = (p-1)(F+I-W): a third of 1F1B's when F = I = W",
              [x["idle"] for x in runs["ZB-H1"]], [(p - 1) * (F + I - W)] * p),
        check("DualPipeV idle per GPU = (p-1)(F+I-W)/2: ZB-H1's, with half-depth chunks",
              [x["idle"] for x in runs["DualPipeV"]], [(p - 1) * (F + I - W) // 2] * p),
        check("makespans in half-stage slots, fastest first", [f"{t} {span[t]}" for t in sorted(span, key=span.get)],
              [f"{t} {span[t]}" for t in ("DualPipeV", "ZB-H1", "1F1B")]),
        check("bubbles of 1F1B and ZB-H1: idle over makespan, from their formulas",
              [runs[t][0]["bubble"] for t in ("1F1B", "ZB-H1")],
              [str(Fraction(p - 1, m + p - 1)), str(Fraction((p - 1) * (F + I - W), m * (F + B) + (p - 1) * (F + I - W)))]),
        check("1F1B holds p - r + 1 micro-batches on GPU r (r = 1 to p)", held["1F1B"],
              [p - r + 1 for r in range(1, p + 1)]),
        check("ZB-H1 holds p on every GPU (1F1B's worst case)", held["ZB-H1"], [p] * p),
        check("DualPipeV holds 2p+1 half-depth chunks on every GPU: p + 1/2 micro-batches' worth",
              held["DualPipeV"], [p + Fraction(1, 2)] * p),
        check("point-to-point sends: 2m per stage boundary between two GPUs (p - 1; DualPipeV's V 2(p - 1))",
              _sends(result), {t: 2 * m * (v or 1) * (p - 1) for t, _, v, _ in RUNS}),
        check("the same work on every GPU in each schedule", {t: [x["makespan"] - x["idle"] for x in xs]
                                                             for t, xs in runs.items()},
              {t: [m * (F + B)] * p for t in runs}),
    ]
    for title, _, v, _ in RUNS:
        out += [dataclasses.replace(c, name=f"{title}: {c.name}") for c in matches_unsplit(runs[title], p * (v or 1), m)]
    return out


def _number(x: Fraction) -> int | float:
    """A count as a number the table right-aligns: whole, or a half micro-batch's worth as a decimal (9/2: 4.5)."""
    return int(x) if x.denominator == 1 else float(x)


def tables(result) -> list[Table]:
    """The three schedules side by side, every cell from the runs: makespan, idle, bubble, what a GPU holds,
    and the model each ran (DualPipeV's is twice as deep, hence its own loss)."""
    vals, p, m = result.values, result.world, knob(result, "m", M)
    sends = _sends(result)
    rows = []
    for title, _, v, _ in RUNS:
        xs = [x[title] for x in vals]
        last = next(x for x in xs if x["has_loss"])
        idle = sorted({x["idle"] for x in xs})
        rows.append((title, [xs[0]["makespan"], idle[0] if len(idle) == 1 else f"{idle[0]}-{idle[-1]}",
                             xs[0]["bubble"], _number(max(Fraction(x["peak"], v or 1) for x in xs)), p * (v or 1),
                             sends[title], round(last["loss"], 4)]))
    cross = {t: _crossings(p, v) for t, _, v, _ in RUNS}
    return [Table(f"{p} GPUs, {m} micro-batches (time in half-stage units: a whole stage's F = 2, I = W = 2)",
                  ["schedule", "makespan", "idle per GPU", "bubble", "held (micro-batches)", "stages (layers)",
                   "transfers", "loss"], rows,
                  notes=["bubble: idle over makespan; held: the most activations a GPU keeps at once, in whole "
                         "micro-batches (DualPipeV's chunks are half one); stages: one layer each. DualPipeV runs "
                         f"{2 * p} half-depth stages, a model twice as deep as the {p} stages 1F1B and ZB-H1 run, so "
                         "its loss is that model's; each loss equals its own unsplit model's (the checks).",
                         "transfers: the point-to-point sends of each schedule's 'running it' phase, counted in the "
                         "trace: for each micro-batch an activation forward and a gradient back across every stage "
                         "boundary between two GPUs; "
                         + "; ".join(f"{t}: 2 x {m} x {cross[t]} = {sends[t]}" for t in sends)
                         + f". DualPipeV's {2 * p} stages have {2 * p - 1} boundaries, but its turn stays on GPU {p}, "
                         f"so {cross['DualPipeV']} cross GPUs: each pair of neighbouring GPUs carries two "
                         "activations and two gradients a micro-batch, one of each on the way down the V and one "
                         "on the way back."])]


def _crossings(p: int, v: int | None) -> int:
    """Stage boundaries between two GPUs: v p - 1 boundaries, less the v - 1 turns of a V that stay on one GPU."""
    return (v or 1) * p - 1 - ((v or 1) - 1)


def _sends(result) -> dict[str, int]:
    """Point-to-point sends of each schedule's 'running it' phase, counted in the trace."""
    return {title: sum(e.kind == "p2p" and e.phase == f"{title}: running it" for e in result.trace.events)
            for title, *_ in RUNS}


NARRATIVE = {
    "1F1B: the schedule": """
        The baseline, drawn with honest costs: a backward takes twice as long as a forward (one matmul for
        the input's gradient, one for the weights'). Time is counted in half-stage units so that all three
        schedules share a clock. 1F1B leaves each GPU idle for (p-1)(F+B), with B = I + W.""",
    "1F1B: running it": """
        Run for real: activations forward, gradients back, weight gradients added up over the micro-batches.""",
    "ZB-H1: the schedule": """
        ZB-H1 splits each backward in two. I, the input's gradient, is what the previous stage waits for, so
        it runs as soon as it can; W, the weights' gradient, is wanted by nobody until the optimizer step, so
        it is put off and slotted into the holes. GPU r lets its W passes lag r - 1 micro-batches behind. The
        idle time falls from 1F1B's (p-1)(F+I+W) to (p-1)(F+I-W): with F = I = W that is (p-1)F against
        3(p-1)F, a third. Every GPU holds at most p micro-batches, the same as 1F1B's first GPU.""",
    "ZB-H1: running it": """
        Executed, an I runs the backward with the weight-gradient work queued instead of done; the matching
        W runs the queue later. The gradients still come out exactly equal to the unsplit model's.""",
    "DualPipeV: the schedule": """
        DualPipeV (from DeepSeek-V3's DualPipe) folds a pipeline of 2p half-depth stages into a V: GPU 1
        holds the first and the last stage, the last GPU (GPU 4 at the post's p = 4) the two middle ones, so a
        micro-batch goes down the GPUs and back up (lower case: the way back). In the middle phase each GPU
        pairs one micro-batch's forward with another's backward, which lets the all-to-all of one hide
        behind the compute of the other. It needs at least 2p micro-batches. DeepSeek-V3's own DualPipe,
        the one the post names, feeds micro-batches in from both ends of the pipeline at once, and so keeps
        two copies of every stage's weights; DualPipeV feeds them from one end only and keeps one copy.""",
    "DualPipeV: running it": """
        The turn of the V needs no transfer (both stages sit on the last GPU), but every other hop is made
        twice per micro-batch, once on the way down and once on the way back. Counted in half-depth chunks a
        GPU holds at most 2p+1 activations, half a micro-batch more than ZB-H1, and the loss and gradients
        match one device's. That device runs the same 2p layers, one per half-depth stage: twice the depth of
        the model 1F1B and ZB-H1 split, which is why this loss is not theirs (the table puts the three side by
        side).""",
}

LESSON = Lesson(name="pp-zero-bubble", title="Pipeline parallelism: zero-bubble schedules fill the holes with W",
                section="Pipeline parallelism: shrinking the bubble (zero-bubble schedules)",
                order=150,
                picture=Picture(plot_zero_bubble, "the three schedules on one clock, each with its makespan and bubble"),
                world=4, min_world=2, max_world=8, program=program, narrative=NARRATIVE, checks=checks, tables=tables,
                summary="1F1B vs ZB-H1 vs DualPipeV on 4 GPUs x 8 micro-batches: makespan, bubble, memory",
                # each 'running it' phase: one transfer as an example, the rest counted (the slot tables and the
                # comparison table are the lesson; the table counts each schedule's transfers)
                events_shown=1,
                keep_values=0, knobs={"pp": Knob(4, world=True), "m": Knob(M, post=NOT_IN_POST)})

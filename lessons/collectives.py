"""The three collectives everything else is built from, run on virtual ranks.

Two ranks all-reduce, reduce-scatter and all-gather a 4-value vector; four ranks do the same all-reduce
as a ring, hop by hop; then the bytes each rank moves are measured for groups of 2, 4 and 8.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from parasim.examples.quiz import Question
from parasim.lesson import Check, Lesson, check

PAIR = 2  # ranks in the 2-GPU examples (a world of one rank runs them on itself)
RING = 4  # ranks in the hop-by-hop ring (2 if the world is smaller): it must divide the 4 values
SIZES = (2, 4, 8)  # group sizes for the byte counts, those that fit in the world
BUFFER = 1024  # float32 elements in the byte-count buffer


def pair_ranks(world: int) -> tuple[int, ...]:
    return tuple(range(min(PAIR, world)))


def ring_ranks(world: int) -> tuple[int, ...]:
    return tuple(range(RING if world >= RING else min(PAIR, world)))


def sizes(world: int) -> tuple[int, ...]:
    return tuple(t for t in SIZES if t <= world)


def vector(rank: int) -> list[int]:
    """Rank r holds 1..4 times 10^r: every digit of a sum tells which rank contributed it."""
    return [(10 ** rank) * v for v in (1, 2, 3, 4)]


def gradient(rank: int, n: int = 4) -> list[int]:
    """The gradient rank r's later work sends back for n values: 5, 6, ... times 10^r (digits tell whose)."""
    return [(10 ** rank) * v for v in range(5, 5 + n)]


def program(ctx):
    comm, out = ctx.comm, {}
    # Every rank creates every group, in the same order, as torch.distributed requires.
    pair = ctx.new_group(pair_ranks(ctx.world), "pair")
    ring = ctx.new_group(ring_ranks(ctx.world), "ring")
    sized = {t: ctx.new_group(range(t), f"t{t}") for t in sizes(ctx.world)}

    if ctx.rank in pair.ranks:
        x = ctx.asarray(vector(ctx.rank))
        ctx.phase("all-reduce")
        out["all_reduce"] = comm.all_reduce(x, group=pair, label="sum on both")
        ctx.phase("reduce-scatter")
        out["reduce_scatter"] = comm.reduce_scatter(x, group=pair, label="sum, keep my half")
        ctx.phase("all-gather")
        out["all_gather"] = comm.all_gather(out["reduce_scatter"], group=pair, label="halves back to whole")
        ctx.phase("backward: a copy's gradient is a sum")
        # the all-gather gave every rank a copy of each half; each rank's later work sends back a gradient
        # for its whole copy, and a half's gradient is the sum over the copies: a reduce-scatter
        dy = ctx.asarray(gradient(ctx.rank))
        out["gather_backward"] = comm.reduce_scatter(dy, group=pair, label="all-gather's backward: sum the copies")
        # the reduce-scatter's output half fed on from this rank only; every rank's input fed that half of the
        # sum, so each gets the half's gradient: the halves gathered
        dz = ctx.asarray(gradient(ctx.rank, len(vector(0)) // len(pair.ranks)))
        out["scatter_backward"] = comm.all_gather(dz, group=pair, label="reduce-scatter's backward: copy the halves")

    if ctx.rank in ring.ranks:
        x = ctx.asarray(vector(ctx.rank))
        ctx.phase("ring all-reduce")
        out["ring"] = comm.all_reduce(x, group=ring, algo="ring", label=f"{ring.size} ranks, hop by hop")
        ctx.phase("all-reduce = reduce-scatter + all-gather")
        part = comm.reduce_scatter(x, group=ring, algo="ring", label="first half of the ring")
        out["rs_ag"] = comm.all_gather(part, group=ring, algo="ring", label="second half of the ring")

    ctx.phase("bytes per rank")
    buf = ctx.rng.integers(0, 100, (BUFFER,), dtype="float32")
    for t, g in sized.items():
        if ctx.rank in g.ranks:
            chunk = comm.reduce_scatter(buf, group=g, algo="ring", label=f"t={t}")
            comm.all_gather(chunk, group=g, algo="ring", label=f"t={t}")
            comm.all_reduce(buf, group=g, algo="ring", label=f"t={t}")
    return out


def _events(result, phase: str, op: str, t: int | None = None):
    return [e for e in result.trace.events
            if e.phase == phase and e.op == op and (t is None or len(e.members) == t)]


def checks(result) -> list[Check]:
    v, ring = result.values, ring_ranks(result.world)
    pair = pair_ranks(result.world)
    pair_sum = np.sum([vector(r) for r in pair], axis=0)
    ring_sum = np.sum([vector(r) for r in ring], axis=0)
    halves = np.split(pair_sum, len(pair))
    out = [
        check(f"all-reduce on {len(pair)} ranks: every rank holds the sum", [v[r]["all_reduce"] for r in pair],
              [pair_sum] * len(pair)),
        check(f"reduce-scatter on {len(pair)} ranks: rank i keeps chunk i of the sum",
              [v[r]["reduce_scatter"] for r in pair],
              halves),
        check(f"all-gather on {len(pair)} ranks: the chunks, whole again", [v[r]["all_gather"] for r in pair],
              [pair_sum] * len(pair)),
        check(f"ring all-reduce on {len(ring)} ranks equals the sum", [v[r]["ring"] for r in ring],
              [ring_sum] * len(ring)),
        # by hand: y_r = [x_0, x_1] on every rank r, so dL/dx_i = sum_r dy_r[half i]; z_i = sum_r x_r[half i],
        # so dL/dx_r = [dz_0, dz_1] on every rank r
        check("an all-gather's backward: half i's gradient sums every rank's gradient for half i (a reduce-scatter)",
              [v[r]["gather_backward"] for r in pair],
              np.split(np.sum([gradient(r) for r in pair], axis=0), len(pair))),
        check("a reduce-scatter's backward: every rank gets each half's gradient (an all-gather)",
              [v[r]["scatter_backward"] for r in pair],
              [np.concatenate([gradient(i, 4 // len(pair)) for i in pair])] * len(pair)),
    ]
    ring_ar = _events(result, "ring all-reduce", "all_reduce")[0]
    t = len(ring)
    out.append(check("ring all-reduce takes t-1 reduce-scatter hops, then t-1 all-gather hops",
                     [sum(h["phase"] == p for h in ring_ar.hops) for p in ("reduce-scatter", "all-gather")],
                     [t - 1, t - 1]))
    phase = "all-reduce = reduce-scatter + all-gather"
    rs, ag = _events(result, phase, "reduce_scatter")[0], _events(result, phase, "all_gather")[0]
    out.append(check("reduce-scatter then all-gather gives the all-reduce's values",
                     [v[r]["rs_ag"] for r in ring], [v[r]["ring"] for r in ring]))
    out.append(check("... and moves the same bytes per rank (measured hop by hop)",
                     [m.sent + n.sent for m, n in zip(rs.members, ag.members)], [m.sent for m in ring_ar.members]))

    nbytes = BUFFER * np.dtype(np.float32).itemsize
    for t in sizes(result.world):
        for op, factor in (("reduce_scatter", 1), ("all_gather", 1), ("all_reduce", 2)):
            e = _events(result, "bytes per rank", op, t)[0]
            share = Fraction(factor * (t - 1), t)
            out.append(check(f"{op} on {t} ranks: every rank sends {factor * (t - 1)}/{t} of the {nbytes} B buffer",
                             sorted({m.sent for m in e.members}), [int(share * nbytes)]))
    return out


def quiz(result) -> list[Question]:
    """Bytes a rank sends in the largest group's ring all-reduce and all-gather, asked before the walk-through
    shows them, answered by the bytes the run counted hop by hop."""
    if not sizes(result.world):
        return []
    t, nbytes = max(sizes(result.world)), BUFFER * np.dtype(np.float32).itemsize
    out = []
    for op, words, factor, how in (
        ("all_reduce", "an all-reduce", 2, "a reduce-scatter, then an all-gather, each rank sending every chunk but one "
                                          "in each"),
        ("all_gather", "an all-gather", 1, "each rank sends on every chunk but one"),
    ):
        sent = max(m.sent for m in _events(result, "bytes per rank", op, t)[0].members)
        out.append(Question(
            f"{t} ranks run {words} of a {nbytes:,}-byte float32 buffer as a ring: how many bytes does each rank "
            "send?", sent, "bytes",
            f"{how}: {factor} x (t - 1)/t of the buffer = {factor} x {t - 1}/{t} x {nbytes:,} B = {sent:,} B"))
    return out


NARRATIVE = {
    "all-reduce": """
        Two ranks each hold a vector of four numbers. After an all-reduce both hold the element-wise sum.
        Nothing else changes: same shape in, same shape out, on every rank.""",
    "reduce-scatter": """
        A reduce-scatter computes the same sum but hands each rank only its own slice of it: rank 0 keeps
        the first half, rank 1 the second. Each rank ends with half the memory and half the traffic of an
        all-reduce.""",
    "all-gather": """
        An all-gather is the way back: every rank contributes its slice and every rank ends with all of
        them, in rank order. Reduce-scatter followed by all-gather is exactly an all-reduce.""",
    "backward: a copy's gradient is a sum": """
        The second fact: when a value is copied, its gradient is the sum of the copies' gradients. An
        all-gather gives every rank a copy of each half; in backward every rank holds a gradient for its
        whole copy (5..8 times 10^r here), and half i's gradient adds up what every copy of it got: a
        reduce-scatter. The other way round, each half of a reduce-scatter's sum came from every rank's
        input, so every rank gets that half's gradient back: an all-gather. So a layer that all-gathers
        forward reduce-scatters backward (sequence parallelism's pair), and the reverse.""",
    "ring all-reduce": """
        Real libraries run these collectives as a ring: each rank only ever talks to its neighbour. The
        buffer is cut into one chunk per rank. In the first t-1 hops each rank passes a running sum on and
        the receiver adds its own part (reduce-scatter); in the next t-1 hops the finished chunks travel
        round (all-gather). The inputs are powers of ten, so the digits of every partial sum show which
        ranks it already contains.""",
    "all-reduce = reduce-scatter + all-gather": """
        Running the two halves as separate collectives gives the same numbers and moves the same bytes
        per rank as the all-reduce above: an all-reduce is nothing more than the pair.""",
    "bytes per rank": """
        How much does each rank send? In a ring reduce-scatter or all-gather every chunk but one passes
        through each rank: (t-1)/t of the buffer. An all-reduce is both, 2(t-1)/t. The counts below are
        added up hop by hop for groups of 2, 4 and 8 ranks, a 4 KB float32 buffer each; the fraction
        approaches 1 (or 2) as t grows, so the cost per rank barely depends on how many ranks there are.""",
}

LESSON = Lesson(
    no_picture="a ring's hops are its picture, and the app draws them (press t on an event)",
    name="collectives",
    section="First: the three collectives",
    order=10,
    title="The three collectives: all-reduce, reduce-scatter, all-gather",
    world=8,
    min_world=1,
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="all-reduce, reduce-scatter and all-gather on 2 ranks; the ring hop by hop; bytes per rank "
            "(--world sets the ranks, and so the groups measured; no other setting: the examples are the post's)",
    keep_values=16,
    quiz=quiz,
)

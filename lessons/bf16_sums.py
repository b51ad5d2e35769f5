"""What summing in bfloat16 does to a gradient all-reduce, against float32 and float64.

Every data-parallel rank holds a gradient in bfloat16, as a bf16 backward pass leaves it. bfloat16 keeps
float32's 8 exponent bits but only 8 significant bits, so each addition of an all-reduce rounds its running
sum to 8 bits. The same gradients are summed over the ranks in bfloat16, in float32 and in float64; float64
is exact here, so the errors of the other two are measured, not estimated. A one-element example first shows
that in bfloat16 the order of the additions changes the answer, then groups of 2, 4 and 8 ranks show the
error growing with the number of additions.
"""
from __future__ import annotations

import math

import numpy as np

from parasim.lesson import Check, Lesson, check

N = 1024  # gradient values per rank
SIZES = (2, 4, 8)  # group sizes for "more ranks, more roundings", those that fit in the world
SMALL = 2.0 ** -8  # half a bfloat16 unit at 1.0: 1 + SMALL is a tie, and ties round to the even 1.0
# Gradient magnitudes lie in [SMALL, 1): a sum of up to 8 of them needs at most 8 + 8 + 3 = 19 significant
# bits, which float32 (24) and float64 (53) hold exactly in any order. So float64 is the exact sum, and any
# difference from it comes from bfloat16's 8 bits alone.
BF16_BITS = 8


def sizes(world: int) -> tuple[int, ...]:
    return tuple(t for t in SIZES if t <= world)


def _floats(x) -> list[float]:
    return [float(v) for v in np.asarray(x.tolist(), dtype=np.float64).reshape(-1)]


def errors(got: list[float], exact: list[float], terms: list[float]) -> dict:
    """How far summed values are from the exact sums: how many differ, the median relative error and the error
    of the whole vector (its length), in percent, and the worst error as a share of the magnitudes that were
    added (`terms`: the sum of |value| over the ranks; an exact sum near zero makes relative errors huge)."""
    rel = sorted(abs(g - e) / abs(e) for g, e in zip(got, exact) if e != 0)
    gap = math.sqrt(sum((g - e) ** 2 for g, e in zip(got, exact)))
    return {"off": sum(g != e for g, e in zip(got, exact)), "of": len(exact), "median_pct": 100 * rel[len(rel) // 2],
            "norm_pct": 100 * gap / math.sqrt(sum(e * e for e in exact)),
            "worst_pct": 100 * max(abs(g - e) / m for g, e, m in zip(got, exact, terms))}


def _say(e: dict) -> str:
    return (f"{e['off']} of {e['of']} sums differ from the exact ones; median relative error {e['median_pct']:.3f}%, "
            f"error of the whole summed gradient {e['norm_pct']:.3f}% of its length, worst element off by "
            f"{e['worst_pct']:.3f}% of the magnitudes added into it")


def _quiet(text: str, **data) -> None:
    """A note nobody leaves."""


def program(ctx):
    xp, comm = ctx.xp, ctx.comm
    f32, f64 = ctx.dtype("float32"), ctx.dtype("float64")
    sized = {t: ctx.new_group(range(t), f"dp{t}") for t in sizes(ctx.world)}
    out: dict = {}

    ctx.phase("one element, every rank")
    x = ctx.asarray([1.0 if ctx.rank == 0 else SMALL], "bfloat16")
    one = {"bf16": comm.all_reduce(x, label="in bfloat16"),
           "fp32": comm.all_reduce(xp.astype(x, f32), label="in float32")}
    every = comm.all_gather(x, label="every rank's value, to add them in rank order")
    acc = every[0:1]
    for r in range(1, ctx.world):  # rank 0's 1.0 first, then each 2^-8 in turn, rounding after every step
        acc = acc + every[r:r + 1]
    one["rank_order"] = acc
    out["one"] = one
    got = {k: _floats(v)[0] for k, v in one.items()}
    # every rank computes the same figures: rank 0 tells them, once, for the whole run
    say = (lambda text, **data: ctx.note(text, run=True, **data)) if ctx.rank == 0 else _quiet
    say(f"exact sum 1 + {ctx.world - 1} x 2^-8 = {1 + (ctx.world - 1) * SMALL:.10g}; float32 gives "
        f"{got['fp32']:.10g}, the bfloat16 all-reduce {got['bf16']:.10g}, bfloat16 in rank order "
        f"{got['rank_order']:.10g}", example=got)

    ctx.phase("gradients in bfloat16")
    magnitude = ctx.rng.uniform((N,), SMALL, 1.0, dtype="bfloat16")
    sign = ctx.rng.integers(0, 2, (N,), dtype="bfloat16") * 2 - 1
    g = magnitude * sign  # exact: a sign flip
    out["grad"] = g
    say(f"every rank holds {N} gradient values of 8 significant bits, magnitudes from 2^-8 to 1")

    ctx.phase("summed in bfloat16")
    out["bf16"] = comm.all_reduce(g, label="gradients, bfloat16 sums")
    ctx.phase("summed in float32")
    out["fp32"] = comm.all_reduce(xp.astype(g, f32), label="gradients, float32 sums")
    ctx.phase("summed in float64")
    out["fp64"] = comm.all_reduce(xp.astype(g, f64), label="gradients, float64 sums (exact here)")

    ctx.phase("the error")
    exact = _floats(out["fp64"])
    terms = _floats(comm.all_reduce(xp.abs(xp.astype(g, f64)), label="magnitudes added into each sum"))
    figures = {"bf16": errors(_floats(out["bf16"]), exact, terms), "fp32": errors(_floats(out["fp32"]), exact, terms)}
    out["figures"] = figures
    say(f"bfloat16 all-reduce over {ctx.world} ranks: {_say(figures['bf16'])}", errors=figures["bf16"],
        dtype="bfloat16")
    say(f"float32 all-reduce: {_say(figures['fp32'])}", errors=figures["fp32"], dtype="float32")

    ctx.phase("more ranks, more roundings")
    grown = {}
    for t, grp in sized.items():
        if ctx.rank in grp.ranks:
            s16 = comm.all_reduce(g, group=grp, label=f"t={t}, bfloat16")
            s64 = comm.all_reduce(xp.astype(g, f64), group=grp, label=f"t={t}, float64")
            size = comm.all_reduce(xp.abs(xp.astype(g, f64)), group=grp, label=f"t={t}, magnitudes")
            grown[t] = {"bf16": s16, "fp64": s64, "errors": errors(_floats(s16), _floats(s64), _floats(size))}
            say(f"{t} ranks ({t - 1} addition{'s' if t > 2 else ''} per element): {_say(grown[t]['errors'])}",
                ranks=t, errors=grown[t]["errors"])
    out["by_size"] = grown
    return out


def checks(result) -> list[Check]:
    v, world = result.values, result.world
    grads = np.stack([np.asarray(v[r]["grad"], dtype=np.float64) for r in range(world)])  # exact: bf16 in float64
    exact = grads.sum(axis=0)  # at most 19 significant bits: exact in float64 in any order
    bound = (world - 1) * 2.0 ** -BF16_BITS * np.abs(grads).sum(axis=0)  # t - 1 roundings of at most half a unit
    one = {k: float(np.asarray(x, dtype=np.float64)[0]) for k, x in v[0]["one"].items()}
    ring_first = float(np.asarray(1 + (world - 1) * SMALL).astype(np.dtype("bfloat16")))
    out = [
        check("one element: float32 holds the exact 1 + (t - 1) * 2^-8", one["fp32"], 1 + (world - 1) * SMALL),
        check("one element, in rank order: every 2^-8 is a tie at 1.0 and rounds to even, so 1.0 stays",
              one["rank_order"], 1.0),
        check("one element, the all-reduce: the small values are added first (gloo's ring ends at rank 0), "
              "then the sum rounds once", one["bf16"], ring_first),
        check("float64 all-reduce equals the exact sum of the gradients (numpy, float64)",
              np.asarray(v[0]["fp64"], dtype=np.float64), exact),
        check("float32 all-reduce equals it too: 19 bits fit in float32's 24",
              np.asarray(v[0]["fp32"], dtype=np.float64), exact),
        check(f"bfloat16 all-reduce is off by at most {world - 1} roundings of half a unit of the running sum",
              bool(np.all(np.abs(np.asarray(v[0]["bf16"], dtype=np.float64) - exact) <= bound)), True),
        check("every rank holds the same bfloat16 sums",
              [np.asarray(v[r]["bf16"], dtype=np.float64).tolist() for r in range(world)],
              [np.asarray(v[0]["bf16"], dtype=np.float64).tolist()] * world),
        check("the figures count what differs from the exact sum",
              [v[0]["figures"]["bf16"]["off"], v[0]["figures"]["fp32"]["off"]],
              [int(np.sum(np.asarray(v[0]["bf16"], dtype=np.float64) != exact)), 0]),
    ]
    grown = v[0]["by_size"]
    if len(grown) > 1:
        worst = [grown[t]["errors"]["norm_pct"] for t in sorted(grown)]
        out.append(check("the summed gradient's error grows with the number of ranks summed",
                         worst == sorted(worst) and worst[0] < worst[-1], True))
    return out


# The frameworks named below, from their sources: Megatron-LM's megatron/training/arguments.py (the flag and its
# help text) and training.py (DistributedDataParallelConfig(grad_reduce_in_fp32=
# args.accumulate_allreduce_grads_in_fp32)); megatron-core 0.16.1's distributed_data_parallel_config.py
# (grad_reduce_in_fp32: "If true, reduce grads in fp32."); torch 2.13's torch/distributed/fsdp/api.py
# (MixedPrecision.reduce_dtype, "to force gradient reduction to run in full precision").
NARRATIVE = {
    "one element, every rank": """
        Rank 0 holds 1.0 and every other rank 2^-8. bfloat16 has 8 significant bits, so next to 1.0 its
        values step by 2^-7: 1 + 2^-8 lies exactly halfway and rounds to the even neighbour, 1.0. Added in
        rank order, each 2^-8 is lost in turn and the sum stays 1.0. gloo's all-reduce (and virtual ranks,
        which add in its order) passes each chunk down a ring that ends at the chunk's owner, here rank 0,
        so the small values meet first, add up exactly, and the total rounds once, to the nearest bfloat16.
        The same numbers, two answers: in bfloat16 the order of the additions is part of the result. float32
        gets the exact sum either way.""",
    "gradients in bfloat16": """
        Each rank now holds 1,024 gradient values, already in bfloat16, with magnitudes between 2^-8 and 1
        and random signs. Any sum of eight of them fits in 19 significant bits, so float32 and float64 hold
        it exactly and float64 serves as the exact answer.""",
    "summed in bfloat16": """
        The gradient all-reduce in bfloat16, the dtype the gradients are in: every one of the t - 1
        additions of each element rounds the running sum to 8 bits.""",
    "summed in float32": """
        The same gradients turned into float32 first, then all-reduced: twice the bytes on the wire, and
        sums with 24 significant bits. Megatron-LM does this with --accumulate-allreduce-grads-in-fp32
        ("Gradient accumulation and all-reduce in fp32"), which Megatron-Core calls grad_reduce_in_fp32 in
        its DistributedDataParallelConfig; PyTorch FSDP's MixedPrecision(reduce_dtype=torch.float32) asks
        for the same.""",
    "summed in float64": """
        And in float64, which is exact for these values: the reference both other sums are measured against.""",
    "the error": """
        The figures compare each sum with the exact one: how many of the 1,024 elements differ, the median
        relative error, the error of the whole summed gradient as a share of its length, and the worst
        element's error as a share of the magnitudes added into it (a sum that nearly cancels to zero has a
        huge relative error from a tiny mistake). float32 is exact. bfloat16 is off in most elements, by a
        fraction of a percent: small next to the gradient itself, but paid again at every step of training,
        by every element.""",
    "more ranks, more roundings": """
        The same bfloat16 gradients summed over 2, 4 and 8 ranks: each extra rank is one more rounding of the
        running sum, so the error grows with the data-parallel size. float32 would stay exact for these values
        up to about 256 ranks (8 bits of value, 8 of spread, 8 more for the count fill its 24). This is why
        gradients are reduced in float32 even when they are computed in bfloat16.""",
}

LESSON = Lesson(
    no_picture="its story is one sum's digits and each element's error, which its lines print exactly",
    name="bf16-sums",
    section="First: the three collectives (sums in low precision)",
    order=20,
    title="bfloat16 gradients all-reduced in bfloat16, float32 and float64",
    world=8,
    min_world=2,
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="one element whose bf16 sum depends on the order; 8 ranks' gradients summed in bf16 vs fp32 vs "
            "float64: the error, and its growth with the ranks (--world sets the ranks, and so the groups; no other "
            "setting: the one-element example is the post's)",
    keep_values=8,
)

"""engine/divergence.py piece by piece: the error measure, marks read back with their defaults, the report
when nothing came before the mark, alternative placements, tolerances by dtype, the collective and site a
divergence is pinned on. Expected values are written out here."""
import ml_dtypes
import numpy as np
import pytest

import parasim
from parasim.engine.divergence import Marked, allowance, assemble, collect, first_divergence, max_error
from parasim.errors import UsageError
from parasim.comm.trace import Mark, Trace

KEEP = 10 ** 6


def test_the_error_measure():
    assert max_error(np.zeros((2, 3)), np.zeros((3, 2))) == (float("inf"), float("inf"))
    assert max_error(np.zeros(0), np.zeros(0)) == (0.0, 0.0)
    assert max_error(np.zeros(2), np.zeros(2)) == (0.0, 0.0)
    assert max_error(np.array([0.5, 0.0]), np.zeros(2)) == (0.5, float("inf"))
    assert max_error(np.array([1.0, 3.0]), np.array([2.0, 4.0])) == (1.0, 0.25)
    # complex on either side: the difference keeps its imaginary part (|3 + 4j - 0| = 5, |4j| = 4)
    assert max_error(np.array([3 + 4j]), np.array([0.0 + 4j])) == (3.0, 0.75)
    assert max_error(np.array([0.0]), np.array([3 + 4j])) == (5.0, 1.0)
    assert max_error(np.array([3 + 4j]), np.array([3.0])) == (4.0, 4 / 3)
    assert max_error(np.array([1, 250], np.uint8), np.array([2, 0], np.uint8)) == (250.0, 125.0)  # no wrap-around


def test_marks_read_back_with_their_defaults():
    trace = Trace(2, marks=[Mark(1, 0, "tensor", "x", None), Mark(0, 0, "note", "hello", None),
                            Mark(0, 1, "tensor", "x", None)])
    got = collect(trace, [[("x", np.array([1.0]))], [("x", np.array([2.0]))]])
    (one, zero) = got["x"]
    assert (one.group, one.placement, one.group_name, one.steps, one.order) == ((1,), "Replicate()", "", {1: 0}, 0)
    assert (zero.group, zero.steps, zero.order) == ((0,), {0: 1}, 2)
    with pytest.raises(UsageError, match="out of step"):
        collect(trace, [[("y", np.array([1.0]))], [("x", np.array([2.0]))]])


def _ref(ctx):
    ctx.mark("x", ctx.asarray([1.0, 2.0, 3.0]))


def test_runs_without_marks_or_names_are_refused():
    run = parasim.run(lambda ctx: ctx.mark("y", ctx.asarray([1.0])), 1)
    with pytest.raises(UsageError, match="the reference marks no tensor named 'y'"):
        first_divergence(run, parasim.run(_ref, 1))
    real_like = parasim.run(_ref, 1)
    real_like.marked = None
    with pytest.raises(UsageError, match="run both on virtual ranks"):
        first_divergence(real_like, parasim.run(_ref, 1))
    with pytest.raises(UsageError, match="run both on virtual ranks"):
        first_divergence(parasim.run(_ref, 1), real_like)


def test_a_divergence_before_any_collective_has_no_event():
    d = first_divergence(parasim.run(lambda ctx: ctx.mark("x", ctx.asarray([1.0, 2.0, 4.0])), 1), parasim.run(_ref, 1))
    assert {k: d[k] for k in ("event", "op", "group", "label", "site", "would_match")} == dict.fromkeys(
        ("event", "op", "group", "label", "site", "would_match"))
    assert d["ranks"] == [0] and d["got"] == [1.0, 2.0, 4.0] and d["want"] == [1.0, 2.0, 3.0]
    assert (d["max_abs"], d["max_rel"], d["placement"], d["marked_on"]) == (1.0, 1 / 3, "Replicate()", "world[0]")


def test_large_tensors_are_not_copied_into_the_report():
    big = parasim.run(lambda ctx: ctx.mark("x", ctx.asarray(np.arange(33.0))), 1)
    d = first_divergence(big, parasim.run(lambda ctx: ctx.mark("x", ctx.asarray(np.arange(33.0) + 1)), 1))
    assert d["got"] is None and d["want"] is None
    edge = parasim.run(lambda ctx: ctx.mark("x", ctx.asarray(np.arange(32.0))), 1)
    d = first_divergence(edge, parasim.run(lambda ctx: ctx.mark("x", ctx.asarray(np.arange(32.0) + 1)), 1))
    assert d["got"] == list(np.arange(32.0)) and d["want"] == list(np.arange(32.0) + 1)


def test_whole_copies_marked_as_partial_are_recognised():
    def program(ctx):
        tp = ctx.new_group([0, 1], "tp")
        ctx.comm.barrier(group=tp)
        ctx.mark("x", ctx.asarray([1.0, 2.0, 3.0]), "Partial()", tp)
    d = first_divergence(parasim.run(program, 2), parasim.run(_ref, 1))
    assert d["would_match"] == "taking them as whole copies on tp would match"
    assert d["event"] == 0 and d["op"] == "barrier" and d["ranks"] == [0, 1] and d["group"] == "tp[0, 1]"


def test_copies_that_differ_are_not_called_whole():
    def program(ctx):
        tp = ctx.new_group([0, 1], "tp")
        ctx.comm.barrier(group=tp)
        ctx.mark("x", ctx.asarray([1.0, 2.0, 3.0]) * (1 + ctx.rank), "Partial()", tp)
    d = first_divergence(parasim.run(program, 2), parasim.run(_ref, 1))
    assert d["would_match"] is None or "whole copies" not in d["would_match"]


def test_float32_is_judged_by_its_own_tolerance():
    def program(ctx, noise):
        ctx.mark("x", ctx.asarray(np.array([1.0, 2.0, 3.0]) * (1 + noise), dtype="float32"))

    def ref(ctx):
        ctx.mark("x", ctx.asarray([1.0, 2.0, 3.0], dtype="float32"))
    # one float32 rounding on each side, of the largest value 3: 2 * 2^-24 / (1 - 2^-24) of it (float64's
    # would be 2^29 times smaller, and refuse a noise of 1e-7)
    assert first_divergence(parasim.run(lambda ctx: program(ctx, 1e-7), 1), parasim.run(ref, 1)) is None
    d = first_divergence(parasim.run(lambda ctx: program(ctx, 1e-6), 1), parasim.run(ref, 1))
    assert d is not None and d["tolerance"] == pytest.approx(2 * 2.0 ** -24 / (1 - 2.0 ** -24), rel=1e-12)


def test_the_pinned_collective_and_site_skip_compute_steps_and_other_members(tmp_path):
    src = tmp_path / "sites.py"
    src.write_text(
        "def program(ctx):\n"
        "    g = ctx.new_group([0, 1], 'dp')\n"
        "    ctx.compute('warm up')\n"
        "    if ctx.rank == 0:\n"
        "        ctx.comm.all_reduce(ctx.asarray([1.0]), group=g, label='sum')  # rank 0's line\n"
        "    else:\n"
        "        y = ctx.comm.all_reduce(ctx.asarray([1.0]), group=g, label='sum')  # rank 1's line\n"
        "        ctx.compute('after')\n"
        "        ctx.mark('y', y, 'Replicate()', ctx.new_group([1], 'one'))\n"
        "    if ctx.rank == 0:\n"
        "        ctx.new_group([1], 'one')\n")
    from parasim.lesson import program_lesson
    program = program_lesson(f"{src}:program", 2).program
    d = first_divergence(parasim.run(program, 2, keep_values=KEEP),
                         parasim.run(lambda ctx: ctx.mark("y", ctx.asarray([3.0])), 1))
    assert d["op"] == "all_reduce" and d["label"] == "sum" and d["ranks"] == [0, 1]
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if text.endswith("# rank 1's line"))
    assert d["site"].endswith(f"sites.py:{line}")  # the marking rank's own line, not rank 0's
    assert d["would_match"] == "the reference times 0.666667: only a scale differs (a clipping factor, an average " \
                               "over another count, a loss scale)"


def test_integer_tensors_are_compared_exactly():
    def ref(ctx):
        ctx.mark("n", ctx.asarray([1, 2, 3], dtype="int64"))
    same = parasim.run(lambda ctx: ctx.mark("n", ctx.asarray([1, 2, 3], dtype="int64")), 1)
    assert first_divergence(same, parasim.run(ref, 1)) is None
    off = parasim.run(lambda ctx: ctx.mark("n", ctx.asarray([1, 2, 4], dtype="int64")), 1)
    assert first_divergence(off, parasim.run(ref, 1))["max_abs"] == 1


def test_an_average_over_the_wrong_group_names_the_right_one():
    """4 ranks; 'pair' {0,1} {2,3} is right, 'cross' {0,2} {1,3} is what ran (op avg). A group that covers
    only some ranks ('solo') comes first and is passed over; another all-reduce on ranks 2 and 3 between
    the sum and the mark must not be taken for the sum's inputs."""
    def program(ctx):
        solo = [ctx.new_group([0], "solo")][0]
        pair = [ctx.new_group(r, "pair") for r in ([0, 1], [2, 3])][ctx.rank // 2]
        cross = [ctx.new_group(r, "cross") for r in ([0, 2], [1, 3])][ctx.rank % 2]
        g = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
        avg = ctx.comm.all_reduce(g, op="avg", group=cross, label="average the gradients")
        if ctx.rank >= 2:
            ctx.comm.all_reduce(ctx.asarray([100.0, 100.0]), group=pair, label="something else")
        else:
            ctx.compute("wait")
            ctx.compute("wait")
            ctx.mark("avg", avg, "Replicate()", pair)
        del solo

    def ref(ctx):
        ctx.mark("avg", ctx.asarray([1.0, 2.0]) * 1.5)  # ranks 0 and 1 averaged
    d = first_divergence(parasim.run(program, 4, keep_values=KEEP), parasim.run(ref, 1))
    assert d["label"] == "average the gradients" and d["group"].startswith("cross")
    assert d["would_match"] == "all_reduce over pair instead of cross would match"


def test_a_scale_is_reported_with_its_sign_and_size():
    def ref(ctx):
        ctx.mark("x", ctx.asarray([1.0, -2.0, 3.0]))
    for factor, word in ((-1.0, "-1"), (2.0, "2"), (0.5, "0.5")):
        d = first_divergence(parasim.run(lambda ctx: ctx.mark("x", ctx.asarray([1.0, -2.0, 3.0]) * factor), 1),
                             parasim.run(ref, 1))
        assert d["would_match"].startswith(f"the reference times {word}: only a scale differs"), factor
    other_size = first_divergence(parasim.run(lambda ctx: ctx.mark("x", ctx.asarray([1.0, 2.0])), 1),
                                  parasim.run(ref, 1))
    assert other_size["max_abs"] == float("inf") and other_size["would_match"] is None


def _marked(placement: str, pieces: dict) -> Marked:
    return Marked("x", placement, tuple(pieces), "tp", pieces, {r: 0 for r in pieces}, 0)


def _dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _two_gamma(k: int, u: float) -> float:  # 2 k u / (1 - k u), written out here
    return 2 * k * u / (1 - k * u)


def test_the_allowance_of_a_copy_is_its_coarser_dtypes_roundings_of_the_largest_value():
    """float32 pieces against a float64 reference: float32's unit roundoff (2^-24); the most roundings counted
    on the ranks that hold a piece (rank 3 counted 4: ranks 0 and 2, counting 9, hold none), of the largest
    finite magnitude of the reference (4; the infinity and the NaN are not magnitudes)."""
    m = _marked("Replicate()", {1: np.float32([1, 2, 3]), 3: np.float32([1, 2, 3])})
    ref = _marked("Replicate()", {0: np.float64([1, -4, np.inf])})
    want = np.array([1.0, -4.0, np.inf, np.nan])
    rel, allow = allowance([9, 2, 9, 4], [3], m, ref, want)
    bound = _two_gamma(4, 2.0 ** -24) * 4
    assert (allow.dtype, allow.roundings, allow.of, allow.gap) == ("float32", 4, "the terms' largest magnitude", 0.0)
    assert allow.bound == pytest.approx(bound, rel=1e-12) and rel == pytest.approx(bound / 4, rel=1e-12)
    # the reference's ranks counted more (6): its count is the one taken
    assert allowance([9, 2, 9, 4], [6], m, ref, want)[1].roundings == 6
    # nothing counted anywhere: one rounding still
    assert allowance([0, 0, 0, 0], [0], m, ref, want)[1].roundings == 1


def test_the_allowance_takes_the_coarsest_dtype_of_either_side():
    want = np.array([2.0])
    for run_dtype, ref_dtype, coarser, u in [("float16", "bfloat16", "bfloat16", 2.0 ** -8),
                                             ("bfloat16", "float16", "bfloat16", 2.0 ** -8),
                                             ("float32", "float16", "float16", 2.0 ** -11),
                                             ("int64", "int32", "float64", 2.0 ** -53)]:
        m = _marked("Replicate()", {0: np.zeros(1, _dtype(run_dtype))})
        ref = _marked("Replicate()", {0: np.zeros(1, _dtype(ref_dtype))})
        rel, allow = allowance([2], [1], m, ref, want)
        assert allow.dtype == coarser, (run_dtype, ref_dtype)
        assert allow.bound == pytest.approx(_two_gamma(2, u) * 2.0, rel=1e-12)
        assert rel == pytest.approx(_two_gamma(2, u), rel=1e-12)


def test_partial_sums_add_one_rounding_per_piece_but_one_of_the_terms_magnitudes():
    """Three Partial pieces of one shape: assembling them adds twice more (k 1 + 2 = 3), and the allowance is of
    the terms' summed magnitudes (|1| + |-5| + |2| = 8 at element 0), larger than the result's own (|-2| = 2)."""
    pieces = {0: np.float32([1.0, 0.5]), 1: np.float32([-5.0, 0.5]), 2: np.float32([2.0, 0.5])}
    m = _marked("Partial()", pieces)
    ref = _marked("Replicate()", {0: np.float64([-2.0, 1.5])})
    want = np.array([-2.0, 1.5])
    rel, allow = allowance([1, 1, 0], [1], m, ref, want)
    assert allow.roundings == 3
    assert allow.bound == pytest.approx(_two_gamma(3, 2.0 ** -24) * 8, rel=1e-12)
    assert rel == pytest.approx(_two_gamma(3, 2.0 ** -24) * 8 / 2, rel=1e-12)
    # pieces of different shapes are not summed element by element: no additions, the result's magnitude
    uneven = _marked("Partial()", {0: np.float32([1.0, 0.5]), 1: np.float32([-5.0])})
    rel, allow = allowance([1, 1, 0], [1], uneven, ref, want)
    assert allow.roundings == 1 and allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -24) * 2, rel=1e-12)
    # a sharded tensor's pieces are not added either
    rel, allow = allowance([1, 1, 0], [1], _marked("Shard(0)", pieces), ref, want)
    assert allow.roundings == 1 and allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -24) * 2, rel=1e-12)


def test_an_all_zero_reference_is_allowed_its_terms_and_nothing_is_allowed_nothing():
    """Partial pieces that cancel to a zero reference: the bound is of the terms (|3| + |-3| = 3 + 3 = 6), made
    relative to 1 (not divided by zero); zeros everywhere: no bound, and a relative tolerance of 0."""
    ref = _marked("Replicate()", {0: np.float64([0.0])})
    m = _marked("Partial()", {0: np.float64([3.0]), 1: np.float64([-3.0])})
    rel, allow = allowance([0, 0], [0], m, ref, np.array([0.0]))
    assert allow.roundings == 1 and allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -53) * 6, rel=1e-12)
    assert rel == allow.bound
    zero = _marked("Partial()", {0: np.float64([0.0]), 1: np.float64([0.0])})
    assert allowance([0, 0], [0], zero, ref, np.array([0.0])) == (0.0, allow.__class__("float64", 1, allow.of, 0.0, 0.0))


def test_no_finite_value_to_scale_by_allows_nothing_from_it():
    """A reference of NaN alone has no magnitude: a copy is allowed nothing (and no division by zero); Partial
    pieces still count their finite terms (|1| + |2| = 3), and a term that is infinite is no magnitude either."""
    nan = np.array([np.nan])
    ref = _marked("Replicate()", {0: nan})
    assert allowance([1], [1], _marked("Replicate()", {0: np.float64([1.0])}), ref, nan)[0] == 0.0
    rel, allow = allowance([0, 0], [0], _marked("Partial()", {0: np.float64([1.0]), 1: np.float64([2.0])}), ref, nan)
    assert allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -53) * 3, rel=1e-12) and rel == allow.bound
    rel, allow = allowance([0, 0], [0], _marked("Partial()", {0: np.float64([np.inf]), 1: np.float64([2.0])}), ref,
                           np.array([4.0]))
    assert allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -53) * 4, rel=1e-12)


def test_partial_terms_are_summed_in_float64_whatever_their_dtype():
    """bfloat16 pieces 1 and 2^-9: their magnitudes add to 1 + 2^-9 in float64 (bfloat16 itself would round the
    sum back to 1)."""
    bf = np.dtype(ml_dtypes.bfloat16)
    m = _marked("Partial()", {0: np.array([1.0], bf), 1: np.array([2.0 ** -9], bf)})
    ref = _marked("Replicate()", {0: np.float64([0.5])})
    rel, allow = allowance([0, 0], [0], m, ref, np.array([0.5]))
    assert allow.dtype == "bfloat16" and allow.roundings == 1
    assert allow.bound == pytest.approx(_two_gamma(1, 2.0 ** -8) * (1 + 2.0 ** -9), rel=1e-12)
    assert rel == pytest.approx(allow.bound / 0.5, rel=1e-12)  # relative to the reference's 0.5


def test_pieces_that_hold_rows_are_put_together_block_by_block():
    """Four ranks: 0 and 1 hold rows 0-1 split on dim 1, 2 and 3 hold rows 3-4 likewise; row 2 is nobody's (NaN)."""
    a = np.arange(8.0).reshape(2, 4)
    b = 10 + np.arange(8.0).reshape(2, 4)
    pieces = {0: a[:, :2], 1: a[:, 2:], 2: b[:, :2], 3: b[:, 2:]}
    rows = {0: (0, 1), 1: (0, 1), 2: (3, 4), 3: (3, 4)}
    whole = assemble("Shard(1)", (0, 1, 2, 3), pieces, rows, size=5)
    assert np.array_equal(whole[[0, 1]], a) and np.array_equal(whole[[3, 4]], b) and np.isnan(whole[2]).all()

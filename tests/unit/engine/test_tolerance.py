"""How close is close enough: the rounding bound of a sum (engine/tolerance.py) as `parasim run` (compare.py)
and `parasim check` (divergence.py) apply it, each tested just inside and just outside its edge, with the
bound worked out here from its closed form: two computations of a sum of n terms in a precision of unit
roundoff u may differ by 2 * gamma(n - 1) * sum |x_i|, gamma(k) = k u / (1 - k u)."""
from __future__ import annotations

import io
import json
import math

import ml_dtypes
import numpy as np
import pytest
from rich.console import Console

import parasim
from parasim.engine.compare import Allowance, compare, values_close
from parasim.engine.divergence import first_divergence
from parasim.engine.real import RealReport
from parasim.engine.tolerance import Closeness, counted, measure, roundoff
from parasim.lesson import Check, Lesson

BF16 = ml_dtypes.bfloat16
U = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def bound(dtype: str, k: int, magnitude: float) -> float:
    """The allowance, from its closed form."""
    u = U[dtype]
    return 2 * k * u / (1 - k * u) * magnitude


# ---------------------------------------------------------------------------------------------
# The bound and its words

@pytest.mark.parametrize("dtype", list(U))
def test_the_unit_roundoff_is_half_the_gap_above_one(dtype):
    """u = 2^-p for p significant bits: 1 + 2u is the next number after 1, and 1 + u rounds back to 1."""
    t = np.dtype(BF16) if dtype == "bfloat16" else np.dtype(dtype)
    u = roundoff(dtype).u
    assert u == U[dtype]
    one = np.array(1.0, dtype=t)
    assert float(one + np.array(2 * u, dtype=t)) > 1.0 and float(one + np.array(u, dtype=t)) == 1.0


def test_the_words_say_the_roundings_the_gap_and_the_bound():
    inside = Closeness("bfloat16", 3, "each sum", 0.0012, 0.0039)
    assert inside.ok and inside.words() == "within 3 bf16 roundings of each sum: largest gap 0.0012 <= 0.0039"
    outside = Closeness("float32", 1, "each sum", 2.5e-7, 1.2e-7)
    assert not outside.ok and outside.words() == "past 1 fp32 rounding of each sum: largest gap 2.5e-07 > 1.2e-07"
    vacuous = Closeness("bfloat16", 300, "x", 16.0, math.inf)  # 300 u > 1: the bound says nothing, and says so
    assert vacuous.ok and "300 bf16 roundings bound nothing" in vacuous.words()


@pytest.mark.parametrize("share, ok", [(0.999, True), (1.001, False)], ids=["just-inside", "just-outside"])
def test_measure_at_the_edge(share, ok):
    want = np.array([1.0, 3.0, -2.0])
    mag = np.array([1000.0, 3.0, 2.0])  # the first sum nearly cancelled: a wide allowance
    edge = bound("float32", 3, 1000.0)
    got = want + np.array([share * edge, 0.0, 0.0])
    c = measure(got, want, "float32", 3, mag, "each sum")
    assert c.ok is ok and c.roundings == 3 and c.gap == pytest.approx(share * edge, rel=1e-12)
    assert c.bound == pytest.approx(edge, rel=1e-12)


def test_measure_names_the_element_nearest_its_allowance_not_the_largest_gap():
    want = np.array([0.0, 0.0])
    c = measure(np.array([1e-3, 1e-6]), want, "float32", 1, np.array([1e6, 1.0]), "each sum")
    assert c.gap == 1e-6 and not c.ok  # 1e-6 is 8 roundings of 1.0; 1e-3 is far inside 1e6's


def test_a_nan_on_one_side_is_past_any_bound():
    c = measure(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), "float64", 10, 1.0, "x")
    assert c.gap == math.inf and not c.ok


# ---------------------------------------------------------------------------------------------
# parasim run: a real run's records against the virtual run, a sum's result moved to the edge

def records(run):
    """A virtual run written as real ranks write their records (comm/torchdist.py), every value as it was."""
    out = [{"rank": r, "world": run.world, "value": run.values[r], "records": [], "roundings": 0}
           for r in range(run.world)]
    for e in run.trace.events:
        for m in e.members:
            out[m.rank]["records"].append({
                "kind": e.kind, "op": e.op, "group": [e.group.index, e.group.name, list(e.group.ranks)],
                "params": e.params, "label": e.label, "ins": m.ins, "outs": m.outs, "sent": m.sent, "recv": m.recv,
                "site": m.site, "before": m.before, "after": m.after, "hops": None})
    return out


FOUR = [1000.0, -999.0, 0.25, -0.25]  # float32 values whose sum (1.0) nearly cancels: sum |x| = 1999.5


def four_sum(ctx):
    return ctx.comm.all_reduce(ctx.asarray([FOUR[ctx.rank], 2.0], dtype="float32"))


@pytest.mark.parametrize("share, ok", [(0.99, True), (1.01, False)], ids=["just-inside", "just-outside"])
def test_a_sum_on_real_ranks_may_be_off_by_its_additions_roundings(share, ok):
    run = parasim.run(four_sum, 4, keep_values=8)
    edge = bound("float32", 3, 1999.5)  # 4 ranks: 3 additions of float32, of sum |x_i|
    real = records(run)
    moved = np.array([1.0 + share * edge, 8.0], dtype=np.float32)
    real[2]["records"][0]["after"] = [moved]
    real[2]["value"] = moved
    diffs, closest = compare(run, real)
    assert (not diffs) is ok, diffs
    assert closest.roundings == 3 and closest.dtype == "float32" and closest.of == "each sum"
    assert closest.bound == pytest.approx(edge, rel=1e-12)
    if not ok:
        assert diffs[0].startswith("rank 2, call 0 (all_reduce at ") and "values after differ (past 3 fp32 " \
            "roundings of each sum: largest gap" in diffs[0]
        assert "return value differs (past 3 fp32 roundings of each sum" in diffs[1]


def test_the_second_element_of_the_same_sum_has_no_room():
    """2.0 summed from 0.5 four times: its terms are small (sum |x| = 2), so 4 units of 2^-22 off is past its own
    bound (12 u of 2 = 3 units), however much room the nearly cancelling first element has."""
    def program(ctx):
        return ctx.comm.all_reduce(ctx.asarray([FOUR[ctx.rank], 0.5], dtype="float32"))
    run = parasim.run(program, 4, keep_values=8)
    real = records(run)
    real[0]["records"][0]["after"] = [np.array([1.0, 2.0 + 2.0 ** -20], dtype=np.float32)]
    diffs, closest = compare(run, real)
    assert diffs and not closest.ok and closest.gap == 2.0 ** -20
    assert closest.bound == pytest.approx(bound("float32", 3, 2.0), rel=1e-12)


def pair_bf16(ctx):
    return ctx.comm.all_reduce(ctx.asarray([16.25], dtype="bfloat16"))


@pytest.mark.parametrize("real_sum, ok", [(32.5, True), (32.75, True), (33.0, False), (35.25, False)],
                         ids=["equal", "one-unit", "two-units", "eight-percent"])
def test_a_bf16_sum_over_two_ranks_is_allowed_one_rounding(real_sum, ok):
    """The report that started this: 35.25 on real ranks against 32.5 on virtual ranks was a MATCH. Two terms
    of 16.25: one addition, one rounding of 32.5 on each side, 2 * 32.5 / 255 = 0.255 in all."""
    run = parasim.run(pair_bf16, 2, keep_values=4)
    real = records(run)
    got = np.array([real_sum], dtype=BF16)
    real[1]["records"][0]["after"], real[1]["value"] = [got], got
    diffs, closest = compare(run, real)
    assert (not diffs) is ok
    if real_sum == 32.5:
        assert closest is None  # bit for bit: no allowance was needed
        return
    assert closest.bound == pytest.approx(bound("bfloat16", 1, 32.5), rel=1e-12)
    assert closest.words().startswith("within 1 bf16 rounding of each sum: largest gap 0.25 <= 0.255" if ok else
                                      "past 1 bf16 rounding of each sum: largest gap")


def test_a_sums_inputs_already_off_widen_its_result_by_their_gaps():
    """A member whose input was off (within its own allowance) moves the sum by as much: 33.0 against 32.5 is
    past one rounding of 32.5 (0.255, the two-units case above) but within it plus the input's gap of 0.5."""
    run = parasim.run(pair_bf16, 2, keep_values=4)
    real = records(run)
    real[0]["records"][0]["before"] = [np.array([16.75], dtype=BF16)]  # rank 0's input, two bf16 units up
    real[0]["roundings"] = 40  # its torch arithmetic: room for that (2 * 40u / (1 - 40u) * 16.75 = 6.2)
    for r in (0, 1):
        real[r]["records"][0]["after"] = [np.array([33.0], dtype=BF16)]
        real[r]["value"] = np.array([33.0], dtype=BF16)
    diffs, closest = compare(run, real)
    assert not diffs, diffs
    assert closest.of == "each sum, plus its inputs' own gaps" and closest.gap == 0.5
    assert closest.bound == pytest.approx(bound("bfloat16", 1, 32.5) + 0.5, rel=1e-12)


@pytest.mark.parametrize("share, ok", [(0.99, True), (1.01, False)], ids=["just-inside", "just-outside"])
def test_a_value_the_program_computed_gets_the_roundings_counted_on_its_rank(share, ok):
    """A return value that is no call's result: the roundings its rank counted (the all-reduce's 1, the
    product's 3 terms on virtual ranks, 5 counted by torch on the real ones: the most of the two), of the
    array's largest value."""
    def program(ctx):
        s = ctx.comm.all_reduce(ctx.asarray([0.015625, 1.125]))
        return ctx.xp.matmul(ctx.asarray([[1.0, 2.0, 3.0]]), ctx.asarray([[1.0], [1.0], [1.0]]))[0] * s
    run = parasim.run(program, 2, keep_values=4)
    assert counted(run) == [1 + 3] * 2
    real = records(run)
    real[1]["roundings"] = 5
    want = run.values[1]  # [0.1875, 13.5]: a small first element, finely placed
    edge = bound("float64", 1 + 5, 13.5)
    real[1]["value"] = want + np.array([share * edge, 0.0])
    diffs, closest = compare(run, real)
    assert (not diffs) is ok
    assert closest.roundings == 6 and closest.of == "their array's largest value"
    assert closest.bound == pytest.approx(edge, rel=1e-12)


def test_the_match_line_says_how_close():
    lesson = Lesson(name="x", title="X", world=2, program=pair_bf16, narrative={}, checks=lambda r: [])
    run = parasim.run(pair_bf16, 2)
    times = {(e.seq, m.rank): (0.0, 1.0) for e in run.trace.events for m in e.members}
    report = RealReport("gloo", 2, run.values, run.trace, times,
                        closest=Closeness("bfloat16", 1, "each sum", 0.25, 0.2549), device="cuda", wire="cpu")
    from parasim.render.verdict import print_verdict
    out = io.StringIO()
    print_verdict(lesson, report, [Check("c", 1, 1, True)], Console(file=out, width=400, highlight=False))
    text = out.getvalue()
    assert "MATCH: every call, group, shape, dtype, byte count and call site as on virtual ranks; values within 1 " \
           "bf16 rounding of each sum: largest gap 0.25 <= 0.255." in text
    assert "2 real ranks on gloo, tensors on cuda, each call's tensors copied to the host and back" in text
    from parasim.cli.run import row_text
    assert row_text("x", report, [Check("c", 1, 1, True)]) == (
        "MATCH      x                    2 ranks  within 1 bf16 rounding of each sum: largest gap 0.25 <= 0.255; "
        "1/1 checks ok")
    report.closest = None
    assert "ranks  bit for bit; 1/1 checks ok" in row_text("x", report, [Check("c", 1, 1, True)])


def test_values_close_allows_what_it_is_given_and_no_more():
    two = Allowance(2, "each sum", np.array([4.0]))
    edge = bound("float16", 2, 4.0)
    assert values_close(np.array([1.0 + 0.99 * edge]), np.array([1.0]), "float16", two)[0]
    assert not values_close(np.array([1.0 + 1.01 * edge]), np.array([1.0]), "float16", two)[0]
    assert values_close(np.array([3.0]), np.array([3.0]), "float16", two) == (True, None)


# ---------------------------------------------------------------------------------------------
# parasim check: a split run's pieces against its reference

def pieces(ctx):
    ctx.mark("s", ctx.asarray([[1e6], [1.0 - 1e6]][ctx.rank]), "Partial()")  # 1.0, summed over 2 ranks


@pytest.mark.parametrize("share, ok", [(0.99, True), (1.01, False)], ids=["just-inside", "just-outside"])
def test_check_allows_the_roundings_of_both_sides_and_no_more(share, ok):
    """The split side's one addition (the Partial sum) of sum |pieces| = 2e6 - 1: the reference may be that far."""
    edge = bound("float64", 1, 2e6 - 1)

    def reference(ctx):
        ctx.mark("s", ctx.asarray([1.0 + share * edge]))
    agreed = []
    found = first_divergence(parasim.run(pieces, 2), parasim.run(reference, 1), agreed)
    if ok:
        assert found is None and agreed[0].gap == pytest.approx(share * edge, rel=1e-6)
        assert agreed[0].words().startswith("within 1 fp64 rounding of the terms' largest magnitude: largest gap")
    else:
        assert found is not None and found["allowance"].startswith("past 1 fp64 rounding of the terms' largest")
        assert found["tolerance"] == pytest.approx(edge / (1.0 + share * edge), rel=1e-12)


def bf16_half(ctx):
    x = ctx.asarray([256.0] + [1.0] * 7, dtype="bfloat16")
    ctx.mark("total", ctx.xp.sum(x[4 * ctx.rank: 4 * ctx.rank + 4], keepdims=True), "Partial()")


@pytest.mark.parametrize("reference_total, ok", [(None, True), (300.0, False)], ids=["rounding", "wrong"])
def test_a_bf16_sum_split_over_two_ranks_is_no_divergence_from_its_rounding(reference_total, ok):
    """256 + seven 1s in bf16: one rank's order loses the 1s (257 rounds to 256), two halves keep four of them
    (256 + 4): a gap of rounding only, within the reference's 7 roundings of 260 (2 * 7u / (1 - 7u) * 260)."""
    def reference(ctx):
        x = ctx.asarray([256.0] + [1.0] * 7, dtype="bfloat16")
        total = ctx.xp.sum(x, keepdims=True) if reference_total is None else ctx.asarray([reference_total], "bfloat16")
        ctx.mark("total", total)
    agreed = []
    found = first_divergence(parasim.run(bf16_half, 2), parasim.run(reference, 1), agreed)
    if ok:
        assert found is None and agreed and agreed[0].dtype == "bfloat16" and agreed[0].roundings == 7
        assert agreed[0].bound == pytest.approx(bound("bfloat16", 7, 260.0), rel=1e-12)
    else:
        assert found is not None and "bf16 rounding" in found["allowance"]


def test_the_app_shows_the_allowance_beside_a_divergence():
    from parasim.tui.view import View

    def split(ctx):
        ctx.comm.barrier()
        pieces(ctx)

    def reference(ctx):
        ctx.mark("s", ctx.asarray([1.5]))
    run = parasim.run(split, 2)
    found = first_divergence(run, parasim.run(reference, 1))
    view = View(run.trace, {}, "t", divergence=found)
    lines = view.divergence_lines(view.diverged())
    assert lines[1] == f"max abs 0.5, max rel 0.333 ({found['allowance']})"
    assert found["allowance"].startswith("past 1 fp64 rounding of the terms' largest magnitude: largest gap 0.5 > ")


# ---------------------------------------------------------------------------------------------
# The roundings counted

def test_a_gap_equal_to_its_bound_is_within_it():
    assert Closeness("float32", 2, "x", 0.5, 0.5).ok and not Closeness("float32", 2, "x", 0.5, 0.4999).ok


def test_a_calls_additions_by_its_op():
    from parasim.engine.tolerance import additions, reduced
    assert [additions("all_reduce", {"op": "sum"}, 4), additions("reduce_scatter", {"op": "avg"}, 4),
            additions("reduce", {"op": "max"}, 4), additions("all_gather", {}, 4)] == [3, 4, 0, 0]
    assert [reduced(12, 3), reduced(12, 3, divides=True), reduced(5, 5), reduced(1, 1, True)] == [3, 4, 0, 1]


def test_a_reduce_scatter_gives_each_member_its_own_chunks_allowance():
    """Chunk 0 sums 1000 and -999 (sum |x| = 1999), chunk 1 sums 0.5 and 0.5 (1): member 1's result may be
    off by one rounding of 1, not of 1999."""
    def program(ctx):
        return ctx.comm.reduce_scatter(ctx.asarray([[1000.0, 0.5], [-999.0, 0.5]][ctx.rank], dtype="float32"))
    run = parasim.run(program, 2, keep_values=4)
    real = records(run)
    real[1]["records"][0]["after"] = [np.array([1.0 + 2.0 ** -20], dtype=np.float32)]
    diffs, closest = compare(run, real)
    assert diffs and closest.bound == pytest.approx(bound("float32", 1, 1.0), rel=1e-12)
    real = records(run)
    real[0]["records"][0]["after"] = [np.array([1.0 + 2.0 ** -20], dtype=np.float32)]
    diffs, closest = compare(run, real)
    assert not diffs and closest.bound == pytest.approx(bound("float32", 1, 1999.0), rel=1e-12)


def four_pieces(ctx):
    ctx.mark("s", ctx.asarray([[1e6], [-1e6], [0.5], [0.5]][ctx.rank]), "Partial()")


@pytest.mark.parametrize("share, ok", [(0.99, True), (1.01, False)], ids=["just-inside", "just-outside"])
def test_check_counts_one_addition_per_piece_but_one(share, ok):
    edge = bound("float64", 3, 2e6 + 1)  # four pieces: three additions, of sum |pieces|

    def reference(ctx):
        ctx.mark("s", ctx.asarray([1.0 + share * edge]))
    found = first_divergence(parasim.run(four_pieces, 4), parasim.run(reference, 1))
    assert (found is None) is ok


def test_torch_calls_are_counted_by_their_summed_lengths():
    torch = pytest.importorskip("torch")
    from parasim.engine.torch_xp import counting_roundings
    a, b = torch.ones(3, 5, dtype=torch.float64), torch.ones(5, 2, dtype=torch.float64)
    with counting_roundings() as c:
        a @ b  # 5 terms
    with counting_roundings() as s:
        a.sum()  # 15 values into 1: 14 additions
        torch.mean(a, dim=0)  # 3 into each of 5: 2 additions and a division
    with counting_roundings() as other:
        torch.softmax(a, dim=1)  # 5 along its dim
        torch.tensordot(a, b, dims=1)  # 5 terms
        torch.einsum("ij,jk->ik", a, b)  # 5 terms
        a + 1.0  # elementwise: none
    assert (c.count, s.count, other.count) == (5, 14 + 3, 5 + 5 + 5)


def test_check_prints_how_close_its_tensors_agree(tmp_path):
    from conftest import cli
    src = tmp_path / "halves.py"
    src.write_text(
        "def program(ctx):\n"
        "    x = ctx.asarray([256.0] + [1.0] * 7, dtype='bfloat16')\n"
        "    ctx.mark('total', ctx.xp.sum(x[4 * ctx.rank: 4 * ctx.rank + 4], keepdims=True), 'Partial()')\n\n\n"
        "def reference(ctx):\n"
        "    ctx.mark('total', ctx.xp.sum(ctx.asarray([256.0] + [1.0] * 7, dtype='bfloat16'), keepdims=True))\n")
    out = cli("check", f"{src}:program", "--world", "2")
    assert out.returncode == 0 and "no divergence (1 marked tensor(s) agree with the lesson's reference on 1 rank; " \
        "within 7 bf16 roundings of the terms' largest magnitude: largest gap 4 <= " in out.stdout
    got = json.loads(cli("check", f"{src}:program", "--world", "2", "--json").stdout)
    assert got["closest"]["roundings"] == 7 and got["closest"]["gap"] == 4.0 and got["closest"]["ok"] is True
    assert got["tolerance"]["unit_roundoff"]["bfloat16"] == 2.0 ** -8


def test_fp8_rounds_by_its_own_epsilon_and_integers_do_not_round():
    from parasim.engine.tolerance import rounds
    assert [rounds(d) for d in ("float8_e4m3fn", "bfloat16", "complex64", "int64", "bool")] == [True, True, True,
                                                                                                False, False]
    assert roundoff("float8_e4m3fn").u == 2.0 ** -4  # 3 stored bits of mantissa: eps 2^-3
    assert roundoff("complex128").u == 2.0 ** -53


def test_check_judges_by_the_coarser_of_the_two_sides_dtypes():
    """bf16 pieces against a float64 reference: bf16's rounding, not float64's."""
    def split(ctx):
        ctx.mark("s", ctx.asarray([[1.0], [2.0]][ctx.rank], dtype="bfloat16"), "Partial()")

    def reference(ctx):
        ctx.mark("s", ctx.asarray([3.0 + 0.02]))  # a bf16 rounding of 3 is 2 * 3 / 255 = 0.0235
    agreed = []
    assert first_divergence(parasim.run(split, 2), parasim.run(reference, 1), agreed) is None
    assert agreed[0].dtype == "bfloat16" and agreed[0].words().startswith("within 1 bf16 rounding")

"""The pipeline lessons: the slot tables noted by each stage are the post's, and the checks hold."""
from fractions import Fraction
import pytest

from parasim.lesson import get_lesson, run_lesson
from helpers_schedules import POST_1F1B, POST_GPIPE


@pytest.mark.parametrize("name, table", [("pp-gpipe", POST_GPIPE), ("pp-1f1b", POST_1F1B)])
def test_pipeline_lesson(name, table):
    lr = run_lesson(get_lesson(name))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note")
    assert [text.split(": ", 1)[1] for _, text in notes] == table
    assert run_lesson(get_lesson(name), 2).ok


def test_interleaved_lesson():
    lr = run_lesson(get_lesson("pp-interleaved"))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    got = {c.name.split(",")[0]: c.got for c in lr.checks}
    assert got["1F1B's bubble"] == "3/7" and got["interleaved bubble = (p-1)/(v*m+p-1)"] == "3/11"  # the post's
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note")
    assert notes[0][1].startswith("GPU 1: F1 F2 F3 F4 f1 f2 f3 f4")  # GPU 1 holds layers 1 and 5


@pytest.mark.parametrize("world, idle", [(4, 6), (2, 2)])
def test_interleaved_slots_are_half_as_long(world, idle):
    """The same 2(p-1) idle slots per GPU as 1F1B, each half as long (v = 2): half the idle time."""
    lr = run_lesson(get_lesson("pp-interleaved"), world)
    assert lr.ok, [c for c in lr.checks if not c.ok]
    got = {c.name.split(":")[0].split(" (")[0]: c.got for c in lr.checks}
    assert got["idle slots per rank, interleaved and 1F1B"] == [[idle] * world, [idle] * world]
    assert got["each slot 1/v as long"] == "1/2"
    assert got["so each rank idles 1/v as long as under 1F1B on the same layers"] == ["1/2"] * world
    assert [x["idle"] for x in lr.result.values] == [idle] * world
    assert [len({*x["grad_sq"]}) for x in lr.result.values] == [2] * world  # two one-layer chunks per GPU


def test_zero_bubble_lesson():
    lr = run_lesson(get_lesson("pp-zero-bubble"))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    assert run_lesson(get_lesson("pp-zero-bubble"), 2).ok
    # the deferred weight passes ran: W actions are in the plan and every gradient matched the unsplit model
    assert any(" W1 " in m.text for m in lr.result.trace.marks if m.kind == "note")


def test_pipeline_checks_by_name_and_value():
    lr = run_lesson(get_lesson("pp-gpipe"))
    got = {c.name: (c.got, c.expected, c.ok) for c in lr.checks}
    assert got == {  # p = 4 stages, m = 4 micro-batches (the post's picture)
        "bubble = (p-1)/(m+p-1), measured from the slot table": ("3/7", "3/7", True),
        "every stage is busy 2m slots": ([8] * 4, [8] * 4, True),
        "micro-batches whose activations a stage holds at once": ([4] * 4, [4] * 4, True),
        "point-to-point transfers: m activations and m gradients per stage boundary": (24, 24, True),
        "bubbles with m = 16 and m = 32": ([0.158, 0.086], [0.158, 0.086], True),  # 3/19 and 3/35
        "smallest m with a bubble under 10% at p = 8": (64, 64, True),
        **{k: got[k] for k in got if "unsplit model" in k}}
    assert [(c.name, c.ok) for c in lr.checks[-3:]] == [
        ("the loss equals the unsplit model's", True),
        ("each layer's gradients equal the unsplit model's (sum of squares)", True),
        ("after one SGD step, each layer's weights equal the unsplit model's (sum of squares)", True)]


@pytest.mark.parametrize("key, scale, ok", [
    ("loss", 1 + 1e-13, True), ("loss", 1 + 1e-11, False),  # the loss agrees to rtol 1e-12
    ("grad_sq", 1 + 1e-11, True), ("grad_sq", 1 + 1e-9, False),  # gradients to 1e-10
    ("stepped", 1 + 1e-13, True), ("stepped", 1 + 1e-11, False),  # stepped weights to 1e-12
])
def test_unsplit_comparison_tolerances(key, scale, ok):
    from parasim.examples.pipeline import matches_unsplit
    values = [dict(v) for v in run_lesson(get_lesson("pp-gpipe")).result.values]
    for v in values:
        v[key] = v[key] * scale if key == "loss" else {s: g * scale for s, g in v[key].items()}
    checks = matches_unsplit(values, len(values), 4)
    assert [c.ok for c in checks] == [ok if k == key else True for k in ("loss", "grad_sq", "stepped")]


def test_zero_bubble_narrative_gives_the_idle_time_the_run_measures():
    """ZB-H1's idle per GPU is (p-1)(F+I-W), a third of 1F1B's (p-1)(F+I+W) when F = I = W: the narrative
    says the formula the run measures (not (F+B-W), which would be two thirds)."""
    from parasim.lesson import get_lesson, run_lesson
    lesson = get_lesson("pp-zero-bubble")
    lr = run_lesson(lesson)
    p = lr.result.world
    zb = {x["ZB-H1"]["idle"] for x in lr.result.values}
    base = {x["1F1B"]["idle"] for x in lr.result.values}
    assert len(zb) == len(base) == 1
    assert Fraction(zb.pop(), base.pop()) == Fraction(1, 3)
    F = I = W = 2  # half-stage units: a stage's forward 2, its backward 4 = input 2 + weights 2
    text = " ".join(lesson.narrative["ZB-H1: the schedule"].split())
    assert "(p-1)(F+I-W)" in text and "(F+B-W)" not in text and "a third" in text
    assert p - 1 == 3 and (p - 1) * (F + I - W) * 3 == (p - 1) * (F + I + W)


def test_interleaved_with_three_chunks_idles_a_third():
    """--chunks 3: the bubble (p-1)/(3m+p-1) and each idle slot a third of 1F1B's."""
    lr = run_lesson(get_lesson("pp-interleaved"), knobs={"pp": 2, "m": 4, "chunks": 3})
    assert lr.ok, [c for c in lr.checks if not c.ok]
    got = {c.name.split(":")[0].split(" (")[0]: c.got for c in lr.checks}
    assert got["interleaved bubble ="] == str(Fraction(1, 3 * 4 + 1))  # (p-1)/(v*m+p-1)
    assert got["each slot 1/v as long"] == "1/3"


def test_interleaved_with_fewer_microbatches_than_stages_says_the_formula_does_not_hold():
    """m < p: a round cannot fill the pipeline; the lesson checks that the bubble is above (p-1)/(vm+p-1)
    instead of claiming the formula (which its run would contradict)."""
    lr = run_lesson(get_lesson("pp-interleaved"), knobs={"pp": 4, "m": 2})
    assert lr.ok, [c for c in lr.checks if not c.ok]
    assert Fraction(lr.result.values[0]["bubble"]) > Fraction(3, 2 * 2 + 3)
    assert any("m = 2 < p = 4" in c.name for c in lr.checks)


def test_compare_lines_up_the_interleaved_bubble():
    from parasim.figures import run_figures
    fig = run_figures(run_lesson(get_lesson("pp-interleaved"), knobs={"pp": 2}))
    assert Fraction(fig["bubble (idle share of the step)"]) == Fraction(1, 2 * 4 + 1)  # (p-1)/(vm+p-1)
    assert fig["point-to-point sends"] == 2 * 4 * (2 * 2 - 1)  # 2m(pv-1)
    assert fig["collectives"] == 0  # a pipeline only sends: no collective in this run


def test_1f1b_sets_gpipe_s_holds_beside_its_own():
    """Stage r (1-based) holds min(p - r + 1, m) micro-batches under 1F1B and m under GPipe: at p = m = 4,
    4 3 2 1 against 4 4 4 4; at m = 8, 4 3 2 1 against 8 8 8 8."""
    lr = run_lesson(get_lesson("pp-1f1b"))
    (table,) = lr.tables
    assert table.columns[1:] == ["1F1B, m = 4 (this run)", "GPipe, m = 4", "1F1B, m = 8", "GPipe, m = 8"]
    assert [label for label, _ in table.rows] == ["stage 1", "stage 2", "stage 3", "stage 4"]
    assert [row for _, row in table.rows] == [[4, 4, 4, 8], [3, 4, 3, 8], [2, 4, 2, 8], [1, 4, 1, 8]]
    assert "The bubble is the same: 3/7 at m = 4." in " ".join(table.notes)


@pytest.mark.parametrize("name", ["pp-1f1b", "pp-zero-bubble"])
def test_1f1b_s_memory_bound_is_said_one_way_with_stages_numbered_from_1(name):
    """The GPUs are numbered 1 to p (as the post numbers them, and as the slot table prints them): stage r holds
    at most p - r + 1 micro-batches under 1F1B, p on GPU 1 and 1 on GPU p. pp-1f1b's narrative once said
    'p - r' (r from 0) while its table's note said 'p - r + 1' (r from 1)."""
    import re
    from parasim.render.walkthrough import walkthrough
    lr = run_lesson(get_lesson(name))
    text = " ".join(walkthrough(lr).split())
    bounds = re.findall(r"p - r(?: \+ 1)?(?= micro|,| whatever)", text)  # the warm-up's "p - r forwards" is no bound
    assert bounds and all(b == "p - r + 1" for b in bounds), bounds
    assert "r+1" not in text and ("r = 1 to p" in text or "numbered 1 to p" in text or "(1 to p)" in text)
    p = lr.result.world
    held = [x["peak"] for x in lr.result.values] if name == "pp-1f1b" else [x["1F1B"]["peak"] for x in lr.result.values]
    assert held == [p - r + 1 for r in range(1, p + 1)]  # GPU r, r = 1..p, at m >= p

"""The pipeline lessons: the slot tables noted by each stage are the post's, and the checks hold."""
from fractions import Fraction
import pytest

from parasim.lesson import get_lesson, run_lesson
from helpers_schedules import POST_1F1B, POST_GPIPE


@pytest.mark.parametrize("name, table", [("pp-gpipe", POST_GPIPE), ("pp-1f1b", POST_1F1B)])
def test_pipeline_lesson(name, table):
    lr = run_lesson(get_lesson(name))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note" and "table_row" in (m.data or {}))
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
    checks = matches_unsplit(values, 8, 4)  # pp-gpipe runs the post's 8 layers
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


def test_zero_bubble_walkthrough_shows_one_transfer_a_phase_and_the_table_counts_them():
    """Walk 25 (#17): the three 'running it' phases listed all 192 transfers (903 lines). Each now shows one
    and counts the rest; the table's transfers column has each schedule's count: an activation and a gradient
    per micro-batch per boundary between two GPUs, m = 8, p = 4: 2 x 8 x 3 = 48 for 1F1B and ZB-H1, and
    DualPipeV's V (8 stages, its turn on GPU 4) crosses each of the 3 GPU pairs twice: 2 x 8 x 6 = 96."""
    import re
    from conftest import cli
    text = cli("lesson", "pp-zero-bubble", "--plain", "--width", "100").stdout
    assert len(text.splitlines()) < 200
    for title, n in (("1F1B", 48), ("ZB-H1", 48), ("DualPipeV", 96)):
        phase = text.split(f"== {title}: running it ==")[1].split("\n== ")[0]
        assert len(re.findall(r"^step +\d+  p2p", phase, re.M)) == 1
        assert f"... and {n - 1} more events in this phase ({n - 1} p2p)" in phase
    (table,) = run_lesson(get_lesson("pp-zero-bubble")).tables
    col = table.columns.index("transfers") - 1
    assert [row[col] for _, row in table.rows] == [48, 48, 96]
    assert "DualPipeV: 2 x 8 x 6 = 96" in " ".join(table.notes)


@pytest.mark.parametrize("pp, m, held, said", [
    # the post's: 8 layers on 4 GPUs, layers 1-2, 3-4, 5-6, 7-8; "B4 on GPU 3" is micro-batch 4 through 5-6
    (4, 4, [[0, 1], [2, 3], [4, 5], [6, 7]],
     "the model: 8 layers, 2 a GPU (GPU 1 layers 1-2, GPU 2 layers 3-4, GPU 3 layers 5-6, GPU 4 layers 7-8); "
     "a cell is a micro-batch through all of its GPU's layers: B4 on GPU 3 is micro-batch 4's backward through "
     "layers 5-6"),
    (2, 3, [[0, 1], [2, 3]], "the model: 4 layers, 2 a GPU (GPU 1 layers 1-2, GPU 2 layers 3-4); a cell is a "
     "micro-batch through all of its GPU's layers: B3 on GPU 1 is micro-batch 3's backward through layers 1-2"),
])
def test_gpipe_runs_two_layers_a_stage_and_says_so(pp, m, held, said):
    lr = run_lesson(get_lesson("pp-gpipe"), knobs={"pp": pp, "m": m})
    assert lr.ok, [c for c in lr.checks if not c.ok]
    assert [sorted(x["grad_sq"]) for x in lr.result.values] == held  # each rank's layers, counted from 0
    notes = lr.result.trace.notes("layers")
    assert [(phase, rank, text) for phase, rank, text, _ in notes] == [("the schedule", pp - 1, said)]
    from parasim.render.walkthrough import walkthrough
    text = walkthrough(lr)
    assert text.index("GPU %d: " % pp) < text.index("the model: ") < text.index("== running it")
    # 1F1B and interleaving keep one layer a stage
    assert [sorted(x["grad_sq"]) for x in run_lesson(get_lesson("pp-1f1b")).result.values] == [[0], [1], [2], [3]]


def test_gpipe_tabulates_the_bubble_against_m_at_the_posts_depths():
    """Stage 1 idles 2(p - 1) slots of 2(m + p - 1) (a forward and a backward a micro-batch, the fill and the
    drain), worked here by hand for p = 4 and p = 8; the post's figures: 16% and 9% at p = 4, m = 16 and 32; at
    p = 8 the bubble first drops under 10% at m = 64."""
    lr = run_lesson(get_lesson("pp-gpipe"))
    (table,) = lr.tables
    assert table.columns == ["micro-batches", "p = 4 (this run): idle slots", "p = 8: idle slots"]
    ms = [4, 16, 32, 63, 64]
    assert [label for label, _ in table.rows] == ["m = 4 (this run)"] + [f"m = {m}" for m in ms[1:]]
    def cell(p, m):
        return f"{2 * (p - 1)} of {2 * (m + p - 1)} = {100 * (p - 1) / (m + p - 1):.1f}%"
    assert [row for _, row in table.rows] == [[cell(4, m), cell(8, m)] for m in ms]
    assert table.rows[0][1][0] == "6 of 14 = 42.9%" and table.rows[-1][1][1] == "14 of 142 = 9.9%"
    notes = " ".join(table.notes)
    assert "m = 16 leaves 16% idle and m = 32 leaves 9%" in notes
    assert "the smallest m under 10% is 64 (m = 63 gives 10%" in notes
    # a backward twice a forward: 4 forwards of 1 and 4 backwards of 2 and the fill and drain 3 x 3: 9 of 21
    assert "this run's stage 1 idles 9 of 21, and every share above comes out the same" in notes
    # the run's own m joins the rows, and a p that is neither 4 nor 8 its own column
    other = run_lesson(get_lesson("pp-gpipe"), knobs={"pp": 2, "m": 8}).tables[0]
    assert other.columns[1:] == ["p = 2 (this run): idle slots", "p = 4: idle slots", "p = 8: idle slots"]
    assert ("m = 8 (this run)", [cell(2, 8), cell(4, 8), cell(8, 8)]) in other.rows
    words = " ".join(get_lesson("pp-gpipe").narrative["the schedule"].split())
    assert "one slot each" in words and "twice a forward" in words and "pp-zero-bubble" in words

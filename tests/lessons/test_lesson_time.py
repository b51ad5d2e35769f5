"""The four lessons that need the clock (issue 34, build item 4) run with every check holding, and what each
teaches holds when worked out here from the run's own clock: TP over two nodes is slower, the layer waits for
the busiest GPU and a hot expert costs more at a larger EP, pairing hides all-to-all time, and the longest
sequence's step takes minutes."""
from __future__ import annotations

import pytest

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.lesson import get_lesson, run_lesson


_RUNS: dict = {}


def ran(name: str):
    """Each lesson run once for the module (they are symbolic runs at real size: a second or two each)."""
    if name not in _RUNS:
        _RUNS[name] = run_lesson(get_lesson(name))
    return _RUNS[name]


@pytest.mark.parametrize("name", ["tp-across-nodes", "hot-expert", "all-to-all-hidden", "fit-is-not-fast"])
def test_every_check_holds(name):
    lesson_run = ran(name)
    bad = [c.name for c in lesson_run.checks if not c.ok]
    assert not bad and lesson_run.checks and lesson_run.tables


def test_tp_over_two_nodes_is_slower_on_the_clock():
    lr = ran("tp-across-nodes")
    tl = simulate(lr.result.trace, machine("h200", 8))
    rows = by_phase(lr.result.trace, tl, 0)
    t8, t16 = (rows[p]["end"] - rows[p]["start"] for p in ("TP 8 inside one node", "TP 16 over two nodes"))
    assert t16 > 2 * t8  # the ring's crossing hops set the pace of every step
    # on nodes of 16 both rings stay on NVLink, and TP 16 (half the products) wins
    tl16 = simulate(lr.result.trace, machine("h200", 16))
    rows16 = by_phase(lr.result.trace, tl16, 0)
    u8, u16 = (rows16[p]["end"] - rows16[p]["start"] for p in ("TP 8 inside one node", "TP 16 over two nodes"))
    assert u16 < u8


def test_the_hot_experts_gpu_is_the_one_everyone_waits_for():
    lr = ran("hot-expert")
    tl = simulate(lr.result.trace, machine("h200"))
    for ep in (4, 8):
        p = f"skewed:0.5 routing, EP {ep}"
        compute = [by_phase(lr.result.trace, tl, r)[p]["compute"] for r in range(8)]
        ends = [by_phase(lr.result.trace, tl, r)[p]["end"] for r in range(8)]
        assert compute.index(max(compute)) in (0, 4)  # a GPU holding an expert 0
        assert max(ends) - min(ends) < 0.2 * (max(ends) - 0)  # the all-to-all brings them to one end together


def test_the_hot_experts_narrative_names_every_gpu_holding_an_expert_0():
    """Issue 53: at EP 4 on 8 GPUs there are two EP groups, each with its own expert 0 (on g0 and g4), and the
    table's busiest GPU may be either: the walk-through names both, and the busiest is one of them."""
    from parasim.render.walkthrough import walkthrough
    lr = ran("hot-expert")
    text = " ".join(walkthrough(lr).split())
    assert "so expert 0 is on g0 and g4" in text and "g0 holds expert 0" in text  # EP 4, then EP 8
    (table,) = lr.tables
    assert dict(table.rows)["skewed:0.5 routing, EP 4"][0] in ("g0", "g4")


def test_the_hot_experts_check_names_the_busiest_gpus():
    """The check on who is busiest under skewed routing reads as GPU names: at EP 4 on 8 GPUs expert 0 sits on g0
    and g4 (one per EP group of 4), at EP 8 on g0 alone. It once printed [True, 0]: a flag and a bare number."""
    from parasim.render.walkthrough import walkthrough
    lr = ran("hot-expert")
    (c,) = [c for c in lr.checks if c.name.startswith("under skewed routing the busiest GPU, at EP 4")]
    assert c.ok and c.got[0] in ("g0", "g4") and c.got[1] == "g0" and c.expected == c.got
    (table,) = lr.tables
    busiest = dict(table.rows)
    assert c.got == [busiest[f"skewed:0.5 routing, EP {ep}"][0] for ep in (4, 8)]  # the table's busiest GPUs
    line = " ".join(walkthrough(lr).split())
    assert f"at EP 8, g0): [{c.got[0]}, g0]" in line and "[True, 0]" not in line


def test_pairing_hides_at_most_the_shorter_stream():
    lr = ran("all-to-all-hidden")
    trace = lr.result.trace
    one, two = simulate(trace, machine("h200", 8)), simulate(trace, machine("h200", 8), ("dualpipe",))
    assert two.step < one.step
    for ep in (8, 16):
        p = f"EP {ep}: micro-batch 2 forward with micro-batch 1 backward"
        a = by_phase(trace, one, 0)[p]
        saved = (a["end"] - a["start"]) - (by_phase(trace, two, 0)[p]["end"] - by_phase(trace, two, 0)[p]["start"])
        # no more than the shorter stream of the busiest GPU: pairing runs the two side by side, no faster
        busiest = max(by_phase(trace, one, r)[p]["compute"] for r in range(16))
        assert 0 < saved <= min(busiest, a["comm"]) * (1 + 1e-9)


def test_the_longest_sequence_takes_minutes():
    lr = ran("fit-is-not-fast")
    (table,) = lr.tables
    post, run, plan = (dict(zip(table.columns[1:], values)) for _, values in table.rows)
    assert post["step (min)"] == pytest.approx(1.54, abs=0.01)  # 2.9e17 FLOPs at 40% of 8 H200s
    assert run["step (min)"] > plan["step (min)"] > 1  # whole scores cost the run's layers twice the post's


def test_the_longest_sequence_says_its_clock_line_is_one_layer():
    """Issue 53: the clock line times the run (one layer) in seconds, the table the step (60 layers) in
    minutes; once the same figure read as both. The note says which is which, with both figures."""
    from parasim.render.walkthrough import walkthrough
    lr = ran("fit-is-not-fast")
    layer = simulate(lr.result.trace, machine("h200")).step
    text = " ".join(walkthrough(lr).split())
    assert f"the run itself is one layer: the clock line below times it ({layer:,.2f} s)" in text
    assert f"({layer * 60:,.1f} s, {layer:,.2f} minutes)" in text  # 60 layers: seconds x 60 = the same figure in minutes
    assert "the run takes" in text and "the step takes" not in text


def test_the_validation_page_says_where_the_time_lessons_moved_with_todays_figures():
    """docs/validation.md's table of the four lessons' figures: its "now" column is each lesson's own table
    (row label, column), as the lesson prints it."""
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "validation.md").read_text()
    section = page[page.index("## Where the time lessons moved"):page.index("## The held-out score, read")]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 11
    for lesson, label, column, _before, now in ((c.strip() for c in r) for r in rows):
        table = ran(lesson).tables[0]  # the lesson's first table holds its times (all-to-all-hidden's second: bytes)
        column = column.split(" (the others'")[0]  # the page's gloss on a column's name
        got = dict(table.rows)[label][table.columns.index(column) - 1]
        assert str(got) == now, (lesson, label, column)


def test_readme_row_of_tp_across_nodes_says_what_its_table_computes():
    """README's lesson row: the communication time and the layer's, TP 16 over two nodes against TP 8 in one,
    as ratios of the lesson's own table."""
    from pathlib import Path
    row = next(line for line in (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines()
               if line.startswith("| `tp-across-nodes`"))
    table = ran("tp-across-nodes").tables[0]
    rows = dict(table.rows)
    inside, over = rows["TP 8 inside one node"], rows["TP 16 over two nodes"]
    comm, layer = (table.columns.index(c) - 1 for c in ("communication (ms)", "layer (ms)"))
    assert f"{over[comm] / inside[comm]:.1f}x the communication time" in row
    assert f"a {over[layer] / inside[layer]:.1f}x slower layer" in row

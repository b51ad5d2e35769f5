"""The view model answers "what is on screen at step k" without a terminal."""
from types import SimpleNamespace

import pytest

from parasim.lesson import get_lesson, run_lesson
from parasim.tui.view import View


@pytest.fixture(scope="module")
def mlp():
    lr = run_lesson(get_lesson("tp-mlp"))
    return View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)


@pytest.fixture(scope="module")
def coll():
    lr = run_lesson(get_lesson("collectives"))
    return View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)


def test_grid_cells(mlp):
    # steps: two all-reduces of the row split, the column split's compute (one event per rank), then B's
    # all-reduce and backward's
    assert mlp.columns == 5 and mlp.cell(0, 1) == ("AR", "all-reduce")
    assert mlp.cell(0, 99) == ("··", "idle")
    assert mlp.at(1, 3) == 3 and mlp.at(1, 5) == 5 and mlp.at(0, 99) is None


def test_the_mlp_numbers_at_chosen_steps(mlp):
    held = {(h.rank, h.role): (h.placement, h.values) for h in mlp.holdings(0)}
    assert held[(0, "out")] == ("replicated", "[1 2 2 2]")  # the wrong row split
    held = {(h.rank, h.role): (h.placement, h.values) for h in mlp.holdings(5)}
    assert held[(0, "in")] == ("partial sum", "[1 1]") and held[(1, "in")] == ("partial sum", "[-2 2]")
    assert held[(0, "out")] == ("replicated", "[-1 3]")
    assert mlp.detail(5)[1].startswith("group tp [0, 1]") and "'f backward'" in mlp.detail(5)[1]
    phase, text, notes = mlp.phase_text(5)
    assert phase == "backward" and "dL/dX" in text and any("through ReLU" in n for n in notes)


def test_stepping_filters_and_focus(coll):
    assert coll.move(0, 1) == 1 and coll.move(0, -1) == 0
    coll.set_filter("reduce_scatter")
    assert coll.visible and all(coll.events[i].op == "reduce_scatter" for i in coll.visible)
    coll.set_filter("ring")  # by axis (group name)
    assert all(coll.events[i].group.name == "ring" for i in coll.visible)
    coll.set_filter("")
    coll.set_focus(5)
    assert all(5 in coll.events[i].ranks for i in coll.visible)
    coll.set_focus(None)
    assert len(coll.visible) == len(coll.events)


def test_ring_hops_on_demand(coll):
    ring = next(i for i, e in enumerate(coll.events) if e.algo == "ring")
    assert any("t shows them" in line for line in coll.detail(ring))
    coll.show_hops = True
    assert any(line.startswith("hop 1 reduce-scatter") for line in coll.detail(ring))
    coll.show_hops = False
    placements = {h.placement for h in coll.holdings(next(i for i, e in enumerate(coll.events)
                                                           if e.op == "all_gather"))}
    assert placements == {"sharded on dim 0", "replicated"}


def test_fold_rows_into_groups(coll):
    assert coll.fold_axes() == ["t8"]  # the only group kind (besides the world) that covers every rank
    assert coll.next_fold() == "t8" and coll.rows == [("t8·0", tuple(range(8)))]
    assert coll.row_cell(0, 1) == coll.cell(0, 1)
    assert coll.next_fold() is None and len(coll.rows) == 8


def test_work_bars_follow_ring_attention():
    lr = run_lesson(get_lesson("cp-causal"), 4)
    view = View(lr.result.trace, lr.lesson.narrative)
    last_contiguous = max(i for i, e in enumerate(view.events) if e.phase == "contiguous split")
    flops = [f for _, f, _ in view.work(last_contiguous)]
    assert flops == sorted(flops) and flops[0] < flops[-1]  # the contiguous split's imbalance
    names = [name for _, _, name in view.work(last_contiguous)]
    assert all(n.startswith("ring: attend to K/V of CP rank") or n.startswith("ring: skip K/V of CP rank") for n in names)


def test_pipeline_slot_window(mlp):
    """Pipeline lessons: the slot table the ranks noted, around the selected transfer's slot."""
    from helpers_schedules import POST_1F1B
    lr = run_lesson(get_lesson("pp-1f1b"))
    view = View(lr.result.trace, lr.lesson.narrative)
    i = next(k for k, e in enumerate(view.events) if e.label.startswith("slot 5:"))
    win = view.slots(i, width=30)
    assert win.names == ["GPU 1", "GPU 2", "GPU 3", "GPU 4"] and win.slot == 5
    assert [" ".join(r) for r in win.rows] == POST_1F1B and (win.first, win.last) == (0, 14)
    assert win.ranks == sorted(m.rank for m in view.events[i].members)
    narrow = view.slots(i, width=6)
    assert narrow.last - narrow.first == 6 and narrow.first <= 4 < narrow.last  # the slot stays in view
    assert mlp.slots(0) is None


def test_followed_token():
    """moe16 follows 'contract': the view names the rank holding it in the selected event's phase."""
    lr = run_lesson(get_lesson("moe16"))
    view = View(lr.result.trace, lr.lesson.narrative)
    at = {e.phase: i for i, e in reversed(list(enumerate(view.events)))}  # first event of each phase
    w = view.watch(at["forward mb1 layer 1"])
    assert w.token.startswith("'contract'") and w.rank == 2 and "routing (scripted) picks E3" in w.notes[0]
    assert view.watch(at["forward mb1 layer 3"]).rank == 10  # after the pipeline hand-off
    assert view.watch(at["backward mb1 layer 2"]).rank == 2
    assert view.watch(at["forward mb2 layer 1"]).rank is None and view.watch(at["gradient sync"]).rank is None


def test_no_followed_token(mlp):
    assert mlp.watch(0) is None


def _reworded(trace):
    """The same trace with every note's and label's words replaced: what screens show of a slot table or
    a followed token must come from the fields."""
    import dataclasses
    marks = [m._replace(text=f"(note {i})") if m.kind == "note" else m for i, m in enumerate(trace.marks)]
    events = [dataclasses.replace(e, label=e.label and "(label)") for e in trace.events]
    return dataclasses.replace(trace, marks=marks, events=events)


def test_screens_read_fields_not_words():
    """Rewording every note leaves the slot table and the followed token as they were: the view reads
    each note's data (table_row and cells; watch, token), never its text."""
    lr = run_lesson(get_lesson("pp-1f1b"))
    i = next(k for k, e in enumerate(lr.result.trace.events) if e.kind == "p2p")
    before, after = View(lr.result.trace).slots(i), View(_reworded(lr.result.trace)).slots(i)
    assert after == before and after.slot == lr.result.trace.events[i].tags["slot"] is not None
    lr = run_lesson(get_lesson("moe16"))
    at = {e.phase: k for k, e in reversed(list(enumerate(lr.result.trace.events)))}["forward mb1 layer 3"]
    w = View(_reworded(lr.result.trace)).watch(at)
    assert (w.token, w.rank) == ("'contract' (t6 of A)", 10) and w.notes == ["g10: (note %d)" % next(
        k for k, m in enumerate(lr.result.trace.marks) if m.rank == 10 and m.kind == "note" and m.data and m.data.get("layer") == 3)]


def test_note_fields_travel_in_the_trace_file(tmp_path):
    """A note's data is saved with the trace and read back; a note without data has no data field."""
    import json

    import parasim
    from parasim.comm.trace import Trace

    def prog(ctx):
        ctx.phase("p", stage=ctx.rank + 1)
        ctx.note("plain")
        ctx.note("with fields", token="x", cells=[".", "F1"])

    tr = parasim.run(prog, 2).trace
    assert [(m.kind, m.text, m.data) for m in tr.marks if m.rank == 1] == [
        ("phase", "p", {"stage": 2}), ("note", "plain", None), ("note", "with fields", {"token": "x", "cells": [".", "F1"]})]
    path = tmp_path / "t.json"
    tr.save(path)
    assert "data" not in json.loads(path.read_text())["marks"][1]
    assert Trace.load(path).marks == tr.marks


def test_no_screen_parses_words():
    """The app and `parasim trace`'s path read fields: no regular expressions there at all."""
    from pathlib import Path

    import parasim
    root = Path(parasim.__file__).parent
    for path in [*sorted((root / "tui").glob("*.py")), root / "examples" / "moe16.py", root / "cli" / "trace.py"]:
        text = path.read_text()
        assert "import re\n" not in text and "from re import" not in text, path


def rooted(ctx):
    x = ctx.asarray([1.0, 2.0, 3.0, 4.0]) * (ctx.rank + 1)
    ctx.comm.reduce(x, dst=1)
    ctx.comm.scatter(x, src=0)


def test_reduce_and_scatter_cells_and_words():
    """The op table's glyph and placement words reach the screen; a reduce's other members hold nothing after."""
    import parasim
    view = View(parasim.run(rooted, 2, keep_values=8).trace)
    assert [view.cell(0, 1), view.cell(1, 2)] == [("RD", "reduce"), ("SC", "scatter")]
    held = [(h.rank, h.role, h.placement, h.values) for h in view.holdings(0)]
    assert held == [(0, "in", "partial sum", "[1 2 3 4]"), (1, "in", "partial sum", "[2 4 6 8]"),
                    (1, "out", "reduced on rank 1", "[3 6 9 12]")]
    held = [(h.rank, h.role, h.placement, h.values) for h in view.holdings(1)]
    assert held[1] == (0, "out", "sharded on dim 0", "[1 2]") and held[3] == (1, "out", "sharded on dim 0", "[3 4]")
    assert held[0][2] == "whole on rank 0"
    assert view.detail(0)[2] == "op=sum" and view.detail(0)[3].startswith("called at ")
    assert view.detail(0)[5] == "         sent 32 B, received 0 B"  # rank 0's: ranks that differ say it each


def test_a_backward_phase_finds_the_token_where_its_forward_twin_held_it():
    """The followed token's holder in a backward phase is read from the phase's fields (micro-batch and
    layer), not from its name: g10 held 'contract' in layer 3's forward, so it does in its backward too."""
    lr = run_lesson(get_lesson("moe16"))
    events = lr.result.trace.events
    back = next(k for k, e in enumerate(events) if e.phase == "backward mb1 layer 3")
    other = next(k for k, e in enumerate(events) if e.phase == "backward mb2 layer 3")
    view = View(lr.result.trace)
    assert view.watch(back).rank == 10 and view.watch(other).rank is None


def test_the_map_panel_draws_gpus_by_node_with_the_event_and_the_token():
    """moe16 (made on a layout): two nodes of 8, one row per DP replica, columns by (CP, TP); layer 1's
    dispatch involves the EP group g0-g3 and 'contract' is on g2. A lesson without a layout has no map."""
    lr = run_lesson(get_lesson("moe16"))
    events = lr.result.trace.events
    i = next(k for k, e in enumerate(events) if e.phase == "forward mb1 layer 1" and e.op == "all_to_all")
    m = View(lr.result.trace).map(i)
    assert m.nodes == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]
    assert m.involved == {0, 1, 2, 3} and m.token == 2 and m.gpus_per_node == 8
    assert View(run_lesson(get_lesson("tp-mlp")).result.trace).map(0) is None


async def test_the_app_shows_the_map_for_moe16():
    from parasim.tui.app import ParasimApp
    lr = run_lesson(get_lesson("moe16"))
    app = ParasimApp(View(lr.result.trace, {}, "moe16"))
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.pause()
        panel = app.query_one("#map")
        assert panel.display and "node 1" in str(panel.render())


def test_the_ruler_writes_each_number_over_its_own_column():
    from parasim.tui.grid import ruler
    # 3 characters a column: step s starts at 3 * (s - first)
    assert ruler(1, 11, 3, None) == ("1" + " " * 11 + "5" + " " * 14 + "10 ", None)
    assert ruler(1, 11, 3, 7) == ("1" + " " * 11 + "5" + " " * 5 + "7" + " " * 8 + "10 ", (18, 19))
    assert ruler(998, 1003, 3, None) == (" " * 6 + "1000" + " " * 5, None)
    assert ruler(1001, 1004, 3, None) == (" " * 9, None)  # 1,000's tail alone would read as 0
    assert ruler(996, 1001, 3, None) == (" " * 15, None)  # 1,000 would be cut by the window's right edge
    text, span = ruler(95, 105, 3, 101)  # 100 would touch the selected 101: left out
    assert text == "95" + " " * 16 + "101" + " " * 9 and span == (18, 21)


def test_what_every_rank_shares_is_said_once(coll):
    # the first all-reduce: 2 ranks, 4 float64 each; directly, each sends its 4 x 8 B to the other
    lines = coll.detail(0)
    assert lines[3] == "each rank sent 32 B and received 32 B" and lines[4].startswith("called at ")
    assert lines[5:] == ["rank 0   float64[4] -> float64[4]", "rank 1   float64[4] -> float64[4]"]


def test_with_hops_on_the_status_says_why_an_event_shows_none(coll):
    ring = next(i for i, e in enumerate(coll.events) if e.algo == "ring")
    direct = next(i for i, e in enumerate(coll.events) if not e.hops and e.kind == "collective")
    assert coll.hops_note(direct) == ""  # hops off: nothing to explain
    coll.show_hops = True
    try:
        assert coll.hops_note(direct) == f"this {coll.events[direct].op} ran direct, not as a ring: no hops"
        assert "ring hops shown" in coll.hops_note(ring)
    finally:
        coll.show_hops = False


def test_the_legend_names_the_kinds_every_cell_shows():
    from parasim.tui.grid import kind_of
    lr = run_lesson(get_lesson("moe16"))
    view = View(lr.result.trace)
    assert view.kinds_seen() == {kind_of(e, m.rank) for e in view.events for m in e.members}  # the scan it replaces


def test_cp_causal_compute_counts_each_split_on_its_own():
    """cp-causal runs the contiguous split, then the zigzag split: at the zigzag phase's last event every
    rank has done the same work (2 blocks per ring step, 4 steps: 8 blocks each), not the two phases added."""
    lr = run_lesson(get_lesson("cp-causal"))
    view = View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)
    last = max(i for i, e in enumerate(view.events) if e.phase == "zigzag split")
    flops = {r: f for r, f, _ in view.work(last)}
    assert len(set(flops.values())) == 1
    first_last = max(i for i, e in enumerate(view.events) if e.phase == "contiguous split")
    work = [f for _, f, _ in view.work(first_last)]
    assert work == sorted(work) and work[0] < work[-1]  # the contiguous split: the last rank works most


def test_a_compute_event_is_one_rank_s_work_not_a_group_s(mlp):
    i = next(i for i, e in enumerate(mlp.events) if e.kind == "compute")
    lines = mlp.detail(i)
    assert lines[0].endswith("compute on rank 0") and "8 FLOPs" in lines and not any("group" in x for x in lines)


@pytest.mark.parametrize("name, quiet, first", [("pp-1f1b", "the schedule", "running it"),
                                                ("moe16", "data", "forward mb1 layer 1")])
def test_a_phase_with_no_event_is_said_with_the_phase_after_it(name, quiet, first):
    """pp-1f1b's "the schedule" (its words and slot table come before any send) and moe16's "data" hold no
    event: the app's narrative says them above the first event's phase, as the walk-through does, not never."""
    from parasim.tui.panels import NarrativePanel

    lesson = get_lesson(name)
    view = View(run_lesson(lesson).result.trace, lesson.narrative)
    assert view.phase_text(0)[0] == first
    (said,) = view.quiet_phases(0)
    assert said[0] == quiet and said[1] == " ".join(lesson.narrative[quiet].split())
    text = NarrativePanel.content(SimpleNamespace(view=view), 0).plain
    assert text.index(quiet) < text.index(" ".join(lesson.narrative[quiet].split())[:40]) < text.index(first)
    # said once, at the first event of the phase after it: the later events of that phase show their own words
    assert all(view.quiet_phases(i) == [] for i in range(1, min(50, len(view.events))))

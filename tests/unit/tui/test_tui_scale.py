"""The app on a symbolic trace of a big world: it opens with its ranks folded by axis (a row per data-parallel
group, never one per GPU), its panels list a bounded number of ranks, and what a step asks is looked up, not
scanned: each lookup here against the plain scan it replaces. (benchmarks/tui.py times DeepSeek-V3's 2,048
GPUs against the paint and step goals; tests assert no times.)"""
import random

import pytest

import parasim
from parasim.train.step import make_step
from parasim.layout import Layout, ModelSpec
from parasim.engine.symbolic.fold import fold_of
from parasim.tui.memory import SHOWN
from parasim.tui.grid import IDLE
from parasim.tui.view import MAX_ROWS, View

SMALL = ModelSpec(name="small", layers=4, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, dense_layers=1,
                  seq=16, bias=False)
LAYOUT = Layout(tp=2, pp=2, dp=32, ep=8, etp=1, sp=True, model=SMALL)  # 128 GPUs: more than a screen's rows


@pytest.fixture(scope="module")
def trace():
    return parasim.run(make_step(LAYOUT, m=2), LAYOUT.world, backend="symbolic", fold=fold_of(LAYOUT)).trace


def test_a_big_world_opens_folded_a_row_per_data_parallel_group(trace):
    view = View(trace)
    assert trace.world == 128 > MAX_ROWS
    assert view.fold_axis == "dp-cp" and len(view.rows) == LAYOUT.tp * LAYOUT.pp
    assert sorted(r for _, ranks in view.rows for r in ranks) == list(range(128))
    dense = ModelSpec(**{**SMALL.__dict__, "experts": 0, "top_k": None, "dense_layers": 0})
    small = parasim.run(make_step(Layout(tp=2, pp=2, dp=2, model=dense), m=2), 8, backend="symbolic").trace
    assert View(small).fold_axis is None and len(View(small).rows) == 8  # a small world keeps a row per rank


def test_a_fold_that_cannot_hold_says_so():
    """64 experts top-2 over EP 32 (2 a GPU) and 8 tokens a GPU: balanced routing picks experts t and t + 32,
    so EP ranks 0-3 and 16-19 get rows and EP rank 4 none; the representative (EP rank 0, sent tokens 0 and 1
    by everyone) would return 2 rows to each, where a full run's EP rank 4 returns none."""
    model = ModelSpec(**{**SMALL.__dict__, "experts": 64})
    layout = Layout(tp=2, pp=2, dp=32, ep=32, etp=1, sp=True, model=model)
    with pytest.raises(parasim.ParasimError, match="EP rank 4 returned 2 rows for the 0 sent to it: a folded run "
                                                   "needs every EP rank to receive as many rows"):
        parasim.run(make_step(layout, m=2), layout.world, backend="symbolic", fold=fold_of(layout))


def test_a_folded_rows_cell_is_its_first_busy_rank(trace):
    view = View(trace)
    for row, (_, ranks) in enumerate(view.rows):
        for col in range(1, view.columns + 1):
            busy = next((r for r in ranks if view.at(r, col) is not None), None)  # the scan the lookup replaces
            want = IDLE if busy is None else view.cell(busy, col)
            assert view.row_cell(row, col)[0] == want[0], (row, col)
    view.fold(None)
    assert view.row_cell(5, 1) == view.cell(5, 1)


def test_panels_list_a_bounded_number_of_ranks(trace):
    view = View(trace)
    big = max(range(len(view.events)), key=lambda i: len(view.events[i].members))
    members = view.events[big].members
    assert len(members) > SHOWN
    held = view.held(big)
    assert [h.rank for h in held] == [m.rank for m in members[:SHOWN]]
    e = view.events[big]
    for h in held:  # the index's answer is the whole trace's
        assert h.by_kind == trace.held(h.rank, e.step) and h.peak == trace.peak(h.rank, phase=e.phase)["bytes"]
    detail = view.detail(big)
    assert detail[-1].startswith(f"... and {len(members) - SHOWN} more ranks: sent "
                                 f"{sum(m.sent for m in members):,} B")
    assert len({h.rank for h in view.holdings(big)}) == SHOWN


def test_stepping_looks_up_what_the_scan_found(trace):
    view = View(trace)
    pick = random.Random(0)
    for text in ("", "all_to_all", "p2p"):
        view.set_filter(text)
        vis = view.visible
        for _ in range(50):
            index, delta = pick.randrange(len(view.events)), pick.choice([-3, -1, 1, 2])
            pos = min(range(len(vis)), key=lambda p: abs(vis[p] - index))
            assert view.move(index, delta) == vis[max(0, min(len(vis) - 1, pos + delta))]
            assert view.clamp(index) == next((i for i in vis if i >= index), vis[-1])
            assert view.status(index).startswith(f"event {vis.index(index) + 1 if index in vis else 0}/")


def test_many_equal_tensors_are_written_once_with_a_count():
    from parasim.comm.interface import Group
    from parasim.comm.trace import Event, Member, Tensor, Trace
    t, u = Tensor((4, 8), "float64"), Tensor((2, 8), "float64")
    world = Group((0,), "world", 0)
    event = Event(0, 1, "collective", "all_gather", world, [Member(0, (t,) * 3, (t,) * 9 + (u,) * 3, 0, 0, "x.py (f)")])
    (row,) = [line for line in View(Trace(1, "virtual", [world], [event])).detail(0) if line.startswith("rank 0 ")]
    # a few: as they are; many: each run once with its count
    assert row == "rank 0   3 x float64[4/4/4,8] -> float64[4,8] x9 float64[2,8] x3"
    # a few alike but for their rows (an all-to-all's chunks): their count and rows, in order
    chunks = Event(0, 1, "collective", "all_to_all", world, [Member(0, (t, u), (u, t, u), 0, 0, "x.py (f)")])
    (row,) = [line for line in View(Trace(1, "virtual", [world], [chunks])).detail(0) if line.startswith("rank 0 ")]
    assert row == "rank 0   2 x float64[4/2,8] -> 3 x float64[2/4/2,8]"


async def test_the_app_steps_through_a_folded_world(trace):
    from parasim.tui.app import ParasimApp
    from parasim.tui.timeline import Timeline
    app = ParasimApp(View(trace, {}, "128 symbolic GPUs"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.query_one(Timeline).virtual_size.height == len(app.view.rows) + 1  # rows, not GPUs
        for _ in range(5):
            await pilot.press("right")
        await pilot.pause()
        assert app.index == app.view.visible[5]


def test_trace_app_opens_a_real_size_run_in_the_app(monkeypatch, capsys):
    from parasim.cli import main
    opened = {}
    monkeypatch.setattr("parasim.cli.common.open_app", lambda trace, narrative, title, whatif=None: opened.update(
        trace=trace, title=title, whatif=whatif))
    monkeypatch.setattr("parasim.cli.trace.need_terminal", lambda flag: None)  # pytest's stdin is no terminal
    assert main(["trace", "--symbolic", "--layout", "megatron-8.3b", "--app"]) == 0
    assert opened["trace"].world == 512 and "512 symbolic GPUs" in opened["title"]
    # its what-if key turns the layout's sizes and runs the step again (tests/unit/tui/test_tui_step_whatif.py)
    assert opened["whatif"].settings == {"tp": 8, "cp": 1, "dp": 64, "pp": 1, "ep": 1, "m": 1, "overlap": "none"}
    assert opened["whatif"].step.result.trace is opened["trace"]
    view = View(opened["trace"])
    assert view.fold_axis == "dp-cp" and len(view.rows) == 8  # TP 8: a row per TP place, each a DP group of 64


def test_a_folded_row_shows_its_lowest_busy_rank():
    """Two ranks of one row busy at the same step with different things: the row shows the first rank's."""
    from parasim.comm.interface import Group
    from parasim.comm.trace import Event, Member, Trace
    world = Group((0, 1, 2, 3), "world", 0)
    pairs = [Group((0, 1), "pair", 1), Group((2, 3), "pair", 2)]
    events = [Event(0, 1, "compute", "think", world, [Member(1, (), (), 0, 0, "x.py:1")]),
              Event(1, 1, "p2p", "send", Group((0, 2), "p2p", 3), [Member(0, (), (), 8, 0, "x.py:2"),
                                                                    Member(2, (), (), 0, 8, "x.py:2")],
                    params={"src": 0, "dst": 2})]
    view = View(Trace(4, "virtual", [world, *pairs], events))
    view.fold("pair")
    assert view.row_cell(0, 1) == view.cell(0, 1) != view.cell(1, 1)  # rank 0's send, not rank 1's compute
    assert view.row_cell(1, 1) == view.cell(2, 1)


def test_notes_belong_to_the_phase_their_rank_was_in():
    from parasim.comm.interface import Group
    from parasim.comm.trace import Event, Mark, Member, Trace
    world = Group((0, 1), "world", 0)
    marks = [Mark(0, 0, "note", "before any phase"), Mark(0, 0, "phase", "one"), Mark(1, 0, "phase", "two"),
             Mark(1, 0, "note", "in two"), Mark(0, 0, "note", "in one"), Mark(0, 1, "phase", "two"),
             Mark(0, 1, "note", "rank 0 in two")]
    events = [Event(0, 1, "compute", "a", world, [Member(0, (), (), 0, 0, "x.py:1")], phase="one"),
              Event(1, 2, "compute", "b", world, [Member(1, (), (), 0, 0, "x.py:2")], phase="two")]
    view = View(Trace(2, "virtual", [world], events, marks))
    assert view.phase_text(0) == ("one", "", ["rank 0: in one"])
    assert view.phase_text(1) == ("two", "", ["rank 0: rank 0 in two", "rank 1: in two"])

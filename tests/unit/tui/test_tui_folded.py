"""The app on a folded run's trace (engine/symbolic/fold.FoldedTrace) reads what the ranks that ran recorded, and
writes no rank's copies out to paint: what each panel shows is what it shows for the whole trace written out."""
from __future__ import annotations

import pytest

import parasim
from parasim.comm.trace import Trace
from parasim.engine.symbolic.fold import FoldedTrace, fold_of
from parasim.layout import Layout
from parasim.train.step import make_step
from parasim.tui.view import View, _looked_up
from tests.unit.train.test_fold import SMALL


@pytest.fixture(scope="module")
def traces():
    layout = Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL)
    run = lambda: parasim.run(make_step(layout, m=2, routing="balanced"), layout.world,  # noqa: E731
                              backend="symbolic", fold=fold_of(layout)).trace
    folded, other = run(), run()
    whole = Trace(other.world, other.backend, other.groups, other.events, other.marks, other.meta)
    return folded, whole


def test_every_panel_of_a_folded_trace_says_what_it_says_of_the_whole(traces):
    folded, whole = traces
    assert isinstance(folded, FoldedTrace) and not isinstance(whole, FoldedTrace)
    a, b = View(folded, {}, "folded"), View(whole, {}, "whole")
    assert folded._marks is None  # the view model read the run's marks, not every rank's copies
    assert folded._events is None  # nor wrote the copies out to index the grid
    assert a._cells == b._cells and a.rows == b.rows and a.step_columns == b.step_columns
    # the legend's kinds: a point-to-point event is a send and a receive, any other its op
    kinds = {k for e in whole.events for k in (("send", "recv") if e.kind == "p2p" else (e.op,))}
    assert a.kinds_seen() == b.kinds_seen() == kinds and len(kinds) > 2
    # each (rank, step)'s first event, worked out over the whole trace's events as the grid's definition says
    first: dict[tuple[int, int], int] = {}
    for i, e in enumerate(whole.events):
        for m in e.members:
            first.setdefault((m.rank, e.step), i)
    for r in range(whole.world):
        for col in range(-1, b.step_columns + 3):
            assert a.at(r, col) == first.get((r, col)), (r, col)
    assert a.at(whole.world, 1) is None and a.at(-1, 1) is None
    for axis in a.fold_axes():  # a folded row shows its lowest rank that is busy at that step
        a.fold(axis)
        for row, (_, ranks) in enumerate(a.rows):
            for col in range(b.step_columns + 2):
                busy = [r for r in ranks if (r, col) in first]
                want = first[(busy[0], col)] if busy else None
                assert a.row_cell(row, col) == (a.cell(busy[0], col) if busy else a.cell(-1, col)), (axis, row, col)
                assert _looked_up(a._row_firsts, row * (b.step_columns + 1) + col) == (busy[0] if busy else None)
                assert want is None or a.at(busy[0], col) == want
    assert folded._events is None  # the events the cells name are written out one by one, not all
    assert a.marks.phase_order == b.marks.phase_order and a.marks.tables == b.marks.tables
    phases = [m.text for m in whole.marks if m.kind == "phase"]
    assert a.marks.phase_order == sorted(set(phases), key=phases.index) and len(phases) > len(set(phases)) > 1
    for i in range(0, len(b.events), 97):
        assert a.held(i) == b.held(i), i
        assert a.slots(i) == b.slots(i) and a.watch(i) == b.watch(i) and a.moves(i) == b.moves(i)
        assert a.work(i) == b.work(i), i
    assert any(a.held(i) for i in range(len(a.events)))  # the step holds memory: the rows are not empty
    assert folded._marks is None
    assert a.phase_text(0) == b.phase_text(0) and a.marks.notes_by_phase == b.marks.notes_by_phase


def test_a_notes_index_of_a_trace_with_notes_reads_them_all():
    """Where the ranks that ran left notes, the index reads every rank's (the copies included)."""
    def program(ctx):
        ctx.phase("one")
        ctx.note(f"rank {ctx.rank} was here")
        ctx.comm.all_reduce(ctx.xp.ones(2))

    trace = parasim.run(program, 4, backend="symbolic", fold=[0, 0, 0, 0]).trace
    view = View(trace, {}, "notes")
    assert [r for r, _ in view.marks.notes_by_phase["one"]] == [0, 1, 2, 3]


def test_the_work_panel_of_a_folded_trace_counts_each_rank_folded_onto_the_one_that_ran():
    """The compute panel (View.work) reads each compute event that ran once, for every rank folded onto its rank:
    per rank, the FLOPs of the phase so far and the latest step, as over the whole trace written out."""
    def program(ctx):
        for phase in ("forward", "backward"):
            ctx.phase(phase)
            ctx.compute("chunk 0", 10.0 * (1 + ctx.rank))
            ctx.comm.all_reduce(ctx.xp.ones(2))
            ctx.compute("chunk 1", 100.0)
            ctx.comm.all_reduce(ctx.xp.ones(2))

    folded = parasim.run(program, 4, backend="symbolic", fold=[0, 0, 2, 2]).trace
    other = parasim.run(program, 4, backend="symbolic", fold=[0, 0, 2, 2]).trace
    whole = Trace(other.world, other.backend, other.groups, other.events, other.marks, other.meta)
    a, b = View(folded, {}, "folded"), View(whole, {}, "whole")
    works = [a.work(i) for i in range(len(b.events))]
    assert folded._events is None and works == [b.work(i) for i in range(len(b.events))]
    last = works[-1]  # backward, both chunks: a folded rank did its representative's work (10 x (1 + rep))
    assert last == [(0, 110.0, "chunk 1"), (1, 110.0, "chunk 1"), (2, 130.0, "chunk 1"), (3, 130.0, "chunk 1")]


def test_a_big_world_with_no_events_opens_folded_and_idle():
    """A program of 128 ranks that made no call (a grid with no cell): the view indexes nothing, folds by its
    axis and shows every cell idle."""
    from parasim.comm.interface import Group
    from parasim.tui.grid import IDLE

    groups = [Group(tuple(range(i, i + 64)), "dp", k + 1) for k, i in enumerate((0, 64))]
    view = View(Trace(128, groups=[Group(tuple(range(128)), "world", 0), *groups]), {}, "nothing")
    assert view.fold_axis == "dp" and len(view.rows) == 2 and view.step_columns == 1
    assert view.row_cell(0, 1) == IDLE == view.cell(5, 1) and view.at(5, 1) is None

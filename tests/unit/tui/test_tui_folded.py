"""The app on a folded run's trace (engine/symbolic/fold.FoldedTrace) reads what the ranks that ran recorded, and
writes no rank's copies out to paint: what each panel shows is what it shows for the whole trace written out."""
from __future__ import annotations

import pytest

import parasim
from parasim.comm.trace import Trace
from parasim.engine.symbolic.fold import FoldedTrace, fold_of
from parasim.layout import Layout
from parasim.train.step import make_step
from parasim.tui.view import View
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
    assert a.cells == b.cells and a.rows == b.rows
    assert a.marks.phase_order == b.marks.phase_order and a.marks.tables == b.marks.tables
    phases = [m.text for m in whole.marks if m.kind == "phase"]
    assert a.marks.phase_order == sorted(set(phases), key=phases.index) and len(phases) > len(set(phases)) > 1
    for i in range(0, len(b.events), 97):
        assert a.held(i) == b.held(i), i
        assert a.slots(i) == b.slots(i) and a.watch(i) == b.watch(i) and a.moves(i) == b.moves(i)
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

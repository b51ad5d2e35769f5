"""The folded world's own paths (engine/symbolic/folded.py), called on one rank from the test itself: a rank that
runs for every member of its group completes each call as it makes it, with no other rank to wait for."""

from __future__ import annotations

import threading

import numpy as np

from parasim.comm.virtual import VirtualWorld
from parasim.comm.virtual_comm import VirtualComm
from parasim.engine.symbolic.folded import FoldedWorld
from parasim.engine.work import Meter


def _folded(world: int, rep: list[int]) -> FoldedWorld:
    w = FoldedWorld(world, rep)
    w.meter, w._thread = Meter(world, lambda: 0), threading.get_ident()  # what run() sets; the calls run here
    return w


def test_an_all_to_all_on_a_group_of_one_hands_back_its_chunk():
    w = _folded(2, [0, 0])
    comm = VirtualComm(w, 0)
    alone = comm.new_group([0], "alone")
    x = np.arange(4.0)
    (got,) = comm.all_to_all([x], group=alone)
    assert got.tolist() == x.tolist() and got is not x
    (event,) = w.events
    assert [m.rank for m in event.members] == [0] and event.members[0].sent == 0


def test_a_folded_members_all_to_all_is_its_representatives():
    """Rank 1 is folded onto rank 0, which sends both chunks: each member's record is its own chunk's."""
    w = _folded(2, [0, 0])
    comm = VirtualComm(w, 0)
    got = comm.all_to_all([np.ones(2), np.ones(3)])
    assert [g.shape for g in got] == [(2,), (2,)]  # rank 0 gets chunk 0 of everyone: its own, twice
    (event,) = w.events
    assert [(m.rank, m.sent, m.recv) for m in event.members] == [(0, 24, 16), (1, 16, 24)]


def test_a_world_made_without_keep_values_keeps_none():
    assert VirtualWorld(2).keep == 0


def test_a_run_folded_around_another_rank_keeps_every_events_phase():
    """Folded around rank 5, a group's first member (rank 1, say) is folded and never enters a phase: an event
    is in the phase of its first member that ran, as a run folded around rank 0 has it."""
    import parasim
    from parasim.engine.symbolic.fold import fold_of
    from parasim.layout import Layout, ModelSpec
    from parasim.train.step import make_step

    model = ModelSpec(name="small", layers=4, hidden=8, heads=4, vocab=16, ffn=16, seq=16, bias=False)
    layout = Layout(tp=2, pp=2, dp=4, sp=True, model=model)

    def phases(around: int) -> list:
        rep = fold_of(layout, around=around)
        trace = parasim.run(make_step(layout, m=2), layout.world, backend="symbolic", fold=rep).trace
        return [(e.kind, e.op, e.phase) for e in trace.events]

    at_0, at_5 = phases(0), phases(5)
    assert at_5 == at_0 and {p for *_, p in at_5} == {"forward and backward", "gradient sync and optimizer"}

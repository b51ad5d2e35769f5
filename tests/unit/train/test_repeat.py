"""Repeated layer calls on symbolic ranks (engine/symbolic/repeat.py, train/repeat.py): a stage's layers run once
per shape and their calls are told to the trace again for the other micro-batches. The trace must be the one
the calls run every time make, event for event (FLOPs and products included), mark for mark."""

from dataclasses import replace

import pytest

import parasim
from parasim.comm.trace import Work
from parasim.engine.symbolic import repeat as rep
from parasim.engine.symbolic.fold import fold_of
from parasim.layout import Layout, ModelSpec
from parasim.nn.layer import TransformerLayer
from parasim.train import step as step_module
from parasim.train.step import make_step

SMALL = ModelSpec(
    name="small", layers=4, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, dense_layers=1, seq=16, bias=False
)
DENSE = replace(SMALL, experts=0, top_k=None, dense_layers=0, dropout=0.1)


def _work(w):
    return None if w is None else (dict(w), dict(w.gemms))


def _events(trace):
    return [
        (
            e.seq,
            e.step,
            e.kind,
            e.op,
            e.group.index,
            e.label,
            e.phase,
            e.params,
            e.algo,
            e.hops,
            e.tags,
            [(*m[:8], _work(m.work)) for m in e.members],
        )
        for e in trace.ran_events
    ]


def _run(layout, m, fold, repeats, monkeypatch, **kw):
    """The step's result, and how many times each (rank, layer) forward ran."""
    ran: dict = {}
    real = TransformerLayer.forward

    def counted(self, x, saved):
        key = (self.par.ctx.rank, self.key)
        ran[key] = ran.get(key, 0) + 1
        return real(self, x, saved)

    with monkeypatch.context() as mp:
        mp.setattr(TransformerLayer, "forward", counted)
        if not repeats:
            mp.setattr(step_module, "repeats", lambda *a: False)
        result = parasim.run(
            make_step(layout, m=m, **kw), layout.world, backend="symbolic", fold=fold_of(layout) if fold else None
        )
    return result, ran


CASES = [
    (Layout(pp=2, dp=4, ep=4, model=SMALL), True, {}),
    (Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL), True, {}),
    (Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL), False, {}),  # TP's other ranks run: no repeats
    (Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL), True, {}),  # CP's ring: no repeats
    # CP by all-gather: its peers folded, every collective the running rank's own: repeated
    (Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, cp_comm="all_gather", model=SMALL), True, {}),
    (Layout(tp=2, pp=2, dp=2, sp=True, model=DENSE), True, {"recompute": "full"}),
    (Layout(pp=2, dp=2, model=DENSE), False, {}),  # no collective in a layer: repeated without folding
]


@pytest.mark.parametrize(
    "layout,fold,kw",
    CASES,
    ids=["pp-dp-ep", "tp-sp-pp-ep", "unfolded", "tp-cp-pp-ep", "tp-cp-gather", "dense-recompute", "dense"],
)
def test_repeated_calls_make_the_trace_running_them_makes(layout, fold, kw, monkeypatch):
    m = 4
    got, ran = _run(layout, m, fold, True, monkeypatch, **kw)
    want, ran_all = _run(layout, m, fold, False, monkeypatch, **kw)
    assert _events(got.trace) == _events(want.trace)
    assert list(got.trace.ran_marks) == list(want.trace.ran_marks)
    assert got.trace.meta == want.trace.meta
    assert str(got.values) == str(want.values)  # the loss is nan on symbolic ranks: compared as text
    assert set(ran) == set(ran_all)
    runs_each = 2 if kw.get("recompute") == "full" else 1  # the recomputed forward has the same shapes
    assert set(ran_all.values()) == {m * runs_each}
    if layout.cp_comm == "p2p" and layout.cp > 1 or (not fold and layout.tp > 1):  # a transfer, or a collective another rank runs
        assert ran == ran_all
    else:  # each layer's forward ran once on each rank that runs
        assert set(ran.values()) == {1}


def test_a_routing_that_draws_each_call_anew_runs_every_call(monkeypatch):
    layout = Layout(pp=2, dp=4, ep=4, model=SMALL)
    _, ran = _run(layout, 4, False, True, monkeypatch, routing="uniform")
    assert set(ran.values()) == {4}


def test_the_clock_and_memory_see_the_same_step(monkeypatch):
    from parasim.clock import machine, simulate

    layout = Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL)
    got, _ = _run(layout, 4, True, True, monkeypatch)
    want, _ = _run(layout, 4, True, False, monkeypatch)
    assert [got.trace.peak(r) for r in range(layout.world)] == [want.trace.peak(r) for r in range(layout.world)]
    m = machine("h100")
    assert simulate(got.trace, m).step == simulate(want.trace, m).step > 0


def _w(flops, gemms=()):
    w = Work(flops)
    w.gemms.update(gemms)
    return w


def test_work_sums_and_differences_drop_what_is_zero():
    a = _w({"matmul": 10, "attention": 4}, {("matmul", 2, 3, 4): 2, ("attention", 1, 1, 1): 1})
    b = _w({"attention": 4}, {("attention", 1, 1, 1): 1})
    d = rep._minus(a, b)
    assert dict(d) == {"matmul": 10} and d.gemms == {("matmul", 2, 3, 4): 2}
    assert rep._minus(b, b) is None and rep._minus(None, None) is None
    s = rep._plus(d, b)
    assert dict(s) == dict(a) and s.gemms == a.gemms and s is not a
    assert rep._plus(None, None) is None and dict(rep._plus(None, b)) == {"attention": 4}
    c = rep._plus(b, None)
    assert dict(c) == {"attention": 4} and c is not b  # a copy: the meter adds into what it is handed


class _World:
    """Just enough of a run's world for record/replay: two ranks, a meter, events and marks."""

    def __init__(self):
        from parasim.comm.virtual import VirtualWorld

        self.w = VirtualWorld(2)
        from parasim.engine.work import Meter

        self.w.meter = Meter(2, lambda: 0)


def test_a_call_without_events_hands_its_flops_to_the_next_event():
    w = _World().w
    w.meter.add("matmul", 5)  # before the call

    def call():
        w.meter.add("matmul", 7)
        w.mark(0, "held", "x", {"kind": "activations", "bytes": 3})
        return "out"

    out, rec = rep.record(w, 0, call)
    assert out == "out" and rec is not None and dict(rec.tail) == {"matmul": 7} and rec.flops == 7
    rep.replay(w, 0, rec)
    assert dict(w.meter.since[0]) == {"matmul": 19} and w.meter.total[0] == 19
    assert [m.text for m in w.marks] == ["x", "x"]


def test_a_replayed_calls_tail_goes_to_the_next_collective():
    """FLOPs after a call's last event (its tail) are the rank's work before whatever comes next; told again by a
    replay, a collective's members must still find them (the meter skips ranks that computed nothing)."""
    w = _World().w

    def call():
        w.compute(0, "c", 1.0, "here")
        w.meter.add("matmul", 6)  # after the call's last event: its tail
        return None

    _, rec = rep.record(w, 0, call)
    assert dict(w.meter.take(0) or {}) == {"matmul": 6}  # the first call's tail, taken
    rep.replay(w, 0, rec)
    assert [dict(x) if x else x for x in w._works([0, 1])] == [{"matmul": 6}, None]


def test_a_replayed_call_without_events_hands_its_flops_to_the_next_collective():
    w = _World().w
    _, rec = rep.record(w, 0, lambda: w.meter.add("attention", 4))
    assert [dict(x) if x else x for x in w._works([0, 1])] == [{"attention": 4}, None]  # the call's own, taken
    rep.replay(w, 0, rec)
    assert [dict(x) if x else x for x in w._works([0, 1])] == [{"attention": 4}, None]


def test_a_replayed_compute_is_in_its_own_ranks_phase():
    """Rank 1 repeats a call that computes while rank 0 is in another phase: the compute event is rank 1's."""
    w = _World().w
    w.mark(0, "phase", "rank 0's")
    w.mark(1, "phase", "rank 1's")
    _, rec = rep.record(w, 1, lambda: w.compute(1, "c", 1.0, "here"))
    rep.replay(w, 1, rec)
    assert [(e.members[0].rank, e.phase) for e in w.events] == [(1, "rank 1's")] * 2


def _mark_then_compute(w):
    w.mark(0, "note", "before")  # before the call's first event, none after its last
    w.compute(0, "c1", 1.0, "here")
    w.compute(0, "c2", 1.0, "here")


def _compute_then_marks(w):
    w.compute(0, "c", 1.0, "here")
    w.mark(0, "note", "after")  # two after the call's last event
    w.mark(0, "note", "after too")


@pytest.mark.parametrize("call, marks", [(_mark_then_compute, ["before"]), (_compute_then_marks, ["after", "after too"])])
def test_a_replay_tells_every_mark_in_its_place(call, marks):
    w = _World().w
    _, rec = rep.record(w, 0, lambda: call(w))
    rep.replay(w, 0, rec)
    assert [m.text for m in w.marks] == marks * 2
    n = len(w.events) // 2
    assert [m.step for m in w.marks[len(marks):]] == [m.step + n for m in w.marks[: len(marks)]]


def test_a_replayed_ring_call_keeps_its_hops():
    """A ring all-reduce the rank runs alone (its other member folded onto it) is told again with its hops."""
    import threading

    import numpy as np

    from parasim.comm.virtual_comm import VirtualComm
    from parasim.engine.symbolic.folded import FoldedWorld
    from parasim.engine.work import Meter

    w = FoldedWorld(2, [0, 0], algo="ring")
    w.meter, w._thread = Meter(2, lambda: 0), threading.get_ident()  # run() would set them; the call runs here
    comm = VirtualComm(w, 0)
    _, rec = rep.record(w, 0, lambda: comm.all_reduce(np.ones(4, np.float32)))
    rep.replay(w, 0, rec)
    first, again = w.events
    assert first.hops and again.hops == first.hops and again.algo == "ring"


def test_a_call_another_rank_ran_beside_is_not_recorded():
    w = _World().w

    def call():
        w.turns += 1  # the scheduler handed over meanwhile
        return 1

    assert rep.record(w, 0, call) == (1, None)


def test_a_phase_inside_a_call_is_not_recorded():
    w = _World().w
    assert rep.record(w, 0, lambda: w.mark(0, "phase", "p"))[1] is None


def test_marks_keep_their_place_between_events():
    w = _World().w

    def call():
        w.mark(0, "note", "before", {"at": "the start"})  # its fields are told again too
        w.meter.add("matmul", 2)
        w.meter.round(5)
        w.compute(0, "c1", 1.0, "here")
        w.mark(0, "note", "between")
        w.compute(0, "c2", 1.0, "here")
        w.meter.add("attention", 3)
        w.mark(0, "note", "after")

    w.meter.add("matmul", 1)
    _, rec = rep.record(w, 0, call)
    assert [i for i, _ in rec.marks] == [0, 1, 2] and dict(rec.head) == {"matmul": 2}
    w.meter.add("matmul", 4)
    w.mark(0, "phase", "later")  # a repeat is in the phase it is made in
    rep.replay(w, 0, rec)
    assert [e.phase for e in w.events] == [None, None, "later", "later"] and w.meter.roundings[0] == 10
    assert [m.data for m in w.marks if m.text == "before"] == [{"at": "the start"}] * 2
    assert {m.rank for m in w.marks} == {0}
    assert [(m.text, m.step) for m in w.marks if m.kind == "note"] == [
        ("before", 0),
        ("between", 1),
        ("after", 2),
        ("before", 2),
        ("between", 3),
        ("after", 4),
    ]
    assert [(e.op, e.step, e.seq, _work(e.members[0].work)) for e in w.events[2:]] == [
        ("c1", 3, 2, ({"matmul": 2}, {})),
        ("c2", 4, 3, None),
    ]  # what came before went to the phase's work mark
    assert dict(w.meter.since[0]) == {"attention": 3}


def test_a_split_backward_is_not_repeated(monkeypatch):
    import functools

    # zero-bubble's I queues the weight-gradient work for its W (train_step runs it without held bytes)
    monkeypatch.setattr(
        step_module, "StepOptions", functools.partial(step_module.StepOptions, schedule="zb-h1", held=False)
    )
    layout = Layout(pp=2, dp=2, model=DENSE)
    got, ran = _run(layout, 4, False, True, monkeypatch)
    want, _ = _run(layout, 4, False, False, monkeypatch)
    assert set(ran.values()) == {4} and _events(got.trace) == _events(want.trace)

    class Ctx:
        symbolic = True

    assert rep is not None and step_module.repeats(Ctx(), 0, None, False)
    assert not step_module.repeats(Ctx(), 0, None, True)  # zero-bubble's W runs what a backward queued
    Ctx.symbolic = False
    assert not step_module.repeats(Ctx(), 0, None, False)


def test_a_collective_another_running_rank_joins_is_never_repeated():
    """Two ranks, each calling one all-reduce through `repeat`: the second to arrive completes the call without
    handing over, so only the event's other running member says the call is not its own."""

    def program(ctx):
        memo, x = {}, ctx.xp.zeros((4,))
        for _ in range(3):
            ctx.repeat(memo, "call", lambda: ctx.comm.all_reduce(x))
        return dict(ctx._recorder.calls)

    result = parasim.run(program, 2, backend="symbolic")
    assert [len(e.members) for e in result.trace.events] == [2, 2, 2]
    assert result.values == [{0: 3}, {0: 3}]


def test_a_repeated_collective_counts_as_a_call_on_its_group():
    def program(ctx):
        g = [ctx.comm.new_group([r], name="alone") for r in range(ctx.world)][ctx.rank]
        memo, x = {}, ctx.xp.zeros((4,))
        again = [ctx.repeat(memo, "call", lambda: ctx.comm.all_reduce(x, group=g))[1] for _ in range(3)]
        return again, ctx._recorder.calls[g.index]

    result = parasim.run(program, 2, backend="symbolic")
    assert result.values == [([False, True, True], 3)] * 2
    # each rank runs to its end without handing over: its three calls, numbered and stepped as calls are
    assert [(e.seq, e.ranks, e.step) for e in result.trace.events] == [
        (i, [r], s) for i, (r, s) in enumerate((r, s) for r in (0, 1) for s in (1, 2, 3))
    ]

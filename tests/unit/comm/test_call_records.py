"""A kind of call's member records are worked out once and reused (comm/virtual.py `_same_records`): what each
member's record says must still be what that call moved, call after call, group after group."""

from __future__ import annotations

import numpy as np

import parasim
from parasim.comm.interface import ring_bytes


def _events(program, world):
    return [e for e in parasim.run(program, world).trace.events if e.kind == "collective"]


def test_reduces_to_other_roots_record_their_own_root():
    def program(ctx):
        x = np.ones(6, np.float32)
        for dst in (0, 2, 0, 3):
            ctx.comm.reduce(x, dst=dst)

    events = _events(program, 4)
    assert [e.params["dst"] for e in events] == [0, 2, 0, 3]
    for e in events:
        got = {m.rank for m in e.members if m.outs}
        assert got == {e.params["dst"]}  # only the root has a result, call after call
        assert all(m.outs[0].shape == (6,) for m in e.members if m.outs)


def test_the_same_call_on_groups_of_other_sizes_moves_each_group_its_own_bytes():
    def program(ctx):
        small = ctx.new_group([0, 1], "pair")
        big = ctx.new_group([0, 1, 2, 3], "all")
        x = np.ones(8, np.float32)
        for _ in range(2):
            if ctx.rank < 2:
                ctx.comm.all_reduce(x, group=small)
            ctx.comm.all_reduce(x, group=big)

    events = _events(program, 4)
    assert [e.group.name for e in events] == ["pair", "all", "pair", "all"]
    for e in events:
        t = e.group.size
        expected = ring_bytes("all_reduce", 32, t, 4)  # the ring's own count, not the record's
        assert [(m.sent, m.recv) for m in e.members] == list(expected)
        # 2(t-1)/t of the buffer each way, by hand
        assert all(m.sent == 2 * (t - 1) * 32 // t for m in e.members)


def test_shapes_and_dtypes_of_one_group_keep_their_own_records():
    def program(ctx):
        for x in (np.ones(4, np.float32), np.ones(8, np.float64), np.ones(4, np.float32), np.ones((2, 3), np.int32)):
            ctx.comm.all_reduce(x)

    events = _events(program, 2)
    assert [(m.ins[0].shape, m.ins[0].dtype) for e in events for m in e.members[:1]] == [
        ((4,), "float32"),
        ((8,), "float64"),
        ((4,), "float32"),
        ((2, 3), "int32"),
    ]
    assert [e.members[0].sent for e in events] == [16, 64, 16, 24]


def test_a_param_that_is_a_list_is_worked_out_rather_than_reused():
    from parasim.comm.interface import Group
    from parasim.comm.ops import OPS
    from parasim.comm.virtual import VirtualWorld

    w = VirtualWorld(2)
    g = Group((0, 1), "w", 0)
    x = np.ones(4, np.float32)
    outs = [x.copy(), x.copy()]
    kind, got = w._same_records(
        g, x, outs, OPS["all_reduce"], {"op": "sum", "algo": ["direct"]}
    )
    assert [row[2:] for row in got] == [(16, 16), (16, 16)] and kind is None
    assert w._records == {}  # nothing kept under a key it could not make


# -- a call that repeats the previous one of its kind (virtual.py `_same_members`) -----------------------------------


def test_a_loop_of_collectives_gives_every_event_the_records_a_fresh_call_would():
    from pathlib import Path

    from conftest import site_at

    here = str(Path(__file__).resolve())

    def program(ctx):
        x = np.ones(4, np.float32)
        for i in range(6):
            if i == 2 and ctx.rank == 1:
                ctx.comm.all_reduce(x)  # rank 1's other line
            else:
                ctx.comm.all_reduce(x)  # the loop's line
            if i == 3 and ctx.rank == 2:
                ctx.xp.matmul(np.ones((2, 3)), np.ones((3, 5)))  # rank 2 computes before the fifth call

    events = _events(program, 4)
    loop, other = site_at(here, "the loop's line"), site_at(here, "rank 1's other line")
    every = [loop] * 4
    # the third: one member from another line, its own site (not the second's); the fourth: all from the loop's
    # again (not the third's)
    assert [[m.site for m in e.members] for e in events] == [every, every, [loop, other, loop, loop], *[every] * 3]
    # the fifth: rank 2's work, a (2 x 3) @ (3 x 5) product: 2 x 5 outputs of 3 multiply-adds, 2 FLOPs each
    assert [[m.work for m in e.members] for e in events] == [[None] * 4] * 4 + [[None, None, {"matmul": 60}, None]] + [
        [None] * 4
    ]
    for e in events:
        assert [(m.rank, m.ins[0].shape, m.outs[0].shape, m.sent, m.recv) for m in e.members] == [
            (r, (4,), (4,), 24, 24) for r in range(4)
        ]  # a ring all-reduce of 16 bytes over 4: 2 passes of 3 chunks of 4 bytes each way
    assert len({id(e.members) for e in events}) == 6  # each event has a list of its own


def test_past_the_kinds_kept_no_call_takes_another_calls_records(monkeypatch):
    from parasim.comm import virtual

    monkeypatch.setattr(virtual, "RECORD_KINDS", 0)  # no kind kept: every call's records worked out afresh

    def program(ctx):
        for n in (4, 8, 4, 2):
            ctx.comm.all_reduce(np.ones(n, np.float32))  # one line, shapes of their own, nothing computed between

    events = _events(program, 2)
    assert [[m.ins[0].shape for m in e.members] for e in events] == [[(n,)] * 2 for n in (4, 8, 4, 2)]
    assert [e.members[0].sent for e in events] == [4 * n for n in (4, 8, 4, 2)]  # two passes of half the buffer
    w = virtual.VirtualWorld(2)
    x = np.ones(4, np.float32)
    kind, _ = w._same_records(
        virtual.Group((0, 1), "w", 0),
        x,
        [x, x],
        virtual.OPS["all_reduce"],
        {"op": "sum", "algo": "direct"},
    )
    assert kind is None and w._records == {}


def test_a_call_after_work_has_that_work_call_after_call():
    """Rank 1 computes before each call of one line, a different product each time: each event holds its own
    FLOPs (a call after work is never the previous call's records again)."""
    def program(ctx):
        x = np.ones(4, np.float32)
        for n in (2, 3, 5):
            if ctx.rank == 1:
                ctx.xp.matmul(np.ones((1, n)), np.ones((n, 1)))  # 1 x 1 outputs of n multiply-adds
            ctx.comm.all_reduce(x)

    events = _events(program, 2)
    assert [[m.work for m in e.members] for e in events] == [[None, {"matmul": 2 * n}] for n in (2, 3, 5)]


def test_an_empty_label_names_no_event():
    def program(ctx):
        ctx.comm.all_reduce(np.ones(2, np.float32), label="")

    assert [e.label for e in _events(program, 2)] == [None]

"""What the virtual engine records, field by field, and how an exchange waits: expected values worked out
by hand from the program, never read back from the engine."""
import numpy as np
import pytest

import parasim
from parasim import CollectiveError, Deadlock, Recv, Send
from parasim.comm.interface import Group
from parasim.comm.trace import Event, Member, Tensor


def test_a_p2p_event_whole():
    """A send of 2 float64 values (16 bytes) from rank 0 to rank 1 with keep_values=2: one event, step 1,
    the sender's phase, the label, both sites, the bytes on each side, the values on each side (an empty
    tuple on the side that has none), src and dst, no algo or hops. A 3-value send keeps no values."""
    from conftest import site_at

    def prog(ctx):
        ctx.phase("fwd" if ctx.rank == 0 else "bwd")
        if ctx.rank == 0:
            ctx.comm.send(ctx.asarray([1.0, 2.0]), 1, label="act")  # the send
            ctx.comm.send(ctx.asarray([1.0, 2.0, 3.0]), 1)  # the long send
        else:
            ctx.comm.recv(0, (2,), "float64")  # the recv
            ctx.comm.recv(0, (3,), "float64")  # the long recv

    ev = parasim.run(prog, world=2, keep_values=2).trace.events
    world = Group((0, 1), "world", 0)
    t2, t3 = Tensor((2,), "float64"), Tensor((3,), "float64")
    sent, got = site_at(__file__, "the send"), site_at(__file__, "the recv")
    assert ev[0] == Event(0, 1, "p2p", "p2p", world,
                          [Member(0, (t2,), (), 16, 0, sent, ([1.0, 2.0],), ()),
                           Member(1, (), (t2,), 0, 16, got, (), ([1.0, 2.0],))],
                          "act", "fwd", {"src": 0, "dst": 1}, None, None)
    sent, got = site_at(__file__, "the long send"), site_at(__file__, "the long recv")
    assert ev[1] == Event(1, 2, "p2p", "p2p", world,
                          [Member(0, (t3,), (), 24, 0, sent, None, None),
                           Member(1, (), (t3,), 0, 24, got, None, None)],
                          None, "fwd", {"src": 0, "dst": 1}, None, None)


def test_a_p2p_event_takes_the_tags_and_label_either_side_gave():
    """Tags and a label given by one side only are the event's; the sender's come first."""
    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.exchange([Send(ctx.asarray([1.0]), 1)], tags={"slot": 1})
            ctx.comm.exchange([Send(ctx.asarray([1.0]), 1)])
            ctx.comm.exchange([Send(ctx.asarray([1.0]), 1)], tags={"slot": 3}, label="mine")
        else:
            ctx.comm.exchange([Recv(0, (1,), "float64")])
            ctx.comm.exchange([Recv(0, (1,), "float64")], tags={"slot": 2}, label="theirs")
            ctx.comm.exchange([Recv(0, (1,), "float64")], tags={"slot": 4}, label="theirs")

    ev = parasim.run(prog, world=2).trace.events
    assert [(e.tags, e.label) for e in ev] == [({"slot": 1}, None), ({"slot": 2}, "theirs"), ({"slot": 3}, "mine")]


def test_events_are_numbered_and_collectives_record_bytes_and_dtypes():
    """Events are numbered 0, 1, 2 in order. A broadcast from rank 0 on two ranks: rank 0 sends its 4
    float32 values (16 bytes) and receives nothing, rank 1 the reverse. An all-to-all on two ranks lists
    every chunk in and out."""
    def prog(ctx):
        ctx.comm.broadcast(ctx.asarray([1.0] * 4).astype(np.float32), 0)
        ctx.comm.all_to_all([ctx.asarray([1.0]), ctx.asarray([2.0, 3.0])])
        ctx.comm.barrier()

    ev = parasim.run(prog, world=2).trace.events
    assert [e.seq for e in ev] == [0, 1, 2]
    t = Tensor((4,), "float32")
    assert [(m.ins, m.outs, m.sent, m.recv) for m in ev[0].members] == [((t,), (t,), 16, 0), ((t,), (t,), 0, 16)]
    one, two = Tensor((1,), "float64"), Tensor((2,), "float64")
    assert [(m.ins, m.outs) for m in ev[1].members] == [((one, two), (one, one)), ((one, two), (two, two))]


def test_the_trace_says_how_it_was_made():
    tr = parasim.run(lambda ctx: ctx.comm.barrier(), world=2, keep_values=5, algo="ring", seed=7).trace
    assert (tr.backend, tr.meta) == ("virtual", {"keep_values": 5, "algo": "ring", "seed": 7,
                                                 "precision": {"name": "post", "exact": True}})


def test_a_batch_waits_for_every_transfer_and_fills_receives_in_order():
    """Rank 0 receives from rank 2 and then rank 1 in one exchange. Rank 2 sends at once; rank 1 sends
    only after it has heard from rank 2, so rank 0's batch is half done for a while and must not resume
    until both receives have arrived, each in its own slot."""
    def prog(ctx):
        pair = ctx.new_group([1, 2], "pair")
        if ctx.rank == 0:
            return ctx.comm.exchange([Recv(2, (1,), "float64"), Recv(1, (1,), "float64")])
        if ctx.rank == 1:
            x = ctx.comm.recv(2, (1,), "float64")
            ctx.comm.send(x + 1.0, 0)
        else:
            ctx.comm.send(ctx.asarray([20.0]), 0)
            ctx.comm.send(ctx.asarray([10.0]), 1)
        ctx.comm.barrier(group=pair)  # the senders wait again after sending

    res = parasim.run(prog, world=3)
    assert [v.tolist() for v in res.values[0]] == [[20.0], [11.0]]
    # steps: rank 2's sends at 1 and 2 (its clock moves on after the first); rank 1 hears at 2 and sends
    # at 3, which is when rank 0's batch ends; the pair's barrier follows rank 1's clock, at 4
    assert [(e.op, e.params.get("src"), e.params.get("dst"), e.step) for e in res.trace.events] == [
        ("p2p", 2, 0, 1), ("p2p", 2, 1, 2), ("p2p", 1, 0, 3), ("barrier", None, None, 4)]


def test_a_deadlock_lists_only_the_posts_still_unmatched():
    """Rank 0 sends to rank 1 and waits to receive from it; rank 1 takes the send and then waits in a
    barrier. Rank 0's send has gone through, so the deadlock names only its receive."""
    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.exchange([Send(ctx.asarray([1.0]), 1), Recv(1, (1,), "float64")])
        else:
            ctx.comm.recv(0, (1,), "float64")
            ctx.comm.barrier()

    with pytest.raises(Deadlock) as info:
        parasim.run(prog, world=2)
    line = info.value.waiting[0]
    assert "unmatched recv(shape=(1,), dtype=float64) from rank 1" in line and "send(" not in line


AT = r" \(called at tests/unit/comm/test_engine_events.py:\d+\)$"  # the program's line that made the bad call


@pytest.mark.parametrize("bad, message", [
    (Send([1.0], 1), r"^send expects a numpy array on virtual ranks, got list" + AT),
    (Send(np.zeros(1), 0), r"^send to rank 0: a rank cannot send to or receive from itself" + AT),
    (Recv(0, (1,), "float64"), r"^recv from rank 0: a rank cannot send to or receive from itself" + AT),
])
def test_exchange_refuses_what_no_backend_could_do(bad, message):
    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.exchange([bad])

    with pytest.raises(CollectiveError, match=message):
        parasim.run(prog, world=2)


def test_a_subclass_of_ndarray_is_an_array():
    """Arrays that subclass numpy's (a memmap, a user's own) are sent like any other."""
    class Tagged(np.ndarray):
        pass

    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.send(np.arange(2.0).view(Tagged), 1)
        else:
            return ctx.comm.recv(0, (2,), "float64")

    assert parasim.run(prog, world=2).values[1].tolist() == [0.0, 1.0]


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("backwards", [False, True])
def test_a_rank_wakes_only_when_its_own_call_is_done(world, backwards):
    """A chain of transfers (each rank receives from its neighbour on one side and sends to the other),
    then an all-reduce that the last ranks reach late. Forwards, each receive finds its send waiting;
    backwards, each send finds its receive waiting. A rank whose transfer completed while it was running
    must not be woken again later, in the middle of its all-reduce."""
    def prog(ctx):
        step = -1 if backwards else 1
        r, first = ctx.rank, ctx.world - 1 if backwards else 0
        x = ctx.asarray([1.0]) if r == first else ctx.comm.recv(r - step, (1,), "float64")
        if 0 <= r + step < ctx.world:
            ctx.comm.send(x + 1.0, r + step)
        return ctx.comm.all_reduce(x)

    total = float(sum(range(1, world + 1)))  # the k-th rank of the chain holds k
    assert [v.tolist() for v in parasim.run(prog, world).values] == [[total]] * world


@pytest.mark.parametrize("members, message", [
    (["0", "1"], r"^new_group pair at .*: ranks must be integers, got '0'$"),
    ([0, 1.0], r"^new_group pair at .*: ranks must be integers, got 1.0$"),
    ([True, 1], r"^new_group pair at .*: ranks must be integers, got True$"),
    (5, r"^new_group pair at .*: ranks must be a list of integers, got 5$"),
    ([0, 0], r"^new_group pair\[0, 0\] at .*: ranks must be distinct and in 0..1$"),
])
def test_group_members_are_taken_as_given_or_refused(members, message):
    with pytest.raises(CollectiveError, match=message):
        parasim.run(lambda ctx: ctx.new_group(members, "pair"), 2)
    assert parasim.run(lambda ctx: ctx.new_group([np.int64(1), 0], "pair").ranks, 2).values == [(1, 0)] * 2


@pytest.mark.parametrize("later, message", [
    ([True, 1], r"^new_group pair at .*: ranks must be integers, got True$"),
    ((0, 1.0), r"^new_group pair at .*: ranks must be integers, got 1.0$"),
    ([1, 0], r"^rank 1 created group #1 as pair\[1, 0\]"),
], ids=["bool", "float", "order"])
def test_a_group_another_rank_made_is_checked_again(later, message):
    """Rank 0 makes the group with good ranks; rank 1's own list, equal to it as numbers (True == 1), is
    still held to the rules, not taken on trust."""
    with pytest.raises(parasim.ParasimError, match=message):
        parasim.run(lambda ctx: ctx.new_group([0, 1] if ctx.rank == 0 else later, "pair"), 2)
    made = parasim.run(lambda ctx: ctx.new_group([0, 1] if ctx.rank == 0 else (0, np.int64(1)), "pair"), 2)
    assert made.values[0] is made.values[1]  # one group, whoever named it


@pytest.mark.parametrize("call, message", [
    (lambda ctx: ctx.comm.all_reduce(np.array(["a", "b"])), r"^all_reduce expects numbers, got an array of dtype <U1" + AT),
    (lambda ctx: ctx.comm.all_reduce(np.array([None]), op="max"), r"^all_reduce expects numbers, got .*object" + AT),
    (lambda ctx: ctx.comm.all_gather(np.array(["a"])), r"^all_gather expects numbers"),
    (lambda ctx: ctx.comm.exchange([Send(np.array(["a"]), 1 - ctx.rank)]), r"^send expects numbers"),
    (lambda ctx: ctx.comm.exchange([Recv(1 - ctx.rank, (1,), "str")]), r"^recv from rank \d: bad shape"),
])
def test_only_numbers_travel(call, message):
    """What no real backend could carry (strings, objects) is refused on virtual ranks too."""
    with pytest.raises(CollectiveError, match=message):
        parasim.run(call, 2)


def test_joins_counts_each_kind_of_call_a_rank_makes():
    """`Trace.joins` (parasim trace --gpu's "does"): per (op, group), in the order first made, the calls and
    the bytes the rank sent and received, worked out by hand: two all-reduces of 4 float64 over 2 ranks (a
    ring sends and receives half the buffer twice: 32 B each way per call), one send of 3 values (24 B) from
    rank 0 to rank 1 (a "p2p" call); compute is no call, and a rank in no event joins nothing."""
    def prog(ctx):
        pair = ctx.new_group([0, 1], "pair")
        if ctx.rank < 2:
            for _ in range(2):
                ctx.comm.all_reduce(ctx.asarray([1.0, 2.0, 3.0, 4.0]), group=pair)
        if ctx.rank == 0:
            ctx.comm.send(ctx.asarray([1.0, 2.0, 3.0]), 1)
        elif ctx.rank == 1:
            ctx.comm.recv(0, (3,), "float64")

    trace = parasim.run(prog, world=3).trace
    assert trace.joins(0) == [{"op": "all_reduce", "group": "pair", "calls": 2, "sent": 64, "received": 64},
                              {"op": "p2p", "group": "world", "calls": 1, "sent": 24, "received": 0}]
    assert trace.joins(1)[1] == {"op": "p2p", "group": "world", "calls": 1, "sent": 0, "received": 24}
    assert trace.joins(2) == []

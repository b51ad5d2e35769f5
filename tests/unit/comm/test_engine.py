"""The engine's contract: results, ownership, groups, point-to-point, and errors that never hang."""
import re

import numpy as np
import pytest
from conftest import site_at

import parasim
from parasim import CollectiveError, CollectiveMismatch, Deadlock, ParasimError, RankFailed, Recv, Send


def test_values_in_rank_order_and_trace():
    def prog(ctx):
        return ctx.comm.all_reduce(ctx.asarray([ctx.rank, 1.0]))  # the sum

    res = parasim.run(prog, world=3)
    assert [v.tolist() for v in res.values] == [[3.0, 3.0]] * 3
    (e,) = res.trace.events
    assert (e.op, e.step, e.ranks, e.group.name) == ("all_reduce", 1, [0, 1, 2], "world")
    assert all(m.site == site_at(__file__, "the sum") for m in e.members)


def test_results_are_owned_and_inputs_untouched():
    def prog(ctx):
        x = ctx.asarray([1.0, 2.0])
        y = ctx.comm.all_reduce(x)
        y[0] = 100 + ctx.rank  # must not leak to other ranks
        return x, y

    res = parasim.run(prog, world=4)
    for r, (x, y) in enumerate(res.values):
        assert x.tolist() == [1.0, 2.0]
        assert y.tolist() == [100 + r, 8.0]


def test_two_runs_in_one_process_are_independent_and_identical():
    def prog(ctx):
        x = ctx.rng.normal((3,))
        return ctx.comm.all_gather(x)

    a, b = parasim.run(prog, world=2, seed=7), parasim.run(prog, world=2, seed=7)
    assert a.trace.to_json() == b.trace.to_json()
    assert all(np.array_equal(x, y) for x, y in zip(a.values, b.values))
    c = parasim.run(prog, world=2, seed=8)
    assert not np.array_equal(a.values[0], c.values[0])


def test_shared_rng_is_the_same_on_every_rank():
    res = parasim.run(lambda ctx: ctx.shared_rng("w").normal((4,)), world=3)
    assert all(np.array_equal(res.values[0], v) for v in res.values)


def test_logical_step_is_one_past_the_latest_member():
    def prog(ctx):
        g01 = ctx.new_group([0, 1], "tp")
        if ctx.rank in (0, 1):
            ctx.comm.barrier(group=g01)
            ctx.comm.barrier(group=g01)
        ctx.comm.barrier()

    events = parasim.run(prog, world=3).trace.events
    assert [(e.group.name, e.step) for e in events] == [("tp", 1), ("tp", 2), ("world", 3)]


def test_exchange_ring_does_not_deadlock_and_records_transfers():
    def prog(ctx):
        nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
        x = ctx.asarray([ctx.rank] * 2)
        (got,) = ctx.comm.exchange([Send(x, nxt), Recv(prv, (2,), x.dtype)])
        return got

    res = parasim.run(prog, world=4)
    assert [v.tolist() for v in res.values] == [[3, 3], [0, 0], [1, 1], [2, 2]]
    assert [e.op for e in res.trace.events] == ["p2p"] * 4
    assert {e.step for e in res.trace.events} == {1}
    assert all(e.members[0].sent == 16 and e.members[1].recv == 16 for e in res.trace.events)


def test_send_recv_pipeline():
    def prog(ctx):
        x = ctx.asarray([1.0]) if ctx.rank == 0 else ctx.comm.recv(ctx.rank - 1, (1,), "float64")
        x = x * 2
        if ctx.rank < ctx.world - 1:
            ctx.comm.send(x, ctx.rank + 1)
        return x

    res = parasim.run(prog, world=4)
    assert [v.tolist() for v in res.values] == [[2.0], [4.0], [8.0], [16.0]]
    assert [e.step for e in res.trace.events] == [1, 2, 3]


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_mismatched_ops_name_both_ranks_ops_and_lines():
    def prog(ctx):
        x = ctx.asarray([1.0, 2.0])
        if ctx.rank == 0:
            ctx.comm.all_reduce(x)  # line A
        else:
            ctx.comm.all_gather(x)  # line B

    with pytest.raises(CollectiveMismatch) as info:
        parasim.run(prog, world=2)
    msg = str(info.value)
    assert "rank 0: all_reduce" in msg and "rank 1: all_gather" in msg
    lines = [ln for ln in msg.splitlines() if "test_engine.py:" in ln]
    assert len({ln.rsplit(":", 1)[1] for ln in lines}) == 2  # two different source lines
    assert info.value.ranks == [0, 1]


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_mismatched_shapes():
    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0] * (ctx.rank + 1)))

    with pytest.raises(CollectiveMismatch, match=r"shape=\(1,\).*\n.*shape=\(2,\)"):
        parasim.run(prog, world=2)


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_skipped_collective_is_a_deadlock():
    def prog(ctx):
        if ctx.rank != 1:
            ctx.comm.all_reduce(ctx.asarray([1.0]))

    with pytest.raises(Deadlock) as info:
        parasim.run(prog, world=3)
    assert "rank 1: finished" in str(info.value)
    assert "missing [1]" in str(info.value)
    assert set(info.value.waiting) == {0, 1, 2}


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_send_send_is_a_deadlock():
    def prog(ctx):
        peer = 1 - ctx.rank
        ctx.comm.send(ctx.asarray([1.0]), peer)
        ctx.comm.recv(peer, (1,), "float64")

    with pytest.raises(Deadlock, match="unmatched send"):
        parasim.run(prog, world=2)


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_wrong_recv_shape_is_a_mismatch():
    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.send(ctx.asarray([1.0, 2.0]), 1)
        else:
            ctx.comm.recv(0, (3,), "float64")

    with pytest.raises(CollectiveMismatch, match="point-to-point"):
        parasim.run(prog, world=2)


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
def test_rank_that_raises_stops_the_run_with_its_traceback():
    def prog(ctx):
        if ctx.rank == 2:
            raise ValueError("boom")
        ctx.comm.barrier()

    with pytest.raises(RankFailed) as info:
        parasim.run(prog, world=3)
    msg = str(info.value)
    assert info.value.rank == 2 and "ValueError: boom" in msg and 'raise ValueError("boom")' in msg
    assert "ranks 0, 1: waits in barrier()" in msg and info.value.waiting[0].startswith("waits in barrier()")
    assert isinstance(info.value.__cause__, ValueError)


def test_groups_must_be_created_by_every_rank_in_the_same_order():
    def prog(ctx):
        names = ["a", "b"] if ctx.rank == 0 else ["b", "a"]
        for n in names:
            ctx.new_group([0, 1], n)

    with pytest.raises(CollectiveMismatch, match="same order"):
        parasim.run(prog, world=2)

    def fewer(ctx):
        if ctx.rank == 0:
            ctx.new_group([0], "solo")

    with pytest.raises(CollectiveMismatch, match="fewer groups"):
        parasim.run(fewer, world=2)


def _solo(call):
    """A program where rank 1 calls `call` on group solo[0], which it is not a member of."""
    def prog(ctx):
        g = ctx.new_group([0], "solo")
        if ctx.rank == 1:
            call(ctx, g)
    return prog


@pytest.mark.parametrize("prog, message", [
    (lambda ctx: ctx.comm.all_reduce([1, 2]), "all_reduce expects a numpy array on virtual ranks, got list"),
    (lambda ctx: ctx.comm.broadcast([1.0], src=0), "broadcast expects a numpy array on virtual ranks, got list"),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1]), op="prod"), "unknown reduce op 'prod'; use one of sum, avg"),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1], "int64"), op="avg"), "op='avg' needs a floating dtype, got int64"),
    (lambda ctx: ctx.comm.reduce_scatter(ctx.asarray([1.0, 2.0, 3.0])),
     "reduce_scatter: size 3 of dim 0 does not divide by the group size 2"),
    (lambda ctx: ctx.comm.all_gather(ctx.asarray([1.0]), dim=3), "all_gather: dim 3 is out of range"),
    (lambda ctx: ctx.comm.reduce_scatter(ctx.asarray([1.0, 2.0]), dim=2), "reduce_scatter: dim 2 is out of range"),
    (lambda ctx: ctx.comm.send(ctx.asarray([1.0]), 5), "send to rank 5: not a member of group world[0, 1]"),
    (lambda ctx: ctx.comm.broadcast(ctx.asarray([1.0]), src=9), "broadcast: src rank 9 is not a member of group"),
    (lambda ctx: ctx.comm.all_to_all([ctx.asarray([1.0])]), "all_to_all: 1 chunks for a group of 2"),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1.0]), algo="tree"), "unknown algo 'tree'; use one of direct, ring"),
    (_solo(lambda ctx, g: ctx.comm.all_reduce(ctx.asarray([1.0]), group=g)),
     "all_reduce: rank 1 is not a member of group solo[0]"),
    (_solo(lambda ctx, g: ctx.comm.broadcast(ctx.asarray([1.0]), 0, group=g)),
     "broadcast: rank 1 is not a member of group solo[0]"),
    (_solo(lambda ctx, g: ctx.comm.barrier(group=g)), "barrier: rank 1 is not a member of group solo[0]"),
    (_solo(lambda ctx, g: ctx.comm.recv(0, (1,), "float64", group=ctx.new_group([1], "one"))),
     "recv from rank 0: not a member of group one[1]"),
    (lambda ctx: ctx.comm.recv(1 - ctx.rank, (1,), None), "recv from rank 1: no dtype given"),
    (lambda ctx: ctx.comm.all_to_all([[1.0], [2.0]]), "all_to_all expects a numpy array on virtual ranks, got list"),
    (lambda ctx: ctx.comm.reduce_scatter([1.0, 2.0]), "reduce_scatter expects a numpy array on virtual ranks, got list"),
    (lambda ctx: ctx.comm.all_gather([1.0]), "all_gather expects a numpy array on virtual ranks, got list"),
    (_solo(lambda ctx, g: ctx.comm.reduce_scatter(ctx.asarray([1.0]), group=g)),
     "reduce_scatter: rank 1 is not a member of group solo[0]"),
    (_solo(lambda ctx, g: ctx.comm.all_gather(ctx.asarray([1.0]), group=g)),
     "all_gather: rank 1 is not a member of group solo[0]"),
    (_solo(lambda ctx, g: ctx.comm.exchange([], group=g)), "exchange: rank 1 is not a member of group solo[0]"),
    (lambda ctx: ctx.comm.all_to_all([ctx.asarray([1.0])] * 2, dim=1), "all_to_all: dim 1 is out of range"),
    (_solo(lambda ctx, g: ctx.comm.all_to_all([ctx.asarray([1.0])], group=g)),
     "all_to_all: rank 1 is not a member of group solo[0]"),
    (lambda ctx: ctx.comm.all_to_all([ctx.asarray([1.0]), ctx.asarray([1.0], "float32")]),
     "all_to_all: chunks must agree in dtype and in every dim but 0; got [((1,), 'float64'), ((1,), 'float32')]"),
    (lambda ctx: ctx.comm.all_to_all([ctx.asarray([[1.0]]), ctx.asarray([[1.0, 2.0]])]),
     "all_to_all: chunks must agree in dtype and in every dim but 0; got [((1, 1), 'float64'), ((1, 2), 'float64')]"),
    (lambda ctx: ctx.comm.all_to_all([ctx.asarray([1.0]), ctx.asarray([[1.0]])]),
     "all_to_all: chunks must agree in dtype and in every dim but 0; got [((1,), 'float64'), ((1, 1), 'float64')]"),
])
def test_bad_arguments_are_clear_errors(prog, message):
    with pytest.raises(CollectiveError) as info:
        parasim.run(prog, world=2)
    assert str(info.value).startswith(message)
    assert issubclass(CollectiveError, ParasimError)


@pytest.mark.parametrize("send_label, recv_label, label", [("act", None, "act"), (None, "grad", "grad"),
                                                           ("act", "grad", "act")])  # the sender's wins
def test_send_and_recv_keep_their_label_and_group(send_label, recv_label, label):
    def prog(ctx):
        g = ctx.new_group([1, 2], "pair")
        if ctx.rank == 1:
            ctx.comm.send(ctx.asarray([1.0]), 2, group=g, label=send_label)
        elif ctx.rank == 2:
            return ctx.comm.recv(1, (1,), "float64", group=g, label=recv_label)

    res = parasim.run(prog, world=3)
    assert res.values[2].tolist() == [1.0]
    ((e,),) = [res.trace.events]
    assert (e.op, e.label, e.group.name, e.ranks) == ("p2p", label, "pair", [1, 2])


def test_bad_world_and_backend():
    with pytest.raises(parasim.UsageError):
        parasim.run(lambda ctx: None, world=0)
    with pytest.raises(parasim.UsageError):
        parasim.run(lambda ctx: None, world=2, backend="mpi")


def test_compute_phase_and_note_marks():
    def prog(ctx):
        ctx.phase("fwd")
        ctx.compute("matmul", flops=8)
        ctx.note("done")
        ctx.comm.barrier()

    tr = parasim.run(prog, world=2).trace
    assert [(e.kind, e.op, e.step, e.phase) for e in tr.events] == [
        ("compute", "matmul", 1, "fwd"), ("compute", "matmul", 1, "fwd"), ("collective", "barrier", 2, "fwd")]
    assert [(m.kind, m.text) for m in tr.marks if m.rank == 0] == [("phase", "fwd"), ("note", "done")]


def test_trace_roundtrip(tmp_path):
    def prog(ctx):
        ctx.phase("p")
        return ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), algo="ring", label="x")

    tr = parasim.run(prog, world=2, keep_values=8).trace
    path = tmp_path / "t.json"
    tr.save(path)
    back = parasim.comm.trace.Trace.load(path)
    assert back.to_json() == tr.to_json()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(parasim.UsageError):
        parasim.comm.trace.Trace.load(bad)


def test_import_parasim_does_not_import_torch():
    import subprocess
    import sys
    code = "import parasim, sys; parasim.run(lambda c: c.comm.barrier(), 2); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_compute_event_whole():
    """A compute note is an event of its own: next number, the rank's clock, the world group, one member
    with nothing in or out, no label, the phase, and its flops."""
    from parasim.comm.interface import Group
    from parasim.comm.trace import Event, Member

    def prog(ctx):
        ctx.phase("work")
        ctx.compute("matmul", 12.0)  # the marker line
    res = parasim.run(prog, world=1)
    (e,) = res.trace.events
    from conftest import site_at
    site = site_at(__file__, "the marker line")
    assert e == Event(0, 1, "compute", "matmul", Group((0,), "world", 0), [Member(0, (), (), 0, 0, site)], None,
                      "work", {"flops": 12.0})


def test_ring_hops_keep_small_values():
    """With algo="ring" and keep_values, each hop of all-reduce, reduce-scatter and all-gather records the
    chunk it moved (two ranks: rank 0 passes its second chunk, rank 1 its first)."""
    def prog(ctx):
        x = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
        ctx.comm.all_reduce(x)
        ctx.comm.reduce_scatter(x)
        ctx.comm.all_gather(x)

    tr = parasim.run(prog, world=2, keep_values=8, algo="ring").trace
    first_hop = [[t["value"] for t in e.hops[0]["transfers"]] for e in tr.events]
    assert first_hop == [[[2.0], [2.0]], [[2.0], [2.0]], [[1.0, 2.0], [2.0, 4.0]]]


def test_a_comm_knows_its_rank_and_world():
    res = parasim.run(lambda ctx: (ctx.comm.rank, ctx.comm.world), world=3)
    assert res.values == [(0, 3), (1, 3), (2, 3)]


@pytest.mark.parametrize("members", [[], [0, 0], [0, 2], [-1, 0], [1, 2, 1]])
def test_a_group_needs_distinct_ranks_inside_the_world(members):
    """Empty, repeated (even with the others in range), and out-of-range members (the world size itself
    included) are refused where the group is made, naming the group and the valid ranks."""
    def prog(ctx):
        ctx.new_group(members, "bad")

    with pytest.raises(CollectiveError, match=r"new_group bad\[.*\] at .*: ranks must be distinct and in 0\.\.1$"):
        parasim.run(prog, world=2)


def test_groups_from_elsewhere_are_refused_and_the_world_group_is_accepted():
    """A group object is checked against the run's own: the world group (index 0) passed explicitly works;
    one with an index this run never made, or the right index with other members, is refused."""
    from parasim.comm.interface import Group

    def prog(ctx, group):
        ctx.new_group([0, 1], "pair")  # index 1
        return ctx.comm.all_reduce(ctx.asarray([1.0]), group=group)

    assert [v.tolist() for v in parasim.run(lambda c: prog(c, Group((0, 1, 2), "world", 0)), 3).values] == [[3.0]] * 3
    for foreign in (Group((0, 1), "pair", 2), Group((1, 2), "pair", 1), Group((0, 1), "tp", 1)):
        with pytest.raises(CollectiveError,
                           match=r"^all_reduce: group .* was not created in this run \(called at tests/unit/comm/test_engine.py:\d+\)$"):
            parasim.run(lambda c, g=foreign: prog(c, g), 3)


def test_groups_created_apart_name_both_sites_and_the_ranks_short_of_groups():
    from conftest import site_at

    def differ(ctx):
        if ctx.rank == 0:
            ctx.new_group([0, 1], "tp")  # rank 0's
        else:
            ctx.new_group([0, 1], "dp")  # rank 1's

    with pytest.raises(CollectiveMismatch) as info:
        parasim.run(differ, 2)
    here, there = site_at(__file__, "rank 1's"), site_at(__file__, "rank 0's")
    assert f"rank 1 created group #1 as dp[0, 1] at {here}, but another rank created it as" in str(info.value)
    assert str(info.value).split(" as ")[2].startswith("tp") and f"at {there};" in str(info.value)

    def fewer(ctx):
        if ctx.rank != 2:
            ctx.new_group([0, 1], "tp")

    with pytest.raises(CollectiveMismatch, match=r"ranks \[2\] created fewer groups than others") as info:
        parasim.run(fewer, 3)
    assert info.value.ranks == [2]


def test_a_failure_ends_the_waiting_ranks_at_once():
    """When one rank raises, the others, parked in a collective, are ended before run() returns: their
    `finally` blocks have run (nothing is left suspended for the garbage collector). A collective called
    from such a block ends too, and does not complete (the run is over)."""
    log, after = [], []

    def prog(ctx):
        pair = ctx.new_group([1, 2], "pair")
        try:
            ctx.comm.barrier()  # every rank has started
            if ctx.rank == 0:
                raise ValueError("boom")
            ctx.comm.barrier()
        finally:
            log.append(ctx.rank)
            if ctx.rank != 0:
                ctx.comm.barrier(group=pair)
                after.append(ctx.rank)

    with pytest.raises(RankFailed, match="rank 0 raised ValueError"):
        parasim.run(prog, 3)
    assert sorted(log) == [0, 1, 2] and after == []


def test_values_are_kept_up_to_keep_values_elements_and_no_further():
    """keep_values=3: a 3-element all-reduce keeps its values before and after, a 4-element one keeps none;
    an all-to-all keeps them only when every chunk in and out is small enough; a barrier keeps empty
    tuples (it moves nothing) and has no tensors in or out."""
    def prog(ctx):
        r = ctx.rank
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0, 3.0]) * (r + 1))
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0, 3.0, 4.0]))
        ctx.comm.all_to_all([ctx.asarray([10.0 * r + j] * 3) for j in range(2)])
        ctx.comm.all_to_all([ctx.asarray([1.0] * (3 + j)) for j in range(2)])  # chunk 1 holds 4 values
        ctx.comm.barrier()

    ev = parasim.run(prog, world=2, keep_values=3).trace.events
    m = ev[0].members[1]
    assert (m.before, m.after) == (([2.0, 4.0, 6.0],), ([3.0, 6.0, 9.0],))
    assert all((m.before, m.after) == (None, None) for m in ev[1].members)
    m = ev[2].members[0]  # rank 0 sends [0,0,0] to itself and [1,1,1] to rank 1; gets [0,0,0] and [10,10,10]
    assert (m.before, m.after) == (([0.0] * 3, [1.0] * 3), ([0.0] * 3, [10.0] * 3))
    assert all((m.before, m.after) == (None, None) for m in ev[3].members)
    assert [(m.ins, m.outs, m.before, m.after) for m in ev[4].members] == [((), (), (), ())] * 2


def test_a_deadlock_names_the_call_number_on_its_group():
    def prog(ctx):
        for i in range(3 if ctx.rank == 0 else 2):
            ctx.comm.all_reduce(ctx.asarray([1.0]))

    with pytest.raises(Deadlock, match=r"rank 0: waits in all_reduce.* on group world\[0, 1\] \(call #2 on it\)"):
        parasim.run(prog, world=2)


def test_a_run_keeps_values_until_its_budget_is_spent(monkeypatch):
    """A run keeps at most KEPT_VALUES numbers (12 here). The first ring all-reduce of 3 numbers on 2 ranks keeps
    2 x (3 in + 3 out) = 12: all of it, hops included. Then nothing more fits: the second call keeps no values,
    neither its members' nor its hops', though each of its numbers is within keep_values."""
    monkeypatch.setattr("parasim.comm.virtual.KEPT_VALUES", 12)

    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0, 3.0]), algo="ring")
        ctx.comm.all_reduce(ctx.asarray([5.0, 6.0]), algo="ring")
        ctx.comm.all_reduce(ctx.asarray([7.0]))

    first, second, third = parasim.run(prog, world=2, keep_values=3).trace.events
    assert first.phase is None  # no rank named a phase
    assert [(m.before, m.after) for m in first.members] == [(([1.0, 2.0, 3.0],), ([2.0, 4.0, 6.0],))] * 2
    assert [t["value"] for h in first.hops for t in h["transfers"]] == [[3.0], [1.0, 2.0], [2.0, 4.0], [6.0]]
    for e in (second, third):
        assert [(m.before, m.after) for m in e.members] == [(None, None)] * 2
    assert [t["value"] for h in second.hops for t in h["transfers"]] == [None] * 4


def _failure(prog, world: int) -> RankFailed:
    with pytest.raises(RankFailed) as err:
        parasim.run(prog, world)
    return err.value


def test_a_failure_says_what_every_other_rank_waits_in():
    """When a rank raises, each other rank's state is named: finished, not yet at a collective, waiting in a
    collective (its call, group, call number, site, who arrived and who is missing: shared by the ranks waiting
    in the same instance at the same line, apart otherwise), or waiting in point-to-point with its unmatched
    posts; a world of one has nobody left ("none")."""
    def alone(ctx):
        raise ValueError("boom")

    assert str(_failure(alone, 1)).endswith("ranks left waiting:\n  none")

    def early(ctx):
        if ctx.rank == 0:
            raise ValueError("boom")
        ctx.comm.barrier()

    assert _failure(early, 2).waiting == {0: "finished", 1: "had not reached a collective yet"}

    def two_lines(ctx):
        a, b = ctx.new_group([0, 1], "a"), ctx.new_group([2, 3], "b")
        if ctx.rank == 4:
            raise ValueError("boom")
        if ctx.rank in (0, 2):
            ctx.comm.all_reduce(ctx.asarray([1.0]), group=a if ctx.rank == 0 else b)
        elif ctx.rank == 1:
            ctx.comm.barrier()
        else:
            ctx.comm.barrier()

    failed = _failure(two_lines, 5)
    waiting = failed.waiting
    left = str(failed).split("ranks left waiting:\n")[1].split("\n")
    assert [line.split(":")[0] for line in left] == ["  rank 0", "  rank 1", "  rank 2", "  rank 3"]
    call = "all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct)"
    assert re.fullmatch(rf"waits in {re.escape(call)} on group a\[0, 1\] \(call #0 on it\) at \S+:\d+; "
                        r"arrived \[0\], missing \[1\]", waiting[0]), waiting[0]
    assert re.fullmatch(rf"waits in {re.escape(call)} on group b\[2, 3\] \(call #0 on it\) at \S+:\d+; "
                        r"arrived \[2\], missing \[3\]", waiting[2]), waiting[2]
    site_1, site_3 = (waiting[r].split(" at ")[1].split(";")[0] for r in (1, 3))
    assert site_1 != site_3  # the same barrier, called from two lines: a text each
    assert waiting[1].replace(site_1, "") == waiting[3].replace(site_3, "")

    def posts(ctx):
        if ctx.rank == 1:
            raise ValueError("boom")
        ctx.comm.exchange([Send(ctx.asarray([1.0]), 1), Recv(1, (1,), "float64")])

    assert re.fullmatch(r"waits in point-to-point at \S+:\d+: unmatched send\(shape=\(1,\), dtype=float64\) to "
                        r"rank 1, recv\(shape=\(1,\), dtype=float64\) from rank 1", _failure(posts, 2).waiting[0])


def test_a_member_that_gets_nothing_back_records_no_output():
    """A reduce to rank 0: both bring a tensor, only rank 0 gets one back."""
    ev = parasim.run(lambda ctx: ctx.comm.reduce(ctx.asarray([1.0, 2.0]), dst=0), world=2).trace.events
    assert [(len(m.ins), len(m.outs)) for m in ev[0].members] == [(1, 1), (1, 0)]


def test_a_collective_called_by_name_is_the_one_its_method_runs():
    """comm.call(name, ...) hands an op with a method of its own to that method, with its group, label and
    params: the same results and the same trace as calling the method; an op with no array takes none."""
    def by(how):
        def prog(ctx):
            g = ctx.new_group([0, 1], "dp")
            x = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
            if how == "name":
                out = ctx.comm.call("all_reduce", x, group=g, label="sum it", op="max")
                ctx.comm.call("barrier", group=g, label="wait")
            else:
                out = ctx.comm.all_reduce(x, group=g, label="sum it", op="max")
                ctx.comm.barrier(group=g, label="wait")
            return out
        return parasim.run(prog, 2)

    def first_members(e):  # members' records without their call sites (the lines differ)
        return [(m.rank, m.ins, m.outs, m.sent, m.recv) for m in e.members]

    name, method = by("name"), by("method")
    assert [v.tolist() for v in name.values] == [[2.0, 4.0]] * 2
    for a, b in zip(name.trace.events, method.trace.events):
        assert (a.op, a.group, a.label, a.params, first_members(a)) == (b.op, b.group, b.label, b.params,
                                                                        first_members(b))
    assert [(e.op, e.group.name, e.label) for e in name.trace.events] == [("all_reduce", "dp", "sum it"),
                                                                         ("barrier", "dp", "wait")]


def test_a_mismatch_lists_every_member_and_the_calls_of_those_that_arrived():
    def prog(ctx):
        x = ctx.asarray([1.0, 2.0])
        if ctx.rank == 0:
            ctx.comm.all_reduce(x)
        elif ctx.rank == 1:
            ctx.comm.all_gather(x)
        else:
            ctx.comm.all_reduce(x)

    with pytest.raises(CollectiveMismatch) as err:
        parasim.run(prog, 3)
    lines = str(err.value).split("\n")
    assert lines[0] == "collective call #0 on group world[0, 1, 2] does not match across ranks:"
    assert lines[1].startswith("  rank 0: all_reduce(shape=(2,), dtype=float64, op=sum, algo=direct) at ")
    assert lines[2].startswith("  rank 1: all_gather(shape=(2,), dtype=float64, dim=0, algo=direct) at ")
    assert lines[3:] == ["  rank 2: not arrived yet"]
    assert err.value.ranks == [0, 1] and [c.split(" at ")[0] for c in err.value.calls] == [
        "all_reduce(shape=(2,), dtype=float64, op=sum, algo=direct)",
        "all_gather(shape=(2,), dtype=float64, dim=0, algo=direct)"]


def test_ranks_asking_for_the_same_groups_in_one_go_share_them_and_a_different_ask_is_refused():
    import parasim
    from parasim.errors import CollectiveError, CollectiveMismatch

    wanted = [([0, 1], "tp"), ([2, 3], "tp"), ([0, 2], "dp"), ([1, 3], "dp")]

    def program(ctx):
        ctx.new_group([0, 1, 2, 3], "all")  # one group first: the bulk ones are numbered after it
        got = ctx.comm.new_groups(wanted)
        return [(g.index, g.name, g.ranks) for g in got], ctx.comm.new_group([0, 3], "pair").index

    from parasim.comm.virtual import VirtualWorld

    made = []
    real = VirtualWorld.new_group

    def counted(self, rank, ranks, name, site):
        made.append(rank)
        return real(self, rank, ranks, name, site)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VirtualWorld, "new_group", counted)
        values = parasim.run(program, 4).values
    # the first rank made them one by one; the others took its groups, checked at once
    assert made.count(0) == 1 + 4 + 1 and made.count(3) == 1 + 1
    assert values[0] == ([(2, "tp", (0, 1)), (3, "tp", (2, 3)), (4, "dp", (0, 2)), (5, "dp", (1, 3))], 6)
    assert values == [values[0]] * 4

    def differs(ctx):
        ctx.comm.new_groups(wanted if ctx.rank == 0 else [([0, 1], "tp"), ([2, 3], "tp"), ([0, 3], "dp"),
                                                          ([1, 2], "dp")])

    with pytest.raises(CollectiveMismatch, match=r"rank 1 created group #3 as dp\[0, 3\]"):
        parasim.run(differs, 4)

    def bools(ctx):  # equal to rank 0's ask under ==, but not ranks: refused as new_group refuses them
        ctx.comm.new_groups(wanted if ctx.rank == 0 else [([False, True], "tp"), *wanted[1:]])

    with pytest.raises(CollectiveError, match="ranks must be integers, got False"):
        parasim.run(bools, 4)


def test_a_backend_without_its_own_new_groups_makes_them_one_by_one():
    """Comm.new_groups, as the real ranks' backend takes it: new_group of each, in order."""
    from types import SimpleNamespace

    from parasim.comm.interface import Comm

    made = []
    fake = SimpleNamespace(new_group=lambda ranks, name: made.append((tuple(ranks), name)) or len(made))
    assert Comm.new_groups(fake, [([0, 1], "tp"), ([2, 3], "tp"), ([0, 2], "dp")]) == [1, 2, 3]
    assert made == [((0, 1), "tp"), ((2, 3), "tp"), ((0, 2), "dp")]

"""The op table (parasim/comm/ops.py) is the one place a collective is described: every entry is reachable
as a Comm method of its name, drawn distinctly, accepted by the trace format, and replayed to the same event."""
import numpy as np

import parasim
from parasim.comm.interface import Comm
from parasim.comm.ops import OPS
from parasim.trace import Trace


def test_every_entry_is_a_public_method_with_its_own_look():
    assert set(OPS) == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "scatter",
                        "barrier"}
    for name, op in OPS.items():
        assert op.name == name and callable(getattr(Comm, name)) and op.takes in ("array", "chunks", "nothing")
        assert len(op.glyph) == 2 and op.title and op.colour
    for field in ("glyph", "title", "colour"):
        values = [getattr(op, field) for op in OPS.values()]
        assert len(set(values)) == len(values), field


def one_of_each(ctx):
    comm, x = ctx.comm, ctx.asarray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) + ctx.rank
    comm.all_reduce(x), comm.reduce_scatter(x), comm.all_gather(x), comm.all_to_all([x[:1], x[1:], x[:0]])
    comm.broadcast(x, 2), comm.reduce(x, 1, "max"), comm.scatter(x, 0), comm.barrier()


def test_the_trace_file_keeps_every_op_and_a_replay_gives_the_same_events(tmp_path):
    trace = parasim.run(one_of_each, 3, keep_values=8).trace
    assert [e.op for e in trace.events] == list(OPS)
    trace.save(tmp_path / "t.json")
    again = Trace.load(tmp_path / "t.json")  # checked against the schema first
    assert [(e.op, e.params, [(m.sent, m.recv, m.after) for m in e.members]) for e in again.events] == \
        [(e.op, e.params, [(m.sent, m.recv, m.after) for m in e.members]) for e in trace.events]

    def replay(ctx):  # each event made again from its record alone: op, params, input shapes
        for e in trace.events:
            m = next(m for m in e.members if m.rank == ctx.rank)
            OPS[e.op].replay(ctx.comm, [np.zeros(t.shape, t.dtype) for t in m.ins], e.params, None, e.label)
    replayed = parasim.run(replay, 3).trace
    assert [(e.op, e.params, e.step, [(m.rank, m.ins, m.outs, m.sent, m.recv) for m in e.members])
            for e in replayed.events] == \
        [(e.op, e.params, e.step, [(m.rank, m.ins, m.outs, m.sent, m.recv) for m in e.members]) for e in trace.events]
    reduce = trace.events[5]
    assert [m.after for m in reduce.members] == [(), ([3.0, 4.0, 5.0, 6.0, 7.0, 8.0],), ()]  # max: rank 2's x


def test_the_default_algorithm_counts_the_ring_bytes_of_the_full_buffer():
    """Without a ring of our own (algo="auto"), a record's bytes are the ring's of the full buffer: the input
    of a reduce-scatter and an all-reduce, the result of an all-gather. 3 members, 6 float64 (48 bytes) each;
    worked by hand: a reduce-scatter or all-gather moves (t-1)/t of the full buffer, an all-reduce twice that."""
    def prog(ctx):
        x = ctx.asarray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        ctx.comm.all_reduce(x), ctx.comm.reduce_scatter(x), ctx.comm.all_gather(x[:2])
    trace = parasim.run(prog, 3).trace
    full = 48
    assert [[(m.sent, m.recv) for m in e.members] for e in trace.events] == [
        [(2 * full * 2 // 3,) * 2] * 3, [(full * 2 // 3,) * 2] * 3, [(full * 2 // 3,) * 2] * 3]


def test_every_table_keyed_by_a_collective_covers_the_op_table_and_nothing_else():
    """Issue 52: a collective is keyed again in the clock's costs, the hop rules and the app's sentences; each
    of those tables holds exactly the op table's entries and point-to-point, so a new collective missing from
    one of them fails here, not on a learner's run."""
    from parasim.clock.costs import COSTS
    from parasim.comm.hops import SENDS
    from parasim.tui.moves import HOW
    want = set(OPS) | {"p2p"}
    for name, table in (("clock/costs.py COSTS", COSTS), ("comm/hops.py SENDS", SENDS), ("tui/moves.py HOW", HOW)):
        assert set(table) == want, name

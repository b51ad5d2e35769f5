"""The op table (parasim/comm/ops.py) is the one place a collective is described: every entry is reachable
as a Comm method of its name, drawn distinctly, accepted by the trace format, and replayed to the same event."""
import numpy as np
import pytest

import parasim
from parasim.comm.interface import Comm
from parasim.comm.ops import OPS
from parasim.errors import CollectiveError, CollectiveMismatch, Deadlock

from conftest import site_at
from parasim.comm.trace import Trace


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


def test_every_op_names_a_pattern_the_hops_the_clock_and_the_app_all_know():
    """Issue 52: a collective's senders, its cost and its sentence for a learner are its pattern's (comm/hops.py
    PATTERNS, clock/costs.py COSTS), named in its entry; the patterns and the costs are one set."""
    from parasim.clock.costs import COSTS
    from parasim.comm.hops import PATTERNS
    assert set(COSTS) == set(PATTERNS)
    assert {op.sends for op in OPS.values()} | {"one-pair"} == set(PATTERNS)
    assert {name for name, op in OPS.items() if op.reduces} == {"all_reduce", "reduce_scatter", "reduce"}


def test_the_bus_factors_are_nccl_tests():
    """nccl-tests' doc/PERFORMANCE.md, by hand at 8 ranks: an all-reduce moves 2(n-1)/n of the buffer from each
    rank (14/8), a reduce-scatter, an all-gather and an all-to-all (n-1)/n (7/8), a broadcast and a reduce the
    buffer (1); a barrier moves nothing and an op the table lacks is no op at all."""
    from parasim.comm.ops import bus_factor
    assert {name: bus_factor(name, 8) for name in OPS if name != "barrier"} == {
        "all_reduce": 14 / 8, "reduce_scatter": 7 / 8, "all_gather": 7 / 8, "all_to_all": 7 / 8, "broadcast": 1.0,
        "reduce": 1.0, "scatter": 7 / 8}
    for name in ("barrier", "gather"):
        with pytest.raises(KeyError):
            bus_factor(name, 8)


def test_an_op_the_table_lacks_is_refused_in_one_line_at_the_programs_call():
    def prog(ctx):
        ctx.comm.call("gather", ctx.asarray([1.0]))  # unknown op
    with pytest.raises(CollectiveError, match="no collective 'gather' in the op table") as info:
        parasim.run(prog, 2)
    assert "\n" not in str(info.value) and site_at(__file__, "unknown op") in str(info.value)



def test_an_op_the_table_lacks_is_refused_as_such_where_another_member_opened_the_call():
    """Rank 0 opens an all-reduce; rank 1 joins it by a name the table lacks: refused as unknown, naming its own
    line, not as a call that does not fit rank 0's."""
    def prog(ctx):
        x = ctx.asarray([1.0])
        if ctx.rank == 0:
            return ctx.comm.all_reduce(x)
        return ctx.comm.call("gather", x)  # joins with an unknown op
    with pytest.raises(CollectiveError, match="^no collective 'gather' in the op table") as info:
        parasim.run(prog, 2)
    assert "\n" not in str(info.value) and site_at(__file__, "joins with an unknown op") in str(info.value)
    assert "does not" not in str(info.value) and "mismatch" not in str(info.value).lower()

# A collective the package has never seen, added as its one entry of the op table before anything else reads it:
# member i gets member i-1's array (a ring shifted by one). Its kernel, byte count and look are the entry's; its
# pattern ("ring": each member sends to the next) gives it its senders, its clock and its sentence.
SCRATCH = """
import json, sys
import numpy as np
from parasim.comm import ops

def _shift(inputs, g, p, keep):
    return [inputs[(i - 1) % g.size].copy() for i in range(g.size)], None

def _no_torch(c, x, p):
    raise NotImplementedError("the scratch collective runs on virtual ranks")

ops.OPS["shift"] = ops.Op("shift", "array", _shift, _no_torch, lambda ins, outs, g, i, p: (ins[0].nbytes, outs[0].nbytes),
                          ("on each rank", "the previous rank's"), "SH", "shift", "teal", "ring", lambda t: 1.0)

import asyncio
import parasim
from parasim.cli import main
from parasim.clock import machine, simulate
from parasim.estimate import kernels
from parasim.comm.trace import Trace
from parasim.tui.app import ParasimApp
from parasim.tui.moves import moves
from parasim.tui.view import View
sys.path.insert(0, sys.argv[1])
from toy import prog

out = {"cli": main(["lesson", sys.argv[1] + "/toy.py:prog", "--world", "4", "--plain", "--chrome", sys.argv[2]])}
trace = parasim.run(prog, 4, keep_values=8).trace
trace.save(sys.argv[3])
again = Trace.load(sys.argv[3])
e = next(e for e in again.events if e.op == "shift")
out["after"] = [list(m.after[0]) for m in e.members]
start, end = simulate(again, machine("h100")).events[e.seq]
out["seconds"] = end - start
out["busbw"] = kernels.collective_bandwidth("h100", "all_reduce", 8, "inside", 4).value
out["note"] = kernels.collective_bandwidth("h100", "shift", 8, "inside", 4).notes
out["moves"] = moves(e)
view = View(again)
out["cell"] = view.cell(0, e.step)

async def shown():
    app = ParasimApp(view, start=again.events.index(e))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        return app.export_screenshot()
out["app"] = "SH" in asyncio.run(shown())
print(json.dumps(out))
"""


def test_a_new_collective_is_its_one_entry_and_runs_through_the_cli_the_clock_the_exports_and_the_app(tmp_path):
    """Issue 52's acceptance: a scratch collective, one entry of the op table and nothing else, runs as a
    user's program through `parasim lesson` (with `--chrome` at the clock's times), the trace file, the clock,
    the estimator's measured rates and the app. Worked by hand: 4 float64 values (32 B) a rank, timed at BF16's
    2 of 8 bytes (8 B on the wire), a bus factor of 1: 8 B at the all-reduce's measured busbw for 8 B (no sweep
    of a shift anywhere), nothing else."""
    import json
    import subprocess
    import sys
    (tmp_path / "toy.py").write_text(
        "def prog(ctx):\n"
        "    x = ctx.asarray([1.0, 2.0, 3.0, 4.0]) * (ctx.rank + 1)\n"
        "    ctx.comm.call('shift', x, label='from the rank before')\n")
    (tmp_path / "scratch.py").write_text(SCRATCH)
    chrome, saved = tmp_path / "c.json", tmp_path / "t.json"
    run = subprocess.run([sys.executable, str(tmp_path / "scratch.py"), str(tmp_path), str(chrome), str(saved)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["cli"] == 0
    assert out["after"] == [[4.0 * k for k in (1, 2, 3, 4)]] + [[i * k for k in (1, 2, 3, 4)] for i in (1.0, 2.0, 3.0)]
    assert out["seconds"] == pytest.approx(8 / out["busbw"])
    assert any("no shift measured on h100" in n for n in out["note"])
    assert out["moves"][0].startswith("counted as a ring moves them")
    assert "rank 0 → rank 1   32 B" in out["moves"] and "rank 3 → rank 0   32 B" in out["moves"]
    assert out["cell"] == ["SH", "shift"] and out["app"]
    events = json.loads(chrome.read_text())["traceEvents"]
    assert any(ev.get("name", "").startswith("shift") and ev.get("dur", 0) > 0 for ev in events)


def test_only_a_name_is_looked_up_in_the_op_table():
    from parasim.comm.ops import entry
    assert entry("all_reduce").name == "all_reduce"
    for bad in (["all_reduce"], None, 3):
        with pytest.raises(CollectiveError, match=r"^no collective .* in the op table"):
            entry(bad)


def test_a_recorded_call_replays_with_its_group_label_and_params():
    """replay hands an "array" op its first array alone, with the group, label and params recorded."""
    from parasim.comm.ops import OPS

    def prog(ctx):
        g = ctx.new_group([0, 1], "dp")
        x = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
        return OPS["all_reduce"].replay(ctx.comm, [x, ctx.asarray([9.0])], {"op": "max"}, g, "again")

    res = parasim.run(prog, 2)
    assert [v.tolist() for v in res.values] == [[2.0, 4.0]] * 2
    (e,) = res.trace.events
    assert (e.op, e.group.name, e.label, e.params.get("op")) == ("all_reduce", "dp", "again", "max")


def test_the_transfers_of_an_event_follow_its_members():
    """A compute event moves nothing; a transfer between ranks 0 and 2 of 3 is read from its two members (the
    world's rank 1 took no part)."""
    import dataclasses

    from parasim.comm.hops import event_transfers

    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.send(ctx.asarray([1.0, 2.0]), 2)
        elif ctx.rank == 2:
            ctx.comm.recv(0, (2,), "float64")

    (e,) = parasim.run(prog, 3).trace.events
    assert e.kind == "p2p" and event_transfers(e) == [(0, 2, 16)]
    assert event_transfers(dataclasses.replace(e, kind="compute")) == []


def test_an_op_without_a_method_of_its_own_is_called_by_name(monkeypatch):
    """Entries added to the op table under new names (copies of all-reduce, all-to-all and barrier), called by
    name: each meets its kernel with the array, the chunks or nothing given, on its group, with its label and
    params, named at the program's line; members that disagree on the chunks' count are a mismatch."""
    import dataclasses

    from parasim.comm import ops

    for new, old in (("sum_up", "all_reduce"), ("swap", "all_to_all"), ("wait_all", "barrier")):
        monkeypatch.setitem(ops.OPS, new, dataclasses.replace(ops.OPS[old], name=new))

    def prog(ctx):
        g = ctx.new_group([0, 1], "dp")
        total = ctx.comm.call("sum_up", ctx.asarray([1.0, 2.0]) * (ctx.rank + 1), group=g, label="add", op="max",
                              algo="direct")
        swapped = ctx.comm.call("swap", [ctx.asarray([10.0 * ctx.rank + j]) for j in range(2)], group=g, label="x")
        ctx.comm.call("wait_all", group=g, label="w")  # a call site
        return total, swapped

    res = parasim.run(prog, 2)
    (t0, s0), (t1, s1) = res.values
    assert t0.tolist() == t1.tolist() == [2.0, 4.0]
    assert [a.tolist() for a in s0] == [[0.0], [10.0]] and [a.tolist() for a in s1] == [[1.0], [11.0]]
    assert [(e.op, e.group.name, e.label) for e in res.trace.events] == [("sum_up", "dp", "add"), ("swap", "dp", "x"),
                                                                        ("wait_all", "dp", "w")]
    assert res.trace.events[0].params["op"] == "max"
    assert all(m.site == site_at(__file__, "a call site") for m in res.trace.events[2].members)

    def uneven(ctx):
        ctx.comm.call("swap", [ctx.asarray([1.0])] * (2 + ctx.rank))

    with pytest.raises(CollectiveMismatch):
        parasim.run(uneven, 2)

    def not_an_array(ctx):
        ctx.comm.call("sum_up", [1.0, 2.0, "x"])

    with pytest.raises(CollectiveError, match="sum_up"):
        parasim.run(not_an_array, 2)

    def text(ctx):
        ctx.comm.call("sum_up", "text", op="sum", algo="direct")

    with pytest.raises(CollectiveError, match=r"^sum_up expects a numpy array on virtual ranks, got str"):
        parasim.run(text, 2)

    def outsider(ctx):
        g = ctx.new_group([0, 1], "dp")
        if ctx.rank == 2:
            ctx.comm.call("sum_up", ctx.asarray([1.0]), group=g, op="sum", algo="direct")

    with pytest.raises(CollectiveError, match=r"^sum_up: rank 2 is not a member of group dp\[0, 1\]"):
        parasim.run(outsider, 3)

    def alone(ctx):
        if ctx.rank == 0:
            ctx.comm.call("sum_up", ctx.asarray([1.0, 2.0]), op="max", algo="direct")

    with pytest.raises(Deadlock, match=r"rank 0: waits in sum_up\(shape=\(2,\), dtype=float64, op=max, algo=direct\) "
                                       r"on group world\[0, 1\]"):
        parasim.run(alone, 2)

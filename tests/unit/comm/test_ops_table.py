"""The op table (parasim/comm/ops.py) is the one place a collective is described: every entry is reachable
as a Comm method of its name, drawn distinctly, accepted by the trace format, and replayed to the same event."""
import numpy as np
import pytest

import parasim
from parasim.comm.interface import Comm
from parasim.comm.ops import OPS
from parasim.errors import CollectiveError

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

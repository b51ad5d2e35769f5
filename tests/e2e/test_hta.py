"""`--hta DIR` writes traces Holistic Trace Analysis reads: its temporal breakdown per rank equals the totals
of the trace's own slices (skipped when the package is absent; the test extra installs it)."""
import json
import math

import pytest
from conftest import cli

from parasim.clock.timeline import export_times
from parasim.lesson import get_lesson, run_lesson

pytest.importorskip("hta")


def _union(intervals: list[tuple[int, int]]) -> int:
    """Length covered by [start, end) intervals, overlaps counted once."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def test_union_by_hand():
    assert _union([(0, 10), (5, 15), (20, 25)]) == 20 and _union([(0, 10), (2, 3)]) == 10 and _union([]) == 0


def test_hta_temporal_breakdown_equals_the_traces_totals(tmp_path):
    from hta.trace_analysis import TraceAnalysis
    out = cli("lesson", "ring-attention", "--plain", "--hta", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lr = run_lesson(get_lesson("ring-attention"))  # the same deterministic run, timed on the same clock
    trace = lr.result.trace
    times, work = export_times(trace, lr.timeline())
    expected = {}
    for r in range(trace.world):
        f = json.loads((tmp_path / f"rank{r}.json").read_text())
        kernels = [e for e in f["traceEvents"] if e.get("cat") == "kernel"]
        # the files hold the trace: one kernel per member of each event, at the clock's time (whole
        # microseconds inside it, at least one), and one per compute span the clock put between events
        events = [k for k in kernels if "seq" in k["args"]]
        assert len(events) == sum(1 for e in trace.events for m in e.members if m.rank == r)
        assert len(kernels) - len(events) == sum(1 for w in work if w[0] == r)
        for k in events:
            start, dur = times[(k["args"]["seq"], r)]
            assert k["ts"] == math.ceil(start) and k["ts"] + k["dur"] <= max(math.ceil(start + dur), k["ts"] + 1)
        spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
        compute = [(k["ts"], k["ts"] + k["dur"]) for k in kernels if not k["name"].startswith("nccl")]
        busy, first, last = _union(spans), min(s for s, _ in spans), max(e for _, e in spans)
        expected[r] = {"idle_time(us)": last - first - busy, "compute_time(us)": _union(compute),
                       "non_compute_time(us)": busy - _union(compute), "kernel_time(us)": last - first}
    assert any(v["non_compute_time(us)"] > 0 and v["compute_time(us)"] > 0 for v in expected.values())
    breakdown = TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    got = {int(row["rank"]): {k: int(row[k]) for k in expected[0]} for _, row in breakdown.iterrows()}
    assert got == expected

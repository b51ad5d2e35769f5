"""The pipeline lessons: the slot tables noted by each stage are the post's, and the checks hold."""
import pytest

from parasim.lesson import get_lesson, run_lesson
from test_pipeline_schedules import POST_1F1B, POST_GPIPE


@pytest.mark.parametrize("name, table", [("pp-gpipe", POST_GPIPE), ("pp-1f1b", POST_1F1B)])
def test_pipeline_lesson(name, table):
    lr = run_lesson(get_lesson(name))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note")
    assert [text.split(": ", 1)[1] for _, text in notes] == table
    assert run_lesson(get_lesson(name), 2).ok


def test_interleaved_lesson():
    lr = run_lesson(get_lesson("pp-interleaved"))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    got = {c.name.split(",")[0]: c.got for c in lr.checks}
    assert got["1F1B's bubble"] == "3/7" and got["interleaved bubble = (p-1)/(v*m+p-1)"] == "3/11"  # the post's
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note")
    assert notes[0][1].startswith("GPU 1: F1 F2 F3 F4 f1 f2 f3 f4")  # GPU 1 holds layers 1 and 5


@pytest.mark.parametrize("world, idle", [(4, 6), (2, 2)])
def test_interleaved_slots_are_half_as_long(world, idle):
    """The same 2(p-1) idle slots per GPU as 1F1B, each half as long (v = 2): half the idle time."""
    lr = run_lesson(get_lesson("pp-interleaved"), world)
    assert lr.ok, [c for c in lr.checks if not c.ok]
    got = {c.name.split(":")[0].split(" (")[0]: c.got for c in lr.checks}
    assert got["idle slots per rank, interleaved and 1F1B"] == [[idle] * world, [idle] * world]
    assert got["each slot half as long"] == "1/2"
    assert got["so each rank idles half as long as under 1F1B on the same layers"] == ["1/2"] * world
    assert [x["idle"] for x in lr.result.values] == [idle] * world
    assert [len({*x["grad_sq"]}) for x in lr.result.values] == [2] * world  # two one-layer chunks per GPU


def test_zero_bubble_lesson():
    lr = run_lesson(get_lesson("pp-zero-bubble"))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    assert run_lesson(get_lesson("pp-zero-bubble"), 2).ok
    # the deferred weight passes ran: W actions are in the plan and every gradient matched the unsplit model
    assert any(" W1 " in m.text for m in lr.result.trace.marks if m.kind == "note")

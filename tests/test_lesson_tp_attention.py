"""The tp-attention lesson: heads per rank, 2 all-reduces each way per layer (measured), GQA replicas."""
import pytest

from parasim.lesson import get_lesson, run_lesson


@pytest.mark.parametrize("world", [1, 2, 4])
def test_checks_hold(world):
    lr = run_lesson(get_lesson("tp-attention"), world)
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_two_all_reduces_each_way_per_layer():
    lr = run_lesson(get_lesson("tp-attention"), 4)
    for phase in ("one layer forward", "one layer backward"):
        assert sum(e.op == "all_reduce" for e in lr.result.trace.events if e.phase == phase) == 2
    assert [v["gqa"]["kv"] for v in lr.result.values] == [[0], [0], [1], [1]]

"""The tp-attention lesson: heads per rank, 2 all-reduces each way per layer (measured), GQA replicas."""
import pytest

import parasim.nn.attention as attention
from parasim.lesson import get_lesson, run_lesson


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16])
def test_checks_hold(world):
    lr = run_lesson(get_lesson("tp-attention"), world)
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_two_all_reduces_each_way_per_layer():
    lr = run_lesson(get_lesson("tp-attention"), 4)
    for phase in ("one layer forward", "one layer backward"):
        assert sum(e.op == "all_reduce" for e in lr.result.trace.events if e.phase == phase) == 2


@pytest.mark.parametrize("world, mha, gqa", [
    # 4 q heads; GQA has max(1, t // 2) kv heads, so q heads 0-1 read kv head 0 and q heads 2-3 kv head 1
    (4, [[0], [1], [2], [3]], [([0], [0]), ([1], [0]), ([2], [1]), ([3], [1])]),
    (2, [[0, 1], [2, 3]], [([0, 1], [0]), ([2, 3], [0])]),  # one kv head, on both ranks
    (1, [[0, 1, 2, 3]], [([0, 1, 2, 3], [0])]),
])
def test_heads_each_rank_holds(world, mha, gqa):
    """Which heads' weights each rank holds (found by matching weight columns), written out by hand."""
    v = run_lesson(get_lesson("tp-attention"), world).result.values
    assert [x["mha"]["held"] for x in v] == [{"q": q, "k": q, "v": q} for q in mha]
    assert [x["gqa"]["held"] for x in v] == [{"q": q, "k": kv, "v": kv} for q, kv in gqa]


def test_a_wrong_head_split_fails_the_head_checks(monkeypatch):
    """Give each rank the next rank's heads (a rotation of the right split): the head checks must say so."""
    split = attention.head_split
    monkeypatch.setattr(attention, "head_split", lambda heads, kv, t, r: split(heads, kv, t, (r + 1) % t))
    lr = run_lesson(get_lesson("tp-attention"), 4)
    bad = [c.name.split(":")[0] for c in lr.checks if not c.ok]
    assert "MHA on 4 rank(s)" in bad and "GQA, 2 kv head(s) on 4 rank(s)" in bad

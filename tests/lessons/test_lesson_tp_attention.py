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


def test_a_head_split_in_half_goes_wrong_and_is_mended_only_by_adding_the_scores():
    """Two ranks each holding half of one head's Q and K columns: softmax of each half, added, sums to 2 a row
    and is not the softmax; the halves of the scores added first (an all-reduce of the s x s scores) give it.
    Worked here from the run's own Q and K."""
    import numpy as np
    from parasim.lesson import get_lesson, run_lesson

    lr = run_lesson(get_lesson("tp-attention"), knobs={"tp": 2})
    half = lr.result.values[0]["half"]
    q, k = np.asarray(half["q"]), np.asarray(half["k"])
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    parts = [q[:, :2] @ k[:, :2].T, q[:, 2:] @ k[:, 2:].T]
    assert np.allclose(np.asarray(half["wrong"]), softmax(parts[0]) + softmax(parts[1]), rtol=0, atol=1e-12)
    assert np.allclose(np.asarray(half["right"]), softmax(parts[0] + parts[1]), rtol=0, atol=1e-12)
    events = [e for e in lr.result.trace.events if e.phase == "a head split in half: why not"]
    assert [e.op for e in events] == ["all_reduce", "all_reduce"] and all(e.group.ranks == (0, 1) for e in events)
    assert "a head split in half: why not" not in {e.phase for e in run_lesson(get_lesson("tp-attention"),
                                                                                knobs={"tp": 1}).result.trace.events}

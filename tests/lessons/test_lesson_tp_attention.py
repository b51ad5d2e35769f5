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


@pytest.mark.parametrize("world, heads, kv, per", [(1, 4, 1, 4), (4, 4, 2, 1), (16, 16, 8, 1)])
def test_the_walk_through_works_the_head_rule_for_the_runs_model(world, heads, kv, per):
    """The heads phase says whole heads must divide by t, with the run's own counts; the GQA phase gives the run's
    kv heads and copies, and (below TP 16) that it is the post's case, 16 heads and 8 KV heads at TP 16, made
    smaller. The counts here are written out by hand for each TP size."""
    from parasim.errors import UsageError

    lesson = get_lesson("tp-attention")
    assert "t has to be a divisor of the number of heads" in " ".join(
        lesson.narrative["heads split across ranks"].split())
    gqa_words = " ".join(lesson.narrative["grouped-query attention"].split())
    assert "scaled down" in gqa_words and "--tp 16" in gqa_words
    lr = run_lesson(lesson, world)
    notes = lr.result.trace.notes("kv_heads")
    rule = [n for n in notes if n[0] == "heads split across ranks"]
    gqa = [n for n in notes if n[0] == "grouped-query attention"]
    assert [n[1] for n in rule] == [n[1] for n in gqa] == [world - 1]  # said once, for the run, after the rest
    assert {(d["heads"], d["kv_heads"], d["tp"]) for _, _, _, d in rule} == {(heads, heads, world)}
    assert {(d["heads"], d["kv_heads"], d["tp"]) for _, _, _, d in gqa} == {(heads, kv, world)}
    said = rule[0][2]
    assert f"{heads} query heads and {heads} kv heads (one each) over t = {world}, {per} of each a rank" in said
    assert f"t = 3 would leave {heads} / 3 heads a rank, so --tp 3 is refused" in said
    with pytest.raises(UsageError, match="not 3"):
        run_lesson(lesson, knobs={"tp": 3})
    said = gqa[0][2]
    if world == 1:
        assert "no kv head needs a copy on more than one rank" in said
        return
    assert f"{heads} query heads, {kv} kv heads on t = {world}" in said and "each kv head sits on 2 ranks" in said
    if world == 16:
        assert said.endswith("(the post's own case)")
    else:
        assert "the post's case, --tp 16: 16 query heads, 8 kv heads, 2 ranks each" in said


@pytest.mark.parametrize("tp, how", [
    (4, "each GPU keeps one of the 4 query heads, and 2 query heads read each K/V head, so the 2 query heads of "
        "one K/V head are on 2 GPUs, one each; each of those GPUs keeps its own copy"),
    (2, "each GPU keeps 2 of the 4 query heads, and 4 query heads read each K/V head, so the 4 query heads of one "
        "K/V head, at 2 a GPU, fill 2 GPUs; each of those GPUs keeps its own copy"),
    (1, "each GPU keeps 4 of the 4 query heads, and 4 query heads read each K/V head, so one GPU holds all the "
        "query heads of a K/V head, and that K/V head once"),
])
def test_the_quiz_says_how_the_copies_come_about_in_words(tp, how):
    (q,) = run_lesson(get_lesson("tp-attention"), knobs={"tp": tp}).questions()
    assert q.worked.startswith(how) and " / " not in q.worked

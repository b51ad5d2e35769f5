"""The ring-attention lesson's walk (issue: a reader's pass): the post's small causal example, 4 tokens on 2 GPUs,
as a grid of who computes each score at which ring step (masked and skipped cells named), worked out here
by hand from the contiguous split and the ring's order; and the backward listing kept short without losing
the K and V passes' labels."""

import pytest

from parasim.lesson import get_lesson, run_lesson
from parasim.render.walkthrough import walkthrough

N, CP = 4, 2  # the post's example: t1, t2 on GPU 1; t3, t4 on GPU 2


def by_hand(q: int, k: int) -> str:
    """The cell of query q, key k (0-based): at step j GPU g holds GPU (g - j)'s chunk, so it meets key k's
    chunk at step (g - owner(k)) mod CP; a later key in its own chunk is masked, in a later chunk skipped."""
    owner = lambda p: p // (N // CP)  # noqa: E731
    g, step = owner(q), (owner(q) - owner(k)) % CP
    if k <= q:
        return f"GPU {g + 1}, step {step}"
    return f"{'masked' if owner(k) == g else 'skipped'}, step {step}"


@pytest.mark.parametrize("world", [2, 4])
def test_the_posts_causal_grid_from_its_run(world):
    lr = run_lesson(get_lesson("ring-attention"), world)
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    table = next(t for t in lr.tables if t.title.startswith("The post's causal example"))
    assert table.columns == ["query"] + [f"key t{k + 1}" for k in range(N)]
    assert [label for label, _ in table.rows] == ["t1 (GPU 1)", "t2 (GPU 1)", "t3 (GPU 2)", "t4 (GPU 2)"]
    for q, (_, cells) in enumerate(table.rows):
        assert cells == [by_hand(q, k) for k in range(N)], q
        assert sum(c.startswith("GPU") for c in cells) == q + 1  # the post's grid: query t_i has i marks
    note = " ".join(table.notes)
    assert "Blocks skipped: 1 by GPU 1, 0 by GPU 2" in note
    assert "GPU 1 0.5, GPU 2 1.5" in note  # half a block, then a block and a half: the post's units


def test_the_backward_listing_is_short_and_keeps_the_k_and_v_labels():
    lr = run_lesson(get_lesson("ring-attention"))
    t = lr.result.world
    text = walkthrough(lr, width=100)
    back = text[text.index("== backward") : text.index("== tables")]
    assert len(back.splitlines()) <= 32  # with every step listed it took 94 lines
    for name in ("K", "V", "dK", "dV"):
        assert f"'ring backward: pass {name} of CP rank" in back
    assert "more events in this phase" in back
    # forward (t computes and t - 1 hand-offs) ends at step 2t - 1; backward passes on t - 1 times, then home
    said = f"steps {2 * t}-{3 * t - 2}: K, V, dK, dV passed on; step {3 * t - 1}: dK, dV sent home"
    rotation = next(tb for tb in lr.tables if tb.title.startswith("Whose keys and values"))
    assert said in " ".join(rotation.notes)
    fwd = text[text.index("== forward") : text.index("== backward")]
    assert "'ring: pass K of CP rank" in fwd and "'ring: pass V of CP rank" in fwd
    assert fwd.count("compute on rank") == 2  # one ring step: attend, pass K and V on, attend to the next

"""The sp lesson's picture (render/plot_sp.py): one layer's flow under SP, every shape and byte count read from
the run. The flow's collectives are held against the sizes worked out here by hand from the small layer
(s = 16 tokens, b = 1, h = 16, 8-byte values) and the TP size; the drawing against its own flow."""

import pytest

from parasim.lesson import get_lesson, run_lesson
from parasim.render.plot_sp import draw_sp, hop_text, plot_sp, sp_flow

S, B, H = 16, 1, 16  # the sp lesson's small layer
ITEM = 8  # float64 on the virtual ranks


def shape(*n):
    return "[" + ", ".join(map(str, n)) + "]"


@pytest.mark.parametrize("t", [2, 4, 8])
def test_the_flow_is_the_runs_collectives(t):
    flow = sp_flow(run_lesson(get_lesson("sp"), t))
    assert flow.t == t and flow.whole == (S, B, H)
    mine, whole = (S // t, B, H), (S, B, H)
    ring = (t - 1) * S * B * H * ITEM // t  # bytes a rank sends in a ring all-gather or reduce-scatter
    # forward: gather before each block's column-parallel product, scatter after its row-parallel one
    assert [(h.op, h.block, h.src, h.dst, h.sent) for h in flow.forward] == [
        ("all_gather", "attn", mine, whole, ring),
        ("reduce_scatter", "attn", whole, mine, ring),
        ("all_gather", "mlp", mine, whole, ring),
        ("reduce_scatter", "mlp", whole, mine, ring),
    ]
    # backward, the MLP first: its gradient gathered, its kept input gathered again, the input's gradient scattered
    assert [(h.op, h.block, h.again) for h in flow.backward] == [
        ("all_gather", "mlp", False),
        ("all_gather", "mlp", True),
        ("reduce_scatter", "mlp", False),
        ("all_gather", "attn", False),
        ("all_gather", "attn", True),
        ("reduce_scatter", "attn", False),
    ]
    assert all(h.sent == ring for h in flow.backward)
    # rank 0's weight slices: Q, K and V's columns, the output's rows, the MLP's 4h columns and rows, over t
    assert flow.shards == {"qkv": (H, 3 * H // t), "out": (H // t, H), "fc1": (H, 4 * H // t), "fc2": (4 * H // t, H)}
    # the norms' weight and bias and the two row-parallel biases: 6 all-reduces of h values
    assert flow.sums == 6 and flow.sum_bytes == 6 * 2 * (t - 1) * H * ITEM // t


def test_the_picture_says_the_runs_shapes_and_bytes(tmp_path):
    from matplotlib.image import imread
    from matplotlib.text import Text

    t = 4
    lr = run_lesson(get_lesson("sp"), t)
    flow = sp_flow(lr)
    fig = draw_sp(flow, "title")
    said = [x.get_text() for x in fig.findobj(Text)]
    ring = (t - 1) * S * B * H * ITEM // t
    gather = f"all-gather (g): {shape(S // t, B, H)} -> {shape(S, B, H)}, {ring:,} B sent"
    scatter = f"reduce-scatter (g\u0304): {shape(S, B, H)} -> {shape(S // t, B, H)}, {ring:,} B sent"
    assert said.count(gather) == 2 and said.count(scatter) == 2  # one pair a block, forward
    assert said.count(f"reduce-scatter (g's backward): {shape(S, B, H)} -> {shape(S // t, B, H)}, {ring:,} B sent") == 2
    assert said.count(hop_text(flow.backward[0], "backward")) == 2  # the gradient gathered, a block each
    assert any(f"W_qkv slice {shape(H, 3 * H // t)}" in x and f"W_o slice {shape(H // t, H)}" in x for x in said)
    assert any(f"W1 slice {shape(H, 4 * H // t)}" in x and f"W2 slice {shape(4 * H // t, H)}" in x for x in said)
    assert any(f"{S // t} of the {S} tokens a rank" in x for x in said)  # the key
    assert any("6 all-reduces of 16 values" in x for x in said)
    png = tmp_path / "sp.png"
    plot_sp(lr, str(png))
    image = imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 500


def test_the_lesson_draws_it_and_a_run_on_one_rank_is_refused(tmp_path):
    from parasim.errors import UsageError

    lesson = get_lesson("sp")
    assert lesson.picture is not None and lesson.picture.draw is plot_sp and not lesson.no_picture
    with pytest.raises(UsageError, match="--tp 2, 4 or 8"):
        plot_sp(run_lesson(lesson, 1), str(tmp_path / "one.png"))
    assert not (tmp_path / "one.png").exists()

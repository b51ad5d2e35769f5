"""The sp lesson's picture (render/plot_sp.py): one layer's flow under SP, every shape and byte count read from
the run. The flow's collectives are held against the sizes worked out here by hand from the small layer
(s = 16 tokens, b = 1, h = 16, 8-byte values) and the TP size; the drawing against its own flow."""

import pytest

from parasim.lesson import get_lesson, run_lesson
from parasim.render.plot_sp import draw_sp, plot_sp, sp_flow

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
    mine, whole = shape(S // t, B, H), shape(S, B, H)
    gathered, scattered = f"{mine} -> {whole}, {ring:,} B sent", f"{whole} -> {mine}, {ring:,} B sent"
    # each arrow names what TP alone runs in its place, in the post's f and g (one pair a block each way)
    assert said.count(f"all-gather, in f's place (TP alone: the identity)\n{gathered}") == 2
    assert said.count(f"reduce-scatter, in g's place (TP alone: the all-reduce 'g forward')\n{scattered}") == 2
    assert said.count(f"all-gather, in g's place (TP alone: the identity)\n{gathered}") == 2
    assert said.count(f"reduce-scatter, in f's place (TP alone: the all-reduce 'f backward')\n{scattered}") == 2
    assert not any("\u0304" in x or "(g)" in x for x in said)  # no longer the paper's g and g-bar
    # the names quoted are TP alone's own all-reduces in the same run
    alone = {e.label for e in lr.result.trace.events if e.phase == "TP alone" and e.op == "all_reduce"}
    assert alone == {"g forward", "f backward"}
    # the kept input slices: saved beside forward's norm boxes, gathered again beside backward's blocks
    for norm in ("LayerNorm 1's", "LayerNorm 2's"):
        assert said.count(f"kept for backward:\n{norm} output,\nmy tokens {mine} only") == 1
        assert said.count(f"kept from forward:\n{norm} output, my tokens\n{mine} -> all-gathered again\n"
                          f"to {whole}, {ring:,} B sent") == 1
    assert any(f"W_qkv slice {shape(H, 3 * H // t)}" in x and f"W_o slice {shape(H // t, H)}" in x for x in said)
    assert any(f"W1 slice {shape(H, 4 * H // t)}" in x and f"W2 slice {shape(4 * H // t, H)}" in x for x in said)
    assert any(f"{S // t} of the {S} tokens a rank" in x for x in said)  # the key
    assert any("6 all-reduces of 16 values" in x for x in said)
    # each dashed second gather starts at its kept box's left edge, level with the box, and ends at the block
    from matplotlib.patches import FancyBboxPatch
    from matplotlib.text import Annotation

    for block in ("attn", "mlp"):
        box = next(p for p in fig.findobj(FancyBboxPatch) if p.get_gid() == f"backward kept {block}")
        label = next(h.label for h in flow.backward if h.again and h.block == block)
        arrow = next(a for a in fig.findobj(Annotation) if a.get_gid() == f"backward kept {label}")
        (x0, y0), (x1, y1) = arrow.xyann, arrow.xy
        assert abs(x0 - box.get_x()) < 0.1 and box.get_y() < y0 < box.get_y() + box.get_height()
        assert x1 < x0 and y1 == y0
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


@pytest.mark.parametrize("t", [2, 8])
def test_no_words_are_drawn_over_others_and_each_stays_in_its_box(t):
    """The longer arrow labels (what TP alone runs in the collective's place) and the kept-slice boxes beside
    the blocks leave every piece of text clear of the others, and each box's words inside the box."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import FancyBboxPatch

    fig = draw_sp(sp_flow(run_lesson(get_lesson("sp"), t)), "title")
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [x for ax in fig.axes for x in ax.texts if x.get_text().strip()] + [x for x in fig.texts if x.get_text()]
    texts += [ax.title for ax in fig.axes] + list(fig.legends[0].get_texts())
    boxes = [x.get_window_extent(renderer) for x in texts]
    for i, a in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            b = boxes[j]
            w, h = min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)
            assert not (w > 1 and h > 1), (texts[i].get_text(), texts[j].get_text())
    patches = [p.get_window_extent(renderer) for p in fig.findobj(FancyBboxPatch) if p.get_gid()]
    assert len(patches) == 5 + 5 + 2 + 2  # forward's and backward's boxes, and the kept slices beside them
    for x, b in zip(texts, boxes):
        (p,) = [p for p in patches if p.x0 <= (b.x0 + b.x1) / 2 <= p.x1 and p.y0 <= (b.y0 + b.y1) / 2 <= p.y1] or [b]
        assert p.x0 <= b.x0 and b.x1 <= p.x1 and p.y0 <= b.y0 and b.y1 <= p.y1, x.get_text()

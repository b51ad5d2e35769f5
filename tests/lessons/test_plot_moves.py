"""What moves, drawn (issue 33, build item 6): the MoE dispatch and combine of the followed token and the
pipeline hand-off, every arrow read from the run; expected values worked out here from the post's example."""
import json

import pytest
from conftest import cli

from parasim.lesson import get_lesson, run_lesson
from parasim.render.plot_moves import handoffs, token_routes


def test_the_post_s_routing_sends_contract_from_g2_to_g1_and_g3_and_back():
    """The post's routing: 'contract' (on g2) picks E3 and E8 at every layer; 8 experts over the EP group g0-g3,
    two each in order, put E3 on g1 and E8 on g3 (on g9 and g11 for stage 2, whose token sits on g10)."""
    routes = token_routes(run_lesson(get_lesson("moe16"), knobs={"routing": "post"}).result.trace)
    assert [r["layer"] for r in routes] == [1, 2, 3, 4]
    assert [(r["gpu"], r["group"]) for r in routes] == [(2, [0, 1, 2, 3])] * 2 + [(10, [8, 9, 10, 11])] * 2
    assert [[(e, g) for e, g, _ in r["picks"]] for r in routes] == [[(3, 1), (8, 3)]] * 2 + [[(3, 9), (8, 11)]] * 2
    assert all(gate is not None and 0 < gate < 1 for r in routes for _, _, gate in r["picks"])


@pytest.mark.parametrize("pp, m", [(4, 4), (2, 3)])
def test_1f1b_hands_off_2_m_p_minus_1_times(pp, m):
    """m activations go down each of the p - 1 boundaries and m gradients come back up."""
    trace = run_lesson(get_lesson("pp-1f1b"), knobs={"pp": pp, "m": m}).result.trace
    sends = handoffs(trace)
    assert len(sends) == 2 * m * (pp - 1)
    assert sorted((src, dst) for _, src, dst, kind in sends if kind == "activation") == \
        sorted((s, s + 1) for s in range(pp - 1) for _ in range(m))
    assert all(dst == src - 1 for _, src, dst, kind in sends if kind == "gradient")


@pytest.mark.parametrize("name", ["moe16", "pp-1f1b"])
def test_the_lessons_draw_their_pictures(tmp_path, name):
    from matplotlib.image import imread
    png = tmp_path / f"{name}.png"
    out = cli("lesson", name, "--plot", str(png), "--json")
    assert out.returncode == 0, out.stderr
    assert imread(png).shape[1] > 500


def test_a_lesson_without_a_picture_names_those_with_one():
    out = cli("lesson", "tp-mlp", "--plot", "x.png")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "moe16" in out.stderr and "pp-1f1b" in out.stderr and "ring-attention" in out.stderr


def test_the_list_names_every_lesson_with_a_picture_and_what_it_shows():
    """The lessons that draw a picture, written out here: the list says so for each of them and no other."""
    drawn = {"ring-attention", "moe16", "pp-gpipe", "pp-1f1b", "pp-interleaved", "pp-zero-bubble", "cp-causal",
             "hot-expert", "rules-of-thumb", "zero", "tp-attention", "sp"}
    rows = json.loads(cli("lesson", "--list", "--json").stdout)
    assert {r["name"] for r in rows if r["picture"]} == drawn
    assert {r["picture"] for r in rows if r["name"] in ("pp-gpipe", "pp-1f1b", "pp-interleaved")} == {
        "the hand-off between stages, slot by slot"}  # three lessons, one picture
    assert cli("lesson", "--list").stdout.count("--plot:") == len(drawn)  # the plain list says it too
    assert "--list" in " ".join(cli("lesson", "--help").stdout.split())


def test_every_lesson_draws_a_picture_or_says_in_one_line_why_not(tmp_path):
    """Issue 53: `--plot` on every lesson. One that draws writes a PNG of its run (checked as an image of some
    size); one that does not is refused before it runs, in one line that says why and names those that draw."""
    from matplotlib.image import imread

    rows = json.loads(cli("lesson", "--list", "--json").stdout)
    for row in rows:
        png = tmp_path / f"{row['name']}.png"
        out = cli("lesson", row["name"], "--plot", str(png), "--json")
        if row["picture"]:
            assert out.returncode == 0 and row["no_picture"] is None, (row["name"], out.stderr)
            assert imread(png).shape[0] > 300 and imread(png).shape[1] > 500, row["name"]
        else:
            assert row["no_picture"] and len(row["no_picture"]) > 30, row["name"]
            assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stdout == "", row["name"]
            assert row["no_picture"] in out.stderr and "moe16" in out.stderr and not png.exists()


def test_the_zero_picture_stacks_what_a_rank_holds_by_kind(tmp_path):
    """The ZeRO picture's bars are the trace's holds: drawn for the four stages, with the sends' ratios."""
    from parasim.render import plot_lessons

    lr = run_lesson(get_lesson("zero"))
    drawn: list = []
    real = plot_lessons.save
    plot_lessons.save = lambda fig, path: drawn.append(fig)
    try:
        plot_lessons.plot_zero_stages(lr, str(tmp_path / "z.png"))
    finally:
        plot_lessons.save = real
    (fig,) = drawn
    held, sent = fig.axes
    heights = [round(sum(p.get_height() for p in held.patches if round(p.get_x() + p.get_width() / 2) == x), 3)
               for x in range(4)]
    # DP holds 16 bytes a parameter and ZeRO-3 2, plus activations: the peak of DP's bars is the tallest
    assert heights[0] == max(heights) and heights[3] < heights[0] / 2
    labels = [t.get_text() for t in sent.texts]
    assert labels == ["1x DP", "1x DP", "1x DP", "1.5x DP"]  # ZeRO-3: 3(n-1)/n against DP's 2(n-1)/n


def test_the_head_split_picture_fills_the_heads_each_rank_holds():
    """tp-attention's picture at TP 4: every head its own K and V puts Q, K and V head r on rank r; grouped-query
    with 2 K/V heads puts K/V head r // 2 on rank r, each held by two ranks (worked out here, not read)."""
    from parasim.render import plot_lessons

    lr = run_lesson(get_lesson("tp-attention"))
    drawn: list = []
    real = plot_lessons.save
    plot_lessons.save = lambda fig, path: drawn.append(fig)
    try:
        plot_lessons.plot_head_split(lr, "unused.png")
    finally:
        plot_lessons.save = real
    (fig,) = drawn
    mha, gqa = fig.axes[:2]

    def cells(ax):  # (column label, rank) of each filled cell
        ticks = {round(t, 2): label.get_text().split()[0] for t, label in zip(ax.get_xticks(), ax.get_xticklabels())}
        return sorted((ticks[round(p.get_x() + 0.45, 2)], round(p.get_y())) for p in ax.patches)

    assert cells(mha) == sorted((f"{part}{r + 1}", r) for part in "QKV" for r in range(4))
    assert cells(gqa) == sorted([(f"Q{r + 1}", r) for r in range(4)] + [(f"{p}{r // 2 + 1}", r) for p in "KV" for r in range(4)])
    assert [t.get_text() for t in gqa.get_xticklabels()][-1] == "V2\nx2"


def test_the_rules_picture_draws_each_rule_broken_in_red_and_kept_in_green():
    """rules-of-thumb's picture: in the time panel, each rule's red bar is the broken run's ms and its green bar
    the kept run's, as the lesson's table gives them (TP 16 over two nodes the slower of its pair)."""
    from parasim.render import plot_lessons

    lr = run_lesson(get_lesson("rules-of-thumb"))
    drawn: list = []
    real = plot_lessons.save
    plot_lessons.save = lambda fig, path: drawn.append(fig)
    try:
        lr.lesson.picture.draw(lr, "unused.png")
    finally:
        plot_lessons.save = real
    (fig,) = drawn
    time = fig.axes[2]
    table = {name: cells for name, cells in lr.tables[0].rows}
    red = [round(p.get_width(), 1) for p in time.patches if p.get_facecolor()[0] > 0.7]
    green = [round(p.get_width(), 1) for p in time.patches if p.get_facecolor()[0] < 0.3]
    assert red == [cells[-1] for name, cells in table.items() if name.startswith("broken")]
    assert green == [cells[-1] for name, cells in table.items() if name.startswith("kept")]

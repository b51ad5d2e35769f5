"""The `--plot` pictures teach: read through matplotlib's own objects (the figure each command writes), not
by looking. The memory bars have a legend off the bars, a line at the usable memory and, where ZeRO has
nothing to split, a note saying so; the layout search shows every family; the layout map has its EP boxes,
gradient links and legend; the token's path is drawn GPU by GPU; the ring's rotation is drawn step by step.
Each figure is also checked for text drawn over text."""
from __future__ import annotations

import json
import re

import pytest

matplotlib = pytest.importorskip("matplotlib")

# The estimator's usable memory of an H200, as its documentation states it (`parasim memory --help`:
# "120 GB of an H200", and estimate/traffic.py's GPU table): 120 GB of the card's 141 GB, GB = 1e9 bytes.
H200_USABLE_GB = 120.0
EP_GROUPS_MOE16 = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]  # the post's EP groups


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the command saves, kept (and still written) so that the test can read its artists."""
    from matplotlib.figure import Figure
    figures = []
    original = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _cli(capsys, *argv: str) -> tuple[int, str]:
    from parasim.cli import main
    code = main(list(argv))
    return code, capsys.readouterr().out


def _boxes(fig, artists):
    """Where the artists land, in pixels of the picture as written (120 dots per inch); pyplot.close left
    the figure without a canvas, so it gets a fresh one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.set_dpi(120)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def _texts_do_not_overlap(fig) -> None:
    """No two pieces of text (titles, labels, notes, numbers) are drawn over each other."""
    texts = [t for ax in fig.axes for t in ax.texts if t.get_visible() and t.get_text().strip()]
    texts += [t for t in fig.texts if t.get_text().strip()]
    texts += [ax.title for ax in fig.axes if ax.get_visible() and ax.get_title()]
    texts += [t for ax in fig.axes for t in (ax.get_legend().get_texts() if ax.get_legend() else [])]
    boxes = _boxes(fig, texts)
    for i, a in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            b = boxes[j]
            overlap_w = min(a.x1, b.x1) - max(a.x0, b.x0)
            overlap_h = min(a.y1, b.y1) - max(a.y0, b.y0)
            assert not (overlap_w > 1 and overlap_h > 1), (texts[i].get_text(), texts[j].get_text())


# -- parasim memory --plot --------------------------------------------------------------------------------------------------
def _memory_figure(capsys, drawn, tmp_path, *flags: str):
    code, _ = _cli(capsys, "memory", "--model", "27b", *flags, "--plot", str(tmp_path / "m.png"))
    assert code == 0
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = drawn
    return fig, fig.axes[0]


def _legend_off_the_bars(fig, ax):
    legend = ax.get_legend()
    assert legend is not None
    bars = [p for c in ax.containers for p in c.patches]
    assert len(bars) >= 4 * 3  # four ZeRO stages, weights + gradients + optimizer at least
    (lbox,), bar_boxes = _boxes(fig, [legend]), _boxes(fig, bars)
    assert not any(lbox.overlaps(b) for b in bar_boxes)
    return legend


def test_memory_legend_sits_off_the_bars_and_a_line_marks_the_usable_memory(capsys, drawn, tmp_path):
    fig, ax = _memory_figure(capsys, drawn, tmp_path, "--tp", "8", "--sp", "--dp", "4", "--gpus", "32")
    legend = _legend_off_the_bars(fig, ax)
    flat = [ln for ln in ax.lines if len(set(ln.get_ydata())) == 1]
    assert [float(ln.get_ydata()[0]) for ln in flat] == [H200_USABLE_GB]
    assert any(str(int(H200_USABLE_GB)) in t.get_text() and "usable" in t.get_text() for t in legend.get_texts())
    assert not any("shards nothing" in t.get_text() for t in fig.texts)  # DP 4: ZeRO does split the states
    _texts_do_not_overlap(fig)


def test_memory_line_follows_the_learners_usable_figure(capsys, drawn, tmp_path):
    _, ax = _memory_figure(capsys, drawn, tmp_path, "--tp", "8", "--gpus", "8", "--usable", "75")
    assert [float(ln.get_ydata()[0]) for ln in ax.lines if len(set(ln.get_ydata())) == 1] == [75.0]


def test_memory_at_dp_1_says_zero_shards_nothing(capsys, drawn, tmp_path):
    fig, ax = _memory_figure(capsys, drawn, tmp_path, "--tp", "1", "--dp", "1", "--gpus", "1")
    _legend_off_the_bars(fig, ax)  # tall bars: a legend inside the axes lands on them
    totals = {}
    for c in ax.containers:
        for p in c.patches:
            x = round(p.get_x(), 6)
            totals[x] = totals.get(x, 0.0) + p.get_height()
    assert len(set(round(v, 6) for v in totals.values())) == 1  # four equal bars: nothing to shard over
    notes = " ".join(t.get_text() for t in [*fig.texts, *ax.texts])
    assert "DP 1" in notes and "shards nothing" in notes
    _texts_do_not_overlap(fig)


# -- parasim fit --search --plot ----------------------------------------------------------------------------------------
def test_fit_search_shows_every_family_none_hidden_under_another(capsys, drawn, tmp_path):
    code, out = _cli(capsys, "fit", "--model", "27b", "--search", "--nodes", "1-16", "--json",
                     "--plot", str(tmp_path / "f.png"))
    assert code == 0
    families = json.loads(out)["families"]
    # the ten families that reach furthest, picked here from the JSON
    ten = sorted(families, key=lambda f: -max(families[f].values()))[:10]
    (fig,) = drawn
    lines = [(ax, ln) for ax in fig.axes for ln in ax.lines]
    for fam in ten:
        mine = [(ax, ln) for ax, ln in lines if ln.get_label() == fam]
        assert len(mine) == 1, fam
        ax, line = mine[0]
        want = sorted((int(n), max(v, 1)) for n, v in families[fam].items())
        assert list(zip(line.get_xdata(), line.get_ydata())) == want
        # nothing with the same points is drawn over it in its panel
        same = [ln for a, ln in lines if a is ax and ln is not line
                and list(zip(ln.get_xdata(), ln.get_ydata())) == want]
        assert all(ln.get_zorder() < line.get_zorder() for ln in same), fam
        assert all(ln.get_label() not in ten for ln in same), fam
    _texts_do_not_overlap(fig)


# -- parasim layout --plot -----------------------------------------------------------------------------------------------
def _squares(ax) -> dict[int, tuple[float, float, float, float]]:
    """Each GPU's square (x0, y0, x1, y1), found as the smallest rectangle around its label 'g<N>'."""
    from matplotlib.patches import Rectangle
    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    out = {}
    for t in ax.texts:
        m = re.match(r"g(\d+)(\n|$)", t.get_text())
        if not m:
            continue
        x, y = t.get_position()
        around = [r for r in rects if r.get_x() <= x <= r.get_x() + r.get_width()
                  and r.get_y() <= y <= r.get_y() + r.get_height()]
        r = min(around, key=lambda r: r.get_width() * r.get_height())
        out[int(m.group(1))] = (r.get_x(), r.get_y(), r.get_x() + r.get_width(), r.get_y() + r.get_height())
    return out


def _gpu_at(squares, point, slack: float = 0.03) -> int | None:
    x, y = point
    hits = [g for g, (x0, y0, x1, y1) in squares.items()
            if x0 - slack <= x <= x1 + slack and y0 - slack <= y <= y1 + slack]
    return hits[0] if len(hits) == 1 else None


def _links(ax):
    """Lines drawn as annotations without words: (from, to) points and the artist."""
    return [a for a in ax.texts if not a.get_text() and getattr(a, "arrow_patch", None) is not None]


def test_layout_map_has_ep_boxes_gradient_links_and_a_legend(capsys, drawn, tmp_path):
    code, out = _cli(capsys, "layout", "--layout", "moe16", "--json", "--plot", str(tmp_path / "l.png"))
    assert code == 0
    groups = json.loads(out)["groups"]
    assert groups["ep"] == EP_GROUPS_MOE16
    (fig,) = drawn
    ax = fig.axes[0]
    squares = _squares(ax)
    assert sorted(squares) == list(range(16))
    # an EP box per EP group: a dashed rectangle around its GPUs' squares and no other GPU's
    from matplotlib.patches import Rectangle
    dashed = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill() and p.get_linestyle() != "solid"]
    for group in EP_GROUPS_MOE16:
        def inside(r, g):
            x0, y0, x1, y1 = squares[g]
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            return r.get_x() <= cx <= r.get_x() + r.get_width() and r.get_y() <= cy <= r.get_y() + r.get_height()
        assert any(all(inside(r, g) for g in group) and not any(inside(r, g) for g in squares if g not in group)
                   for r in dashed), group
    legend = ax.get_legend()
    assert legend is not None
    said = " ".join(t.get_text() for t in legend.get_texts())
    assert "EP group" in said and "gradient" in said
    # a link per gradient group: its links join every member (dense weights over DP x CP, experts over EDP)
    ends = [(_gpu_at(squares, a.xyann), _gpu_at(squares, a.xy)) for a in _links(ax)]
    for kind in ("dp-cp", "expert-dp"):
        for group in groups[kind]:
            joined = {group[0]}
            for _ in group:
                joined |= {b for a, b in ends if a in joined and b in group} | {a for a, b in ends
                                                                                 if b in joined and a in group}
            assert joined == set(group), (kind, group)
    _texts_do_not_overlap(fig)


# -- parasim trace --plot -----------------------------------------------------------------------------------------------
def _expected_moves(path: dict) -> list[tuple[int, int]]:
    """The token's moves in the forward pass, read from `parasim trace --json`'s words: the holder's route note
    names the GPU of each expert ('E3 (gate 0.60) on g1', or 'on this GPU'); each GPU away gets the token
    (dispatch) and sends its output back (combine); the pipeline step 'gA -> gB' hands it on."""
    moves = []
    for step in path["steps"]:
        if step.get("direction") != "forward":
            continue
        if "event" not in step and "router picks" in step["text"] or "routing (scripted) picks" in step["text"]:
            me = step["ranks"][0]
            away = list(dict.fromkeys(int(g) for g in re.findall(r"\) on g(\d+)", step["text"])))
            moves += [(me, g) for g in away if g != me] + [(g, me) for g in away if g != me]
        elif step.get("group") == "pp" and step.get("op") == "p2p":
            a, b = re.match(r"g(\d+) -> g(\d+)", step["text"]).groups()
            moves.append((int(a), int(b)))
    return moves


def _on_arrow(arrow, point, within: float = 0.06) -> bool:
    """Whether `point` lies on the arrow's curve: arc3 draws the quadratic curve from .xyann to .xy whose
    control point is the chord's middle moved by rad * (dy, -dx) (equal axes: data units are drawn alike)."""
    (x0, y0), (x1, y1) = arrow.xyann, arrow.xy
    rad = float(re.search(r"rad=(-?[\d.]+)", arrow.arrowprops["connectionstyle"]).group(1))
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    for i in range(201):
        t = i / 200
        x = (1 - t) ** 2 * x0 + 2 * t * (1 - t) * cx + t * t * x1
        y = (1 - t) ** 2 * y0 + 2 * t * (1 - t) * cy + t * t * y1
        if (x - point[0]) ** 2 + (y - point[1]) ** 2 <= within ** 2:
            return True
    return False


@pytest.mark.parametrize("flags", [("--routing", "post"), ("--routing", "learned"),
                                   ("--tp", "2", "--cp", "1", "--pp", "1", "--ep", "4", "--sp", "--world", "8")],
                         ids=["moe16-post", "moe16-learned", "one-stage-four-layers"])
def test_trace_draws_the_tokens_whole_path_in_order(capsys, drawn, tmp_path, flags):
    code, out = _cli(capsys, "trace", *flags, "--json", "--plot", str(tmp_path / "t.png"))
    assert code == 0
    path = json.loads(out)
    moves = _expected_moves(path)
    if flags == ("--routing", "post"):  # the post's own path for 'contract': g2 -> g1 (E3), g3 (E8) and back, then g10
        assert moves[:4] == [(2, 1), (2, 3), (1, 2), (3, 2)] and (2, 10) in moves
    (fig,) = drawn
    ax = fig.axes[0]
    squares = _squares(ax)
    arrows = [a for a in _links(ax) if "-|>" in str(a.arrowprops.get("arrowstyle", ""))]
    ends = [(_gpu_at(squares, a.xyann), _gpu_at(squares, a.xy)) for a in arrows]
    assert sorted(ends) == sorted(set(moves))  # an arrow for every move the token makes, and no other
    paths = [(a.xyann, a.xy, a.arrowprops["connectionstyle"]) for a in arrows]
    assert len(set(paths)) == len(paths)  # none drawn over another
    # each move's number sits on the arrow of that move, so the numbers read the path in order
    numbered = {}
    for t in ax.texts:
        if re.fullmatch(r"\d+(,\d+)*", t.get_text()):
            (on,) = [e for a, e in zip(arrows, ends) if _on_arrow(a, t.get_position())]
            numbered.update({int(n): on for n in t.get_text().split(",")})
    assert numbered == {k: m for k, m in enumerate(moves, 1)}
    assert ax.get_legend() is not None
    _texts_do_not_overlap(fig)


# -- parasim lesson ring-attention --plot -------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [4, 2])
def test_ring_picture_shows_which_chunk_each_rank_holds_at_each_step(capsys, drawn, tmp_path, world):
    code, _ = _cli(capsys, "lesson", "ring-attention", "--world", str(world), "--plain",
                   "--plot", str(tmp_path / "r.png"))
    assert code == 0
    (fig,) = drawn
    ax = fig.axes[0]
    per = 8 // world  # the lesson's 8 tokens, split contiguously: rank r owns t(per*r+1) .. t(per*(r+1))

    def tokens(r: int) -> str:
        return f"t{per * r + 1}\u2013t{per * (r + 1)}" if per > 1 else f"t{r + 1}"

    cells = [t for t in ax.texts if t.get_text().startswith("K/V of ")]
    assert len(cells) == world * world
    xs = sorted({round(t.get_position()[0], 6) for t in cells})
    ys = sorted({round(t.get_position()[1], 6) for t in cells}, reverse=True)  # rank 0 on top
    for t in cells:
        step = xs.index(round(t.get_position()[0], 6))
        rank = ys.index(round(t.get_position()[1], 6))
        owner = (rank - step) % world  # the ring: at step j, rank i holds rank i - j's keys and values
        assert t.get_text().startswith(f"K/V of {tokens(owner)}\n"), (rank, step, t.get_text())
    arrows = [a for a in ax.texts if not a.get_text() and getattr(a, "arrow_patch", None) is not None]
    assert len(arrows) == world * (world - 1)  # every rank hands its chunk on after each step but the last
    legend = ax.get_legend()
    assert legend is not None and any(" B " in t.get_text() or " B per" in t.get_text() for t in legend.get_texts())
    _texts_do_not_overlap(fig)


def test_lesson_plot_for_a_lesson_without_a_picture_is_one_line(capsys, tmp_path):
    from parasim.cli import main
    code = main(["lesson", "tp-mlp", "--plain", "--plot", str(tmp_path / "z.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "ring-attention" in err
    assert not (tmp_path / "z.png").exists()


def test_schedule_picture_has_a_time_axis_and_a_key_for_every_kind_it_draws(capsys, drawn, tmp_path):
    """Issue 53: `schedule --plot` names its x axis and keys each kind of action it draws (ZB-H1: F, I and W;
    no B), and a second chunk's lighter boxes where the schedule has one."""
    code, _ = _cli(capsys, "schedule", "--schedule", "zb-h1", "--pp", "4", "--microbatches", "8",
                   "--plot", str(tmp_path / "zb.png"))
    assert code == 0
    (ax,) = drawn[-1].axes
    assert ax.get_xlabel().startswith("time, in slots")
    keys = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [k.split(":")[0] for k in keys] == ["F", "I", "W"]
    code, _ = _cli(capsys, "schedule", "--schedule", "interleaved", "--pp", "4", "--microbatches", "8",
                   "--chunks", "2", "--plot", str(tmp_path / "il.png"))
    keys = [t.get_text() for t in drawn[-1].axes[0].get_legend().get_texts()]
    assert keys[-1] == "lower case: the second chunk" and [k.split(":")[0] for k in keys[:-1]] == ["F", "B"]


def test_pp_zero_bubble_draws_its_three_schedules_on_one_clock(capsys, drawn, tmp_path):
    """Three panels, titled with the makespans the lesson's table gives (66, 54, 51 at p = 4, m = 8), each
    with a box per action: 8 micro-batches x 4 GPUs x (F, B) for 1F1B, (F, I, W) for ZB-H1."""
    code, _ = _cli(capsys, "lesson", "pp-zero-bubble", "--plain", "--plot", str(tmp_path / "zb.png"))
    assert code == 0
    fig = drawn[-1]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in axes] == ["1F1B", "ZB-H1", "DualPipeV"]
    assert [int(ax.get_title().split("makespan ")[1].split()[0]) for ax in axes] == [66, 54, 51]
    assert [len(ax.patches) for ax in axes[:2]] == [8 * 4 * 2, 8 * 4 * 3]


def test_cp_causal_colours_each_block_by_the_rank_that_computes_it(capsys, drawn, tmp_path):
    """Per split, each rank's colour covers its whole blocks and half its diagonal ones: their count is the
    run's work per rank (contiguous 2, 6, 10, 14; zigzag 8 each at CP 4)."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import Polygon, Rectangle
    code, _ = _cli(capsys, "lesson", "cp-causal", "--plain", "--plot", str(tmp_path / "cp.png"))
    assert code == 0
    fig = drawn[-1]
    colours = {to_hex(f"C{r}"): r for r in range(4)}
    for ax, want in zip(fig.axes, ([2, 6, 10, 14], [8, 8, 8, 8])):
        work = [0.0] * 4
        for p in ax.patches:
            work[colours[to_hex(p.get_facecolor())]] += 1.0 if isinstance(p, Rectangle) else 0.5
            assert isinstance(p, (Rectangle, Polygon))
        assert work == want


def test_hot_expert_draws_each_gpus_compute_the_busiest_marked(capsys, drawn, tmp_path):
    """Six panels (3 routings x EP 4, 8): the tallest bar is the table's busiest GPU, its height the table's
    "its compute (ms)", and the title's wait the table's "others wait (ms)"."""
    from matplotlib.colors import to_hex
    code, _ = _cli(capsys, "lesson", "hot-expert", "--plain", "--plot", str(tmp_path / "hot.png"))
    assert code == 0
    fig = drawn[-1]
    table = json.loads(_cli(capsys, "lesson", "hot-expert", "--json")[1])["tables"][0]
    rows = {r["routing, EP"]: r for r in table["rows"]}
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(rows) == 6
    for ax in panels:
        routing, rest = ax.get_title().split(", EP ")
        row = rows[f"{routing} routing, EP {rest.split(':')[0]}"]
        heights = [p.get_height() for p in ax.patches]
        red = [i for i, p in enumerate(ax.patches) if to_hex(p.get_facecolor()) == to_hex("tab:red")]
        assert red == [int(row["busiest GPU"][1:])] and round(max(heights), 2) == row["its compute (ms)"]
        assert f"others wait {row['others wait (ms)']:.2f} ms" in ax.get_title()
        # the layer's time on the clock: a solid line at the table's "layer (ms)", said over it
        flat = [ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == "-" and len(set(ln.get_ydata())) == 1]
        assert [round(y, 2) for y in flat] == [row["layer (ms)"]]
        assert [t.get_text() for t in ax.texts] == [f"layer {row['layer (ms)']:.2f} ms"]
    # balanced routing's layer stands above uniform's at EP 8, though nobody waits (the picture shows why it is slower)
    assert rows["balanced routing, EP 8"]["layer (ms)"] > rows["uniform routing, EP 8"]["layer (ms)"]
    assert "round-robin" in fig._suptitle.get_text()
    _texts_do_not_overlap(fig)


# -- an independent walk through every lesson's picture -------------------------------------------------------------
def _picks_said(out: str) -> dict[int, list[tuple[str, str, str]]]:
    """Per MoE layer, the followed token's experts as the lesson's own words say them (its --plain output):
    'layer 1: the router picks E6 (gate 0.79) on this GPU, E4 (gate 0.21) on g1;' -> [(6, 0.79, this GPU), ...]."""
    said = " ".join(out.split())
    return {int(layer): re.findall(r"E(\d+) \(gate ([\d.]+)\) on (this GPU|g\d+)", text)
            for layer, text in re.findall(r"layer (\d+): [^;]*?picks ([^;]*);", said)}


def _layers_of(title: str) -> dict[int, int]:
    """'layers 1-2 on g2 and 3-4 on g10: dispatch' -> {1: 2, 2: 2, 3: 10, 4: 10}."""
    out = {}
    for span, gpu in re.findall(r"([\d, -]+) on g(\d+)", title.split(":")[0].split(" ", 1)[1]):
        for part in span.split(","):
            a, _, b = part.strip().partition("-")
            out.update({n: int(gpu) for n in range(int(a), int(b or a) + 1)})
    return out


@pytest.mark.parametrize("routing", ["learned", "post"])
def test_moe16_boxes_the_ep_group_and_gates_every_expert_the_local_one_too(capsys, drawn, tmp_path, routing):
    """The dashed outline is the layer's EP group (named on it); every chosen expert shows its gate, the one on
    the token's own GPU too (learned: E6 at 0.79 on g2), and the combine is the token itself (the residual)
    plus the gate-weighted sum of all of them. The post's routing: E3 (0.6) on g1 and E8 (0.4) on g3 in every
    layer, one route, so one row of panels says it (the walk found four alike rows); learned routes differ."""
    code, out = _cli(capsys, "lesson", "moe16", "--routing", routing, "--plain", "--plot", str(tmp_path / "d.png"))
    assert code == 0
    picks = _picks_said(out)
    assert sorted(picks) == [1, 2, 3, 4]
    if routing == "post":
        assert picks[1] == [("3", "0.60", "g1"), ("8", "0.40", "g3")]
    else:  # the case the walk found: an expert on the token's own GPU, its gate left out
        assert ("6", "0.79", "this GPU") in picks[1]
    # a route, as the text says it, where the GPUs sit in EP groups of 4 (g0-g3, ...): its picks by place
    said = {n: tuple((e, g, "here" if w == "this GPU" else int(w[1:]) % 4) for e, g, w in p) for n, p in picks.items()}
    fig = drawn[-1]
    assert "dashed outline: the layer's EP group" in fig._suptitle.get_text()
    panels = [ax for ax in fig.axes if re.search(r": (dispatch|combine)$", ax.get_title(loc="left"))]
    assert len(panels) == 2 * len(set(said.values()))
    assert len(panels) == (2 if routing == "post" else 8)
    drawn_layers = [n for ax in panels if ax.get_title(loc="left").endswith("dispatch")
                    for n in _layers_of(ax.get_title(loc="left"))]
    assert sorted(drawn_layers) == [1, 2, 3, 4]  # every layer in one row, once
    for ax in panels:
        title = ax.get_title(loc="left")
        layers, way = _layers_of(title), title.rsplit(": ", 1)[1]
        assert len({said[n] for n in layers}) == 1  # a row is one route
        layer = min(layers)
        texts = [t.get_text() for t in ax.texts]
        gpus = {int(m.group(1)): t.get_position() for t in ax.texts if (m := re.fullmatch(r"g(\d+)", t.get_text()))}
        assert sorted(gpus) in EP_GROUPS_MOE16 and layers[layer] in gpus
        dashed = [p for p in ax.patches if not p.get_fill() and p.get_linestyle() not in ("solid", "-")]
        assert len(dashed) == 1
        (box,) = dashed
        assert all(box.get_x() < x < box.get_x() + box.get_width() and box.get_y() < y < box.get_y() + box.get_height()
                   for x, y in gpus.values())
        assert f"EP group ep[{min(gpus)}-{max(gpus)}]" in texts
        if way == "dispatch":
            for e, gate, _ in picks[layer]:
                assert any(f"E{e} (gate {gate})" in t for t in texts), (layer, e, texts)
        else:
            (total,) = [t for t in texts if t.startswith("layer output = ")]
            residual, *experts = total[len("layer output = "):].split(" + ")
            assert residual == "contract" and "+ contract (residual)" in texts
            assert sorted(experts) == sorted(f"{g} x E{e}(contract)" for e, g, _ in picks[layer])
    _texts_do_not_overlap(fig)


def test_moe16_picture_draws_the_layout_the_token_s_gpus_and_its_hand_off(capsys, drawn, tmp_path):
    """Above the routes: the post's 16-GPU layout (the command that draws it alone named on it), the GPUs the
    walk-through says hold 'contract' outlined, and the hand-off between them after the last layer of stage 1
    (4 layers over 2 stages: layer 2)."""
    code, out = _cli(capsys, "lesson", "moe16", "--plain", "--plot", str(tmp_path / "d.png"))
    assert code == 0
    holders = [int(r) for r in re.findall(r"rank (\d+): holds 'contract'", out)]
    assert holders == [2, 10]
    (layout,) = [ax for ax in drawn[-1].axes if ax.get_title(loc="left").startswith("the layout the run used")]
    assert "parasim layout --tp 2 --cp 2 --dp 2 --pp 2 --ep 4 --sequence-parallel" in " ".join(
        layout.get_title(loc="left").split())
    outlined = sorted(int(p.get_gid().split()[1]) for p in layout.patches
                      if (p.get_gid() or "").startswith("gpu ") and p.get_linewidth() > 2)
    assert outlined == holders
    assert "g2 -> g10: hand-off after layer 2" in [t.get_text() for t in layout.texts]


def _arrows(ax):
    return [a for a in ax.texts if not a.get_text() and getattr(a, "arrow_patch", None) is not None]


@pytest.mark.parametrize("lesson, flags", [("pp-interleaved", ()), ("pp-1f1b", ()),
                                           ("pp-interleaved", ("--pp", "2")), ("pp-interleaved", ("--chunks", "3"))],
                         ids=["interleaved", "1f1b", "interleaved-pp2", "interleaved-v3"])
def test_handoff_names_its_slot_and_no_arrow_crosses_a_row(capsys, drawn, tmp_path, lesson, flags):
    """A slot of the interleaved schedule is one chunk (a virtual stage), not a stage; a send that wraps round
    (GPU 4's chunk to GPU 1's next one, and its gradient back) is drawn as two short arrows off the table's
    edges, so no arrow crosses a row; no two arrows lie on each other; the key sits under the table, clear of
    its numbers and axis label."""
    code, out = _cli(capsys, "lesson", lesson, *flags, "--json", "--plot", str(tmp_path / "h.png"))
    assert code == 0
    knobs = json.loads(out)["settings"]
    p, m, v = knobs["pp"], knobs["m"], knobs.get("chunks", 1)
    (fig,) = drawn
    ax = fig.axes[0]
    label = ax.get_xlabel()
    assert ("chunk" in label and "virtual stage" in label and "one stage" not in label) if v > 1 else "one stage" in label
    arrows = _arrows(ax)
    sends, wraps = 2 * m * (p * v - 1), 2 * m * (v - 1)  # every chunk boundary; those from GPU p back to GPU 1
    assert len(arrows) == sends + wraps  # a wrap-around send is two short arrows
    for a in arrows:
        lo, hi = sorted((a.xyann[1], a.xy[1]))
        assert not any(lo < r < hi for r in range(p)), (a.xyann, a.xy)  # rows are centred on 0 .. p-1
    # no two arrows on each other: two in the same gap between rows (an activation down and a gradient up
    # sent in the same slot) span x ranges apart
    spans = [(round(min(a.xyann[1], a.xy[1]), 6), round(max(a.xyann[1], a.xy[1]), 6),
              min(a.xyann[0], a.xy[0]), max(a.xyann[0], a.xy[0])) for a in arrows]
    for i, (lo, hi, x0, x1) in enumerate(spans):
        for lo2, hi2, u0, u1 in spans[i + 1:]:
            assert (lo, hi) != (lo2, hi2) or x1 < u0 or u1 < x0, ((lo, hi, x0, x1), (u0, u1))
    (key,) = fig.legends + [ax.get_legend()] * (ax.get_legend() is not None)
    said = " ".join(t.get_text() for t in key.get_texts())
    assert ("wrap-around" in said) == (v > 1) and "activation" in said and "gradient" in said
    _texts_do_not_overlap(fig)
    (kbox, *words) = _boxes(fig, [key, ax.xaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()])
    assert not any(kbox.overlaps(w) for w in words)


def test_ring_numbers_its_steps_as_the_lessons_table_does(capsys, drawn, tmp_path):
    code, out = _cli(capsys, "lesson", "ring-attention", "--json", "--plot", str(tmp_path / "r.png"))
    assert code == 0
    table = json.loads(out)["tables"][0]
    want = [int(re.match(r"step (\d+)", r["step"]).group(1)) for r in table["rows"]]
    assert want == [0, 1, 2, 3]
    ax = drawn[-1].axes[0]
    heads = sorted((t.get_position()[0], t.get_text()) for t in ax.texts if re.match(r"step \d+", t.get_text()))
    assert [int(re.match(r"step (\d+)", s).group(1)) for _, s in heads] == want


def _inside(fig, ax, artists) -> None:
    (frame,) = _boxes(fig, [ax])
    for a, box in zip(artists, _boxes(fig, artists)):
        assert frame.y0 - 1 <= box.y0 and box.y1 <= frame.y1 + 1, a


def test_zero_leaves_headroom_over_every_bar_and_its_label(capsys, drawn, tmp_path):
    """The DP bar (19.07 kB, what rank 0 holds at its peak in the trace) and its label fit under the top."""
    from parasim.lesson import get_lesson, run_lesson
    code, _ = _cli(capsys, "lesson", "zero", "--plain", "--plot", str(tmp_path / "z.png"))
    assert code == 0
    trace = run_lesson(get_lesson("zero")).result.trace
    peaks = [trace.peak(0, p)["bytes"] / 1e3 for p in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    fig = drawn[-1]
    held, sent = fig.axes
    assert [t.get_text() for t in held.texts] == [f"{kb:.2f} kB" for kb in peaks]
    for ax in (held, sent):
        top = max(p.get_y() + p.get_height() for p in ax.patches)
        assert ax.get_ylim()[1] >= 1.08 * top
        _inside(fig, ax, ax.texts)
    _texts_do_not_overlap(fig)


def _luminance(rgb) -> float:
    def lin(c):
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_zero_bubble_numbers_its_slots_and_its_cells_read_at_native_size(capsys, drawn, tmp_path):
    """Each panel's slots are numbered (1 .. 66, the longest makespan); every cell's label is at least 9 pt
    (15 pixels at 120 dpi) and at least 4.5:1 against its cell (WCAG's contrast for text, its colour drawn
    with its alpha over white)."""
    from matplotlib.colors import to_rgb, to_rgba
    code, _ = _cli(capsys, "lesson", "pp-zero-bubble", "--plain", "--plot", str(tmp_path / "zb.png"))
    assert code == 0
    axes = [ax for ax in drawn[-1].axes if ax.get_title()]
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in range(1, 67)]
        for t in ax.texts:
            x, y = t.get_position()
            (cell,) = [p for p in ax.patches if p.get_x() <= x <= p.get_x() + p.get_width()
                       and p.get_y() <= y <= p.get_y() + p.get_height()]
            r, g, b, a = to_rgba(cell.get_facecolor())
            back = _luminance([a * c + 1 - a for c in (r, g, b)])
            ink = _luminance(to_rgb(t.get_color()))
            assert t.get_fontsize() >= 9, t.get_text()
            assert (max(back, ink) + 0.05) / (min(back, ink) + 0.05) >= 4.5, (ax.get_title(), t.get_text())


def test_rules_of_thumb_keys_off_the_bars_and_draws_broken_above_kept(capsys, drawn, tmp_path):
    code, _ = _cli(capsys, "lesson", "rules-of-thumb", "--plain", "--plot", str(tmp_path / "r.png"))
    assert code == 0
    fig = drawn[-1]
    keys = [lg for lg in fig.legends] + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(keys) == 1 and [t.get_text() for t in keys[0].get_texts()] == ["rule broken", "rule kept"]
    bars = [p for ax in fig.axes for p in ax.patches]
    (kbox,), boxes = _boxes(fig, keys), _boxes(fig, bars)
    assert not any(kbox.overlaps(b) for b in boxes)
    for ax in fig.axes:  # the key's order on the page: each rule's red bar above its green one
        red = sorted(p.get_y() for p in ax.patches if p.get_facecolor()[0] > 0.7)
        green = sorted(p.get_y() for p in ax.patches if p.get_facecolor()[0] < 0.3)
        assert ax.yaxis_inverted() and all(r < g for r, g in zip(red, green))


def test_hot_expert_names_its_x_axis(capsys, drawn, tmp_path):
    code, _ = _cli(capsys, "lesson", "hot-expert", "--plain", "--plot", str(tmp_path / "e.png"))
    assert code == 0
    bottom = [ax for ax in drawn[-1].axes if ax.get_title()][-3:]
    assert all(ax.get_xlabel() == "GPU" for ax in bottom)

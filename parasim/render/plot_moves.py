"""What moves, drawn from a lesson's run: where the followed token of the MoE example lives, its dispatch and
combine (`parasim lesson moe16 --plot`), and the pipeline hand-off, stage to stage, slot by slot (`parasim lesson
pp-1f1b --plot`, pp-gpipe, pp-interleaved). Everything drawn is read from the run: the notes the token's
holders left (which experts, on which GPUs, with which gates), the all-to-all's group, each rank's slot
table and every point-to-point send."""

from __future__ import annotations

from typing import Any

from .plot_base import pyplot, save
from ..comm.texts import rank_list
from ..layout.axes import SIZED
from ..comm.trace import Trace

FORWARD, BACKWARD = "tab:blue", "tab:red"  # activations on, gradients back (sends and their slots)
OTHER = "0.45"  # the other tokens on the followed token's GPU (moe16's "the"), drawn beside it


# -- the MoE dispatch and combine ---------------------------------------------------------------------------
def token_routes(trace: Trace) -> list[dict]:
    """Per MoE layer the followed token went through: its GPU, the EP group it was dispatched over, and each
    pick (expert, GPU, gate), from the notes its holders left and the layer's dispatch all-to-all."""
    out = []
    for phase, rank, _, d in trace.notes("watch"):
        if d.get("watch") != "route":
            continue
        dispatch = next(e for e in trace.events if e.phase == phase and e.op == "all_to_all" and rank in e.ranks)
        out.append(
            {
                "layer": d["layer"],
                "gpu": rank,
                "group": list(dispatch.group.ranks),
                "axis": dispatch.group.name,  # the group's mesh axis, as the trace names it ("ep")
                "picks": list(zip(d["experts"], d["gpus"], d.get("gates") or [None] * len(d["gpus"]))),
            }
        )
    return out


def same_routes(routes: list[dict]) -> list[list[dict]]:
    """The routes (`token_routes`) gathered where they are one route: the same experts with the same gates, on
    GPUs at the same places of their EP group, the token's GPU too (the post's routing, layer after layer and
    stage after stage); each gathering in the order its first layer came."""
    out: dict[tuple, list[dict]] = {}
    for r in routes:
        at = r["group"].index
        key = (at(r["gpu"]), tuple((e, at(g), gate) for e, g, gate in r["picks"]))
        out.setdefault(key, []).append(r)
    return list(out.values())


def layout_command(layout: Any) -> str:
    """The `parasim layout` command that draws `layout` alone: its sizes above 1, and SP."""
    sizes = " ".join(f"--{a} {getattr(layout, a)}" for a in SIZED if getattr(layout, a) > 1)
    return f"parasim layout {sizes}" + (" --sequence-parallel" if layout.sp else "")


def plot_dispatch(lr: Any, path: str, layout: Any = None, others: dict[str, list[dict]] | None = None) -> None:
    """Where the followed token lives and what happens to it at an MoE layer, from the run's notes. On top, where
    `layout` is given (the layout the run used): its map (nodes, GPUs with their experts, EP groups, gradient
    links), the GPUs holding the token outlined and the pipeline hand-off between them. Then a row per distinct
    route (`same_routes`: the post's routing is one route in every layer): left, the dispatch (the token's EP
    group as a dashed outline, arrows to each GPU computing one of its experts, labelled with the expert and its
    gate; an expert on the token's own GPU said under it); right, the combine (the gate-weighted outputs coming
    back, added to the token itself, the residual: the layer's output as the sum, each gate the run's, and each
    layer's two terms' norms where the holder noted them). `others`: the routes (`token_routes`) of the other
    tokens on the followed token's GPU, by their words, from runs watching them: drawn grey beside its own (the
    post draws "the" going to g0 beside "contract")."""
    trace = lr.result.trace
    rows = same_routes(token_routes(trace))
    residual = {d["layer"]: d for _, _, _, d in trace.notes("residual")}
    holders = [r for _, r, _, d in trace.notes("watch") if d.get("watch") == "holds"]
    token = next((d["token"] for _, _, _, d in trace.notes("watch") if d.get("watch") == "holds"), "")
    word = next((d["residual"] for d in residual.values()), "x")
    plt = pyplot()
    top = 6.2 if layout is not None else 0.0
    # per row: the other tokens' routes at its first layer, and the height it takes (each path of theirs drawn
    # under the boxes adds a band, so that the lines under them keep their spacing)
    alsos = [
        [(w, r) for w, routes in (others or {}).items() for r in routes if r["layer"] == same[0]["layer"]]
        for same in rows
    ]
    heights = [2.5 + (0.2 + 0.25 * sum(len(_away(r)) for _, r in also) if also else 0.0) for also in alsos]
    fig = plt.figure(figsize=(12, top + sum(heights) + 0.9))
    grid = fig.add_gridspec(
        len(rows) + (layout is not None), 2, height_ratios=([top] if layout is not None else []) + heights
    )
    if layout is not None:
        _draw_layout(fig.add_subplot(grid[0, :]), layout, holders, trace)
    for i, (same, also) in enumerate(zip(rows, alsos)):
        for j, way in enumerate(("dispatch", "combine")):
            _draw_group(fig.add_subplot(grid[i + (layout is not None), j]), same, way, residual, word, also)
    fig.suptitle(
        f"Where {token} lives and goes at each MoE layer: dispatch to the GPUs holding its experts, combine back"
        "\n(boxes: GPUs; dashed outline: the layer's EP group; gold: the token's GPU; labels: each expert and its "
        "gate)",
        fontsize=10,
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def _draw_layout(ax: Any, layout: Any, holders: list[int], trace: Trace) -> None:
    """The layout's map (render/plot_layout.py's), the token's GPUs outlined, and the forward hand-off between
    them read from the run (the first point-to-point send from one holder to the next), its legend under it."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from .plot_layout import NODE_GAP, TOKEN_COLOUR, _arc, _draw_map, _Grid, layout_map

    cells = layout_map(layout)
    grid = _Grid(cells, min(layout.tp * layout.cp, layout.gpus_per_node))
    entries = _draw_map(ax, layout, grid, cells, set(holders), faint_links=True)
    entries.insert(1, (Patch(fill=False, edgecolor=TOKEN_COLOUR, lw=2.5), "a GPU holding the token (one a stage)"))
    layer = {m.text: (m.data or {}).get("layer") for m in trace.marks if m.kind == "phase"}
    for src, dst in zip(holders, holders[1:]):
        e = next(
            (e for e in trace.events if e.kind == "p2p" and (e.params["src"], e.params["dst"]) == (src, dst)), None
        )
        if e is None:
            continue
        a, b = grid.edge(src, "top", 0.85), grid.edge(dst, "top", 0.15)
        _arc(
            ax,
            a,
            b,
            (0.0, 1.1),
            arrowstyle="-|>,head_length=0.5,head_width=0.25",
            color=TOKEN_COLOUR,
            lw=2.2,
            mutation_scale=10,
        )
        ax.text(
            (a[0] + b[0]) / 2,
            a[1] + 1.15,
            f"g{src} -> g{dst}: hand-off after layer {layer.get(e.phase)}",
            ha="center",
            va="bottom",
            fontsize=7.5,
            color=TOKEN_COLOUR,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none"},
        )
        entries.append(
            (
                Line2D([], [], color=TOKEN_COLOUR, lw=2.2, marker=">", ms=4),
                "the pipeline hand-off of the token's activations (PP)",
            )
        )
    handles, labels = zip(*entries)
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=2, fontsize=7.5, frameon=False)
    ax.set_xlim(-0.8, grid.per_line * (grid.cols + NODE_GAP) - NODE_GAP + 0.3)
    ax.set_ylim(grid.node_y(grid.nodes - 1) - 1.1, grid.top + 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        f"the layout the run used: {layout}\n(drawn alone by {layout_command(layout)} --plot FILE.png)\n"
        + post_grid(cells, holders[0] if holders else 0),
        fontsize=9,
        loc="left",
    )


def post_grid(cells: list[dict], gpu: int) -> str:
    """How the drawn grid maps to the post's map, in one line: here a row is a DP replica and a column a (CP rank,
    TP rank) pair; the post draws each replica with TP ranks as rows and CP ranks as columns, the replicas side
    by side. `gpu`'s place in both, from its cell's coordinates."""
    c = next(x for x in cells if x["gpu"] == gpu)
    k = c["coords"]
    return (
        "the post's map turned: here a row is a DP replica and a column a (CP rank, TP rank) pair; the post's rows "
        f"are TP ranks,\nits columns CP ranks, the replicas side by side (g{gpu}: here row DP {k['dp']}, column "
        f"cp{k['cp']} tp{k['tp']}; in the post replica {k['dp']}, row TP rank {k['tp']}, column CP rank {k['cp']})"
    )


def _gated(e: int, gate: float | None, word: str) -> str:
    """One chosen expert's share of the token's output: 'gate x E<e>(word)' (no gate where none is noted)."""
    return f"E{e}({word})" if gate is None else f"{gate:.2f} x E{e}({word})"


def _numbers(layers: list[int]) -> str:
    """1, 2, 3 -> '1-3'; 1, 3 -> '1, 3'."""
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers))


def _draw_group(
    ax: Any, same: list[dict], way: str, residual: dict, word: str, also: list[tuple[str, dict]] = ()
) -> None:
    from matplotlib.patches import FancyBboxPatch

    route = same[0]  # the others are the same route: drawn once, on the first one's GPUs
    group, home = route["group"], route["gpu"]
    x = {g: i for i, g in enumerate(group)}
    outline = FancyBboxPatch(
        (-0.42, -0.5),
        len(group) - 0.16,
        0.92,
        boxstyle="round,pad=0.02",
        fill=False,
        edgecolor="0.35",
        linestyle="--",
        lw=1.0,
    )
    outline.set_gid(f"EP group {rank_list(group)}")
    ax.add_patch(outline)
    ax.text(
        -0.36,
        -0.5,
        f"EP group {route.get('axis', 'ep')}{rank_list(group)}",
        ha="left",
        va="center",
        fontsize=7,
        color="0.3",
        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"},
    )  # on the outline's lower edge, as a frame's name
    for g in group:
        ax.add_patch(_box(x[g], "gold" if g == home else "white"))
        ax.text(x[g], 0, f"g{g}", ha="center", va="center", fontsize=9, fontweight="bold")
    under = []  # lines under the group, top down
    stay = [(e, gate) for e, g, gate in route["picks"] if g == home]
    if way == "dispatch" and stay:
        said = ", ".join(f"E{e}" + (f" (gate {gate:.2f})" if gate is not None else "") for e, gate in stay)
        under.append(f"{said} on g{home} itself: it stays")
    if way == "dispatch":  # the same route on other GPUs (the next stage's): where its picks go there
        for r in same[1:]:
            if r["gpu"] != home and r["gpu"] != same[same.index(r) - 1]["gpu"]:
                gpus = ", ".join(f"g{g}" for g in dict.fromkeys(g for _, g, _ in r["picks"]) if g != r["gpu"])
                under.append(
                    f"from layer {r['layer']} on g{r['gpu']}: the same picks, to {gpus or 'none'} "
                    f"(EP group {r.get('axis', 'ep')}{rank_list(r['group'])})"
                )
    if way == "combine":  # the token's output: itself (the residual) plus every chosen expert's output x its gate
        total = " + ".join(_gated(e, gate, word) for e, _, gate in route["picks"])
        under.append(f"layer output = {word} + {total}")
        noted = [residual[r["layer"]] for r in same if r["layer"] in residual]
        if noted:
            under.append("the two terms' sizes in the run (norms: the residual / the experts' share):")
            said = [f"layer {d['layer']}: {d['norms']['residual']:.2f} / {d['norms']['experts']:.2f}" for d in noted]
            under += [", ".join(said[i : i + 4]) for i in range(0, len(said), 4)]
        # the residual: the token itself, kept on its GPU, added to what comes back
        ax.annotate(
            "",
            xy=(x[home] - 0.12, -0.3),
            xytext=(x[home] + 0.12, -0.3),
            arrowprops=dict(arrowstyle="-|>", color="0.2", lw=1.2, connectionstyle="arc3,rad=-1.6"),
        )
        # its label right of the loop, or left where the other tokens' paths all come back from the right
        sides = {x[g] > x[home] for _, r in also for g in _away(r)}
        left = sides == {True}
        ax.text(
            x[home] + (-0.34 if left else 0.34),
            -0.55,
            f"+ {word} (residual)",
            ha="right" if left else "left",
            va="top",
            fontsize=7,
        )
    for n, (e, g, gate) in enumerate(sorted(route["picks"], key=lambda p: x[p[1]])):
        if g == home:
            continue
        a, b = (x[home], x[g]) if way == "dispatch" else (x[g], x[home])
        bend = 0.35 + 0.15 * n
        ax.annotate(
            "",
            xy=(b, 0.32),
            xytext=(a, 0.32),
            arrowprops=dict(
                arrowstyle="-|>",
                color=FORWARD if way == "dispatch" else BACKWARD,
                lw=1.6,
                connectionstyle=f"arc3,rad={-bend if b > a else bend}",
            ),
        )
        what = f"E{e}" + (f" (gate {gate:.2f})" if gate is not None else "")
        ax.text(
            (a + b) / 2,
            0.62 + 0.3 * n + 0.12 * abs(b - a),
            what if way == "dispatch" else _gated(e, gate, word),
            ha="center",
            fontsize=7,
        )
    # the other tokens on the same GPU (the post's "the" beside "contract"): a grey path under the boxes to each
    # GPU holding one of its experts, sent once however many of them it holds there
    low = -0.72
    for other, r in also:
        there = _away(r)
        for g, es in there.items():
            # under the boxes, into the side of the expert's GPU facing the token's (clear of the group's name on
            # the outline's lower edge) and into the bottom of the token's GPU (clear of the residual's loop)
            side = 1 if x[home] > x[g] else -1
            edge, leg, mine = x[g] + 0.3 * side, x[g] + 0.45 * side, x[home] - 0.18 * side
            path = [(mine, -0.3), (mine, low), (leg, low), (leg, -0.15), (edge, -0.15)]
            path = path if way == "dispatch" else path[::-1]
            ax.plot([p[0] for p in path[:-1]], [p[1] for p in path[:-1]], color=OTHER, lw=1.3, ls="--")
            ax.annotate("", xy=path[-1], xytext=path[-2], arrowprops=dict(arrowstyle="-|>", color=OTHER, lw=1.3))
            a, b = mine, leg
            what = ", ".join(f"E{e}" for e in es)
            said = f"'{other}' to {what}" if way == "dispatch" else f"{what} of '{other}' back"
            ax.text(
                (a + b) / 2,
                low - 0.04,
                said + (" (once)" if len(es) > 1 and way == "dispatch" else ""),
                ha="center",
                va="top",
                fontsize=7,
                color=OTHER,
            )
            low -= 0.3
        if way == "dispatch":
            every: dict[int, list[int]] = {}
            for e, g, _ in r["picks"]:
                every.setdefault(g, []).append(e)
            where = "; ".join(f"{', '.join(f'E{e}' for e in es)} on g{g}" for g, es in every.items())
            once = "; sent to each GPU once" if any(len(es) > 1 for es in there.values()) else ""
            under.append(f"grey: g{r['gpu']}'s other token, '{other}': {where}{once}")
    top = -0.78 + (low + 0.72) - (0.2 if also else 0)
    for i, line in enumerate(under):
        ax.text((len(group) - 1) / 2, top - 0.22 * i, line, ha="center", va="top", fontsize=7)
    ax.set_xlim(-0.6, len(group) - 0.4)
    ax.set_ylim(top - 0.12 - 0.22 * max(len(under), 1), 1.9)
    ax.axis("off")
    by_gpu: dict[int, list[int]] = {}
    for r in same:
        by_gpu.setdefault(r["gpu"], []).append(r["layer"])
    layers = sum(by_gpu.values(), [])
    said = " and ".join(f"{_numbers(ls)} on g{g}" for g, ls in by_gpu.items())
    ax.set_title(f"layer{'s' * (len(layers) > 1)} {said}: {way}", fontsize=9, loc="left")


def _away(route: dict) -> dict[int, list[int]]:
    """A route's picks on GPUs other than the token's own: GPU -> its experts there (one path each)."""
    out: dict[int, list[int]] = {}
    for e, g, _ in route["picks"]:
        if g != route["gpu"]:
            out.setdefault(g, []).append(e)
    return out


def _box(x: float, colour: str) -> Any:
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x - 0.3, -0.3), 0.6, 0.6, boxstyle="round,pad=0.02", facecolor=colour, edgecolor="black")


# -- the pipeline hand-off -----------------------------------------------------------------------------------
def handoffs(trace: Trace) -> list[tuple[int, int, int, str]]:
    """Every point-to-point send of a pipeline run: (slot, from rank, to rank, 'activation' or 'gradient')."""
    out = []
    for e in trace.events:
        if e.kind != "p2p" or not e.tags or "slot" not in e.tags:
            continue
        kind = "gradient" if "send gradient" in (e.label or "") else "activation"
        out.append((e.tags["slot"], e.params["src"], e.params["dst"], kind))
    return out


HANDOFF = "the hand-off between stages, slot by slot"  # what plot_handoff shows, for the pipeline lessons' --plot


WRAP = "tab:purple"  # a send from the last stage of one chunk round to the first GPU's next chunk, and back


def chunk_of(label: str) -> int:
    """Which of its GPU's chunks a slot-table label runs, 0-based: 'F1' 0, 'f1' 1, 'F1:3' 2 (pipeline/action.py)."""
    if ":" in label:
        return int(label.split(":")[1]) - 1
    return 1 if label[:1].islower() else 0


def is_wrap(src: int, dst: int, kind: str) -> bool:
    """A send against the pipeline's flow on the page: an activation to an earlier GPU or a gradient to a later
    one, which only an interleaved schedule makes (the last GPU's chunk to the first GPU's next chunk)."""
    return dst < src if kind == "activation" else dst > src


def plot_handoff(lr: Any, path: str) -> None:
    """Stages as rows, the schedule's slots across: each rank's forward (F, blue) and backward (B, red) cells,
    idle cells grey, and an arrow for every send: an activation down to the next stage, a gradient back up. A
    send that wraps round (interleaved: the last GPU's chunk to the first GPU's next one, or its gradient
    back) leaves its GPU off the table's edge and enters the other from the opposite edge, crossing no row."""
    values, trace = lr.result.values, lr.result.trace
    slots = [v["slots"] for v in values]
    p, width = len(slots), max(len(s) for s in slots)
    chunks = 1 + max((chunk_of(c) for row in slots for c in row if c), default=0)
    plt = pyplot()
    sends = handoffs(trace)
    wraps = [x for x in sends if is_wrap(x[1], x[2], x[3])]
    key_h = 0.8 if wraps else 0.55  # inches under the table for the key (two rows, three with wraps)
    fig, ax = plt.subplots(figsize=(min(18, 2.0 + 0.42 * width), 1.6 + 0.62 * p + key_h))
    for r, row in enumerate(slots):
        for s, cell in enumerate(row):
            colour = "#eeeeee" if cell is None else (FORWARD if cell[0] in "Ff" else BACKWARD)
            ax.add_patch(
                plt.Rectangle(
                    (s, r - 0.35),
                    0.92,
                    0.7,
                    facecolor=colour,
                    alpha=0.85 if cell else 1,
                    hatch=None if cell else "//",
                    edgecolor="#bbbbbb" if cell is None else "none",
                )
            )
            if cell:
                ax.text(s + 0.46, r, cell, ha="center", va="center", fontsize=7, color="white")
    arrow = dict(arrowstyle="-|>", lw=0.8)
    for slot, src, dst, kind in sends:
        # from the end of the sender's slot (slots are 1-based); a gradient a little later than an activation
        # sent in the same slot, so that the two do not lie on each other
        x = slot - 0.16 + (0.18 if kind == "gradient" else 0.0)
        if is_wrap(src, dst, kind):  # off one edge of the table, in at the other: two short arrows
            out = 1 if kind == "activation" else -1  # activations leave downward, gradients upward
            for (x0, y0), (x1, y1) in (
                ((x, src + 0.35 * out), (x + 0.08, src + 0.62 * out)),
                ((x + 0.08, dst - 0.62 * out), (x + 0.16, dst - 0.35 * out)),
            ):
                ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrow, color=WRAP))
            continue
        ax.annotate(
            "",
            xy=(x + 0.16, dst + (-0.35 if dst > src else 0.35)),
            xytext=(x, src + (0.35 if dst > src else -0.35)),
            arrowprops=dict(arrow, color="black" if kind == "activation" else "dimgrey"),
        )
    ax.set_xlim(-0.2, width + 0.2)
    edge = 0.75 if wraps else 0.5  # room for the wrap-around arrows off the table's edges
    ax.set_ylim(p - 1 + edge, -edge)
    ax.set_yticks(range(p), [f"GPU {r + 1}" for r in range(p)])
    ax.set_xticks([s + 0.46 for s in range(width)], [str(s + 1) for s in range(width)], fontsize=7)
    if chunks > 1:  # a slot runs one chunk: a virtual stage, 1/chunks of a GPU's layers
        ax.set_xlabel(
            f"slot of the schedule (one forward or backward of one micro-batch through one chunk: a virtual "
            f"stage, 1/{chunks} of a GPU's layers)"
        )
    else:
        ax.set_xlabel("slot of the schedule (one forward or backward of one micro-batch on one stage)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # how the labels name a GPU's chunks: the first upper case, the second lower case, the third on 'F1:3'
    later = (", f: 2nd chunk" if chunks > 1 else "") + (", F1:3: 3rd" if chunks > 2 else "")
    handles = [
        Patch(color=FORWARD, label=f"forward (F{later})"),
        Patch(color=BACKWARD, label=f"backward (B{later.replace('f:', 'b:').replace('F1:3', 'B1:3')})"),
        Patch(facecolor="#eeeeee", hatch="//", edgecolor="#bbbbbb", label="idle (the bubble)"),
        Line2D([], [], color="black", lw=0.8, marker=">", ms=4, label="activation sent to the next GPU"),
        Line2D([], [], color="dimgrey", lw=0.8, marker=">", ms=4, label="gradient sent back"),
    ]
    if wraps:
        handles.append(
            Line2D(
                [],
                [],
                color=WRAP,
                lw=0.8,
                marker=">",
                ms=4,
                label=f"wrap-around, GPU {p} to GPU 1's next chunk (gradients: back):\nout at one edge of the "
                "table, in at the other",
            )
        )
    # the key under the table (beside it, it would squeeze the slots), in a band of its own
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    ax.set_title(
        f"{lr.lesson.name}: the pipeline hand-off on {p} GPUs, {len(sends)} sends (arrows: activations "
        f"down, gradients up); bubble {values[0]['bubble']} of the step",
        fontsize=10,
        loc="left",
    )
    fig.tight_layout(rect=(0, key_h / fig.get_figheight(), 1, 1))
    save(fig, path)
    plt.close(fig)

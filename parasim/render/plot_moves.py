"""What moves, drawn from a lesson's run: the dispatch and combine of the followed token in the MoE example
(`parasim lesson moe16 --plot`), and the pipeline hand-off, stage to stage, slot by slot (`parasim lesson
pp-1f1b --plot`, pp-gpipe, pp-interleaved). Everything drawn is read from the run: the notes the token's
holders left (which experts, on which GPUs, with which gates), the all-to-all's group, each rank's slot
table and every point-to-point send."""

from __future__ import annotations

from typing import Any

from .plot_base import pyplot, save
from ..comm.texts import rank_list
from ..comm.trace import Trace

FORWARD, BACKWARD = "tab:blue", "tab:red"  # activations on, gradients back (sends and their slots)


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


def plot_dispatch(lr: Any, path: str) -> None:
    """A row per MoE layer: the token's EP group as a dashed outline around its GPUs' boxes, its GPU marked;
    left, the dispatch (arrows to each GPU computing one of its experts, labelled with the expert and its gate;
    an expert on the token's own GPU said under it, with its gate); right, the combine (the gate-weighted
    outputs coming back, and the token's output as the gate-weighted sum of every chosen expert)."""
    routes = token_routes(lr.result.trace)
    plt = pyplot()
    fig, axes = plt.subplots(len(routes), 2, figsize=(11, 1.9 * len(routes) + 1.0), squeeze=False)
    for row, route in zip(axes, routes):
        for ax, way in zip(row, ("dispatch", "combine")):
            _draw_group(ax, route, way)
    token = next((d["token"] for _, _, _, d in lr.result.trace.notes("watch") if d.get("watch") == "holds"), "")
    fig.suptitle(
        f"Where {token} goes in each MoE layer: dispatch to the GPUs holding its experts, combine back\n"
        "(boxes: GPUs; dashed outline: the layer's EP group; gold: the token's GPU; labels: each expert and its "
        "gate)",
        fontsize=10,
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def _gated(e: int, gate: float | None) -> str:
    """One chosen expert's share of the token's output: 'gate x E<e>' (the expert alone where no gate is noted)."""
    return f"E{e}" if gate is None else f"{gate:.2f} x E{e}"


def _draw_group(ax: Any, route: dict, way: str) -> None:
    from matplotlib.patches import FancyBboxPatch

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
    stay = [(e, gate) for e, g, gate in route["picks"] if g == home]
    if way == "dispatch" and stay:
        said = ", ".join(f"E{e}" + (f" (gate {gate:.2f})" if gate is not None else "") for e, gate in stay)
        ax.text(x[home], -0.66, f"{said} here: stays", ha="center", va="top", fontsize=7)
    if way == "combine":  # the token's output: every chosen expert's output times its gate, summed
        total = " + ".join(_gated(e, gate) for e, _, gate in route["picks"])
        ax.text(x[home], -0.66, f"output = {total}", ha="center", va="top", fontsize=7)
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
            what if way == "dispatch" else f"E{e}'s output" + (f" x {gate:.2f}" if gate is not None else ""),
            ha="center",
            fontsize=7,
        )
    ax.set_xlim(-0.6, len(group) - 0.4)
    ax.set_ylim(-1.0, 1.9)
    ax.axis("off")
    ax.set_title(f"layer {route['layer']}: {way}", fontsize=9, loc="left")


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

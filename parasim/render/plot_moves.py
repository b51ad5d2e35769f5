"""What moves, drawn from a lesson's run: the dispatch and combine of the followed token in the MoE example
(`parasim lesson moe16 --plot`), and the pipeline hand-off, stage to stage, slot by slot (`parasim lesson
pp-1f1b --plot`, pp-gpipe, pp-interleaved). Everything drawn is read from the run: the notes the token's
holders left (which experts, on which GPUs, with which gates), the all-to-all's group, each rank's slot
table and every point-to-point send."""

from __future__ import annotations

from typing import Any

from .plot_base import pyplot, save
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
                "picks": list(zip(d["experts"], d["gpus"], d.get("gates") or [None] * len(d["gpus"]))),
            }
        )
    return out


def plot_dispatch(lr: Any, path: str) -> None:
    """A row per MoE layer: the token's EP group as boxes, its GPU marked; left, the dispatch (arrows to each
    GPU computing one of its experts, labelled with the expert and its gate); right, the combine (the
    gate-weighted outputs coming back). A pick on the token's own GPU moves nothing: said in its box."""
    routes = token_routes(lr.result.trace)
    plt = pyplot()
    fig, axes = plt.subplots(len(routes), 2, figsize=(11, 1.9 * len(routes) + 1.0), squeeze=False)
    for row, route in zip(axes, routes):
        for ax, way in zip(row, ("dispatch", "combine")):
            _draw_group(ax, route, way)
    token = next((d["token"] for _, _, _, d in lr.result.trace.notes("watch") if d.get("watch") == "holds"), "")
    fig.suptitle(
        f"Where {token} goes in each MoE layer: dispatch to the GPUs holding its experts, combine back\n"
        "(boxes: the layer's EP group; gold: the token's GPU; labels: the expert and its gate)",
        fontsize=10,
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def _draw_group(ax: Any, route: dict, way: str) -> None:
    group, home = route["group"], route["gpu"]
    x = {g: i for i, g in enumerate(group)}
    for g in group:
        ax.add_patch(_box(x[g], "gold" if g == home else "white"))
        ax.text(x[g], 0, f"g{g}", ha="center", va="center", fontsize=9, fontweight="bold")
    stay = [f"E{e}" for e, g, _ in route["picks"] if g == home]
    if stay:
        ax.text(x[home], -0.62, f"{', '.join(stay)} here: stays", ha="center", va="top", fontsize=7)
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


def plot_handoff(lr: Any, path: str) -> None:
    """Stages as rows, the schedule's slots across: each rank's forward (F, blue) and backward (B, red) cells,
    idle cells grey, and an arrow for every send: an activation down to the next stage, a gradient back up."""
    values, trace = lr.result.values, lr.result.trace
    slots = [v["slots"] for v in values]
    p, width = len(slots), max(len(s) for s in slots)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(18, 1.6 + 0.42 * width), 0.9 + 0.62 * p))
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
    sends = handoffs(trace)
    for slot, src, dst, kind in sends:
        x = slot - 0.08  # the end of the sender's slot (slots are 1-based)
        ax.annotate(
            "",
            xy=(x + 0.16, dst + (-0.35 if dst > src else 0.35)),
            xytext=(x, src + (0.35 if dst > src else -0.35)),
            arrowprops=dict(arrowstyle="-|>", color="black" if kind == "activation" else "dimgrey", lw=0.8),
        )
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(p - 0.5, -0.7)
    ax.set_yticks(range(p), [f"GPU {r + 1}" for r in range(p)])
    ax.set_xticks([s + 0.46 for s in range(width)], [str(s + 1) for s in range(width)], fontsize=7)
    ax.set_xlabel("slot of the schedule (one forward or backward of one micro-batch on one stage)")
    from matplotlib.patches import Patch

    second = any(c and c[0].islower() for row in slots for c in row)  # an interleaved run's second chunk
    ax.legend(
        handles=[
            Patch(color=FORWARD, label="forward (F" + (", f: 2nd chunk)" if second else ")")),
            Patch(color=BACKWARD, label="backward (B" + (", b: 2nd chunk)" if second else ")")),
            Patch(facecolor="#eeeeee", hatch="//", edgecolor="#bbbbbb", label="idle (the bubble)"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    ax.set_title(
        f"{lr.lesson.name}: the pipeline hand-off on {p} GPUs, {len(sends)} sends (arrows: activations "
        f"down, gradients up); bubble {values[0]['bubble']} of the step",
        fontsize=10,
        loc="left",
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)

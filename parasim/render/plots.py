"""Pictures (matplotlib, no display needed): the pipeline slot table, the estimator's memory bars and
layout search. Each is drawn with matplotlib's Agg back end into a file written whole or not at all."""
from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError
from ..pipeline.action import kind_of
from ..pipeline.timing import Timing


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg back end (files only, no display). MPLBACKEND is set aside while
    matplotlib is imported: it reads the variable then and refuses a name it does not know with a
    ValueError, though a picture written to a file never uses the back end the variable names."""
    named = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if named is not None:
            os.environ["MPLBACKEND"] = named
    return plt


def plot_slots(timing: Timing, title: str, path: str) -> None:
    plt = _pyplot()

    ranks, width = len(timing.slots), timing.makespan
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * width + 1.5), 0.55 * ranks + 1.2))
    for r, row in enumerate(timing.slots):
        t = 0
        while t < width:  # an action spans as many slots as it costs: one box per action
            label, end = row[t], t + 1
            while end < width and label and row[end] == label:
                end += 1
            if label:
                colour = kind_of(label).plot  # each kind's colour from the kind table
                ax.add_patch(plt.Rectangle((t, ranks - 1 - r), end - t, 1, color=colour, ec="white",
                                           alpha=0.65 if label[0].islower() else 1.0))  # a second chunk: lighter
                ax.text((t + end) / 2, ranks - 0.5 - r, label, ha="center", va="center", fontsize=8, color="white")
            t = end
    ax.set_xlim(0, width)
    ax.set_ylim(0, ranks)
    ax.set_yticks([ranks - 0.5 - r for r in range(ranks)], [f"GPU {r + 1}" for r in range(ranks)])
    ax.set_xticks([t + 0.5 for t in range(width)], [str(t + 1) for t in range(width)], fontsize=7)
    ax.set_title(f"{title}: bubble {timing.bubble} ({float(timing.bubble):.0%})")
    ax.set_frame_on(False)
    fig.tight_layout()
    _save(fig, path, bbox_inches=None)
    plt.close(fig)


# -- the estimator's pictures ---------------------------------------------------------------------------------------------
def _save(fig: Any, path: str, bbox_inches: str | None = "tight") -> None:
    """The figure in `path` (its format from the name's suffix), whole or not at all (render/output)."""
    from .output import write_whole
    try:
        write_whole(path, lambda temp: fig.savefig(temp, dpi=120, bbox_inches=bbox_inches))
    except ValueError as exc:  # matplotlib: a format it cannot write
        raise UsageError(f"cannot write {path}: {exc}") from None


def plot_memory(model, plan, seq: int, unit: float, name: str, path: str) -> None:
    plt = _pyplot()
    from dataclasses import replace

    from ..estimate.memory import breakdown
    bars = [breakdown(model, replace(plan, zero=z), seq) for z in range(4)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * 4
    for item in bars[0].items:
        vals = [b.items[item] / unit for b in bars]
        ax.bar([f"ZeRO-{z}" for z in range(4)], vals, bottom=bottom, label=item)
        bottom = [x + v for x, v in zip(bottom, vals)]
    ax.set_ylabel(f"{name} per GPU")
    ax.set_title(f"{model.name}: {plan.label()} on {plan.world} GPUs, s = {seq:,}")
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def plot_search(result: dict, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    fams = sorted(result["families"].items(), key=lambda kv: -max(kv[1].values(), default=0))
    for fam, row in fams[:10]:  # the ten families that reach furthest
        xs = sorted(row)
        ax.plot(xs, [max(row[x], 1) for x in xs], marker=".", label=fam)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("longest sequence (tokens)")
    ax.set_title(f"{result['model']}: longest sequence per layout family")
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


# -- the layout as one picture -----------------------------------------------------------------------------
def layout_map(layout: Any) -> list[dict]:
    """Where each GPU is drawn, as the post draws its 16-GPU map: nodes left to right; in a node, one row per
    DP replica (of its pipeline stage) and one column per (CP rank, TP rank); each GPU with its coordinates,
    its EP group (an index) and the experts it holds (1-based)."""
    coords, groups = layout.coords(), layout.groups()
    ep_index = {r: i for i, g in enumerate(groups["ep"]) for r in g}
    cols = min(layout.tp * layout.cp, layout.gpus_per_node)
    out = []
    for c in coords:
        r = c["rank"]
        node, slot = divmod(r, layout.gpus_per_node)
        out.append({"gpu": r, "node": node, "row": slot // cols, "col": slot % cols, "ep_group": ep_index[r],
                    "experts": [e + 1 for e in layout.experts_of(c["ep"])],
                    "coords": {k: c[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")}})
    return out


def plot_layout_map(layout: Any, path: str, title: str = "", mark: int | None = None) -> None:
    """The layout in one picture: GPUs by node, each labelled with its experts and filled by EP group; GPU
    `mark` (a followed token's) drawn in red."""
    from ..limits import check_experts_shown, check_plot_gpus
    check_plot_gpus(layout.world)
    check_experts_shown(layout.world, layout.experts_each)
    plt = _pyplot()

    cells = layout_map(layout)
    per = min(layout.gpus_per_node, layout.world)
    cols = min(layout.tp * layout.cp, layout.gpus_per_node)
    rows = max(c["row"] for c in cells) + 1
    nodes = (layout.world + per - 1) // per
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * nodes * cols / 2), 1.2 * rows + 1.6))
    palette = plt.get_cmap("tab20")
    for c in cells:
        x = c["node"] * (cols + 1) + c["col"]
        y = rows - 1 - c["row"]
        ax.add_patch(plt.Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, color=palette(c["ep_group"] % 20), alpha=0.55,
                                   ec="red" if c["gpu"] == mark else "white", lw=3 if c["gpu"] == mark else 1))
        label = f"g{c['gpu']}\n" + (" ".join(f"E{e}" for e in c["experts"]) if c["experts"] else "")
        ax.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7,
                color="red" if c["gpu"] == mark else "black")
    for n in range(nodes):
        ax.add_patch(plt.Rectangle((n * (cols + 1) - 0.1, -0.1), cols + 0.2, rows + 0.2, fill=False, ec="grey"))
        ax.text(n * (cols + 1) + cols / 2, rows + 0.25, f"node {n}", ha="center", fontsize=9)
        for c in (c for c in cells if c["node"] == n and c["row"] == rows - 1):  # under the bottom row: CP, TP
            ax.text(n * (cols + 1) + c["col"] + 0.5, -0.25, f"cp{c['coords']['cp']} tp{c['coords']['tp']}",
                    ha="center", fontsize=6, color="grey")
    ax.set_xlim(-0.3, nodes * (cols + 1))
    ax.set_ylim(-0.45, rows + 0.7)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"{layout}: GPUs by node (colour: EP group; E: experts held)", fontsize=9)
    _save(fig, path)
    plt.close(fig)

"""Pictures (matplotlib, no display needed): the pipeline slot table, the estimator's memory bars and
layout search; the layout map, a token's path and the ring's rotation live in plot_layout.py and
plot_ring.py. Each is drawn with matplotlib's Agg back end into a file written whole or not at all."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from ..pipeline.action import KINDS, kind_of
from ..pipeline.timing import Timing
from .plot_base import pyplot, save, tokens_text
from .plot_layout import layout_map, plot_layout_map, plot_token_path  # noqa: F401 (the pictures' one import path)


def plot_slots(timing: Timing, title: str, path: str) -> None:
    plt = pyplot()
    ranks, width = len(timing.slots), timing.makespan
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * width + 1.5), 0.55 * ranks + 1.2))
    draw_slots(ax, timing.slots, width, f"{title}: bubble {timing.bubble} ({float(timing.bubble):.0%})")
    fig.tight_layout()
    save(fig, path, bbox_inches="tight")
    plt.close(fig)


def luminance(colour: Any, alpha: float = 1.0) -> float:
    """The relative luminance (WCAG 2) of `colour` drawn with `alpha` over a white page."""
    from matplotlib.colors import to_rgb

    def channel(c: float) -> float:
        c = alpha * c + (1 - alpha)  # over white
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in to_rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: float, b: float) -> float:
    """WCAG 2's contrast ratio of two luminances (1 to 21; 4.5 and up reads as body text)."""
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def ink(colour: Any, alpha: float = 1.0) -> str:
    """Black or white, whichever reads better on `colour` (drawn with `alpha` over white)."""
    back = luminance(colour, alpha)
    return "black" if contrast(back, luminance("black")) >= contrast(back, luminance("white")) else "white"


def draw_slots(
    ax: Any,
    slots: list[list[str | None]],
    width: int,
    title: str,
    key: bool = True,
    fontsize: float = 8,
    xlabel: bool = True,
) -> None:
    """One slot table on `ax`: a row per GPU, a box per action as long as its cost (its label in black or
    white, whichever reads better on its colour, at `fontsize`), a time axis numbered slot by slot (named
    with `xlabel`), and (with `key`) a key for each kind of action drawn."""
    plt = pyplot()
    ranks = len(slots)
    for r, row in enumerate(slots):
        row = list(row) + [None] * (width - len(row))  # a schedule shorter than the axis: idle to its end
        t = 0
        while t < width:  # an action spans as many slots as it costs: one box per action
            label, end = row[t], t + 1
            while end < width and label and row[end] == label:
                end += 1
            kind = kind_of(label) if label else None
            if label:
                colour = kind.plot if kind else "0.5"  # each kind's colour from the kind table
                alpha = 0.65 if label[0].islower() else 1.0  # a second chunk: lighter
                ax.add_patch(plt.Rectangle((t, ranks - 1 - r), end - t, 1, color=colour, ec="white", alpha=alpha))
                ax.text(
                    (t + end) / 2,
                    ranks - 0.5 - r,
                    label,
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color=ink(colour, alpha),
                )
            t = end
    ax.set_xlim(0, width)
    ax.set_ylim(0, ranks)
    ax.set_yticks([ranks - 0.5 - r for r in range(ranks)], [f"GPU {r + 1}" for r in range(ranks)])
    ax.set_xticks([t + 0.5 for t in range(width)], [str(t + 1) for t in range(width)], fontsize=7)
    ax.set_title(title)
    if xlabel:
        ax.set_xlabel("time, in slots (an action spans the slots its cost takes; blank: the GPU waits)")
    ax.set_frame_on(False)
    if not key:
        return
    # a key for each kind of action the table holds, in the kind table's order; lower case: a second chunk
    seen = {k.letter for row in slots for x in row if x and (k := kind_of(x))}
    second = any(x and x[0].islower() for row in slots for x in row)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=k.plot, label=f"{k.letter}: {k.title}")
        for k in KINDS.values()
        if k.letter in seen
    ]
    if second:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.55", alpha=0.65, label="lower case: the second chunk"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.32),
        ncol=min(3, len(handles)),
        fontsize=8,
        frameon=False,
    )


# -- the estimator's pictures ---------------------------------------------------------------------------------------------
def plot_memory(model: Any, plan: Any, seq: int, unit: float, name: str, path: str, usable: float, gpu: Any) -> None:
    """`memory --plot FILE`: memory_figure written to `path`."""
    save(memory_figure(model, plan, seq, unit, name, usable, gpu), path)


def memory_figure(model: Any, plan: Any, seq: int, unit: float, name: str, usable: float, gpu: Any) -> Any:
    """Memory per GPU item by item, one stacked bar per ZeRO stage, against the usable memory per GPU
    (`usable` bytes: the estimator's figure for `gpu`, or the one the learner gave). The legend sits beside
    the bars, never on them; items that are 0 at every stage are named under the picture, not drawn; and
    where the four bars are equal (no copies to shard over) the picture says why."""
    plt = pyplot()
    from dataclasses import replace

    from ..estimate.memory import breakdown

    bars = [breakdown(model, replace(plan, zero=z), seq) for z in range(4)]
    shown = [k for k in bars[0].items if any(b.items[k] > 0 for b in bars)]
    zero_items = [k for k in bars[0].items if k not in shown]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    names = [f"ZeRO-{z}" + (" (this plan)" if z == plan.zero else "") for z in range(4)]
    bottom = [0.0] * 4
    for item in shown:
        vals = [b.items[item] / unit for b in bars]
        ax.bar(range(4), vals, width=0.6, bottom=bottom, label=item)
        bottom = [x + v for x, v in zip(bottom, vals)]
    top = max(max(bottom), usable / unit)
    for x, total in enumerate(bottom):  # each bar's total above it, in the picture's unit
        ax.text(
            x,
            total + top * 0.01,
            f"{total:,.1f}",
            ha="center",
            va="bottom",
            fontsize=8,
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"},
        )  # readable on the usable line
    card = f" of the {gpu.name}'s {gpu.memory / unit:,.0f} {name}" if math.isclose(usable, gpu.usable) else ""
    ax.axhline(
        usable / unit, color="black", ls="--", lw=1.2, label=f"usable per GPU: {usable / unit:,.0f} {name}{card}"
    )
    ax.set_xticks(range(4), names)
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel(f"memory per GPU ({name}, " + ("2^30 bytes)" if name == "GiB" else "1e9 bytes)"))
    where = f" on {plan.world} GPUs" if plan.world > 1 else ""
    stage = f" (stage {bars[plan.zero].stage + 1} of {plan.pp}, the one that holds most)" if plan.pp > 1 else ""
    ax.set_title(f"{model.name}: {plan.label()}{where}, sequence {seq:,} tokens{stage}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    line = [i for i, lab in enumerate(labels) if lab.startswith("usable")]
    order = line + [i for i in range(len(labels) - 1, -1, -1) if i not in line]  # the line, then items top first
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
    )  # beside the bars, never on them
    notes = []
    if all(math.isclose(b.total, bars[0].total) for b in bars):  # nothing to shard over: say why
        notes.append(
            f"DP {plan.dp} x CP {plan.cp} = {plan.dp * plan.cp}: ZeRO splits optimizer states, gradients "
            "and weights over the GPUs that hold copies of the same weights; here there is no other copy, "
            "so ZeRO shards nothing and the four bars are equal."
        )
    if zero_items:
        notes.append("0 at every stage here, not drawn: " + ", ".join(zero_items) + ".")
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), ha="left", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    plt.close(fig)  # out of pyplot's list of open figures: the caller saves it or shows it
    return fig


def search_panels(result: dict, shown: int = 10) -> list[tuple[str, dict[int, int], list[str]]]:
    """The `shown` families that reach furthest (family, {nodes: longest sequence}, the other shown families
    whose curve is the same), in the order they are drawn."""
    fams = sorted(result["families"].items(), key=lambda kv: -max(kv[1].values(), default=0))[:shown]
    curves = {fam: {int(n): v for n, v in row.items()} for fam, row in fams}
    return [
        (fam, curve, [other for other, c in curves.items() if other != fam and c == curve])
        for fam, curve in curves.items()
    ]


def plot_search(result: dict, path: str) -> None:
    """Longest sequence against nodes for the ten families that reach furthest, one small panel each (the
    family in colour, the others grey behind it), so that families with the same curve are all seen; a
    panel says which others it equals."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator

    panels = search_panels(result)
    cols = min(5, max(1, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.0 * cols + 0.5, 2.7 * rows + 1.2), sharex=True, sharey=True, squeeze=False
    )
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        fam, curve, same = panels[i]
        for other, c, _ in panels:  # the other families, grey, for scale
            xs = sorted(c)
            ax.plot(xs, [max(c[x], 1) for x in xs], color="0.82", lw=0.9, zorder=1, label="_context")
        xs = sorted(curve)
        ax.plot(xs, [max(curve[x], 1) for x in xs], color=f"C{i % 10}", lw=2, marker="o", ms=2.5, zorder=3, label=fam)
        same_as = textwrap.fill("same curve as: " + "; ".join(same), 44) if same else ""
        ax.set_title(fam + ("\n" + same_as if same else ""), fontsize=7.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="major", lw=0.4, color="0.9")
        ax.tick_params(labelsize=7)
    ax0 = axes.flat[0]
    ax0.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax0.yaxis.set_major_locator(LogLocator(base=10))
    ax0.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tokens_text(v)))
    for ax in axes[-1]:
        ax.set_xlabel("nodes", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("longest sequence\n(tokens; K = 1,000)", fontsize=8)
    fig.suptitle(
        f"{result['model']}: the longest sequence that fits, per layout family "
        f"({result['usable']:g} {result.get('unit', 'GB')} usable per GPU)",
        fontsize=10,
    )
    fig.legend(
        [Line2D([], [], color="C0", lw=2, marker="o", ms=3), Line2D([], [], color="0.82", lw=0.9)],
        [
            "the panel's family (named above the panel, with any family whose curve is the same)",
            "the other families, for scale",
        ],
        loc="lower center",
        ncol=2,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, -0.01),
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    save(fig, path)
    plt.close(fig)

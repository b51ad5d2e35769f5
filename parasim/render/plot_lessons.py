"""Pictures of lessons whose figures are shapes: the three zero-bubble schedules on one clock
(`parasim lesson pp-zero-bubble --plot`), causal attention's blocks under the contiguous and zigzag splits
(`parasim lesson cp-causal --plot`), the hot expert's compute per GPU, ZeRO's stages (what a rank holds by kind
and what it sends) and the rules of thumb broken and kept. Everything drawn is read from the run: its values,
its trace's holds and sends, or the lesson's own study of it."""

from __future__ import annotations

from typing import Any

from ..comm.trace_schema import HELD_KINDS
from .plot_base import pyplot, save
from .plots import draw_slots


def plot_zero_bubble(lr: Any, path: str) -> None:
    """1F1B, ZB-H1 and DualPipeV one above the other on the same time axis (half-stage slots), each titled
    with its makespan and bubble as the run measured them."""
    plt = pyplot()
    vals = lr.result.values
    titles = list(vals[0])  # the schedules, in the order the lesson ran them
    width = max(vals[0][t]["makespan"] for t in titles)
    ranks = len(vals)
    fig, axes = plt.subplots(
        len(titles), 1, figsize=(max(8.0, 0.3 * width + 2), (0.45 * ranks + 1.1) * len(titles) + 0.8), squeeze=False
    )
    for i, (ax, t) in enumerate(zip(axes[:, 0], titles)):
        run = vals[0][t]
        last = i == len(titles) - 1
        draw_slots(
            ax,
            [x[t]["slots"] for x in vals],
            width,
            f"{t}: makespan {run['makespan']} slots, bubble {run['bubble']}",
            key=last,
            fontsize=9.5,  # readable at the picture's own size, where a one-slot box is 0.3 inch wide
            xlabel=last,  # one clock for all three: named once, under the last
        )
        ax.tick_params(axis="x", labelsize=8)  # each panel numbered slot by slot, to read a time off any
    fig.suptitle(
        f"{ranks} GPUs, {lr.result.trace.meta.get('knobs', {}).get('m', '')} micro-batches: W fills the "
        "holes 1F1B leaves",
        fontsize=11,
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def plot_cp_causal(lr: Any, path: str) -> None:
    """For each split, the causal block grid (query pieces down, key pieces across, the sequence cut in 2cp):
    a block coloured by the CP rank whose queries compute it, the diagonal's masked half and the future left
    white; each rank's total, as the run counted it, in the key."""
    plt = pyplot()
    from matplotlib.patches import Polygon, Rectangle

    vals = lr.result.values
    t = len(vals)
    n = 2 * t
    splits = [s for s in vals[0] if isinstance(vals[0][s], dict) and "pieces" in vals[0][s]]
    fig, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 4.6), squeeze=False)
    for ax, split in zip(axes[0], splits):
        owner = {p: r for r, x in enumerate(vals) for p in x[split]["pieces"]}
        for q in range(n):
            colour = f"C{owner[q]}"
            y = n - 1 - q
            for k in range(q):
                ax.add_patch(Rectangle((k, y), 1, 1, color=colour, ec="white"))
            ax.add_patch(Polygon([(q, y), (q, y + 1), (q + 1, y)], closed=True, color=colour, ec="white"))
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([k + 0.5 for k in range(n)], [f"k{k + 1}" for k in range(n)], fontsize=7)
        ax.set_yticks([n - 0.5 - q for q in range(n)], [f"q{q + 1}" for q in range(n)], fontsize=7)
        ax.set_title(f"{split}: blocks per rank " + ", ".join(f"{x[split]['blocks']:g}" for x in vals), fontsize=9)
        ax.set_xlabel("key pieces")
        ax.set_ylabel("query pieces")
    handles = [Rectangle((0, 0), 1, 1, color=f"C{r}", label=f"CP rank {r} (GPU {r + 1})") for r in range(t)]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, t), fontsize=8, frameon=False)
    fig.suptitle(
        f"Causal attention over {t} CP ranks: each block is one piece's queries against one piece's keys "
        "(a half block on the diagonal; the future is masked)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    save(fig, path)
    plt.close(fig)


def plot_hot_expert(lr: Any, path: str) -> None:
    """A panel per routing and EP size: each GPU's expert compute on the clock, the busiest GPU's bar marked and
    the mean dashed (the gap between them is what every other GPU waits), and the layer's time on the clock as
    a solid line over the bars (compute, the wait and the all-to-alls: balanced routing's line stands above
    uniform's at EP 8 though nobody waits). All from the lesson's own study of its run."""
    plt = pyplot()
    rows = lr.lesson.study(lr.result)["rows"]
    names = list(rows)  # "ROUTING routing, EP N", in the lesson's order
    eps = list(dict.fromkeys(n.rsplit("EP ", 1)[1] for n in names))
    routings = list(dict.fromkeys(n.split(" routing")[0] for n in names))
    fig, axes = plt.subplots(
        len(eps), len(routings), figsize=(3.6 * len(routings), 2.6 * len(eps) + 1.0), sharey=True, squeeze=False
    )
    top = max(r["time"] for r in rows.values()) * 1e3
    for i, ep in enumerate(eps):
        for j, routing in enumerate(routings):
            ax, r = axes[i][j], rows[f"{routing} routing, EP {ep}"]
            ms = [c * 1e3 for c in r["compute"]]
            mean = sum(ms) / len(ms)
            layer = r["time"] * 1e3
            colours = ["tab:red" if g == r["busiest"] else "tab:blue" for g in range(len(ms))]
            ax.bar(range(len(ms)), ms, color=colours)
            ax.axhline(mean, color="0.3", ls="--", lw=1)
            ax.axhline(layer, color="black", lw=1.6)
            ax.text(-0.45, layer + 0.02 * top, f"layer {layer:.2f} ms", fontsize=7, va="bottom", ha="left")
            ax.set_ylim(0, top * 1.16)
            ax.set_xticks(range(len(ms)), [f"g{g}" for g in range(len(ms))], fontsize=7)
            ax.set_title(f"{routing}, EP {ep}: others wait {max(ms) - mean:.2f} ms", fontsize=8.5)
            if j == 0:
                ax.set_ylabel("ms on the clock", fontsize=8)
            if i == len(eps) - 1:
                ax.set_xlabel("GPU", fontsize=8)
            ax.tick_params(labelsize=7)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig.legend(
        handles=[
            Patch(color="tab:red", label="the busiest GPU's expert compute: the layer waits for it"),
            Patch(color="tab:blue", label="the other GPUs' compute"),
            Line2D([], [], color="0.3", ls="--", label="the mean compute"),
            Line2D([], [], color="black", lw=1.6, label="the layer: compute, waiting and the all-to-alls"),
        ],
        loc="lower center",
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        "One MoE layer on the clock: each GPU's expert compute and the layer's time, by routing and EP size\n"
        "balanced: each token's picks dealt round-robin over every GPU of its EP group (an even load, but every "
        "token sent to every GPU)",
        fontsize=9.5,
    )
    fig.tight_layout(rect=(0, 0.09, 1, 0.95))
    save(fig, path)
    plt.close(fig)


def plot_zero_stages(lr: Any, path: str) -> None:
    """Left: what rank 0 holds at its peak in each stage, stacked by kind (the trace's holds); right: the bytes
    it sends in each stage (the lesson's figures)."""
    plt = pyplot()
    trace, figs = lr.result.trace, lr.lesson.figures(lr.result)
    stages = [p for p in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3") if f"{p}: bytes a rank sends" in figs]
    fig, (held, sent) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(stages)
    for kind in HELD_KINDS:
        values = [trace.peak(0, p)["by_kind"].get(kind, 0) / 1e3 for p in stages]
        if any(values):
            held.bar(stages, values, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
    for x, total in enumerate(bottom):  # each bar's total above it
        held.text(x, total, f"{total:.2f} kB", ha="center", va="bottom", fontsize=8)
    # headroom above the tallest bar for its label: a zero-height bar stacked on top (a kind another stage
    # holds) pins autoscaling at the bar's top and would clip it there
    held.set_ylim(0, max(bottom) * 1.15)
    held.set_ylabel("kB rank 0 holds at its peak")
    held.set_title(f"What a rank holds, by kind ({trace.world} ranks)", fontsize=10)
    held.legend(fontsize=8, loc="upper right")
    values = [figs[f"{p}: bytes a rank sends"] / 1e3 for p in stages]
    sent.bar(stages, values, color="tab:gray")
    for x, v in enumerate(values):
        sent.text(x, v, f"{v / values[0]:g}x DP", ha="center", va="bottom", fontsize=8)
    sent.set_ylim(0, max(values) * 1.15)
    sent.set_ylabel("kB rank 0 sends in one step")
    sent.set_title("What a rank sends: ZeRO-3 gathers the weights twice", fontsize=10)
    fig.suptitle("DP and ZeRO's three stages, one Adam step each, measured in the run", fontsize=11)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def plot_broken_kept(pairs: dict[str, tuple[dict, dict]], title: str, path: str) -> None:
    """Each rule of thumb's two runs side by side, the rule broken and kept (`pairs`: rule -> the two runs'
    figures, as the rules-of-thumb lesson measures them): bytes across nodes (all GPUs), GPU 0's memory and its
    time."""
    plt = pyplot()
    names = list(pairs)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("across", "GB sent across nodes (all GPUs)", 1e9),
        ("memory", "GB GPU 0 keeps (state + activations)", 1e9),
        ("ms", "ms of GPU 0 on the clock", 1),
    )
    for ax, (key, unit, scale) in zip(axes, panels):
        for k, (colour, said) in enumerate((("tab:red", "rule broken"), ("tab:green", "rule kept"))):
            runs = [pairs[n][k] for n in names]
            values = [(f["state"] + f["activations"]) if key == "memory" else f[key] for f in runs]
            ax.barh(
                [y + (-0.2 if k == 0 else 0.2) for y in range(len(names))],  # broken above kept, as the key
                [v / scale for v in values],
                height=0.4,
                color=colour,
                label=said,
            )
        ax.set_yticks(list(range(len(names))), names if ax is axes[0] else [""] * len(names))
        ax.invert_yaxis()
        ax.set_xlabel(unit)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)  # under the panels, off every bar
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save(fig, path)
    plt.close(fig)


def plot_head_split(lr: Any, path: str) -> None:
    """A panel per attention (all heads their own K and V, then grouped-query): a row per TP rank, a column per
    Q, K and V head, a cell filled where the rank holds that head's weights (the run found them in the weights
    themselves); a K/V head held by several ranks is a replicated one."""
    plt = pyplot()
    vals = lr.result.values
    kinds = [k for k in ("mha", "gqa") if k in vals[0]]
    titles = {"mha": "every head its own K and V", "gqa": "grouped-query: K and V heads shared"}
    colours = {"q": "tab:blue", "k": "tab:orange", "v": "tab:green"}
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 1.1 + 0.55 * len(vals)), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        held = [v[kind]["held"] for v in vals]
        widths = {p: max(max(h[p], default=-1) for h in held) + 1 for p in ("q", "k", "v")}
        x0, ticks, labels = 0.0, [], []
        for part in ("q", "k", "v"):
            for head in range(widths[part]):
                owners = [r for r, h in enumerate(held) if head in h[part]]
                for r in owners:
                    ax.add_patch(plt.Rectangle((x0 + head, r), 0.9, 0.9, color=colours[part]))
                ticks.append(x0 + head + 0.45)
                labels.append(f"{part.upper()}{head + 1}" + ("\n" + f"x{len(owners)}" if len(owners) > 1 else ""))
            x0 += widths[part] + 0.6
        ax.set_xlim(-0.2, x0 - 0.4)
        ax.set_ylim(len(vals) + 0.1, -0.2)
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set_yticks([r + 0.45 for r in range(len(vals))], [f"TP rank {r}" for r in range(len(vals))], fontsize=8)
        ax.set_title(titles[kind], fontsize=10)
        ax.set_frame_on(False)
    fig.suptitle(
        f"Which heads' weights each of {len(vals)} TP ranks holds (xN: a K/V head held by N ranks)", fontsize=10
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)

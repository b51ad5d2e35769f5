"""The slot table as a picture (matplotlib, no display needed)."""
from __future__ import annotations

from .timing import Timing

COLOURS = {"F": "#4c9be8", "B": "#d264b6", "I": "#d264b6", "W": "#e8b04c"}


def plot_slots(timing: Timing, title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks, width = len(timing.slots), timing.makespan
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * width + 1.5), 0.55 * ranks + 1.2))
    for r, row in enumerate(timing.slots):
        t = 0
        while t < width:  # an action spans as many slots as it costs: one box per action
            label, end = row[t], t + 1
            while end < width and label and row[end] == label:
                end += 1
            if label:
                colour = COLOURS[label[0].upper()]
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
    fig.savefig(path, dpi=120)
    plt.close(fig)

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
        for t, label in enumerate(row):
            if label:
                ax.add_patch(plt.Rectangle((t, ranks - 1 - r), 1, 1, color=COLOURS[label[0]], ec="white"))
                ax.text(t + 0.5, ranks - 0.5 - r, label, ha="center", va="center", fontsize=8, color="white")
    ax.set_xlim(0, width)
    ax.set_ylim(0, ranks)
    ax.set_yticks([ranks - 0.5 - r for r in range(ranks)], [f"GPU {r + 1}" for r in range(ranks)])
    ax.set_xticks([t + 0.5 for t in range(width)], [str(t + 1) for t in range(width)], fontsize=7)
    ax.set_title(f"{title}: bubble {timing.bubble} ({float(timing.bubble):.0%})")
    ax.set_frame_on(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Ring attention's K/V rotation as a picture (`parasim lesson ring-attention --plot FILE`): which chunk of
keys and values each CP rank holds at each step, and the hand-off that moves it to the next rank, all read
from the lesson's run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .plot_base import pyplot, save


@dataclass(frozen=True)
class RingRun:
    """What the picture needs from a run: held[i][s], the CP rank whose K/V chunk rank i holds at step s
    (0-based, and drawn so: step 0 is each rank's own chunk, as the lesson's table numbers it); pos[i], the sequence positions rank i owns (0-based); the bytes one hand-off sends, per
    tensor (K, then V), from the run's point-to-point events."""

    held: list[list[int]]
    pos: list[list[int]]
    sent: list[int]


def ring_run(lr: Any) -> RingRun:
    """The ring lesson's run: each rank's `held` and `pos` values, and the bytes of the forward hand-offs
    (the point-to-point calls of the first phase that makes any)."""
    values = lr.result.values
    p2p = [e for e in lr.result.trace.events if e.kind == "p2p"]
    first = [e for e in p2p if e.phase == p2p[0].phase] if p2p else []
    # one hand-off is a K call and a V call from the same rank at the same step
    per_pass: dict[tuple[int, int, int], list[int]] = {}
    for e in first:
        per_pass.setdefault((e.step, e.params["src"], e.params["dst"]), []).append(e.member(e.params["src"]).sent)
    sent = next(iter(per_pass.values()), [])
    return RingRun([list(v["held"]) for v in values], [list(v["pos"]) for v in values], sent)


def token_runs(positions: list[int]) -> str:
    """Positions (0-based) as the learner counts tokens: t1-t2 t7-t8."""
    out, ps = [], sorted(positions)
    if not ps:
        return ""
    start = prev = ps[0]
    for p in ps[1:] + [None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(f"t{start + 1}" if start == prev else f"t{start + 1}\u2013t{prev + 1}")
        if p is not None:
            start = prev = p
    return " ".join(out)


def plot_ring(run: RingRun, title: str, path: str) -> None:
    """One row per CP rank, one column per step: the K/V chunk the rank attends to at that step (coloured
    by the rank whose tokens it holds), and an arrow for every hand-off to the next step's holder."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t, steps = len(run.held), len(run.held[0]) if run.held else 0
    palette = plt.get_cmap("Pastel1" if t <= 9 else "tab20")
    dark = plt.get_cmap("Set1" if t <= 9 else "tab20")
    col_w, row_h, box_w, box_h = 2.2, 1.0, 1.5, 0.72  # a step's column leaves room for the arrows
    fig, ax = plt.subplots(figsize=(1.6 + col_w * steps * 1.05, 1.4 + row_h * t * 0.75))

    def centre(rank: int, step: int) -> tuple[float, float]:
        return step * col_w + box_w / 2, (t - 1 - rank) * row_h + box_h / 2

    for i in range(t):
        for s in range(steps):
            owner = run.held[i][s]
            x, y = centre(i, s)
            box = plt.Rectangle(
                (x - box_w / 2, y - box_h / 2),
                box_w,
                box_h,
                facecolor=palette(owner % palette.N),
                edgecolor="0.4",
                lw=0.8,
                zorder=2,
            )
            box.set_gid(f"chunk rank {i} step {s} holds {owner}")
            ax.add_patch(box)
            ax.text(
                x,
                y,
                f"K/V of {token_runs(run.pos[owner])}\n(rank {owner}'s" + (", its own)" if owner == i else ")"),
                ha="center",
                va="center",
                fontsize=7.5,
                zorder=3,
                fontweight="bold" if owner == i else "normal",
            )
        ax.text(
            -0.25,
            centre(i, 0)[1],
            f"CP rank {i} (GPU {i + 1})\nqueries {token_runs(run.pos[i])}",
            ha="right",
            va="center",
            fontsize=8,
        )
    for s in range(steps):  # numbered from 0, as the lesson's table and the post number them
        said = f"step {s}" + (" (own chunk)" if s == 0 else "")
        ax.text(centre(0, s)[0], t * row_h - 0.05, said, ha="center", va="bottom", fontsize=8.5)
    for s in range(steps - 1):  # each chunk to whoever holds it next step
        for i in range(t):
            owner = run.held[i][s]
            nxt = next((k for k in range(t) if run.held[k][s + 1] == owner), None)
            if nxt is None:
                continue
            (x0, y0), (x1, y1) = centre(i, s), centre(nxt, s + 1)
            arrow = ax.annotate(
                "",
                xy=(x1 - box_w / 2, y1),
                xytext=(x0 + box_w / 2, y0),
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": dark(owner % dark.N),
                    "lw": 1.4,
                    "shrinkA": 1,
                    "shrinkB": 1,
                    "mutation_scale": 10,
                },
            )
            arrow.set_gid(f"pass step {s} rank {i} -> rank {nxt} chunk {owner}")
    ax.set_xlim(-0.2, steps * col_w - (col_w - box_w) + 0.1)
    ax.set_ylim(-0.15, t * row_h + 0.35)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    sent = " + ".join(f"{b:,} B" for b in run.sent) if run.sent else "see the trace"
    handles = [Patch(facecolor=palette(0), edgecolor="0.4"), Line2D([], [], color=dark(0), lw=1.4, marker=">", ms=4)]
    labels = [
        "the K/V chunk a rank attends its queries to at that step (colour: whose tokens; bold: its own)",
        f"a hand-off: the chunk moves to the next rank for the next step (K + V: {sent} per arrow, from the run)",
    ]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), fontsize=7.5, frameon=False)
    fig.text(
        0.5,
        0.0,
        f"After step {steps - 1} every rank's queries have met every key; only K and V move. Backward "
        "sends the chunks round again, each gathering its dK/dV,\nand one last hop brings every dK/dV home.",
        ha="center",
        va="top",
        fontsize=7.5,
        color="0.25",
    )
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def plot_ring_lesson(lr: Any, path: str) -> None:
    run = ring_run(lr)
    plot_ring(run, f"Ring attention on {len(run.held)} CP ranks: the K/V chunks go round, the queries stay", path)

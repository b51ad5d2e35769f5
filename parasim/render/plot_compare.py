"""`parasim compare --plot`: the figures that change with the setting, one small panel each, a bar per setting.
Only numbers are drawn (a figure in words, such as where a token lives, stays in the table); a fraction
('3/7') is drawn at its value."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ..figures import differing
from .compare import setting_label
from .plot_base import pyplot, save

COLUMNS = 3  # panels a row


def number(value: Any) -> float | None:
    """A figure as a bar's height: ints, floats, fractions written as 'a/b'; None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(Fraction(value))
        except (ValueError, ZeroDivisionError):
            return None
    return None


def plotted(rows: list[dict]) -> list[str]:
    """The changing figures that every run gives as a number: the panels, in the table's order."""
    return [n for n in differing(rows) if all(number(r["figures"].get(n)) is not None for r in rows)]


def plot_compare(name: str, rows: list[dict], flags: dict[str, str], path: str) -> None:
    """Draw the changing numeric figures of `rows` (compare's runs) into `path`."""
    names = plotted(rows)
    plt = pyplot()
    cols = max(1, min(COLUMNS, len(names)))
    lines = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(lines, cols, figsize=(4.2 * cols, 3.0 * lines + 0.6), squeeze=False)
    labels = [setting_label(r["settings"], flags).replace("\n", " ") for r in rows]
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_visible(False)
            continue
        heights = [number(r["figures"][names[k]]) for r in rows]
        bars = ax.bar(range(len(rows)), heights, color="tab:blue")
        ax.bar_label(bars, labels=[_short(h) for h in heights], fontsize=8)
        ax.set_xticks(range(len(rows)), labels, fontsize=8, rotation=20 if len(rows) > 3 else 0)
        ax.set_title(_wrap(names[k]), fontsize=9)
        ax.set_ylabel("bytes" if "bytes" in names[k] else "", fontsize=8)
        ax.margins(y=0.18)
    if not names:
        axes.flat[0].set_visible(True)
        axes.flat[0].axis("off")
        axes.flat[0].text(
            0.5, 0.5, "no figure that is a number changes between these settings", ha="center", va="center"
        )
    fig.suptitle(f"{name}: what changes between {len(rows)} settings (every figure from a run)", fontsize=11)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def _short(v: float) -> str:
    """A bar's label: 1.2M, 45K, 0.43."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= size:
            return f"{v / size:.3g}{suffix}"
    return f"{v:.3g}"


def _wrap(text: str, width: int = 40) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text

"""The lessons that draw a picture of their run (`parasim lesson NAME --plot FILE.png`): lesson -> its picture.
Each function takes the lesson's run and the file to write;
the words say what it shows (`parasim lesson --help` lists them)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .plot_lessons import plot_cp_causal, plot_hot_expert, plot_zero_bubble
from .plot_moves import plot_dispatch, plot_handoff
from .plot_ring import plot_ring_lesson

LESSON_PLOTS: dict[str, tuple[Callable[[Any, str], None], str]] = {  # lesson -> (its picture, what it shows)
    "ring-attention": (plot_ring_lesson, "which K/V chunk each CP rank holds at each step"),
    "moe16": (plot_dispatch, "the followed token's dispatch and combine, layer by layer"),
    "pp-gpipe": (plot_handoff, "the hand-off between stages, slot by slot"),
    "pp-1f1b": (plot_handoff, "the hand-off between stages, slot by slot"),
    "pp-interleaved": (plot_handoff, "the hand-off between stages, slot by slot"),
    "pp-zero-bubble": (plot_zero_bubble, "the three schedules on one clock, each with its makespan and bubble"),
    "cp-causal": (plot_cp_causal, "the causal blocks each CP rank computes, contiguous and zigzag"),
    "hot-expert": (plot_hot_expert, "each GPU's expert compute by routing and EP size, the busiest marked"),
}


def plots_help() -> str:
    """What `--plot` draws for each lesson that has a picture, for the command's help (lessons that draw the
    same picture named together)."""
    by_what: dict[str, list[str]] = {}
    for name, (_, what) in LESSON_PLOTS.items():
        by_what.setdefault(what, []).append(name)
    return "; ".join(f"{', '.join(names)}: {what}" for what, names in by_what.items())

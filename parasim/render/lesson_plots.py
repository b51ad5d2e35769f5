"""The lessons that draw a picture of their run (`parasim lesson NAME --plot FILE.png`): lesson -> its picture.
Each function takes the lesson's run and the file to write."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .plot_moves import plot_dispatch, plot_handoff
from .plot_ring import plot_ring_lesson

LESSON_PLOTS: dict[str, Callable[[Any, str], None]] = {
    "ring-attention": plot_ring_lesson,  # which K/V chunk each CP rank holds at each step
    "moe16": plot_dispatch,  # the followed token's dispatch and combine, layer by layer
    "pp-gpipe": plot_handoff,  # stages by slots, every send between them
    "pp-1f1b": plot_handoff,
    "pp-interleaved": plot_handoff,
}

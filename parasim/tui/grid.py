"""What a cell of the timeline shows: each kind of event's glyph, style and colour (every collective's from the
op table), the idle cell, which kind a rank's part in an event is, and the ruler of step numbers over the
columns. Plain Python: the timeline widget (timeline.py), the legend and the view model read it."""

from __future__ import annotations

from ..comm.ops import OPS
from ..comm.trace import Event

# cell text, style name and colour per kind of event: every collective's from the op table, then the rest
STYLES: dict[str, tuple[str, str, str]] = {name: (op.glyph, op.title, op.colour) for name, op in OPS.items()}
STYLES.update({"send": ("S>", "send", "green"), "recv": (">R", "recv", "lime"), "compute": ("CO", "compute", "grey")})
CELLS = {kind: (glyph, title) for kind, (glyph, title, _) in STYLES.items()}
COLOURS = {title: colour for _, title, colour in STYLES.values()}
IDLE = ("··", "idle")


def ruler(first: int, last: int, cell_w: int, selected: int | None) -> tuple[str, tuple[int, int] | None]:
    """The step numbers over the grid's columns `first`..`last - 1` (logical steps, from 1), `cell_w`
    characters a column: step 1 and every fifth step written from the left edge of its column, and the
    selected step's number over its column (numbers it would touch left out). A number that the window would
    cut is left out: its tail alone would read as another number. Returns the text and the selected number's
    span in it (None: not in this window)."""
    width = (last - first) * cell_w
    chars = [" "] * width
    span = None
    if selected is not None and first <= selected < last:
        at = (selected - first) * cell_w
        span = (at, at + len(str(selected)))
    for step in [s for s in range(first, last) if s == 1 or s % 5 == 0] + ([selected] if span else []):
        at = (step - first) * cell_w
        end = at + len(str(step))
        if end > width or (step != selected and span is not None and at <= span[1] and end >= span[0]):
            continue  # cut by the window's edge, or touching the selected number: a space must part them
        chars[at:end] = str(step)
    return "".join(chars), (span if span is not None and span[1] <= width else None)


def kind_of(e: Event, rank: int) -> str:
    if e.kind == "p2p":
        return "send" if e.members[0].rank == rank else "recv"
    return "compute" if e.kind == "compute" else e.op

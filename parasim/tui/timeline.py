"""The rank x step grid, drawn with Textual's line API: only visible cells are built, so long traces scroll."""
from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .view import COLOURS, IDLE, KINDS, View

LABEL_W, CELL_W = 8, 3
STYLES = sorted({s for _, s in KINDS.values()} | {IDLE[1]})


class Timeline(ScrollView, can_focus=True, inherit_bindings=False):
    """Ranks as rows, logical steps as columns; the selected event's cells are highlighted."""

    # each kind's colour comes from the op table (view.COLOURS); the rest of the look is in parasim.tcss
    DEFAULT_CSS = "\n".join(f"Timeline > .timeline--{title} {{ color: {colour}; }}" for title, colour in COLOURS.items())
    COMPONENT_CLASSES = {f"timeline--{s}" for s in STYLES} | {"timeline--selected", "timeline--label",
                                                                "timeline--header", "timeline--column",
                                                                "timeline--watch", "timeline--diverged"}

    class Selected(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, view: View, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = view
        self.index = 0
        self.watch_rank: int | None = None  # the rank holding a followed token, its label drawn apart
        self._taking: set[int] | None = None  # the selected event's ranks
        self.resize_rows()

    def resize_rows(self) -> None:
        self.virtual_size = Size(LABEL_W + self.view.columns * CELL_W, len(self.view.rows) + 1)
        self.refresh(layout=True)

    def select(self, index: int, watch_rank: int | None = None) -> None:
        self.index, self.watch_rank = index, watch_rank
        self._taking = set(self.view.events[index].ranks) if self.view.events else None  # asked by every row
        if self.view.events:
            step = self.view.events[index].step
            self.scroll_to_region(Region(LABEL_W + (step - 1) * CELL_W, 0, CELL_W, 1), animate=False, force=True)
        self.refresh()

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"timeline--{name}")

    def render_line(self, y: int) -> Strip:
        sx, sy = self.scroll_offset
        row = y + sy
        width = self.size.width
        first = sx // CELL_W
        last = min(self.view.columns, (sx + width) // CELL_W + 2)
        events = self.view.events
        sel = events[self.index] if events else None
        if row == 0:
            label = Segment("step".ljust(LABEL_W), self._style("header"))
            cells = [Segment(f"{c + 1:<{CELL_W}}" if (c + 1) % 5 == 0 or c == 0 else " " * CELL_W,
                             self._style("column" if sel is not None and sel.step == c + 1 else "header"))
                     for c in range(first, last)]
        elif row - 1 < len(self.view.rows):
            name, ranks = self.view.rows[row - 1]
            if self._taking is None and sel is not None:
                self._taking = set(sel.ranks)
            taking = self._taking or set()
            mine = sel is not None and not taking.isdisjoint(ranks)
            style = self._style("selected" if mine else "label")
            if self.watch_rank in ranks:
                style = style + self._style("watch")
            label = Segment(name[:LABEL_W - 1].ljust(LABEL_W), style)
            cells = []
            for c in range(first, last):
                text, style = self.view.row_cell(row - 1, c + 1)
                st = self._style(style)
                if sel is not None and sel.step == c + 1 and mine:
                    st = st + self._style("selected")
                if self.view.diverged_at(row - 1, c + 1):
                    st = st + self._style("diverged")
                cells.append(Segment(text.ljust(CELL_W), st))
        else:
            return Strip.blank(width, self.rich_style)
        body = Strip(cells).crop(sx - first * CELL_W, sx - first * CELL_W + max(0, width - LABEL_W))
        return Strip.join([Strip([label], LABEL_W), body]).adjust_cell_length(width, self.rich_style)

    def on_click(self, event) -> None:
        col = (event.x + self.scroll_offset.x - LABEL_W) // CELL_W + 1
        row = event.y + self.scroll_offset.y - 1
        if event.x >= LABEL_W and 0 <= row < len(self.view.rows):
            for rank in self.view.rows[row][1]:
                index = self.view.at(rank, col)
                if index is not None:
                    self.post_message(self.Selected(index))
                    return

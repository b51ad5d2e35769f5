"""The rank x step grid, drawn with Textual's line API: only visible cells are built, so long traces scroll."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .grid import COLOURS, IDLE, CELLS, ruler
from .view import View

LABEL_W, CELL_W = 8, 3
STYLES = sorted({s for _, s in CELLS.values()} | {IDLE[1]})


class Timeline(ScrollView, can_focus=True, inherit_bindings=False):
    """Ranks as rows, logical steps as columns; the selected event's cells are highlighted."""

    # each kind's colour comes from the op table (view.COLOURS); the rest of the look is in parasim.tcss
    DEFAULT_CSS = "\n".join(
        f"Timeline > .timeline--{title} {{ color: {colour}; }}" for title, colour in COLOURS.items()
    )
    COMPONENT_CLASSES = {f"timeline--{s}" for s in STYLES} | {
        "timeline--selected",
        "timeline--label",
        "timeline--header",
        "timeline--column",
        "timeline--watch",
        "timeline--diverged",
        "timeline--critical",
    }

    class Selected(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    index: var[int] = var(0, init=False, always_update=True)  # bound to the app's: the selected event
    revision: var[int] = var(0, init=False)  # bound to the app's: rows folded, filter changed

    def __init__(self, view: View, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = view
        self._taking: set[int] | None = None  # the selected event's ranks
        self._watch_rank: int | None = None  # the rank holding a followed token (its row label drawn apart)
        self._lines: LRUCache[tuple, Strip] = LRUCache(1024)  # rows' lines drawn, by what they depend on
        self.resize_rows()

    def resize_rows(self) -> None:
        # one spare column: the body's window is the widget less the label gutter, so a scroll that brings the
        # last column fully into view may go up to a cell past the grid
        self.virtual_size = Size(LABEL_W + (self.view.columns + 1) * CELL_W, len(self.view.rows) + 1)
        self.refresh(layout=True)

    def watch_index(self) -> None:
        self._taking = set(self.view.events[self.index].ranks) if self.view.events else None
        watch = self.view.watch(self.index)
        self._watch_rank = watch.rank if watch else None
        self.follow()
        self.refresh()

    def watch_revision(self) -> None:
        self._lines.clear()  # rows folded or unfolded
        self.resize_rows()
        self.follow()

    def on_resize(self) -> None:
        self.follow()

    def _window(self) -> tuple[int, int, int]:
        """(first column shown, columns that fit, first row shown), from the scroll offset. The column scroll is
        taken down to a whole cell, so every column starts under its ruler number and no half cell shows."""
        view = self.scrollable_content_region
        return (self.scroll_offset.x // CELL_W, max(1, (view.width - LABEL_W) // CELL_W), self.scroll_offset.y)

    def follow(self) -> None:
        """Scroll so the selected event's column and its first rank's row are in view."""
        region = self.scrollable_content_region
        if not self.view.events or region.width <= LABEL_W or region.height < 2:
            return  # not laid out yet: on_resize follows once it is
        e = self.view.events[self.index]
        first, fit, top = self._window()
        column = self.view.column_of(self.index)
        if column < first:
            first = column
        elif column >= first + fit:
            first = column - fit + 1
        taking = set(e.ranks)
        rows = [k for k, (_, ranks) in enumerate(self.view.rows) if not taking.isdisjoint(ranks)]
        shown = region.height - 1  # the ruler's line stays on top
        if rows and rows[0] < top:
            top = rows[0]
        elif rows and rows[-1] >= top + shown:  # bring the last into view, unless that hides the first
            top = min(rows[0], rows[-1] - shown + 1)
        self.scroll_to(x=first * CELL_W, y=top, animate=False, force=True, immediate=True)

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"timeline--{name}")

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        first, _, top = self._window()
        last = min(self.view.columns, first + max(0, width - LABEL_W) // CELL_W + 1)
        events = self.view.events
        sel = events[self.index] if events else None
        if y == 0 and self.view.time_mode:  # times over the columns, in the unit the gutter names
            head = self._style("header")
            cells = [Segment(self.view.clock.ruler(first, last, CELL_W), head)]
            label = Segment(self.view.clock.unit()[1].ljust(LABEL_W), head)
        elif y == 0:  # the ruler: always on top, over the columns shown
            text, span = ruler(first + 1, last + 1, CELL_W, sel.step if sel is not None else None)
            head = self._style("header")
            if span is None:
                cells = [Segment(text, head)]
            else:
                cells = [
                    Segment(text[: span[0]], head),
                    Segment(text[span[0] : span[1]], self._style("column")),
                    Segment(text[span[1] :], head),
                ]
            label = Segment("step".ljust(LABEL_W), head)
        elif y - 1 + top < len(self.view.rows):
            row = y - 1 + top
            name, ranks = self.view.rows[row]
            if self._taking is None and sel is not None:
                self._taking = set(sel.ranks)
            taking = self._taking or set()
            mine = sel is not None and not taking.isdisjoint(ranks)
            watched = self._watch_rank is not None and self._watch_rank in ranks
            time = self.view.time_mode
            key = (row, first, last, width, sel.step if mine else None, mine, watched, time, self.index if time else 0)
            cached = self._lines.get(key)
            if cached is not None:  # a row's line changes only when the selection comes or goes
                return cached
            style = self._style("selected" if mine else "label")
            if watched:
                style = style + self._style("watch")
            label = Segment(name[: LABEL_W - 1].ljust(LABEL_W), style)
            cells = []
            for c in range(first, last) if time else ():  # on the clock: the selected event's cells, the path
                text, style, critical, index = self.view.time_cell(row, c + 1)
                st = self._style(style)
                if critical:
                    st = st + self._style("critical")
                if index is not None and index == self.index:
                    st = st + self._style("selected")
                cells.append(Segment(text.ljust(CELL_W), st))
            for c in range(first, last) if not time else ():
                text, style = self.view.row_cell(row, c + 1)
                st = self._style(style)
                if sel is not None and sel.step == c + 1 and mine:
                    st = st + self._style("selected")
                if self.view.diverged_at(row, c + 1):
                    st = st + self._style("diverged")
                cells.append(Segment(text.ljust(CELL_W), st))
        else:
            return Strip.blank(width, self.rich_style)
        body = Strip(cells).crop(0, max(0, width - LABEL_W))
        line = Strip.join([Strip([label], LABEL_W), body]).adjust_cell_length(width, self.rich_style)
        if y > 0:
            self._lines[key] = line
        return line

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._lines.clear()  # a new theme: every line's colours change

    def on_click(self, event: Click) -> None:
        at = event.get_content_offset(self)
        if at is None or at.y == 0 or at.x < LABEL_W:
            return  # the ruler or a row's label
        first, _, top = self._window()
        col = (at.x - LABEL_W) // CELL_W + first + 1
        row = at.y - 1 + top
        if 0 <= row < len(self.view.rows):
            for rank in self.view.rows[row][1]:
                index = self.view.at(rank, col)
                if index is not None:
                    self.post_message(self.Selected(index))
                    return

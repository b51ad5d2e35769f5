"""The timeline in microseconds: the clock's spans (parasim/clock) of every GPU cut into columns of equal time.
Plain Python: the view model (view.py) switches to it (key u), the grid widget draws what it says.

A cell shows what its GPU did at the middle of its column: a transfer (the op's glyph), compute (▒▒) or
nothing (idle, ··). A cell whose span lies on the step's critical path is marked, so the chain that sets
the step's length reads across the grid.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Sequence

from ..clock.report import ClockChoice
from ..clock.timeline import simulate
from ..clock.costs import machine
from .grid import IDLE, CELLS, kind_of
from ..comm.trace import Trace

COMPUTE = ("▒▒", "compute")
TARGET_COLUMNS = 120  # the step spread over about this many columns; never fewer than it has steps


class ClockGrid:
    """Each rank's spans on the clock, and the columns of `seconds` each they are drawn in."""

    def __init__(self, trace: Trace, events: Sequence[Any], choice: ClockChoice = ClockChoice()):
        self.choice = choice
        self.tl = simulate(trace, machine(choice.gpu, choice.gpus_per_node), choice.overlap)
        self.range = None  # a real-size run's: what the held-out runs like it measured (clock/uncertainty.py)
        if not trace.meta.get("precision", {}).get("exact", True):
            from ..clock.uncertainty import family_range, held_out, trace_family

            self.range = family_range(trace_family(trace), choice.gpu, held_out())
        index = {e.seq: i for i, e in enumerate(events)}
        self.index = index
        critical = {id(s) for s in self.tl.critical}
        columns = max(TARGET_COLUMNS, max([e.step for e in events] + [1]))
        self.seconds = self.tl.step / columns if self.tl.step > 0 else 1e-6
        self.columns = max(1, int(self.tl.step / self.seconds + 0.999999))
        # per (rank, stream): spans sorted by start, as (start, end, cell, critical, event index or None). One
        # stream's spans never overlap (a GPU runs one compute and one communication at a time)
        self.spans: dict[tuple[int, str], list[tuple[float, float, tuple[str, str], bool, int | None]]] = {}
        for s in self.tl.spans:
            i = index.get(s.seq) if s.seq is not None else None
            for r in s.ranks:
                if s.kind == "compute":
                    cell = COMPUTE
                else:
                    cell = CELLS.get(kind_of(events[i], r), COMPUTE) if i is not None else COMPUTE
                self.spans.setdefault((r, s.kind), []).append((s.start, s.end, cell, id(s) in critical, i))
        for row in self.spans.values():
            row.sort(key=lambda x: x[0])
        self._starts = {key: [x[0] for x in row] for key, row in self.spans.items()}

    def _span(self, rank: int, column: int) -> tuple | None:
        """The span of `rank` that covers most of 1-based `column`, of either stream (None: idle all through
        it); a span shorter than a column (a latency-bound call) still shows."""
        lo, hi = (column - 1) * self.seconds, column * self.seconds
        best, cover = None, 0.0
        rank = self.tl.ran_for(rank)  # a folded rank's spans are its representative's
        for stream in ("comm", "compute"):
            row = self.spans.get((rank, stream))
            if not row:
                continue
            k = bisect_left(self._starts[(rank, stream)], hi) - 1
            while k >= 0 and row[k][1] > lo:  # one stream's spans do not overlap: those in the column are together
                got = min(row[k][1], hi) - max(row[k][0], lo)
                if got > cover:
                    best, cover = row[k], got
                k -= 1
        return best

    def cell(self, rank: int, column: int) -> tuple[str, str, bool, int | None]:
        """(two characters, style name, on the critical path, the event it belongs to) of one cell."""
        got = self._span(rank, column)
        if got is None:
            return IDLE[0], IDLE[1], False, None
        _, _, (text, style), critical, index = got
        return text, style, critical, index

    def event_at(self, rank: int, column: int) -> int | None:
        """The event a click on (rank, column) selects: the transfer there, or the one the compute precedes."""
        got = self._span(rank, column)
        return None if got is None else got[4]

    def column_of(self, seq: int) -> int:
        """The 0-based column where event `seq`'s transfer (or compute) starts."""
        start = self.tl.events.get(seq, (0.0, 0.0))[0]
        return min(self.columns - 1, int(start / self.seconds))

    def unit(self) -> tuple[float, str]:
        """(seconds per unit, its name) for the ruler: microseconds, or milliseconds past 10 ms."""
        return (1e-3, "ms") if self.tl.step >= 1e-2 else (1e-6, "us")

    def ruler(self, first: int, last: int, cell_w: int) -> str:
        """Times over columns `first`..`last - 1` (0-based), every tenth column from its left edge."""
        scale, _ = self.unit()
        width = (last - first) * cell_w
        chars = [" "] * width
        for c in range(first, last):
            if c % 10:
                continue
            text = f"{c * self.seconds / scale:,.4g}"
            at = (c - first) * cell_w
            if at + len(text) <= width:
                chars[at : at + len(text)] = text
        return "".join(chars)

    def setting(self) -> str:
        """What the run is laid out on, and the range runs like it measured (the timeline's title says it)."""
        over = ", ".join(self.choice.overlap) or "no overlap"
        like = f"; runs like it {self.range.low:.2f}-{self.range.high:.2f}x" if self.range is not None else ""
        return f"{self.tl.machine.name}, {over}{like}"

    def status(self) -> str:
        """The step, a column's time and the critical path's split: short enough for the status line at 100
        columns beside where stepping is (the GPU, overlap and range are the timeline's title)."""
        scale, name = self.unit()
        split = self.tl.critical_split()
        return (
            f"step {self.tl.step / scale:,.4g} {name}, {self.seconds / scale:,.3g} a column; path "
            f"{split['compute'] / scale:,.4g} compute + {split['comm'] / scale:,.4g} comm"
        )

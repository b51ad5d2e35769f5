"""A lesson's tables as plain text: a title, a header, one labelled row each, aligned, and the notes under
it. A table wider than the page is printed a row at a time (each column named), never cut."""
from __future__ import annotations

import textwrap
from typing import Any

from ..lesson import Table
from .numbers import scalar
from .text import printable


def cell(v: Any) -> str:
    """A value as a table shows it: thousands separated, integer floats without '.0', lists joined."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return scalar(v)
    if isinstance(v, (list, tuple)):
        return " ".join(cell(x) for x in v) or "-"
    if v is None:
        return "-"
    return printable(str(v))


def table_lines(t: Table, width: int = 96) -> list[str]:
    cells = [[printable(label)] + [cell(v) for v in values] for label, values in t.rows]
    head = [printable(c) for c in t.columns]
    widths = [max(len(r[i]) for r in [head] + cells) for i in range(len(head))]
    out = [printable(t.title)]
    numeric = [i > 0 and all(isinstance(values[i - 1], (int, float)) and not isinstance(values[i - 1], bool)
                             for _, values in t.rows) for i in range(len(head))]  # numbers line up on the right
    if sum(widths) + 2 * (len(widths) - 1) <= width:
        line = lambda r: "  ".join((c.rjust(w) if numeric[i] else c.ljust(w)).rstrip() if i == len(r) - 1  # noqa: E731
                                   else c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        out += ["  " + line(head), "  " + "  ".join("-" * w for w in widths)] + ["  " + line(r) for r in cells]
    else:  # too wide for the page: each row as "column: value" lines
        for r in cells:
            out.append(f"  {r[0]}")
            out += [f"      {c}: {v}" for c, v in zip(head[1:], r[1:])]
    for note in t.notes:
        out += textwrap.wrap(printable(note), width, initial_indent="  ", subsequent_indent="    ")
    return out

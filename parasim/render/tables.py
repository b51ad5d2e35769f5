"""A lesson's tables as plain text: a title, a header, one labelled row each, aligned, and the notes under
it. A table wider than the page still reads across: its headers wrapped, turned a quarter, or its columns in
blocks (`table_lines`); never cut."""

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


GAP = 2  # spaces between columns, and the indent of a table's lines


def _header_lines(words: str, width: int) -> list[str]:
    """A header cell wrapped at spaces to `width` (a word longer than that stays whole)."""
    return textwrap.wrap(words, width, break_long_words=False, break_on_hyphens=False) or [""]


def _fit(head: list[str], body: list[list[str]], width: int, wrap: tuple[int, ...] = ()) -> list[int] | None:
    """Column widths that fit `width` with the headers over as few lines as can be: each column at least its
    longest cell (the columns in `wrap`: their longest word, their cells then wrapped over lines), and just
    wide enough for its header to wrap into that many lines; None where even one word a line does not fit."""

    def longest(i: int) -> int:
        cells = [r[i] for r in body]
        return max([len(w) for c in cells for w in c.split()] + [0]) if i in wrap else max(map(len, cells), default=0)

    room = width - GAP - GAP * (len(head) - 1)
    deepest = max(len(h.split()) for h in head) or 1
    for depth in range(1, deepest + 1):
        widths = []
        for i, h in enumerate(head):
            w = max([longest(i)] + [len(word) for word in h.split()])
            while len(_header_lines(h, w)) > depth:
                w += 1
            widths.append(w)
        if sum(widths) <= room:
            # wrapped columns share what is left in proportion to what each still lacks of its longest cell, so
            # no column is left a word wide beside one that took it all
            need = {i: max(0, max(len(r[i]) for r in body) - widths[i]) for i in wrap}
            spare, lacking = room - sum(widths), sum(need.values())
            for i in wrap:
                widths[i] += min(need[i], spare * need[i] // lacking) if lacking else 0
            return widths
    return None


def _laid_out(head: list[str], body: list[list[str]], numeric: list[bool], widths: list[int]) -> list[str]:
    """The table at `widths`: headers wrapped over as many lines as the longest needs, a rule, the rows (a text
    cell wider than its column wrapped over lines of its own row)."""

    def line(cells: list[str]) -> str:
        return (
            " " * GAP
            + (" " * GAP).join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        ).rstrip()

    def block(cells: list[list[str]], bottom: bool) -> list[str]:  # cells of one row, each over its lines
        depth = max(map(len, cells))
        cells = [([""] * (depth - len(c)) + c) if bottom else (c + [""] * (depth - len(c))) for c in cells]
        return [line([c[k] for c in cells]) for k in range(depth)]

    heads = block([_header_lines(h, w) for h, w in zip(head, widths)], bottom=True)  # on the rule
    rows = [block([[c] if len(c) <= w else _header_lines(c, w) for c, w in zip(r, widths)], bottom=False) for r in body]
    return heads + [" " * GAP + (" " * GAP).join("-" * w for w in widths)] + [x for r in rows for x in r]


def _numeric(rows: list[list[Any]]) -> list[bool]:
    """Per column (label first): every value a number, so it lines up on the right."""
    return (
        [
            i > 0 and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
            for i in range(len(rows[0]))
        ]
        if rows
        else []
    )


def table_lines(t: Table, width: int = 96) -> list[str]:
    """The table as lines of at most `width` characters that read across: as it is (long headers wrapped over
    two or more lines; else long words of text cells wrapped inside their cells); else turned a quarter (columns
    as rows) where that fits; else its columns in blocks, the row labels repeated in each; only where no single
    column fits beside its labels, a row at a time."""
    values = [[label] + list(vals) for label, vals in t.rows]
    head = [printable(c) for c in t.columns]
    body = [[printable(r[0])] + [cell(v) for v in r[1:]] for r in values]
    # a hyphenated word ("all-to-all-hidden", "expert-dp") is never cut at its hyphens, as in the walk-through
    out = textwrap.wrap(printable(t.title), width, subsequent_indent="  ", break_on_hyphens=False) or [""]
    numeric = _numeric(values)
    widths = _fit(head, body, width)
    texts = tuple(i for i in range(1, len(head)) if not numeric[i])  # words that may wrap inside their cell
    wrapped = None if widths is not None or not texts else _fit(head, body, width, texts)
    if widths is not None or wrapped is not None:
        out += _laid_out(head, body, numeric, widths or wrapped)
    elif body and (turned := _turned(t, head, body, values, width)) is not None:
        out += turned
    elif body and (blocks := _blocks(head, body, numeric, width)) is not None:
        out += blocks
    else:  # not one column fits beside the labels: each row as "column: value" lines
        for r in body:
            out.append(f"  {r[0]}")
            out += [f"      {c}: {v}" for c, v in zip(head[1:], r[1:])]
    for note in t.notes:
        out += textwrap.wrap(
            printable(note), width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
        )
    return out


def _turned(t: Table, head: list[str], body: list[list[str]], values: list[list[Any]], width: int) -> list[str] | None:
    """The table with its rows as columns (the first header names the new label column), where that fits."""
    t_head = [head[0]] + [r[0] for r in body]
    t_body = [[head[i]] + [r[i] for r in body] for i in range(1, len(head))]
    t_values = [[head[i]] + [r[i] for r in values] for i in range(1, len(head))]
    widths = _fit(t_head, t_body, width)
    if widths is None:
        return None
    numeric = _numeric(t_values)
    said = textwrap.wrap(
        f"(turned to fit: a column per {printable(t.columns[0])})",
        width,
        initial_indent=" " * GAP,
        subsequent_indent=" " * (GAP + 1),
    )
    return said + _laid_out(t_head, t_body, numeric, widths)


def _blocks(head: list[str], body: list[list[str]], numeric: list[bool], width: int) -> list[str] | None:
    """The columns in consecutive blocks that each fit beside the row labels; None where one column alone
    does not."""
    out, start, n = [], 1, len(head)
    while start < n:
        end = start + 1
        if _fit([head[0], head[start]], [[r[0], r[start]] for r in body], width) is None:
            return None
        while (
            end < n
            and _fit([head[0]] + head[start : end + 1], [[r[0]] + r[start : end + 1] for r in body], width) is not None
        ):
            end += 1
        cols = [0] + list(range(start, end))
        part = [[r[i] for i in cols] for r in body]
        widths = _fit([head[i] for i in cols], part, width)
        assert widths is not None
        out += [f"  (columns {start}-{end - 1} of {n - 1})" if end - start > 1 else f"  (column {start} of {n - 1})"]
        out += _laid_out([head[i] for i in cols], part, [numeric[i] for i in cols], widths)
        start = end
    return out

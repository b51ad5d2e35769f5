"""A pipeline schedule's slot table: one row per GPU, one column per time slot, and its summary line."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from ..pipeline.action import kind_of
from ..pipeline.timing import Timing


def print_schedule(
    timing: Timing,
    schedule: str,
    pp: int,
    microbatches: int,
    v: int,
    layers: int | None,
    per: int | None,
    width: int | None = None,
) -> None:
    """The slot table, cut into consecutive windows of slots that each fit `width` columns (the terminal's,
    or 100): every cell whole (F16, B16), the time ruler above each window."""
    import shutil

    title = f"{schedule}: {pp} ranks x {microbatches} micro-batches" + (
        f", {v} chunks per rank (second in lower case)" if v == 2 else f", {v} chunks per rank" if v > 2 else ""
    )
    width = width or max(60, shutil.get_terminal_size((100, 30)).columns)
    cell = max([len(str(timing.makespan))] + [len(x) for row in timing.slots for x in row if x])
    label = max(len("time ->"), len(f"GPU {len(timing.slots)}")) + 3  # its padding and the table's edge
    per_window = max(1, (width - label - 2) // (cell + 3))  # a cell, its padding, one column of slack
    console = Console(highlight=False, width=width)
    for start in range(0, timing.makespan, per_window):
        stop = min(timing.makespan, start + per_window)
        part = "" if per_window >= timing.makespan else f" (slots {start + 1}-{stop} of {timing.makespan})"
        console.print(title + part)
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1))
        table.add_column("time ->", no_wrap=True)
        for t in range(start, stop):
            table.add_column(str(t + 1), justify="center", no_wrap=True, min_width=cell)
        for r, row in enumerate(timing.slots):  # each kind's colour from the kind table
            table.add_row(
                f"GPU {r + 1}", *[f"[{kind_of(x).rich}]{x}[/]" if x else "[dim].[/]" for x in row[start:stop]]
            )
        console.print(table)
    if per:
        console.print(f"{layers} layers: {per} per stage, {per * v} per rank")
    console.print(
        f"makespan {timing.makespan} slots; each rank busy {', '.join(str(timing.makespan - i) for i in timing.idle)}"
        f" of {timing.makespan}; bubble {timing.bubble} = {float(timing.bubble):.1%}; peak micro-batches "
        f"held per rank {timing.peak}" + (" (counted per chunk)" if v > 1 else "")
    )

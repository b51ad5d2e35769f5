"""A pipeline schedule's slot table: one row per GPU, one column per time slot, and its summary line."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from ..pipeline.action import kind_of
from ..pipeline.timing import Timing


def print_schedule(timing: Timing, schedule: str, pp: int, microbatches: int, v: int, layers: int | None,
                   per: int | None) -> None:
    title = f"{schedule}: {pp} ranks x {microbatches} micro-batches" + (
        f", {v} chunks per rank (second in lower case)" if v == 2 else f", {v} chunks per rank" if v > 2 else "")
    table = Table(box=box.SIMPLE_HEAD, title=title,
                  title_justify="left", padding=(0, 1))
    table.add_column("time ->", no_wrap=True)
    for t in range(timing.makespan):
        table.add_column(str(t + 1), justify="center")
    for r, row in enumerate(timing.slots):  # each kind's colour from the kind table
        table.add_row(f"GPU {r + 1}", *[f"[{kind_of(x).rich}]{x}[/]" if x else "[dim].[/]" for x in row])
    console = Console(highlight=False, width=max(100, 12 + 5 * timing.makespan))
    console.print(table)
    if per:
        console.print(f"{layers} layers: {per} per stage, {per * v} per rank")
    console.print(f"makespan {timing.makespan} slots; each rank busy {', '.join(str(timing.makespan - i) for i in timing.idle)}"
                  f" of {timing.makespan}; bubble {timing.bubble} = {float(timing.bubble):.1%}; peak micro-batches "
                  f"held per rank {timing.peak}" + (" (counted per chunk)" if v > 1 else ""))

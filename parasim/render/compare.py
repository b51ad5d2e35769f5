"""`parasim compare`'s table: one column per setting, one row per figure, the rows whose figure changes
with the setting marked."""

from __future__ import annotations

from typing import Any

from ..figures import differing
from .tables import cell
from .text import printable


def setting_label(settings: dict[str, Any], flags: dict[str, str]) -> str:
    """'--tp 4', '-m 16', one per line: the settings as the command line gives them (a switch that is on, by
    its name alone)."""
    return "\n".join(flags[n] if v is True else f"{flags[n]} {v}" for n, v in settings.items())


def compare_table(lesson: str, rows: list[dict[str, Any]], flags: dict[str, str]) -> Any:
    """A rich Table: figures down, settings across; '*' marks a figure that changes, and its cells are bold."""
    from rich.table import Table

    changes = set(differing(rows))
    table = Table(
        title=f"{lesson}: the same figures at {len(rows)} settings (* changes with the setting; bytes in B)",
        title_justify="left",
    )
    table.add_column("figure (from each run)", overflow="fold", min_width=20, ratio=1)
    for r in rows:
        label = "\n".join(printable(line) for line in setting_label(r["settings"], flags).split("\n"))
        table.add_column(label, justify="right")
    names = list(dict.fromkeys(n for r in rows for n in r["figures"]))
    for n in names:
        mark = "* " if n in changes else "  "
        cells = [cell(r["figures"].get(n)) for r in rows]
        table.add_row(mark + printable(n), *[f"[bold]{c}[/bold]" if n in changes else c for c in cells])
    return table

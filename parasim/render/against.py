"""The estimate beside a symbolic run of the same plan (train/against.py): tables for people."""

from __future__ import annotations

from typing import Any


def print_compare(console: Any, run: dict, unit: float, name: str) -> None:
    from rich.table import Table

    table = Table(
        title=f"against one step on symbolic ranks: GPU {run['gpu']} (stage {run['stage'] + 1}), at its peak",
        title_justify="left",
    )
    for col, justify in (
        ("item", "left"),
        (f"estimate {name}", "right"),
        (f"run {name}", "right"),
        (f"estimate - run, by cause ({name})", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in run["rows"]:
        why = "\n".join(f"{v / unit:+,.3f} {part}" for part, v in r["parts"].items()) or "equal"
        table.add_row(r["item"], f"{r['estimate'] / unit:,.3f}", f"{r['run'] / unit:,.3f}", why)
    table.add_row(
        "[bold]total[/]",
        f"[bold]{run['estimate_total'] / unit:,.3f}[/]",
        f"[bold]{run['run_total'] / unit:,.3f}[/]",
        "",
    )
    console.print(table)
    traffic = Table(
        title=f"sent by the busiest GPU per step, {name} (the run's float64 bytes counted as BF16)",
        title_justify="left",
    )
    for col in ("axis", "collective", "estimate", "run", "estimate - run, by cause"):
        traffic.add_column(col, justify="right" if col in ("estimate", "run") else "left")
    for t in run["traffic"]:
        why = "\n".join(f"{v / unit:+,.3f} {part}" for part, v in t["parts"].items() if v) or "equal"
        traffic.add_row(t["axis"], t["op"], f"{t['estimate'] / unit:,.3f}", f"{t['run'] / unit:,.3f}", why)
    console.print(traffic)


def print_fit(out: dict, unit: float, name: str) -> None:
    print(
        f"{out['plan']}: the estimator's longest sequence for what the step runs, cut to a multiple of "
        f"{out['granule']} tokens, and one such step longer ({out['usable'] / unit:g} {name} usable):"
    )
    for row in out["lengths"]:
        verdict = "fits" if row["fits"] else "does NOT fit"
        print(
            f"  {row['seq']:>12,} tokens: the run holds {row['run_total'] / unit:,.3f} {name}, plus "
            f"{row['missing'] / unit:,.3f} {name} the step has no code for = {row['total'] / unit:,.3f} {name} "
            f"(estimate {row['estimate_total'] / unit:,.3f}): {verdict}"
        )

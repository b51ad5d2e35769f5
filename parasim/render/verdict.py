"""The verdict of `parasim run`: did the real ranks do what the virtual ranks did, and how long did it take.

A lesson's title and name, compute steps' names and check names can come from a user's program: they go
into Rich's markup escaped (`markup_safe`), or printed without markup through `printable`."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from ..lesson import Check, Lesson
from ..engine.real import RealReport
from .text import markup_safe, printable


def print_verdict(lesson: Lesson, report: RealReport, checks: list[Check], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    where = (
        ""
        if report.device == "cpu"
        else f", tensors on {report.device}"
        + (", each call's tensors copied to the host and back" if report.wire == "cpu" else "")
    )
    console.print(
        f"[bold]{markup_safe(lesson.title)}[/]  ({markup_safe(lesson.name)}: {report.world} real ranks on "
        f"{markup_safe(report.backend)}{where}, "
        f"compared with {report.world} virtual ranks)"
    )

    ranks = Table(box=box.SIMPLE_HEAD, title="per rank", title_justify="left")
    for col in ("rank", "calls", "bytes sent", "bytes received", "time in calls (ms)"):
        ranks.add_column(col, justify="right")
    for r in range(report.world):
        mine = [(e, m) for e in report.trace.events for m in e.members if m.rank == r]
        busy = sum(report.times[(e.seq, r)][1] for e, _ in mine) / 1e3
        ranks.add_row(
            str(r),
            str(len(mine)),
            f"{sum(m.sent for _, m in mine):,}",
            f"{sum(m.recv for _, m in mine):,}",
            f"{busy:.2f}",
        )
    console.print(ranks)

    ops = Table(box=box.SIMPLE_HEAD, title="measured per kind of call", title_justify="left")
    for col in ("op", "calls", "total (ms)", "mean (us)"):
        ops.add_column(col, justify="right" if col != "op" else "left")
    for op, t in report.timings().items():
        ops.add_row(markup_safe(op), str(t["calls"]), f"{t['total_ms']:.2f}", f"{t['mean_us']:.0f}")
    console.print(ops)
    console.print(f"start-up (processes, rendezvous, groups): {report.startup_s:.1f} s")

    if report.match:
        how = "values bit for bit" if report.closest is None else f"values {report.closest.words()}"
        console.print(
            f"[green bold]MATCH[/]: every call, group, shape, dtype, byte count and call site as on "
            f"virtual ranks; {how}."
        )
    else:
        console.print(f"[red bold]DIFFERENT[/]: {len(report.differences)} difference(s) from the virtual run:")
        for d in report.differences:
            console.print(f"  {printable(d)}", markup=False)
    bad = [c for c in checks if not c.ok]
    console.print(f"lesson checks on the real values: {len(checks) - len(bad)} of {len(checks)} ok")
    for c in bad:
        console.print(printable(f"  FAIL {c.name}: got {c.got}, expected {c.expected}"), markup=False)

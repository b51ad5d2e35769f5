"""The figures of one lesson run that a learner compares across settings (`parasim compare`): what every
run has (ranks, checks, events, the bytes the busiest GPU sent on each axis, the most any GPU held) and
what the lesson itself declares (`Lesson.figures`: the bubble of a schedule, the bytes an SP rank keeps).
Every figure is read from the run; nothing here is a formula for one."""
from __future__ import annotations

from typing import Any

from .lesson import LessonRun


def axis_of(event: Any) -> str:
    """The axis an event's bytes travel on: its group's name ('tp', 'ep', 'pair'); point-to-point
    transfers are counted together."""
    return "p2p" if event.kind == "p2p" else event.group.name


def run_figures(lr: LessonRun) -> dict[str, Any]:
    """Name -> value for one run, in the order a table shows them."""
    trace = lr.result.trace
    out: dict[str, Any] = {"ranks": trace.world,
                           "checks ok": f"{sum(c.ok for c in lr.checks)} of {len(lr.checks)}",
                           "collectives": sum(e.kind != "compute" for e in trace.events)}
    sent: dict[str, dict[int, int]] = {}
    for e in trace.events:
        if e.kind == "compute":
            continue
        per = sent.setdefault(axis_of(e), {})
        for m in e.members:
            per[m.rank] = per.get(m.rank, 0) + m.sent
    for axis in sorted(sent):
        out[f"bytes sent by the busiest GPU on {axis}"] = max(sent[axis].values())
    if any(mk.kind == "held" for mk in trace.marks):
        out["most bytes one GPU held"] = max(trace.peak(r)["bytes"] for r in range(trace.world))
    if lr.lesson.figures is not None:
        out.update(lr.lesson.figures(lr.result))
    return out

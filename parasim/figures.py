"""The figures of one lesson run that a learner compares across settings (`parasim compare`): what every
run has (ranks, checks, events, the bytes the busiest GPU sent on each axis, the most any GPU held) and
what the lesson itself declares (`Lesson.figures`: the bubble of a schedule, the bytes an SP rank keeps).
Every figure is read from the run; nothing here is a formula for one."""
from __future__ import annotations

from typing import Any, Callable

from .lesson import LessonRun, Table
from .comm.trace import Trace


def axis_of(event: Any) -> str:
    """The axis an event's bytes travel on: its group's name ('tp', 'ep', 'pair'); point-to-point
    transfers are counted together."""
    return "p2p" if event.kind == "p2p" else event.group.name


def run_figures(lr: LessonRun) -> dict[str, Any]:
    """Name -> value for one run, in the order a table shows them."""
    trace = lr.result.trace
    out: dict[str, Any] = {"ranks": trace.world,
                           "checks ok": f"{sum(c.ok for c in lr.checks)} of {len(lr.checks)}",
                           **trace_figures(trace)}
    if lr.lesson.figures is not None:
        out.update(lr.lesson.figures(lr.result))
    return out


def trace_figures(trace: Trace) -> dict[str, Any]:
    """What any run's trace says, a lesson's or a layout's: collectives and sends made, the bytes the busiest
    GPU sent on each axis, the most bytes one GPU held (when the run said what it holds)."""
    out: dict[str, Any] = {"collectives": sum(e.kind == "collective" for e in trace.events),
                           "point-to-point sends": sum(e.kind == "p2p" for e in trace.events)}
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
    return out


def sent_in_phase(result: Any, phase: str | None, keep: Callable[[Any], bool] | None = None, rank: int = 0) -> int:
    """Bytes `rank` sent in `phase` (None: in every phase), as the trace recorded them, on the events
    `keep(event)` picks (None: all of them). The one place lessons and tables add up what a rank sent."""
    return sum(m.sent for e in result.trace.events if (phase is None or e.phase == phase)
               and (keep is None or keep(e)) for m in e.members if m.rank == rank)


def sp_traffic_table(result: Any, alone: str, with_sp: str, names: tuple[str, str] = ("TP alone", "TP + SP")) -> Table:
    """What rank 0 sent for one layer, forward and backward, run with TP alone (phase `alone`) and with TP + SP
    (phase `with_sp`), by what each collective is for (read from its op and the layer's label), with the
    post's claim, the run's figures and why they differ."""
    again = lambda e: "again" in (e.label or "")  # noqa: E731  backward gathers the saved slices once more
    kinds = [
        ("all-reduces (TP's f and g)", alone, lambda e: e.op == "all_reduce"),
        ("all-gathers and reduce-scatters in their place", with_sp,
         lambda e: e.op in ("all_gather", "reduce_scatter") and not again(e)),
        ("backward's second all-gather of the saved slices", with_sp, lambda e: e.op == "all_gather" and again(e)),
        ("the norms' and biases' gradient sums SP adds", with_sp, lambda e: e.op == "all_reduce"),
    ]
    rows = [(what, [sent_in_phase(result, alone, keep) if phase == alone else 0,
                    sent_in_phase(result, with_sp, keep) if phase == with_sp else 0]) for what, phase, keep in kinds]
    total = [sent_in_phase(result, p) for p in (alone, with_sp)]
    same = rows[0][1][0]
    return Table(f"Bytes rank 0 sent for one small layer, forward and backward, over {result.world} ranks",
                 ["collectives", *names], rows + [("total", total)],
                 notes=[f"post: SP moves the same bytes as TP. run: {total[0]:,} B against {total[1]:,} B. why: "
                        f"the gathers and scatters that replace the all-reduces move {rows[1][1][1]:,} B against "
                        f"{same:,} B; on top, backward gathers the saved slices a second time (SP kept only a "
                        "slice of each), and the norms' and biases' weight gradients, partial over the ranks' "
                        "tokens, are summed."])

"""The figures of one lesson run that a learner compares across settings (`parasim compare`): what every
run has (ranks, checks, events, the bytes the busiest GPU sent on each axis, the most any GPU held) and
what the lesson itself declares (`Lesson.figures`: the bubble of a schedule, the bytes an SP rank keeps).
Every figure is read from the run; nothing here is a formula for one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .lesson import Lesson, LessonRun, Table, KNOB_KINDS, run_lesson, sent_in_phase
from .comm.trace import Trace
from .layout.axes import AXES, SIZED

if TYPE_CHECKING:
    from .examples.worked import Example
    from .layout import Layout


def event_axis(event: Any) -> str:
    """The axis an event's bytes travel on: its group's name ('tp', 'ep', 'pair'); point-to-point
    transfers are counted together."""
    return "p2p" if event.kind == "p2p" else event.group.name


def run_figures(lr: LessonRun) -> dict[str, Any]:
    """Name -> value for one run, in the order a table shows them."""
    trace = lr.result.trace
    out: dict[str, Any] = {
        "ranks": trace.world,
        "checks ok": f"{sum(c.ok for c in lr.checks)} of {len(lr.checks)}",
        **trace_figures(trace),
    }
    if lr.lesson.figures is not None:
        out.update(lr.lesson.figures(lr.result))
    return out


def trace_figures(trace: Trace) -> dict[str, Any]:
    """What any run's trace says, a lesson's or a layout's: collectives and sends made, the bytes the busiest
    GPU sent on each axis, the most bytes one GPU held (when the run said what it holds)."""
    out: dict[str, Any] = {
        "collectives": sum(e.kind == "collective" for e in trace.events),
        "point-to-point sends": sum(e.kind == "p2p" for e in trace.events),
    }
    sent: dict[str, dict[int, int]] = {}
    for e in trace.events:
        if e.kind == "compute":
            continue
        per = sent.setdefault(event_axis(e), {})
        for m in e.members:
            per[m.rank] = per.get(m.rank, 0) + m.sent
    for axis in sorted(sent):
        out[f"bytes sent by the busiest GPU on {axis}"] = max(sent[axis].values())
    if any(mk.kind == "held" for mk in trace.marks):
        out["most bytes one GPU held"] = max(trace.peak(r)["bytes"] for r in range(trace.world))
    return out


def sp_traffic_table(result: Any, alone: str, with_sp: str, names: tuple[str, str] = ("TP alone", "TP + SP")) -> Table:
    """What rank 0 sent for one layer, forward and backward, run with TP alone (phase `alone`) and with TP + SP
    (phase `with_sp`), by what each collective is for (read from its op and the layer's label), with the
    post's claim, the run's figures and why they differ."""
    again = lambda e: "again" in (e.label or "")  # noqa: E731  backward gathers the saved slices once more
    kinds = [
        ("all-reduces (TP's f and g)", alone, lambda e: e.op == "all_reduce"),
        (
            "all-gathers and reduce-scatters in their place",
            with_sp,
            lambda e: e.op in ("all_gather", "reduce_scatter") and not again(e),
        ),
        ("backward's second all-gather of the saved slices", with_sp, lambda e: e.op == "all_gather" and again(e)),
        ("the norms' and biases' gradient sums SP adds", with_sp, lambda e: e.op == "all_reduce"),
    ]
    rows = [
        (
            what,
            [
                sent_in_phase(result, alone, keep) if phase == alone else 0,
                sent_in_phase(result, with_sp, keep) if phase == with_sp else 0,
            ],
        )
        for what, phase, keep in kinds
    ]
    total = [sent_in_phase(result, p) for p in (alone, with_sp)]
    same = rows[0][1][0]
    return Table(
        f"Bytes rank 0 sent for one small layer, forward and backward, over {result.world} ranks",
        ["collectives", *names],
        rows + [("total", total)],
        notes=[
            f"post: SP moves the same bytes as TP. run: {total[0]:,} B against {total[1]:,} B. why: "
            f"the gathers and scatters that replace the all-reduces move {rows[1][1][1]:,} B against "
            f"{same:,} B; on top, backward gathers the saved slices a second time (SP kept only a "
            "slice of each), and the norms' and biases' weight gradients, partial over the ranks' "
            "tokens, are summed."
        ],
    )


def differing(rows: list[dict[str, Any]]) -> list[str]:
    """The figures whose value is not the same in every run (a figure some runs lack counts as differing)."""
    names = list(dict.fromkeys(n for r in rows for n in r["figures"]))
    return [n for n in names if len({repr(r["figures"].get(n)) for r in rows}) > 1]


@dataclass(frozen=True)
class Comparison:
    """The same figures from several runs (`parasim compare`): one row per setting ({"settings", "figures",
    "ok"}: whether the run agreed with its single-device reference), a heading for each setting, and the
    settings the same in every run (said in `name`, so left out of the rows' labels)."""

    name: str
    rows: list[dict[str, Any]]
    labels: dict[str, str]
    key: str = "lesson"  # what names the runs in the JSON: "lesson", or "compare" for layouts
    hidden: frozenset[str] = frozenset()

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)

    def differ(self) -> list[str]:
        return differing(self.rows)

    def shown(self) -> list[dict[str, Any]]:
        """The rows with the settings every run shares left out of their settings."""
        return [{**r, "settings": {k: v for k, v in r["settings"].items() if k not in self.hidden}} for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return {self.key: self.name, "rows": self.rows, "differ": self.differ()}


def compare_lesson(lesson: Lesson, grid: list[dict[str, Any]], timeout: float | None) -> Comparison:
    """Run `lesson` at each of the settings in `grid` (every setting refused before the first run)."""
    for settings in grid:
        lesson.settings(settings)
    rows = []
    for settings in grid:
        lr = run_lesson(lesson, timeout=timeout, knobs=settings)
        rows.append({"settings": settings, "figures": run_figures(lr), "ok": lr.ok})
    return Comparison(lesson.name, rows, {n: k.flags[0] for n, k in KNOB_KINDS.items()})


# a table's heading for each setting of a layout: an axis's its own (layout/axes.py), then the rest
LAYOUT_LABELS = {
    **{name: AXES[name].label for name in SIZED},
    "world": "GPUs",
    "experts": "experts",
    "layers": "layers",
    "gpus_per_node": "GPUs/node",
    "microbatches": "m",
    "routing": "routing",
    "sp": "SP",
}


def layout_label(sizes: dict[str, Any], sp: bool) -> str:
    """Sizes as a table labels them ("TP 2 EP 4 SP")."""
    return " ".join(f"{LAYOUT_LABELS[k]} {v}" for k, v in sizes.items()) + (" SP" if sp else "")


@dataclass(frozen=True)
class LayoutRun:
    """One layout to run the worked example on: the sizes as given, the layout they make, the micro-batches,
    the routing and the token followed."""

    sizes: dict[str, Any]
    layout: Layout
    microbatches: int
    routing: str
    watch: Any


def compare_layouts(ex: Example, runs: list[LayoutRun], sp: bool, timeout: float | None) -> Comparison:
    """The worked example's step on each layout, checked against the unsplit model where it routes by its own
    router, with the same figures side by side (bytes inside and across nodes per axis, the token's path)."""
    from .engine.runner import run

    rows = []
    for r in runs:
        layout, m, routing = r.layout, r.microbatches, r.routing
        result = run(ex.make_program(r.watch, layout, m, routing), layout.world, seed=0, timeout=timeout)
        exact = ex.exactness(result.values, layout, m, routing) if routing in ex.routings else None
        trace = result.trace
        fig = {"GPUs": layout.world, **trace_figures(trace)}  # the busiest GPU per axis, as a lesson's
        for axis, link in sorted(trace.bytes_by_link(layout.gpus_per_node).items()):
            fig[f"{axis}: bytes inside a node, all GPUs"] = link["inside"]
            fig[f"{axis}: bytes across nodes, all GPUs"] = link["across"]
        fig.update(ex.token_figures(trace))
        fig["loss and gradients equal the unsplit model's"] = "-" if exact is None else exact["exact"]
        settings = {**r.sizes, **({"sp": True} if sp else {})}
        rows.append({"settings": settings, "figures": fig, "ok": exact is None or exact["exact"]})
    for row in rows:  # a link no run used is no figure
        row["figures"] = {
            n: v
            for n, v in row["figures"].items()
            if not n.endswith("all GPUs") or any(x["figures"].get(n) for x in rows)
        }
    same = {k: v for k, v in rows[0]["settings"].items() if all(r["settings"].get(k) == v for r in rows)}
    name = "layout" + (
        f" ({layout_label({k: v for k, v in same.items() if k != 'sp'}, 'sp' in same)} in every run)" if same else ""
    )
    hidden = frozenset(same) if len(same) < len(rows[0]["settings"]) else frozenset()
    return Comparison(name, rows, LAYOUT_LABELS, "compare", hidden)

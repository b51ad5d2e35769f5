"""The post's cheat sheet, every cell computed: for each way of splitting the work, what it splits, what it
sends and what limits it, each read from a lesson's run at that lesson's sizes (`parasim cheatsheet`).

One entry per method (CHEAT_ROWS): the lessons it reads and the function that makes its cells from their runs.
Each lesson runs once however many rows read it. A cell says its figure and where it came from; the row names
its lessons, so a learner can open the run behind any cell (`parasim lesson NAME`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from ..lesson import LessonRun, Table, get_lesson, run_lesson

LessonRuns = dict[str, LessonRun]
Cells = tuple[str, str, str, dict[str, Any]]  # splits, communication, main limit; the figures behind them


def ops(lr: LessonRun, phase: str) -> Counter:
    """How many calls of each op the run made in `phase` (each group's call counted once)."""
    return Counter(e.op for e in lr.result.trace.events if e.phase == phase)


def _fig(lr: LessonRun, name: str) -> Any:
    assert lr.lesson.figures is not None
    return lr.lesson.figures(lr.result)[name]


def _table_row(lr: LessonRun, title_start: str, label: str) -> dict[str, Any]:
    """A row of one of a lesson's tables, by its label, its cells named by their columns."""
    t = next(t for t in lr.tables if t.title.startswith(title_start))
    cells = next(values for name, values in t.rows if name == label)
    return dict(zip(t.columns[1:], cells))


def _parameters(lr: LessonRun) -> int:
    """The zero lesson's parameters: DP's range over the whole flat buffer."""
    return sum(b - a for a, b in lr.result.values[0]["DP"]["ranges"])


def _joined(names: Any) -> str:
    """Op names as a sentence says them: reduce-scatter + all-gather."""
    return " + ".join(op.replace("_", "-") for op in names)


def _dp(runs: LessonRuns) -> Cells:
    lr = runs["zero"]
    params = _parameters(lr)
    per = _fig(lr, "DP: bytes a rank holds at rest") / params
    calls = ops(lr, "DP")["all_reduce"]
    return (
        f"the batch ({lr.result.world} ranks)",
        f"all-reduce of the gradients, once a step ({calls} buckets)",
        f"the whole model on every GPU: {per:g} B a parameter",
        {"ranks": lr.result.world, "parameters": params, "bytes_per_parameter": per, "all_reduce_calls": calls},
    )


def _zero(runs: LessonRuns) -> Cells:
    lr = runs["zero"]
    params = _parameters(lr)
    per = {s: _fig(lr, f"{s}: bytes a rank holds at rest") / params for s in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")}
    sent = {s: _fig(lr, f"{s}: bytes a rank sends") for s in ("DP", "ZeRO-1", "ZeRO-3")}
    said = {s: _joined(sorted(ops(lr, s), reverse=True)) for s in ("ZeRO-1", "ZeRO-3")}
    more = sent["ZeRO-3"] / sent["DP"]
    return (
        "Adam's state / + gradients / + weights: "
        + " / ".join(f"{per[s]:g}" for s in ("ZeRO-1", "ZeRO-2", "ZeRO-3"))
        + f" B a parameter (plain DP: {per['DP']:g})",
        f"{said['ZeRO-1']}: DP's bytes ({sent['ZeRO-1'] / sent['DP']:g}x); ZeRO-3 gathers the weights for backward too",
        f"ZeRO-3 sends {more:g}x DP's bytes every step",
        {"bytes_per_parameter": per, "bytes_sent": sent, "zero3_over_dp": more},
    )


def _tp(runs: LessonRuns) -> Cells:
    lr, nodes = runs["tp-attention"], runs["tp-across-nodes"]
    fwd, bwd = ops(lr, "one layer forward")["all_reduce"], ops(lr, "one layer backward")["all_reduce"]
    t = lr.result.world
    heads = len({h for v in lr.result.values for h in v["mha"]["held"]["q"]})  # the query heads the ranks hold
    # the same layer on the clock at TP 8 in a node and TP 16 over two (tp-across-nodes: a second's run, where
    # rules-of-thumb's whole step took seven)
    layer = {
        n: _table_row(nodes, "One 27B dense layer", n)["layer (ms)"]
        for n in ("TP 8 inside one node", "TP 16 over two nodes")
    }
    slower = f"{layer['TP 16 over two nodes'] / layer['TP 8 inside one node']:.2f}x"
    return (
        f"weight matrices: whole heads ({t} ranks)",
        f"{fwd + bwd} all-reduces a layer ({fwd} forward, {bwd} backward)",
        f"t divides the heads ({heads} here); over two nodes a TP 16 layer takes {slower} TP 8's time",
        {"tp": t, "all_reduce_forward": fwd, "all_reduce_backward": bwd, "heads": heads, "over_two_nodes": slower},
    )


def _sp(runs: LessonRuns) -> Cells:
    lr = runs["sp"]
    t = lr.result.world
    said = _joined(op for op in ("reduce_scatter", "all_gather") if ops(lr, "TP + SP")[op])
    ratio = _fig(lr, "bytes rank 0 sent, TP + SP (all-gathers, reduce-scatters)") / _fig(
        lr, "bytes rank 0 sent, TP alone (all-reduces)"
    )
    less = _fig(lr, "TP alone keeps this many times what TP + SP keeps")
    return (
        f"tokens between TP's products (1/{t} each)",
        f"{said} for each all-reduce: {ratio:g}x TP's bytes (backward gathers again)",
        f"its group is TP's; {less:.2f}x less activation memory",
        {"tp": t, "bytes_over_tp": ratio, "activations_less": less},
    )


def _cp(runs: LessonRuns) -> Cells:
    ring, causal = runs["ring-attention"], runs["cp-causal"]
    cp = ring.result.world
    forward = next(e.phase for e in ring.result.trace.events if e.phase and e.phase.startswith("forward"))
    passes = ops(ring, forward)["p2p"] // cp  # each rank's sends: K and V, cp - 1 times
    slow = _fig(causal, "zigzag's speed-up of the slowest rank")
    return (
        f"the sequence, through the whole layer (1/{cp} each)",
        f"K and V around a ring: {passes // 2} passes a layer forward, their gradients back",
        f"causal imbalance: zigzag makes the busiest rank {slow:g}x faster",
        {"cp": cp, "sends_forward": passes, "zigzag_speedup": slow},
    )


def _pp(runs: LessonRuns) -> Cells:
    lr = runs["pp-1f1b"]
    p, m = lr.result.world, lr.result.trace.meta["knobs"]["m"]
    bubble = Fraction(str(lr.result.values[0]["bubble"]))
    sends = ops(lr, "running it")["p2p"]
    return (
        f"the layers ({p} stages)",
        f"point to point at the {p - 1} cuts: activations forward, gradients back ({sends} sends)",
        f"the bubble, (p - 1)/(m + p - 1): {bubble} at p = {p}, m = {m}",
        {"pp": p, "microbatches": m, "bubble": str(bubble), "p2p": sends},
    )


def _ep(runs: LessonRuns) -> Cells:
    lr = runs["hot-expert"]
    rows = {ep: _table_row(lr, "One MoE layer", f"skewed:0.5 routing, EP {ep}") for ep in (4, 8)}
    a2a = [e for e in lr.result.trace.events if e.phase == "uniform routing, EP 4" and e.op == "all_to_all"]
    per_group = len(a2a) // len({tuple(e.group.ranks) for e in a2a})  # EP 4 on 8 GPUs: two groups, each its own
    waits = {ep: rows[ep]["of the layer"] for ep in rows}
    return (
        "the experts (1/8 each at EP 8)",
        f"all-to-all of tokens: {per_group} a MoE layer ({per_group // 2} forward, {per_group // 2} backward)",
        f"the busiest GPU sets the pace: a hot expert keeps the others waiting {waits[4]} of the layer at "
        f"EP 4, {waits[8]} at EP 8",
        {"all_to_all_per_layer": per_group, "wait_share": waits},
    )


@dataclass(frozen=True)
class Method:
    """One row of the cheat sheet: the method's name, the lessons it is read from, and how."""

    name: str
    lessons: tuple[str, ...]
    cells: Callable[[LessonRuns], Cells]


CHEAT_ROWS: tuple[Method, ...] = (
    Method("DP", ("zero",), _dp),
    Method("ZeRO-1/2/3", ("zero",), _zero),
    Method("TP", ("tp-attention", "tp-across-nodes"), _tp),
    Method("SP", ("sp",), _sp),
    Method("CP", ("ring-attention", "cp-causal"), _cp),
    Method("PP", ("pp-1f1b",), _pp),
    Method("EP", ("hot-expert",), _ep),
)


@dataclass(frozen=True)
class Row:
    method: str
    splits: str
    communication: str
    limit: str
    lessons: tuple[str, ...]
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheatSheet:
    rows: list[Row]

    def table(self) -> Table:
        return Table(
            "The cheat sheet, every cell from a run (the lessons at the right, each at its own sizes)",
            ["method", "splits", "communication", "main limit", "from"],
            [(r.method, [r.splits, r.communication, r.limit, ", ".join(r.lessons)]) for r in self.rows],
            notes=[
                "every figure is the run's: `parasim lesson NAME` steps through the run behind it; "
                "`parasim cheatsheet --json` gives each row's figures."
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [
                {
                    "method": r.method,
                    "splits": r.splits,
                    "communication": r.communication,
                    "limit": r.limit,
                    "lessons": list(r.lessons),
                    "figures": r.figures,
                }
                for r in self.rows
            ]
        }


def cheat_sheet(progress: Callable[[str], None] | None = None) -> CheatSheet:
    """Run every lesson the rows read (each once; `progress` told each name as it starts) and make the rows."""
    runs: LessonRuns = {}
    for method in CHEAT_ROWS:
        for name in method.lessons:
            if name not in runs:
                if progress is not None:
                    progress(name)
                runs[name] = run_lesson(get_lesson(name))
    rows = []
    for method in CHEAT_ROWS:
        splits, communication, limit, figures = method.cells(runs)
        rows.append(Row(method.name, splits, communication, limit, method.lessons, figures))
    return CheatSheet(rows)

"""The post's cheat sheet, every cell computed: for each way of splitting the work, what it splits, what it
sends and what limits it, each read from a lesson's run at that lesson's sizes (`parasim cheatsheet`).

One entry per method (CHEAT_ROWS): the lessons it reads and the function that makes its cells from their runs.
Each lesson runs once however many rows read it. A cell says its figure and where it came from; the row names
its lessons, so a learner can open the run behind any cell (`parasim lesson NAME`). Where a cell needs more
than a line to be right (SP's bytes over TP's, CP's masks), the row carries a note for that column: a table
marks the cell [n] and prints the note under it (`footnoted`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from ..lesson import LessonRun, Table, get_lesson, run_lesson, sent_in_phase

LessonRuns = dict[str, LessonRun]
# splits, communication, main limit; the figures behind them; notes on a column's cell ({column: note})
Cells = tuple[str, str, str, dict[str, Any], dict[str, str]]
CELL_COLUMNS = ("splits", "communication", "limit")  # a row's cells, in the table's order


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
        f"all-reduce of the gradients ({calls} buckets a step)",
        f"the whole model on every GPU: {per:g} B a parameter",
        {"ranks": lr.result.world, "parameters": params, "bytes_per_parameter": per, "all_reduce_calls": calls},
        {},
    )


def _zero(runs: LessonRuns) -> Cells:
    lr = runs["zero"]
    params = _parameters(lr)
    per = {s: _fig(lr, f"{s}: bytes a rank holds at rest") / params for s in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")}
    sent = {s: _fig(lr, f"{s}: bytes a rank sends") for s in ("DP", "ZeRO-1", "ZeRO-3")}
    said = {s: _joined(sorted(ops(lr, s), reverse=True)) for s in ("ZeRO-1", "ZeRO-3")}
    more = sent["ZeRO-3"] / sent["DP"]
    return (
        "Adam / + grads / + weights: "
        + " / ".join(f"{per[s]:g}" for s in ("ZeRO-1", "ZeRO-2", "ZeRO-3"))
        + " B a param",
        f"{said['ZeRO-1']}: DP's bytes ({sent['ZeRO-1'] / sent['DP']:g}x)",
        f"ZeRO-3 gathers weights twice: {more:g}x DP's bytes",
        {"bytes_per_parameter": per, "bytes_sent": sent, "zero3_over_dp": more},
        {},
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
        f"weight matrices, by whole heads ({t} ranks)",
        f"{fwd + bwd} all-reduces a layer ({fwd} forward, {bwd} backward)",
        f"t must divide heads ({heads}); 2 nodes {slower} slower",
        {"tp": t, "all_reduce_forward": fwd, "all_reduce_backward": bwd, "heads": heads, "over_two_nodes": slower},
        {
            "limit": f"TP: a layer at TP 16 over two nodes takes {slower} the time of TP 8 inside one "
            "(tp-across-nodes): its all-reduces leave the node's links.",
        },
    )


def _sp(runs: LessonRuns) -> Cells:
    lr = runs["sp"]
    t, res = lr.result.world, lr.result
    said = _joined(op for op in ("reduce_scatter", "all_gather") if ops(lr, "TP + SP")[op])
    ratio = _fig(lr, "bytes rank 0 sent, TP + SP (all-gathers, reduce-scatters)") / _fig(
        lr, "bytes rank 0 sent, TP alone (all-reduces)"
    )
    less = _fig(lr, "TP alone keeps this many times what TP + SP keeps")
    # what the 'TP + SP' layer sent beyond the pairs that replace TP's all-reduces: backward's gathers of the
    # saved slices once more (the sp lesson labels them 'again'), and the whole weights' gradient sums
    again = [e for e in res.trace.events if e.phase == "TP + SP" and e.op == "all_gather" and "again" in e.label]
    regathered = sent_in_phase(res, "TP + SP", lambda e: e in again)
    pairs = sent_in_phase(res, "TP + SP", lambda e: e.op in ("all_gather", "reduce_scatter") and e not in again)
    alone = sent_in_phase(res, "TP alone", lambda e: e.op == "all_reduce")
    sums = [e for e in res.trace.events if e.phase == "TP + SP" and e.op == "all_reduce"]
    summed = sent_in_phase(res, "TP + SP", lambda e: e in sums)
    before = " and ".join(sorted({e.label.split(" backward")[0].rsplit(".", 1)[-1] for e in again}))
    same = "the same bytes" if pairs == alone else f"{pairs / alone:g}x the bytes"
    why = (
        f"SP: its {said} pairs move {same} as TP's all-reduces ({pairs:,} B against {alone:,} B, rank 0, one "
        f"layer). The {ratio:g}x comes from backward: SP keeps only its slice of the sequence, so before the "
        f"weight-gradient products of {before} it gathers the whole input again, {len(again)} more all-gathers "
        f"a layer ({regathered:,} B). Left out of the {ratio:g}x: {len(sums)} small all-reduces ({summed:,} B) "
        "that sum the norms' and biases' gradients."
    )
    return (
        f"tokens between TP's products (1/{t} each)",
        f"{said}: {ratio:g}x TP's bytes",
        f"its group is TP's; {less:.2f}x less activation memory",
        {
            "tp": t,
            "bytes_over_tp": ratio,
            "activations_less": less,
            "pairs_bytes": pairs,
            "tp_bytes": alone,
            "regathers": len(again),
            "regathered_bytes": regathered,
            "gradient_sum_bytes": summed,
        },
        {"communication": why},
    )


def _cp(runs: LessonRuns) -> Cells:
    ring, causal = runs["ring-attention"], runs["cp-causal"]
    cp = ring.result.world
    forward = next(e.phase for e in ring.result.trace.events if e.phase and e.phase.startswith("forward"))
    passes = ops(ring, forward)["p2p"] // cp  # each rank's sends: K and V, cp - 1 times
    slow = _fig(causal, "zigzag's speed-up of the slowest rank")
    return (
        f"the sequence, through the whole layer (1/{cp} each)",
        f"K, V around a ring: {passes // 2} passes forward, grads back",
        f"causal imbalance (zigzag {slow:g}x); custom masks",
        {"cp": cp, "sends_forward": passes, "zigzag_speedup": slow},
        {
            "limit": "CP: a rank meets the other ranks' keys one chunk at a time, so the attention mask is "
            f"applied chunk by chunk. Zigzag evens out the plain causal mask ({slow:g}x faster busiest rank in "
            "cp-causal) because its shape is known in advance; a mask of any other shape (image tokens that see "
            "each other both ways, packed documents kept apart, an arbitrary pattern) leaves the ranks uneven "
            "work again, or needs an attention kernel written to skip and split chunks by that mask."
        },
    )


def _pp(runs: LessonRuns) -> Cells:
    lr = runs["pp-1f1b"]
    p, m = lr.result.world, lr.result.trace.meta["knobs"]["m"]
    bubble = Fraction(str(lr.result.values[0]["bubble"]))
    sends = ops(lr, "running it")["p2p"]
    return (
        f"the layers ({p} stages)",
        f"{p - 1} cuts: activations on, grads back ({sends} sends)",
        f"bubble (p-1)/(m+p-1) = {bubble} at p = {p}, m = {m}",
        {"pp": p, "microbatches": m, "bubble": str(bubble), "p2p": sends},
        {},
    )


def _ep(runs: LessonRuns) -> Cells:
    lr = runs["hot-expert"]
    rows = {ep: _table_row(lr, "One MoE layer", f"skewed:0.5 routing, EP {ep}") for ep in (4, 8)}
    a2a = [e for e in lr.result.trace.events if e.phase == "uniform routing, EP 4" and e.op == "all_to_all"]
    per_group = len(a2a) // len({tuple(e.group.ranks) for e in a2a})  # EP 4 on 8 GPUs: two groups, each its own
    waits = {ep: rows[ep]["of the layer"] for ep in rows}
    return (
        "the experts (1/8 each at EP 8)",
        f"{per_group} all-to-alls of tokens a layer ({per_group // 2} each way)",
        f"hot expert: others wait {waits[4]} / {waits[8]}",
        {"all_to_all_per_layer": per_group, "wait_share": waits},
        {
            "limit": f"EP: when half the tokens pick one expert first, the GPU holding it sets the layer's pace; "
            f"the others wait {waits[4]} of the layer at EP 4 and {waits[8]} at EP 8 (it holds fewer experts, so "
            "the hot one is more of its work)."
        },
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
    notes: dict[str, str] = field(default_factory=dict)  # {column: what its cell needs said at more length}


def footnoted(rows: list[Row], columns: tuple[str, ...]) -> tuple[list[list[str]], list[str]]:
    """The rows' cells in `columns` (of CELL_COLUMNS), a cell with a note marked [n], and the notes, numbered in
    the order the marks are read (row by row, left to right): a table shows only the notes of its columns."""
    cells, notes = [], []
    for r in rows:
        said = []
        for c in columns:
            text = getattr(r, c)
            if c in r.notes:
                notes.append(f"[{len(notes) + 1}] {r.notes[c]}")
                text += f" [{len(notes)}]"
            said.append(text)
        cells.append(said)
    return cells, notes


@dataclass(frozen=True)
class CheatSheet:
    rows: list[Row]

    def table(self) -> Table:
        cells, notes = footnoted(self.rows, CELL_COLUMNS)
        return Table(
            "The cheat sheet, every cell from a run (the lessons at the right, each at its own sizes)",
            ["method", "splits", "communication", "main limit", "from"],
            [(r.method, [*c, ", ".join(r.lessons)]) for r, c in zip(self.rows, cells)],
            notes=notes
            + [
                "every figure is the run's: `parasim lesson NAME` steps through the run behind it; "
                "`parasim cheatsheet --json` gives each row's figures and notes."
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
                    "notes": dict(r.notes),
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
        splits, communication, limit, figures, notes = method.cells(runs)
        rows.append(Row(method.name, splits, communication, limit, method.lessons, figures, notes))
    return CheatSheet(rows)

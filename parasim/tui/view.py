"""What the step-through screen shows at step k, in plain Python (no Textual): the rank x step grid, the
selected event's details, what each rank holds around it (values and placements), and the narrative.

Stepping goes one event at a time, in the order events completed (their seq); the grid's columns are the
logical steps of the trace. Filters (by op or axis) and a focused rank narrow what stepping visits.

Every string a panel shows that came from the trace or the program (names, labels, phases, notes, sites,
dtypes) leaves this model through `printable`: the app draws it as it is, never as a terminal command.
(The app puts these strings into Rich Text, which reads no markup, so '[bold]' in a name stays literal.)
"""

from __future__ import annotations

import copy

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm.ops import OPS
from ..layout.axes import AXES, SIZED
from ..lesson import Table
from ..render.numbers import alike_chunks, scalar
from ..render.text import printable
from ..comm.trace import Event, Trace
from ..engine.collector import collector_paused
from .grid import IDLE, CELLS, kind_of
from .marks import MarkIndex
from .memory import SHOWN, HeldIndex, held_rows  # SHOWN: members (and tensors of one) a panel lists


# Why `t` shows no hops for an event, by kind of event (a collective that ran without a ring says its algorithm).
NO_HOPS = {
    "p2p": "a point-to-point message (one send, one receive) has no ring hops",
    "compute": "compute moves no data: no ring hops",
    "collective": "this {op} ran {algo}, not as a ring: no hops",
}


def placement(e: Event, side: str) -> str:
    """How a collective's input or output is laid out over its group (DTensor's words, from the op table)."""
    if e.kind == "collective" and e.op in OPS:
        return OPS[e.op].words(side, e.params)
    return "point-to-point" if e.kind == "p2p" else ""


def fmt(v: Any) -> str:
    """Small arrays as compact rows, the numbers as every renderer writes them (render/numbers.py), floats to 4
    significant digits."""
    if isinstance(v, list):
        if v and all(isinstance(x, list) for x in v) and len(v) == 1:
            return fmt(v[0])
        return "[" + " ".join(fmt(x) for x in v) + "]"
    return scalar(v, digits=4, grouped=False)  # a tensor's values, in a narrow panel


def _tensor(t) -> str:
    return f"{t.dtype}[{','.join(map(str, t.shape))}]"


MAX_ROWS = 64  # ranks drawn one row each; a bigger world opens with its ranks folded by an axis


def _tensors(ts: tuple) -> str:
    """A member's tensors: a few alike but for their rows (an all-to-all's chunks, one a rank) as their count and
    rows, 4 x float64[2/1/0/0,10], as the walk-through writes them; other few as they are; many, runs of equal
    ones written once with a count."""
    chunks = alike_chunks(list(ts), 8, sep=",") if len(ts) <= 8 else None
    if chunks is not None:
        return chunks
    if len(ts) <= 8:
        return " ".join(_tensor(t) for t in ts) or "-"
    runs: list[list] = []
    for t in ts:
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    return " ".join(_tensor(t) + (f" x{n}" if n > 1 else "") for t, n in runs)


@dataclass
class Holding:
    rank: int
    role: str  # "in" / "out" / "sends" / "receives"
    shape: str
    placement: str
    values: str  # "" when the trace kept no values


@dataclass
class SlotWindow:
    """A window of a pipeline slot table: rows of action labels ("." idle) over slots [first, last), the
    slot whose end the selected transfer happens at (actions before it are done), and the ranks moving data."""

    names: list[str]
    rows: list[list[str]]
    first: int
    last: int
    slot: int | None
    ranks: list[int]


@dataclass
class MapView:
    """The GPUs by node, as the post draws its map: per node one row per DP replica, columns by (CP rank,
    TP rank); which GPUs the selected event involves, and the followed token's GPU."""

    nodes: list[list[list[int]]]  # node -> rows -> GPUs
    involved: set[int]
    token: int | None
    gpus_per_node: int


# a trace made on a layout has a group over each axis a layout is given a size for (layout/axes.py)
MAP_KINDS = tuple(AXES[name].group for name in SIZED)  # tp, cp, dp, pp, ep, expert-tp
MAP_MAX_GPUS = 64


def _layout_of(trace: Trace) -> Any:
    """The layout a trace's groups were made from (`ctx.use_layout`), read back from their sizes; None when
    the trace was not made on a layout, or is too large to draw."""
    from ..layout import Layout, LayoutError

    sizes = {}
    for g in trace.groups:
        if g.name in MAP_KINDS:
            sizes.setdefault(g.name, len(g.ranks))
    if set(sizes) != set(MAP_KINDS) or trace.world > MAP_MAX_GPUS:
        return None
    try:
        layout = Layout(**{name: sizes[AXES[name].group] for name in SIZED}, world=trace.world)
    except LayoutError:
        return None
    made = {(g.name, tuple(g.ranks)) for g in trace.groups if g.name in MAP_KINDS}
    wanted = {(k, tuple(r)) for k, lists in layout.groups().items() if k in MAP_KINDS for r in lists}
    return layout if made == wanted else None  # the other rank order, or hand-made groups: no map


@dataclass
class Watch:
    """The followed token at the selected event: its name, the rank holding it (None: not in this phase)."""

    token: str
    rank: int | None
    notes: list[str]


def _watch_notes(trace: Trace) -> tuple[str, dict[Any, int], dict[str, list[str]], dict[str, dict]]:
    """The followed token, its holder per place (a phase's micro-batch and layer, read from the phase's
    fields: a backward phase finds the rank that held the token in its forward twin), and the notes left
    in each phase. Phase names are never parsed."""
    token, holders, said = "", {}, {}
    if not trace.noted("watch"):
        return token, holders, said, {}  # nothing followed (a folded trace's copies repeat what ran: none either)
    fields = {m.text: m.data for m in trace.marks if m.kind == "phase" and m.data}
    for phase, rank, text, data in trace.notes("watch"):
        if data["watch"] == "holds":
            token = token or data["token"]
            continue
        holders.setdefault(_place(fields, phase), rank)
        said.setdefault(phase, []).append(f"g{rank}: {text}")
    return token, holders, said, fields


def _place(fields: dict[str, dict], phase: str) -> Any:
    f = fields.get(phase) or {}
    return (f["micro_batch"], f["layer"]) if "micro_batch" in f and "layer" in f else phase


def _least_of_each(packed: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """From numbers key x base + value: the keys in order, and the least value of each."""
    packed = np.sort(packed)
    keys = packed // base
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    return keys[first], packed[first] % base


def _looked_up(table: tuple[list[int], list[int]], key: int) -> int | None:
    """The value of `key` in (sorted keys, values), or None."""
    keys = table[0]
    i = bisect_left(keys, key)
    return table[1][i] if i < len(keys) and keys[i] == key else None


@dataclass
class View:
    trace: Trace
    narrative: dict[str, str] = field(default_factory=dict)
    title: str = ""
    show_hops: bool = False
    filter_text: str = ""
    focus_rank: int | None = None
    divergence: dict | None = None  # `parasim check`'s first divergence, marked in the timeline
    tables: list[Any] = field(default_factory=list)  # the lesson's tables of this run (parasim.lesson.Table)
    time_mode: bool = False  # the grid's columns in microseconds on the clock (tui/clockgrid.py), not steps
    clock_choice: Any = None  # the GPU type and overlap the time view lays the run out on (None: the default)

    def __post_init__(self) -> None:
        # a folded trace written out, the cells' keys, the rows' columns: at real size a million records, none in a
        # cycle, made with the cyclic collector paused once over them all (engine/collector.py: one collection
        # after, or none where the caller holds it until the app has painted)
        with collector_paused():
            self._build()

    def _build(self) -> None:
        self.title = printable(self.title)
        self._with_events: set[str | None] | None = None  # the phases that hold an event, read when first asked
        # a folded run's events written out one by one as the app visits them (engine/symbolic/fold.py)
        self.events = self.trace.on_demand()
        ranks, at, steps = self.trace.grid_places()
        self.step_columns = max(int(steps.max()) if len(steps) else 1, 1)
        self._clock: Any = None  # tui/clockgrid.ClockGrid, made when the grid first shows time
        # (rank, step) -> the first event the rank is in at that step, what a cell shows: 600,000 members at real
        # size, so sorted keys (rank x width + step) with the event's place below them, in numpy, looked up by
        # bisection; the first of a key's is the event that comes first
        self._width = width = self.step_columns + 1
        n = max(len(self.events), 1)
        self._cell_keys, events = _least_of_each((ranks * width + steps[at]) * n + at, n)
        self._cells = (self._cell_keys.tolist(), events.tolist())
        self._visible = list(range(len(self.events)))
        self._watch: tuple | None = None  # the followed token's notes, parsed on first use
        self.fold_axis: str | None = None
        self._held: Any = None  # tui/memory.py's index of each rank's holds, made on first use
        self.marks = MarkIndex(self.trace)  # what the marks say, read once (tui/marks.py)
        self._row_firsts: tuple[list[int], list[int]] = ([], [])  # folded rows: row x width + column -> first busy rank
        self.rows: list[tuple[str, tuple[int, ...]]] = [(f"rank {r}", (r,)) for r in range(self.trace.world)]
        if self.trace.world > MAX_ROWS:  # a real-size world opens folded: a row per group, not 2,048 rows
            self.fold(self._opening_fold())

    # -- folding ranks into their groups -------------------------------------------------------------
    def fold_axes(self) -> list[str]:
        """Group names that partition the world (tp, dp, ...), the candidates for folding rows."""
        out = []
        for name in dict.fromkeys(g.name for g in self.trace.groups if g.name != "world"):
            members = sorted(r for g in self.trace.groups if g.name == name for r in g.ranks)
            if members == list(range(self.trace.world)):
                out.append(name)
        return out

    def _opening_fold(self) -> str | None:
        """A big world's opening fold: one row per data-parallel group when that fits (a row per pipeline
        stage and model-parallel place: the schedule at a glance), else the axis that makes the most rows
        that fit on a screen."""
        counts = {a: len({g.ranks for g in self.trace.groups if g.name == a}) for a in self.fold_axes()}
        fits = [a for a, n in counts.items() if 1 < n <= MAX_ROWS]
        if "dp-cp" in fits:
            return "dp-cp"
        return max(fits, key=lambda a: counts[a]) if fits else None

    def fold(self, axis: str | None) -> None:
        """One row per group of `axis` (None: one row per rank)."""
        self.fold_axis = axis
        self._row_firsts = ([], [])
        if axis is None:
            self.rows = [(f"rank {r}", (r,)) for r in range(self.trace.world)]
            return
        groups = sorted({g.ranks for g in self.trace.groups if g.name == axis}, key=min)
        self.rows = [(f"{printable(axis)}·{min(g)}", tuple(sorted(g))) for g in groups]
        # each row's first busy rank per column (its lowest: a row's ranks are in order), from the cells' keys at
        # once (rows of 128 ranks are drawn often): sorted keys (row x width + column) with the rank below them
        world, width = self.trace.world, self._width
        row_of = np.full(world, -1, dtype=np.int64)
        for k, (_, rs) in enumerate(self.rows):
            row_of[list(rs)] = k
        rank, column = self._cell_keys // width, self._cell_keys % width
        row = row_of[rank]
        keys, firsts = _least_of_each(((row * width + column) * world + rank)[row >= 0], world)
        self._row_firsts = (keys.tolist(), firsts.tolist())

    def next_fold(self) -> str | None:
        """Cycle: unfolded, then each axis that partitions the world, then unfolded again. Returns the axis
        folded by, as shown (None: unfolded)."""
        axes = [None] + self.fold_axes()
        self.fold(axes[(axes.index(self.fold_axis) + 1) % len(axes)] if self.fold_axis in axes else None)
        return None if self.fold_axis is None else printable(self.fold_axis)

    # -- which events stepping visits --------------------------------------------------------------
    def set_filter(self, text: str) -> None:
        """Keep events whose op, kind, group (axis) or label contains `text` ('' keeps all)."""
        self.filter_text = text.strip().lower()
        self._refilter()

    def set_focus(self, rank: int | None) -> None:
        self.focus_rank = rank
        self._refilter()

    def _refilter(self) -> None:
        t, r = self.filter_text, self.focus_rank
        self._visible = [
            i
            for i, e in enumerate(self.events)
            if (not t or t in e.op.lower() or t in e.kind or t in e.group.name.lower() or t in (e.label or "").lower())
            and (r is None or r in e.ranks)
        ]

    @property
    def visible(self) -> list[int]:
        return self._visible

    def clamp(self, index: int) -> int:
        """The nearest visible event index at or after `index` (or the last one)."""
        if not self._visible:
            return 0
        pos = bisect_left(self._visible, index)  # visible indices are in order: a step looks up, never scans
        return self._visible[min(pos, len(self._visible) - 1)]

    def move(self, index: int, delta: int) -> int:
        """Step `delta` visible events from `index`."""
        if not self._visible:
            return index
        pos = self._nearest(index)
        return self._visible[max(0, min(len(self._visible) - 1, pos + delta))]

    def _nearest(self, index: int) -> int:
        """The position in `visible` of the visible event nearest `index` (the lower one on a tie)."""
        pos = bisect_left(self._visible, index)
        if pos == len(self._visible) or (pos > 0 and index - self._visible[pos - 1] <= self._visible[pos] - index):
            return pos - 1
        return pos

    def at(self, rank: int, column: int) -> int | None:
        """The event a click on (rank, column: a logical step, or a slice of time) selects."""
        if self.time_mode:
            return self.clock.event_at(rank, column)
        return self._cell_event(rank, column)

    def _cell_event(self, rank: int, column: int) -> int | None:
        """The first event `rank` is in at step `column` (None: none)."""
        if not (0 <= column < self._width and 0 <= rank < self.trace.world):
            return None  # a key out of range would name another rank's cell
        return _looked_up(self._cells, rank * self._width + column)

    # -- steps or time -------------------------------------------------------------------------------
    @property
    def clock(self) -> Any:
        if self._clock is None:
            from .clockgrid import ClockGrid

            self._clock = (
                ClockGrid(self.trace, self.events)
                if self.clock_choice is None
                else ClockGrid(self.trace, self.events, self.clock_choice)
            )
        return self._clock

    def on_clock(self, choice: Any) -> "View":
        """This view of the same trace, its time view on another clock (`choice`, clock/report.ClockChoice): the
        grid's index shared, the time view made again when shown."""
        out = copy.copy(self)
        out.clock_choice, out._clock = choice, None
        return out

    def toggle_time(self) -> None:
        """The grid's columns: logical steps, or microseconds on the clock."""
        self.time_mode = not self.time_mode

    @property
    def columns(self) -> int:
        return self.clock.columns if self.time_mode else self.step_columns

    def column_of(self, index: int) -> int:
        """The 0-based column of event `index`: its step, or where its transfer starts on the clock."""
        e = self.events[index]
        return self.clock.column_of(e.seq) if self.time_mode else e.step - 1

    def time_cell(self, row: int, column: int) -> tuple[str, str, bool, int | None]:
        """A row's cell on the clock: (text, style, on the critical path, the event it belongs to); a folded
        row shows its first rank."""
        return self.clock.cell(self.rows[row][1][0], column)

    # -- the grid ------------------------------------------------------------------------------------
    def kinds_seen(self) -> set[str]:
        """The kinds of cell the grid holds (the legend's): a point-to-point event is a send and a receive."""
        seen: set[str] = set()
        # one look per event that ran: a copy (a folded run's) is of its source's kind
        for e in self.trace.ran_events:
            seen.update(("send", "recv") if e.kind == "p2p" else ("compute",) if e.kind == "compute" else (e.op,))
        return seen

    def cell(self, rank: int, column: int) -> tuple[str, str]:
        """(two characters, style name) of one grid cell."""
        found = self._cell_event(rank, column)
        if found is None:
            return IDLE
        e = self.events[found]
        return CELLS.get(kind_of(e, rank), ("??", "compute"))

    def row_cell(self, row: int, column: int) -> tuple[str, str]:
        """A row's cell: its first rank that did something at that step (folded rows hold several ranks)."""
        ranks = self.rows[row][1]
        if len(ranks) == 1:
            return self.cell(ranks[0], column)
        rank = _looked_up(self._row_firsts, row * self._width + column) if 0 <= column < self._width else None
        return IDLE if rank is None else self.cell(rank, column)

    def diverged(self) -> int | None:
        """The index of the event `parasim check` pinned the first divergence on, if any."""
        seq = (self.divergence or {}).get("event")
        return next((i for i, e in enumerate(self.events) if e.seq == seq), None) if seq is not None else None

    def diverged_at(self, row: int, column: int) -> bool:
        if self.time_mode:
            return False
        i = self.diverged()
        if i is None:
            return False
        e = self.events[i]
        return e.step == column and any(r in e.ranks for r in self.rows[row][1])

    def divergence_lines(self, index: int) -> list[str]:
        """For the pinned event: what differs from the reference, by how much, and both values when small."""
        d = self.divergence
        if d is None or index != self.diverged():
            return []
        lines = [
            f"FIRST DIVERGENCE: '{d['name']}' ({d['placement']} on {d['marked_on']})",
            f"max abs {d['max_abs']:.3g}, max rel {d['max_rel']:.3g} "
            + (f"({d['allowance']})" if d.get("allowance") else f"(tolerance {d['tolerance']:g})"),
        ]
        if d.get("would_match"):
            lines.append(d["would_match"])
        if d.get("got") is not None:
            lines += [f"this run:  {fmt(d['got'])}", f"reference: {fmt(d['want'])}"]
        return lines

    def takes_part(self, index: int, rank: int) -> bool:
        return rank in self.events[index].ranks

    # -- the panels ----------------------------------------------------------------------------------
    def detail(self, index: int) -> list[str]:
        if not self.events:
            return ["(this trace has no events)"]
        e = self.events[index]
        if e.kind == "compute":  # one rank's own work: no group, nothing sent
            flops = e.params.get("flops")
            return self.divergence_lines(index) + [
                f"#{e.seq}  step {e.step}  compute on rank {', '.join(str(r) for r in e.ranks)}",
                e.op,
                *([f"{float(flops):,.0f} FLOPs"] if flops is not None else []),
                *([f"called at {e.members[0].site}"] if e.members else []),
            ]
        head = f"#{e.seq}  step {e.step}  {e.op}"
        if e.kind == "p2p":
            head += f"  rank {e.params['src']} -> rank {e.params['dst']}"
        lines = self.divergence_lines(index)
        lines += [head, f"group {e.group.name} {list(e.group.ranks)}" + (f"   '{e.label}'" if e.label else "")]
        params = {k: v for k, v in e.params.items() if k not in ("src", "dst")}
        if params:
            lines.append("  ".join(f"{k}={v}" for k, v in params.items()))
        # what every rank shares is said once (a data-parallel sum of 8 ranks: 10 lines, not 17); the rest in
        # short lines per rank, so a narrow panel does not wrap them mid-phrase
        same_bytes = len(e.members) > 1 and len({(m.sent, m.recv) for m in e.members}) == 1
        one_site = len({m.site for m in e.members}) == 1
        if same_bytes:
            lines.append(f"each rank sent {e.members[0].sent:,} B and received {e.members[0].recv:,} B")
        if one_site:
            lines.append(f"called at {e.members[0].site}")
        for m in e.members[:SHOWN]:
            lines.append(f"rank {m.rank:<3} {_tensors(m.ins)} -> {_tensors(m.outs)}")
            if not same_bytes:
                lines.append(
                    f"         sent {m.sent:,} B, received {m.recv:,} B" + ("" if one_site else f", at {m.site}")
                )
        if len(e.members) > SHOWN:
            lines.append(
                f"... and {len(e.members) - SHOWN} more ranks: sent {sum(m.sent for m in e.members):,} B by all of them"
            )
        if self.show_hops and e.hops:
            for hop in e.hops:
                moves = "  ".join(
                    f"{t['src']}->{t['dst']}:c{t['chunk']}" + (f"={fmt(t['value'])}" if t["value"] is not None else "")
                    for t in hop["transfers"]
                )
                lines.append(f"hop {hop['hop'] + 1} {hop['phase']}: {moves}")
        elif e.hops:
            lines.append(f"ring algorithm: {len(e.hops)} hops (t shows them)")
        return [printable(line) for line in lines]

    def holdings(self, index: int) -> list[Holding]:
        """Per rank taking part: what it held going in and what it holds coming out of the event."""
        if not self.events:
            return []
        e = self.events[index]
        out = []
        for m in e.members[:SHOWN]:
            for side, tensors, values in (("in", m.ins, m.before), ("out", m.outs, m.after)):
                for j, t in enumerate(tensors[:SHOWN]):
                    role = side if e.kind != "p2p" else ("sends" if side == "in" else "receives")
                    shown = fmt(values[j]) if values and j < len(values) else ""
                    out.append(Holding(m.rank, role, printable(_tensor(t)), printable(placement(e, side)), shown))
        return out

    def watch(self, index: int) -> Watch | None:
        """For traces that follow one token (notes with a `watch` field, as `parasim trace` runs leave them): the
        rank holding it in the selected event's phase, and what the holder noted there."""
        if not self.events:
            return None
        if self._watch is None:
            self._watch = _watch_notes(self.trace)
        token, holders, said, fields = self._watch
        if not holders:
            return None
        phase = self.events[index].phase or ""
        rank = holders.get(_place(fields, phase))
        if rank is None:
            return Watch(printable(token), None, [])
        return Watch(printable(token), rank, [printable(n) for n in said.get(phase, [])])

    def map(self, index: int) -> MapView | None:
        """The map panel for traces made on a layout (the MoE example, parasim trace): None otherwise."""
        if not self.events:
            return None
        if not hasattr(self, "_layout"):
            self._layout = _layout_of(self.trace)
        layout = self._layout
        if layout is None:
            return None
        per = min(layout.gpus_per_node, layout.world)
        cols = min(layout.tp * layout.cp, per)
        nodes = [
            [
                list(range(n * per + r * cols, min(n * per + (r + 1) * cols, (n + 1) * per)))
                for r in range((per + cols - 1) // cols)
            ]
            for n in range((layout.world + per - 1) // per)
        ]
        watch = self.watch(index)
        return MapView(nodes, set(self.events[index].ranks), watch.rank if watch else None, per)

    def phase_text(self, index: int) -> tuple[str, str, list[str]]:
        """(phase name, narrative, notes of that phase) for the selected event."""
        if not self.events:
            return "", "", []
        return self._said(self.events[index].phase or "")

    def _said(self, phase: str) -> tuple[str, str, list[str]]:
        said = self.marks.notes_by_phase.get(phase, [])  # held bytes have their own panel
        notes = [f"rank {r}: {text}" for r, text in sorted(said, key=lambda rn: rn[0])]  # each rank's in order
        text = " ".join(self.narrative.get(phase, "").split())
        return printable(phase), printable(text), notes

    def quiet_phases(self, index: int) -> list[tuple[str, str, list[str]]]:
        """(phase name, narrative, notes) of the phases just before the selected event's that have no event of
        their own (pp-1f1b's "the schedule": its words and slot table come before the first send), at the first
        event of the phase that follows them, so that the app says them as the walk-through does, not never."""
        if not self.events:
            return []
        if self._with_events is None:
            self._with_events = {e.phase for e in self.trace.events}
        order = self.marks.phase_order
        phase = self.events[index].phase
        if phase not in order or (index > 0 and self.events[index - 1].phase == phase):
            return []  # said at the phase's first event only: the later ones have their own words to show
        quiet: list[str] = []
        for earlier in reversed(order[: order.index(phase)]):
            if earlier in self._with_events:
                break
            quiet.insert(0, earlier)
        return [self._said(p) for p in quiet if self.narrative.get(p, "").strip() or self.marks.notes_by_phase.get(p)]

    def all_tables(self) -> list[Any]:
        """What T shows: the lesson's own tables, then each slot table the ranks noted (a pipeline lesson's
        schedule, one row a GPU, one column a slot), so the schedule reads whole in one place at any size."""
        out = list(self.tables)
        for phase, grid in self.marks.tables.items():
            width = max(len(cells) for cells in grid.values())
            out.append(
                Table(
                    f"{printable(phase)}: each GPU's action in each slot, as the ranks ran them ('.' idle)",
                    ["GPU", *(str(t + 1) for t in range(width))],
                    [(f"GPU {g}", [*grid[g], *["."] * (width - len(grid[g]))]) for g in sorted(grid)],
                )
            )
        return out

    def slots(self, index: int, width: int = 20) -> SlotWindow | None:
        """For pipeline lessons: the slot table the ranks noted (rows "GPU k: F1 F2 ..."), the latest one at
        or before the selected event's phase, and the slot the selected transfer belongs to ("slot t: ...")."""
        if not self.events:
            return None
        e = self.events[index]
        order, tables = self.marks.phase_order, self.marks.tables
        here = order.index(e.phase) if e.phase in order else len(order) - 1
        name = next((order[k] for k in range(here, -1, -1) if order[k] in tables), None)
        if name is None:
            return None
        rows = [tables[name][g] for g in sorted(tables[name])]
        span = max(len(r) for r in rows)
        slot = (e.tags or {}).get("slot")
        centre = slot if slot is not None else 0
        first = max(0, min(centre - width // 2, span - width))
        return SlotWindow(
            [f"GPU {g}" for g in sorted(tables[name])],
            rows,
            first,
            min(span, first + width),
            slot,
            sorted({m.rank for m in e.members}) if e.kind == "p2p" else [],
        )

    def work(self, index: int) -> list[tuple[int, float, str]]:
        """Per rank: compute flops recorded in the selected event's phase up to its step, and the rank's latest
        compute step there (e.g. which K/V chunk ring attention is working on). Counted per phase, so that a
        lesson that runs the same work two ways (cp-causal's contiguous then zigzag split) shows each way's
        balance on its own. Empty when nothing was recorded."""
        if not self.events:
            return []
        step, phase = self.events[index].step, self.events[index].phase
        done = [0.0] * self.trace.world
        last = [""] * self.trace.world
        seen = False
        for e, ranks in self.marks.computes:
            if e.step <= step and e.phase == phase:
                seen = True
                flops = float(e.params.get("flops", 0) or 0)
                for r in ranks:
                    done[r] += flops
                    last[r] = e.op
        return [(r, done[r], printable(last[r])) for r in range(self.trace.world)] if seen else []

    def held(self, index: int) -> list:
        """The memory panel: per rank of the selected event, the bytes it held while the event ran, and its
        peak (tui/memory.py). Empty when the run declared no held bytes."""
        if not self.events:
            return []
        if self._held is None:
            self._held = HeldIndex(self.trace)
        return held_rows(self._held, self.events[index])

    def status(self, index: int) -> str:
        at = bisect_left(self._visible, index)
        pos = at + 1 if at < len(self._visible) and self._visible[at] == index else 0
        parts = [f"event {pos}/{len(self._visible)}"]
        if self.filter_text:
            parts.append(f"filter '{printable(self.filter_text)}'")
        if self.focus_rank is not None:
            parts.append(f"rank {self.focus_rank}")
        if self.diverged() is not None:
            parts.append(f"first divergence at #{self.divergence['event']} (d jumps there)")
        if self.time_mode:
            parts.append(self.clock.status())
        return "  ".join(parts)

    def moves(self, index: int) -> list[str] | None:
        """What moves at the event: who sends how many bytes to whom (None: a compute event moves nothing)."""
        from .moves import moves

        return moves(self.events[index]) if self.events else None

    def hops_note(self, index: int) -> str:
        """With ring hops on (t): why the selected event shows none, or what shows them ('' with hops off)."""
        if not self.show_hops or not self.events:
            return ""
        e = self.events[index]
        if e.hops:
            return "ring hops shown in the selected event (t hides them)"
        return printable(NO_HOPS.get(e.kind, NO_HOPS["collective"]).format(op=e.op, algo=e.algo or "directly"))

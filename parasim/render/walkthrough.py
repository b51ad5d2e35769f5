"""The plain-text walk-through of a lesson run: each phase's narrative, then every event in it with each
rank's values before and after, the bytes it moved and the line that called it; then the checks.

Names, labels, phases, notes, sites and narratives come from a trace file or a user's program: every line
goes out through `printable`, so what a terminal would act on (an escape sequence, a bell) is shown."""

from __future__ import annotations

import re
import textwrap
from typing import Any, Iterator, NamedTuple

from ..lesson import LessonRun
from ..comm.texts import rank_list
from ..comm.trace import Event
from .numbers import alike_chunks, nbytes, nbytes_short, scalar
from .text import printable


def wrap_words(text: str, width: int, **kw: str) -> list[str]:
    """Text wrapped at `width`, never inside a hyphenated word ("all-reduce" stays whole on its line)."""
    return textwrap.wrap(text, width, break_on_hyphens=False, **kw)  # type: ignore[arg-type]


WIDTH = 96  # the page's width where the terminal's is not known (a pipe, a file)
WIDEST = 200  # past this, lines get too long to read at a glance


def fmt_value(v: Any, grouped: bool = True) -> str:
    """A value of a check or a tensor: a number alone with thousands separators, numbers inside a list
    (written with commas) without; integer-valued floats without '.0' (render/numbers.py)."""
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x, False) for x in v) + "]"
    if isinstance(v, dict):  # figures named (by variant, by rank): name: value, ...
        return "{" + "; ".join(f"{k}: {fmt_value(x, grouped)}" for k, x in v.items()) + "}"
    return scalar(v, grouped=grouped)


fmt_bytes = nbytes  # noqa: E305  a byte count as every renderer writes it

SHOWN_VALUES = 8  # a check's list longer than this is summed up in the walk-through (--json keeps it whole)
SHOWN_CHARS = 72  # a member's values written longer than this show as their shapes (--json keeps them)


def _shape(v: Any) -> list[int]:
    """The lengths of a nested list, outermost first (of its first element at each depth)."""
    dims = []
    while isinstance(v, list):
        dims.append(len(v))
        v = v[0] if v else None
    return dims


def fmt_check(v: Any) -> str:
    """A check's value for the walk-through: whole when short; a long list (an array's values) as its shape and
    its first values, so a line reads as a sentence ('8 x 1,024 values: [[-0.21875, -0.84375, ...], ...]')."""
    dims = _shape(v)
    if not dims or all(d <= SHOWN_VALUES for d in dims):
        return fmt_value(v)

    def head(x: Any) -> str:  # the first few of each list, and '...' where it goes on
        if not isinstance(x, list):
            return fmt_value(x, False)
        keep = 3 if x and isinstance(x[0], list) else 4
        return "[" + ", ".join(head(y) for y in x[:keep]) + (", ..." if len(x) > keep else "") + "]"

    return f"{' x '.join(f'{d:,}' for d in dims)} values: {head(v)}"


def _params(e: Event) -> str:
    # a transfer's ends are said on its head already (rank 0 -> rank 2)
    parts = [f"{k}={v}" for k, v in e.params.items() if k not in ("algo", "src", "dst") and v is not None]
    if e.algo == "ring":
        parts.append("ring algorithm")
    return ", ".join(parts)


SHOWN_TENSORS = 4  # a member's arrays written out one by one; more (an all-to-all's chunks) are summed up
SHOWN_MEMBERS = 10  # a group's members written out one by one; a larger group shows its first and last


FOLDED = 3  # this many ranks in a row, or more, whose lines read the same are printed once, as a range


MemberLine = tuple[str, str, str, str]  # a member's line before it is laid out: arrays (or values), sent, recv, site


def _folded_runs(lines: list[tuple[int, MemberLine]]) -> list[tuple[int, int, MemberLine]]:
    """Members' lines as runs (first rank, last rank, line): consecutive ranks that did the very same thing (the
    same arrays, bytes and source line), FOLDED or more of them, one run; any other rank a run of its own."""
    runs: list[tuple[int, int, MemberLine]] = []
    i = 0
    while i < len(lines):
        rank, rest = lines[i]
        j = i
        while j + 1 < len(lines) and lines[j + 1][0] == lines[j][0] + 1 and lines[j + 1][1] == rest:
            j += 1
        if j - i + 1 >= FOLDED:
            runs.append((rank, lines[j][0], rest))
            i = j + 1
        else:
            runs.append((rank, rank, rest))
            i += 1
    return runs


def _member_lines(who: str, member: MemberLine, width: int) -> list[str]:
    """A member's line in columns (arrays, then what it sent and received, right-aligned) where the page has
    room; else the columns closed up; else its bytes on a line of their own under its arrays, never a number
    cut from its unit."""
    what, sent, recv, site = member
    for line in (
        f"    {who} {what:<44} sent {sent:>9}  recv {recv:>9}{site}",
        f"    {who} {what}  sent {sent}, recv {recv}{site}",
    ):
        if len(line) <= width:
            return [line]
    return [f"    {who} {what}", f"{'':14}sent {sent}, recv {recv}{site}"]


def _folded(lines: list[tuple[int, MemberLine]], width: int) -> Iterator[list[str]]:
    """Members' lines, each run of alike ranks (`_folded_runs`) one 'ranks a-b' line: eight identical lines of a
    ZeRO gather say one thing once."""
    for first, last, rest in _folded_runs(lines):
        yield _member_lines(f"ranks {first}-{last}" if last > first else f"rank {first:<3}", rest, width)


def _tensors(ts) -> str:
    """A member's arrays: each written out, or, for several of one dtype and width (an all-to-all's chunks),
    their count and their first dims: 4 x float64[1/2/1/0, 10], or over a big group 64 x bfloat16[421..568, 7172]."""
    ts = list(ts)
    # a few chunks' rows written out, so that a member's line fits a 100-column page; many, their range
    chunks = alike_chunks(ts, SHOWN_TENSORS)
    if chunks is not None:
        return chunks
    return " ".join(f"{t.dtype}{list(t.shape)}" for t in ts) or "-"


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return nbytes_short(lo) if lo == hi else f"{nbytes_short(lo)} to {nbytes_short(hi)}"


def event_lines(e: Event, width: int = WIDEST) -> Iterator[str]:
    """An event's lines, none wider than `width`: its head (step, op, group, label and, where every member
    called it from one place, that source line), then a line a member (or a range of alike ones), then a
    ring's hops. A line too long for the page goes on under itself."""
    head, *rest = _event_lines(e, width)
    site = {m.site for m in e.members}
    # the source line that made the call, said once for all (a user's program is read by it): at the head's
    # end, or under it where the page has no room left
    yield from _lines_at(f"{head}  {site.pop()}" if len(site) == 1 else head, width)
    for line in rest:
        yield from _lines_at(line, width)


def _lines_at(line: str, width: int) -> list[str]:
    return wrap_words(line, width, subsequent_indent=" " * 12) if len(line) > width else [line]


def _event_lines(e: Event, width: int) -> Iterator[str]:
    if e.kind == "compute":  # one rank's own work: no group, nothing sent
        ranks = ", ".join(str(m.rank) for m in e.members)
        flops = e.params.get("flops")
        work = f"  ({fmt_value(float(flops))} FLOPs)" if flops else ""  # 0: a mark where work starts
        who = f"rank{'s' * (len(e.members) != 1)} {ranks}"
        yield f"step {e.step:>3}  compute on {who}: {e.op}{work}"
        return
    head = f"step {e.step:>3}  {e.op}"
    if e.kind == "p2p":
        head += f"  rank {e.params['src']} -> rank {e.params['dst']}"
    else:
        head += f"  on {e.group.name}{rank_list(e.group.ranks)}" if e.group is not None else "  on ?"
    if _params(e):
        head += f"  ({_params(e)})"
    if e.label:
        head += f"  '{e.label}'"
    members = list(e.members)
    # one source line for all (as a collective's members almost always share): said once, on the head
    one_site = len({m.site for m in members}) == 1
    yield head
    lines: list[tuple[int, MemberLine]] = []  # (rank, its line before layout), in order
    for m in members:
        what = f"{_tensors(m.ins)} -> {_tensors(m.outs)}"
        if m.before is not None and m.after is not None and (m.before or m.after):
            values = (
                f"{' '.join(fmt_value(v) for v in m.before) or '-'} -> {' '.join(fmt_value(v) for v in m.after) or '-'}"
            )
            what = values if len(values) <= SHOWN_CHARS else f"{what} (values: --json)"
        site = "" if one_site else f"  {m.site}"
        lines.append((m.rank, (what, nbytes_short(m.sent), nbytes_short(m.recv), site)))
    # alike members folded first (16 ranks that did the same are one line); then, of many lines still, the
    # first ones and the last two, and what the members between sent and received
    folded = list(_folded(lines, width))
    if len(folded) > SHOWN_MEMBERS:
        sizes = [last - first + 1 for first, last, _ in _folded_runs(lines)]  # members a line, in order
        between = members[sum(sizes[: SHOWN_MEMBERS - 2]) : len(members) - sum(sizes[-2:])]
        folded = (
            folded[: SHOWN_MEMBERS - 2]
            + [
                [
                    f"    ... ranks {between[0].rank} to {between[-1].rank} ({len(between)}): sent "
                    f"{_span([x.sent for x in between])}, recv {_span([x.recv for x in between])}"
                ]
            ]
            + folded[-2:]
        )
    for member in folded:
        yield from member
    hops = e.hops or []
    if hops and any(t["value"] is None for h in hops for t in h["transfers"]):
        phases = [p for p in ("reduce-scatter", "all-gather") if any(h["phase"] == p for h in hops)]
        counts = " + ".join(
            f"{n} {p} hop{'s' * (n != 1)}" for p in phases for n in [sum(h["phase"] == p for h in hops)]
        )
        sizes = sorted({t["bytes"] for h in hops for t in h["transfers"]})
        yield f"      ring: {counts}, each rank passing one chunk ({' or '.join(map(fmt_bytes, sizes))}) to the next"
        hops = []
    for hop in hops:
        moves = "; ".join(
            f"{t['src']}->{t['dst']} chunk {t['chunk']}"
            + (f" {fmt_value(t['value'])}" if t["value"] is not None else f" ({t['bytes']} B)")
            for t in hop["transfers"]
        )
        yield f"      hop {hop['hop'] + 1} of {hop['phase']}: {moves}"


def phase_order(trace) -> list[str | None]:
    """The phases in the order the program has them: each rank enters its phases in program order, so a
    phase comes after every phase some rank entered before it. Ranks that skip the first phases enter the
    later ones early (they have nothing to wait for), so the order the marks were recorded in is not the
    program's. Among phases free to come next, the one whose first event or note is earliest comes first."""
    import heapq

    first: dict[str | None, tuple[int, int]] = {}  # phase -> (earliest step, first mention) for the tie-break
    after: dict[str | None, set] = {}
    seen_at: dict[int, str | None] = {}
    for i, mk in enumerate(trace.marks):
        if mk.kind != "phase":
            continue
        first.setdefault(mk.text, (mk.step, i))
        first[mk.text] = (min(first[mk.text][0], mk.step), first[mk.text][1])
        before = seen_at.get(mk.rank, None)
        if mk.rank in seen_at and before != mk.text:
            after.setdefault(before, set()).add(mk.text)
        seen_at[mk.rank] = mk.text
    for e in trace.events:
        if e.phase in first:
            first[e.phase] = (min(first[e.phase][0], e.step), first[e.phase][1])
        else:
            first[e.phase] = (e.step, len(trace.marks) + e.seq)
    waits = {p: 0 for p in first}
    for p, nexts in after.items():
        for q in nexts:
            waits[q] += 1
    ready = [(first[p], i, p) for i, p in enumerate(first) if waits[p] == 0]
    heapq.heapify(ready)
    order: list[str | None] = [None]
    left = dict(waits)
    while left:
        if not ready:  # a phase entered twice in different orders: take the earliest of what is left
            p = min(left, key=lambda q: first[q])
            left[p] = 0
            ready.append((first[p], -1, p))
        _, _, p = heapq.heappop(ready)
        if p not in left:
            continue
        del left[p]
        if p is not None:
            order.append(p)
        for q in after.get(p, ()):
            if q in left:
                left[q] -= 1
                if left[q] == 0:
                    heapq.heappush(ready, (first[q], len(order), q))
    return order


def _phase_blocks(trace) -> list[tuple[str | None, list[tuple[int, int, int, str | Event]]]]:
    """Phases in program order (`phase_order`), each with its events and notes, ordered by step. The k-th
    notes of every rank in a phase are said together, in rank order, at the step of the earliest of them:
    ranks note the same thing at different logical steps (a pipeline's last stage starts later)."""
    current: dict[int, str | None] = {}
    notes: list[tuple[str | None, int, int, int, "str | SlotRow"]] = []  # phase, k, rank, step, text
    count: dict[tuple[str | None, int], int] = {}
    for mk in trace.marks:
        if mk.kind == "phase":
            current[mk.rank] = mk.text
        elif mk.kind == "note":  # held bytes are read by `Trace.held`, not narrated
            phase = current.get(mk.rank)
            k = count[phase, mk.rank] = count.get((phase, mk.rank), -1) + 1
            said = mk.text if mk.data and mk.data.get("run") else f"rank {mk.rank}: {mk.text}"  # run=True: for the run
            if mk.data and "table_row" in mk.data:  # a row of a slot table: its cells, as the app reads them
                cells = [str(c) for c in mk.data["cells"]]
                shown = " ".join(cells)
                head = said[: -len(shown)] if shown and said.endswith(shown) else f"{said} "
                said = SlotRow(head, tuple(cells))
            notes.append((phase, k, mk.rank, mk.step, said))
    at: dict[tuple[str | None, int], int] = {}
    for phase, k, _, step, _ in notes:
        at[phase, k] = min(at.get((phase, k), step), step)
    items: dict[str | None, list] = {p: [] for p in phase_order(trace)}
    for phase, k, rank, _, text in notes:
        items.setdefault(phase, []).append((at[phase, k], 1, k, rank, text))
    for e in trace.events:
        items.setdefault(e.phase, []).append((e.step, 0, e.seq, 0, e))
    return [(p, sorted(items[p], key=lambda it: it[:4])) for p in items]


def _alike(e: Event) -> tuple:
    """What two events of one step share when they did the same thing on other ranks: the op, its parameters (but
    a transfer's ends), the label with its numbers blanked, and each member's arrays, bytes and source line
    (asked of the events of one step only: `_phase_lines` gathers them)."""
    params = tuple((k, repr(v)) for k, v in e.params.items() if k not in ("src", "dst"))  # a list's too
    members = tuple((_tensors(m.ins), _tensors(m.outs), m.sent, m.recv, m.site) for m in e.members)
    return e.kind, re.sub(r"\d+", "#", e.op), params, re.sub(r"\d+", "#", e.label or ""), members


def _others(first: Event, rest: list[Event]) -> str:
    """One line for the events a folded first one stands for: their groups, transfers or ranks."""
    n = len(rest)
    numbers = (
        " (each with its own numbers in the label)"
        if any(e.label != first.label or e.op != first.op for e in rest)
        else ""
    )
    if first.kind == "p2p":
        ends = ", ".join(f"{e.params['src']} -> {e.params['dst']}" for e in rest)
        return f"    ... and {n} more transfer{'s' * (n != 1)} like it at this step{numbers}: {ends}"
    if first.kind == "compute":
        ranks = ", ".join(str(m.rank) for e in rest for m in e.members)
        return f"    ... and the same work on rank{'s' * (n != 1)} {ranks}{numbers}"
    groups = ", ".join(rank_list(e.group.ranks) if e.group is not None else "?" for e in rest)
    name = first.group.name if first.group is not None else "its"
    return f"    ... and the same call on {n} more {name} group{'s' * (n != 1)}{numbers}: {groups}"


def _folded_steps(events: list[Event]) -> list[tuple[Event, list[Event]]]:
    """Events of a phase with those alike at the same step gathered behind the first of them, in order."""
    heads: dict[tuple, tuple[Event, list[Event]]] = {}
    for e in events:
        key = _alike(e)
        if key in heads:
            heads[key][1].append(e)
        else:
            heads[key] = (e, [])
    return list(heads.values())


class SlotRow(NamedTuple):
    """A note that is a row of a pipeline's slot table (its data's `table_row` and `cells`, as the app's slot
    panel reads them): the words before the cells, and the cells."""

    head: str
    cells: tuple[str, ...]


RANK_NOTE = re.compile(r"rank (\d+): (.*)", re.S)
NOTES_SHOWN = (4, 2)  # of many ranks' notes alike but for their figures: the first and the last said


def _same_note(other: object, first: str) -> bool:
    """Whether `other` is another rank's note saying what `first` says, but for its figures."""
    a, b = RANK_NOTE.fullmatch(first), RANK_NOTE.fullmatch(other) if isinstance(other, str) else None
    return bool(a and b) and re.sub(r"\d", "#", a[2]) == re.sub(r"\d", "#", b[2])  # type: ignore[index]


def _note_lines(notes: list[str]) -> list[str]:
    """Ranks' notes alike but for their figures: the very same words from consecutive ranks said once ('ranks
    0-7: ...'); else each said where there are few, else the first and last few with one line for those between
    (a 64-GPU run's every rank says its count)."""
    head, tail = NOTES_SHOWN
    said = [RANK_NOTE.fullmatch(n) for n in notes]
    ranks = [int(m[1]) for m in said if m]
    if (
        len(ranks) == len(notes) >= FOLDED
        and len({m[2] for m in said if m}) == 1
        and ranks == list(range(ranks[0], ranks[0] + len(ranks)))
    ):  # the very same words from consecutive ranks: said once, as a run of alike members is
        return [f"  ranks {ranks[0]}-{ranks[-1]}: {said[0][2]}"]  # type: ignore[index]
    if len(notes) <= head + tail + 2:
        return [f"  {n}" for n in notes]
    between = [int(RANK_NOTE.fullmatch(n)[1]) for n in notes[head:-tail]]  # type: ignore[index]
    return (
        [f"  {n}" for n in notes[:head]]
        + [
            f"  ... {f'ranks {between[0]} to {between[-1]}' if between == list(range(between[0], between[-1] + 1)) else 'the ranks between'}"
            f" ({len(between)}): the same, each with its own figures"
        ]
        + [f"  {n}" for n in notes[-tail:]]
    )


def _notes_at_width(lines: list[str], width: int) -> list[str]:
    """Notes held to the page's width: each wrapped at words, its next lines under them."""
    return [line for note in lines for line in wrap_words(note, width, subsequent_indent=" " * 6)]


def _slot_grid(rows: list[SlotRow], width: int) -> list[str]:
    """Slot rows as a grid under a line numbering the slots: every cell as wide as the widest, and where the rows
    are longer than the page, cut into blocks of whole slots, each headed by the slots it holds."""
    slots = max(len(row.cells) for row in rows)
    # a cell holds its slot's number too: the grid's first line numbers the slots, as the post's tables do
    cell = max(max((len(c) for row in rows for c in row.cells), default=1), len(str(slots)))
    lead = max(len(row.head) for row in rows) + 2
    per = max(1, (width - lead) // (cell + 1))
    out = []
    for a in range(0, slots, per):
        b = min(slots, a + per)
        if slots > per:
            out.append(f"  slots {a + 1}-{b}:")
        out.append("  slot".ljust(lead) + " ".join(str(n).ljust(cell) for n in range(a + 1, b + 1)))
        out += [("  " + row.head).ljust(lead) + " ".join(c.ljust(cell) for c in row.cells[a:b]) for row in rows]
    return [line.rstrip() for line in out]


def _phase_lines(items: list, shown: int | None, width: int, fold: bool = False) -> list[str]:
    """A phase's events and notes in order; with `fold`, the events of a step alike but for their ranks said
    once with a line naming the others; past the first `shown` events (None: all), the rest of its events in one
    line by op, its notes still said."""
    out: list[str] = []
    told, left = 0, dict[str, int]()
    i = 0
    while i < len(items):
        item = items[i][-1]
        if isinstance(item, SlotRow):  # a slot table's rows, together
            j = i
            while j < len(items) and isinstance(items[j][-1], SlotRow):
                j += 1
            out += _slot_grid([it[-1] for it in items[i:j]], width)
            i = j
            continue
        if not isinstance(item, Event):
            lines = []  # the notes until the next event or slot row, alike ones folded
            while i < len(items) and isinstance(items[i][-1], str):
                j = i + 1
                while j < len(items) and _same_note(items[j][-1], items[i][-1]):
                    j += 1
                lines += _note_lines([it[-1] for it in items[i:j]])
                i = j
            out += _notes_at_width(lines, width)
            continue
        j = i
        while j < len(items) and isinstance(items[j][-1], Event) and items[j][-1].step == item.step:
            j += 1
        events = [it[-1] for it in items[i:j]]
        for first, rest in _folded_steps(events) if fold else [(e, []) for e in events]:
            if shown is None or told < shown:
                out += list(event_lines(first, width))
                out += wrap_words(_others(first, rest), width, subsequent_indent=" " * 8) if rest else []
                told += 1
            else:
                for e in [first, *rest]:
                    left[e.op] = left.get(e.op, 0) + 1
        i = j
    if left:
        ops = ", ".join(f"{n} {op}" for op, n in sorted(left.items(), key=lambda kv: (-kv[1], kv[0])))
        out += wrap_words(
            f"... and {sum(left.values())} more events in this phase ({ops}): --json and the app list every one",
            width,
            initial_indent="    ",
            subsequent_indent="    ",
        )
    return out


def page_width() -> int:
    """The page's width, held to 60..WIDEST: the terminal's where stdout is one, else WIDTH (a pipe or a file
    reads the same on every machine; `lesson --width` sets it)."""
    import os
    import sys

    columns = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else WIDTH
    return max(60, min(WIDEST, columns))


def _quiet_runs(blocks: list, lesson: Any) -> list:
    """Where a lesson shows no event of a phase (events_shown 0: its tables tell the story), two or more phases
    in a row with no text of their own would be headers over one count line each: each such run becomes one
    block, its phases' names as a tuple, their items together. Any other lesson's blocks are left as they are."""
    if lesson.events_shown != 0:
        return blocks
    out: list = []
    for phase, items in blocks:
        if phase is not None and not lesson.narrative.get(phase, "").strip():
            if not items:
                continue  # entered, nothing happened, nothing to say: not said at all, as elsewhere
            if out and isinstance(out[-1][0], list):
                out[-1][0].append(phase)
                out[-1][1].extend(items)
                continue
            out.append(([phase], list(items)))
            continue
        out.append((phase, items))
    return [
        (tuple(p), items) if isinstance(p, list) and len(p) > 1 else (p[0] if isinstance(p, list) else p, items)
        for p, items in out
    ]


def _quiet_lines(phases: tuple, items: list, width: int) -> list[str]:
    """A run of phases with no text of their own (`_quiet_runs`): one header, their names on one line, their
    events counted by op (a rank's own work as compute), then their notes."""
    left: dict[str, int] = {}
    for it in items:
        if isinstance(it[-1], Event):
            op = "compute" if it[-1].kind == "compute" else it[-1].op
            left[op] = left.get(op, 0) + 1
    ops = ", ".join(f"{n} {op}" for op, n in sorted(left.items(), key=lambda kv: (-kv[1], kv[0])))
    out = ["", f"== {phases[0]} ... {phases[-1]}: {len(phases)} phases with no text of their own =="]
    out += wrap_words(printable("phases run, in order: " + ", ".join(phases)), width, subsequent_indent="  ")
    out += wrap_words(
        f"{sum(left.values())} events in them ({ops}): --json and the app list every one",
        width,
        initial_indent="    ",
        subsequent_indent="    ",
    )
    return out + _phase_lines([it for it in items if not isinstance(it[-1], Event)], None, width)


def walkthrough(lr: LessonRun, width: int | None = None) -> str:
    """The run as plain text, `width` characters a line at most (default: the terminal's, `page_width`)."""
    width = width or page_width()
    lesson, trace = lr.lesson, lr.result.trace
    kind = "symbolic" if lesson.backend == "symbolic" else "virtual"
    out = wrap_words(f"{lesson.title}  ({lesson.name}, {trace.world} {kind} ranks)", width, subsequent_indent="  ")
    settings = trace.meta.get("knobs")
    if settings:
        from ..lesson import KNOB_KINDS

        said = ", ".join(f"{KNOB_KINDS[n].flags[-1]} {v}" for n, v in settings.items())
        out += wrap_words(f"settings: {said}  {lesson.settings_words(settings)}", width, subsequent_indent="  ")
    seen: dict[tuple, tuple[str | None, int, int]] = {}  # a phase's calls, alike -> (phase, first step, last)
    for phase, items in _quiet_runs(_phase_blocks(trace), lesson):
        if isinstance(phase, tuple):  # phases with no text of their own, none of their events shown: said once
            out += _quiet_lines(phase, items, width)
            continue
        if phase is None and not items:
            continue
        if phase is not None:
            if not items and not lesson.narrative.get(phase, "").strip():
                continue  # a phase the program entered but where nothing happened, and nothing to say
            out += ["", f"== {phase} =="]
            for para in lesson.narrative.get(phase, "").strip().split("\n\n"):
                if para.strip():
                    out += wrap_words(printable(" ".join(para.split())), width) + [""]  # wrapped as shown
        events = [it[-1] for it in items if isinstance(it[-1], Event)]
        key = tuple((_alike(e), e.group.ranks if e.group is not None else None) for e in events)
        if len(events) > 1 and key in seen:  # the very calls of an earlier phase, on the same groups: said once
            first, a, b = seen[key]
            out += wrap_words(
                f"    the same {len(events)} calls as '{first}' (steps {a}-{b}), here at steps {events[0].step}-"
                f"{events[-1].step}: --json and the app list every one",
                width,
                subsequent_indent="      ",
            )
            out += _phase_lines([it for it in items if not isinstance(it[-1], Event)], None, width)
            continue
        if len(events) > 1:
            seen[key] = (phase, events[0].step, events[-1].step)
        out += _phase_lines(items, lesson.events_shown, width, lesson.fold_alike)
    if lr.tables:
        from .tables import table_lines

        out += ["", "== tables (every figure from the run) =="]
        for t in lr.tables:
            out += [""] + table_lines(t, width)
    total = sum(m.sent for e in trace.events for m in e.members)
    out += ["", f"{len(trace.events)} events over {trace.steps} steps; {fmt_bytes(total)} sent in all."]
    out += wrap_words(clock_words(lr.clock()), width)
    out += ["", "== checks (computed by the run, compared with a single-device reference) =="]
    for c in lr.checks:  # each wrapped at the page's width, its lines after the first under its words
        if c.ok and c.got == c.expected:
            said = f"  ok   {c.name}: {fmt_check(c.got)}"
        else:
            mark = "ok  " if c.ok else "FAIL"
            said = f"  {mark} {c.name}: got {fmt_check(c.got)}, expected {fmt_check(c.expected)}"
        out += wrap_words(said, width, subsequent_indent=" " * 7)
    out.append(f"{sum(c.ok for c in lr.checks)} of {len(lr.checks)} checks ok.")
    return "\n".join(map(printable, out)) + "\n"  # a line each: a newline inside a name shows as \n


def clock_words(c: dict) -> str:
    """The run on the clock in a sentence: the step, its critical path, and what each overlap switch not on
    would save (lesson --json's "clock")."""
    # a switch's saving is said where it is 1% of the step or more; below that (a lesson's toy arrays, where
    # the saving is nanoseconds of arithmetic), the switches are named together as saving next to nothing
    off = {name: v["saves_us"] for name, v in c["switches"].items() if not v["on"] and v["saves_us"] > 0}
    saves = [f"{name} would save {duration(us)}" for name, us in off.items() if us >= 0.01 * c["step_us"]]
    little = [name for name, us in off.items() if us < 0.01 * c["step_us"]]
    if little:
        saves.append(f"{' and '.join(little)} would save under 1% of it")
    over = ", ".join(c["overlap"]) or "no overlap"
    r = c.get("range")
    like = (
        f" (held-out runs like it measured {r['low_ratio']:.2f}x to {r['high_ratio']:.2f}x the clock's time: "
        f"{duration(r['low_s'] * 1e6)} to {duration(r['high_s'] * 1e6)}; {len(r['runs'])} {r['like']})"
        if r
        else ""
    )
    small = (
        " (this run's arrays are a lesson's few values, so its time is the collectives' fixed costs, not "
        "arithmetic; the lessons marked 'on the clock' in parasim lesson --list time a real-size step)"
        if c.get("exact") and c["critical_compute_us"] < 0.01 * c["step_us"]
        else ""
    )
    compute, comm = c["critical_compute_us"], c["critical_comm_us"]
    path = (
        f"its critical path all communication ({duration(comm)})"
        if compute == 0
        else f"its critical path all compute ({duration(compute)})"
        if comm == 0
        else f"its critical path {duration(compute)} of compute and {duration(comm)} of communication"
    )
    return (
        f"On the clock ({c['gpu']}s, {c['gpus_per_node']} a node, {over}; parasim hardware): the run takes "
        f"{duration(c['step_us'])}{like}, {path}{small}" + (f"; {'; '.join(saves)}." if saves else ".")
    )


def duration(us: float) -> str:
    """Microseconds in the unit that reads best: ns, us, ms or s, three figures."""
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "us")):
        if us >= scale:
            return f"{us / scale:.3g} {unit}"
    return f"{us * 1e3:.3g} ns" if us >= 1e-3 else ("none" if us == 0 else "under 1 ns")

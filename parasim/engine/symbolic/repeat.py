"""A call repeated on the trace without running it again: on symbolic ranks, a layer's forward or backward on
arrays of the same shapes does the same work every time (no values, routing that draws alike), so a stage
running 16 micro-batches need compute its layers once and tell the trace the same events 15 more times.

`record` runs a call and keeps what it told the trace: its events (each with the FLOPs that stood before it),
its marks, the FLOPs after its last event, its rounding counts. `replay` tells the trace all of that again as
the call would have: each event numbered, stepped and counted on its group as if it had been called, the
FLOPs the rank had done before the call put in front of the first, marks at the step they would have had.

A call can be repeated only when nothing else ran while it did and each of its events is the rank's own: a
collective whose only running member is this rank (every other member folded onto it,
engine/symbolic/folded.py) or a compute event. Any other (a transfer, a collective another running rank
joins) keeps the call running each time. tests/unit/train/test_repeat.py holds every trace equal to the one
the calls run each time make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...comm.trace import Event, Mark, Member, Work

_member = tuple.__new__  # a Member without NamedTuple's Python-level __new__ (64 members an event)


@dataclass(frozen=True)
class Recording:
    """What one call told the trace, as `replay` tells it again."""

    events: tuple[Event, ...]  # in order, each its own (see the module's text)
    head: Work | None  # the FLOPs before the first event that the call itself did (the rest came before it)
    tail: Work | None  # the FLOPs after the last event (with no event: all the call did)
    marks: tuple[tuple[int, Mark], ...]  # (how many of the call's events came before it, the mark)
    flops: int  # the call's product FLOPs (the meter's total)
    roundings: int
    result: Any


def _copy(w: Work | None) -> Work:
    out = Work(w or {})
    if w:
        out.gemms.update(w.gemms)
    return out


def _plus(a: Work | None, b: Work | None) -> Work | None:
    """a + b, kind by kind and product by product (None: nothing)."""
    if not b:
        return _copy(a) if a else None
    out = _copy(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    for k, v in b.gemms.items():
        out.gemms[k] = out.gemms.get(k, 0) + v
    return out if out else None


def _minus(a: Work | None, b: Work | None) -> Work | None:
    """a - b where b is a part of a: the FLOPs a meter added between a snapshot b and a."""
    out = _copy(a)
    for k, v in (b or {}).items():
        left = out.get(k, 0) - v
        if left:
            out[k] = left
        else:
            out.pop(k, None)
    for k, v in (b.gemms if b else {}).items():
        left = out.gemms.get(k, 0) - v
        if left:
            out.gemms[k] = left
        else:
            out.gemms.pop(k, None)
    return out if out else None


def _own(world: Any, rank: int, e: Event) -> bool:
    """Whether event `e` is `rank`'s alone: a compute event of it, or a collective it alone ran (its other
    members folded onto it, each with its FLOPs)."""
    if e.kind == "compute":
        return e.members[0].rank == rank
    return e.kind == "collective" and tuple(world._members_running(e.group)) == (rank,)


def record(world: Any, rank: int, fn: Callable[[], Any]) -> tuple[Any, Recording | None]:
    """fn() on `rank`, and what it told the trace (None: the call cannot be repeated, see the module's text)."""
    meter = world.meter
    before = _copy(meter.since[rank])
    n_events, n_marks, turns = len(world.events), len(world.marks), world.turns
    flops, roundings = meter.total[rank], meter.roundings[rank]
    result = fn()
    if world.turns != turns:  # another rank ran meanwhile: its events and marks may be among these
        return result, None
    events = tuple(world.events[n_events:])
    marks = world.marks[n_marks:]
    if not all(_own(world, rank, e) for e in events) or any(m.kind in ("phase", "work") for m in marks):
        return result, None  # a phase hands the rank's FLOPs to a mark: not a layer's call
    steps = [e.step for e in events]
    placed = tuple((sum(s <= m.step for s in steps), m) for m in marks)
    if events:
        head, tail = _minus(events[0].members[0].work, before), _copy(meter.since[rank]) or None
    else:
        head, tail = None, _minus(meter.since[rank], before)
    rec = Recording(events, head, tail, placed, meter.total[rank] - flops, meter.roundings[rank] - roundings, result)
    return result, rec


def replay(world: Any, rank: int, rec: Recording) -> None:
    """Tell the trace what `rec`'s call told it, as if `rank` had made the call now."""
    meter, ranks, events, marks = world.meter, world.ranks, world.events, world.marks
    st = ranks[rank]
    placed = iter(rec.marks)
    mark = next(placed, None)
    for i, e in enumerate(rec.events):
        while mark is not None and mark[0] == i:
            _mark(marks, st, mark[1])
            mark = next(placed, None)
        members = e.members
        if i == 0:  # what the rank computed before the call stands before its first event, with the call's own
            work = _plus(meter.take(rank), rec.head)
            members = [_member(Member, (*m[:8], work)) for m in members]
        g = e.group
        if e.kind == "compute":
            st.clock += 1
            step = st.clock
        else:
            step = 1 + max([ranks[r].clock for r in g.ranks])
            for r in g.ranks:
                ranks[r].clock = step
            world.calls[g.index] = world.calls.get(g.index, 0) + 1
        events.append(
            Event(
                len(events),
                step,
                e.kind,
                e.op,
                g,
                list(members),
                e.label,
                st.phase,  # a repeated call's events are the rank's alone: of its group, it alone ran
                e.params,
                e.algo,
                e.hops,
                e.tags,
            )
        )
    while mark is not None:
        _mark(marks, st, mark[1])
        mark = next(placed, None)
    if rec.events:
        meter.put(rank, _copy(rec.tail))  # the meter adds into it: a copy of its own
    elif rec.tail:
        meter.put(rank, _plus(meter.since[rank], rec.tail))
    meter.total[rank] += rec.flops
    meter.roundings[rank] += rec.roundings


def _mark(marks: list, st: Any, m: Mark) -> None:
    marks.append(Mark(st.rank, st.clock, m.kind, m.text, m.data))

"""Folding: ranks that do the same work run once and are counted many times.

On symbolic ranks, two GPUs of one pipeline stage that differ only in their TP, DP or EP place run the same
program on arrays of the same shapes (when the data and the routing are symmetric: every micro-batch the
same length, routing by the `balanced` policy). So one representative per class runs; a folded rank takes
part in its representative's collectives with the representative's shapes, and its own events (in groups
no representative is in) are copies of its representative's, renamed. `unfold` writes those copies into the
trace, which then counts every GPU as a full run would (tests/unit/train/test_fold.py holds the two equal).
"""

from __future__ import annotations

from typing import Any, Sequence

from ...errors import UsageError
from ...comm.trace import Event, Mark, Member, Trace
from ..collector import collector_paused

_member = tuple.__new__  # a Member without NamedTuple's Python-level __new__ (copies of 64-rank events)

KEEP = ("pp", "cp")  # a rank's work depends on its stage and (through the causal mask) on its CP slice


PLACE = ("tp", "cp", "dp", "pp")  # a rank's place in the attention view names it alone


def fold_of(layout: Any, keep: Sequence[str] = KEEP, around: int = 0) -> list[int]:
    """rank -> its representative: of the ranks with the same coordinates on the `keep` axes, the one that
    shares rank `around`'s other coordinates (so `around` runs itself, with the ranks it exchanges with)."""
    coords = layout.coords()
    if not 0 <= around < len(coords):
        raise UsageError(f"fold around rank {around}: the layout has ranks 0-{len(coords) - 1}")
    named = {tuple(c[a] for a in PLACE): c["rank"] for c in coords}
    anchor = coords[around]
    return [named[tuple(c[a] if a in keep else anchor[a] for a in PLACE)] for c in coords]


def unfold(trace: Trace, rep: Sequence[int]) -> Trace:
    """The trace a full run would have made: every event of a group that has a folded image (a group of the
    same name whose members are folded, position by position, onto the same representatives) copied onto
    that image, and every mark of a representative copied to the ranks folded onto it."""
    with collector_paused():  # millions of new records, none in a cycle (engine/collector.py)
        return _unfold(trace, rep)


def _unfold(trace: Trace, rep: Sequence[int]) -> Trace:
    rep = list(rep)
    if len(rep) != trace.world:
        raise UsageError(f"a fold names {len(rep)} ranks for a run of {trace.world}")
    by_key: dict[tuple, list] = {}
    for g in trace.groups:
        by_key.setdefault((g.name, tuple(rep[r] for r in g.ranks)), []).append(g)
    mirrors: dict[int, list[int]] = {}
    for r, s in enumerate(rep):
        if r != s:
            mirrors.setdefault(s, []).append(r)
    images: dict[int, list] = {}  # a group's folded images (and the renaming onto each), found once per group

    def images_of(grp: Any) -> list:
        got = images.get(grp.index)
        if got is None:  # its own group is among the same key's too
            got = images[grp.index] = [
                (g, dict(zip(grp.ranks, g.ranks)))
                for g in by_key[(grp.name, tuple(rep[r] for r in grp.ranks))]
                if g.ranks != grp.ranks and not any(rep[r] == r for r in g.ranks)
            ]
        return got

    events = list(trace.events)
    for e in trace.events:
        if e.kind == "compute":  # one rank's work: each rank folded onto it did the same
            (m,) = e.members
            events += [_renamed(e, {m.rank: r}, e.group) for r in mirrors.get(m.rank, ())]
            continue
        events += [_renamed(e, to, g) for g, to in images_of(e.group)]
    ran = {id(e) for e in trace.events}
    events.sort(key=lambda e: e.step)  # stable: a full run's order within a step is by arrival, not ours
    renumbered: dict[int, Event] = {}
    for i, e in enumerate(events):
        if id(e) in ran:  # the run's own events are copied with their new number; the copies made here
            events[i] = renumbered[id(e)] = _with_seq(e, i)  # are numbered in place
        else:
            e.seq = i
    for e in events:  # a copy's source is the run's event as this trace numbers it
        if e.source is not None:
            e.source = renumbered[id(e.source)]
    marks = list(trace.marks) + [
        Mark(r, m.step, m.kind, m.text, m.data) for m in trace.marks for r in mirrors.get(m.rank, ())
    ]
    # "fold": who ran for whom, so the clock times each run event once and its copies as it (clock/timeline.py)
    return Trace(trace.world, trace.backend, trace.groups, events, marks, {**trace.meta, "folded": True, "fold": rep})


def _renamed(e: Event, to: dict[int, int], group: Any) -> Event:
    get = to.get
    # one tuple a member, its fields unpacked (a slice and a join would make three: millions at 16,384 GPUs)
    members = [_member(Member, (get(r, r), i, o, s, v, site, b, a, w)) for r, i, o, s, v, site, b, a, w in e.members]
    params = e.params  # shared with the source where nothing in it names a rank (events never change their params)
    if "src" in params or "dst" in params:
        params = dict(params)
        for key in ("src", "dst"):  # point-to-point ends, and roots, are global ranks
            if key in params and params[key] in to:
                params[key] = to[params[key]]
    out = object.__new__(Event)  # as _with_seq: a dataclass's __init__ costs more, millions of times
    out.__dict__ = {
        **e.__dict__,
        "group": group,
        "members": members,
        "params": params,
        "hops": None,
        "time": None,
        "source": e,
    }
    return out


def _with_seq(e: Event, seq: int) -> Event:
    out = object.__new__(Event)  # a copy with another number (a dataclass's __init__ costs more, 70,000 times)
    out.__dict__ = {**e.__dict__, "seq": seq}
    return out

"""Folding: ranks that do the same work run once and are counted many times.

On symbolic ranks, two GPUs of one pipeline stage that differ only in their TP, DP or EP place run the same
program on arrays of the same shapes (when the data and the routing are symmetric: every micro-batch the
same length, routing by the `balanced` policy). So one representative per class runs; a folded rank takes
part in its representative's collectives with the representative's shapes, and its own events (in groups
no representative is in) are copies of its representative's, renamed. `unfold` writes those copies into the
trace, which then counts every GPU as a full run would (tests/unit/train/test_fold.py holds the two equal).
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Sequence as SequenceABC
from typing import Any, Iterator, Sequence

import numpy as np

from ...errors import UsageError
from ...comm.trace import Event, Mark, Member, Trace
from ..collector import collector_paused

_member = tuple.__new__  # a Member without NamedTuple's Python-level __new__ (copies of 64-rank events)

KEEP = ("pp", "cp")  # a rank's work depends on its stage and (through the causal mask) on its CP slice


def keep_of(layout: Any) -> tuple[str, ...]:
    """The axes along which each rank runs itself in `layout`: its stage's, and its CP slice's where CP ranks pass
    K and V point to point (a ring: each peer must run) or their work differs (the contiguous split's causal mask
    gives the first slice least to do). CP by all-gather under the zigzag split gives every CP rank the same shapes,
    the same work and only collectives: its CP ranks fold like TP's."""
    if layout.cp > 1 and layout.cp_comm == "all_gather" and layout.zigzag:
        return ("pp",)
    return KEEP


def cp_running(layout: Any) -> int:
    """The CP ranks of a stage that run themselves in a folded run of `layout` (1 where they fold onto one)."""
    return layout.cp if "cp" in keep_of(layout) else 1


PLACE = ("tp", "cp", "dp", "pp")  # a rank's place in the attention view names it alone


def fold_of(layout: Any, keep: Sequence[str] | None = None, around: int = 0) -> list[int]:
    """rank -> its representative: of the ranks with the same coordinates on the `keep` axes (None: the layout's,
    `keep_of`), the one that shares rank `around`'s other coordinates (so `around` runs itself, with the ranks it
    exchanges with)."""
    keep = keep_of(layout) if keep is None else keep
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
    folded = FoldedTrace(trace, rep)
    return Trace(folded.world, folded.backend, folded.groups, folded.events, folded.marks, folded.meta)


class FoldedTrace(Trace):
    """A folded run's trace as it ran: the representatives' events (numbered as the full trace numbers them) and
    marks, and the rule that maps every other rank onto the one that ran for it (`rep`; the copies go onto the
    folded images of the groups that ran). `events` and `marks` are the full trace's, written out when first
    asked for; what asks about one rank (`events_of`, `marks_of`, and so `peak`, `joins`, `held`) or about the
    step on the clock (clock/timeline.py reads `ran_events`) writes out that rank's part, or nothing.

    At 16,384 GPUs the full trace is three million events and 5 GB; the run's own is 1/1,000 of it."""

    def __init__(self, ran: Trace, rep: Sequence[int]):
        rep = list(rep)
        if len(rep) != ran.world:
            raise UsageError(f"a fold names {len(rep)} ranks for a run of {ran.world}")
        self.world, self.backend, self.groups = ran.world, ran.backend, ran.groups
        # "fold": who ran for whom, so the clock times each run event once and its copies as it (clock/timeline.py)
        self.meta = {**ran.meta, "folded": True, "fold": rep}
        self.rep = rep
        self._ran_marks = list(ran.marks)
        self._events: list[Event] | None = None
        self._marks: list[Mark] | None = None
        by_key: dict[tuple, list] = {}
        for g in ran.groups:
            by_key.setdefault((g.name, tuple(rep[r] for r in g.ranks)), []).append(g)
        self._by_key = by_key
        self._mirrors: dict[int, list[int]] = {}
        for r, s in enumerate(rep):
            if r != s:
                self._mirrors.setdefault(s, []).append(r)
        self._images: dict[int, list] = {}
        self._image_ranks: dict[tuple, np.ndarray] = {}  # (group, its members' ranks in an event) -> each image's
        self._made: dict[int, list[Event]] = {}  # a ran event's place -> its copies, written out on demand
        self._ran_at: dict[int, Event] | None = None  # a ran event's number -> it
        self._ran_groups = {e.group.index for e in ran.events if e.kind != "compute"}
        self._number(list(ran.events))

    def _images_of(self, grp: Any) -> list:
        """A group's folded images and the renaming onto each, found once per group."""
        got = self._images.get(grp.index)
        if got is None:  # its own group is among the same key's too
            rep = self.rep
            got = self._images[grp.index] = [
                (g, dict(zip(grp.ranks, g.ranks)))
                for g in self._by_key[(grp.name, tuple(rep[r] for r in grp.ranks))]
                if g.ranks != grp.ranks and not any(rep[r] == r for r in g.ranks)
            ]
        return got

    def _copies(self, e: Event) -> int:
        if e.kind == "compute":  # one rank's work: each rank folded onto it did the same
            return len(self._mirrors.get(e.members[0].rank, ()))
        return len(self._images_of(e.group))

    def _number(self, run: list[Event]) -> None:
        """Number the run's events as the full trace does: the run's events, then the copies in the order they are
        made (event by event, image by image), sorted by step, stably (within a step a full run's order is by
        arrival, not ours). `ran_events` is the run's in that order; `_first_copy` the number of each one's
        first copy."""
        counts: dict[int, list[int]] = {}  # step -> [events that ran, copies]
        ncopies = []
        for e in run:
            n = self._copies(e)
            ncopies.append(n)
            c = counts.setdefault(e.step, [0, 0])
            c[0] += 1
            c[1] += n
        start, total = {}, 0
        for step in sorted(counts):
            start[step] = total
            total += counts[step][0] + counts[step][1]
        self._total = total
        ran_at = dict(start)  # the next number of an event that ran, by step
        copy_at = {step: start[step] + counts[step][0] for step in counts}
        ran, first = [], []
        for e, n in zip(run, ncopies):
            ran.append(_with_seq(e, ran_at[e.step]))
            ran_at[e.step] += 1
            first.append(copy_at[e.step])
            copy_at[e.step] += n
        order = sorted(range(len(ran)), key=lambda i: ran[i].seq)
        self._ran_events = [ran[i] for i in order]
        self._first_copy = [first[i] for i in order]

    @property
    def ran_events(self) -> list[Event]:
        return self._ran_events

    @property
    def ran_marks(self) -> list[Mark]:
        return self._ran_marks

    # -- the full trace, written out when asked for -----------------------------------------------------------
    @property  # type: ignore[override]
    def events(self) -> list[Event]:
        if self._events is None:
            with collector_paused():  # millions of new records, none in a cycle (engine/collector.py)
                out: list[Event | None] = [None] * self._total
                for j, e in enumerate(self.ran_events):
                    out[e.seq] = e
                    for copy in self._copies_of(j):
                        out[copy.seq] = copy
                self._events = out  # type: ignore[assignment]
                self._made = {}
        return self._events  # type: ignore[return-value]

    @events.setter
    def events(self, value: list[Event]) -> None:
        self._events = list(value)

    def on_demand(self) -> Sequence[Event]:
        return self._events if self._events is not None else EventsOnDemand(self)

    def event_at(self, seq: int) -> Event:
        """Event `seq` of the full trace, written out with the other copies of the event it copies, not the rest."""
        if self._events is not None:
            return self._events[seq]
        if self._ran_at is None:
            self._ran_at = {e.seq: e for e in self._ran_events}
        got = self._ran_at.get(seq)
        if got is not None:
            return got
        # the ran event whose copies' numbers hold it: the last whose first copy is at or before it (one with no
        # copies has the next one's first number, and comes before it)
        j = bisect_right(self._first_copy, seq) - 1
        return self._copies_of(j)[seq - self._first_copy[j]]

    def _copies_of(self, j: int) -> list[Event]:
        """The copies of the j-th ran event, numbered, made once."""
        got = self._made.get(j)
        if got is None:
            got = self._made[j] = self._copied(self._ran_events[j])
            for k, copy in enumerate(got):
                copy.seq = self._first_copy[j] + k
        return got

    def compute_events(self) -> list[tuple[Event, tuple[int, ...]]]:
        if self._events is not None:
            return super().compute_events()
        mirrors = self._mirrors
        return [
            (e, (r, *mirrors.get(r, ()))) for e in self._ran_events if e.kind == "compute" for r in (e.members[0].rank,)
        ]

    def grid_places(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As Trace's, from the rule: a copy's members are its source's, renamed onto the image (a compute
        event's onto each rank folded onto its own), and its step is its source's."""
        if self._events is not None:
            return super().grid_places()
        steps = np.zeros(self._total, dtype=np.int64)
        ranks: list[np.ndarray] = []
        at: list[np.ndarray] = []
        for e, first in zip(self._ran_events, self._first_copy):
            mine = tuple([m.rank for m in e.members])
            steps[e.seq] = e.step
            ranks.append(np.array(mine, dtype=np.int64))
            at.append(np.full(len(mine), e.seq, dtype=np.int64))
            if e.kind == "compute":
                images = np.array(self._mirrors.get(mine[0], ()), dtype=np.int64)[:, None]
            else:
                images = self._renamed_ranks(e.group, mine)
            n = len(images)
            if n:
                steps[first : first + n] = e.step
                ranks.append(images.ravel())
                at.append(np.repeat(np.arange(first, first + n, dtype=np.int64), len(mine)))
        if not ranks:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), steps
        return np.concatenate(ranks), np.concatenate(at), steps

    def _renamed_ranks(self, grp: Any, mine: tuple[int, ...]) -> np.ndarray:
        """(images x members) the ranks of an event on `grp` whose members are `mine`, renamed onto each image of
        the group, in `_copied`'s order: made once per group and members."""
        key = (grp.index, mine)
        got = self._image_ranks.get(key)
        if got is None:
            images = self._images_of(grp)
            got = np.array([[to.get(r, r) for r in mine] for _, to in images], dtype=np.int64).reshape(
                len(images), len(mine)
            )
            self._image_ranks[key] = got
        return got

    @property  # type: ignore[override]
    def marks(self) -> list[Mark]:
        if self._marks is None:
            mirrors = self._mirrors
            self._marks = self.ran_marks + [
                Mark(r, m.step, m.kind, m.text, m.data) for m in self.ran_marks for r in mirrors.get(m.rank, ())
            ]
        return self._marks

    @marks.setter
    def marks(self, value: list[Mark]) -> None:
        self._marks = list(value)

    def _copied(self, e: Event) -> list[Event]:
        """The copies of run event `e` (numbered by the caller), in the order they are made."""
        if e.kind == "compute":
            (m,) = e.members
            return [_renamed(e, {m.rank: r}, e.group) for r in self._mirrors.get(m.rank, ())]
        return [_renamed(e, to, g) for g, to in self._images_of(e.group)]

    # -- one rank's part, without the rest -------------------------------------------------------------------
    def events_of(self, rank: int) -> list[Event]:
        if self._events is not None:
            return super().events_of(rank)
        rep = self.rep[rank]
        mine = []
        if rep == rank:  # a rank that ran: no copy is ever made onto a group holding one (`_images_of`)
            for e in self.ran_events:
                if _holds(e, rank):
                    mine.append(e)
            return mine
        where = self._images_for(rank)
        at = self._mirrors[rep].index(rank)
        for e, first in zip(self.ran_events, self._first_copy):
            if e.kind == "compute":
                if e.members[0].rank == rep:
                    copy = _renamed(e, {rep: rank}, e.group)
                    copy.seq = first + at
                    mine.append(copy)
            elif _holds(e, rank):
                mine.append(e)
            else:
                found = where.get(e.group.index)
                if found is not None:
                    k, g, to = found
                    copy = _renamed(e, to, g)
                    copy.seq = first + k
                    mine.append(copy)
        mine.sort(key=lambda e: e.seq)
        return mine

    def _images_for(self, rank: int) -> dict[int, tuple[int, Any, dict]]:
        """group index of a group that ran -> (its image's place among its images, the image, the renaming), for
        the image that holds `rank` (a folded rank is in at most one image of each group)."""
        rep, out = self.rep, {}
        for g in self.groups:
            if rank not in g.ranks:
                continue
            for grp in self._by_key[(g.name, tuple(rep[r] for r in g.ranks))]:
                if grp.ranks == g.ranks or grp.index not in self._ran_groups:
                    continue
                for k, (img, to) in enumerate(self._images_of(grp)):
                    if img.index == g.index:
                        out[grp.index] = (k, img, to)
        return out

    def marks_of(self, rank: int) -> list[Mark]:
        rep = self.rep[rank]
        if rep == rank:
            return [m for m in self.ran_marks if m.rank == rank]
        return [Mark(rank, m.step, m.kind, m.text, m.data) for m in self.ran_marks if m.rank == rep]


class EventsOnDemand(SequenceABC):
    """A folded trace's events in the full trace's order, each copy written out when it is first asked for (the
    app visits a few hundred of 70,000); going through them all writes the trace out."""

    def __init__(self, trace: FoldedTrace):
        self._trace = trace

    def __len__(self) -> int:
        return self._trace._total

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"event {i} of a trace of {n}")
        return self._trace.event_at(i)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._trace.events)


def _holds(e: Event, rank: int) -> bool:
    """Whether `rank` is a member of `e` (a collective's members are its group's ranks)."""
    if e.kind == "collective":
        return rank in e.group.ranks
    return any(m.rank == rank for m in e.members)


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

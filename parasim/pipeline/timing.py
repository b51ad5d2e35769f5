"""Place a schedule's actions in time slots from their dependencies, the way the post draws its tables.

What each kind waits for is its entry's `needs` in the kind table (action.KINDS): a forward of micro-batch k
on stage s waits for the forward of k on stage s-1; a backward (B or I) for the backward of k on stage s+1
and the forward of k on s; a weight pass W for its I. Each rank runs its list in order, one action at a
time; communication takes no time.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..errors import UsageError
from .action import KINDS, Action


@dataclass
class Timing:
    begin: list[list[int]]  # per rank, the start slot of each of its actions (in schedule order)
    makespan: int
    slots: list[list[str | None]]  # per rank, per time unit: the action's label or None (idle)
    idle: list[int]
    peak: list[int]  # most micro-batches whose activations a rank holds at once
    costs: dict[str, int]  # slots each kind of action takes

    @property
    def bubble(self) -> Fraction:
        ranks = len(self.slots)
        return Fraction(sum(self.idle), ranks * self.makespan) if self.makespan else Fraction(0)

    def to_dict(self, name: str, pp: int, m: int) -> dict:
        return {
            "schedule": name,
            "pp": pp,
            "microbatches": m,
            "slots": self.slots,
            "bubble": str(self.bubble),
            "bubble_fraction": float(self.bubble),
            "peak_activations": self.peak,
            "makespan": self.makespan,
            "idle": self.idle,
        }


def time_schedule(
    schedule: list[list[Action]],
    costs: dict[str, int] | None = None,
    max_slots: int | None = None,
    why: str = "the timing fills every slot of every rank",
) -> Timing:
    """Each action's start slot. `max_slots`: refuse (UsageError, naming the limit and `why`) as soon as the
    ranks x time slots passes it, before the slot table is built: placing the actions takes a pass over the
    ranks per round, about as many steps as the table has slots."""
    costs = {**{k.letter: k.cost for k in KINDS.values()}, **(costs or {})}
    # each kind's needs as (stage offset, kinds) pairs, read once: the loop below runs for every action
    needs = {k.letter: tuple((n.offset, n.kinds) for n in k.needs) for k in KINDS.values()}
    pp = len(schedule)
    last_stage = max((a.stage for acts in schedule for a in acts), default=0)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) -> end time
    # plain tuples on the hot path: hashing the Action dataclass would dominate large schedules
    plan = [[(a.kind, a.stage, a.mb, costs[a.kind]) for a in acts] for acts in schedule]
    begin: list[list[int]] = [[0] * len(acts) for acts in schedule]
    free, ptr = [0] * pp, [0] * pp
    remaining = sum(len(acts) for acts in schedule)
    while remaining:
        progress = False
        for r in range(pp):
            i = ptr[r]
            if i >= len(plan[r]):
                continue
            kind, stage, mb, cost = plan[r][i]
            t = _ready(done, needs[kind], stage, mb, last_stage)
            if t is None:
                continue
            s = max(free[r], t)
            begin[r][i] = s
            done[(kind, stage, mb)] = free[r] = s + cost
            if max_slots is not None and pp * free[r] > max_slots:
                raise UsageError(
                    f"the slot table, {pp:,} ranks x {free[r]:,} or more time slots: "
                    f"{pp * free[r]:,} slots is more than the limit of {max_slots:,} ({why})"
                )
            ptr[r] = i + 1
            remaining -= 1
            progress = True
        if not progress:
            stuck = {r: str(schedule[r][ptr[r]]) for r in range(pp) if ptr[r] < len(schedule[r])}
            raise UsageError(f"the schedule deadlocks: every rank waits ({stuck})")
    makespan = max(free, default=0)
    slots: list[list[str | None]] = [[None] * makespan for _ in range(pp)]
    for r, acts in enumerate(schedule):
        for i, a in enumerate(acts):
            label = str(a)
            for t in range(begin[r][i], begin[r][i] + costs[a.kind]):
                slots[r][t] = label
    idle = [sum(x is None for x in row) for row in slots]
    return Timing(begin, makespan, slots, idle, _peaks(schedule, begin, costs), costs)


def _ready(
    done: dict[tuple[str, int, int], int],
    needs: tuple[tuple[int, tuple[str, ...]], ...],
    stage: int,
    mb: int,
    last_stage: int,
) -> int | None:
    """The slot an action of (stage, mb) may start at, from the ends of what it needs; None: not yet."""
    t = 0
    for offset, kinds in needs:
        at = stage + offset
        if at < 0 or at > last_stage:  # no such stage: the need is void
            continue
        end = None
        for kind in kinds:
            end = done.get((kind, at, mb))
            if end is not None:
                break
        if end is None:
            return None
        t = max(t, end)
    return t


def _peaks(schedule: list[list[Action]], begin: list[list[int]], costs: dict[str, int]) -> list[int]:
    """Activations (per stage and micro-batch) are held from a forward's start until the end of its full
    backward, or of its weight pass: each kind's `holds` in the kind table."""
    out = []
    for r, acts in enumerate(schedule):
        events = []
        for i, a in enumerate(acts):
            holds = KINDS[a.kind].holds
            if holds > 0:
                events.append((begin[r][i], 1))
            elif holds < 0:
                events.append((begin[r][i] + costs[a.kind], -1))
        held = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            held += delta
            peak = max(peak, held)
        out.append(peak)
    return out

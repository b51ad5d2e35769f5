"""Place a schedule's actions in time slots from their dependencies, the way the post draws its tables.

A forward of micro-batch k on stage s waits for the forward of k on stage s-1; a backward (B or I) waits
for the backward of k on stage s+1 and the forward of k on s; a weight pass W waits for its I. Each rank
runs its list in order, one action at a time; communication takes no time.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..errors import UsageError
from .schedules import Action


@dataclass
class Timing:
    start: dict[tuple[int, Action], int]
    end: dict[tuple[int, Action], int]
    makespan: int
    slots: list[list[str | None]]  # per rank, per time unit: the action's label or None (idle)
    idle: list[int]
    peak: list[int]  # most micro-batches whose activations a rank holds at once

    @property
    def bubble(self) -> Fraction:
        ranks = len(self.slots)
        return Fraction(sum(self.idle), ranks * self.makespan) if self.makespan else Fraction(0)

    def to_dict(self, name: str, pp: int, m: int) -> dict:
        return {"schedule": name, "pp": pp, "microbatches": m, "slots": self.slots,
                "bubble": str(self.bubble), "bubble_fraction": float(self.bubble), "peak_activations": self.peak,
                "makespan": self.makespan, "idle": self.idle}


def simulate(schedule: list[list[Action]], costs: dict[str, int] | None = None) -> Timing:
    costs = {"F": 1, "B": 1, "I": 1, "W": 1, **(costs or {})}
    pp = len(schedule)
    last_stage = max((a.stage for acts in schedule for a in acts), default=0)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) -> end time
    start, end = {}, {}
    free, ptr = [0] * pp, [0] * pp

    def ready(a: Action) -> int | None:
        deps = []
        if a.kind == "F" and a.stage > 0:
            deps.append(("F", a.stage - 1, a.mb))
        if a.kind in ("B", "I"):
            deps.append(("F", a.stage, a.mb))
            if a.stage < last_stage:
                nxt = ("B", a.stage + 1, a.mb) if ("B", a.stage + 1, a.mb) in done else ("I", a.stage + 1, a.mb)
                deps.append(nxt)
        if a.kind == "W":
            deps.append(("I", a.stage, a.mb))
        if any(d not in done for d in deps):
            return None
        return max([done[d] for d in deps] + [0])

    total = sum(len(acts) for acts in schedule)
    while len(start) < total:
        progress = False
        for r in range(pp):
            if ptr[r] >= len(schedule[r]):
                continue
            a = schedule[r][ptr[r]]
            t = ready(a)
            if t is None:
                continue
            s = max(free[r], t)
            start[(r, a)], end[(r, a)] = s, s + costs[a.kind]
            done[(a.kind, a.stage, a.mb)] = s + costs[a.kind]
            free[r] = s + costs[a.kind]
            ptr[r] += 1
            progress = True
        if not progress:
            stuck = {r: str(schedule[r][ptr[r]]) for r in range(pp) if ptr[r] < len(schedule[r])}
            raise UsageError(f"the schedule deadlocks: every rank waits ({stuck})")
    makespan = max(end.values(), default=0)
    slots: list[list[str | None]] = [[None] * makespan for _ in range(pp)]
    for (r, a), s in start.items():
        for t in range(s, end[(r, a)]):
            slots[r][t] = str(a)
    idle = [sum(x is None for x in row) for row in slots]
    return Timing(start, end, makespan, slots, idle, _peaks(schedule, start, end))


def _peaks(schedule: list[list[Action]], start: dict, end: dict) -> list[int]:
    """Activations are held from a forward's start until the micro-batch's last backward piece ends."""
    out = []
    for r, acts in enumerate(schedule):
        split = any(a.kind == "W" for a in acts)
        events = []
        for a in acts:
            if a.kind == "F":
                events.append((start[(r, a)], 1))
            elif a.kind == ("W" if split else "B"):
                events.append((end[(r, a)], -1))
        held = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            held += delta
            peak = max(peak, held)
        out.append(peak)
    return out

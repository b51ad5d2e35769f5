"""The memory panel's model: bytes each rank of the selected event held while it ran (as the program told
the trace with `ctx.hold`), by kind, beside that rank's peak within the event's phase."""

from __future__ import annotations

from typing import NamedTuple

from ..comm.trace import HELD_KINDS, Event, Trace
from ..engine.symbolic.fold import FoldedTrace

SHORT = {"weights": "w", "gradients": "g", "optimizer": "opt", "activations": "act", "gathered": "gath"}


class Held(NamedTuple):
    rank: int
    by_kind: dict[str, int]
    total: int
    peak: int  # the most this rank held at any moment of the event's phase
    peak_where: str  # the buffer that reached it


SHOWN = 16  # ranks a panel lists for one event (a real-size all-to-all has 64, a data-parallel sum 128)


class HeldIndex:
    """Each rank's own marks (holds, frees, phases), found in one pass over the trace and asked of a trace
    of that rank alone: a real-size symbolic run has millions of marks, and a step asks a few ranks."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.world, self.backend = trace.world, trace.backend
        # the ranks that ran held what the others did (a folded trace's marks are copies of theirs)
        self.any = any(mk.kind == "held" for mk in trace.ran_marks)
        self.by_rank: dict[int, list] = {}
        if not isinstance(trace, FoldedTrace):  # one pass over every mark; a folded trace gives one rank's alone
            for mk in trace.marks:
                if mk.kind in ("held", "phase"):
                    self.by_rank.setdefault(mk.rank, []).append(mk)
        self._peaks: dict[tuple[int, str | None], dict] = {}

    def of(self, rank: int) -> Trace:
        if isinstance(self.trace, FoldedTrace) and rank not in self.by_rank:
            self.by_rank[rank] = [mk for mk in self.trace.marks_of(rank) if mk.kind in ("held", "phase")]
        return Trace(self.world, self.backend, marks=self.by_rank.get(rank, []))

    def peak(self, rank: int, phase: str | None) -> dict:
        key = (rank, phase)
        if key not in self._peaks:  # a phase's peak does not change as the event does: once per rank
            self._peaks[key] = self.of(rank).peak(rank, phase=phase)
        return self._peaks[key]


def held_rows(index: HeldIndex, event: Event, limit: int = SHOWN) -> list[Held]:
    """One row per rank taking part in `event`, the first `limit` of them; empty when the run told the trace
    nothing it holds."""
    if not index.any:
        return []
    out = []
    for r in event.ranks[:limit]:
        now = index.of(r).held(r, event.step)
        peak = index.peak(r, event.phase)
        out.append(Held(r, now, sum(now.values()), peak["bytes"], peak["name"] or ""))
    return out


def describe(row: Held) -> str:
    """The kinds a rank holds, largest first, in few letters: 'opt 13,056  w 2,176 ...'."""
    parts = sorted(((n, k) for k, n in row.by_kind.items() if n), reverse=True)
    return "  ".join(f"{SHORT[k]} {n:,}" for n, k in parts) or "nothing"


__all__ = ["HELD_KINDS", "SHOWN", "Held", "HeldIndex", "describe", "held_rows"]

"""The memory panel's model: bytes each rank of the selected event held while it ran (as the program told
the trace with `ctx.hold`), by kind, beside that rank's peak within the event's phase."""
from __future__ import annotations

from typing import NamedTuple

from ..trace import HELD_KINDS, Event, Trace

SHORT = {"weights": "w", "gradients": "g", "optimizer": "opt", "activations": "act", "gathered": "gath"}


class Held(NamedTuple):
    rank: int
    by_kind: dict[str, int]
    total: int
    peak: int  # the most this rank held at any moment of the event's phase
    peak_where: str  # the buffer that reached it


def held_rows(trace: Trace, event: Event) -> list[Held]:
    """One row per rank taking part in `event`; empty when the run told the trace nothing it holds."""
    if not any(mk.kind == "held" for mk in trace.marks):
        return []
    out = []
    for r in event.ranks:
        now = trace.held(r, event.step)
        peak = trace.peak(r, phase=event.phase)
        out.append(Held(r, now, sum(now.values()), peak["bytes"], peak["name"] or ""))
    return out


def describe(row: Held) -> str:
    """The kinds a rank holds, largest first, in few letters: 'opt 13,056  w 2,176 ...'."""
    parts = sorted(((n, k) for k, n in row.by_kind.items() if n), reverse=True)
    return "  ".join(f"{SHORT[k]} {n:,}" for n, k in parts) or "nothing"


__all__ = ["HELD_KINDS", "Held", "describe", "held_rows"]

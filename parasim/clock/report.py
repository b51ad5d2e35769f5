"""A run's times for the reader: the chosen GPU and overlap, the run's timeline (beside its trace, which the
clock never writes on), and what each overlap switch would save on this very run (the same trace laid out
again with the switch on)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..estimate.hardware import GPUS
from .costs import machine
from .overlaps import OVERLAPS, TRACE, names, parse
from .timeline import Timeline, paired_phases, simulate, summary
from ..comm.trace import Trace


@dataclass(frozen=True)
class ClockChoice:
    """The machine and switches a run is timed on (`--gpu-model`, `--gpus-per-node`, `--overlap`)."""

    gpu: str = "h200"
    gpus_per_node: int | None = None
    overlap: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise UsageError(f"--gpu-model: {self.gpu!r} is not one of {', '.join(GPUS)}")
        parse(",".join(self.overlap) or "none", TRACE)  # a bad name: the flag's own error


def timeline_of(trace: Trace, choice: ClockChoice = ClockChoice()) -> Timeline:
    """`trace` laid out on the clock of `choice`: every event's start and end (the trace is left as it is)."""
    return simulate(trace, machine(choice.gpu, choice.gpus_per_node), choice.overlap)


def clock_report(trace: Trace, choice: ClockChoice = ClockChoice(), tl: Timeline | None = None) -> dict[str, Any]:
    """The step of `trace` on `choice` (`tl`, its timeline, when the caller has it already) and what each switch
    not chosen would save on it."""
    m = machine(choice.gpu, choice.gpus_per_node)
    tl = simulate(trace, m, choice.overlap) if tl is None else tl
    out = summary(tl, trace)
    exact = trace.meta.get("precision", {}).get("exact", True)
    out["exact"] = exact  # a lesson's small arrays in float64: its time is the collectives' fixed costs
    if not exact:  # a real-size run: the held-out runs like it
        from .uncertainty import family_range, held_out, trace_family

        out["range"] = family_range(trace_family(trace), choice.gpu, held_out()).to_dict(tl.step)
    out["switches"] = {}
    paired = paired_phases(trace)
    for name in names(TRACE):
        o = OVERLAPS[name]
        on = tuple(sorted(set(choice.overlap) | {name}))
        off = tuple(x for x in choice.overlap if x != name)
        if not any(o.moves(e, paired) for e in trace.ran_events):  # it moves nothing here: no timeline to lay out
            with_it = without = tl.step
        else:  # the timeline of the choice is one of the two; the others time no event again
            costs = tl.costs if tl.machine == m else None
            with_it = tl.step if name in choice.overlap else simulate(trace, m, on, costs).step
            without = tl.step if name not in choice.overlap else simulate(trace, m, off, costs).step
        out["switches"][name] = {
            "what": o.what,
            "flag": o.flag,
            "on": name in choice.overlap,
            "step_on_us": with_it * 1e6,
            "step_off_us": without * 1e6,
            "saves_us": (without - with_it) * 1e6,
        }
    return out

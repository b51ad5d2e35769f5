"""Virtual ranks: one process, numpy arrays, cooperative scheduling; the same trace on every run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..comm.trace import Trace
from .context import Context


@dataclass
class RunResult:
    """What a run produced: each rank's return value (in rank order) and the trace of every event."""

    values: list[Any]
    trace: Trace
    times: dict[tuple[int, int], tuple[float, float]] | None = None  # real ranks: (seq, rank) -> (start, dur) us
    marked: list[list[tuple[str, Any]]] | None = None  # per rank: the tensors it marked (ctx.mark), in order
    # per rank: the roundings its ctx.xp products and sums made, added up (engine/work.py; None: not counted)
    roundings: list[int] | None = None

    @property
    def world(self) -> int:
        return self.trace.world


def run_virtual(
    program: Callable[[Context], Any],
    world: int,
    *,
    seed: int = 0,
    keep_values: int = 0,
    algo: str = "direct",
    timeout: float | None = None,
    precision: Any = None,
) -> RunResult:
    """`program(ctx)` on `world` virtual ranks (checked by `parasim.run`, which calls this)."""
    # Imported here so that `import parasim` stays light.
    import array_api_compat.numpy as xp

    from ..comm.virtual import VirtualWorld
    from ..comm.virtual_comm import VirtualComm

    from .work import Meter, counting

    vw = VirtualWorld(world, keep_values=keep_values, algo=algo, timeout=timeout)
    vw.meter = Meter(world, lambda: vw.running)  # FLOPs go to the rank whose turn it is
    xp = counting(xp, vw.meter)
    contexts = [Context(r, world, VirtualComm(vw, r), xp, seed, vw, _identity, precision) for r in range(world)]
    values = vw.run(program, contexts)
    trace = vw.trace()
    trace.meta["seed"] = seed
    return RunResult(values, trace, marked=[c.marked for c in contexts], roundings=list(vw.meter.roundings))


def _identity(a):
    return a

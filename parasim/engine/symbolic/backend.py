"""Symbolic ranks: virtual ranks (the same scheduler, groups, op table and trace) whose arrays are
`SymArray`s. Every collective and transfer is matched, checked and recorded with its shapes and bytes as
on virtual ranks; no array data exists, so worlds and sizes are those of real clusters. Each run makes its
own `SymbolicRun` (the memo of the shape rules and each rank's FLOPs) and the namespace and draws of it."""

from __future__ import annotations

from typing import Any, Callable, Hashable

import numpy as np

from ...comm.interface import dtype_name, numeric
from ...comm.virtual import VirtualWorld
from ...comm.virtual_p2p import check_array
from ...comm.virtual_comm import VirtualComm
from ..context import Context
from ..virtual import RunResult
from ...errors import CollectiveError
from ...layout.precision import Precision, precision as precision_of
from .array import SymArray, SymbolicRun
from ..collector import collector_paused
from .fold import FoldedTrace
from .folded import FoldedWorld
from .namespace import SymbolicNamespace, SymbolicRng
from .repeat import record, replay

_RUNS = object()  # a memo's mark for a call that cannot be repeated


def check_symbolic_array(x: Any, op: str) -> None:
    """A symbolic rank sends SymArrays (numpy arrays too: index lists are real)."""
    if isinstance(x, SymArray):
        if not numeric(x.dtype):
            raise CollectiveError(f"{op} expects numbers, got an array of dtype {dtype_name(x.dtype)}")
        return
    check_array(x, op)


class SymbolicComm(VirtualComm):
    def _check_array(self, x: Any, op: str) -> None:
        check_symbolic_array(x, op)


class SymbolicContext(Context):
    """A rank's context whose arrays, draws and literals are symbolic, of the run `xp` belongs to."""

    def __init__(
        self, rank: int, world: int, comm: Any, seed: int, recorder: Any, xp: SymbolicNamespace, precision: Precision
    ):
        super().__init__(rank, world, comm, xp, seed, recorder, _identity, precision, exact=False)
        self.rng = SymbolicRng(xp.run)  # type: ignore[assignment]
        self.symbolic = True

    def shared_rng(self, name: str) -> SymbolicRng:  # type: ignore[override]
        return SymbolicRng(self.xp.run)

    def repeat(self, memo: dict, key: Hashable, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """The first call for `key` runs and is recorded; later ones tell the trace its events again
        (engine/symbolic/repeat.py). A call that cannot be repeated runs every time."""
        got = memo.get(key)
        if got is not None:
            if got is _RUNS:
                return fn(), False
            replay(self._recorder, self.rank, got)
            return got.result, True
        result, rec = record(self._recorder, self.rank, fn)
        memo[key] = _RUNS if rec is None else rec
        return result, False

    def asarray(self, values: Any, dtype: Any = None) -> SymArray:
        return SymArray(np.shape(values), dtype_name(self.float_name if dtype is None else dtype), self.xp.run)


def run_symbolic(
    program: Callable[[Any], Any],
    world: int,
    *,
    seed: int = 0,
    algo: str = "direct",
    fold: list[int] | None = None,
    timeout: float | None = None,
    precision: Precision | None = None,
) -> RunResult:
    """`program(ctx)` on `world` symbolic ranks (checked by `parasim.run`, which calls this). `fold`: rank ->
    the rank that runs for it (engine/symbolic/fold.py); the trace then counts every rank (FoldedTrace). Arrays are
    made in `precision`'s dtypes (the post's by default), so the trace's bytes are a training run's."""
    precision = precision_of(precision)
    options: dict[str, Any] = dict(keep_values=0, algo=algo, timeout=timeout, check=check_symbolic_array)
    vw = VirtualWorld(world, **options) if fold is None else FoldedWorld(world, fold, **options)
    # FLOPs go to the rank whose turn it is; draws, zeros and float literals in the precision's compute dtype
    run = SymbolicRun(world, lambda: vw.running, precision.dtype("compute"))
    vw.meter = run.meter  # each event carries the FLOPs its members did since their last one
    xp = SymbolicNamespace(run)
    contexts = [
        SymbolicContext(r, world, SymbolicComm(vw, r), seed, vw, xp, precision)
        if fold is None or fold[r] == r
        else None
        for r in range(world)
    ]
    with collector_paused():  # the run's records and their unfolded copies: millions, none in a cycle
        values = vw.run(program, contexts)
        trace = vw.trace()
        if fold is not None:  # the copies onto the folded ranks are written out when a reader asks for them
            trace = FoldedTrace(trace, fold)
    trace.backend = "symbolic"
    trace.meta["seed"] = seed
    # per rank: its matmuls' FLOPs (a folded rank did its representative's)
    trace.meta["flops"] = list(run.flops) if fold is None else [run.flops[s] for s in fold]
    if fold is not None and "tail_work" in trace.meta:
        trace.meta["tail_work"] = [trace.meta["tail_work"][s] for s in fold]
    return RunResult(values, trace, marked=[c.marked if c is not None else [] for c in contexts])


def _identity(a: Any) -> Any:
    return a

"""Symbolic ranks: virtual ranks (the same scheduler, groups, op table and trace) whose arrays are
`SymArray`s. Every collective and transfer is matched, checked and recorded with its shapes and bytes as
on virtual ranks; no array data exists, so worlds and sizes are those of real clusters."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..comm.interface import dtype_name, numeric
from ..comm.virtual import VirtualWorld, _check_array
from ..comm.virtual_comm import VirtualComm
from ..engine.context import Context
from ..engine.virtual import RunResult
from ..errors import CollectiveError, UsageError
from .array import SymArray
from .namespace import SymbolicNamespace, SymbolicRng

XP = SymbolicNamespace()


def check_array(x: Any, op: str) -> None:
    """A symbolic rank sends SymArrays (numpy arrays too: index lists are real)."""
    if isinstance(x, SymArray):
        if not numeric(x.dtype):
            raise CollectiveError(f"{op} expects numbers, got an array of dtype {dtype_name(x.dtype)}")
        return
    _check_array(x, op)


class SymbolicComm(VirtualComm):
    def _check_array(self, x: Any, op: str) -> None:
        check_array(x, op)


class SymbolicContext(Context):
    """A rank's context whose arrays, draws and literals are symbolic."""

    def __init__(self, rank: int, world: int, comm: Any, seed: int, recorder: Any):
        super().__init__(rank, world, comm, XP, seed, recorder, _identity)
        self.rng = SymbolicRng()  # type: ignore[assignment]
        self.symbolic = True

    def shared_rng(self, name: str) -> SymbolicRng:  # type: ignore[override]
        return SymbolicRng()

    def asarray(self, values: Any, dtype: Any = "float64") -> SymArray:
        return SymArray(np.shape(values), dtype_name(dtype))


def run_symbolic(program: Callable[[Any], Any], world: int, *, seed: int = 0, algo: str = "direct",
                 fold: list[int] | None = None, timeout: float | None = None) -> RunResult:
    """`program(ctx)` on `world` symbolic ranks (checked by `parasim.run`, which calls this). `fold`: rank ->
    the rank that runs for it (symbolic/fold.py); the trace is then unfolded to count every rank."""
    vw = VirtualWorld(world, keep_values=0, algo=algo, timeout=timeout)
    vw.check_array = check_array
    if fold is not None:
        if len(fold) != world or any(not 0 <= s < world or fold[s] != s for s in fold):
            raise UsageError("a fold maps every rank to a rank that runs for itself")
        vw.rep = list(fold)
    contexts = [SymbolicContext(r, world, SymbolicComm(vw, r), seed, vw) if fold is None or fold[r] == r else None
                for r in range(world)]
    values = vw.run(program, contexts)
    trace = vw.trace()
    if fold is not None:
        from .fold import unfold
        trace = unfold(trace, fold)
    trace.backend = "symbolic"
    trace.meta["seed"] = seed
    trace.meta["flops"] = vw.flops  # per rank: its matmuls' FLOPs (a folded rank did its representative's)
    return RunResult(values, trace, marked=[c.marked if c is not None else [] for c in contexts])


def _identity(a: Any) -> Any:
    return a

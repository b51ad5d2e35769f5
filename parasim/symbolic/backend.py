"""Symbolic ranks: virtual ranks (the same scheduler, groups, op table and trace) whose arrays are
`SymArray`s. Every collective and transfer is matched, checked and recorded with its shapes and bytes as
on virtual ranks; no array data exists, so worlds and sizes are those of real clusters."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..comm.interface import dtype_name
from ..comm.virtual import NUMERIC, VirtualWorld, _check_array
from ..comm.virtual_comm import VirtualComm
from ..engine.context import Context
from ..engine.virtual import RunResult
from ..errors import CollectiveError
from .array import SymArray
from .namespace import SymbolicNamespace, SymbolicRng

XP = SymbolicNamespace()


def check_array(x: Any, op: str) -> None:
    """A symbolic rank sends SymArrays (numpy arrays too: index lists are real)."""
    if isinstance(x, SymArray):
        if x.dtype.kind not in NUMERIC:
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


def run_symbolic(program: Callable[[Any], Any], world: int, *, seed: int = 0, algo: str = "direct") -> RunResult:
    """`program(ctx)` on `world` symbolic ranks (checked by `parasim.run`, which calls this)."""
    vw = VirtualWorld(world, keep_values=0, algo=algo)
    vw.check_array = check_array
    contexts = [SymbolicContext(r, world, SymbolicComm(vw, r), seed, vw) for r in range(world)]
    values = vw.run(program, contexts)
    trace = vw.trace()
    trace.backend = "symbolic"
    trace.meta["seed"] = seed
    return RunResult(values, trace, marked=[c.marked for c in contexts])


def _identity(a: Any) -> Any:
    return a

"""`parasim.run`: call an SPMD program once per rank and collect its values and trace."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import UsageError
from ..limits import TIMEOUT, VIRTUAL_WORLD, at_most, check_timeout
from .context import Context
from .virtual import RunResult, run_virtual

BACKENDS = ("virtual", "symbolic", "gloo", "nccl")


def run(
    program: Callable[[Context], Any],
    world: int | None = None,
    backend: str = "virtual",
    *,
    seed: int = 0,
    keep_values: int = 0,
    algo: str = "direct",
    check: bool = True,
    timeout: float | None = TIMEOUT,
    layout: Any = None,
    fold: list[int] | None = None,
    precision: Any = None,
) -> RunResult:
    """Run `program(ctx)` on `world` ranks: virtual ranks in this process, symbolic ones (shapes and bytes,
    no values: real sizes), or real ones (gloo, nccl) in `world` local processes, for which `program` must
    be picklable (a module-level function).

    seed: seeds `ctx.rng` (per rank) and `ctx.shared_rng(name)`; same seed, same draws on every backend.
    keep_values: record the values of arrays with at most this many elements in the trace (for lessons).
    algo: how all-reduce, reduce-scatter and all-gather run by default: "direct", or "ring" hop by hop.
    check (real ranks): the signature exchange before each collective.
    timeout: seconds before a stuck rank stops the run, naming it and its line: on real ranks, seconds in one
    call; on virtual and symbolic ranks, seconds of running without reaching a collective or returning (None:
    no limit there).
    layout: a `parasim.Layout`; every rank then starts with `ctx.layout`, `ctx.groups[name]` and `ctx.coords`,
    and `world` defaults to the layout's.
    fold (symbolic ranks): rank -> the rank that runs for it (`parasim.engine.symbolic.fold.fold_of(layout)`): ranks
    that do the same work run once, and the trace is written out for every rank.
    precision: the training precision the run stands for (a layout/precision.py name or entry; default the
    post's). Symbolic ranks compute each kind of tensor in its dtype, so the trace's bytes are the job's;
    virtual and real ranks compute in float64, exact, and the trace says which precision they stand for.
    """
    from ..layout.precision import precision as precision_of

    precision = precision_of(precision)
    if layout is not None:
        from .context import WithLayout

        if world is not None and world != layout.world:
            raise UsageError(f"world {world} differs from the layout's {layout.world} GPUs")
        world = layout.world
        program = WithLayout(program, layout)
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
    if fold is not None and backend != "symbolic":
        raise UsageError("folding ranks needs symbolic ranks: values would differ from rank to rank")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise UsageError(f"world size must be a positive integer, got {world!r}")
    if timeout is not None or backend in ("gloo", "nccl"):
        check_timeout(timeout)
    if backend == "symbolic":
        from .symbolic.backend import run_symbolic

        at_most("world size", world, VIRTUAL_WORLD, "symbolic ranks run in this one process, one greenlet each")
        return _stamped(
            run_symbolic(program, world, seed=seed, algo=algo, fold=fold, timeout=timeout, precision=precision),
            precision.name,
            exact=False,
        )
    if backend == "virtual":
        at_most("world size", world, VIRTUAL_WORLD, "virtual ranks hold real arrays, all in this one process")
    else:
        from .launch import RealOptions, launch
        from .merge import merge

        assert timeout is not None  # check_timeout above refused None: real ranks always run under a limit
        results = launch(program, world, RealOptions(backend, seed, keep_values, algo, check, timeout))
        trace, times = merge(results, backend)
        return _stamped(RunResult([r["value"] for r in results], trace, times), precision.name, exact=True)
    return _stamped(
        run_virtual(
            program, world, seed=seed, keep_values=keep_values, algo=algo, timeout=timeout, precision=precision
        ),
        precision.name,
        exact=True,
    )


def _stamped(result: RunResult, precision: str, exact: bool) -> RunResult:
    """The run's trace told which precision it stands for, and whether its values are exact (float64) or
    computed in that precision's dtypes (the clock and the renderers read it)."""
    result.trace.meta["precision"] = {"name": precision, "exact": exact}
    return result

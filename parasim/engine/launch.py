"""Start real ranks: N local processes that meet through a store served here on 127.0.0.1 (nothing
listens beyond loopback, whatever the environment says), or join a run that torchrun already started. Each
process runs the program on a `TorchComm` and hands back its own record of every call; the caller merges
and checks them.

Programs travel to the workers as a picklable callable or as (file path, function name), so a program
loaded from a file (a lesson) need not be importable.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..limits import check_processes, check_real_timeout
from ..errors import CollectiveError, ParasimError, RankFailed, RealRunFailed, UsageError
from ..comm.rank_errors import ASK, REIMPORTED, STARTING, Watch, answer_where, ask_where, failure, guard_hint
from ..comm.loopback import local_env, loopback_store
from ..comm.sites import with_call_site
from ..comm.starter import leave_with, signals_held, starter, sweep_folders
from ..comm.torchrun import job_store
from ..comm.watchdog import raised_text

Target = Callable[[Any], Any] | tuple[str, str]
REAL_BACKENDS = ("gloo", "nccl")  # the torch.distributed ones: engine/runner.BACKENDS adds virtual and symbolic


@dataclass(frozen=True)
class RealOptions:
    backend: str = "gloo"
    seed: int = 0
    keep_values: int = 0
    algo: str = "direct"
    check: bool = True  # the signature exchange before each collective
    timeout: float = 30.0  # seconds a rank may wait in one collective before the run is stopped
    error_dir: str | None = None  # where each failing rank writes its error (set by `launch`)
    # where a rank's tensors live: "auto" (NCCL: its own GPU; gloo: the CPU), "cpu", or "cuda" (gloo on CUDA
    # tensors: ranks share the GPUs round robin, so several ranks can run on one GPU, which NCCL refuses)
    device: str = "auto"
    prints_to_stderr: bool = False  # what the program prints goes to stderr (--json: stdout holds the JSON alone)


DEVICES = ("auto", "cpu", "cuda")


RankJob = tuple[Target, RealOptions]  # a program and the options it runs with (seed, keep_values, ...)


def check_backend(backend: str, nproc_per_node: int, device: str = "auto") -> None:
    """UsageError (exit 2) when the backend cannot run here: no torch, no GPU, too few GPUs, or a device
    the backend cannot use."""
    if backend not in REAL_BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; use one of {', '.join(REAL_BACKENDS)}")
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; use one of {', '.join(DEVICES)}")
    if backend == "nccl" and device == "cpu":
        raise UsageError("--backend nccl keeps tensors on GPUs; --device cpu needs --backend gloo")
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UsageError(
            'real ranks need torch: pip install torch (in a parasim checkout: pip install ".[torch]", as README says)'
        ) from None
    if backend == "gloo" and not dist.is_gloo_available():
        raise UsageError("this torch build has no gloo backend")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU and none is visible here; leave it out to run on the CPU")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise UsageError("--backend nccl needs CUDA GPUs and none is visible here; use --backend gloo on CPU")
        if not dist.is_nccl_available():
            raise UsageError("this torch build has no NCCL backend; use --backend gloo")
        if torch.cuda.device_count() < nproc_per_node:
            raise UsageError(
                f"--backend nccl needs one GPU per rank: {nproc_per_node} ranks on this node, "
                f"{torch.cuda.device_count()} GPUs visible"
            )


def _load(target: Target) -> Callable[[Any], Any]:
    if callable(target):
        return target
    path, name = target
    spec = importlib.util.spec_from_file_location(f"parasim_program_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None  # a path to a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _to_host(v: Any) -> Any:
    """Return values as numpy (picklable, comparable with a virtual run)."""
    import torch

    from ..comm.torchdist import to_numpy

    if isinstance(v, torch.Tensor):
        return to_numpy(v)  # bfloat16 too
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_host(x) for k, x in v.items()}
    return v


def run_rank(target: Target, opts: RealOptions, gather: bool = False) -> Any:
    """The body of one real rank. torch.distributed's usual environment must be set (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, ...), as torchrun sets it.

    Returns this rank's result; with `gather`, rank 0 returns every rank's (in rank order), the others None."""
    out = run_jobs([(target, opts)], gather, store=job_store(opts.timeout))
    return out if out is None else out[0]


def run_jobs(
    jobs: list[RankJob], gather: bool = False, store: Any = None, watch: Watch | None = None
) -> list[Any] | None:
    """Several programs one after another on this rank, in one process group (one start-up for all).

    Returns this rank's result per job; with `gather`, rank 0 returns per job every rank's result (in rank
    order), the others None. Backend and timeout are the first job's. Without `store`, the process group
    is found through torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). `watch`: what the
    launcher's watchdog sees of this rank (a local launch)."""
    import torch
    import torch.distributed as dist

    opts = jobs[0][1]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if opts.backend == "nccl":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    elif opts.device == "cuda":  # gloo on CUDA tensors: gloo copies through the host, so GPUs may be shared
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=opts.timeout)
    if store is None:
        dist.init_process_group(opts.backend, timeout=timeout)
    else:
        dist.init_process_group(
            opts.backend,
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
    if watch is not None:
        watch.leave()  # joined: from here on the watchdog expects calls
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [_run_program(target, o, rank, world, device, watch) for target, o in jobs]
    out: list[Any] | None = mine
    if gather:
        everyone: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(mine, everyone, dst=0)
        out = None if everyone is None else [[everyone[r][j] for r in range(world)] for j in range(len(jobs))]
    dist.destroy_process_group()
    return out


def _run_program(
    target: Target, opts: RealOptions, rank: int, world: int, device: Any, watch: Watch | None = None
) -> dict:
    """One program on this rank, with a comm and context of its own; its result and call records."""
    import array_api_compat.torch as xp
    import torch

    from .context import Context
    from .torch_xp import TorchNamespace, counting_roundings
    from ..comm.torchdist import TorchComm, to_torch

    try:
        wire = torch.device("cpu") if opts.backend == "gloo" else None  # gloo works on the host, whatever the device
        comm = TorchComm(
            rank,
            world,
            device,
            keep_values=opts.keep_values,
            algo=opts.algo,
            check=opts.check,
            timeout=datetime.timedelta(seconds=opts.timeout),
            watch=watch,
            wire=wire,
        )
        ctx = Context(rank, world, comm, TorchNamespace(xp), opts.seed, comm, lambda a: to_torch(a, device))
        if watch is not None:
            watch.leave()  # the file's top level is the program's own code
        with _prints_to_stderr(opts.prints_to_stderr):
            program = _load(target)
            comm.start()
            with counting_roundings() as counter:  # how far this rank's arithmetic may drift: engine/compare.py
                value = program(ctx)
            comm.finish()
    except Exception as exc:
        # Report before anything closes a connection: the other ranks' failures are only echoes of this one.
        err: Exception = exc if isinstance(exc, ParasimError) else RankFailed(raised_text(rank, exc).rstrip("\n"), rank)
        if isinstance(exc, CollectiveError):  # a call that can never work: its line, as virtual ranks say
            err = with_call_site(exc)
        _report(opts, rank, err)
        if err is exc:
            raise
        raise err from exc
    return {
        "rank": rank,
        "world": world,
        "value": _to_host(value),
        "records": comm.records,
        "groups": [[g.index, g.name, list(g.ranks)] for g in comm.groups],
        "roundings": counter.count,
        "device": device.type,
        "wire": comm.wire.type,
    }


@contextlib.contextmanager
def _prints_to_stderr(on: bool) -> Any:
    """While the block runs, file descriptor 1 (print, and C code's stdout) is stderr's: the program's prints
    then stay out of the JSON its launcher writes on stdout."""
    import sys

    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _report(opts: RealOptions, rank: int, err: BaseException) -> None:
    """Leave this rank's error for the launcher, with what it needs to raise the same error again."""
    if opts.error_dir:
        data = {"rank": rank, "time": time.time(), "kind": type(err).__name__, "message": str(err)}
        data.update({a: getattr(err, a) for a in ("calls", "ranks", "waiting") if hasattr(err, a)})
        with contextlib.suppress(OSError, TypeError), open(os.path.join(opts.error_dir, f"rank{rank}.json"), "w") as f:
            json.dump(data, f)


def _worker(
    jobs: list[RankJob],
    rank: int,
    world: int,
    port: int,
    folder: str,
    beats: Any,
    states: Any,
    env: dict[str, str],
    launcher: int,
) -> None:
    """The body of one local process: join the run's store, run every job, leave the results (or the
    error) in `folder` and exit quietly; the launcher reports. `beats` and `states`: shared memory the
    launcher watches (rank_errors.Watch). `launcher`: the launching process's pid."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle: it ends the workers
    leave_with(launcher, folder)
    signal.signal(ASK, answer_where(folder, rank))  # the launcher asks where a rank stuck in its program is
    os.environ.clear()  # the launcher's environment now, not the fork server's when it started
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        import pickle

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # one thread per rank: N processes share this machine's cores
        store = dist.TCPStore(
            "127.0.0.1", port, world + 1, False, timeout=datetime.timedelta(seconds=jobs[0][1].timeout)
        )
        out = run_jobs(jobs, store=store, watch=Watch(beats, states, rank))
        try:
            data = pickle.dumps(out)
        except Exception as exc:
            err = RealRunFailed(
                f"rank {rank}: its results cannot be sent back to the launcher "
                f"({type(exc).__name__}: {exc}); return numbers, arrays or tensors",
                rank,
            )
            _report(jobs[0][1], rank, err)
            os._exit(1)
        with open(os.path.join(folder, f"result{rank}.pkl"), "wb") as f:
            f.write(data)
    except BaseException as exc:  # reported in the folder (by _run_program, or here), not on stderr
        if not os.path.exists(os.path.join(folder, f"rank{rank}.json")):
            _report(jobs[0][1], rank, RankFailed(raised_text(rank, exc).rstrip("\n"), rank))
        os._exit(1)
    os._exit(0)  # skip interpreter shutdown: a gloo thread must not hold the process once results are written


def launch(target: Target, nproc: int, opts: RealOptions) -> list[dict]:
    """Run `target` on `nproc` local processes; return each rank's result, in rank order."""
    return launch_many([(target, opts)], nproc)[0]


def launch_many(jobs: list[RankJob], nproc: int) -> list[list[dict]]:
    """Run several programs one after another on the same `nproc` local processes, paying the start-up
    (processes, torch import, rendezvous) once; return per job each rank's result, in rank order.
    Backend and timeout are the first job's (a job with another backend is refused).

    Every socket stays on 127.0.0.1: the store is served here on loopback, gloo is kept to the loopback
    interface. A rank that fails is named with its own error; one that dies without raising (an exit
    code, a signal) is named with that; one stuck outside any collective while others time out waiting
    for it is named with the line it is on."""
    import multiprocessing
    import pickle

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # This process is a worker importing the script that launched it (the spawn and forkserver start
        # methods do), and the script launches again at its top level. Leave at once and quietly: the
        # launcher sees this exit code and says what to change.
        os._exit(REIMPORTED)
    opts = jobs[0][1]
    if any(o.backend != opts.backend for _, o in jobs):
        raise UsageError("every program of one launch runs on the same backend")
    check_real_timeout(opts.timeout)
    check_processes(nproc)
    check_backend(opts.backend, nproc, opts.device)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn = starter()
    store, port = loopback_store(nproc, opts.timeout)
    beats = spawn.RawArray("d", nproc)  # when each rank last finished a call (monotonic clock; 0: not joined)
    states = spawn.RawArray("b", nproc)  # what each rank is doing: rank_errors.STARTING, IN_PROGRAM, IN_CALL
    env = local_env()
    sweep_folders()
    with tempfile.TemporaryDirectory(prefix=f"parasim-{os.getpid()}-") as folder:
        procs = [
            spawn.Process(
                target=_worker,
                name=f"parasim-rank{r}",
                daemon=True,
                args=(
                    [(t, replace(o, error_dir=folder)) for t, o in jobs],
                    r,
                    nproc,
                    port,
                    folder,
                    beats,
                    states,
                    env,
                    os.getpid(),
                ),
            )
            for r in range(nproc)
        ]
        try:
            for p in procs:
                try:
                    with signals_held():
                        p.start()
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    raise UsageError(
                        f"the program cannot be sent to the worker processes ({exc}); real ranks "
                        "need a function defined at a module's top level"
                    ) from None
                except (EOFError, ConnectionError) as exc:  # the fork server died: it too imports the script
                    raise RealRunFailed(
                        f"the worker processes could not be started ({type(exc).__name__}: "
                        f"{exc}); if the script calls parasim.run at its top level: "
                        f"{guard_hint()}"
                    ) from None
            # twice the timeout: a rank waiting in a collective is ended by its backend's own time-out first,
            # with the better message (which call, which group)
            died, stalled = _wait_all(procs, folder, beats, 2 * opts.timeout)
            where = ask_where(procs, states, folder)  # before they are stopped: who is stuck, and on which line
        finally:
            _end(procs)
            del store
        if stalled or died or any(p.exitcode != 0 for p in procs):
            raise failure(
                procs, folder, died, where, opts.timeout, stalled, {r for r in range(nproc) if states[r] != STARTING}
            )
        out = []
        for r in range(nproc):
            with open(os.path.join(folder, f"result{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return [[out[r][j] for r in range(nproc)] for j in range(len(jobs))]


def _wait_all(
    procs: list, folder: str, beats: Any, timeout: float, grace: float = 2.0
) -> tuple[list[tuple[int, int]], bool]:
    """Wait until every process has exited. When one fails, give the others `grace` seconds to report
    their own errors (most are echoes of it), then stop waiting. Returns (rank, exit code) of each process
    seen to end without reporting an error (an exit code, a signal, or exit code 0 before its results
    were written), in that order, and whether the run stalled: every rank joined and none finished a
    call for `timeout` seconds (the watchdog: ranks stuck outside any collective)."""
    import multiprocessing.connection

    alive = {p.sentinel: r for r, p in enumerate(procs)}
    died: list[tuple[int, int]] = []
    deadline = None
    while alive:
        left = max(0.0, deadline - time.monotonic()) if deadline is not None else min(1.0, timeout)
        ready = multiprocessing.connection.wait(list(alive), timeout=left)
        if not ready and deadline is not None:
            break  # the grace after a failure is over
        if not ready:
            last = [beats[r] for r in alive.values()]
            if all(last) and time.monotonic() - max(last) > timeout:
                return died, True
            continue
        for sentinel in ready:
            r = alive.pop(sentinel)
            procs[r].join()
            code = procs[r].exitcode
            # a worker writes its results, then exits 0: exit 0 without them is a program that left early
            failed = code != 0 or not os.path.exists(os.path.join(folder, f"result{r}.pkl"))
            if failed and deadline is None:
                deadline = time.monotonic() + grace
            if failed and not os.path.exists(os.path.join(folder, f"rank{r}.json")):
                died.append((r, code))
    return died, False


def _end(procs: list, grace: float = 1.0) -> None:
    """No worker outlives the launch: a hung one is killed, on every way out (Ctrl-C included)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:
            p.join(grace)


def join_torchrun(target: Target, opts: RealOptions) -> list[dict] | None:
    """Run this process's rank of a torchrun job; rank 0 gets every rank's result, the others None."""
    check_real_timeout(opts.timeout)
    check_backend(opts.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), opts.device)
    return run_rank(target, opts, gather=True)

"""Start real ranks: N local processes that meet through a store served here on 127.0.0.1 (nothing
listens beyond loopback), or join a run that torchrun already started. Each process runs the program on a `TorchComm` and hands back its
own record of every call; the caller merges and checks them.

Programs travel to the workers as a picklable callable or as (file path, function name), so a program
loaded from a file (a lesson) need not be importable.
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import importlib.util
import json
import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..limits import check_processes, check_timeout
from ..errors import Deadlock, ParasimError, RankFailed, RealRunFailed, UsageError
from .rank_errors import failure

Target = Callable[[Any], Any] | tuple[str, str]
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class RealOptions:
    backend: str = "gloo"
    seed: int = 0
    keep_values: int = 0
    algo: str = "direct"
    check: bool = True  # the signature exchange before each collective
    timeout: float = 30.0  # seconds a rank may wait in one collective before the run is stopped
    error_dir: str | None = None  # where each failing rank writes its error (set by `launch`)


Job = tuple[Target, RealOptions]  # a program and the options it runs with (seed, keep_values, ...)


def under_torchrun() -> bool:
    """True in a process that torchrun (or another elastic agent) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_backend(backend: str, nproc_per_node: int) -> None:
    """UsageError (exit 2) when the backend cannot run here: no torch, no GPU, too few GPUs."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UsageError("real ranks need torch: pip install 'parasim[torch]'") from None
    if backend == "gloo" and not dist.is_gloo_available():
        raise UsageError("this torch build has no gloo backend")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise UsageError("--backend nccl needs CUDA GPUs and none is visible here; use --backend gloo on CPU")
        if not dist.is_nccl_available():
            raise UsageError("this torch build has no NCCL backend; use --backend gloo")
        if torch.cuda.device_count() < nproc_per_node:
            raise UsageError(f"--backend nccl needs one GPU per rank: {nproc_per_node} ranks on this node, "
                             f"{torch.cuda.device_count()} GPUs visible")


def _load(target: Target) -> Callable[[Any], Any]:
    if callable(target):
        return target
    path, name = target
    spec = importlib.util.spec_from_file_location(f"parasim_program_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)


def _to_host(v: Any) -> Any:
    """Return values as numpy (picklable, comparable with a virtual run)."""
    import torch
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_host(x) for k, x in v.items()}
    return v


def run_rank(target: Target, opts: RealOptions, gather: bool = False) -> Any:
    """The body of one real rank. torch.distributed's usual environment must be set (RANK, WORLD_SIZE, ...).

    Returns this rank's result; with `gather`, rank 0 returns every rank's (in rank order), the others None."""
    out = run_jobs([(target, opts)], gather)
    return out if out is None else out[0]


def run_jobs(jobs: list[Job], gather: bool = False, store: Any = None,
             on_call: Callable[[], None] | None = None) -> list[Any] | None:
    """Several programs one after another on this rank, in one process group (one start-up for all).

    Returns this rank's result per job; with `gather`, rank 0 returns per job every rank's result (in rank
    order), the others None. Backend and timeout are the first job's. Without `store`, the process group
    is found through torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    import torch
    import torch.distributed as dist

    opts = jobs[0][1]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if opts.backend == "nccl":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=opts.timeout)
    if store is None:
        dist.init_process_group(opts.backend, timeout=timeout)
    else:
        dist.init_process_group(opts.backend, store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    if on_call is not None:
        on_call()  # joined: from here on the watchdog expects calls
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [_run_program(target, o, rank, world, device, on_call) for target, o in jobs]
    out: list[Any] | None = mine
    if gather:
        everyone = [None] * world if rank == 0 else None
        dist.gather_object(mine, everyone, dst=0)
        out = None if everyone is None else [[everyone[r][j] for r in range(world)] for j in range(len(jobs))]
    dist.destroy_process_group()
    return out


def _run_program(target: Target, opts: RealOptions, rank: int, world: int, device: Any,
                 on_call: Callable[[], None] | None = None) -> dict:
    """One program on this rank, with a comm and context of its own; its result and call records."""
    import array_api_compat.torch as xp
    import torch
    import torch.distributed as dist

    from ..engine.context import Context
    from .torchdist import TorchComm

    try:
        comm = TorchComm(rank, world, device, keep_values=opts.keep_values, algo=opts.algo, check=opts.check,
                         timeout=datetime.timedelta(seconds=opts.timeout), on_call=on_call)
        ctx = Context(rank, world, comm, xp, opts.seed, comm, lambda a: torch.from_numpy(a).to(device))
        program = _load(target)
        dist.barrier()
        comm.t_start = time.perf_counter()
        value = program(ctx)
        comm.finish()
    except Exception as exc:
        # Report before anything closes a connection: the other ranks' failures are only echoes of this one.
        err = exc if isinstance(exc, ParasimError) else RankFailed(
            f"rank {rank} raised {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), rank)
        _report(opts, rank, err)
        if err is exc:
            raise
        raise err from exc
    return {"rank": rank, "world": world, "value": _to_host(value), "records": comm.records,
            "groups": [[g.index, g.name, list(g.ranks)] for g in comm.groups]}


def _report(opts: RealOptions, rank: int, err: BaseException) -> None:
    """Leave this rank's error for the launcher, with what it needs to raise the same error again."""
    if opts.error_dir:
        data = {"rank": rank, "time": time.time(), "kind": type(err).__name__, "message": str(err)}
        data.update({a: getattr(err, a) for a in ("calls", "ranks", "waiting") if hasattr(err, a)})
        with contextlib.suppress(OSError, TypeError), open(os.path.join(opts.error_dir, f"rank{rank}.json"), "w") as f:
            json.dump(data, f)


def _worker(jobs: list[Job], rank: int, world: int, port: int, folder: str, beats: Any = None,
            env: dict[str, str] | None = None) -> None:
    """The body of one local process: join the run's store, run every job, leave the results (or the
    error) in `folder` and exit quietly; the launcher reports."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle: it ends the workers
    if env is not None:  # the launcher's environment now, not the fork server's when it started
        os.environ.clear()
        os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import pickle

        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)  # one thread per rank: N processes share this machine's cores
        store = dist.TCPStore("127.0.0.1", port, world + 1, False,
                              timeout=datetime.timedelta(seconds=jobs[0][1].timeout))

        def beat() -> None:
            beats[rank] = time.monotonic()  # shared memory: no message, no lock, a few ns per call

        out = run_jobs(jobs, store=store, on_call=None if beats is None else beat)
        try:
            data = pickle.dumps(out)
        except Exception as exc:
            err = RealRunFailed(f"rank {rank}: its results cannot be sent back to the launcher "
                                f"({type(exc).__name__}: {exc}); return numbers, arrays or tensors", rank)
            _report(jobs[0][1], rank, err)
            os._exit(1)
        with open(os.path.join(folder, f"result{rank}.pkl"), "wb") as f:
            f.write(data)
    except BaseException as exc:  # reported in the folder (by _run_program, or here), not on stderr
        if not os.path.exists(os.path.join(folder, f"rank{rank}.json")):
            _report(jobs[0][1], rank, RankFailed(
                f"rank {rank} raised {type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)), rank))
        os._exit(1)
    os._exit(0)  # skip interpreter shutdown: a gloo thread must not hold the process once results are written


def _loopback_store(world: int, timeout: float) -> tuple[Any, int]:
    """The run's key-value store (where ranks meet), served by this process on 127.0.0.1 only. torch's
    TCPStore binds every interface unless handed a socket that is already listening."""
    import torch.distributed as dist
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(max(128, world))
    port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world + 1, True, master_listen_fd=sock.fileno(),
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout))
    sock.detach()  # the store owns the descriptor now and closes it
    return store, port


def launch(target: Target, nproc: int, opts: RealOptions) -> list[dict]:
    """Run `target` on `nproc` local processes; return each rank's result, in rank order."""
    return launch_many([(target, opts)], nproc)[0]


def launch_many(jobs: list[Job], nproc: int) -> list[list[dict]]:
    """Run several programs one after another on the same `nproc` local processes, paying the start-up
    (processes, torch import, rendezvous) once; return per job each rank's result, in rank order.
    Backend and timeout are the first job's (a job with another backend is refused).

    Every socket stays on 127.0.0.1: the store is served here on loopback, gloo is kept to the loopback
    interface. A rank that fails is named with its own error; one that dies without raising (an exit
    code, a signal) is named with that."""
    import pickle

    opts = jobs[0][1]
    if any(o.backend != opts.backend for _, o in jobs):
        raise UsageError("every program of one launch runs on the same backend")
    check_timeout(opts.timeout)
    check_processes(nproc)
    check_backend(opts.backend, nproc)
    if opts.backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep every byte on the loopback interface
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn = _starter()
    store, port = _loopback_store(nproc, opts.timeout)
    beats = spawn.RawArray("d", nproc)  # when each rank last finished a call (monotonic clock; 0: not joined)
    _sweep_folders()
    with tempfile.TemporaryDirectory(prefix=f"parasim-{os.getpid()}-") as folder:
        procs = [spawn.Process(target=_worker, name=f"parasim-rank{r}", daemon=True,
                               args=([(t, replace(o, error_dir=folder)) for t, o in jobs], r, nproc,
                                     port, folder, beats, dict(os.environ))) for r in range(nproc)]
        try:
            for p in procs:
                try:
                    p.start()
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    raise UsageError(f"the program cannot be sent to the worker processes ({exc}); real ranks "
                                     "need a function defined at a module's top level") from None
            # twice the timeout: a rank waiting in a collective is ended by its backend's own time-out first,
            # with the better message (which call, which group)
            died = _wait_all(procs, folder, beats, 2 * opts.timeout)
        finally:
            _end(procs)
            del store
        if died == "stalled":
            raise Deadlock(f"no rank finished a call for {2 * opts.timeout:g} s (twice the run's timeout): every "
                           "rank is busy outside collectives, or waits where no backend times out; the ranks were "
                           "stopped")
        if died is not None or any(p.exitcode != 0 for p in procs):
            raise failure(procs, folder, died)
        out = []
        for r in range(nproc):
            with open(os.path.join(folder, f"result{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return [[out[r][j] for r in range(nproc)] for j in range(len(jobs))]


def _starter() -> Any:
    """How worker processes start: forked from a server that imported torch once (torch's import is most
    of a rank's start-up), so that the ranks of a launch, and every later launch of this process, skip it.
    The server is started fresh (no threads, no CUDA), so forking it is safe; where the platform has no
    fork, spawn."""
    import multiprocessing
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "torch.distributed", "parasim.comm.torchdist", "parasim.engine"])
    return ctx


def _sweep_folders() -> None:
    """Remove the folders of earlier launches whose process is gone (killed before it could clean up):
    each is named parasim-PID-..., so only a dead owner's folder is touched."""
    import shutil
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "parasim-*-*")):
        pid = os.path.basename(path).split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)


def _wait_all(procs: list, folder: str, beats: Any, timeout: float, grace: float = 2.0) -> Any:
    """Wait until every process has exited. When one fails, give the others `grace` seconds to report
    their own errors (most are echoes of it), then stop waiting. Returns (rank, exit code) of the first
    process seen to die without reporting an error, "stalled" when every rank has joined and none has
    finished a call for `timeout` seconds (the watchdog: ranks stuck outside any collective), or None."""
    import multiprocessing.connection
    alive = {p.sentinel: r for r, p in enumerate(procs)}
    died, deadline = None, None
    while alive:
        left = max(0.0, deadline - time.monotonic()) if deadline is not None else min(1.0, timeout)
        ready = multiprocessing.connection.wait(list(alive), timeout=left)
        if not ready and deadline is not None:
            break  # the grace after a failure is over
        if not ready:
            last = [beats[r] for r in alive.values()]
            if all(last) and time.monotonic() - max(last) > timeout:
                return "stalled"
            continue
        for sentinel in ready:
            r = alive.pop(sentinel)
            procs[r].join()
            code = procs[r].exitcode
            if code != 0 and deadline is None:
                deadline = time.monotonic() + grace
            if code != 0 and died is None and not os.path.exists(os.path.join(folder, f"rank{r}.json")):
                died = (r, code)
    return died


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
    check_timeout(opts.timeout)
    check_backend(opts.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return run_rank(target, opts, gather=True)

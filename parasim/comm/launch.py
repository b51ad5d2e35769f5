"""Start real ranks: N local processes through torch's elastic launcher (what torchrun runs), or join a
run that torchrun already started. Each process runs the program on a `TorchComm` and hands back its
own record of every call; the caller merges and checks them.

Programs travel to the workers as a picklable callable or as (file path, function name), so a program
loaded from a file (a lesson) need not be importable.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import logging
import os
import socket
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..errors import ParasimError, UsageError

Target = Callable[[Any], Any] | tuple[str, str]
BACKENDS = ("gloo", "nccl")


class RealRunFailed(ParasimError):
    """A real run ended with a failed rank; the message is that rank's error."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


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


def run_jobs(jobs: list[Job], gather: bool = False) -> list[Any] | None:
    """Several programs one after another on this rank, in one process group (one start-up for all).

    Returns this rank's result per job; with `gather`, rank 0 returns per job every rank's result (in rank
    order), the others None. Backend and timeout are the first job's."""
    import torch
    import torch.distributed as dist

    opts = jobs[0][1]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if opts.backend == "nccl":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(opts.backend, timeout=datetime.timedelta(seconds=opts.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [_run_program(target, o, rank, world, device) for target, o in jobs]
    out: list[Any] | None = mine
    if gather:
        everyone = [None] * world if rank == 0 else None
        dist.gather_object(mine, everyone, dst=0)
        out = None if everyone is None else [[everyone[r][j] for r in range(world)] for j in range(len(jobs))]
    dist.destroy_process_group()
    return out


def _run_program(target: Target, opts: RealOptions, rank: int, world: int, device: Any) -> dict:
    """One program on this rank, with a comm and context of its own; its result and call records."""
    import array_api_compat.torch as xp
    import torch
    import torch.distributed as dist

    from ..context import Context
    from .torchdist import TorchComm

    try:
        comm = TorchComm(rank, world, device, keep_values=opts.keep_values, algo=opts.algo, check=opts.check,
                         timeout=datetime.timedelta(seconds=opts.timeout))
        ctx = Context(rank, world, comm, xp, opts.seed, comm, lambda a: torch.from_numpy(a).to(device))
        program = _load(target)
        dist.barrier()
        comm.t_start = time.perf_counter()
        value = program(ctx)
        comm.finish()
    except Exception as exc:
        # Report before anything closes a connection: the other ranks' failures are only echoes of this one.
        err = exc if isinstance(exc, ParasimError) else RealRunFailed(
            f"rank {rank} raised {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), rank)
        _report(opts, rank, err)
        if err is exc:
            raise
        raise err from exc
    return {"rank": rank, "world": world, "value": _to_host(value), "records": comm.records,
            "groups": [[g.index, g.name, list(g.ranks)] for g in comm.groups]}


def _report(opts: RealOptions, rank: int, err: BaseException) -> None:
    if opts.error_dir:
        with contextlib.suppress(OSError), open(os.path.join(opts.error_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "time": time.time(), "kind": type(err).__name__, "message": str(err)}, f)


def _worker(jobs: list[Job]) -> list[dict]:
    # One thread per rank: N processes share this machine's cores.
    import torch
    torch.set_num_threads(1)
    return run_jobs(jobs)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _quiet_launcher():
    """The elastic agent logs every start and failure; parasim reports failures itself."""
    names = ["torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"]
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def launch(target: Target, nproc: int, opts: RealOptions) -> list[dict]:
    """Run `target` on `nproc` local processes; return each rank's result, in rank order."""
    return launch_many([(target, opts)], nproc)[0]


def launch_many(jobs: list[Job], nproc: int) -> list[list[dict]]:
    """Run several programs one after another on the same `nproc` local processes, paying the start-up
    (processes, torch import, rendezvous) once; return per job each rank's result, in rank order.
    Backend and timeout are the first job's (a job with another backend is refused)."""
    opts = jobs[0][1]
    if any(o.backend != opts.backend for _, o in jobs):
        raise UsageError("every program of one launch runs on the same backend")
    check_backend(opts.backend, nproc)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if opts.backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep every byte on the loopback interface
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"parasim-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn", local_addr="127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="parasim-") as errors:
        try:
            with _quiet_launcher():
                out = elastic_launch(config, _worker)([(t, replace(o, error_dir=errors)) for t, o in jobs])
        except ChildFailedError as exc:
            _reap()
            root = _root_error(errors)
            if root is not None:
                raise RealRunFailed(root["message"] if root["kind"] == "RealRunFailed"
                                    else f"{root['kind']}: {root['message']}", root["rank"]) from None
            rank, failure = exc.get_first_failure()
            raise RealRunFailed(_failure_message(rank, failure), rank) from None
        _reap()
    return [[out[r][j] for r in sorted(out)] for j in range(len(jobs))]


def _reap(grace: float = 3.0) -> None:
    """Workers hand back their results before they exit; one that then hangs in its own shutdown (a gloo
    thread) must not keep parasim waiting, nor be left behind."""
    import multiprocessing
    deadline = time.monotonic() + grace
    for child in multiprocessing.active_children():
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(1.0)


_ECHOES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")


def _root_error(folder: str) -> dict | None:
    """The rank that failed for its own reason, first. When one rank fails the others fail too (reset
    connections); those echoes come after it, and name no program line of their own."""
    errors = []
    for name in os.listdir(folder):
        with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name)) as f:
            errors.append(json.load(f))
    if not errors:
        return None
    return min(errors, key=lambda e: (any(x in e["message"] for x in _ECHOES), e["time"], e["rank"]))


def _failure_message(rank: int, failure: Any) -> str:
    data = failure.error_file_data or {}
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message")
    if not msg:
        return f"rank {rank} died (exit code {failure.exitcode}) before reporting an error"
    # torchelastic writes "ExcType: text"; our own errors already name the rank and call site.
    kind, _, text = str(msg).partition(": ")
    if kind.endswith(("RealRunFailed", "CollectiveMismatch", "Deadlock", "CollectiveError")):
        return f"{kind.rsplit('.', 1)[-1]}: {text}"
    return f"rank {rank} raised {msg}"


def join_torchrun(target: Target, opts: RealOptions) -> list[dict] | None:
    """Run this process's rank of a torchrun job; rank 0 gets every rank's result, the others None."""
    check_backend(opts.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return run_rank(target, opts, gather=True)

"""A job torchrun started: its variables checked, and its ranks' store, met on loopback when every rank is
on this machine (engine/launch.py's join_torchrun runs this process's rank of it)."""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from typing import Any

from ..errors import RealRunFailed, UsageError
from .loopback import listening, loopback_address, loopback_interface


# What torchrun sets in every process it starts. The first five say "this process is a rank of a job";
# MASTER_ADDR and MASTER_PORT alone say nothing (a local launch sets its own), so only they may be left over.
TORCHRUN_RANK_VARS = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
TORCHRUN_VARS = TORCHRUN_RANK_VARS + ("MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True in a process that torchrun (or another elastic agent) started. Only some of its variables set
    (left over in a shell, or set by hand) is a UsageError naming them: parasim could neither join a job
    nor know that it should start its own ranks."""
    present = [v for v in TORCHRUN_VARS if os.environ.get(v)]
    if not any(v in present for v in TORCHRUN_RANK_VARS):
        return False
    missing = [v for v in TORCHRUN_VARS if v not in present]
    if missing:
        stray = [v for v in present if v in TORCHRUN_RANK_VARS]
        raise UsageError(
            f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} set, as in a process torchrun "
            f"started, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: unset "
            f"{', '.join(stray)} to start the ranks here, or start parasim with torchrun"
        )
    n = {v: _whole(v) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")}
    if not (
        0 <= n["RANK"] < n["WORLD_SIZE"]
        and 0 <= n["LOCAL_RANK"] < n["LOCAL_WORLD_SIZE"] <= n["WORLD_SIZE"]
        and 0 < n["MASTER_PORT"] < 2**16
    ):
        shown = ", ".join(f"{v}={os.environ[v]}" for v in n)
        raise UsageError(
            f"torchrun's variables do not fit together ({shown}): a rank is from 0 to WORLD_SIZE - 1, "
            "a local rank from 0 to LOCAL_WORLD_SIZE - 1, a port from 1 to 65535"
        )
    return True


def _whole(name: str) -> int:
    text = os.environ[name]
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise UsageError(f"{name} must be a whole number, got {text[:40]!r}")
    return int(text)


def job_store(timeout: float) -> Any:
    """The store of a job torchrun started, at MASTER_ADDR:MASTER_PORT, where its ranks meet. torchrun's
    agent serves it (TORCHELASTIC_USE_AGENT_STORE=True) or else rank 0 does, which torch would do on every
    interface: when MASTER_ADDR is a loopback address (every rank on this machine), it listens on that
    address alone, and gloo keeps to the loopback interface."""
    import torch.distributed as dist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    limit = datetime.timedelta(seconds=timeout)
    local = loopback_address(host)
    if local is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    try:
        with _stderr_held():
            if rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                store = dist.TCPStore(host, port, world, False, timeout=limit)
            elif local is not None:
                sock = listening(local, port, world)
                try:
                    store = dist.TCPStore(local, port, world, True, master_listen_fd=sock.fileno(), timeout=limit)
                finally:
                    sock.detach()  # the store owns the descriptor (a failed one leaves it to this process's exit)
            else:
                store = dist.TCPStore(host, port, world, True, timeout=limit, multi_tenant=True)
    except (dist.DistError, OSError) as exc:  # a store nobody serves, ranks that never come: one line
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RealRunFailed(
            f"rank {rank} could not meet the job's other ranks at {host}:{port} (MASTER_ADDR, "
            f"MASTER_PORT) within {timeout:g} s: {what}",
            rank,
        ) from None
    return dist.PrefixStore("default_pg", store)  # the keys env:// would use, apart from the agent's own


@contextlib.contextmanager
def _stderr_held() -> Any:
    """Hold what is written to file descriptor 2 meanwhile (torch's C++ side logs every retry of a store
    connection there, with its stack frames) and pass it on only if the block succeeds: a failure is then
    told in one line by the caller."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if ok:
                held.seek(0)
                os.write(2, held.read())

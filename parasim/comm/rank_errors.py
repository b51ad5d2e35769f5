"""Which rank broke a local launch, and its error rebuilt with the type and text a virtual run gives.

Each rank that fails leaves its error in the launch's folder as JSON; when one rank fails the others
fail too (reset connections), so the one that failed for its own reason is found first."""
from __future__ import annotations

import contextlib
import json
import os
import signal

from ..errors import CollectiveError, CollectiveMismatch, Deadlock, ParasimError, RankFailed, RealRunFailed, UsageError


def failure(procs: list, folder: str, died: tuple[int, int] | None) -> ParasimError:
    """The error that names the cause: a rank that died without raising comes first (its peers' errors are
    echoes), then the rank whose own error came first."""
    if died is not None:
        rank, code = died
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return RealRunFailed(f"rank {rank} {how} without raising an error; the other ranks were stopped", rank)
    root = _root_error(folder)
    if root is not None:
        return _rebuilt(root)
    rank = next(r for r, p in enumerate(procs) if p.exitcode != 0)
    return RealRunFailed(f"rank {rank} ended with exit code {procs[rank].exitcode} before reporting an error", rank)


def _rebuilt(e: dict) -> ParasimError:
    """The error a rank reported, as the same type with the same text as on virtual ranks (so `except
    parasim.CollectiveMismatch` works on both); `rank` says which rank reported it."""
    kind, message, rank = e["kind"], e["message"], e["rank"]
    if kind == "CollectiveMismatch":
        err: ParasimError = CollectiveMismatch(message, e.get("calls"), e.get("ranks"))
    elif kind == "Deadlock":
        err = Deadlock(message, {int(r): w for r, w in (e.get("waiting") or {}).items()})
    elif kind in ("RankFailed", "RealRunFailed"):
        err = (RankFailed if kind == "RankFailed" else RealRunFailed)(message, rank)
    elif kind in ("CollectiveError", "UsageError"):
        err = (CollectiveError if kind == "CollectiveError" else UsageError)(message)
    else:  # another parasim error (a LayoutError, ...): its name leads, as the CLI prints it
        err = RankFailed(f"rank {rank} raised {kind}: {message}", rank)
    err.rank = rank
    return err


# what a rank reports because another failed: a reset connection, or waiting at the end of the run for a
# rank that is itself stuck (that rank's own time-out names the call)
_ECHOES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted",
           "the end-of-run check (this rank had finished)")


def _root_error(folder: str) -> dict | None:
    """The rank that failed for its own reason, first. When one rank fails the others fail too (reset
    connections); those echoes come after it, and name no program line of their own."""
    errors = []
    for name in os.listdir(folder):
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name)) as f:
                errors.append(json.load(f))
    if not errors:
        return None
    return min(errors, key=lambda e: (any(x in e["message"] for x in _ECHOES), e["time"], e["rank"]))

"""Which rank broke a local launch, and its error rebuilt with the type and text a virtual run gives.

Each rank that fails leaves its error in the launch's folder as JSON; when one rank fails the others
fail too (reset connections), so the one that failed for its own reason is found first.

A rank stuck outside every collective (a loop, a sleep) raises nothing: the ranks waiting for it time out
and would take the blame. So each worker says, through shared memory, whether it is in a call
(`Watch`), and answers a signal from the launcher with the line its program is on (`answer_where`); the
launcher asks the ranks outside any call (`ask_where`) before it stops them, and the error names them.
A rank busy in C code cannot answer (Python runs a signal handler only between bytecodes): it is named
without a line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from types import FrameType
from typing import Any, Callable

from ..errors import (
    CollectiveError,
    CollectiveMismatch,
    Deadlock,
    ParasimError,
    RankFailed,
    RealRunFailed,
    TimedOut,
    UsageError,
)
from .texts import by_text, rank_list

# What a worker is doing, as `Watch` writes it to shared memory: not joined yet, running the program's own
# code (its file's top level included), or in a call (a collective, or parasim's own start and end steps).
STARTING, IN_PROGRAM, IN_CALL = 0, 1, 2
ASK = signal.SIGUSR1  # the launcher's question "which line are you on?"
# The exit code of a process that multiprocessing started by importing the launching script again, and
# that found itself calling parasim.run there (the script has no `if __name__ == "__main__":` guard).
REIMPORTED = 86
NO_LINE = "in code that does not return to Python (C code, or a call that blocks signals), so its line is unknown"


def guard_hint() -> str:
    """What to change when the script that launched real ranks launches again as each rank imports it."""
    import sys
    from .sites import short_path

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    script = f"the script {short_path(path)}" if path else "the script"
    return (
        f"each real rank starts by importing {script}, and it calls parasim.run again as it is imported: put "
        'that call under `if __name__ == "__main__":`'
    )


class Watch:
    """One worker's side of the launcher's watch, in shared memory (no message, no lock, a few ns a call):
    when it last finished a call (the watchdog's clock) and whether it is in one now."""

    def __init__(self, beats: Any, states: Any, rank: int):
        self.beats, self.states, self.rank = beats, states, rank

    def enter(self) -> None:
        self.states[self.rank] = IN_CALL

    def leave(self) -> None:
        self.beats[self.rank] = time.monotonic()
        self.states[self.rank] = IN_PROGRAM


def answer_where(folder: str, rank: int) -> Callable[[int, FrameType | None], None]:
    """The signal handler a worker installs for ASK: it leaves in `folder` the line its program is on (the
    innermost frame in the program's own code), written whole (a temporary file, then renamed)."""
    from .sites import site_name
    from .watchdog import frame_text, where

    def handler(signum: int, frame: FrameType | None) -> None:
        f = where(frame)
        data = {"site": None if f is None else site_name((f.f_code.co_filename, f.f_lineno)), "text": frame_text(frame)}
        path = os.path.join(folder, f"where{rank}.txt")
        with contextlib.suppress(OSError):  # the launch may be over and its folder gone
            with open(path + ".tmp", "w") as out:
                json.dump(data, out)
            os.replace(path + ".tmp", path)

    return handler


def ask_where(procs: list, states: Any, folder: str, wait: float = 1.0) -> dict[int, dict | None]:
    """Where each live rank outside any call is: {rank: {"site", "text"}, or None where it did not answer
    within `wait` seconds (busy in C code)}. Ranks in a call are not asked: they wait on the others."""
    asked = [r for r, p in enumerate(procs) if p.is_alive() and states[r] == IN_PROGRAM]
    for r in asked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[r].pid, ASK)
    answers: dict[int, dict | None] = {}
    deadline = time.monotonic() + wait
    while asked and len(answers) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.02)
        for r in asked:
            if r not in answers:
                with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, f"where{r}.txt")) as f:
                    answers[r] = json.load(f)
    return {r: answers.get(r) for r in asked}


def failure(
    procs: list,
    folder: str,
    died: list[tuple[int, int]],
    where: dict[int, dict | None] | None = None,
    timeout: float = 30.0,
    stalled: bool = False,
    joined: set[int] | None = None,
) -> ParasimError:
    """The error that names the cause: a rank that died without raising comes first (its peers' errors are
    echoes), then ranks stuck outside any collective while others timed out waiting for them (`where`,
    from `ask_where`), then the rank whose own error came first. `died`: (rank, exit code) of the ranks that
    ended without reporting, in the order seen; `joined`: the ranks that reached the run's store."""
    where = where or {}
    if any(code == REIMPORTED and r not in (joined or set()) for r, code in died):
        return UsageError(guard_hint())
    if died:
        return _died(died, len(procs))
    if stalled:
        return _stalled(where, timeout)
    reports = _reports(folder)
    root = _root_error(reports)
    if where and root is not None and root["kind"] == "Deadlock":
        return _stuck(where, timeout, reports)
    if root is not None:
        return _rebuilt(root)
    rank = next(r for r, p in enumerate(procs) if p.exitcode != 0)
    return RealRunFailed(f"rank {rank} ended with exit code {procs[rank].exitcode} before reporting an error", rank)


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name} without raising an error"
    if code == 0:  # os._exit(0), or an exit of the process by other means: the program never returned
        return "exited with code 0 before its program returned"
    return f"exited with code {code} without raising an error"


def _died(died: list[tuple[int, int]], world: int) -> RealRunFailed:
    ranks: dict[str, list[int]] = {}
    for r, code in died:
        ranks.setdefault(_how(code), []).append(r)
    parts = [
        f"rank {rs[0]} {how}" if len(rs) == 1 else f"ranks {rank_list(sorted(rs))[1:-1]} each {how}"
        for how, rs in ranks.items()
    ]
    tail = "; the other ranks were stopped" if len(died) < world else ""
    return RealRunFailed("; ".join(parts) + tail, died[0][0])


def _place(answer: dict | None) -> str:
    return NO_LINE if answer is None else f"at {answer['text']}"


def _stuck(where: dict[int, dict | None], timeout: float, reports: list[dict]) -> TimedOut:
    """Ranks outside any collective, while the others timed out waiting for them: as a virtual run says it."""
    waiting: dict[int, str] = {}
    for e in reports:
        waiting.update({int(r): w for r, w in (e.get("waiting") or {}).items() if int(r) not in where})
    stuck = sorted(where)
    if len(stuck) == 1:
        head = f"rank {stuck[0]} ran for {timeout:g} s"
        places = f": stopped {_place(where[stuck[0]])}"
    else:
        head = f"ranks {rank_list(stuck)[1:-1]} ran for {timeout:g} s"
        places = "; where each was stopped:\n" + "\n".join(by_text({r: _place(where[r]) for r in stuck}))
    left = "\n".join(by_text(waiting)) or "  none"
    first = where[stuck[0]]
    return TimedOut(
        f"{head} without reaching a collective or returning (the time limit, --timeout){places}\n"
        f"ranks left waiting:\n{left}",
        stuck[0],
        None if first is None else first["site"],
        waiting,
    )


def _stalled(where: dict[int, dict | None], timeout: float) -> Deadlock:
    head = f"no rank finished a call for {2 * timeout:g} s (twice the run's timeout)"
    if not where:
        return Deadlock(
            f"{head}: every rank is busy outside collectives, or waits where no backend times out; the "
            "ranks were stopped"
        )
    return Deadlock(
        f"{head}; the ranks outside any collective were stopped:\n"
        + "\n".join(by_text({r: _place(a) for r, a in where.items()})),
        {r: f"runs outside any collective, {_place(a)}" for r, a in where.items()},
    )


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
    err.rank = rank  # every rebuilt error says which rank reported it, whatever its type
    return err


# what a rank reports because another failed: a reset connection, or waiting at the end of the run for a
# rank that is itself stuck (that rank's own time-out names the call)
_ECHOES = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "the end-of-run check (this rank had finished)",
)


def _reports(folder: str) -> list[dict]:
    """Every error a rank left in the folder."""
    errors = []
    for name in os.listdir(folder):
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name)) as f:
                errors.append(json.load(f))
    return errors


def _root_error(errors: list[dict]) -> dict | None:
    """The rank that failed for its own reason, first. When one rank fails the others fail too (reset
    connections); those echoes come after it, and name no program line of their own."""
    if not errors:
        return None
    return min(errors, key=lambda e: (any(x in e["message"] for x in _ECHOES), e["time"], e["rank"]))

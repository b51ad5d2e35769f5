"""The sizes parasim accepts, checked before any work starts: past them a run would exhaust memory or
time on a workstation long before it taught anything. Each refusal is one line naming the limit and why."""
from __future__ import annotations

import os
from typing import Any, Callable

from .errors import UsageError

VIRTUAL_WORLD = 16_384  # virtual ranks hold real arrays: one greenlet, context and comm each (~15 KB)
LOCAL_PROCESSES = 128  # real ranks on one machine: one process with its own torch each (~300 MB)
LAYOUT_WORLD = 65_536  # GPUs in a layout: its groups are built and listed rank by rank
SCHEDULE_CELLS = 100_000  # ranks x micro-batches x chunks of a pipeline schedule: its slot table
FILE_BYTES = 1 << 30  # a trace or config file read whole into memory
KEPT_VALUES = 4_000_000  # numbers a virtual run keeps in its trace (keep_values), over all its calls:
# as Python lists about 32 bytes each, 128 MB; past it a call's values are dropped and counted
JSON_DEPTH = 100  # levels of [ and { in a file read as JSON: parasim's own nest about 12 deep; Python's reader
# and printer recurse once a level and stop near 1,000
MAX_SIZE = 10**12  # any one size (hidden, tokens, GPUs, ...): far beyond every model, small enough for float64
PLOT_FORMATS = (".png", ".svg", ".pdf")


def size_arg(parse: Callable[[str], int], text: str) -> int:
    """A command-line size: `parse(text)`, from 1 to MAX_SIZE. Text longer than any such number is refused
    before parsing (Python would spend seconds on a 5,000-digit one)."""
    import argparse
    try:
        n = parse(text) if len(text) <= 20 else 0
    except (ValueError, OverflowError):  # OverflowError: 'infK' is an infinity
        n = 0
    if not 1 <= n <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {MAX_SIZE:.0e}, got {text[:40]!r}")
    return n


def at_most(what: str, value: Any, limit: int, why: str) -> None:
    """UsageError unless `value` <= `limit` (both already integers)."""
    if value > limit:
        raise UsageError(f"{what}: {value:,} is more than the limit of {limit:,} ({why})")


TIMEOUT = 30.0  # seconds: the default time limit of a rank (real: in one call; virtual: between two calls)
MAX_TIMEOUT = 1e6


def check_timeout(timeout: Any) -> None:
    """UsageError unless `timeout` is a finite number of seconds above zero (checked before any start)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < MAX_TIMEOUT:
        raise UsageError(f"timeout must be a number of seconds above 0 and below 1e6, got {timeout!r}")


REAL_MIN_TIMEOUT = 1.0  # seconds: real ranks are processes that must start, meet and answer each other in it


def check_real_timeout(timeout: Any) -> None:
    """check_timeout, and at least REAL_MIN_TIMEOUT: on real ranks the limit also bounds each process's
    start and its meeting with the others, which a shorter limit cuts off before the program runs."""
    check_timeout(timeout)
    if timeout < REAL_MIN_TIMEOUT:
        raise UsageError(f"timeout must be at least {REAL_MIN_TIMEOUT:g} s on real ranks, got {timeout!r}: it also "
                         "bounds how long the processes take to start and meet, which takes longer than that")


def check_processes(nproc: int) -> None:
    at_most("real ranks (processes)", nproc, LOCAL_PROCESSES,
            "each real rank is a process with its own torch, all on this machine")


def read_bounded(path: str, what: str = "file", limit: int = FILE_BYTES) -> bytes:
    """A file's bytes, refusing what is not a regular file (a device, a pipe, a folder) or is too large."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    import stat
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path} is not a regular file")
    at_most(f"{what} {path}: bytes", st.st_size, limit, "parasim reads it whole into memory")
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None


def check_plot_path(path: str) -> None:
    """A picture is written to a file named with a format matplotlib writes, not into a folder."""
    if not path or os.path.isdir(path):
        raise UsageError(f"--plot needs a file name (FILE.png), got {path!r}")
    if not path.lower().endswith(PLOT_FORMATS):
        raise UsageError(f"--plot {path}: name a {', '.join(PLOT_FORMATS)} file")

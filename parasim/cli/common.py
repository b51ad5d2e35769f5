"""What every command shares: a parser whose errors are one line, and flag helpers."""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from ..limits import size_arg


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (never a traceback or a usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def positive(text: str) -> int:
    return size_arg(int, text)


def seconds(text: str) -> float:
    """A time limit in seconds: a finite number above 0 (checked before anything starts)."""
    from ..limits import check_timeout
    try:
        value = float(text) if len(text) <= 40 else float("nan")
    except ValueError:
        value = float("nan")
    try:
        check_timeout(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_timeout(p: argparse.ArgumentParser) -> None:
    """`--timeout S` on a command that runs programs on virtual ranks."""
    from ..limits import TIMEOUT
    p.add_argument("--timeout", type=seconds, default=TIMEOUT, metavar="S",
                   help=f"seconds a rank may run without reaching a collective or returning (default {TIMEOUT:g}); "
                        "past it the run stops, naming the rank and the line it was on")


def gpu_preset(name: str, what: str = "GPU") -> Any:
    """The estimator's GPU preset called `name` (any case), or one line naming the presets."""
    from ..estimate.traffic import gpu_presets
    table = gpu_presets()
    if name.lower() not in table:
        raise UsageError(f"unknown {what} {name!r}; presets: {', '.join(table)}")
    return table[name.lower()]


def write_hta(path: str, trace: Any, times: Any = None) -> None:
    """`--hta DIR`: one Kineto-style trace per rank (DIR/rank<r>.json) for Holistic Trace Analysis."""
    from ..render.chrome import write_hta as written
    if not path:
        raise UsageError("an empty folder name: give a folder to write the HTA traces to")
    try:
        written(trace, path, times)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def write(path: str, text: str) -> None:
    if not path:
        raise UsageError("an empty file name: give a path to write to")
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None

"""The errors parasim raises. Every one derives from ParasimError, so callers can catch them all."""

from __future__ import annotations


class ParasimError(Exception):
    """Base class of every parasim error."""

    # the rank that raised it, where a real run reports one (comm/rank_errors.py); declared only: an error
    # that no rank reported has no such attribute
    rank: int


class UsageError(ParasimError):
    """Bad input from a person: a layout, a size, a lesson name, a file. The CLI prints it in one line."""


class OutputError(ParasimError):
    """Output that could not be written: a full disk, a closed standard output. Files are written whole or
    not at all, so nothing half-written is left behind."""


class LayoutError(UsageError, ValueError):
    """A layout (or its model) breaks a rule; the message names the rule."""


class CollectiveError(ParasimError, ValueError):
    """A collective called with arguments that can never work (wrong dim, rank not in group, ...)."""


class CollectiveMismatch(ParasimError):
    """Members of one group called collectives that do not fit together (op, shape, dtype or group)."""

    def __init__(self, message: str, calls: list[str] | None = None, ranks: list[int] | None = None):
        super().__init__(message)
        self.calls = calls or []
        self.ranks = ranks or []


class Deadlock(ParasimError):
    """Every unfinished rank waits on something no other rank will ever provide."""

    def __init__(self, message: str, waiting: dict[int, str] | None = None):
        super().__init__(message)
        self.waiting = waiting or {}


class RankFailed(ParasimError):
    """A rank's program raised; the run was stopped. The original exception is the __cause__."""

    def __init__(self, message: str, rank: int, waiting: dict[int, str] | None = None):
        super().__init__(message)
        self.rank = rank
        self.waiting = waiting or {}


class TimedOut(RankFailed):
    """A rank ran past the run's time limit without reaching a collective or returning (a loop, a sleep).
    `site`: the line it was on ('file.py:12'), when known."""

    def __init__(self, message: str, rank: int | None, site: str | None = None, waiting: dict[int, str] | None = None):
        super().__init__(message, rank, waiting)
        self.site = site


class RealRunFailed(RankFailed):
    """A real rank died without raising (an exit code, a signal), or its results could not be sent back.
    Errors a rank raised keep their own type on real ranks as on virtual ones (RankFailed for the
    program's own exceptions, CollectiveMismatch, Deadlock, ...)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message, rank)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt is (so every cleanup an interrupt runs runs for it too): the CLI ends
    with `parasim: terminated` and exit code 143."""

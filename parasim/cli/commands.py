"""The commands behind `parasim` (parasim/cli/__init__.py says how each ends): the parser of every command's
flags, and the one place every command's errors become one line and an exit code."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Sequence

from .. import __version__
from ..errors import OutputError, ParasimError, Terminated, UsageError
from ..limits import check_plot_path
from .cheatsheet import add_cheatsheet
from .check import add_check
from .compare import add_compare
from .estimate import add_estimate_commands
from .layout import add_layout
from .lesson import add_lesson, add_view
from .run import add_run
from .schedule import add_schedule
from .serve import add_serve
from .trace import add_trace
from .validate import add_validate
from .common import BROKEN_PIPE, INTERRUPTED, TERMINATED, Parser, Stdout, check_folder, signals_to, silence_stdout


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="parasim", description="LLM training parallelism, taught by running it on virtual ranks.")
    p.add_argument("--version", action="version", version=f"parasim {__version__}")
    from .completion import SHELLS, CompletionAction

    p.add_argument(
        "--completion",
        choices=SHELLS,
        action=CompletionAction,
        help="print a completion script for the shell (commands, flags, choices, lessons) and exit",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # the order of `parasim --help`
    for add in (
        add_lesson,
        add_schedule,
        add_trace,
        add_view,
        add_run,
        add_check,
        add_compare,
        add_layout,
        add_estimate_commands,
        add_cheatsheet,
        add_validate,
        add_serve,
    ):
        add(sub)
    return p


def run_command(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None, exiting: bool = False
) -> int:
    """`parasim ARGS` with `parser` (build_parser()'s, built before any signal is taken over). `exiting`: the
    process ends when this returns, so SIGINT and SIGTERM are ignored from then on, not handed back."""
    stopper = _Stopper()
    with signals_to(stopper, after=signal.SIG_IGN if exiting else None):
        try:
            return _output(argv, parser or build_parser())
        finally:
            # the command has answered (its exit code and line are decided): a signal from here on changes
            # nothing, and the cleanup runs to its end
            stopper.stopping = True
            if "parasim.comm.starter" in sys.modules:  # real ranks were started: nothing of theirs outlives us
                sys.modules["parasim.comm.starter"].stop_starter()


def _output(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    out = Stdout(sys.stdout)
    sys.stdout = out
    try:
        code = _run(argv, parser)
        out.flush()  # output to a pipe or a file is buffered: a full disk or a gone reader shows here
        return code
    except OutputError as exc:
        silence_stdout(out.stream)
        said(f"parasim: {exc}")
        return 1
    except BrokenPipeError:  # `parasim lesson x | head`
        silence_stdout(out.stream)
        return BROKEN_PIPE
    except SystemExit as exc:
        if isinstance(exc.__context__, BrokenPipeError):  # Rich's own answer to a broken pipe: exit 1
            silence_stdout(out.stream)
            return BROKEN_PIPE
        raise
    finally:
        if sys.stdout is out:
            sys.stdout = out.stream


def _run(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    try:
        _check_cwd()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the command that did not know them, and its own help
            where = f"parasim {args.command}" if getattr(args, "command", None) else "parasim"
            raise UsageError(f"{where}: unrecognized arguments: {' '.join(extra)} (see {where} --help)")
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        if getattr(args, "plot", None) is not None:  # before any work: a wrong name would fail at the end
            check_plot_path(args.plot)
        for flag in ("chrome", "plot", *getattr(args, "output_files", ())):
            if getattr(args, flag, None):
                check_folder(getattr(args, flag))
        return args.func(args)
    except UsageError as exc:
        said(f"parasim: error: {exc}" if not str(exc).startswith("parasim") else f"{exc}", one_line=True)
        return 2
    except OutputError:
        raise
    except ParasimError as exc:
        from ..errors import RankFailed  # "rank r raised X: ..." already names the error

        kind = "" if isinstance(exc, RankFailed) else f"{type(exc).__name__}: "
        said(f"parasim: {kind}{exc}")
        return 1
    except Terminated:  # a KeyboardInterrupt too: everything started has been ended on the way here
        said("parasim: terminated")
        return TERMINATED
    except KeyboardInterrupt:  # real ranks are ended by the launcher on the way out
        said("parasim: interrupted")
        return INTERRUPTED


def said(text: str, one_line: bool = False) -> None:
    """A message on stderr. It may quote a file's text or a path (a name holding ESC [ 2 J): that is shown
    escaped, never acted on by the terminal. Bad input is said in `one_line` (a newline in a name is shown
    as \\n); a failed run's message keeps its own lines (the program's traceback, the ranks left waiting)."""
    from ..render.text import printable, printable_lines

    print(printable(text) if one_line else printable_lines(text.split("\n")), file=sys.stderr)


class _Stopper:
    """SIGINT and SIGTERM as exceptions in the main thread, so that every `finally` on the way out runs
    (real ranks killed, files not left half-written): the first signal raises, later ones are ignored
    while that cleanup runs (a second Ctrl-C would otherwise cut it short and leave processes behind)."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.stopping:
            return
        self.stopping = True
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _check_cwd() -> None:
    """A current folder that was deleted under the shell (`cd d && rmdir ../d`) is refused in one line:
    relative names would fail one by one, and call sites are named relative to it."""
    try:
        os.getcwd()
    except OSError:
        raise UsageError(
            "the current folder no longer exists (it was deleted): cd to one that does, then run parasim again"
        ) from None

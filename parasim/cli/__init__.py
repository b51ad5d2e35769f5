"""The `parasim` command: one thin module per command (parse, call the library, call a renderer).

Exit codes, the same for every command:
  0    done (and, for a command that checks, everything agreed)
  1    a failing run (a rank that raised, a mismatch, a divergence, a check that failed), or output that
       could not be written (a full disk, a closed stdout): one line on stderr. Files are written whole
       or not at all (a temporary file renamed over the name), so a failed write leaves nothing behind.
  2    bad input (a flag, a file, a user's program, an output path in a folder that does not exist):
       one line on stderr, before any work where it can be known then
  130  interrupted (Ctrl-C)
  141  stdout's reader went away (`parasim lesson x | head -1`): nothing more is written and nothing is
       said, as other Unix tools end on a broken pipe (128 + SIGPIPE, the code a shell shows for them)
A terminal that cannot show a character gets its ASCII spelling (-> for an arrow, x for a times sign).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .. import __version__
from ..errors import OutputError, ParasimError, UsageError
from ..limits import check_plot_path
from . import check, compare, estimate, layout, lesson, run, schedule, serve, trace, validate
from .common import BROKEN_PIPE, Parser, Stdout, check_folder, silence_stdout


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="parasim", description="LLM training parallelism, taught by running it on virtual ranks.")
    p.add_argument("--version", action="version", version=f"parasim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # the order of `parasim --help`
    for add in (lesson.add_lesson, schedule.add_schedule, trace.add_trace, lesson.add_view, run.add_run,
                check.add_check, compare.add_compare, layout.add_layout, estimate.add_estimate_commands,
                validate.add_validate, serve.add_serve):
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    out = Stdout(sys.stdout)
    sys.stdout = out
    try:
        code = _run(argv)
        out.flush()  # output to a pipe or a file is buffered: a full disk or a gone reader shows here
        return code
    except OutputError as exc:
        silence_stdout(out.stream)
        print(f"parasim: {exc}", file=sys.stderr)
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


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
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
        print(f"parasim: error: {exc}" if not str(exc).startswith("parasim") else f"{exc}", file=sys.stderr)
        return 2
    except OutputError:
        raise
    except ParasimError as exc:
        from ..errors import RankFailed  # "rank r raised X: ..." already names the error
        kind = "" if isinstance(exc, RankFailed) else f"{type(exc).__name__}: "
        print(f"parasim: {kind}{exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # real ranks are ended by the launcher on the way out
        print("parasim: interrupted", file=sys.stderr)
        return 130


def _check_cwd() -> None:
    """A current folder that was deleted under the shell (`cd d && rmdir ../d`) is refused in one line:
    relative names would fail one by one, and call sites are named relative to it."""
    try:
        os.getcwd()
    except OSError:
        raise UsageError("the current folder no longer exists (it was deleted): cd to one that does, "
                         "then run parasim again") from None


if __name__ == "__main__":
    sys.exit(main())

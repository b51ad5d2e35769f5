"""The `parasim` command: one thin module per command (parse, call the library, call a renderer).
Bad input: one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import __version__
from ..errors import ParasimError, UsageError
from ..limits import check_plot_path
from . import check, estimate, layout, lesson, run, schedule, trace
from .common import Parser


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="parasim", description="LLM training parallelism, taught by running it on virtual ranks.")
    p.add_argument("--version", action="version", version=f"parasim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # the order of `parasim --help`
    for add in (lesson.add_lesson, schedule.add_schedule, trace.add_trace, lesson.add_view, run.add_run,
                check.add_check, layout.add_layout, estimate.add_estimate_commands):
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        if getattr(args, "plot", None) is not None:  # before any work: a wrong name would fail at the end
            check_plot_path(args.plot)
        return args.func(args)
    except UsageError as exc:
        print(f"parasim: error: {exc}" if not str(exc).startswith("parasim") else f"{exc}", file=sys.stderr)
        return 2
    except ParasimError as exc:
        from ..errors import RankFailed  # "rank r raised X: ..." already names the error
        kind = "" if isinstance(exc, RankFailed) else f"{type(exc).__name__}: "
        print(f"parasim: {kind}{exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # real ranks are ended by the launcher on the way out
        print("parasim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `parasim lesson x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `parasim` command: thin, one function per command. Bad input: one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import __version__
from .errors import ParasimError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (never a traceback or a usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def cmd_lesson(args: argparse.Namespace) -> int:
    from .lesson import get_lesson, load_lessons, run_lesson

    if args.name is None:
        lessons = load_lessons()
        if args.json:
            print(json.dumps([{"name": l.name, "title": l.title, "world": l.world, "summary": l.summary}
                              for l in lessons.values()], indent=2))
        else:
            print("Lessons (parasim lesson NAME):")
            for l in lessons.values():
                print(f"  {l.name:<16} {l.world:>3} ranks  {l.title}")
        return 0
    lesson = get_lesson(args.name)
    lr = run_lesson(lesson, args.world)
    if args.chrome:
        from .chrome import to_chrome
        _write(args.chrome, json.dumps(to_chrome(lr.result.trace)) + "\n")
    if args.trace:
        _write(args.trace, lr.result.trace.to_json() + "\n")
    if args.json:
        print(json.dumps(lr.to_dict(), indent=1))
    else:
        # The step-through TUI (its own issue) will open here on a terminal; until then, plain text.
        from .walkthrough import walkthrough
        sys.stdout.write(walkthrough(lr))
    return 0 if lr.ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parasim", description="LLM training parallelism, taught by running it on virtual ranks.")
    p.add_argument("--version", action="version", version=f"parasim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    lp = sub.add_parser("lesson", help="list the lessons, or run one and walk through it",
                        description="Run a lesson on virtual ranks and walk through every collective it makes. "
                                    "Without NAME, list the lessons.")
    lp.add_argument("name", nargs="?", metavar="NAME", help="the lesson to run (omit to list them)")
    out = lp.add_mutually_exclusive_group()
    out.add_argument("--plain", action="store_true", help="print the plain-text walk-through (the default for now)")
    out.add_argument("--json", action="store_true",
                     help='print {"lesson", "world", "events", "values", "checks"} as JSON')
    lp.add_argument("--world", type=_positive, metavar="N", help="number of ranks (default: the lesson's own)")
    lp.add_argument("--chrome", metavar="FILE", help="also write the run as a Chrome trace (Perfetto, chrome://tracing)")
    lp.add_argument("--trace", metavar="FILE", help="also write the run's parasim trace (JSON)")
    lp.set_defaults(func=cmd_lesson)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        return args.func(args)
    except UsageError as exc:
        print(f"parasim: error: {exc}" if not str(exc).startswith("parasim") else f"{exc}", file=sys.stderr)
        return 2
    except ParasimError as exc:
        print(f"parasim: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `parasim lesson x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

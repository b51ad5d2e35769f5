"""`parasim compare`: run a lesson at several settings and set the same figures side by side."""
from __future__ import annotations

import argparse
import itertools
from typing import Any

from ..errors import UsageError
from .common import add_timeout, print_json, program_output


def add_compare(sub: Any) -> None:
    from ..lesson import KNOB_KINDS
    cp = sub.add_parser("compare", help="run a lesson at several settings and compare the same figures",
                        description="Run a lesson once per setting (every combination of the values given, "
                                    "as in `parasim compare sp --tp 2,4,8`) and print one table of the same "
                                    "figures: bytes per axis, the most one GPU held, the lesson's own figures, "
                                    "its checks. Rows whose figure changes with the setting are marked.")
    cp.add_argument("name", metavar="LESSON", help="the lesson to run (parasim lesson --list)")
    out = cp.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help='print {"lesson", "rows": [{"settings", "figures", "ok"}], "differ"} as JSON')
    group = cp.add_argument_group("settings", "comma-separated values of the lesson's settings "
                                  "(parasim lesson --list --json names each lesson's)")
    for name, kind in KNOB_KINDS.items():
        group.add_argument(*kind.flags, dest=f"knob_{name}", metavar=f"{kind.metavar},...",
                           help=kind.help, type=_values(kind.parse))
    add_timeout(cp)
    cp.set_defaults(func=cmd_compare)


def _values(parse: Any) -> Any:
    from .common import positive

    def read(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected values separated by commas, got {text[:40]!r}")
        read_one = positive if parse is int else parse
        values = [read_one(t) for t in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"a value given twice in {text[:40]!r}")
        return values
    return read


def settings_grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every combination of the values given, in the order given."""
    from ..lesson import KNOB_KINDS
    given = {n: getattr(args, f"knob_{n}") for n in KNOB_KINDS if getattr(args, f"knob_{n}", None) is not None}
    if not given:
        raise UsageError("give the settings to compare, such as --tp 2,4,8 (parasim lesson --list --json names "
                         "each lesson's)")
    return [dict(zip(given, combo)) for combo in itertools.product(*given.values())]


def cmd_compare(args: argparse.Namespace) -> int:
    from ..figures import run_figures
    from ..lesson import KNOB_KINDS, get_lesson, is_program, run_lesson
    from ..render.compare import compare_table, differing
    if is_program(args.name):
        raise UsageError("compare runs a lesson at its settings; a program file has none")
    lesson = get_lesson(args.name)
    grid = settings_grid(args)
    for settings in grid:  # every setting refused before the first run
        lesson.settings(settings)
    rows = []
    with program_output(args):
        for settings in grid:
            lr = run_lesson(lesson, timeout=args.timeout, knobs=settings)
            rows.append({"settings": settings, "figures": run_figures(lr), "ok": lr.ok})
    if args.json:
        print_json({"lesson": lesson.name, "rows": rows, "differ": differing(rows)}, indent=2)
    else:
        from rich.console import Console
        flags = {n: k.flags[0] for n, k in KNOB_KINDS.items()}
        Console(highlight=False).print(compare_table(lesson.name, rows, flags))
        bad = [r for r in rows if not r["ok"]]
        print("every run checked itself against its single-device reference: "
              + ("all agree" if not bad else f"{len(bad)} disagree"))
    return 0 if all(r["ok"] for r in rows) else 1

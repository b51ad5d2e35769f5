"""`parasim check`: run a program and its reference, and name the first collective whose result is wrong."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..layout.axes import SIZED
from ..jsonout import dumps
from .common import (
    SHARED_PROCESS,
    add_timeout,
    import_before_starting,
    need_terminal,
    positive,
    program_output,
    width_arg,
)

if TYPE_CHECKING:  # a type only: the commands import nothing heavy before they run
    from ..comm.trace import Trace

# keep every collective's values (up to this many elements each, within the run's budget, limits.KEPT_VALUES):
# other groups, ops and dims are tried on them
KEEP = 10**6


def add_check(sub: Any) -> None:
    cp = sub.add_parser(
        "check",
        help="compare a program with its reference at every marked tensor; name the first wrong collective",
        description="Run a lesson (or your program, path/to/file.py:function) on virtual ranks "
        "and its reference (one rank, or the same program on another layout), put "
        "every tensor both marked (ctx.mark) "
        "back together from the ranks' pieces, and report the first that differs: "
        "the collective it comes from, its group, label and source line, the "
        "error, and the group or placement that would have matched.",
        epilog=SHARED_PROCESS,
    )
    cp.add_argument("name", metavar="LESSON", help="a lesson, or path/to/file.py:function")
    cp.add_argument(
        "--bug",
        metavar="NAME",
        help="run one of the lesson's wrong variants (silent-bugs: "
        "expert-over-dp-cp, dense-over-dp, norm-not-over-tp, clip-per-group, dropout-per-rank)",
    )
    cp.add_argument(
        "--reference",
        metavar="FILE.py:FN",
        help="the one-rank program marking whole tensors "
        "(default: the lesson's, or a `reference` function in the program's file)",
    )
    cp.add_argument(
        "--reference-layout",
        metavar="N|SIZES",
        help="the reference is the same program on another "
        "layout: N ranks, or sizes such as tp=1,cp=2,pp=2,ep=2,sp for a lesson built on a layout (moe16)",
    )
    cp.add_argument(
        "--against",
        choices=("gloo",),
        help="compare with the same program on real gloo ranks instead "
        "of a reference: the first call whose values differ, with both values",
    )
    cp.add_argument("--world", type=positive, metavar="N", help="ranks for a program given as file.py:function")
    out = cp.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help='print {"lesson", "bug", "compared", "closest", "first_divergence", "checks"} as JSON',
    )
    out.add_argument(
        "--tui",
        action="store_true",
        help="open the run in the app with the first divergence marked in the timeline (d jumps to it)",
    )
    cp.add_argument(
        "--width",
        type=width_arg,
        metavar="N",
        help="wrap the report's lines at N columns, 60 to 200 (default: the terminal's; into a pipe or a file "
        "each line stays whole)",
    )
    add_timeout(cp)
    cp.set_defaults(func=cmd_check)


def report_width(args: argparse.Namespace) -> int | None:
    """The width the report's lines are held to: --width, else the terminal's; None (lines whole) into a pipe or
    a file, where a line is more often searched than read."""
    import sys

    from ..render.walkthrough import page_width

    if getattr(args, "width", None) is not None:
        return args.width
    return page_width() if sys.stdout.isatty() else None


def fit(text: str, width: int | None) -> str:
    """The report's lines held to `width`: each wrapped at spaces, its later lines indented 4 more than its first
    (a word longer than the width, a path, stays whole); unchanged where `width` is None."""
    from ..render.walkthrough import wrap_words

    if width is None:
        return text
    out = []
    for line in text.splitlines():
        lead = " " * (len(line) - len(line.lstrip(" ")))
        wrapped = wrap_words(
            line.strip(), width, initial_indent=lead, subsequent_indent=lead + "    ", break_long_words=False
        )
        out += wrapped or [line]
    return "\n".join(out)


def cmd_check(args: argparse.Namespace) -> int:
    from ..engine.divergence import TOLERANCE, collect, first_divergence
    from ..engine.runner import run
    from ..engine.tolerance import worst
    from ..lesson import get_lesson, is_program, program_lesson

    if args.tui:
        need_terminal("--tui")
    lesson = get_lesson(args.name, args.world, timeout=args.timeout)
    program = lesson.program
    if args.bug is not None:
        if args.bug not in lesson.variants:
            known = ", ".join(lesson.variants) or "none"
            raise UsageError(f"{lesson.name} has no variant {args.bug!r}; its variants: {known}")
        program = lesson.variants[args.bug]
    reference, ref_world, against = lesson.reference, 1, "the lesson's reference on 1 rank"
    if args.reference is not None and args.reference_layout is not None:
        raise UsageError("give --reference or --reference-layout, not both")
    if args.reference is not None:
        if not is_program(args.reference):
            raise UsageError(f"--reference takes path/to/file.py:function, got {args.reference!r}")
        reference, against = (
            program_lesson(args.reference, 1, timeout=args.timeout).program,
            f"{args.reference} on 1 rank",
        )
    if args.reference_layout is not None:
        reference, ref_world = reference_on(lesson, args.reference_layout)
        against = f"the same program on {args.reference_layout}" + (" ranks" if args.reference_layout.isdigit() else "")
    elif reference is None and lesson.on_layout is None and lesson.fits(1):  # the same program, unsplit
        reference, against = lesson.program, "the same program on 1 rank"
    world = args.world or lesson.world
    lesson.check_world(world)
    if args.against is not None:
        return _against_real(args, lesson, world)
    symbolic = lesson.backend != "virtual"  # tensors without values: only the lesson's own checks compare
    with program_output(args):
        result = run(
            program, world, lesson.backend, seed=lesson.seed, keep_values=0 if symbolic else KEEP, timeout=args.timeout
        )
    names = {} if symbolic else collect(result.trace, result.marked)
    if symbolic:
        reference = None
    found, checks, agreed = None, [], []
    if reference is not None:
        # the reference's marks are compared, never its collectives' values: it keeps none
        with program_output(args):
            ran = run(reference, ref_world, seed=lesson.seed, timeout=args.timeout)
        found = first_divergence(result, ran, agreed)
    elif names:
        raise UsageError(f"{lesson.name} marks tensors but has no reference: give --reference file.py:function")
    closest = worst(agreed)
    if args.bug is None:  # the lesson's own comparisons with its unsplit model come along
        checks = lesson.judge(result)[0]
    dropped = result.trace.meta.get("values_dropped", 0)
    if args.tui:
        open_at_divergence(result.trace, lesson, found).run()
    elif args.json:
        print(
            dumps(
                {
                    "lesson": lesson.name,
                    "bug": args.bug,
                    "world": world,
                    "reference": against,
                    "compared": len(names),
                    "tolerance": TOLERANCE,
                    "closest": None if closest is None else closest.to_dict(),
                    "first_divergence": found,
                    "values_dropped": dropped,
                    "checks": [c.to_dict() for c in checks],
                }
            )
        )
    else:
        width = report_width(args)
        text = _text(
            lesson.name, args.bug, len(names), found, checks, against if reference is not None else None, closest
        )
        print(fit(text, width))
        if dropped:
            print(fit(_dropped(result.trace, found, dropped), width))
    return 1 if found is not None or not all(c.ok for c in checks) else 0


def open_at_divergence(trace: Trace, lesson: Any, found: dict | None) -> Any:
    """The app on the run, opening at the event the first divergence is pinned on (d jumps back to it)."""
    from ..tui.app import ParasimApp
    from ..tui.view import View

    view = View(trace, lesson.narrative, lesson.title, divergence=found)
    return ParasimApp(view, start=view.diverged())


def _dropped(trace: Trace, found: dict | None, dropped: int) -> str:
    """The line that says values were not kept, and what that left untried."""
    from ..limits import KEPT_VALUES

    calls = sum(e.kind != "compute" for e in trace.events)
    line = (
        f"  the values of {dropped} of {calls} calls were not kept (a run keeps {KEPT_VALUES:,} numbers at "
        "most, to bound its memory)"
    )
    event = None if found is None or found["event"] is None else trace.events[found["event"]]
    if event is not None and any(m.before is None for m in event.members):
        line += (
            f"; event #{event.seq}, where the divergence is pinned, kept none, so what would have matched was not tried"
        )
    return line


SIZE_KEYS = (*SIZED, "world")  # a layout's sizes (layout/axes.py) and its GPUs
FLAG_KEYS = ("sp", "zigzag")


def parse_sizes(text: str) -> dict:
    """'tp=2,cp=1,sp' -> {"tp": 2, "cp": 1, "sp": True}: layout sizes (positive integers) and flags."""
    out: dict = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq and key in FLAG_KEYS:
            out[key] = True
        elif eq and key in SIZE_KEYS and value.isdigit() and int(value) > 0:
            out[key] = int(value)
        else:
            raise UsageError(
                f"layout sizes are {'=N, '.join(SIZE_KEYS)}=N (N >= 1) and the flags "
                f"{', '.join(FLAG_KEYS)}, comma-separated; got {item!r}"
            )
    if not out:
        raise UsageError(f"--reference-layout needs a world size N or sizes such as tp=2,sp; got {text!r}")
    return out


def reference_on(lesson: Any, text: str) -> tuple[Any, int]:
    """The lesson's own program as the reference, on N ranks or on other layout sizes: (program, world)."""
    if text.isdigit():
        world = int(text)
        if world < 1:
            raise UsageError(f"--reference-layout needs at least one rank, got {text}")
        if lesson.on_layout is not None:
            raise UsageError(f"{lesson.name} is built on a layout: give its sizes (e.g. tp=1,pp=2), not a world size")
        lesson.check_world(world)
        return lesson.program, world
    if lesson.on_layout is None:
        raise UsageError(f"{lesson.name} adapts to the world size alone: give --reference-layout N (a number of ranks)")
    return lesson.on_layout(parse_sizes(text))


def _text(
    name: str,
    bug: str | None,
    compared: int,
    found: dict | None,
    checks: list,
    against: str | None,
    closest: Any = None,
) -> str:
    head = f"{name}" + (f" --bug {bug}" if bug else "")
    lines = []
    if found is None and not compared:
        lines.append(f"{head}: no divergence (it marks no tensors with values: only its own checks compare)")
    elif found is None:
        how = "bit for bit" if closest is None else closest.words()
        lines.append(f"{head}: no divergence ({compared} marked tensor(s) agree with {against}; {how})")
    else:
        lines += [
            f"{head}: first divergence from {against} at '{found['name']}' ({found['placement']} on "
            f"{found['marked_on']})",
            f"  max abs error {found['max_abs']:.3g}, max relative {found['max_rel']:.3g} ({found['allowance']})",
        ]
        if found["nan"]:
            lines.append(f"  {found['nan']}")
        if found["rows_missing"]:
            rows = found["rows_missing"]
            lines.append(
                f"  {len(rows)} row(s) of the whole are held by no rank: "
                + ", ".join(map(str, rows[:8]))
                + (", ..." if len(rows) > 8 else "")
            )
        if found["event"] is not None and found["received_at"] is not None:
            src, dst = found["ranks"]
            lines.append(
                f"  from event #{found['event']}: {found['op']} rank {src} -> rank {dst} on {found['group']} "
                f"'{found['label']}', sent at {found['site']}, received at {found['received_at']}"
            )
        elif found["event"] is not None:
            lines.append(
                f"  from event #{found['event']}: {found['op']} on {found['group']} "
                f"'{found['label']}' at {found['site']}"
            )
        if found["transfer"]:
            lines.append(f"  {found['transfer']}")
        if found["copies_differ"]:
            lines.append(
                f"  the copies on {found['marked_on']} differ from each other: whatever made them (a random "
                "draw, a sum) was not the same on every rank there"
            )
        if found["would_match"]:
            lines.append(f"  {found['would_match']}")
    if checks:
        ok = sum(c.ok for c in checks)
        lines.append(f"  the lesson's own checks against the unsplit model: {ok} of {len(checks)} ok")
    return "\n".join(lines)


def _against_real(args: argparse.Namespace, lesson: Any, world: int) -> int:
    """The program on real ranks against its virtual run: the first call that differs, both values in it."""
    from ..engine.launch import RealOptions
    from ..engine.real import run_real

    if args.bug is not None:
        raise UsageError("--against runs the lesson's own program on real ranks; --bug variants run on virtual ranks")
    import_before_starting("torch", "torch.distributed")
    with program_output(args):
        report = run_real(
            lesson.target,
            world,
            RealOptions(args.against, lesson.seed, KEEP, "direct", True, args.timeout, prints_to_stderr=args.json),
        )
    if report is None:  # a torchrun rank other than 0
        return 0
    first = report.differences[0] if report.differences else None
    if args.json:
        print(
            dumps(
                {
                    "lesson": lesson.name,
                    "against": args.against,
                    "world": world,
                    "first_divergence": None if first is None else {"against": args.against, "call": first},
                    "differences": len(report.differences),
                }
            )
        )
    else:
        said = f"{lesson.name} on {world} {args.against} ranks against its virtual run: " + (
            "no difference" if first is None else f"first difference: {first}"
        )
        print(fit(said, report_width(args)))
    return 0 if first is None else 1

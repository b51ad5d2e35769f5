"""`parasim lesson` and `parasim view`: run a lesson on virtual ranks, or open a saved trace."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UsageError
from .common import (
    SHARED_PROCESS,
    add_clock,
    add_timeout,
    clock_choice,
    json_text,
    need_terminal,
    on_terminal,
    open_app,
    positive,
    print_json,
    program_output,
    write,
    write_hta,
    width_arg,
    write_json,
)


def add_lesson(sub: Any) -> None:
    lp = sub.add_parser(
        "lesson",
        help="list the lessons, or run one and walk through it",
        description="Run a lesson on virtual ranks and walk through every collective it makes. "
        "Without NAME, list the lessons.",
        epilog=SHARED_PROCESS,
    )
    lp.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="the lesson to run (omit to list them), or your own "
        "SPMD program as path/to/file.py:function (with --world)",
    )
    out = lp.add_mutually_exclusive_group()
    out.add_argument(
        "--plain",
        action="store_true",
        help="print the plain-text walk-through (the default when stdout is not a terminal)",
    )
    out.add_argument("--tui", action="store_true", help="open the step-through app (the default on a terminal)")
    out.add_argument(
        "--json",
        action="store_true",
        help='print {"lesson", "world", "clock", "events", "values", "checks"} as JSON (each event with '
        "its start and end on the clock)",
    )
    lp.add_argument(
        "--list",
        action="store_true",
        help="list the lessons in the order of the post (the same as no NAME; with --json, as JSON)",
    )
    lp.add_argument(
        "--width",
        type=width_arg,
        metavar="N",
        help="the plain walk-through's line width, 60 to 200 (default: the terminal's, or 96 into a pipe or a file)",
    )
    lp.add_argument("--world", type=positive, metavar="N", help="number of ranks (default: the lesson's own)")
    lp.add_argument(
        "--chrome",
        metavar="FILE",
        help="also write the run as a Chrome trace (Perfetto, chrome://tracing), "
        "each slice at the clock's predicted time (see timing)",
    )
    lp.add_argument("--trace", metavar="FILE", help="also write the run's parasim trace (JSON)")
    lp.add_argument(
        "--hta",
        metavar="DIR",
        help="also write one Kineto-style trace per rank (DIR/rank<r>.json) for Holistic Trace Analysis",
    )
    lp.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the lesson's picture from its run (`parasim lesson "
        "--list` names the lessons that draw one, and what each shows)",
    )
    q = lp.add_argument_group("predict, then see")
    q.add_argument(
        "--quiz",
        action="store_true",
        help="ask for the lesson's figures before showing them (the bytes a rank sends, the bubble, where a "
        "token lands, ZeRO's bytes a parameter), grade each answer against the run and show how it comes "
        "out; in the walk-through the questions come first, read from the terminal (or stdin); in the app, "
        "key z; `parasim lesson --list --json` says which lessons ask",
    )
    q.add_argument(
        "--answer",
        action="append",
        default=[],
        metavar="A",
        help="with --quiz, an answer given up front, in the questions' order (repeat it): nothing is read "
        "from stdin; --json grades these",
    )
    add_knobs(lp)
    add_clock(lp)
    add_timeout(lp)
    lp.set_defaults(func=cmd_lesson, output_files=("trace",))  # checked before the run (cli.main)


def add_view(sub: Any) -> None:
    vp = sub.add_parser(
        "view",
        help="open a saved trace (parasim lesson --trace FILE, or a real run) in the app",
        description="Step through a saved parasim trace in the TUI (plain text when stdout is "
        "not a terminal, or with --plain).",
    )
    vp.add_argument(
        "trace",
        metavar="TRACE.json",
        help="a trace written by --trace, or a program to run first: path/to/file.py:function (with --world)",
    )
    vp.add_argument("--plain", action="store_true", help="print the plain-text walk-through")
    vp.add_argument("--world", type=positive, metavar="N", help="ranks for a program given as file.py:function")
    add_timeout(vp)
    vp.set_defaults(func=cmd_view)


def add_knobs(parser: argparse.ArgumentParser) -> None:
    """The settings lessons let a learner turn (parasim.lesson.KNOB_KINDS); each lesson takes some of them."""
    from ..lesson import KNOB_KINDS

    group = parser.add_argument_group(
        "lesson settings",
        "each lesson takes some of these (its defaults are the "
        "post's where the post gives one that runs here; the walk-through's settings "
        "line says which); `parasim lesson --list --json` names each lesson's",
    )
    for name, kind in KNOB_KINDS.items():
        group.add_argument(
            *kind.flags,
            dest=f"knob_{name}",
            metavar=kind.metavar,
            help=kind.help,
            type=positive if kind.parse is int else kind.parse,
        )


def given_knobs(args: argparse.Namespace) -> dict:
    """The lesson settings given on the command line, by knob name."""
    from ..lesson import KNOB_KINDS

    return {
        name: getattr(args, f"knob_{name}") for name in KNOB_KINDS if getattr(args, f"knob_{name}", None) is not None
    }


def cmd_lesson(args: argparse.Namespace) -> int:
    from ..lesson import get_lesson, load_lessons, run_lesson

    if args.name is None:
        from ..lesson import KNOB_KINDS

        given = [
            f
            for f, v in (
                ("--world", args.world),
                ("--chrome", args.chrome),
                ("--trace", args.trace),
                ("--hta", args.hta),
                ("--plot", args.plot),
            )
            if v is not None
        ]
        given += [KNOB_KINDS[n].flags[-1] for n in given_knobs(args)]
        if given:
            raise UsageError(f"{' and '.join(given)} apply to one lesson: parasim lesson NAME {given[0]} ...")
        _list_lessons(load_lessons(), args.json, getattr(args, "width", None))
        return 0
    if getattr(args, "list", False):  # parasim view FILE.py:fn comes here without it
        raise UsageError("--list lists every lesson: parasim lesson --list (without a NAME)")
    if args.tui:
        need_terminal("--tui")
    lesson = get_lesson(args.name, args.world, timeout=args.timeout)
    _check_quiz(args, lesson)
    if args.plot is not None and lesson.picture is None:
        drawn = [name for name, other in load_lessons().items() if other.picture is not None]
        raise UsageError(
            f"--plot: {lesson.name} has no picture: {lesson.no_picture or 'none drawn yet'}; lessons that draw "
            f"one: {', '.join(drawn)}"
        )
    timing = clock_choice(args)  # a bad --overlap: exit 2 before the run
    with program_output(args):
        lesson.settings(given_knobs(args))  # a setting the lesson does not take: exit 2 before the run
        lr = run_lesson(lesson, args.world, timeout=args.timeout, knobs=given_knobs(args))
    lr.timing = timing
    quiz = getattr(args, "quiz", False)  # parasim view comes here without it
    asked = len(lr.questions()) if quiz and args.answer else 0  # the questions depend on the run's settings
    if len(args.answer if quiz else []) > asked:
        raise UsageError(
            f"--answer given {len(args.answer)} times: {lesson.name} asks {asked} question{'s' * (asked != 1)} "
            "at these settings (its answers in their order)"
        )
    # the JSON first, whole: a value with no JSON form is refused before any file or line is written
    text = json_text(_with_quiz(lr, args.answer) if quiz else lr.to_dict()) if args.json else None
    if args.chrome is not None or args.hta is not None:  # at the clock's predicted times
        from ..clock.timeline import export_times

        times, work = export_times(lr.result.trace, lr.timeline())
    if args.chrome is not None:
        from ..render.chrome import to_chrome

        write_json(args.chrome, to_chrome(lr.result.trace, times=times, work=work), "the Chrome trace")
    if args.hta is not None:
        write_hta(args.hta, lr.result.trace, times, work)
    if args.trace is not None:
        write(args.trace, lr.result.trace.to_json() + "\n")
    if args.plot is not None:
        lesson.picture.draw(lr, args.plot)
    if text is not None:
        sys.stdout.write(text + "\n")
    elif args.tui or (not args.plain and on_terminal()):
        open_app(lr.result.trace, lesson.narrative, lesson.title, lr.tables, lr, args.timeout, quiz=quiz)
    else:
        from ..render.walkthrough import walkthrough

        if quiz:
            _ask(lr.questions(), args.answer, getattr(args, "width", None))
        sys.stdout.write(walkthrough(lr, getattr(args, "width", None)))  # commands that share this take no --width
    return 0 if lr.ok else 1


def _check_quiz(args: argparse.Namespace, lesson: Any) -> None:
    """--quiz on a lesson that asks nothing, or --answer without --quiz: one line, before the run."""
    from ..examples.quiz import MAX_ANSWER

    if not getattr(args, "quiz", False):
        if getattr(args, "answer", None):
            raise UsageError("--answer answers a quiz: give --quiz too")
        return
    lesson.check_asks()
    for a in args.answer:
        if len(a) > MAX_ANSWER:
            raise UsageError(f"--answer: at most {MAX_ANSWER} characters, got {len(a)}")


def _with_quiz(lr: Any, answers: list[str]) -> dict:
    """The run's JSON with its questions graded against `answers` (--answer; none read from stdin)."""
    from ..examples.quiz import grade

    return {**lr.to_dict(), "quiz": [g.to_dict() for g in grade(lr.questions(), answers)]}


def _ask(questions: list, given: list[str], width: int | None = None) -> None:
    """The walk-through's quiz: each question, then its answer (given up front, or a line of stdin; none at
    its end), graded, with the worked formula where the answer was not right; held to the page's width."""
    from ..examples.quiz import MAX_ANSWER, grade, prompt_of, quiz_lines
    from ..render.walkthrough import page_width, wrap_words

    width = width or page_width()

    print(f"Predict, then see: {len(questions)} question{'s' * (len(questions) != 1)} before the walk-through.")
    right = 0
    for i, q in enumerate(questions):
        print("\n" + "\n".join(wrap_words(prompt_of(q, i + 1, len(questions)), width, subsequent_indent="  ")))
        if given:
            answer: str | None = given[i] if i < len(given) else None
            print(f"> {answer if answer is not None else ''}")
        else:
            print("> ", end="", flush=True)
            answer = _read_answer(MAX_ANSWER)
            if not sys.stdin.isatty():
                print(answer or "")  # what was piped in, so the transcript reads as asked and answered
        (graded,) = grade([q], [answer])
        right += bool(graded.right)
        print("\n".join(w for line in quiz_lines(graded) for w in wrap_words(line, width, subsequent_indent="    ")))
    print(f"\n{right} of {len(questions)} right.\n")


def _read_answer(bound: int) -> str | None:
    """A line of stdin, its first `bound` characters (the rest of a longer line read and dropped, a bounded
    piece at a time); None at its end."""
    if sys.stdin is None or sys.stdin.closed:
        return None
    line = sys.stdin.readline(bound + 1)
    if not line:
        return None
    rest = line
    while rest and not rest.endswith("\n"):
        rest = sys.stdin.readline(bound)
    return line.rstrip("\n")[:bound].strip()


def _list_lessons(lessons: dict, as_json: bool, width: int | None = None) -> None:
    """Every lesson in the post's order, with the section of the post it works through and the picture
    `--plot` draws of it, `width` columns wide (default: the page's, as the walk-through's)."""
    if as_json:
        print_json([lesson.listing() for lesson in lessons.values()], indent=2)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title="Lessons, in the order of the post (parasim lesson NAME)",
        title_justify="left",
        show_lines=False,
        expand=False,
    )
    table.add_column("lesson", no_wrap=True, style="bold")
    table.add_column("ranks", justify="right")
    table.add_column("the post's section / what it runs")
    for l in lessons.values():
        drawn = f"\n[dim]--plot: {escape(l.picture.shows)}[/dim]" if l.picture else ""
        table.add_row(
            l.name,
            str(l.world),
            (f"{escape(l.section)}\n[dim]{escape(l.title)}[/dim]" if l.section else escape(l.title)) + drawn,
        )
    from ..render.walkthrough import page_width

    Console(highlight=False, width=width or page_width()).print(table)


def cmd_view(args: argparse.Namespace) -> int:
    from ..lesson import is_program, load_lessons
    from ..comm.trace import Trace

    if is_program(args.trace):  # a user's program: run it on virtual ranks, then the same as a lesson
        # the app on a terminal, text otherwise: the lesson command's flags, with none of its exports
        return cmd_lesson(
            argparse.Namespace(
                **{
                    **vars(args),
                    "name": args.trace,
                    "json": False,
                    "tui": False,
                    "chrome": None,
                    "hta": None,
                    "plot": None,
                    "trace": None,
                }
            )
        )
    if args.world is not None:
        raise UsageError("--world is for a program given as file.py:function; a saved trace has its own")
    trace = Trace.load(args.trace)
    lesson = load_lessons().get(trace.meta.get("lesson", ""))
    narrative, title = (lesson.narrative, lesson.title) if lesson else ({}, args.trace)
    if args.plain or not on_terminal():
        from ..engine.runner import RunResult
        from ..lesson import Lesson, LessonRun
        from ..render.walkthrough import walkthrough

        shown = lesson or Lesson(args.trace, args.trace, trace.world, lambda ctx: None, {}, lambda r: [])
        sys.stdout.write(walkthrough(LessonRun(shown, RunResult([], trace), [])))
        return 0
    open_app(trace, narrative, title)
    return 0

"""The `parasim` command: thin, one function per command. Bad input: one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from . import __version__
from .errors import ParasimError, UsageError
from .limits import check_plot_path, check_processes, size_arg
from .pipeline.schedules import SCHEDULES


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (never a traceback or a usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _positive(text: str) -> int:
    return size_arg(int, text)


def _write(path: str, text: str) -> None:
    if not path:
        raise UsageError("an empty file name: give a path to write to")
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def cmd_lesson(args: argparse.Namespace) -> int:
    from .lesson import get_lesson, load_lessons, run_lesson

    if args.name is None:
        given = [f for f, v in (("--world", args.world), ("--chrome", args.chrome), ("--trace", args.trace)) if v is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} apply to one lesson: parasim lesson NAME {given[0]} ...")
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
    if args.chrome is not None:
        from .chrome import to_chrome
        _write(args.chrome, json.dumps(to_chrome(lr.result.trace)) + "\n")
    if args.trace is not None:
        _write(args.trace, lr.result.trace.to_json() + "\n")
    if args.json:
        print(json.dumps(lr.to_dict(), indent=1))
    elif args.tui or (not args.plain and sys.stdout.isatty()):
        _open_tui(lr.result.trace, lesson.narrative, lesson.title)
    else:
        from .walkthrough import walkthrough
        sys.stdout.write(walkthrough(lr))
    return 0 if lr.ok else 1


def _open_tui(trace, narrative: dict, title: str) -> None:
    from .tui.app import ParasimApp
    from .tui.view import View
    ParasimApp(View(trace, narrative, title)).run()


def cmd_view(args: argparse.Namespace) -> int:
    from .lesson import load_lessons
    from .trace import Trace

    trace = Trace.load(args.trace)
    lesson = load_lessons().get(trace.meta.get("lesson", ""))
    narrative, title = (lesson.narrative, lesson.title) if lesson else ({}, args.trace)
    if args.plain or not sys.stdout.isatty():
        from .engine import RunResult
        from .lesson import Lesson, LessonRun
        from .walkthrough import walkthrough
        shown = lesson or Lesson(args.trace, args.trace, trace.world, lambda ctx: None, {}, lambda r: [])
        sys.stdout.write(walkthrough(LessonRun(shown, RunResult([], trace), [])))
        return 0
    _open_tui(trace, narrative, title)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .comm.launch import under_torchrun
    from .lesson import get_lesson
    from .real import run_real

    if args.name == "all":
        return _run_all(args)
    lesson = get_lesson(args.name)
    if under_torchrun():
        import os
        nproc = int(os.environ["WORLD_SIZE"])
    else:
        nproc = args.nproc or lesson.world
    lesson.check_world(nproc)
    report = run_real(lesson.target, nproc, _real_options(args, lesson))
    if report is None:  # a torchrun rank other than 0: rank 0 reports for everyone
        return 0
    checks = _real_checks(lesson, report)
    if args.chrome is not None:
        from .chrome import to_chrome
        _write(args.chrome, json.dumps(to_chrome(report.trace, times=report.times)) + "\n")
    if args.json:
        print(json.dumps({**report.to_dict(), "lesson": lesson.name, "checks": [c.to_dict() for c in checks]},
                         indent=1))
    else:
        from .verdict import print_verdict
        print_verdict(lesson, report, checks)
    return 0 if _passed(report, checks) else 1


def _real_options(args: argparse.Namespace, lesson: Any) -> Any:
    """How `parasim run` runs one lesson on real ranks: the lesson's seed and kept values, the user's flags."""
    from .comm.launch import RealOptions
    return RealOptions(args.backend, lesson.seed, lesson.keep_values, "direct", not args.no_check, args.timeout)


def _real_checks(lesson: Any, report: Any) -> list:
    """The lesson's own checks, on the values and trace of the real run."""
    from .engine import RunResult
    return list(lesson.checks(RunResult(report.values, report.trace, report.times)))


def _passed(report: Any, checks: list) -> bool:
    return report.match and all(c.ok for c in checks)


def _run_all(args: argparse.Namespace) -> int:
    """`parasim run all`: every lesson on real ranks, one launch per world size (start-up paid once each):
    the lessons that fit --nproc, or else each lesson on its own world."""
    from .comm.launch import under_torchrun
    from .lesson import load_lessons
    from .real import run_real_many

    if under_torchrun():
        raise UsageError("`run all` starts its own ranks; under torchrun run one lesson at a time")
    if args.chrome is not None:
        raise UsageError("--chrome writes one lesson's timeline; name the lesson instead of all")
    if args.nproc:
        check_processes(args.nproc)
    lessons = list(load_lessons().values())
    by_world: dict[int, list] = {}
    for lesson in lessons:
        w = args.nproc or lesson.world
        if lesson.fits(w):
            by_world.setdefault(w, []).append(lesson)
    if not by_world:
        raise UsageError(f"no lesson runs on {args.nproc} ranks")
    rows = []
    for world, group in sorted(by_world.items()):
        jobs = [(lesson.target, _real_options(args, lesson)) for lesson in group]
        if not args.json:
            print(f"{len(group)} lesson(s) on {world} {args.backend} ranks ...", file=sys.stderr, flush=True)
        for lesson, report in zip(group, run_real_many(jobs, world)):
            rows.append((lesson, report, _real_checks(lesson, report)))
    skipped = [lesson.name for lesson in lessons if not any(lesson is r[0] for r in rows)]
    ok = all(_passed(report, checks) for _, report, checks in rows)
    if args.json:
        print(json.dumps({"backend": args.backend, "match": ok, "skipped": skipped, "lessons": [
            {**report.to_dict(), "lesson": lesson.name, "checks": [c.to_dict() for c in checks]}
            for lesson, report, checks in rows]}, indent=1))
    else:
        for lesson, report, checks in rows:
            hint = "" if _passed(report, checks) else f"  <- details: parasim run {lesson.name} --nproc {report.world}"
            print(f"{'MATCH' if report.match else 'DIFFERENT':<10} {lesson.name:<18} {report.world:>3} ranks  "
                  f"{sum(c.ok for c in checks)}/{len(checks)} checks ok{hint}")
        if skipped:
            print(f"not run (no fit on {args.nproc} ranks): {', '.join(skipped)}")
    return 0 if ok else 1


def cmd_layout(args: argparse.Namespace) -> int:
    from .layout import Layout, Model
    from .presets import PRESETS, preset

    if args.list:
        if args.json:
            print(json.dumps({n: {"about": d, **l.to_dict()} for n, (d, l) in PRESETS.items()}, indent=1))
        else:
            for name, (about, layout) in PRESETS.items():
                print(f"  {name:<16} {layout.world:>5} GPUs  {about}")
        return 0
    sizes = {k: getattr(args, k) for k in ("tp", "cp", "pp", "dp", "ep", "etp", "world")}
    model = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "experts", "seq")}
    if args.layout:
        if any(v is not None for v in sizes.values()) or any(v is not None for v in model.values()):
            raise UsageError("give either --layout NAME or sizes, not both")
        layout, title = preset(args.layout), f"{args.layout}: {PRESETS[args.layout][0]}"
    else:
        order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else args.order
        m = Model(**model) if any(v is not None for v in model.values()) else None
        layout = Layout(**{k: v for k, v in sizes.items() if v is not None}, order=order, sp=args.sp, model=m)
        title = ""
    if args.json:
        print(json.dumps(layout.to_json()))
    else:
        from .layout_view import print_layout
        print_layout(layout, title, args.nodes)
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from .pipeline.schedules import check_layers, default_chunks, generate
    from .pipeline.timing import simulate

    costs = {"B": args.backward_cost, "I": 1, "W": 1}
    plan = generate(args.schedule, args.pp, args.microbatches, args.chunks)
    v = args.chunks or default_chunks(args.schedule)
    per = check_layers(args.layers, plan) if args.layers else None
    timing = simulate(plan, costs)
    name = f"{args.schedule}, p={args.pp}, m={args.microbatches}" + (f", v={v}" if v > 1 else "")
    if args.plot is not None:
        from .pipeline.plot import plot_slots
        try:
            plot_slots(timing, name, args.plot)
        except OSError as exc:
            raise UsageError(f"cannot write {args.plot}: {exc.strerror or exc}") from None
    if args.json:
        out = timing.to_dict(args.schedule, args.pp, args.microbatches)
        out.update(chunks=v, **({"layers_per_stage": per} if per else {}))
        print(json.dumps(out))
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table
    title = f"{args.schedule}: {args.pp} ranks x {args.microbatches} micro-batches" + (
        f", {v} chunks per rank (second in lower case)" if v == 2 else f", {v} chunks per rank" if v > 2 else "")
    table = Table(box=box.SIMPLE_HEAD, title=title,
                  title_justify="left", padding=(0, 1))
    table.add_column("time ->", no_wrap=True)
    for t in range(timing.makespan):
        table.add_column(str(t + 1), justify="center")
    colour = {"F": "cyan", "B": "magenta", "I": "magenta", "W": "yellow"}
    for r, row in enumerate(timing.slots):
        table.add_row(f"GPU {r + 1}", *[f"[{colour[x[0].upper()]}]{x}[/]" if x else "[dim].[/]" for x in row])
    console = Console(highlight=False, width=max(100, 12 + 5 * timing.makespan))
    console.print(table)
    if per:
        console.print(f"{args.layers} layers: {per} per stage, {per * v} per rank")
    console.print(f"makespan {timing.makespan} slots; each rank busy {', '.join(str(timing.makespan - i) for i in timing.idle)}"
                  f" of {timing.makespan}; bubble {timing.bubble} = {float(timing.bubble):.1%}; peak micro-batches "
                  f"held per rank {timing.peak}" + (" (counted per chunk)" if v > 1 else ""))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from .engine import run
    from .moe16 import LAYOUT, find_token, make_program, token_path

    if args.layout != LAYOUT:
        raise UsageError(f"token paths are worked out for the {LAYOUT} layout only, got {args.layout!r}")
    watch = find_token(args.token)
    result = run(make_program(watch), 16, seed=0)
    path = token_path(result.trace, watch)
    if args.json:
        print(json.dumps(path, indent=1))
        return 0
    print(f"{path['token']!r}: t{path['position']} of sequence {path['sequence']}, micro-batch {path['micro_batch']}, "
          f"on the {LAYOUT} layout (16 GPUs, one training step; g<rank> names a GPU)")
    phase, summary = None, {}
    for step in path["steps"]:
        if step["phase"] != phase:
            _flush_summary(summary)
            phase = step["phase"]
            print(f"\n{phase}")
        if step["phase"].startswith("backward") and not args.all and "event" in step:
            key = f"{step['op'].replace('_', '-')} over {step['group']}"
            summary[key] = summary.get(key, 0) + 1
            continue
        print(f"  {'#' + str(step['event']) + ' ' if 'event' in step else ''}{step['text']}")
    _flush_summary(summary)
    if not args.all:
        print("\n(backward steps summarised; --all lists every event, --json gives them with event numbers)")
    return 0


def _flush_summary(summary: dict[str, int]) -> None:
    if summary:
        print("  the same path in reverse: " + ", ".join(f"{n} x {k}" for k, n in summary.items()))
        summary.clear()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parasim", description="LLM training parallelism, taught by running it on virtual ranks.")
    p.add_argument("--version", action="version", version=f"parasim {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    lp = sub.add_parser("lesson", help="list the lessons, or run one and walk through it",
                        description="Run a lesson on virtual ranks and walk through every collective it makes. "
                                    "Without NAME, list the lessons.")
    lp.add_argument("name", nargs="?", metavar="NAME", help="the lesson to run (omit to list them)")
    out = lp.add_mutually_exclusive_group()
    out.add_argument("--plain", action="store_true", help="print the plain-text walk-through (the default when "
                     "stdout is not a terminal)")
    out.add_argument("--tui", action="store_true", help="open the step-through app (the default on a terminal)")
    out.add_argument("--json", action="store_true",
                     help='print {"lesson", "world", "events", "values", "checks"} as JSON')
    lp.add_argument("--world", type=_positive, metavar="N", help="number of ranks (default: the lesson's own)")
    lp.add_argument("--chrome", metavar="FILE", help="also write the run as a Chrome trace (Perfetto, chrome://tracing)")
    lp.add_argument("--trace", metavar="FILE", help="also write the run's parasim trace (JSON)")
    lp.set_defaults(func=cmd_lesson)

    sp_ = sub.add_parser("schedule", help="a pipeline schedule's slot table, bubble and activation peaks",
                         description="Generate a pipeline schedule (actions per stage) and place it in time slots "
                                     "from its dependencies.")
    sp_.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="the schedule (orders as "
                     "torch.distributed.pipelining runs them; gpipe as the post draws it)")
    sp_.add_argument("--chunks", "-v", type=_positive, metavar="V", help="model chunks per rank (interleaved: "
                     "default 2; zbv and dualpipev: exactly 2; others: 1)")
    sp_.add_argument("--layers", type=_positive, metavar="L", help="check that L layers split evenly over the stages")
    sp_.add_argument("--pp", type=_positive, default=4, metavar="P", help="pipeline ranks (default 4)")
    sp_.add_argument("--microbatches", "-m", type=_positive, default=4, metavar="M", help="micro-batches (default 4)")
    sp_.add_argument("--backward-cost", type=int, choices=(1, 2), default=1,
                     help="slots a full backward takes (the post draws 1; about 2 in reality)")
    sp_.add_argument("--json", action="store_true", help='print {"schedule","pp","microbatches","slots",...}')
    sp_.add_argument("--plot", metavar="FILE.png", help="draw the slot table with matplotlib")
    sp_.set_defaults(func=cmd_schedule)

    tr = sub.add_parser("trace", help="follow one token through the 16-GPU MoE example, collective by collective",
                        description="Run the post's 16-GPU MoE example (TP2 x CP2 x DP2 attention, EP4 experts, "
                                    "PP2, SP) for one training step on virtual ranks and follow one token: which "
                                    "GPU holds it, every collective it takes part in, where the router sends it, "
                                    "the pipeline hand-off, and the gradient sums.")
    tr.add_argument("--layout", default="moe16", help="the layout (moe16, the only one with a worked token path)")
    tr.add_argument("--token", default="contract", help="a word of sequence A (its first occurrence), or t1..t8, "
                    "or SEQ:WORD for sequences B, C, D (default: contract)")
    tr.add_argument("--all", action="store_true", help="list every backward event too")
    tr.add_argument("--json", action="store_true", help='print {"token", "sequence", "position", "steps": [...]}')
    tr.set_defaults(func=cmd_trace)

    vp = sub.add_parser("view", help="open a saved trace (parasim lesson --trace FILE, or a real run) in the app",
                        description="Step through a saved parasim trace in the TUI (plain text when stdout is "
                                    "not a terminal, or with --plain).")
    vp.add_argument("trace", metavar="TRACE.json", help="a trace written by --trace")
    vp.add_argument("--plain", action="store_true", help="print the plain-text walk-through")
    vp.set_defaults(func=cmd_view)

    rp = sub.add_parser("run", help="run a lesson on real ranks (torch.distributed) and check it against virtual ranks",
                        description="Run a lesson on real ranks: N local processes (gloo on CPU, NCCL on GPUs), "
                                    "or, under torchrun, the ranks torchrun started. The real run is compared "
                                    "call by call with a virtual run of the same program.",
                        epilog="multi-node: torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
                               "--rdzv-endpoint HOST:PORT -m parasim run collectives --backend nccl")
    rp.add_argument("name", metavar="LESSON", help="the lesson to run, or all (every lesson, one launch per world size)")
    rp.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                    help="gloo (CPU processes, default) or nccl (one GPU per rank)")
    rp.add_argument("--nproc", type=_positive, metavar="N",
                    help="processes to start on this machine (default: the lesson's world size)")
    rp.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="seconds a rank may wait in one call before the run is stopped (default 30); a run "
                         "where no rank finishes a call for twice as long is stopped too")
    rp.add_argument("--no-check", action="store_true",
                    help="skip the signature exchange before each collective (faster; mismatches then time out)")
    rp.add_argument("--json", action="store_true",
                    help='print {"backend", "world", "match", "differences", "timings", ...} as JSON')
    rp.add_argument("--chrome", metavar="FILE", help="write the real timeline as a Chrome trace")
    rp.set_defaults(func=cmd_run)

    yp = sub.add_parser("layout", help="the process groups of a layout, as Megatron-Core builds them",
                        description="Show which ranks form each TP, CP, DP, PP and EP group of a layout, exactly "
                                    "as Megatron-Core's initialize_model_parallel builds them (MoE parallel "
                                    "folding included). Sizes left out are 1; dp or world is derived.")
    yp.add_argument("--layout", metavar="NAME", help="a preset (see --list)")
    yp.add_argument("--list", action="store_true", help="list the presets")
    for short, long, what in (("--tp", "--tensor-model-parallel-size", "tensor parallel size"),
                              ("--cp", "--context-parallel-size", "context parallel size"),
                              ("--pp", "--pipeline-model-parallel-size", "pipeline parallel size"),
                              ("--dp", "--data-parallel-size", "data parallel size (default: derived)"),
                              ("--ep", "--expert-model-parallel-size", "expert parallel size"),
                              ("--etp", "--expert-tensor-parallel-size", "expert tensor parallel size (default: tp)"),
                              ("--world", "--world-size", "number of GPUs (default: derived)")):
        yp.add_argument(short, long, dest=short[2:], type=_positive, metavar="N", help=what)
    yp.add_argument("--order", default="tp-cp-ep-dp-pp", help="rank order, fastest axis first "
                    "(tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp)")
    yp.add_argument("--use-tp-pp-dp-mapping", action="store_true", help="Megatron's flag for order tp-cp-ep-pp-dp")
    yp.add_argument("--sequence-parallel", "--sp", dest="sp", action="store_true", help="sequence parallelism")
    for short, long, dest, what in (("--layers", "--num-layers", "layers", "layers (must divide by pp)"),
                                    ("--hidden", "--hidden-size", "hidden", "hidden size"),
                                    ("--heads", "--num-attention-heads", "heads", "attention heads (divide by tp)"),
                                    ("--kv-heads", "--num-query-groups", "kv_heads", "key/value heads (GQA)"),
                                    ("--experts", "--num-experts", "experts", "experts per MoE layer (divide by ep)"),
                                    ("--seq", "--seq-length", "seq", "sequence length (divides by 2*cp)")):
        yp.add_argument(short, long, dest=dest, type=_positive, metavar="N", help=what)
    yp.add_argument("--nodes", type=_positive, default=2, metavar="N", help="nodes to draw (default 2)")
    yp.add_argument("--json", action="store_true",
                    help='print {"layout": {...}, "groups": {NAME: [[ranks], ...]}, "coords": [...]}')
    yp.set_defaults(func=cmd_layout)
    from .cli_estimate import add_estimate_commands
    add_estimate_commands(sub)
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
        from .errors import RankFailed  # "rank r raised X: ..." already names the error
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

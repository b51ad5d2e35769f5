"""`parasim run`: a lesson on real ranks (torch.distributed), checked against virtual ranks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UsageError
from .common import import_before_starting, positive, program_output, seconds_arg, write, write_hta
from ..limits import TIMEOUT, check_processes, check_real_timeout
from ..jsonout import dumps


def add_run(sub: Any) -> None:
    rp = sub.add_parser(
        "run",
        help="run a lesson on real ranks (torch.distributed) and check it against virtual ranks",
        description="Run a lesson on real ranks: N local processes (gloo on CPU, NCCL on GPUs), "
        "or, under torchrun, the ranks torchrun started. The real run is compared "
        "call by call with a virtual run of the same program.",
        epilog="multi-node: torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
        "--rdzv-endpoint HOST:PORT -m parasim run collectives --backend nccl",
    )
    rp.add_argument(
        "name",
        metavar="LESSON",
        help="the lesson to run, all (every lesson, one launch per world "
        "size), or your own program as path/to/file.py:function (with --nproc)",
    )
    rp.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="gloo (CPU processes, default) or nccl (one GPU per rank)",
    )
    rp.add_argument(
        "--nproc",
        type=positive,
        metavar="N",
        help="processes to start on this machine (default: the lesson's world size)",
    )
    rp.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the ranks' tensors live: auto (NCCL: one GPU per rank; gloo: the CPU), cpu, or cuda "
        "(gloo on CUDA tensors; ranks share the visible GPUs, so a multi-rank lesson runs on one GPU)",
    )
    rp.add_argument(
        "--timeout",
        type=seconds_arg,
        default=TIMEOUT,
        metavar="S",
        help=f"seconds a rank may wait in one call before the run is stopped (default {TIMEOUT:g}, at "
        "least 1); a rank stuck outside any call meanwhile is named with its line, and a run where "
        "no rank finishes a call for twice as long is stopped too",
    )
    rp.add_argument(
        "--no-check",
        action="store_true",
        help="skip the signature exchange before each collective (faster; mismatches then time out)",
    )
    rp.add_argument(
        "--json",
        action="store_true",
        help='print {"backend", "world", "match", "differences", "tolerance", "device", "wire", '
        '"timings", ...} as JSON ("wire": where the calls ran on the tensors: "cpu" beside device '
        '"cuda" is a copy to the host and back)',
    )
    rp.add_argument("--chrome", metavar="FILE", help="write the real timeline as a Chrome trace")
    rp.add_argument(
        "--hta",
        metavar="DIR",
        help="write one Kineto-style trace per rank (DIR/rank<r>.json, measured times) for Holistic Trace Analysis",
    )
    rp.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from ..comm.torchrun import under_torchrun
    from ..lesson import get_lesson
    from ..engine.real import run_real

    check_real_timeout(args.timeout)  # before any file is loaded or process started
    import_before_starting("torch", "torch.distributed")
    if args.name == "all":
        return _run_all(args)
    if under_torchrun():
        import os

        given = int(os.environ["WORLD_SIZE"])
    else:
        given = args.nproc
    lesson = get_lesson(args.name, given, "--nproc")  # a user's file.py:function runs on --nproc ranks
    if lesson.backend != "virtual":
        raise UsageError(
            f"{lesson.name} works at real sizes on {lesson.backend} ranks, with no values to hold: "
            "real ranks cannot run it (parasim lesson runs it)"
        )
    nproc = given or lesson.world
    lesson.check_world(nproc)
    with program_output(args):
        report = run_real(lesson.target, nproc, _real_options(args, lesson))
    if report is None:  # a torchrun rank other than 0: rank 0 reports for everyone
        return 0
    checks = _real_checks(lesson, report)
    if args.chrome is not None:
        from ..render.chrome import to_chrome

        write(args.chrome, dumps(to_chrome(report.trace, times=report.times), indent=None) + "\n")
    if args.hta is not None:
        write_hta(args.hta, report.trace, report.times)
    if args.json:
        print(dumps({**report.to_dict(), "lesson": lesson.name, "checks": [c.to_dict() for c in checks]}))
    else:
        from ..render.verdict import print_verdict

        print_verdict(lesson, report, checks)
    return 0 if _passed(report, checks) else 1


def _real_options(args: argparse.Namespace, lesson: Any) -> Any:
    """How `parasim run` runs one lesson on real ranks: the lesson's seed and kept values, the user's flags."""
    from ..engine.launch import RealOptions

    return RealOptions(
        args.backend,
        lesson.seed,
        lesson.keep_values,
        "direct",
        not args.no_check,
        args.timeout,
        device=args.device,
        prints_to_stderr=args.json,
    )


def _real_checks(lesson: Any, report: Any) -> list:
    """The lesson's own checks, on the values and trace of the real run."""
    from ..engine.runner import RunResult

    return lesson.judge(RunResult(report.values, report.trace, report.times))[0]


def _passed(report: Any, checks: list) -> bool:
    return report.match and all(c.ok for c in checks)


def _run_all(args: argparse.Namespace) -> int:
    """`parasim run all`: every lesson on real ranks, one launch per world size (start-up paid once each):
    the lessons that fit --nproc, or else each lesson on its own world."""
    from ..comm.torchrun import under_torchrun
    from ..lesson import load_lessons
    from ..engine.real import run_real_many

    if under_torchrun():
        raise UsageError("`run all` starts its own ranks; under torchrun run one lesson at a time")
    if args.chrome is not None or args.hta is not None:
        raise UsageError("--chrome and --hta write one lesson's timeline; name the lesson instead of all")
    if args.nproc:
        check_processes(args.nproc)
    lessons = list(load_lessons().values())
    by_world: dict[int, list] = {}
    for lesson in lessons:
        w = args.nproc or lesson.world
        if lesson.fits(w) and lesson.backend == "virtual":  # symbolic lessons hold no values to run for real
            by_world.setdefault(w, []).append(lesson)
    if not by_world:
        raise UsageError(f"no lesson runs on {args.nproc} ranks")
    rows = []
    for world, group in sorted(by_world.items()):
        jobs = [(lesson.target, _real_options(args, lesson)) for lesson in group]
        if not args.json:
            print(f"{len(group)} lesson(s) on {world} {args.backend} ranks ...", file=sys.stderr, flush=True)
        with program_output(args):
            reports = run_real_many(jobs, world)
        for lesson, report in zip(group, reports):
            rows.append((lesson, report, _real_checks(lesson, report)))
    skipped = [lesson.name for lesson in lessons if not any(lesson is r[0] for r in rows)]
    ok = all(_passed(report, checks) for _, report, checks in rows)
    if args.json:
        print(
            dumps(
                {
                    "backend": args.backend,
                    "match": ok,
                    "skipped": skipped,
                    "lessons": [
                        {**report.to_dict(), "lesson": lesson.name, "checks": [c.to_dict() for c in checks]}
                        for lesson, report, checks in rows
                    ],
                },
                indent=1,
            )
        )
    else:
        for lesson, report, checks in rows:
            print(row_text(lesson.name, report, checks))
        if skipped:
            print(f"not run (no fit on {args.nproc} ranks, or symbolic only): {', '.join(skipped)}")
    return 0 if ok else 1


def row_text(name: str, report: Any, checks: list) -> str:
    """One lesson's line of `parasim run all`: the verdict, how close the values came, the lesson's checks."""
    hint = "" if _passed(report, checks) else f"  <- details: parasim run {name} --nproc {report.world}"
    how = "" if not report.match else "bit for bit; " if report.closest is None else f"{report.closest.words()}; "
    return (
        f"{'MATCH' if report.match else 'DIFFERENT':<10} {name:<18} {report.world:>3} ranks  "
        f"{how}{sum(c.ok for c in checks)}/{len(checks)} checks ok{hint}"
    )

"""What a machine with CUDA GPUs can check of parasim's real ranks, printed as one markdown table.

NCCL refuses two ranks on one GPU, so with G GPUs visible this runs:
  - tests/e2e/test_nccl.py (pytest -m nccl);
  - NCCL: every lesson that runs on 1 rank, and with G >= 2 those that run on 2, 4, 8, 16 ranks (<= G);
  - gloo ranks with their tensors on the GPU (several ranks share one), every lesson on its own world,
    when `parasim run` has the `--device cuda` option (else a row says it is not checked);
  - every kind of call (scripts/gpu_programs.py) on NCCL and on gloo with CUDA tensors, each rank
    checking that its tensors are on the GPU; when all of them together fail, one row per kind;
  - which kinds gloo itself takes on CUDA tensors (scripts/gpu_gloo_direct.py: torch.distributed alone, no
    copy by parasim), one row per kind: parasim's gloo ranks copy each call's tensors to the host and back,
    and their rows say so (the report's "wire");
  - a bf16 gradient all-reduce beside its float32 one: on NCCL, on gloo with CUDA tensors (within bf16's
    rounding) and on gloo on the CPU (bit for bit).
`parasim run` itself compares every real run with virtual ranks, call by call ("match"), with its
tolerance for sums of non-integers in bf16, float16 and float32. What cannot run is a row too, with why.

    bash scripts/gpu_check.sh [--dry-run [--gpus N]] [--out FILE.md] [--budget SECONDS] [--each SECONDS]

Exit status: 0 when every row that ran passed, 1 when one did not, 2 when nothing can run here.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = "scripts/gpu_programs.py"
DIRECT = "scripts/gpu_gloo_direct.py"  # asks gloo itself which kinds of call it takes on CUDA tensors
WORLDS = (1, 2, 4, 8, 16)  # the world sizes NCCL tries, as many as there are GPUs
DEVICE_ENV = "PARASIM_GPU_CHECK_DEVICE"  # read by gpu_programs.py: the device every real rank must be on
NEEDED = ("torch", "numpy", "greenlet", "array_api_compat", "ml_dtypes")  # what real ranks import
TAIL = 160  # characters of an error line kept in the table


@dataclass(frozen=True)
class Machine:
    gpus: int
    names: tuple[str, ...]
    torch: str
    cuda: str | None
    nccl: str | None


@dataclass
class Check:
    """One command, and the rows it gives: one per lesson for `parasim run all`, else one."""

    part: str  # what is checked, in words (the row's first cell)
    backend: str
    tensors: str  # where the ranks' tensors are
    world: str  # ranks, as the table shows them
    argv: list[str] | None  # None: it cannot run here (why_not says why)
    why_not: str = ""
    lessons: tuple[str, ...] = ()  # a `parasim run all`: the lessons it should report (or the kinds a probe asks)
    per: str = "lesson "  # the row name of each of them, before its name
    env: dict[str, str] = field(default_factory=dict)
    exact: bool = False  # bit for bit expected: a tolerance used is a failure
    split: list["Check"] = field(default_factory=list)  # run one by one when this gives no report


@dataclass
class Row:
    part: str
    backend: str
    tensors: str
    world: str
    result: str
    command: int | None  # the number of the command that gave it (None: nothing ran)

    @property
    def failed(self) -> bool:
        return self.result.startswith(("NO", "error"))


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float


Runner = Callable[[list[str], dict[str, str], float], Outcome]


# ---------------------------------------------------------------------------------------------
# The machine and what parasim offers on it

def probe(torch: Any) -> Machine:
    """The GPUs `torch` sees, and the versions that matter for NCCL."""
    cuda = torch.cuda
    n = cuda.device_count() if cuda.is_available() else 0
    nccl = None
    with contextlib.suppress(Exception):  # torch without NCCL, or an older API: the table says "unknown"
        v = cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return Machine(n, tuple(cuda.get_device_name(i) for i in range(n)), str(torch.__version__),
                   getattr(getattr(torch, "version", None), "cuda", None), nccl)


def missing_modules(names: Sequence[str] = NEEDED) -> list[str]:
    """The modules of `names` this Python cannot import (found without importing them)."""
    return [n for n in names if importlib.util.find_spec(n) is None]


def has_device_option() -> bool:
    """Whether `parasim run` takes `--device cuda` (gloo ranks with CUDA tensors): asked of its own parser."""
    from parasim.cli import build_parser
    from parasim.errors import UsageError
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(["run", "collectives", "--device", "cuda"])
        except (SystemExit, UsageError):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The plan: every check, in order, with its command or the reason it cannot run

def plan(lessons: Sequence[Any], machine: Machine, device_option: bool, python: str = sys.executable) -> list[Check]:
    """The checks for `machine`, cheapest first (a budget that runs out cuts the costly ones). `lessons`:
    objects with name, world, backend and fits(world), as parasim.lesson.Lesson has."""
    run = [python, "-m", "parasim", "run"]
    g = machine.gpus
    real = [x for x in lessons if x.backend == "virtual"]
    no_device = "`parasim run` has no --device option: its gloo ranks keep their tensors on the CPU (docs/gpu.md)"
    cuda_env = {DEVICE_ENV: "cuda"}
    out = [Check("tests/e2e/test_nccl.py (pytest -m nccl)", "nccl", "cuda", "1" if g < 2 else f"1-{min(g, 8)}",
                 [python, "-m", "pytest", "-q", "-m", "nccl", "tests/e2e/test_nccl.py", "-p", "no:cacheprovider"])]
    # NCCL takes one GPU per rank: the worlds that fit the GPUs, one launch each
    for w in WORLDS:
        fit = tuple(x.name for x in real if x.fits(w))
        if fit and w <= g:
            one = [Check(f"lesson {n}", "nccl", "cuda", str(w),
                         run + [n, "--backend", "nccl", "--nproc", str(w), "--json"], lessons=(n,)) for n in fit]
            out.append(Check(f"lessons on {w} rank{'s' if w > 1 else ''}", "nccl", "cuda", str(w),
                             run + ["all", "--backend", "nccl", "--nproc", str(w), "--json"], lessons=fit, split=one))
    # a lesson with no world NCCL can give it here is named once (gloo on the GPU runs it, below)
    left = [x.name for x in real if not any(x.fits(w) and w <= g for w in WORLDS)]
    if left:
        out.append(Check("lessons on more ranks than GPUs", "nccl", "cuda", f"{g + 1}+", None,
                         f"{', '.join(left)}: NCCL takes one GPU per rank and {g} {'is' if g == 1 else 'are'} "
                         "visible"))
    for x in lessons:
        if x.backend != "virtual":
            out.append(Check(f"lesson {x.name}", "-", "-", str(x.world), None,
                             f"runs on {x.backend} ranks only: shapes and bytes, no values to run for real"))
    # every kind of call, each rank checking that its tensors are on the GPU; one by one if all together fail
    kinds = _kinds()
    two = "" if g >= 2 else "NCCL takes one GPU per rank: two ranks need two GPUs"
    for backend, w, extra, why in (("nccl", 1, [], ""), ("nccl", min(max(g, 2), 4), [], two),
                                   ("gloo", 4, ["--device", "cuda"], "" if device_option else no_device)):
        if why:
            out.append(Check("every kind of call", backend, "cuda", str(w), None, why))
            continue
        args = ["--backend", backend, "--nproc", str(w)] + extra + ["--json"]
        one = [Check(f"call: {k}", backend, "cuda", str(w), run + [f"{PROGRAMS}:{k}"] + args, env=cuda_env)
               for k in kinds]
        out.append(Check("every kind of call", backend, "cuda", str(w), run + [f"{PROGRAMS}:every_call"] + args,
                         env=cuda_env, split=one))
    # gloo itself, no copy by parasim: which kinds it takes on CUDA tensors (a refusal is a finding, not a failure)
    out.append(Check("gloo itself on CUDA tensors", "gloo", "cuda, handed to gloo", "2",
                     [python, DIRECT, "--device", "cuda", "--timeout", "20"], lessons=_kinds(), per="gloo itself: "))
    # bf16 beside float32: on the GPU within bf16's rounding, on gloo's CPU ranks bit for bit
    bf16 = run + [f"{PROGRAMS}:bf16_sum"]
    for w in sorted({1, min(g, 4)}):
        out.append(Check("bf16 all-reduce (and float32)", "nccl", "cuda", str(w),
                         bf16 + ["--backend", "nccl", "--nproc", str(w), "--json"], env=cuda_env))
    out.append(Check("bf16 all-reduce (and float32)", "gloo", "cuda", "4",
                     bf16 + ["--backend", "gloo", "--device", "cuda", "--nproc", "4", "--json"] if device_option
                     else None, no_device, env=cuda_env))
    out.append(Check("bf16 all-reduce (and float32), bit for bit", "gloo", "cpu", "4",
                     bf16 + ["--backend", "gloo", "--nproc", "4", "--json"], exact=True))
    # the costly part last: every lesson on its own world as gloo ranks sharing the GPUs
    gloo_cuda = ["--backend", "gloo", "--device", "cuda", "--json"]
    if device_option:
        one = [Check(f"lesson {x.name}", "gloo", "cuda", str(x.world), run + [x.name] + gloo_cuda, lessons=(x.name,))
               for x in real]
        out.append(Check("every lesson on its own world", "gloo", "cuda", "own", run + ["all"] + gloo_cuda,
                         lessons=tuple(x.name for x in real), split=one))
    else:
        out.append(Check("every lesson on its own world", "gloo", "cuda", "own", None, no_device))
    return out


def _kinds() -> tuple[str, ...]:
    """The kinds of call scripts/gpu_programs.py has a program for (loaded by path, as parasim loads it)."""
    spec = importlib.util.spec_from_file_location("gpu_programs", ROOT / PROGRAMS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.KINDS)


# ---------------------------------------------------------------------------------------------
# Running the plan

def run_command(argv: list[str], env: dict[str, str], timeout: float) -> Outcome:
    """Run argv from the checkout in a session of its own; at the time limit the whole session (the
    launcher and its ranks) is ended, so nothing is left running."""
    t = time.monotonic()
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **env}
    p = subprocess.Popen(argv, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        code, err = 124, (err or "") + f"\nstopped after {timeout:.0f} s (--each)"
    return Outcome(code, out or "", err or "", time.monotonic() - t)


Command = tuple[list[str], dict[str, str], Outcome | None]  # argv, extra environment, outcome (None: dry run)


def execute(checks: list[Check], runner: Runner, budget: float, each: float, dry: bool = False,
            clock: Callable[[], float] = time.monotonic) -> tuple[list[Row], list[Command]]:
    """Run the checks in order within `budget` seconds in all, each command at most `each`: the rows, and
    every command run (numbered from 1 in the table). `dry`: run nothing, list what would run."""
    rows: list[Row] = []
    commands: list[Command] = []
    end = clock() + budget

    def one(c: Check) -> None:
        if c.argv is None:
            rows.extend(_rows(c, f"not checked: {c.why_not}", None))
            return
        if dry:
            commands.append((c.argv, c.env, None))
            rows.extend(_rows(c, "not run (dry run)", len(commands)))
            return
        left = end - clock()
        if left < 1:
            rows.extend(_rows(c, f"not checked: out of time (--budget {budget:.0f} s)", None))
            return
        got = runner(c.argv, c.env, min(each, left))
        commands.append((c.argv, c.env, got))
        number = len(commands)
        if c.argv[1:3] == ["-m", "pytest"]:
            rows.append(_row(c, _pytest_result(got), number))
            return
        report = _json(got.stdout)
        if report is None and c.split:  # no report at all: one failure hid the rest, so each on its own
            rows.append(_row(c, f"{_error(got)}; each one alone below", number))
            for s in c.split:
                one(s)
        elif report is None:
            rows.extend(_rows(c, _error(got), number))
        elif "kinds" in report:  # gloo asked directly: a row per kind
            by_kind = {item.get("kind"): item for item in report["kinds"] if isinstance(item, dict)}
            for kind in c.lessons:
                item = by_kind.get(kind, {"ok": False, "result": "not reported"})
                rows.append(Row(f"{c.per}{kind}", c.backend, c.tensors, c.world, direct(item), number))
        elif "lessons" in report:  # `parasim run all`: a report per lesson
            by_name = {item.get("lesson"): item for item in report["lessons"]}
            for name in c.lessons:
                item = by_name.get(name)
                rows.append(Row(f"lesson {name}", c.backend, tensors(c, item), str(item["world"]) if item else c.world,
                                verdict(item, c.exact) if item else "not run by `parasim run all`", number))
        else:
            rows.append(Row(c.part, c.backend, tensors(c, report), c.world, verdict(report, c.exact), number))

    for c in checks:
        one(c)
    return rows, commands


def _row(c: Check, result: str, number: int | None) -> Row:
    return Row(c.part, c.backend, c.tensors, c.world, result, number)


def _rows(c: Check, result: str, number: int | None) -> list[Row]:
    """A check's rows: one per lesson for a `run all`, else one."""
    if len(c.lessons) > 1:
        return [Row(f"{c.per}{n}", c.backend, c.tensors, c.world, result, number) for n in c.lessons]
    return [_row(c, result, number)]


def tensors(c: Check, report: dict | None) -> str:
    """Where the report says the ranks' tensors were, and that each call copied them to the host and back
    when it did (parasim's gloo ranks on CUDA tensors); the check's own words when the report does not say."""
    device, wire = (report or {}).get("device"), (report or {}).get("wire")
    if not isinstance(device, str) or not isinstance(wire, str):
        return c.tensors
    return device if wire == device else f"{device}, via {'host' if wire == 'cpu' else wire} copies"


def direct(item: dict) -> str:
    """One kind of call asked of gloo itself, in words."""
    said = _short(item.get("result", ""))
    if item.get("ok"):
        return "yes: gloo takes CUDA tensors for it itself"
    if said.startswith("not tried"):
        return f"not checked: {said}"
    if said.startswith("refused"):
        return f"not on CUDA tensors: gloo {said} (parasim copies to the host)"
    return f"NO: {said}"


def verdict(report: dict, exact: bool = False) -> str:
    """One lesson's or program's `parasim run --json` report, in words."""
    if not report.get("match"):
        first = (report.get("differences") or ["(no difference listed)"])[0]
        return f"NO: differs from virtual ranks: {_short(first)}"
    failed = [c for c in report.get("checks", []) if not c.get("ok")]
    if failed:
        return f"NO: check failed: {_short(failed[0].get('name', '?'))}"
    tolerance = report.get("tolerance", "exact")
    if tolerance == "exact":
        return "yes, exact"
    if exact:
        return "NO: equal only within a tolerance, bit for bit expected"
    words = tolerance.get("words") if isinstance(tolerance, dict) else None  # how close, as `parasim run` says
    return f"yes, {_short(words)}" if isinstance(words, str) and words.startswith("within") else "yes, within rounding"


def _pytest_result(got: Outcome) -> str:
    last = (got.stdout.strip().splitlines() or [""])[-1]
    if got.code == 0:
        return f"yes: {_short(last)}"
    if got.code == 5:
        return "not checked: pytest collected no test"
    return f"NO (exit {got.code}): {_short(last or _last(got.stderr))}"


def _json(text: str) -> dict | None:
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    return None


def _error(got: Outcome) -> str:
    return f"error (exit {got.code}): {_short(_last(got.stderr) or _last(got.stdout))}"


def _last(text: str) -> str:
    """The line that says what went wrong: parasim's own one-line error if there is one, else the last."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    own = [x for x in lines if x.startswith("parasim:")]
    return (own or lines or [""])[-1]


def _short(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= TAIL else text[:TAIL - 3] + "..."


# ---------------------------------------------------------------------------------------------
# The report

def table(machine: Machine, rows: list[Row], commands: list[Command]) -> str:
    """Markdown: what the machine is, one row per check, a count, then the commands with their times."""
    lines = [f"GPUs: {machine.gpus} ({', '.join(machine.names) or 'none'}); torch {machine.torch}, "
             f"CUDA {machine.cuda or 'none'}, NCCL {machine.nccl or 'unknown'}", "",
             "| part | backend | tensors on | ranks | result | command |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.part} | {r.backend} | {r.tensors} | {r.world} | {r.result} | "
              f"{'#' + str(r.command) if r.command else '-'} |" for r in rows]
    failed = sum(r.failed for r in rows)
    passed = sum(r.result.startswith("yes") for r in rows)
    unchecked = sum(r.result.startswith("not checked") for r in rows)
    refused = sum(r.result.startswith("not on CUDA") for r in rows)
    lines += ["", f"{passed} passed, {failed} failed, {unchecked} not checked"
              + (f", {refused} not on CUDA tensors in gloo itself" if refused else "")
              + (" (dry run: nothing was run)" if commands and commands[0][2] is None else ""), "", "Commands:"]
    for i, (argv, env, got) in enumerate(commands, 1):
        when = "not run" if got is None else f"exit {got.code}, {got.seconds:.1f} s"
        shown = " ".join([f"{k}={v}" for k, v in sorted(env.items())] + ["python" if a == sys.executable else a
                                                                         for a in argv])
        lines.append(f"- #{i} ({when}): `{shown}`")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < 10**6:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"seconds must be a number above 0, got {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"a GPU count is a whole number from 1 to 64, got {text!r}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]  # one line, as parasim's own commands do
        print(f"gpu_check: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None, torch: Any = None, runner: Runner = run_command) -> int:
    """The script. `torch` and `runner` stand in for the real ones in tests (a torch whose cuda is faked)."""
    ap = _Parser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list the checks and the commands; run nothing")
    ap.add_argument("--gpus", type=_count, metavar="N", help="with --dry-run: plan for N GPUs, not the ones visible")
    ap.add_argument("--out", metavar="FILE.md", help="also write the table to this file")
    ap.add_argument("--budget", type=_seconds, default=540.0, metavar="S",
                    help="seconds for everything (default 540); checks left after it are listed as not checked")
    ap.add_argument("--each", type=_seconds, default=300.0, metavar="S",
                    help="seconds one command may take (default 300)")
    args = ap.parse_args(argv)
    if args.gpus is not None and not args.dry_run:
        ap.error("--gpus plans for GPUs that are not there: use it with --dry-run")
    if torch is None:
        gone = missing_modules()
        if gone:
            print(f"gpu_check: {sys.executable} cannot import {', '.join(gone)}; docs/gpu.md says how to bring "
                  "them", file=sys.stderr)
            return 2
        import torch  # type: ignore[no-redef]
    machine = probe(torch)
    if args.gpus is not None:
        machine = Machine(args.gpus, (f"{args.gpus} planned, {machine.gpus} visible",), machine.torch, machine.cuda,
                          machine.nccl)
    if machine.gpus == 0:
        print(f"gpu_check: no CUDA GPU visible to {sys.executable}: nothing to check (--dry-run --gpus N shows "
              "the plan for N)", file=sys.stderr)
        return 2
    from parasim.lesson import load_lessons
    checks = plan(list(load_lessons().values()), machine, has_device_option())
    rows, commands = execute(checks, runner, args.budget, args.each, dry=args.dry_run)
    text = table(machine, rows, commands)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0 if not any(r.failed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

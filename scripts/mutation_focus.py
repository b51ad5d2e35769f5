"""A quick first pass over the mutants of a module that every test reaches (comm.virtual, nn.attention):
run only the test files that aim at it, in one interpreter, and record each mutant they kill in mutmut's
results. mutmut itself then runs only what is left, against every test that reaches it.

    .venv/bin/python scripts/mutation_focus.py parasim.nn.attention tests/unit/nn/test_nn_units.py tests/refs/test_layer_exact.py
    bash scripts/mutation.sh "parasim.nn.attention*"      # the rest, with the whole suite

A kill here is a kill: a listed test fails with the mutant active (or it runs past --timeout). A mutant
the listed files miss is left as it was, for mutmut (or, with --missed-survive, recorded as survived). Run `bash scripts/mutation.sh PATTERN` once first:
it writes the mutants and mutmut's map of tests (mutants/). Options: --shard i/n (run every n-th mutant,
for one process per core), --timeout S (per mutant, default 120), --names FILE (only the mutants it lists),
--reach S (no files: each mutant runs the tests mutmut's map says reach its function, fastest first, as many
as fit in S seconds of their recorded durations; mutmut's own run takes all of them in no set order).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
OPEN = (None, 0, 5, 33)  # not run, survived, or no test reached it


def open_mutants(prefix: str, codes: tuple = OPEN) -> list[str]:
    return [k for meta in sorted((MUTANTS / "parasim").rglob("*.py.meta"))
            for k, v in json.loads(meta.read_text())["exit_code_by_key"].items() if k.startswith(prefix) and v in codes]


def record(name: str, code: int = 1) -> None:
    """Set `name`'s exit code in its module's results (1 killed, 0 survived); re-read each time: shards
    share the files."""
    module = name.split(".x", 1)[0]  # parasim.nn.attention.x_head_split__mutmut_3 -> parasim.nn.attention
    meta = MUTANTS / (module.replace(".", "/") + ".py.meta")
    with open(MUTANTS / ".focus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # read, change, write as one step
        data = json.loads(meta.read_text())
        data["exit_code_by_key"][name] = code
        tmp = meta.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=4))
        tmp.replace(meta)


class Reach:
    """--reach: the tests that reach a mutant's function (mutmut's map, mutants/mutmut-stats.json), cheapest
    first. mutmut records a test's call only, so a test whose module fixture runs a whole lesson shows 0 s:
    the cost of each test run here (setup, call and teardown) replaces the recorded one as it is seen.
    A mutant's neighbours (same function, then same module) are mostly killed by the same tests, and each
    test file collected costs time, so the last killers and the cheapest few go first, on their own."""

    def __init__(self, budget: float) -> None:
        stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())
        self.by_function = stats["tests_by_mangled_function_name"]
        self.cost: dict[str, float] = dict(stats["duration_by_test"])
        self.budget = budget
        self.killers: dict[str, list[str]] = {}

    @staticmethod
    def keys(name: str) -> tuple[str, str]:
        return name.partition("__mutmut_")[0], name.split(".x", 1)[0]  # its function, its module

    def tiers(self, name: str) -> tuple[list[str], list[str]]:
        """The first try, then the rest within the budget (at least one test each, when any reaches it)."""
        reach = sorted(self.by_function.get(self.keys(name)[0], ()), key=lambda t: (self.cost.get(t, 0.0), t))
        known = set(reach)
        first = list(dict.fromkeys([t for key in self.keys(name) for t in self.killers.get(key, [])[-3:] if t in known]
                                   + reach[:3]))
        rest, spent = [], sum(self.cost.get(t, 0.0) for t in first)
        for test in reach:
            if test in first:
                continue
            spent += self.cost.get(test, 0.0)
            if rest and spent > self.budget:
                break
            rest.append(test)
        return first, rest

    def killed(self, name: str, tests: list[str]) -> None:
        for key in self.keys(name):
            self.killers.setdefault(key, []).extend(tests)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="a module (parasim.nn.attention) or a mutant name prefix")
    ap.add_argument("tests", nargs="*", help="test files, fastest and most pointed first (pytest stops at the first failure)")
    ap.add_argument("--shard", default="0/1", metavar="i/n")
    ap.add_argument("--timeout", type=int, default=120, metavar="S")
    ap.add_argument("--names", metavar="FILE", help="only the mutants named in FILE, one a line (e.g. what "
                    "`scripts/mutation_changed.py REV --names MODULE` prints)")
    ap.add_argument("--reach", type=float, metavar="S",
                    help="instead of test files: the tests that reach each mutant's function (mutants/mutmut-stats.json), "
                         "cheapest first, up to S seconds of their costs")
    ap.add_argument("--missed-survive", action="store_true",
                    help="record a mutant the files miss as survived (conservative: the score counts it against "
                         "the tests until `bash scripts/mutation.sh --survivors` runs it with the whole suite)")
    args = ap.parse_args()
    if bool(args.tests) == (args.reach is not None):
        ap.error("give test files or --reach S, not both")
    if not (MUTANTS / "parasim").is_dir():
        sys.exit("no mutants/ yet: run `bash scripts/mutation.sh PATTERN` once first")
    i, n = (int(x) for x in args.shard.split("/"))
    # with --missed-survive a second pass runs only what no pass has run yet
    names = open_mutants(args.prefix, (None,) if args.missed_survive else OPEN)
    if args.names:
        wanted = set(Path(args.names).read_text().split())
        names = [k for k in names if k in wanted]
    names = names[i::n]
    # run the tests from mutants/tests, as mutmut does: call sites are named from the package's root
    tests = [Path(t).resolve().relative_to(ROOT).as_posix() for t in args.tests]
    for src in sorted((ROOT / "tests").rglob("*.py")):
        rel = src.relative_to(ROOT)
        if not src.name.startswith("test_") or rel.as_posix() in tests:
            (MUTANTS / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, MUTANTS / rel)
    reach = Reach(args.reach) if args.reach is not None else None
    os.chdir(MUTANTS)  # the mutated package, as mutmut runs it
    sys.path.insert(0, str(MUTANTS))
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PARASIM_HYPOTHESIS="mutation")
    import pytest

    def alarm(*_: object) -> None:
        raise TimeoutError

    failed: list[str] = []  # the node ids that failed in the last call

    class Failures:  # a pytest plugin: which test killed the mutant, and what each test cost
        @staticmethod
        def pytest_runtest_logreport(report) -> None:
            if report.failed:
                failed.append(report.nodeid)
            if reach is not None:
                before = 0.0 if report.when == "setup" else reach.cost.get(report.nodeid, 0.0)
                reach.cost[report.nodeid] = before + report.duration

    def fails(name: str, tests: list[str]) -> bool:
        os.environ["MUTANT_UNDER_TEST"] = name  # mutmut's trampolines read it at each call
        failed.clear()
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(args.timeout)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                # -n 0: in this interpreter, whatever pyproject's addopts ask (one xdist start per mutant costs seconds)
                return pytest.main(["-x", "-q", "-n", "0", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not slow and not nccl",
                                    "--import-mode=append", "--tb=no", *tests], plugins=[Failures]) != 0
        except Exception:  # a time-out, or the mutant broke pytest itself (mutmut counts a crash as killed)
            return True
        finally:
            signal.alarm(0)

    def killed_by(name: str, tests: list[str]) -> bool:
        if reach is None:
            return fails(name, tests)
        first, rest = reach.tiers(name)
        # never an empty list: pytest given no ids runs every test
        if fails(name, first) or (rest and fails(name, rest)):
            reach.killed(name, failed)
            return True
        return False

    if reach is None and fails("none", tests):
        sys.exit("the test files fail with no mutant active: fix them first")
    import parasim
    assert str(MUTANTS) in parasim.__file__, f"parasim imported from {parasim.__file__}, not mutants/"
    killed = 0
    for name in names:
        start = time.monotonic()
        if reach is not None and not reach.tiers(name)[0]:  # no test reaches it: mutmut records that itself
            print(f"no tests {name}", flush=True)
            continue
        if killed_by(name, tests):
            record(name)
            killed += 1
            print(f"killed   {name} {time.monotonic() - start:.1f}s", flush=True)
        else:
            if args.missed_survive:
                record(name, 0)
            print(f"missed   {name} {time.monotonic() - start:.1f}s", flush=True)
    print(f"{killed} of {len(names)} killed; the rest are left for mutmut")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every benchmark in benchmarks/ runs end to end at a tiny size: `python benchmarks/X.py --tiny` exits 0, with
no traceback, and prints at least one ratio. The files are found by glob when the tests are collected, so a
new benchmark without a `--tiny` mode fails here (argparse refuses the flag, exit 2).

What a ratio is here: a number followed by "x" or "%" ("1.39x the floor", "0.16x the 5 s goal", "6% of the
step"): every benchmark prints its measurements against a floor, a goal or another run as one of these.
Durations are never asserted (docs/testing.md): at a tiny size the ratios say little, and the machine may be
loaded; what is tested is that the benchmark still runs, and still prints what it is for.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
RATIO = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:x|%)(?![A-Za-z0-9])")
# real ranks: gloo processes need torch
NEEDS_TORCH = {"real_vs_virtual.py"}
# more than a few seconds at --tiny on CI's two cores (the app under Textual's Pilot; processes forked for gloo)
SLOW = {"tui.py", "real_vs_virtual.py"}
LIMIT_S = 300  # a generous bound on a loaded machine: the tiny runs take about 0.5-7 s here


def _param(path: Path):
    marks = [pytest.mark.slow] if path.name in SLOW else []
    return pytest.param(path, id=path.name, marks=marks)


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


def test_the_ratio_rule_reads_what_the_benchmarks_print():
    """The pattern the tiny runs are held to, on lines of the forms the benchmarks print (and on some that are
    no ratio: a size, a time, a name)."""
    ratios = ["-> 1.39x the floor", "(13.2x; goal <= 50 us)", "= 6% of the step", "0.16x the 5 s goal",
              "       0.13x", "(symbolic / virtual = 0.69) 0.6x the 10 s target", "1,024.5 x the goal"]
    others = ["64K float32", "0.43 s", "16 GPUs", "ZeRO-1", "1x1 conv", "tp=8: 4.5 ms", "h200x8"]
    assert all(RATIO.search(line) for line in ratios), [line for line in ratios if not RATIO.search(line)]
    assert not any(RATIO.search(line) for line in others), [line for line in others if RATIO.search(line)]


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize("path", [_param(p) for p in BENCHMARKS])
def test_benchmark_runs_tiny_and_prints_a_ratio(path: Path):
    if path.name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip(f"{path.name} runs real ranks, which need torch")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run([sys.executable, str(path.relative_to(ROOT)), "--tiny"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=LIMIT_S, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"{path.name} --tiny exited {out.returncode}:\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert RATIO.search(out.stdout), f"{path.name} --tiny printed no ratio (a number and x or %):\n{out.stdout}"

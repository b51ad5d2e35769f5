"""The live estimator's answer to one move (`parasim memory --app`): CPU seconds from a key press's move to the
answer the view draws, for each setting moved once up and once down, against the 100 ms goal (issue 54), on
the 27B model and on the DeepSeek-V3-like model at 2,048 GPUs. The first answer, which times the held-out runs
once for every later range, is reported apart.

    python benchmarks/estimator_live.py [--tiny]

--tiny: the 27B model, three settings (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import time

from parasim.api import _query
from parasim.tui.estimator import Estimator

GOAL_S = 0.1


def moves(e: Estimator, names: list[str]) -> tuple[list[float], int]:
    """CPU seconds of each answer after a move of each setting up, then down; and how many answers said the
    settings break a layout rule (answered without planning)."""
    out, refused = [], 0
    for name in names:
        for step in (1, -1):
            e.move(name, step)
            t = time.process_time()
            refused += "refused" in e.answer()
            out.append(time.process_time() - t)
    return out, refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the 27B model, three settings: for tests")
    args = ap.parse_args()
    cases = [("27b", 8192, dict(tp=8, sp=True))]
    if not args.tiny:
        cases.append(("deepseek-v3", 4096, dict(tp=8, sp=True, pp=16, ep=8, dp=16)))
    for model, seq, plan in cases:
        e = Estimator.from_query(_query(model, seq, "h200", None, (), plan))
        t = time.process_time()
        e.answer()
        first = time.process_time() - t
        names = ["tp", "seq", "recompute"] if args.tiny else [s.name for s in e.settings() if s.name != "model"]
        times, refused = moves(e, names)
        times.sort()
        worst, median = times[-1], times[len(times) // 2]
        print(f"{model}: first answer {first:.2f} s CPU (the held-out runs timed once); {len(times)} moves "
              f"({refused} breaking a rule): "
              f"median {median * 1e3:.1f} ms = {median / GOAL_S:.2f}x the 100 ms goal, "
              f"slowest {worst * 1e3:.1f} ms = {worst / GOAL_S:.2f}x")


if __name__ == "__main__":
    main()

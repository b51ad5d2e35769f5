"""Pipeline schedules at scale, measured in one run: generating and timing a 64-stage x 1,024 micro-batch
1F1B schedule (goal: under 1 s in all), and the executor's overhead: 1F1B over 4 virtual stages against the
same layers run unsplit on one rank.

    python benchmarks/pipeline.py [--json] [--tiny]

--tiny: 8 stages x 64 micro-batches, and 4 micro-batches through the executor (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import time

import parasim
from parasim.nn import Saved
from parasim.nn.layer import Stack
from parasim.examples.pipeline import _data, _layers, pipeline_run
from parasim.pipeline.schedules import generate
from parasim.pipeline.timing import time_schedule


def unsplit(stages: int, m: int):
    """The same layers on one rank, forward and backward for every micro-batch."""
    def program(ctx):
        stack = Stack(_layers(ctx, 0, stages))
        for mb in range(m):
            y, cache = stack.forward(_data(ctx, mb, "x"), Saved())
            stack.backward(cache, _data(ctx, mb, "target"))
    return program


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="8 x 64 and 4 micro-batches: for tests")
    args = ap.parse_args()
    stages, micro = (8, 64) if args.tiny else (64, 1024)
    t = time.perf_counter()
    timing = time_schedule(generate("1f1b", stages, micro))
    big = time.perf_counter() - t
    m = 4 if args.tiny else 16
    t = time.perf_counter()
    parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", m), 4)
    split = time.perf_counter() - t
    t = time.perf_counter()
    parasim.run(unsplit(4, m), 1)
    base = time.perf_counter() - t
    result = {f"schedule_{stages}x{micro}_s": round(big, 3), "goal_s": 1.0, "makespan": timing.makespan,
              "bubble": str(timing.bubble), "executor_1f1b_4_stages_s": round(split, 3),
              "unsplit_s": round(base, 3), "ratio": round(split / base, 2)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"1F1B, {stages} stages x {micro:,} micro-batches: generated and timed in {big:.2f} s (goal < 1 s); "
          f"makespan {timing.makespan}, bubble {timing.bubble}")
    print(f"executor, 1F1B over 4 virtual stages, {m} micro-batches, forward + backward: {split * 1e3:.0f} ms; "
          f"the same layers unsplit: {base * 1e3:.0f} ms ({split / base:.1f}x, tiny layers: mostly engine overhead)")


if __name__ == "__main__":
    main()

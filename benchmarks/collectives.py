"""How fast are virtual ranks? Measured in one run, printed as ratios.

1. All-reduce of 16M float32 on 8 virtual ranks, against a numpy floor: the sum of the 8 arrays plus one
   copy per rank (what any in-process all-reduce must at least do). Goal: at most 1.3x the floor.
2. Per-call time of a 4-element all-reduce on 8 ranks: the engine's own overhead (scheduling, checks,
   trace), in CPU seconds of this process (the run's start and end included, spread over its calls), the best
   of its samples (three for each of --repeat's): a call's own cost is what it takes when nothing else runs,
   and other work on a shared machine only ever adds to it (timeit's convention; the samples are interleaved
   with the floor's). Goal: at most 25 us (issue 55). Beside it, 8 bare greenlets that meet at every call and do only the kernel's sum and
   copies: what the engine's shape costs before any check, call site or trace record.
3. All-to-all of 16M float32 per rank on 8 virtual ranks (8 chunks each), against the copy floor: every
   rank's input copied once into a fresh array (what any in-process all-to-all must at least move). CPU
   seconds of this process, so other work on the machine does not move the ratio. Goal: at most 1.5x.

    python benchmarks/collectives.py [--json] [--repeat N] [--tiny]

--tiny: 64K float32 instead of 16M, 100 small calls instead of 2,000, one sample: under a second, for
tests/e2e/test_benchmarks.py (the ratios are then mostly start-up and say little).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import parasim

WORLD, BIG, TINY_CALLS = 8, 16 * 1024 * 1024, 2000


def floor_all_reduce(xs: list[np.ndarray]) -> list[np.ndarray]:
    out = np.add(xs[0], xs[1])
    for x in xs[2:]:
        np.add(out, x, out=out)
    return [out.copy() for _ in xs]


def engine_big(xs: list[np.ndarray]) -> float:
    def prog(ctx):
        ctx.comm.all_reduce(xs[ctx.rank])

    t = time.perf_counter()
    parasim.run(prog, world=WORLD)
    return time.perf_counter() - t


def engine_tiny() -> float:
    def prog(ctx):
        x = np.ones(4, np.float32)
        for _ in range(TINY_CALLS):
            ctx.comm.all_reduce(x)

    t = time.process_time()
    parasim.run(prog, world=WORLD)
    return (time.process_time() - t) / TINY_CALLS


def engine_all_to_all(xs: list[np.ndarray]) -> float:
    def prog(ctx):
        ctx.comm.all_to_all(np.split(xs[ctx.rank], WORLD))

    t = time.process_time()
    parasim.run(prog, world=WORLD)
    return time.process_time() - t


def floor_all_to_all(xs: list[np.ndarray]) -> float:
    t = time.process_time()
    out = [x.copy() for x in xs]
    took = time.process_time() - t
    del out
    return took


def bare_tiny() -> float:
    """Per call: 8 greenlets that meet at every call with nothing else done, no checks, no call site, no trace:
    the last to arrive sums the arrays in order and hands each its copy, the others switch to the next ready
    one. The least a virtual-rank engine of this shape (a greenlet a rank, numpy's kernel) can cost a call."""
    from collections import deque

    from greenlet import getcurrent, greenlet

    hub, ready = getcurrent(), deque()
    arrived: list = [None] * WORLD
    results: list = [None] * WORLD
    count = [0]

    def meet(rank: int, x: np.ndarray) -> np.ndarray:
        arrived[rank] = x
        count[0] += 1
        if count[0] < WORLD:
            (ready.popleft() if ready and ready[0] else hub).switch()
        else:
            count[0] = 0
            out = arrived[0] + arrived[1]
            for y in arrived[2:]:
                out += y
            results[:] = [out, *map(np.ndarray.copy, [out] * (WORLD - 1))]
            ready.extend([glets[r] for r in range(WORLD) if r != rank])
        return results[rank]

    def program(rank: int):
        def run() -> None:
            x = np.ones(4, np.float32)
            for _ in range(TINY_CALLS):
                meet(rank, x)
        return run

    glets = [greenlet(program(r), parent=hub) for r in range(WORLD)]
    ready.extend(glets)
    t = time.process_time()
    while ready:
        ready.popleft().switch()
    return (time.process_time() - t) / TINY_CALLS


def floor_tiny() -> float:
    xs = [np.ones(4, np.float32) for _ in range(WORLD)]
    t = time.process_time()
    for _ in range(TINY_CALLS):
        floor_all_reduce(xs)
    return (time.process_time() - t) / TINY_CALLS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--repeat", type=int, default=5,
                    help="samples per measurement (the median is reported; for the tiny call, the best)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes and one sample: a second, for tests")
    args = ap.parse_args()
    global BIG, TINY_CALLS
    if args.tiny:
        BIG, TINY_CALLS, args.repeat = 64 * 1024, 100, 1
    label = f"{BIG // (1024 * 1024)}M" if BIG >= 1024 * 1024 else f"{BIG // 1024}K"

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(BIG, dtype=np.float32) for _ in range(WORLD)]
    engine_big(xs), floor_all_reduce(xs)  # warm up: page in every buffer once
    big_engine, big_floor = [], []
    for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
        big_engine.append(engine_big(xs))
        t = time.perf_counter()
        floor_all_reduce(xs)
        big_floor.append(time.perf_counter() - t)
    engine_all_to_all(xs), floor_all_to_all(xs)  # warm up, as above
    a2a_engine, a2a_floor = [], []
    for _ in range(args.repeat):
        a2a_engine.append(engine_all_to_all(xs))
        a2a_floor.append(floor_all_to_all(xs))
    del xs
    engine_tiny()
    tiny_engine, tiny_floor, tiny_bare = [], [], []
    for _ in range(3 * args.repeat):  # interleaved, as above; three times as many: each is a twentieth of a second
        tiny_engine.append(engine_tiny())
        tiny_floor.append(floor_tiny())
        tiny_bare.append(bare_tiny())

    e, f = statistics.median(big_engine), statistics.median(big_floor)
    te, tf = min(tiny_engine), min(tiny_floor)
    result = {
        f"all_reduce_{label}_float32_8_ranks": {"engine_s": round(e, 4), "numpy_floor_s": round(f, 4),
                                           "ratio": round(e / f, 3), "goal_ratio": 1.3},
        f"all_to_all_{label}_float32_8_ranks": {
            "engine_cpu_s": round(statistics.median(a2a_engine), 4),
            "copy_floor_cpu_s": round(statistics.median(a2a_floor), 4),
            "ratio": round(statistics.median(a2a_engine) / max(statistics.median(a2a_floor), 1e-9), 3),
            "goal_ratio": 1.5,
        },
        "all_reduce_4_float32_8_ranks": {"engine_us_per_call": round(te * 1e6, 1),
                                         "numpy_floor_us_per_call": round(tf * 1e6, 1),
                                         "ratio": round(te / tf, 2), "goal_us_per_call": 25,
                                         "bare_greenlets_us_per_call": round(min(tiny_bare) * 1e6, 1)},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    b, t = result[f"all_reduce_{label}_float32_8_ranks"], result["all_reduce_4_float32_8_ranks"]
    print(f"all-reduce, {label} float32, 8 virtual ranks: {b['engine_s'] * 1e3:.1f} ms vs numpy floor "
          f"{b['numpy_floor_s'] * 1e3:.1f} ms -> {b['ratio']:.2f}x the floor (goal <= {b['goal_ratio']}x)")
    a = result[f"all_to_all_{label}_float32_8_ranks"]
    print(f"all-to-all, {label} float32 a rank, 8 virtual ranks: {a['engine_cpu_s'] * 1e3:.1f} ms CPU vs copy floor "
          f"{a['copy_floor_cpu_s'] * 1e3:.1f} ms -> {a['ratio']:.2f}x the floor (goal <= {a['goal_ratio']}x)")
    print(f"all-reduce, 4 float32, 8 virtual ranks: {t['engine_us_per_call']:.1f} us CPU per call "
          f"(numpy floor {t['numpy_floor_us_per_call']:.1f} us, {t['ratio']:.1f}x; goal <= {t['goal_us_per_call']} us)")
    bare = t["bare_greenlets_us_per_call"]
    print(f"  8 bare greenlets meeting (the sum and copies, no checks, call site or trace): {bare:.1f} us per call; "
          f"the engine {t['engine_us_per_call'] / bare:.2f}x that")


if __name__ == "__main__":
    main()

"""Real ranks (gloo processes on this machine) against virtual ranks, for the same programs, in one run.

Prints ratios: start-up of a real run (the first launch, which starts the fork server that imports torch
once, and a later one) against a whole virtual run, and the time of one small all-reduce
on gloo (with and without the signature exchange) against the same call on virtual ranks.

    python benchmarks/real_vs_virtual.py [--json] [--world N] [--tiny]

--tiny: 2 ranks and 20 calls instead of 200 (for tests/e2e/test_benchmarks.py). Real ranks need torch.
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np

import parasim
from parasim.engine.launch import RealOptions
from parasim.lesson import get_lesson, run_lesson
from parasim.engine.real import run_real

CALLS = 200


def many_all_reduces(ctx, calls: int = CALLS):
    x = ctx.asarray(np.arange(4.0))
    for _ in range(calls):
        ctx.comm.all_reduce(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--tiny", action="store_true", help="2 ranks, 20 calls: for tests")
    args = ap.parse_args()
    calls = CALLS
    if args.tiny:
        args.world, calls = 2, 20
    # the count travels with the program: real ranks import this file afresh and see only CALLS
    program = functools.partial(many_all_reduces, calls=calls)

    lesson = get_lesson("collectives")
    t = time.perf_counter()
    run_lesson(lesson, args.world)
    virtual_lesson_s = time.perf_counter() - t
    t = time.perf_counter()
    parasim.run(program, args.world)
    virtual_call_us = (time.perf_counter() - t) / calls * 1e6

    real = run_real(lesson.target, args.world, RealOptions("gloo", lesson.seed, lesson.keep_values))
    again = run_real(lesson.target, args.world, RealOptions("gloo", lesson.seed, lesson.keep_values))
    checked = run_real(program, args.world, RealOptions("gloo", check=True))
    unchecked = run_real(program, args.world, RealOptions("gloo", check=False))
    # per call: the mean, over ranks and calls, of the time a rank spent inside all_reduce
    gloo_us = unchecked.timings()["all_reduce"]["mean_us"]
    gloo_checked_us = checked.timings()["all_reduce"]["mean_us"]
    result = {
        "world": args.world,
        # the first launch of a process starts the fork server (one torch import); later ones fork from it
        "startup_s": {"gloo": round(real.startup_s, 2), "gloo_next_launch": round(again.startup_s, 2),
                      "virtual_whole_lesson": round(virtual_lesson_s, 3),
                      "ratio": round(real.startup_s / virtual_lesson_s, 1)},
        "all_reduce_4_float64_us": {"virtual": round(virtual_call_us, 1), "gloo": round(gloo_us, 1),
                                    "gloo_with_signature_check": round(gloo_checked_us, 1),
                                    "gloo_over_virtual": round(gloo_us / virtual_call_us, 1),
                                    "check_overhead": round(gloo_checked_us / gloo_us, 2)},
        "lesson_matches": real.match,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    s, c = result["startup_s"], result["all_reduce_4_float64_us"]
    print(f"collectives lesson on {args.world} ranks: gloo start-up {s['gloo']} s (a later launch from the same "
          f"process {s['gloo_next_launch']} s) vs the whole virtual run {s['virtual_whole_lesson'] * 1e3:.0f} ms "
          f"({s['ratio']}x); real run matches virtual: {real.match}")
    print(f"one 4-element all-reduce: virtual {c['virtual']} us, gloo {c['gloo']} us ({c['gloo_over_virtual']}x), "
          f"gloo with the signature check {c['gloo_with_signature_check']} us ({c['check_overhead']}x unchecked)")


if __name__ == "__main__":
    main()

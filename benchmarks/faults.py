"""How fast is a fault reported among many virtual ranks? Measured in one run.

For each world (512, 1,024, 2,048 ranks): a deadlock (the last rank skips an all-reduce), a mismatch (the
last rank asks for max where the others ask for sum) and a failed rank (the last rank raises while the
others wait in a barrier). Printed: seconds to the error, the error's length, and the ratio of that time
to a clean run of one all-reduce on the same world (the engine's own cost of starting that many ranks).
Goal: under 2 s at 2,048 ranks, growing about linearly with the world.

    python benchmarks/faults.py [--json] [--worlds 512,1024,2048] [--tiny]

--tiny: worlds of 8 and 16 ranks (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import time

import parasim


def clean(ctx):
    ctx.comm.all_reduce(ctx.asarray([1.0]))


def deadlock(ctx):
    if ctx.rank != ctx.world - 1:
        ctx.comm.all_reduce(ctx.asarray([1.0]))


def mismatch(ctx):
    ctx.comm.all_reduce(ctx.asarray([1.0]), op="max" if ctx.rank == ctx.world - 1 else "sum")


def failed(ctx):
    if ctx.rank == ctx.world - 1:
        raise ValueError("the last rank fails")
    ctx.comm.barrier()


def timed(program, world: int) -> tuple[float, int]:
    t = time.perf_counter()
    try:
        parasim.run(program, world)
        text = ""
    except parasim.ParasimError as exc:
        text = str(exc)
    return time.perf_counter() - t, len(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worlds", default="512,1024,2048")
    ap.add_argument("--tiny", action="store_true", help="worlds of 8 and 16 ranks: for tests")
    args = ap.parse_args()
    if args.tiny:
        args.worlds = "8,16"
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        base, _ = timed(clean, world)
        for program in (deadlock, mismatch, failed):
            seconds, chars = timed(program, world)
            rows.append({"world": world, "fault": program.__name__, "seconds": round(seconds, 3),
                         "chars": chars, "over_clean_run": round(seconds / base, 2)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'world':>6} {'fault':<9} {'seconds':>8} {'chars':>6} {'x clean run':>12}")
    for r in rows:
        print(f"{r['world']:>6} {r['fault']:<9} {r['seconds']:>8.3f} {r['chars']:>6} {r['over_clean_run']:>11.2f}x")


if __name__ == "__main__":
    main()

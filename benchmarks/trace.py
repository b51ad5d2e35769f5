"""`parasim trace` on a 64-GPU layout (TP2 + SP x CP2 x PP2 x DP8, EP8): one training step on virtual ranks,
the token path and the check against the unsplit model, against the 5 s goal. Measured in one run.

    python benchmarks/trace.py [--json] [--tiny]

--tiny: the 16-GPU moe16 layout instead (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import time

from parasim.cli import main

ARGS = ["trace", "--tp", "2", "--sp", "--cp", "2", "--pp", "2", "--dp", "8", "--ep", "8", "--token", "t6", "--json"]
TINY_ARGS = ["trace", "--layout", "moe16", "--token", "t6", "--json"]  # 16 GPUs
GOAL_S = 5.0


def run(args: list[str]) -> tuple[float, dict]:
    out = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(args)
    took = time.perf_counter() - t
    assert code == 0
    return took, json.loads(out.getvalue())


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--tiny", action="store_true", help="the 16-GPU moe16 layout: for tests")
    args = ap.parse_args()
    gpus = 16 if args.tiny else 64
    took, data = run(TINY_ARGS if args.tiny else ARGS)
    result = {"gpus": gpus, "seconds": round(took, 3), "goal_s": GOAL_S, "of_goal": round(took / GOAL_S, 2),
              "events_on_the_path": len(data["steps"]), "exact": data["exactness"]["exact"]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"trace on {gpus} GPUs: {took:.2f} s, {took / GOAL_S:.2f}x the {GOAL_S:g} s goal; "
              f"{result['events_on_the_path']} steps on the token's path; exact: {result['exact']}")


if __name__ == "__main__":
    main_()

"""The estimator's layout search, measured: `parasim fit --model 27b --search --nodes 1-64` (every layout
on 1 to 64 nodes of 8 GPUs, solved and ranked), in process and as a command, against its 1 s goal.

    python benchmarks/estimate.py [--json] [--repeat N] [--tiny]

--tiny: 1 to 4 nodes, one sample (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from parasim.estimate import get_model, search
from parasim.estimate.fit import parse_nodes

GOAL_S = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="1-4 nodes, one sample: for tests")
    args = ap.parse_args()
    span = "1-4" if args.tiny else "1-64"
    if args.tiny:
        args.repeat = 1
    model, nodes = get_model("27b"), parse_nodes(span)
    best, layouts = float("inf"), 0
    for _ in range(args.repeat):
        t = time.perf_counter()
        layouts = search(model, nodes, 120e9)["layouts_tried"]
        best = min(best, time.perf_counter() - t)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "parasim", "fit", "--model", "27b", "--search", "--nodes", span,
                          "--json"], capture_output=True, text=True)
    command = time.perf_counter() - t
    if out.returncode:
        raise SystemExit(out.stderr)
    res = {"layouts": layouts, "search_s": best, "command_s": command, "goal_s": GOAL_S,
           "search_vs_goal": best / GOAL_S, "command_vs_goal": command / GOAL_S}
    if args.json:
        print(json.dumps(res))
        return
    print(f"search over {layouts:,} layouts ({span} nodes): {best:.3f} s in process (best of {args.repeat}), "
          f"{best / GOAL_S:.2f}x the {GOAL_S:g} s goal")
    print(f"the whole command (start-up, search, JSON): {command:.3f} s, {command / GOAL_S:.2f}x the goal")


if __name__ == "__main__":
    main()

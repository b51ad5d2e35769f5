"""What the clock costs, measured in one run (issue 34: at most 20% of the deepseek-v3 symbolic step).

    python benchmarks/clock.py [--json] [--tiny]

1. The deepseek-v3 preset's whole training step on 2,048 symbolic GPUs (PP 16 x EP 64, DP 128, 16
   micro-batches, ranks of each stage folded: benchmarks/symbolic.py's item 5), then every event of its
   trace laid out on the clock (clock/timeline.simulate: H200s, nodes of 8): the two times and their ratio.
2. The report --json adds on that timeline (clock/report.clock_report, as a lesson makes it: the step's summary,
   the range of the held-out runs like it, and a timeline for each overlap switch that moves something, to say
   what it would save). Issue 55's goal: at most 15% of the step. The modules the report imports when first
   asked (the held-out runs' sets and their model, about 0.1 s once a process) are imported before it is timed:
   the figure is the report's work on this run.

--tiny: the same on the 27B model's TP8 + SP + PP2 preset (16 GPUs, 4 micro-batches): under a second, for
tests/e2e/test_benchmarks.py.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import parasim
from parasim.clock.costs import machine
from parasim.clock.report import clock_report
from parasim.clock.timeline import simulate
from parasim.train.step import make_step
from parasim.layout import preset
from parasim.engine.symbolic.fold import fold_of

GOAL = 0.20  # the clock's time over the step's
REPORT_GOAL = 0.15  # the report's (issue 55)


def timed(fn) -> tuple[float, object]:
    """CPU seconds of this process (the machine's other load does not move them) and fn's result."""
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--tiny", action="store_true", help="a 16-GPU layout instead of 2,048 GPUs (seconds)")
    args = ap.parse_args()
    name, m = ("27b-tp8-sp-pp2", 4) if args.tiny else ("deepseek-v3", 16)
    layout = preset(name)
    layout = replace(layout, model=replace(layout.model, seq=4096))
    step_s, result = timed(lambda: parasim.run(make_step(layout, m=m), layout.world, backend="symbolic",
                                               fold=fold_of(layout)))
    trace = result.trace
    clock_s, tl = timed(lambda: simulate(trace, machine("h200", layout.gpus_per_node)))
    from parasim.clock.published import all_runs  # imported once a process: not the report's work on the run

    all_runs()  # the run sets' modules, imported as the report first asks for them

    report_s, _ = timed(lambda: clock_report(trace, tl=tl))  # as a lesson's --json makes it: on the run's timeline
    out = {"layout": name, "gpus": layout.world, "events": len(trace.events), "step_s": step_s, "clock_s": clock_s,
           "clock_over_step": clock_s / step_s, "report_s": report_s, "report_over_step": report_s / step_s, "report_goal": REPORT_GOAL,
           "goal": GOAL, "predicted_step_s": tl.step}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{name}, one step on {out['gpus']:,} symbolic GPUs ({out['events']:,} events): {step_s:.2f} s CPU to run")
    print(f"  the clock over every event: {clock_s:.2f} s = {out['clock_over_step']:.0%} of the step (goal: at most "
          f"{GOAL:.0%}); the predicted step: {tl.step:.2f} s on H200s")
    print(f"  --json's report (the summary, the held-out range, a timeline per overlap switch that moves "
          f"something): {report_s:.2f} s = {out['report_over_step']:.0%} of the step (goal: at most {REPORT_GOAL:.0%})")


if __name__ == "__main__":
    main()

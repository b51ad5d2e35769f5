"""`parasim schedule`: a pipeline schedule's slot table, bubble and activation peaks."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import UsageError
from .common import positive
from ..pipeline.schedules import SCHEDULES


def add_schedule(sub: Any) -> None:
    sp_ = sub.add_parser("schedule", help="a pipeline schedule's slot table, bubble and activation peaks",
                         description="Generate a pipeline schedule (actions per stage) and place it in time slots "
                                     "from its dependencies.")
    sp_.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="the schedule (orders as "
                     "torch.distributed.pipelining runs them; gpipe as the post draws it)")
    sp_.add_argument("--chunks", "-v", type=positive, metavar="V", help="model chunks per rank (interleaved: "
                     "default 2; zbv and dualpipev: exactly 2; others: 1)")
    sp_.add_argument("--layers", type=positive, metavar="L", help="check that L layers split evenly over the stages")
    sp_.add_argument("--pp", type=positive, default=4, metavar="P", help="pipeline ranks (default 4)")
    sp_.add_argument("--microbatches", "-m", type=positive, default=4, metavar="M", help="micro-batches (default 4)")
    sp_.add_argument("--backward-cost", type=int, choices=(1, 2), default=1,
                     help="slots a full backward takes (the post draws 1; about 2 in reality)")
    sp_.add_argument("--json", action="store_true", help='print {"schedule","pp","microbatches","slots",...}')
    sp_.add_argument("--plot", metavar="FILE.png", help="draw the slot table with matplotlib")
    sp_.set_defaults(func=cmd_schedule)


def cmd_schedule(args: argparse.Namespace) -> int:
    from ..pipeline.schedules import check_layers, default_chunks, generate
    from ..pipeline.timing import simulate

    costs = {"B": args.backward_cost, "I": 1, "W": 1}
    plan = generate(args.schedule, args.pp, args.microbatches, args.chunks)
    v = args.chunks or default_chunks(args.schedule)
    per = check_layers(args.layers, plan) if args.layers else None
    timing = simulate(plan, costs)
    name = f"{args.schedule}, p={args.pp}, m={args.microbatches}" + (f", v={v}" if v > 1 else "")
    if args.plot is not None:
        from ..render.plots import plot_slots
        try:
            plot_slots(timing, name, args.plot)
        except OSError as exc:
            raise UsageError(f"cannot write {args.plot}: {exc.strerror or exc}") from None
    if args.json:
        out = timing.to_dict(args.schedule, args.pp, args.microbatches)
        out.update(chunks=v, **({"layers_per_stage": per} if per else {}))
        print(json.dumps(out))
        return 0
    from ..render.schedule import print_schedule
    print_schedule(timing, args.schedule, args.pp, args.microbatches, v, args.layers, per)
    return 0

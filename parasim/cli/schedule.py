"""`parasim schedule`: a pipeline schedule's slot table, bubble and activation peaks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..pipeline.schedules import schedule_entry, schedule_names
from .common import count, json_text, positive


def add_schedule(sub: Any) -> None:
    sp_ = sub.add_parser(
        "schedule",
        help="a pipeline schedule's slot table, bubble and activation peaks",
        description="Generate a pipeline schedule (actions per stage) and place it in time slots "
        "from its dependencies.",
    )
    sp_.add_argument(
        "--schedule",
        choices=schedule_names(),
        default="1f1b",
        help="the schedule (orders as torch.distributed.pipelining runs them; gpipe as the post draws it)",
    )
    sp_.add_argument("--chunks", "-v", type=positive, metavar="V", help=f"model chunks per rank ({_chunk_rules()})")
    sp_.add_argument("--layers", type=positive, metavar="L", help="check that L layers split evenly over the stages")
    sp_.add_argument("--pp", type=positive, default=4, metavar="P", help="pipeline ranks (default 4)")
    sp_.add_argument("--microbatches", "-m", type=positive, default=4, metavar="M", help="micro-batches (default 4)")
    sp_.add_argument(
        "--backward-cost",
        type=count,
        choices=(1, 2),
        default=1,
        help="slots a full backward takes (the post draws 1; about 2 in reality)",
    )
    sp_.add_argument(
        "--json", action="store_true", help='print {"schedule","pp","microbatches","slots",...} instead of the table'
    )
    sp_.add_argument("--plot", metavar="FILE.png", help="draw the slot table with matplotlib")
    sp_.set_defaults(func=cmd_schedule)


def _chunk_rules() -> str:
    """What --chunks may be, schedules with the same rule named together (from the registry)."""
    names: dict[str, list[str]] = {}
    for name in schedule_names():
        names.setdefault(schedule_entry(name).chunks_words, []).append(name)
    return "; ".join(f"{', '.join(n)}: {words}" for words, n in names.items())


def cmd_schedule(args: argparse.Namespace) -> int:
    from ..limits import SLOT_TABLE, SLOTS_PLOTTED, SLOTS_SHOWN
    from ..pipeline.schedules import check_layers, default_chunks, generate, rounds_note
    from ..pipeline.timing import time_schedule

    costs = {"B": args.backward_cost}  # the other kinds: their costs in the kind table
    plan = generate(args.schedule, args.pp, args.microbatches, args.chunks)
    v = args.chunks or default_chunks(args.schedule)
    per = check_layers(args.layers, plan) if args.layers else None
    # the slots this command fills, draws or prints, whichever bound is the tightest
    bound = min(
        [(SLOT_TABLE, "the timing fills every slot of every rank")]
        + ([(SLOTS_PLOTTED, "--plot draws a box and a label for each slot")] if args.plot else [])
        + ([] if args.json else [(SLOTS_SHOWN, (f"the table prints every slot; --json gives up to {SLOT_TABLE:,}"))])
    )
    timing = time_schedule(plan, costs, *bound)
    name = f"{args.schedule}, p={args.pp}, m={args.microbatches}" + (f", v={v}" if v > 1 else "")
    note = rounds_note(args.pp, args.microbatches, v) if args.schedule.startswith("interleaved") else None
    text = None
    if args.json:
        out = timing.to_dict(args.schedule, args.pp, args.microbatches)
        out.update(chunks=v, **({"layers_per_stage": per} if per else {}), **({"note": note} if note else {}))
        text = json_text(out, indent=None)
    if args.plot is not None:
        from ..render.plots import plot_slots

        plot_slots(timing, name, args.plot)
    if text is not None:
        sys.stdout.write(text + "\n")
        return 0
    from ..render.schedule import print_schedule

    print_schedule(timing, args.schedule, args.pp, args.microbatches, v, args.layers, per)
    if note:
        import textwrap

        print(textwrap.fill(f"note: {note}", 100, subsequent_indent="  "))
    return 0

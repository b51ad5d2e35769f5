"""`parasim trace`: follow one token through the 16-GPU MoE example."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import UsageError


def add_trace(sub: Any) -> None:
    tr = sub.add_parser("trace", help="follow one token through the 16-GPU MoE example, collective by collective",
                        description="Run the post's 16-GPU MoE example (TP2 x CP2 x DP2 attention, EP4 experts, "
                                    "PP2, SP) for one training step on virtual ranks and follow one token: which "
                                    "GPU holds it, every collective it takes part in, where the router sends it, "
                                    "the pipeline hand-off, and the gradient sums.")
    tr.add_argument("--layout", default="moe16", help="the layout (moe16, the only one with a worked token path)")
    tr.add_argument("--token", default="contract", help="a word of sequence A (its first occurrence), or t1..t8, "
                    "or SEQ:WORD for sequences B, C, D (default: contract)")
    tr.add_argument("--all", action="store_true", help="list every backward event too")
    tr.add_argument("--json", action="store_true", help='print {"token", "sequence", "position", "steps": [...]}')
    tr.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    from ..engine.runner import run
    from ..examples.moe16 import LAYOUT, find_token, make_program, token_path

    if args.layout != LAYOUT:
        raise UsageError(f"token paths are worked out for the {LAYOUT} layout only, got {args.layout!r}")
    watch = find_token(args.token)
    result = run(make_program(watch), 16, seed=0)
    path = token_path(result.trace, watch)
    if args.json:
        print(json.dumps(path, indent=1))
        return 0
    print(f"{path['token']!r}: t{path['position']} of sequence {path['sequence']}, micro-batch {path['micro_batch']}, "
          f"on the {LAYOUT} layout (16 GPUs, one training step; g<rank> names a GPU)")
    phase, summary = None, {}
    for step in path["steps"]:
        if step["phase"] != phase:
            _flush_summary(summary)
            phase = step["phase"]
            print(f"\n{phase}")
        if step.get("direction") == "backward" and not args.all and "event" in step:
            key = f"{step['op'].replace('_', '-')} over {step['group']}"
            summary[key] = summary.get(key, 0) + 1
            continue
        print(f"  {'#' + str(step['event']) + ' ' if 'event' in step else ''}{step['text']}")
    _flush_summary(summary)
    if not args.all:
        print("\n(backward steps summarised; --all lists every event, --json gives them with event numbers)")
    return 0


def _flush_summary(summary: dict[str, int]) -> None:
    if summary:
        print("  the same path in reverse: " + ", ".join(f"{n} x {k}" for k, n in summary.items()))
        summary.clear()

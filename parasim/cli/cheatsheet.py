"""`parasim cheatsheet`: the post's cheat sheet, every cell computed from a lesson's run (examples/cheatsheet.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import json_text, progress_line, width_arg


def add_cheatsheet(sub: Any) -> None:
    p = sub.add_parser(
        "cheatsheet",
        help="the post's cheat sheet, every cell computed from a lesson's run",
        description="For each way of splitting the work (DP, ZeRO, TP, SP, CP, PP, EP): what it splits, what it "
        "sends and what limits it, each figure read from the run of the lesson named beside it, at that "
        "lesson's sizes. A cell marked [n] has note n under the table (why SP sends more than TP, what CP's "
        "masks need). Runs the lessons it reads (a few seconds).",
    )
    p.add_argument("--json", action="store_true", help='print {"rows": [...]} with each row\'s figures and notes')
    p.add_argument(
        "--width",
        type=width_arg,
        help="the table's line width, 60 to 200 (default: the terminal's, or 96 into a pipe or a file); at 200 "
        "each method's row reads on one line, narrower pages wrap its cells",
    )
    p.set_defaults(func=cmd_cheatsheet)


def cmd_cheatsheet(args: argparse.Namespace) -> int:
    from ..examples.cheatsheet import cheat_sheet
    from ..render.tables import table_lines
    from ..render.walkthrough import page_width

    said = progress_line if sys.stderr.isatty() else None
    sheet = cheat_sheet(None if said is None else lambda name: said(f"running lesson {name} ..."))
    if args.json:
        sys.stdout.write(json_text(sheet.to_dict()) + "\n")
    else:
        sys.stdout.write("\n".join(table_lines(sheet.table(), args.width or page_width())) + "\n")
    return 0

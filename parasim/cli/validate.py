"""`parasim validate step-time`: the clock's step time against published training runs, in three sets."""
from __future__ import annotations

import argparse
from typing import Any

from .common import print_json

ALL = "all"


def add_validate(sub: Any) -> None:
    vp = sub.add_parser("validate", help="hold parasim's figures against published training runs",
                        description="Hold parasim's figures against published runs, each with its source.")
    what = vp.add_subparsers(dest="what", metavar="WHAT", required=True, parser_class=type(vp))
    st = what.add_parser("step-time", help="the clock's step time against published runs",
                         description="The clock's step time (a plan's, without running it) against published "
                                     "training runs: each run's configuration and source, the published figure in "
                                     "its own unit, parasim's and the error; what parasim assumes where a source "
                                     "is silent, and what the other choices would give. One set of constants per "
                                     "GPU type (parasim hardware). The runs are split by source into a calibration "
                                     "set (the sources the model was shaped on), a held-out set (never shaped on, "
                                     "but read for causes since) and a fresh held-out set (five other sources, "
                                     "scored once: the test of the model), each scored on its own.")
    # the sets' names are checked in the command, against clock/runs.py's SETS (importing it here would slow
    # every command's start)
    st.add_argument("--set", dest="which", default=ALL, metavar="SET",
                    help=f"print one set: calibration, held-out, fresh or {ALL} (default: {ALL}, calibration first)")
    st.add_argument("--json", action="store_true",
                    help='print {"rows": [{name, set, source, gpus, published, predicted, unit, error, assumed, '
                         '...}], "score": {SET: {runs, median_abs_error, max_abs_error, bias, ...}}}')
    st.set_defaults(func=cmd_step_time)


def cmd_step_time(args: argparse.Namespace) -> int:
    from ..clock.published import rows, scores
    from ..clock.runs import SETS
    from ..errors import UsageError
    if args.which not in SETS + (ALL,):
        raise UsageError(f"--set {args.which!r}: the sets are {', '.join(SETS)} and {ALL}")
    table = rows(None if args.which == ALL else args.which)
    if args.json:
        print_json({"rows": table, "score": scores(table)}, indent=2)
        return 0
    from rich.console import Console
    from ..render.validation_text import step_time_report
    step_time_report(Console(highlight=False), table, scores(table))
    return 0

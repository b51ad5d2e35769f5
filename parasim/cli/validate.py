"""`parasim validate step-time`: the clock's step time against published training runs."""
from __future__ import annotations

import argparse
from typing import Any

from .common import print_json


def add_validate(sub: Any) -> None:
    vp = sub.add_parser("validate", help="hold parasim's figures against published training runs",
                        description="Hold parasim's figures against published runs, each with its source.")
    what = vp.add_subparsers(dest="what", metavar="WHAT", required=True, parser_class=type(vp))
    st = what.add_parser("step-time", help="the clock's step time against published runs",
                         description="The clock's step time (a plan's, without running it) against published "
                                     "training runs: each run's configuration and source, the published throughput, "
                                     "parasim's and the error; what parasim assumes where a source is silent, and "
                                     "what the other choices would give. One set of constants per GPU type "
                                     "(parasim hardware).")
    st.add_argument("--json", action="store_true",
                    help='print {"rows": [{name, source, gpus, published, predicted, unit, error, ...}], "score"}')
    st.set_defaults(func=cmd_step_time)


def cmd_step_time(args: argparse.Namespace) -> int:
    from ..clock.published import rows, score
    table = rows()
    if args.json:
        print_json({"rows": table, "score": score(table)}, indent=2)
        return 0
    from rich.console import Console
    from ..render.validation_text import step_time_report
    step_time_report(Console(highlight=False), table, score(table))
    return 0

"""`parasim validate step-time`: the clock's step time against published training runs, set by set;
`parasim validate moe-layer`: the clock's MoE layer against one measured alone."""

from __future__ import annotations

import argparse
from typing import Any

from .common import print_json

ALL = "all"


def add_validate(sub: Any) -> None:
    vp = sub.add_parser(
        "validate",
        help="hold parasim's figures against published training runs",
        description="Hold parasim's figures against published runs, each with its source.",
    )
    what = vp.add_subparsers(dest="what", metavar="WHAT", required=True, parser_class=type(vp))
    from ..clock.sets import NAMES  # imports nothing else of parasim's: no run is loaded for --help

    st = what.add_parser(
        "step-time",
        help="the clock's step time against published runs",
        description="The clock's step time (a plan's, without running it) against published "
        "training runs: each run's configuration and source, the published figure in "
        "its own unit, parasim's and the error; what parasim assumes where a source "
        "is silent, and what the other choices would give. One set of constants per "
        "GPU type (parasim hardware). The runs are split by source into a calibration "
        "set (the sources the model was shaped on), a held-out set (never shaped on, "
        "but read for causes since) and later sets, each gathered after the one "
        "before it was scored, from other sources, and scored once with the model of "
        "its day; only the newest is a clean test. Each set is scored on its own.",
    )
    st.add_argument(
        "--set",
        dest="which",
        default=ALL,
        metavar="SET",
        help=f"print one set: {', '.join(NAMES)} or {ALL} (default: {ALL}, calibration first)",
    )
    st.add_argument(
        "--json",
        action="store_true",
        help='print {"rows": [{name, set, source, gpus, published, predicted, unit, error, assumed, '
        '...}], "score": {SET: {runs, median_abs_error, max_abs_error, bias, ...}}}',
    )
    st.set_defaults(func=cmd_step_time)
    ml = what.add_parser(
        "moe-layer",
        help="the clock's MoE layer against one measured alone",
        description="The clock's MoE layer, item by item (router, experts, shared expert, "
        "activation, permutation, EP all-to-alls), forward and backward, against "
        "Megatron-Core's MoE-layer performance test on an H100 (a layer timed alone, "
        "not a training run): a Mixtral-like and a DeepSeek-like layer, BF16 and FP8. "
        "The dispatchers the clock does not time (DeepEP, HybridEP) are listed with "
        "what they save, measured.",
    )
    ml.add_argument(
        "--json",
        action="store_true",
        help='print {"rows": [{case, model, dispatcher, precision, forward_ms, backward_ms, '
        "parasim_forward_ms, parasim_backward_ms, forward_error, backward_error, items_ms, ...}], "
        '"score": {cases, timings, median_abs_error, max_abs_error, bias}, "source": {...}}',
    )
    ml.set_defaults(func=cmd_moe_layer)


def cmd_step_time(args: argparse.Namespace) -> int:
    from ..clock.published import rows, scores
    from ..clock.sets import NAMES as SETS
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


def cmd_moe_layer(args: argparse.Namespace) -> int:
    from dataclasses import asdict
    from ..clock.moe_layer import A2A_SOURCE, SOURCE, all_to_all_rows, rows, score

    table, a2a = rows(), all_to_all_rows()
    if args.json:
        print_json(
            {
                "rows": table,
                "score": score(table),
                "source": asdict(SOURCE),
                "all_to_all": a2a,
                "all_to_all_source": asdict(A2A_SOURCE),
            },
            indent=2,
        )
        return 0
    from rich.console import Console
    from ..render.validation_text import moe_layer_report

    moe_layer_report(Console(highlight=False), table, score(table), SOURCE, a2a, A2A_SOURCE)
    return 0

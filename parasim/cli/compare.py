"""`parasim compare`: run a lesson at several settings and set the same figures side by side."""

from __future__ import annotations

import argparse
import itertools
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..layout.axes import AXES, SIZED
from .common import add_timeout, print_json, program_output

if TYPE_CHECKING:
    from ..figures import Comparison


def add_compare(sub: Any) -> None:
    from ..lesson import KNOB_KINDS

    cp = sub.add_parser(
        "compare",
        help="run a lesson at several settings and compare the same figures",
        description="Run a lesson once per setting (every combination of the values given, "
        "as in `parasim compare sp --tp 2,4,8`) and print one table of the same "
        "figures: bytes per axis, the most one GPU held, the lesson's own figures, "
        "its checks. Rows whose figure changes with the setting are marked.",
    )
    cp.add_argument(
        "name",
        metavar="LESSON",
        help="the lesson to run (parasim lesson --list), or `layout`: the "
        "post's MoE example (parasim trace) on several layouts",
    )
    out = cp.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help='print {"lesson", "rows": [{"settings", "figures", "ok"}], "differ"} as JSON',
    )
    cp.add_argument(
        "--plot", metavar="FILE.png", help="also draw the figures that change, one small panel each, a bar per setting"
    )
    group = cp.add_argument_group(
        "settings", "comma-separated values of the lesson's settings (parasim lesson --list --json names each lesson's)"
    )
    for name, kind in KNOB_KINDS.items():
        group.add_argument(
            *kind.flags, dest=f"knob_{name}", metavar=f"{kind.metavar},...", help=kind.help, type=_values(kind.parse)
        )
    sizes = cp.add_argument_group(
        "layout sizes",
        "with LESSON = layout: comma-separated sizes of the MoE example's "
        "layout (as parasim trace takes them), e.g. parasim compare layout --tp 2 --cp 2 "
        "--pp 2 --ep 4,8 --sp --world 16",
    )
    from .common import count

    for flag, what in LAYOUT_FLAGS.items():  # experts may be 0: a dense model
        sizes.add_argument(
            flag,
            dest=f"size_{flag[2:].replace('-', '_')}",
            metavar="N,...",
            help=what,
            type=_values(count if flag == "--experts" else int),
        )
    sizes.add_argument(
        "--sp",
        "--sequence-parallel",
        dest="sp",
        action="store_true",
        help="sequence parallelism in every layout (MoE with TP needs it)",
    )
    from .trace import add_example

    add_example(sizes)
    sizes.add_argument(
        "--token", default="contract", help="the word to follow (parasim trace --token; default contract)"
    )
    add_timeout(cp)
    cp.set_defaults(func=cmd_compare)


# the settings of a layout that only `parasim compare layout` takes (the lessons' flags, the axes' sizes --tp ...
# --ep and -m, are read as layout sizes there too)
LAYOUT_FLAGS = {
    "--etp": f"{AXES['etp'].what} (default 1)",
    "--world": "GPUs (default: tp x cp x pp x dp)",
    "--experts": "experts per layer (default 8; 0: a dense model)",
    "--layers": "layers (default 4)",
    "--gpus-per-node": "GPUs per node, for the bytes that cross nodes (default 8)",
}


def _values(parse: Any) -> Any:
    from .common import positive

    def read(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected values separated by commas, got {text[:40]!r}")
        read_one = positive if parse is int else parse
        values = [read_one(t) for t in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"a value given twice in {text[:40]!r}")
        return values

    return read


def settings_grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every combination of the values given, in the order given."""
    from ..lesson import KNOB_KINDS

    given = {n: getattr(args, f"knob_{n}") for n in KNOB_KINDS if getattr(args, f"knob_{n}", None) is not None}
    if not given:
        raise UsageError(
            "give the settings to compare, such as --tp 2,4,8 (parasim lesson --list --json names each lesson's)"
        )
    return [dict(zip(given, combo)) for combo in itertools.product(*given.values())]


def cmd_compare(args: argparse.Namespace) -> int:
    from ..figures import compare_lesson
    from ..lesson import get_lesson, is_program

    given = [f for f in LAYOUT_FLAGS if getattr(args, f"size_{f[2:].replace('-', '_')}") is not None]
    from ..examples.worked import DEFAULT

    given += ["--sp"] * args.sp + ["--token"] * (args.token != "contract") + ["--example"] * (args.example != DEFAULT)
    if args.name == "layout":
        return _compare_layouts(args)
    if given:
        raise UsageError(
            f"{given[0]} is a layout size: parasim compare layout {given[0]} ... (a lesson takes its own settings)"
        )
    if is_program(args.name):
        raise UsageError("compare runs a lesson at its settings; a program file has none")
    lesson, grid = get_lesson(args.name), settings_grid(args)
    with program_output(args):  # what the runs print goes to stderr under --json
        comparison = compare_lesson(lesson, grid, args.timeout)
    return _show(args, comparison)


def _show(args: argparse.Namespace, comparison: Comparison) -> int:
    """The table (or JSON, or the picture too) of the runs' figures; exit 1 when a run disagrees with its
    reference."""
    if args.plot is not None:
        from ..render.plot_compare import plot_compare

        plot_compare(comparison.name, comparison.shown(), comparison.labels, args.plot)
    if args.json:
        print_json(comparison.to_dict(), indent=2)
    else:
        from rich.console import Console
        from ..render.compare import compare_table

        Console(highlight=False).print(compare_table(comparison.name, comparison.shown(), comparison.labels))
        bad = [r for r in comparison.rows if not r["ok"]]
        print(
            "every run checked itself against its single-device reference: "
            + ("all agree" if not bad else f"{len(bad)} disagree")
        )
    return 0 if comparison.ok else 1


# a layout's settings by the names parasim trace gives them (the axes' sizes first: layout/axes.py), and where
# compare's arguments keep them (an axis a lesson takes as a knob under the knob's name)
LAYOUT_SIZES = {
    **{name: f"size_{name}" for name in SIZED},
    "world": "size_world",
    "experts": "size_experts",
    "layers": "size_layers",
    "gpus_per_node": "size_gpus_per_node",
    "microbatches": "knob_m",
    "routing": "knob_routing",
}


def _compare_layouts(args: argparse.Namespace) -> int:
    """`parasim compare layout ...`: the MoE example's step on every combination of the sizes given, each run
    checked against the unsplit model, the same figures side by side."""
    from .trace import layout_of_args
    from ..examples.worked import example
    from ..figures import LayoutRun, compare_layouts, layout_label

    if args.knob_chunks is not None:
        raise UsageError("--chunks is a lesson's setting (pp-interleaved); a layout runs 1F1B")
    from ..lesson import KNOB_KINDS

    dests = {n: f"knob_{n}" if n in KNOB_KINDS else dest for n, dest in LAYOUT_SIZES.items()}
    given = {n: getattr(args, dest) for n, dest in dests.items() if getattr(args, dest, None) is not None}
    if not given:
        raise UsageError("give the layout sizes to compare, such as --tp 2 --cp 2 --pp 2 --ep 4,8 --sp --world 16")
    grid = [dict(zip(given, combo)) for combo in itertools.product(*given.values())]
    ex = example(args.example)
    runs = []
    for sizes in grid:  # every layout refused before the first run, naming the one refused
        ns = argparse.Namespace(
            layout=None,
            sp=args.sp,
            split=None,
            example=args.example,
            **{k: sizes.get(k) for k in (*SIZED, "world", "experts", "layers", "gpus_per_node")},
        )
        try:
            layout = layout_of_args(ns).layout
            # the example's own router unless a routing is given (its first routing: the one that learns)
            m, routing = sizes.get("microbatches") or ex.micro_batches, sizes.get("routing", ex.routings[0])
            ex.check_runnable(layout, m, routing)
            reps = ex.replicas(layout.dp, m)
            watch = ex.find_token(args.token, [s for rep in reps for s in rep])
        except UsageError as e:
            hint = ""
            if "world" not in sizes:  # a size not given is 1, not the example's: say what the example's are
                from ..layout import preset

                own = preset(ex.layout)
                hint = (
                    " (a size not given is 1, not the example's; its own: "
                    + " ".join(f"--{n} {getattr(own, n)}" for n in SIZED if getattr(own, n) > 1)
                    + (" --sp" if own.sp else "")
                    + f" --world {own.world})"
                )
            raise UsageError(f"{layout_label(sizes, args.sp)}: {e}{hint}") from None
        runs.append(LayoutRun(sizes, layout, m, routing, watch))
    with program_output(args):
        comparison = compare_layouts(ex, runs, args.sp, args.timeout)
    return _show(args, comparison)

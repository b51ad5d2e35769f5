"""`parasim compare`: run a lesson at several settings and set the same figures side by side."""
from __future__ import annotations

import argparse
import itertools
from typing import Any

from ..errors import UsageError
from ..layout.axes import AXES, SIZED
from .common import add_timeout, print_json, program_output


def add_compare(sub: Any) -> None:
    from ..lesson import KNOB_KINDS
    cp = sub.add_parser("compare", help="run a lesson at several settings and compare the same figures",
                        description="Run a lesson once per setting (every combination of the values given, "
                                    "as in `parasim compare sp --tp 2,4,8`) and print one table of the same "
                                    "figures: bytes per axis, the most one GPU held, the lesson's own figures, "
                                    "its checks. Rows whose figure changes with the setting are marked.")
    cp.add_argument("name", metavar="LESSON", help="the lesson to run (parasim lesson --list), or `layout`: the "
                    "post's MoE example (parasim trace) on several layouts")
    out = cp.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help='print {"lesson", "rows": [{"settings", "figures", "ok"}], "differ"} as JSON')
    cp.add_argument("--plot", metavar="FILE.png", help="also draw the figures that change, one small panel each, "
                    "a bar per setting")
    group = cp.add_argument_group("settings", "comma-separated values of the lesson's settings "
                                  "(parasim lesson --list --json names each lesson's)")
    for name, kind in KNOB_KINDS.items():
        group.add_argument(*kind.flags, dest=f"knob_{name}", metavar=f"{kind.metavar},...",
                           help=kind.help, type=_values(kind.parse))
    sizes = cp.add_argument_group("layout sizes", "with LESSON = layout: comma-separated sizes of the MoE example's "
                                  "layout (as parasim trace takes them), e.g. parasim compare layout --tp 2 --cp 2 "
                                  "--pp 2 --ep 4,8 --sp --world 16")
    from .common import count
    for flag, what in LAYOUT_FLAGS.items():  # experts may be 0: a dense model
        sizes.add_argument(flag, dest=f"size_{flag[2:].replace('-', '_')}", metavar="N,...", help=what,
                           type=_values(count if flag == "--experts" else int))
    sizes.add_argument("--sp", action="store_true", help="sequence parallelism in every layout (MoE with TP needs it)")
    from .trace import add_example
    add_example(sizes)
    sizes.add_argument("--token", default="contract", help="the word to follow (parasim trace --token; default "
                       "contract)")
    add_timeout(cp)
    cp.set_defaults(func=cmd_compare)


# the settings of a layout that only `parasim compare layout` takes (the lessons' flags, the axes' sizes --tp ...
# --ep and -m, are read as layout sizes there too)
LAYOUT_FLAGS = {"--etp": f"{AXES['etp'].what} (default 1)", "--world": "GPUs (default: tp x cp x pp x dp)", "--experts": "experts per layer (default 8; 0: a dense model)",
                "--layers": "layers (default 4)", "--gpus-per-node": "GPUs per node, for the bytes that cross "
                "nodes (default 8)"}


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
        raise UsageError("give the settings to compare, such as --tp 2,4,8 (parasim lesson --list --json names "
                         "each lesson's)")
    return [dict(zip(given, combo)) for combo in itertools.product(*given.values())]


def cmd_compare(args: argparse.Namespace) -> int:
    from ..figures import run_figures
    from ..lesson import KNOB_KINDS, get_lesson, is_program, run_lesson
    given = [f for f in LAYOUT_FLAGS if getattr(args, f"size_{f[2:].replace('-', '_')}") is not None]
    from ..examples.worked import DEFAULT
    given += ["--sp"] * args.sp + ["--token"] * (args.token != "contract") + ["--example"] * (args.example != DEFAULT)
    if args.name == "layout":
        return _compare_layouts(args)
    if given:
        raise UsageError(f"{given[0]} is a layout size: parasim compare layout {given[0]} ... (a lesson takes "
                         "its own settings)")
    if is_program(args.name):
        raise UsageError("compare runs a lesson at its settings; a program file has none")
    lesson = get_lesson(args.name)
    grid = settings_grid(args)
    for settings in grid:  # every setting refused before the first run
        lesson.settings(settings)
    rows = []
    with program_output(args):
        for settings in grid:
            lr = run_lesson(lesson, timeout=args.timeout, knobs=settings)
            rows.append({"settings": settings, "figures": run_figures(lr), "ok": lr.ok})
    flags = {n: k.flags[0] for n, k in KNOB_KINDS.items()}
    return _show(args, lesson.name, rows, flags, "lesson")  # every setting given varies


def _show(args: argparse.Namespace, name: str, rows: list[dict], flags: dict[str, str], key: str,
          hide: set[str] = frozenset()) -> int:
    """The table (or JSON, or the picture too) of the runs' figures, the settings in `hide` (the same in every
    run, said in `name`) left out of the columns' labels; exit 1 when a run disagrees with its reference."""
    from ..render.compare import compare_table, differing
    shown = [{**r, "settings": {k: v for k, v in r["settings"].items() if k not in hide}} for r in rows]
    if args.plot is not None:
        from ..render.plot_compare import plot_compare
        plot_compare(name, shown, flags, args.plot)
    if args.json:
        print_json({key: name, "rows": rows, "differ": differing(rows)}, indent=2)
    else:
        from rich.console import Console
        Console(highlight=False).print(compare_table(name, shown, flags))
        bad = [r for r in rows if not r["ok"]]
        print("every run checked itself against its single-device reference: "
              + ("all agree" if not bad else f"{len(bad)} disagree"))
    return 0 if all(r["ok"] for r in rows) else 1


# a layout's settings by the names parasim trace gives them (the axes' sizes first: layout/axes.py), and where
# compare's arguments keep them (an axis a lesson takes as a knob under the knob's name)
LAYOUT_SIZES = {**{name: f"size_{name}" for name in SIZED}, "world": "size_world", "experts": "size_experts",
                "layers": "size_layers", "gpus_per_node": "size_gpus_per_node", "microbatches": "knob_m",
                "routing": "knob_routing"}


def _compare_layouts(args: argparse.Namespace) -> int:
    """`parasim compare layout ...`: the MoE example's step on every combination of the sizes given, each run
    checked against the unsplit model, the same figures side by side."""
    from .trace import layout_of_args
    from ..examples.worked import example
    from ..engine.runner import run
    from ..figures import trace_figures
    if args.knob_chunks is not None:
        raise UsageError("--chunks is a lesson's setting (pp-interleaved); a layout runs 1F1B")
    from ..lesson import KNOB_KINDS
    dests = {n: f"knob_{n}" if n in KNOB_KINDS else dest for n, dest in LAYOUT_SIZES.items()}
    given = {n: getattr(args, dest) for n, dest in dests.items() if getattr(args, dest, None) is not None}
    if not given:
        raise UsageError("give the layout sizes to compare, such as --tp 2 --cp 2 --pp 2 --ep 4,8 --sp --world 16")
    grid = [dict(zip(given, combo)) for combo in itertools.product(*given.values())]
    ex = example(args.example)
    plans = []
    for sizes in grid:  # every layout refused before the first run, naming the one refused
        ns = argparse.Namespace(layout=None, sp=args.sp, split=None, example=args.example, **{
            k: sizes.get(k) for k in (*SIZED, "world", "experts", "layers", "gpus_per_node")})
        try:
            layout = layout_of_args(ns).layout
            # the example's own router unless a routing is given (its first routing: the one that learns)
            m, routing = sizes.get("microbatches") or ex.micro_batches, sizes.get("routing", ex.routings[0])
            ex.check_runnable(layout, m, routing)
            reps = ex.replicas(layout.dp, m)
            watch = ex.find_token(args.token, [s for rep in reps for s in rep])
        except UsageError as e:
            raise UsageError(f"{_label(sizes, args.sp)}: {e}") from None
        plans.append((sizes, layout, m, routing, watch))
    rows = []
    with program_output(args):
        for sizes, layout, m, routing, watch in plans:
            result = run(ex.make_program(watch, layout, m, routing), layout.world, seed=0, timeout=args.timeout)
            exact = ex.exactness(result.values, layout, m, routing) if routing in ex.routings else None
            trace = result.trace
            fig = {"GPUs": layout.world, **trace_figures(trace)}  # the busiest GPU per axis, as a lesson's
            for axis, link in sorted(trace.bytes_by_link(layout.gpus_per_node).items()):
                fig[f"{axis}: bytes inside a node, all GPUs"] = link["inside"]
                fig[f"{axis}: bytes across nodes, all GPUs"] = link["across"]
            fig.update(ex.token_figures(trace))
            fig["loss and gradients equal the unsplit model's"] = "-" if exact is None else exact["exact"]
            rows.append({"settings": {**sizes, **({"sp": True} if args.sp else {})}, "figures": fig,
                         "ok": exact is None or exact["exact"]})
    for r in rows:  # a link no run used is no figure
        r["figures"] = {n: v for n, v in r["figures"].items() if not n.endswith("all GPUs") or
                        any(x["figures"].get(n) for x in rows)}
    same = {k: v for k, v in rows[0]["settings"].items() if all(r["settings"].get(k) == v for r in rows)}
    name = "layout" + (f" ({_label({k: v for k, v in same.items() if k != 'sp'}, 'sp' in same)} in every run)"
                       if same else "")
    return _show(args, name, rows, LAYOUT_LABELS, "compare", hide=set(same) if len(same) < len(rows[0]["settings"])
                 else set())


# a table's heading for each setting: an axis's its own (layout/axes.py), then the rest
LAYOUT_LABELS = {**{name: AXES[name].label for name in SIZED}, "world": "GPUs", "experts": "experts",
                 "layers": "layers", "gpus_per_node": "GPUs/node", "microbatches": "m", "routing": "routing", "sp": "SP"}


def _label(sizes: dict, sp: bool) -> str:
    return " ".join(f"{LAYOUT_LABELS[k]} {v}" for k, v in sizes.items()) + (" SP" if sp else "")

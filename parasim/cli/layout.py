"""`parasim layout`: the process groups of a layout, as Megatron-Core builds them."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from ..errors import UsageError
from ..layout.axes import SIZED
from ..limits import NODES_SHOWN, check_experts_shown
from .common import add_sizes, add_stages, positive, positive_up_to, print_json, width_arg, with_stages


def add_layout(sub: Any) -> None:
    yp = sub.add_parser(
        "layout",
        help="the process groups of a layout, as Megatron-Core builds them",
        description="Show which ranks form each TP, CP, DP, PP and EP group of a layout, exactly "
        "as Megatron-Core's initialize_model_parallel builds them (MoE parallel "
        "folding included). Sizes left out are 1; dp or world is derived.",
    )
    yp.add_argument("--layout", metavar="NAME", help="a preset (see --list)")
    yp.add_argument("--list", action="store_true", help="list the presets")
    add_sizes(
        yp,
        said={
            "dp": "default: derived",
            "etp": "default 1 with experts, as in the post and parasim trace; "
            "without experts it follows tp, as Megatron's does",
        },
        megatron=True,
    )
    yp.add_argument(
        "--world", "--world-size", dest="world", type=positive, metavar="N", help="number of GPUs (default: derived)"
    )
    yp.add_argument(
        "--order", default="tp-cp-ep-dp-pp", help="rank order, fastest axis first (tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp)"
    )
    yp.add_argument("--use-tp-pp-dp-mapping", action="store_true", help="Megatron's flag for order tp-cp-ep-pp-dp")
    yp.add_argument("--sequence-parallel", "--sp", dest="sp", action="store_true", help="sequence parallelism")
    for short, long, dest, what in (
        ("--layers", "--num-layers", "layers", "layers (divide by pp, unless the layers on stages are given)"),
        ("--hidden", "--hidden-size", "hidden", "hidden size"),
        ("--heads", "--num-attention-heads", "heads", "attention heads (divide by tp)"),
        ("--kv-heads", "--num-query-groups", "kv_heads", "key/value heads (GQA)"),
        ("--experts", "--num-experts", "experts", "experts per MoE layer (divide by ep)"),
        ("--seq", "--seq-length", "seq", "sequence length (divides by 2*cp)"),
    ):
        yp.add_argument(short, long, dest=dest, type=positive, metavar="N", help=what)
    yp.add_argument(
        "--nodes",
        type=positive_up_to(NODES_SHOWN, "each node is drawn as a panel"),
        default=2,
        metavar="N",
        help=f"nodes to draw (default 2, at most {NODES_SHOWN})",
    )
    yp.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the layout as one picture: GPUs by node, the experts each holds, EP groups by colour",
    )
    yp.add_argument(
        "--json", action="store_true", help='print {"layout": {...}, "groups": {NAME: [[ranks], ...]}, "coords": [...]}'
    )
    yp.add_argument(
        "--width",
        type=width_arg,
        metavar="N",
        help="the page's line width, 60 to 200 (default: the terminal's, or 80 into a pipe or a file)",
    )
    add_stages(yp)
    from .megatron import add_megatron

    add_megatron(yp, what="layout (and the model sizes its rules check)")
    from .megatron import add_job

    add_job(yp)
    yp.set_defaults(func=cmd_layout)


def cmd_layout(args: argparse.Namespace) -> int:
    from ..layout import PRESETS, Layout, ModelSpec, layout_names, preset

    if args.list:
        if args.json:
            print_json({n: {"about": PRESETS[n].about, **preset(n).to_dict()} for n in layout_names()})
        else:
            for n in layout_names():
                print(f"  {n:<16} {preset(n).world:>5} GPUs  {PRESETS[n].about}")
        return 0
    sizes = {k: getattr(args, k) for k in (*SIZED, "world")}
    model = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "experts", "seq")}
    if args.layout and (args.megatron or args.job):
        raise UsageError(f"give either --layout NAME or {'--job' if args.job else '--megatron'} FILE, not both")
    from .megatron import check_not_both, read_job_arg, read_megatron

    check_not_both(args)

    # read once: the layout and the answer's "megatron" (or "job") both come from it
    job = read_megatron(args) or read_job_arg(args)
    megatron = job if getattr(job, "script", None) is not None else None  # a Megatron-LM job, by either flag
    if args.layout:
        if any(v is not None for v in sizes.values()) or any(v is not None for v in model.values()):
            raise UsageError("give either --layout NAME or sizes, not both")
        layout, title = preset(args.layout), f"{args.layout}: {PRESETS[args.layout].about}"
        layout = replace(layout, model=with_stages(args, layout.model))  # the layers on stages the flags give
    elif job is not None:
        title = f"{job.path} ({'Megatron-LM flags' if megatron is not None else job.title})"
        layout = _job_layout(args, job, sizes, model)
    else:
        order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else args.order
        given = {k: v for k, v in model.items() if v is not None}
        m = with_stages(args, ModelSpec(**given) if given else None)
        if sizes["etp"] is None and ((sizes["ep"] or 1) > 1 or given.get("experts")):
            sizes["etp"] = 1  # an MoE layout: the post's experts, and parasim trace's, are not split by TP
        layout = Layout(**{k: v for k, v in sizes.items() if v is not None}, order=order, sp=args.sp, model=m)
        title = ""
    if not args.json:  # the drawing names each GPU's experts, on the nodes it draws
        check_experts_shown(min(layout.world, args.nodes * layout.gpus_per_node), layout.experts_each)
    if args.plot is not None:
        from ..render.plots import plot_layout_map

        plot_layout_map(layout, args.plot, title)
    written = None
    if args.megatron_args:
        from ..megatron.args import PRECISION_FLAGS, job_rest, layout_args, model_args, script_text
        from ..megatron.pipeline import pipeline_args

        from ..megatron.args import megatron_precision

        precision = "megatron-bf16" if job is None else megatron_precision(job.step["precision"])
        words = (
            model_args(layout.model, layout.model.seq if layout.model else None, partial=True, job=megatron)
            + layout_args(layout, bool(layout.model and layout.model.experts))
            + pipeline_args(layout.model, layout)
            + list(PRECISION_FLAGS[precision])
        )
        words += [] if megatron is None else job_rest(megatron, words)  # the rest of the job, as it gives it
        written = {"args": words, "torchrun": script_text(words, layout.world, layout.gpus_per_node)}
    if args.json:
        out = layout.to_json()
        if job is not None:
            out["megatron" if megatron is not None else "job"] = job.to_dict()
        if written is not None:
            out["megatron_args"] = written
        print_json(out, indent=None)
        return 0
    if job is not None:
        from .megatron import print_job

        print_job(job, args)
    from ..render.layout_view import print_layout

    from rich.console import Console

    print_layout(layout, title, args.nodes, Console(highlight=False, width=args.width))
    if written is not None:
        from ..megatron.args import describe
        from .megatron import print_written

        print_written(f"this layout as Megatron-LM flags on {describe(layout.world, layout.gpus_per_node)}", written)
    return 0


def _job_layout(args: argparse.Namespace, job: Any, sizes: dict, model: dict) -> Any:
    """The layout of `job` (`--megatron FILE` or `--job FILE`, read), the sizes given here in place of the job's."""
    from ..layout import ModelSpec
    from ..megatron.job import layout_of

    fields = {k: job.model.get(k) for k in ("layers", "hidden", "heads", "kv_heads", "experts", "stages")}
    fields.update({k: v for k, v in model.items() if v is not None and k != "seq"})
    seq = model.get("seq") or job.seq
    m = with_stages(args, ModelSpec(**{k: v for k, v in fields.items() if v is not None}, seq=seq))
    return layout_of(job, m, **sizes, sp=args.sp or None, order="tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else None)

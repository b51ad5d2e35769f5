"""`parasim trace`: follow one token through one training step of the MoE example, on any layout."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import UsageError
from ..limits import check_app_gpus, check_plot_gpus
from ..layout.axes import SIZED
from ..layout.mesh import CP_COMMS
from ..nn.routing import policy_help
from ..render.token_path import gpu_text, path_text
from .common import add_sizes, add_stages, count, need_terminal, print_json, progress_line, positive, with_stages

if TYPE_CHECKING:  # types only: the commands import nothing heavy before they run
    from ..comm.trace import Trace
    from ..examples.tracing import TraceQuery

SIZES = (*SIZED, "world")  # a layout's sizes as the flags give them (layout/axes.py), and its GPUs


def add_trace(sub: Any) -> None:
    tr = sub.add_parser(
        "trace",
        help="follow one token through a layout, collective by collective",
        description="Run the post's MoE example (4 layers, 8 experts, top-2, 8-token sequences) "
        "for one training step on virtual ranks, on the moe16 layout (TP2 x CP2 x DP2 "
        "attention, EP4 experts, PP2, SP) or any other, and follow one token: which "
        "GPU holds it, every collective it takes part in, where the router sends it, "
        "the pipeline hand-off and the gradient sums; then check the run against "
        "the unsplit model.",
        epilog="example: parasim trace --tp 2 --cp 2 --pp 2 --ep 4 --sp --world 16 --token t6",
    )
    add_example(tr)
    tr.add_argument("--layout", metavar="NAME", help="a preset (default: the example's, moe16); or give sizes instead")
    add_sizes(tr, said={"dp": "default: derived", "etp": "default 1"})
    tr.add_argument("--world", type=positive, metavar="N", help="GPUs (default: tp x cp x pp x dp)")
    tr.add_argument(
        "--sp",
        "--sequence-parallel",
        dest="sp",
        action="store_true",
        help="sequence parallelism (an MoE model with TP needs it)",
    )
    tr.add_argument("--experts", type=count, metavar="N", help="experts per layer (default 8; 0: a dense model)")
    tr.add_argument(
        "--layers",
        type=positive,
        metavar="L",
        help="layers (default 4; divide by pp unless the layers on stages are given)",
    )
    tr.add_argument(
        "--gpus-per-node", type=positive, metavar="N", help="GPUs per node, for the bytes that cross nodes (default 8)"
    )
    tr.add_argument(
        "--split",
        choices=("contiguous", "zigzag"),
        help="how CP splits the sequence (moe16: contiguous, as the post draws it)",
    )
    tr.add_argument(
        "--cp-comm",
        choices=CP_COMMS,
        help="how CP ranks share K and V: p2p, a ring beside attention (default); all_gather, the whole sequence's "
        "K and V gathered first, as Llama 3 trained (its preset llama3-405b-long)",
    )
    tr.add_argument("--microbatches", "-m", type=positive, metavar="M", help="micro-batches per DP replica (default 2)")
    tr.add_argument(
        "--routing",
        default="learned",
        metavar="HOW",
        help="learned: the run's own router (default); "
        "post: the post's drawn routing for its sentence (contract -> E3 (gate 0.6) and E8 (0.4), the -> "
        f"E1 and E2); or a policy, seeded: {policy_help()}",
    )
    tr.add_argument(
        "--seq",
        type=positive,
        metavar="N",
        help="tokens per sequence of a real-size step on a full-size preset with --symbolic (default 4,096)",
    )
    tr.add_argument(
        "--symbolic",
        action="store_true",
        help="run on symbolic ranks: shapes and bytes, no values "
        "(needs a routing policy; nothing to check against the unsplit model); with a full-size preset "
        "(--layout deepseek-v3, megatron-8.3b, 27b-...) one training step at real size, one GPU's "
        "view (--gpu N)",
    )
    tr.add_argument(
        "--token",
        default="contract",
        help="a word of sequence A (its first occurrence), or t1..t8, "
        "or SEQ:WORD for the other sequences (B, C, D, then E, F, ... on wider DP) (default: contract)",
    )
    tr.add_argument(
        "--gpu",
        type=count,
        metavar="N",
        help="instead of a token, one GPU: what it stores (weight "
        "shards, whole copies, experts, optimizer share, tokens) and every collective it joins",
    )
    tr.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the layout with the followed token's path on it: "
        "dispatch, combine and the pipeline hand-off, numbered in order",
    )
    tr.add_argument("--all", action="store_true", help="list every backward event too")
    shown = tr.add_mutually_exclusive_group()  # the app never returns to print JSON after it
    shown.add_argument(
        "--json",
        action="store_true",
        help='print {"token", "sequence", "position", "layout", "steps": [...], "exactness": {...}}',
    )
    tr.add_argument(
        "--gpu-model",
        default="h200",
        metavar="NAME",
        help="with --symbolic --gpu: the GPU preset "
        "the step's time and the fit of its peak are worked out for (h200, h100, h800, a100, b200; default "
        "h200; its constants: parasim hardware)",
    )
    from ..layout.precision import PRECISIONS

    tr.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        metavar="NAME",
        help="with --symbolic at real size: the dtype of each kind of tensor the step computes and sends "
        f"in ({', '.join(PRECISIONS)}; default post, the post's BF16; with --megatron, the job's)",
    )
    tr.add_argument(
        "--no-flash",
        action="store_true",
        help="with --symbolic at real size: keep the s x s "
        "attention scores (no FlashAttention), as `parasim memory --no-flash` counts them",
    )
    shown.add_argument(
        "--app",
        action="store_true",
        help="open the run in the app instead (a real-size world "
        "opens with its ranks folded by axis: a row per data-parallel group)",
    )
    add_stages(tr)
    from .megatron import add_megatron

    add_megatron(
        tr,
        write=False,
        what="model and layout, at real size on symbolic ranks (implies --symbolic and "
        "--routing balanced; give --gpu N or --app)",
    )
    from .megatron import add_job

    add_job(tr)
    tr.add_argument(
        "--config",
        metavar="FILE",
        help="with --job: the model (a Hugging Face config.json) for a job file that names none of its own "
        "(DeepSpeed, picotron)",
    )
    tr.set_defaults(func=cmd_trace)


def add_example(parser: Any) -> None:
    """`--example NAME`: the worked example to run (examples/worked.py); trace, compare layout and serve take it."""
    from ..examples.worked import DEFAULT, EXAMPLES

    parser.add_argument(
        "--example",
        choices=tuple(EXAMPLES),
        default=DEFAULT,
        help=f"the worked example to follow a token through (default {DEFAULT})",
    )


class Traced(NamedTuple):
    """What `parasim trace` follows a token through: the layout, its name, and the Megatron-LM job it came from
    (--megatron FILE, read once; None otherwise), whose step choices the real-size step takes."""

    layout: Any
    name: str
    job: Any = None
    source: str | None = None  # the flag and file the job came from ("--job ds.json"), for a refusal's advice


def layout_of_args(args: argparse.Namespace) -> Traced:
    """The layout to trace, and its name: a preset, or the sizes given (with the example's model)."""
    from ..examples.worked import example
    from ..layout import Layout, preset

    ex = example(args.example)
    sizes = {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    model_flags = args.experts is not None or args.layers is not None
    if getattr(args, "megatron", None) is not None or getattr(args, "job", None) is not None:
        return _job_layout(args, sizes)  # (parasim compare builds its own arguments, without either)
    from .megatron import read_megatron

    read_megatron(args)  # variables for a script (--megatron-env) without the script: refused in one line
    if getattr(args, "config", None) is not None:
        raise UsageError("--config gives the model of a --job file that names none: give it with --job FILE")
    if args.layout is not None and (sizes or args.sp or model_flags):
        raise UsageError("give either --layout NAME or sizes (--tp, --experts, ...), not both")
    split = {} if args.split is None else {"zigzag": args.split == "zigzag"}
    if getattr(args, "cp_comm", None) is not None:  # parasim compare's arguments have no --cp-comm
        split["cp_comm"] = args.cp_comm
    if args.gpus_per_node is not None:
        split["gpus_per_node"] = args.gpus_per_node
    if not sizes and not args.sp and not model_flags:
        layout = preset(args.layout or ex.layout)
        return Traced(replace(layout, model=with_stages(args, layout.model), **split), args.layout or ex.layout)
    small = ex.model  # sizes given without a preset: the example's own small model on them
    experts = small.experts if args.experts is None else args.experts
    model = with_stages(
        args,
        replace(
            small,
            experts=experts,
            top_k=min(small.top_k, experts) if experts else None,
            layers=args.layers or small.layers,
        ),
    )
    sizes.setdefault("etp", 1)
    layout = Layout(**sizes, sp=args.sp, model=model, **{"zigzag": False, **split})
    return Traced(layout, str(layout))


def _job_layout(args: argparse.Namespace, sizes: dict) -> Traced:
    """`--megatron FILE` or `--job FILE`: the job's model and layout at real size (sizes given here replace the
    job's); the run is symbolic, routed by the balanced policy (what a folded real-size step needs)."""
    from ..megatron.job import layout_of
    from .megatron import check_not_both, job_model, print_job, read_job_arg, read_megatron

    flag = "--megatron" if args.megatron is not None else "--job"
    if args.layout is not None:
        raise UsageError(f"give either --layout NAME or {flag} FILE, not both")
    check_not_both(args)
    job = read_megatron(args) or read_job_arg(args)
    model = with_stages(args, replace(job_model(args, job), seq=args.seq or job.seq))
    layout = layout_of(job, model, **sizes, sp=args.sp or None)
    print_job(job, args)
    path = args.megatron or args.job
    return Traced(layout, path.rsplit("/", 1)[-1], job, f"{flag} {path}")


def trace_query(args: argparse.Namespace, traced: Traced) -> TraceQuery:
    """The flags as the library takes them."""
    from ..examples.tracing import TraceQuery

    return TraceQuery(
        traced.layout,
        traced.name,
        example=args.example,
        microbatches=args.microbatches,
        routing=args.routing,
        token=args.token,
        symbolic=args.symbolic,
        gpu_model=args.gpu_model,
        job=traced.job,
        source=traced.source,
        seq=args.seq,
        flash=not args.no_flash,
        precision=args.precision,
    )


def cmd_trace(args: argparse.Namespace) -> int:
    from ..estimate.traffic import gpu_spec
    from ..examples.tracing import gpu_view, token_trace, traced_step

    traced = layout_of_args(args)
    gpu_spec(args.gpu_model, "--gpu-model")  # refused before anything runs
    q = trace_query(args, traced)
    if args.app:
        if q.at_scale:
            check_app_gpus(q.layout.world, q.microbatches or q.layout.pp)  # a real-size step's default: PP's
        need_terminal("--app")
    if q.at_scale and args.gpu is None and not args.app:
        raise UsageError("at real size there is no word to follow: give --gpu N for one GPU's view, or --app")
    if args.plot is not None and not q.at_scale:
        check_plot_gpus(q.layout.world)
    step = traced_step(q, args.gpu, progress=progress_line)
    if args.app:
        if q.at_scale:  # its what-if key runs the step again at other sizes
            from ..tui.whatif import StepWhatIf

            whatif = StepWhatIf(q, step)
            return _app(step.result.trace, whatif.title, whatif)
        return _app(step.result.trace, f"{q.name}: one training step")
    if args.gpu is not None or q.at_scale:
        view = gpu_view(q, args.gpu, step)
        if args.json:
            print_json(view.to_dict())
        else:
            print("\n".join(gpu_text(view.view, view.value, q.name, step.routing)))
        return 0 if view.ok else 1
    traced_path = token_trace(q, step)
    path = traced_path.path
    if args.plot is not None:
        from ..render.plots import plot_token_path

        plot_token_path(
            step.layout,
            path,
            step.result.trace,
            args.plot,
            f"{q.name}: the path of {path['token']!r} "
            f"(t{path['position']} of sequence {path['sequence']}) through one forward pass",
        )
    if args.json:
        print_json(traced_path.to_dict())
        return 0
    print("\n".join(path_text(path, q.name, step.layout, args.routing, args.symbolic, args.all)))
    return 0 if traced_path.ok else 1


def _app(trace: Trace, title: str, whatif: Any = None) -> int:
    from .common import open_app

    open_app(trace, {}, title, whatif=whatif)
    return 0

"""`parasim trace`: follow one token through one training step of the MoE example, on any layout."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import UsageError
from ..limits import TRACE_EXPERT_LAYERS, TRACE_PASSES, at_most, check_plot_gpus
from ..layout.axes import SIZED
from ..nn.routing import policy_help
from ..render.token_path import gpu_text, joins, path_text
from .common import add_sizes, add_stages, count, gpu_preset, need_terminal, print_json, positive, with_stages

if TYPE_CHECKING:  # a type only: the commands import nothing heavy before they run
    from ..comm.trace import Trace

SIZES = (*SIZED, "world")  # a layout's sizes as the flags give them (layout/axes.py), and its GPUs


def add_trace(sub: Any) -> None:
    tr = sub.add_parser("trace", help="follow one token through a layout, collective by collective",
                        description="Run the post's MoE example (4 layers, 8 experts, top-2, 8-token sequences) "
                                    "for one training step on virtual ranks, on the moe16 layout (TP2 x CP2 x DP2 "
                                    "attention, EP4 experts, PP2, SP) or any other, and follow one token: which "
                                    "GPU holds it, every collective it takes part in, where the router sends it, "
                                    "the pipeline hand-off and the gradient sums; then check the run against "
                                    "the unsplit model.",
                        epilog="example: parasim trace --tp 2 --cp 2 --pp 2 --ep 4 --sp --world 16 --token t6")
    add_example(tr)
    tr.add_argument("--layout", metavar="NAME", help="a preset (default: the example's, moe16); or give sizes "
                    "instead")
    add_sizes(tr, said={"dp": "default: derived", "etp": "default 1"})
    tr.add_argument("--world", type=positive, metavar="N", help="GPUs (default: tp x cp x pp x dp)")
    tr.add_argument("--sp", action="store_true", help="sequence parallelism (an MoE model with TP needs it)")
    tr.add_argument("--experts", type=count, metavar="N", help="experts per layer (default 8; 0: a dense model)")
    tr.add_argument("--layers", type=positive, metavar="L", help="layers (default 4; divide by pp unless the layers "
                    "on stages are given)")
    tr.add_argument("--gpus-per-node", type=positive, metavar="N", help="GPUs per node, for the bytes that cross "
                    "nodes (default 8)")
    tr.add_argument("--split", choices=("contiguous", "zigzag"), help="how CP splits the sequence (moe16: "
                    "contiguous, as the post draws it)")
    tr.add_argument("--microbatches", "-m", type=positive, metavar="M", help="micro-batches per DP replica (default 2)")
    tr.add_argument("--routing", default="learned", metavar="HOW", help="learned: the run's own router (default); "
                    "post: the post's drawn routing for its sentence (contract -> E3 (gate 0.6) and E8 (0.4), the -> "
                    f"E1 and E2); or a policy, seeded: {policy_help()}")
    tr.add_argument("--seq", type=positive, metavar="N", help="tokens per sequence of a real-size step on a "
                    "full-size preset with --symbolic (default 4,096)")
    tr.add_argument("--symbolic", action="store_true", help="run on symbolic ranks: shapes and bytes, no values "
                    "(needs a routing policy; nothing to check against the unsplit model); with a full-size preset "
                    "(--layout deepseek-v3, megatron-8.3b, 27b-...) one training step at real size, one GPU's "
                    "view (--gpu N)")
    tr.add_argument("--token", default="contract", help="a word of sequence A (its first occurrence), or t1..t8, "
                    "or SEQ:WORD for the other sequences (B, C, D, then E, F, ... on wider DP) (default: contract)")
    tr.add_argument("--gpu", type=count, metavar="N", help="instead of a token, one GPU: what it stores (weight "
                    "shards, whole copies, experts, optimizer share, tokens) and every collective it joins")
    tr.add_argument("--plot", metavar="FILE.png", help="also draw the layout with the followed token's path on it: "
                    "dispatch, combine and the pipeline hand-off, numbered in order")
    tr.add_argument("--all", action="store_true", help="list every backward event too")
    shown = tr.add_mutually_exclusive_group()  # the app never returns to print JSON after it
    shown.add_argument("--json", action="store_true",
                       help='print {"token", "sequence", "position", "layout", "steps": [...], "exactness": {...}}')
    tr.add_argument("--gpu-model", default="h200", metavar="NAME", help="with --symbolic --gpu: the GPU preset "
                    "the step's time and the fit of its peak are worked out for (h200, h100, h800, a100, b200; default "
                    "h200; its constants: parasim hardware)")
    from ..layout.precision import PRECISIONS
    tr.add_argument("--precision", choices=tuple(PRECISIONS), metavar="NAME",
                    help="with --symbolic at real size: the dtype of each kind of tensor the step computes and sends "
                         f"in ({', '.join(PRECISIONS)}; default post, the post's BF16; with --megatron, the job's)")
    tr.add_argument("--no-flash", action="store_true", help="with --symbolic at real size: keep the s x s "
                    "attention scores (no FlashAttention), as `parasim memory --no-flash` counts them")
    shown.add_argument("--app", action="store_true", help="open the run in the app instead (a real-size world "
                       "opens with its ranks folded by axis: a row per data-parallel group)")
    add_stages(tr)
    from .megatron import add_megatron
    add_megatron(tr, write=False, what="model and layout, at real size on symbolic ranks (implies --symbolic and "
                 "--routing balanced; give --gpu N or --app)")
    tr.set_defaults(func=cmd_trace)


def add_example(parser: Any) -> None:
    """`--example NAME`: the worked example to run (examples/worked.py); trace, compare layout and serve take it."""
    from ..examples.worked import DEFAULT, EXAMPLES
    parser.add_argument("--example", choices=tuple(EXAMPLES), default=DEFAULT,
                        help=f"the worked example to follow a token through (default {DEFAULT})")


class Traced(NamedTuple):
    """What `parasim trace` follows a token through: the layout, its name, and the Megatron-LM job it came from
    (--megatron FILE, read once; None otherwise), whose step choices the real-size step takes."""

    layout: Any
    name: str
    job: Any = None


def layout_of_args(args: argparse.Namespace) -> Traced:
    """The layout to trace, and its name: a preset, or the sizes given (with the example's model)."""
    from ..examples.worked import example
    from ..layout import Layout, preset
    ex = example(args.example)
    sizes = {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    model_flags = args.experts is not None or args.layers is not None
    if getattr(args, "megatron", None) is not None:  # parasim compare builds its own arguments, without it
        return _job_layout(args, sizes)
    from .megatron import read_megatron
    read_megatron(args)  # variables for a script (--megatron-env) without the script: refused in one line
    if args.layout is not None and (sizes or args.sp or model_flags):
        raise UsageError("give either --layout NAME or sizes (--tp, --experts, ...), not both")
    split = {} if args.split is None else {"zigzag": args.split == "zigzag"}
    if args.gpus_per_node is not None:
        split["gpus_per_node"] = args.gpus_per_node
    if not sizes and not args.sp and not model_flags:
        layout = preset(args.layout or ex.layout)
        return Traced(replace(layout, model=with_stages(args, layout.model), **split), args.layout or ex.layout)
    small = ex.model  # sizes given without a preset: the example's own small model on them
    experts = small.experts if args.experts is None else args.experts
    model = with_stages(args, replace(small, experts=experts, top_k=min(small.top_k, experts) if experts else None,
                                      layers=args.layers or small.layers))
    sizes.setdefault("etp", 1)
    layout = Layout(**sizes, sp=args.sp, model=model, **{"zigzag": False, **split})
    return Traced(layout, str(layout))


def _job_layout(args: argparse.Namespace, sizes: dict) -> Traced:
    """`--megatron FILE`: the job's model and layout at real size (sizes given here replace the job's); the
    run is symbolic, routed by the balanced policy (what a folded real-size step needs)."""
    from ..megatron.job import layout_of
    from .megatron import job_model, print_job, read_megatron
    if args.layout is not None:
        raise UsageError("give either --layout NAME or --megatron FILE, not both")
    job = read_megatron(args)
    model = with_stages(args, replace(job_model(args, job), seq=args.seq or job.seq))
    layout = layout_of(job, model, **sizes, sp=args.sp or None)
    print_job(job, args)
    return Traced(layout, args.megatron.rsplit("/", 1)[-1], job)


def cmd_trace(args: argparse.Namespace) -> int:
    from ..engine.runner import run
    from ..examples.worked import example
    ex = example(args.example)

    if args.app:
        need_terminal("--app")
    layout, name, job = layout_of_args(args)
    gpu_preset(args.gpu_model, "--gpu-model")  # refused before anything runs
    # a Megatron-LM job is at real size: one step on symbolic ranks, as --symbolic runs a full-size preset
    if (args.symbolic or getattr(args, "megatron", None) is not None) and not _is_example(layout, ex.seq):
        return _at_scale(args, layout, name, job)
    if args.seq is not None:
        raise UsageError("--seq sets a real-size step's sequence: use it with --symbolic and a full-size preset")
    if args.no_flash:  # the example's small layers keep their scores already: there are real values to keep
        raise UsageError("--no-flash is a choice of a real-size step: use it with --symbolic and a full-size preset")
    if args.precision is not None:  # the example's token path compares values: it runs exact, in float64
        raise UsageError("--precision is a choice of a real-size step: use it with --symbolic and a full-size preset")
    m = args.microbatches or ex.micro_batches
    ex.check_runnable(layout, m, args.routing)
    _check_size(layout, m)
    if args.plot is not None:
        check_plot_gpus(layout.world)
    reps = ex.replicas(layout.dp, m)
    watch = ex.find_token(args.token, [s for rep in reps for s in rep])
    if args.gpu is not None and not 0 <= args.gpu < layout.world:
        raise UsageError(f"--gpu {args.gpu}: the layout has GPUs 0-{layout.world - 1}")
    if args.symbolic and args.routing in ex.routings:
        raise UsageError("--symbolic has no router scores to route by: give --routing uniform, balanced or skewed:F")
    result = run(ex.make_program(watch, layout, m, args.routing), layout.world, "symbolic" if args.symbolic else "virtual",
                 seed=0)
    if args.app:
        return _app(result.trace, f"{name}: one training step")
    if args.gpu is not None:
        return _gpu_view(args, result, layout, name, m, gpu=args.gpu, routing=args.routing, symbolic=args.symbolic)
    path = ex.token_path(result.trace, watch, reps, name)
    if args.plot is not None:
        from ..render.plots import plot_token_path
        plot_token_path(layout, path, result.trace, args.plot, f"{name}: the path of {path['token']!r} "
                        f"(t{path['position']} of sequence {path['sequence']}) through one forward pass")
    path["routing"] = args.routing
    path["backend"] = result.trace.backend
    # the unsplit model routes by its own router: a policy's choices (and symbolic ranks' missing values)
    # leave nothing to compare
    path["exactness"] = (ex.exactness(result.values, layout, m, args.routing) if args.routing in ex.routings
                         else None)
    path["bytes_by_link"] = {"gpus_per_node": layout.gpus_per_node,
                             "by_group": result.trace.bytes_by_link(layout.gpus_per_node)}
    if args.json:
        print_json(path)
        return 0
    print("\n".join(path_text(path, name, layout, args.routing, args.symbolic, args.all)))
    x = path["exactness"]
    return 0 if x is None or x["exact"] else 1


def _gpu_view(args: argparse.Namespace, result: Any, layout: Any, name: str, m: int, plan: Any = None, *,
              gpu: int, routing: str, symbolic: bool) -> int:
    """`--gpu N`: what one GPU keeps and every kind of collective it joins, with its bytes; for a real-size
    step (`plan`: the estimator's plan it ran), what its peak assumes and whether it fits the GPU."""
    from ..examples.worked import example
    ex = example(args.example)
    g = gpu
    value = result.values[g]
    out = {"gpu": g, "layout": name, "sizes": {a: getattr(layout, a) for a in SIZED},
           "coords": value["coords"], "stores": value["stores"],
           "experts_per_layer": [[x + 1 for x in layer] for layer in value["experts"]],
           "does": joins(result.trace, g),
           "backend": result.trace.backend,
           "peak": result.trace.peak(g) if any(mk.kind == "held" for mk in result.trace.marks) else None,
           "exactness": ex.exactness(result.values, layout, m, routing) if routing in ex.routings else None}
    if plan is not None and out["peak"] is not None:
        from ..estimate.memory import assumptions, items
        from ..train.differences import as_run
        gpu = gpu_preset(args.gpu_model, "--gpu-model")
        seq, stage = layout.model.seq, value["coords"]["pp"]
        # the estimator's own figure for this GPU's stage, as `parasim memory` gives it (its model's shapes,
        # not the step's code: `parasim memory --symbolic` itemises the difference)
        estimate = sum(float(a + b * seq + c * seq * seq) for a, b, c in items(layout.model, plan, stage).values())
        out["peak"].update(assumes=assumptions(as_run(plan)), gpu_model=gpu.name, usable=gpu.usable,
                           card=gpu.memory, fits=out["peak"]["bytes"] <= gpu.usable, estimate=estimate)
    if "flops" in result.trace.meta and symbolic:
        from ..estimate.kernels import NoMeasurement
        try:
            out["time"] = _times(args, result.trace, layout, g, m, plan)
        except NoMeasurement as exc:  # the GPU type's datasheet holds, a kernel table does not: the peak stands
            out["time"] = {"gpu": gpu_preset(args.gpu_model, "--gpu-model").name, "step_s": None, "why": str(exc)}
    ok = out["exactness"] is None or out["exactness"]["exact"]
    if args.json:
        print_json(out)
        return 0 if ok else 1
    print("\n".join(gpu_text(out, value, name, routing)))
    return 0 if ok else 1


def _times(args: argparse.Namespace, trace: Trace, layout: Any, g: int, m: int, plan: Any = None) -> dict:
    """The step on the clock (parasim/clock): every event of the run timed on the GPU type, this GPU's
    compute, communication and idle time, the busiest GPU and the critical path; tokens per second per GPU
    and MFU (the model's FLOPs without recomputation, estimate.traffic.step_flops, over the GPUs' peak)."""
    from ..clock.costs import machine
    from ..clock.timeline import simulate
    gpu_preset(args.gpu_model, "--gpu-model")
    tl = simulate(trace, machine(args.gpu_model, layout.gpus_per_node))  # bytes as the run's precision sent them
    busiest = max(range(trace.world), key=lambda r: (tl.busy[r], -r))
    flops = trace.meta.get("flops") or [0] * trace.world
    seq = layout.model.seq
    tokens = seq * m * layout.dp * (plan.micro_batch if plan is not None else 1)
    extra = {"tokens_per_s_per_gpu": tokens / tl.step / trace.world if tl.step else 0.0}
    if plan is not None and tl.step:
        from ..estimate.traffic import step_flops
        model_flops = step_flops(layout.model, replace(plan, recompute="none"), seq)["total"]
        extra["mfu"] = model_flops / (tl.step * trace.world * tl.machine.peak_flops)
    from ..clock.uncertainty import family_range, held_out, trace_family
    extra["range"] = family_range(trace_family(trace), args.gpu_model, held_out()).to_dict(tl.step)
    return {"gpu": tl.machine.name, "step_s": tl.step, "critical": tl.critical_split(), **extra,
            "this": {"rank": g, "flops": flops[g], "compute_s": tl.busy[g], "comm_s": tl.comm[g],
                     "idle_s": tl.idle(g)},
            "busiest": {"rank": busiest, "compute_s": tl.busy[busiest]}}


def _is_example(layout: Any, seq: int) -> bool:
    """The example's own small model (`seq`-token sequences), which follows a word; else a model at real size."""
    return layout.model is not None and layout.model.seq in (None, seq) and layout.model.hidden <= 64


def _at_scale(args: argparse.Namespace, layout: Any, name: str, job: Any) -> int:
    """A preset at its real size on symbolic ranks: one training step (train/step.py), the ranks of each
    stage folded onto one, and one GPU's view of it."""
    from ..engine.runner import run
    from ..estimate.memory import Plan
    from ..train.against import step_layout
    from ..train.step import make_step
    from ..limits import check_symbolic_step
    from ..engine.symbolic.fold import fold_of

    if args.gpu is None and not args.app:
        raise UsageError("at real size there is no word to follow: give --gpu N for one GPU's view, or --app")
    gpu = 0 if args.gpu is None else args.gpu  # the app's view of a real-size step opens on GPU 0
    if not 0 <= gpu < layout.world:
        raise UsageError(f"--gpu {gpu}: the layout has GPUs 0-{layout.world - 1}")
    model = layout.model
    if model is None:
        raise UsageError(f"{name} has no model to run: give a preset with one (deepseek-v3, megatron-8.3b, 27b-...)")
    if args.seq is not None or not model.seq:  # presets of full models leave the sequence to the run
        layout = replace(layout, model=replace(model, seq=args.seq or 4096))
    # the default (learned) has no router scores to route by at real size: the step routes by the balanced
    # policy, what a folded step needs (a dense model routes nothing)
    if layout.model.experts and args.routing not in ("learned", "balanced"):
        raise UsageError("a real-size step folds ranks that do the same work, which needs --routing balanced "
                         "(every GPU routes alike)")
    routing = "balanced"
    m = args.microbatches or layout.pp
    check_symbolic_step(layout.model.seq, m, layout.pp)
    # one memory model: the step runs the estimator's plan of this layout (FlashAttention unless --no-flash,
    # dropout masks), built as `parasim memory --symbolic` builds it, so this GPU's peak is the one it shows
    # `job`: a Megatron job's step choices, as `memory --megatron` takes them
    choices = {} if job is None else {"dropout": job.step["dropout"], "recompute": job.step["recompute"],
                                      "flash": job.step["flash"] and not args.no_flash,
                                      "precision": job.step["precision"]}
    if args.precision is not None:
        choices["precision"] = args.precision
    plan = Plan.of(layout, **{"microbatches": m, "flash": not args.no_flash, **choices})
    try:
        layout = replace(layout, model=step_layout(layout.model, plan, layout.model.seq).model)
    except UsageError as exc:
        if job is None:
            raise
        raise UsageError(f"{exc}; parasim memory --megatron {args.megatron} estimates the job as it is") from None
    fold = fold_of(layout, around=gpu)  # the GPU asked about runs itself: its values are its own
    print(f"running one step of {name} on {layout.world:,} symbolic GPUs ({len(set(fold))} run, the rest folded "
          f"onto them), {m} micro-batches of {layout.model.seq:,} tokens ...", file=sys.stderr, flush=True)
    result = run(make_step(layout, m, routing), layout.world, "symbolic", fold=fold, precision=plan.precision)
    if args.app:
        return _app(result.trace, f"{name}: one training step on {layout.world:,} symbolic GPUs")
    return _gpu_view(args, result, layout, name, m, plan, gpu=gpu, routing=routing, symbolic=True)


def _check_size(layout: Any, m: int) -> None:
    """The example's step runs every GPU's layers for every micro-batch on virtual ranks, and holds and
    checks every expert of every layer: both bounded by what runs in seconds."""
    model = layout.model
    at_most(f"GPUs x micro-batches x layers of the token trace ({layout.world:,} x {m:,} x {model.layers:,})",
            layout.world * m * model.layers, TRACE_PASSES, "virtual ranks run each one for real, a few ms each")
    at_most(f"experts x layers of the token trace ({model.experts:,} x {model.layers:,})",
            model.experts * model.layers, TRACE_EXPERT_LAYERS, "every expert's weights are made, run and checked")


def _app(trace: Trace, title: str) -> int:
    from .common import open_app
    open_app(trace, {}, title)
    return 0

"""`parasim memory` and `parasim fit`: the estimator from the command line. Bad input: one line, exit 2."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from typing import Any

from ..errors import UsageError
from ..layout.mesh import CP_COMMS
from ..limits import SEARCH_TOP, number_arg, size_arg
from ..render.text import markup_safe, printable_lines
from ..nn.routing import policy_help
from .common import add_sizes, add_stages, count, positive_up_to, print_json, progress_line, with_stages
from ..job.query import JobQuery, Sources, Units
from .megatron import read_megatron

_TOKENS = re.compile(r"([0-9]+)(?:\.([0-9]+))?([KM])", re.IGNORECASE)  # 4K, 1.5M


def _pos(text: str) -> int:
    """A positive integer in digits; a K or M suffix multiplies by 1,024 or 1,024^2, as context lengths and
    vocabularies are quoted (a 32K context is 32,768 tokens, a 128K vocabulary 131,072 entries)."""

    def parse(t: str) -> int:
        m = _TOKENS.fullmatch(t)
        if m is None:
            from ..limits import digits

            return digits(t)
        whole, frac, unit = m.groups()
        mult = 1024 if unit.upper() == "K" else 1024**2
        value = int(whole) * mult + (int(frac) * mult // 10 ** len(frac) if frac else 0)  # exact: no float
        return value

    return size_arg(parse, text)


def _number(low: float, high: float, what: str) -> Any:
    def parse(text: str) -> float:
        return number_arg(text, low, high, what)

    return parse


def _common(p: argparse.ArgumentParser, search: bool = False, runs: bool = True) -> None:
    """The flags that give a model, a layout and the training choices; `runs`: also --emit, --symbolic and
    --routing (memory and fit, not check-layout)."""
    m = p.add_argument_group("model (one of --model, --config, or the sizes)")
    m.add_argument("--model", metavar="NAME", help="a preset: 27b, moe16, deepseek-v3, megatron-8.3b")
    m.add_argument("--config", metavar="FILE", help="a Hugging Face config.json (dense or MoE)")
    for flag, what in (
        ("--layers", "layers"),
        ("--hidden", "hidden size"),
        ("--heads", "attention heads"),
        ("--vocab", "vocabulary size"),
        ("--kv-heads", "key/value heads (GQA)"),
        ("--ffn", "MLP width (default 4 x hidden)"),
        ("--experts", "routed experts per MoE layer"),
        ("--top-k", "experts per token"),
        ("--expert-ffn", "one expert's MLP width"),
    ):
        m.add_argument(flag, type=_pos, metavar="N", help=what)
    m.add_argument(
        "--params",
        type=_number(1, 1e15, "a parameter count"),
        metavar="P",
        help="stated parameter count (e.g. 27e9); default: counted from the shapes",
    )
    y = p.add_argument_group("layout" + (" (ignored by --search, which tries them all)" if search else ""))
    add_sizes(y, _pos, {"dp": "default: derived from --gpus", "etp": "default 1"})
    y.add_argument("--gpus", type=_pos, metavar="N", help="GPUs in all (default: tp x cp x pp x dp)")
    y.add_argument("--sp", "--sequence-parallel", dest="sp", action="store_true", help="sequence parallelism")
    y.add_argument(
        "--cp-comm",
        choices=CP_COMMS,
        default=None,
        help="how CP ranks share K and V: p2p, a ring (default); all_gather, gathered before attention (Llama 3's)",
    )
    y.add_argument(
        "--zero",
        type=count,
        choices=(0, 1, 2, 3),
        default=None,
        help="ZeRO stage over dp x cp (default 1: the distributed optimizer"
        + ("; --search tries all unless given)" if search else ")"),
    )
    y.add_argument(
        "--recompute",
        nargs="?",
        const="full",
        choices=("none", "selective", "full"),
        default=None,
        help="activation recomputation (bare --recompute: full)",
    )
    t = p.add_argument_group("training and hardware")
    t.add_argument("--no-flash", action="store_true", help="keep the s x s attention scores (no FlashAttention)")
    t.add_argument("--no-dropout", action="store_true", help="no dropout masks kept")
    t.add_argument("--micro-batch", type=_pos, metavar="B", help="sequences per micro-batch (default 1)")
    t.add_argument("--microbatches", type=_pos, metavar="M", help="micro-batches per step (default: pp)")
    t.add_argument("--chunked-loss", action="store_true", help="compute the loss in chunks: no whole logits")
    from ..layout.precision import PRECISIONS

    t.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        metavar="NAME",
        help="the dtype of each kind of tensor, as a framework keeps and sends it: "
        f"{', '.join(PRECISIONS)} (default: post, the post's 2 + 2 + 12 bytes a parameter; with "
        "--megatron, the job's: megatron-bf16 for --bf16)",
    )
    from ..estimate.dispatch import DISPATCHERS
    from ..estimate.fusion import FUSIONS
    from ..estimate.kernels import KERNELS

    t.add_argument(
        "--attention-kernel",
        choices=KERNELS,
        default=None,
        help="the attention kernel the framework runs, for the step's time: cudnn (cuDNN's fused "
        "attention, TransformerEngine's on a B200; measured there only), fa3 (TransformerEngine's "
        "class on Hopper), fa2 (PyTorch's SDPA, the flash-attn 2 package) or fa1 (flash-attn 1.x, "
        "A100 only); default: the first of these measured on the GPU",
    )
    t.add_argument(
        "--fusion",
        choices=tuple(FUSIONS),
        default=None,
        help="how the framework runs a layer's elementwise work, for the step's time: megatron (fused "
        "kernels, the default) or torch-eager (one kernel per operation: torchtitan without "
        "torch.compile)",
    )
    t.add_argument(
        "--dispatcher",
        choices=tuple(DISPATCHERS),
        default=None,
        help="how an MoE layer's tokens reach their experts, for the step's time: alltoall (NCCL's "
        "all-to-all, each of a token's top-k copies; the default) or deepep / hybridep (once to "
        "each GPU and node that needs it)",
    )
    t.add_argument(
        "--gpu",
        default="h200",
        help="GPU preset: h200 (default), h100, h800, a100, b200 (b200: memory "
        "only, its kernels are not all measured yet)",
    )
    t.add_argument(
        "--usable",
        type=_number(0.001, 1e6, "usable memory per GPU in GB"),
        metavar="GB",
        help="usable memory per GPU in GB (GiB with --gib); default: the GPU's (120 GB of an H200)",
    )
    from ..clock.overlaps import PLAN, names

    t.add_argument(
        "--overlap",
        metavar="LIST",
        help=f"communication the step runs beside compute, for its time: a comma-separated list of "
        f"{', '.join(names(PLAN))}, or all, or none (the default; with --megatron, the job's); "
        "dualpipe is modelled on a run's trace (lessons), not in a plan's step",
    )
    t.add_argument("--gib", action="store_true", help="units of 2^30 bytes instead of GB = 1e9 bytes")
    t.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_stages(p)
    from .megatron import add_megatron

    add_megatron(p, search=search)
    from .megatron import add_job

    add_job(p, emit=runs, model_beside=True)
    if not runs:
        return
    r = p.add_argument_group("against a run")
    r.add_argument(
        "--symbolic",
        action="store_true",
        help="also run the step on symbolic ranks (real sizes, "
        "no values; train/step.py) and show the run's figures beside the estimate, item by item",
    )
    r.add_argument(
        "--routing",
        default="balanced",
        metavar="HOW",
        help=f"with --symbolic, MoE routing by a policy ({policy_help()}); balanced by default, as a folded step needs",
    )


def add_estimate_commands(sub: Any) -> None:
    mp = sub.add_parser(
        "memory",
        help="memory per GPU, itemised, for a model and layout",
        description="Estimate memory per GPU item by item: weights, gradients, optimizer states "
        "(ZeRO 0-3), activations, in-flight micro-batches, recomputation, logits; "
        "plus the step's traffic and time. GB = 1e9 bytes unless --gib.",
    )
    _common(mp)
    mp.add_argument(
        "--seq",
        type=_pos,
        metavar="S",
        help="sequence length (default 4096, or the job's --seq-length with --megatron; 32K = 32,768: write 32000 for 32,000)",
    )
    mp.add_argument("--plot", metavar="FILE.png", help="stacked bars of the items, for ZeRO stages 0-3")
    mp.add_argument(
        "--app",
        action="store_true",
        help="the estimator as a live view on this terminal (or in a browser: parasim serve --memory ARGS): "
        "move the model, sequence, micro-batch, degrees, ZeRO, recomputation and GPU with the arrow keys "
        "and watch the memory, the fit and the step's time change",
    )
    mp.add_argument(
        "--critic",
        action="store_true",
        help="hold the layout to the rules of thumb, as parasim check-layout does: each one it breaks, with "
        "the step and memory of the same GPUs following it",
    )
    mp.set_defaults(func=cmd_memory)

    cp_ = sub.add_parser(
        "check-layout",
        help="hold a layout to the post's rules of thumb: each kept or broken, and what breaking it costs",
        description="Hold a model's layout (flags, --megatron, --config or --job, as memory takes them) to the "
        "post's rules of thumb: TP and EP inside a node, SP with TP, CP for a sequence too long for a GPU, PP "
        "(not TP or CP) across nodes with at least as many micro-batches as stages, ZeRO-1 with DP. Each rule "
        "the layout breaks is shown with the same GPUs and batch following it: the step's time and the "
        "memory of the busiest GPU, both computed.",
    )
    _common(cp_, runs=False)
    cp_.add_argument("--seq", type=_pos, metavar="S", help="sequence length (default 4096, or the job's)")
    cp_.set_defaults(func=cmd_check_layout)

    fp = sub.add_parser(
        "fit",
        help="the longest sequence that fits, or the best layout per node count",
        description="Solve for the longest sequence that fits in the usable memory per GPU "
        "(default 120 GB of a 141 GB H200), or with --search rank every valid "
        "layout on each node count.",
    )
    _common(fp, search=True)
    fp.add_argument("--search", action="store_true", help="try every layout (TP, SP, CP, PP, DP/ZeRO, recompute)")
    fp.add_argument("--nodes", default="1-64", metavar="A-B", help="node counts for --search (default 1-64)")
    fp.add_argument("--gpus-per-node", type=_pos, default=8, metavar="N", help="GPUs per node (default 8)")
    fp.add_argument(
        "--top",
        type=positive_up_to(SEARCH_TOP, "each is listed with its whole layout"),
        default=5,
        metavar="K",
        help=f"layouts listed per node count (default 5, at most {SEARCH_TOP})",
    )
    fp.add_argument("--plot", metavar="FILE.png", help="with --search: longest sequence against nodes per family")
    fp.add_argument(
        "--by",
        choices=("length", "time"),
        default="length",
        help="with --search: rank by the longest sequence (length, the default) or, among the layouts "
        "that fit --seq, by the step's time on --gpu (tokens per second per GPU), saying what "
        "costs each losing layout most",
    )
    fp.add_argument("--seq", type=_pos, metavar="S", help="with --by time: the sequence to train at (default 4096)")
    fp.add_argument(
        "--global-batch",
        type=_pos,
        metavar="B",
        help="with --by time: sequences per step, all replicas (default 1024): a layout whose DP x "
        "micro-batch does not divide it is left out",
    )
    fp.set_defaults(func=cmd_fit)

    hp = sub.add_parser(
        "hardware",
        help="the GPU constants every time and memory figure uses, with sources",
        description="Print the hardware table: for each GPU type --gpu-model takes, its memory, "
        "dense BF16 peak, memory bandwidth, NVLink and network bandwidth per GPU, each "
        "with the datasheet it comes from and how that source prints it; then the "
        "measured kernel costs the clock times products, attention and collectives "
        "by, at a few sample points, with their sources.",
    )
    hp.add_argument("--json", action="store_true", help='print {"gpus", "latency", "kernels", "sources"} as JSON')
    hp.set_defaults(func=cmd_hardware)


def cmd_hardware(args: argparse.Namespace) -> int:
    from ..estimate.kernels import hardware_table

    table = hardware_table()
    if args.json:
        print_json(table, indent=2)
        return 0
    from rich.console import Console
    from ..render.estimate_text import hardware_report

    hardware_report(Console(highlight=False), table)
    return 0


# -- turning flags into a model, a plan and a GPU ---------------------------------------------------------
def _model(args: argparse.Namespace) -> tuple[Any, Sources]:
    """The model the flags give, with the layers on stages the flags give in place of its own, and the files
    read to make it (each read once, here)."""
    model, sources = _given_model(args)
    return with_stages(args, model), sources


def _given_model(args: argparse.Namespace) -> tuple[Any, Sources]:
    from ..estimate.models import from_flags, get_model
    from .megatron import check_not_both, check_sets, job_model

    check_not_both(args)
    check_sets(args)
    job = read_megatron(args)
    if job is not None:
        return job_model(args, job), Sources(megatron=job)
    if getattr(args, "job", None):
        return _job_model(args)
    sizes = {
        k: getattr(args, k)
        for k in ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn", "experts", "top_k", "expert_ffn", "params")
    }
    given = [n for n, v in (("--model", args.model), ("--config", args.config)) if v] + (
        ["sizes"] if any(v is not None for v in sizes.values()) else []
    )
    if len(given) > 1:
        raise UsageError(f"give one of --model, --config or sizes, not {' and '.join(given)}")
    if args.model:
        return get_model(args.model), Sources()
    if args.config:
        from ..estimate.models import read_hf_config

        hf = read_hf_config(args.config)  # what it read and left out, printed beside the answer
        return hf.model, Sources(config=hf, config_path=args.config)
    if not given:
        raise UsageError(
            "which model? give --model NAME (e.g. 27b), --config FILE or --layers/--hidden/--heads/--vocab"
        )
    return from_flags(**sizes), Sources()


def _job_model(args: argparse.Namespace) -> tuple[Any, Sources]:
    """--job FILE: the model its stack's file gives, over the model given beside it (--model or --config, which
    a file naming no model needs), with the size flags over both. A Megatron-LM job or a Hugging Face config
    given by --job is read as --megatron or --config reads it."""
    from ..job.formats import read_job_file
    from .megatron import MODEL_SIZES, job_model

    fmt, read = read_job_file(args.job, args.job_format, tuple(args.job_set))
    if fmt.name == "megatron":
        if args.model or args.config:
            raise UsageError("a Megatron-LM job gives its own model: give --job FILE or --model/--config, not both")
        return job_model(args, read), Sources(megatron=read)
    if fmt.name == "hf":
        if args.model or args.config:
            raise UsageError(f"{args.job} is a model's config.json: give it by --job or --config, not both")
        return read.model, Sources(config=read, config_path=args.job)
    if args.model and args.config:
        raise UsageError("give the model beside --job by --model or by --config, not both")
    base, config = None, None
    if args.model:
        from ..estimate.models import get_model

        base = get_model(args.model)
    elif args.config:
        from ..estimate.models import read_hf_config

        config = read_hf_config(args.config)
        base = config.model
    sizes = {k: getattr(args, k, None) for k in MODEL_SIZES}
    return read.model_spec(base, **sizes), Sources(job=read, config=config, config_path=args.config)


def _plan(args: argparse.Namespace, model: Any, job: Any, seq: int | None = None, scored: bool = False) -> Any:
    """The plan the flags give (over `job`'s, the --megatron job, where given), checked by the layout rules
    (Layout's, as `parasim layout` checks them), against the sequence too when it is known (`memory --seq`).
    `scored`: a plan held to the rules of thumb (check-layout, memory --critic), where an MoE model under TP
    without SP is the broken rule "SP with TP", not refused (clock/critic.ScoredPlan); a job's plan is checked
    as its file gives it, and refused as Megatron-LM would refuse it."""
    from ..estimate.memory import Plan

    if job is not None:  # the job's layout and step, with the flags given here in their place
        from ..megatron.job import plan_of

        plan = plan_of(
            job,
            model,
            args.gpus,
            tp=args.tp,
            cp=args.cp,
            pp=args.pp,
            dp=args.dp,
            ep=args.ep,
            etp=args.etp,
            sp=args.sp or None,
            cp_comm=args.cp_comm,
            zero=args.zero,
            recompute=args.recompute,
            flash=False if args.no_flash else None,
            dropout=False if args.no_dropout else None,
            micro_batch=args.micro_batch,
            microbatches=args.microbatches,
            chunked_loss=args.chunked_loss or None,
            precision=args.precision,
        )
        return replace(plan, **_kernels(args)).check(model, seq)
    # world and dp: given, derived or checked by the layout's own rule (--gpus is its world)
    plan = Plan(
        tp=args.tp or 1,
        sp=args.sp,
        cp=args.cp or 1,
        cp_comm=args.cp_comm or CP_COMMS[0],
        pp=args.pp or 1,
        dp=args.dp,
        world=args.gpus,
        ep=args.ep or 1,
        etp=args.etp or 1,
        zero=1 if args.zero is None else args.zero,
        recompute=args.recompute or "none",
        flash=not args.no_flash,
        dropout=not args.no_dropout,
        micro_batch=args.micro_batch or 1,
        microbatches=args.microbatches,
        chunked_loss=args.chunked_loss,
        precision=_precision(args, job),
        **_kernels(args),
    )
    if scored:
        from ..clock.critic import scored as scored_plan

        plan = scored_plan(plan)
    return plan.check(model, seq)


def _search_choices(args: argparse.Namespace, job: Any) -> dict[str, Any]:
    """The training choices both of fit's searches hold fixed while they try every layout (None: try each)."""
    return dict(
        zero=args.zero,
        recompute=args.recompute,
        flash=not args.no_flash,
        dropout=not args.no_dropout,
        micro_batch=args.micro_batch or 1,
        chunked_loss=args.chunked_loss,
        precision=_precision(args, job),
        **_kernels(args),
    )


def _kernels(args: argparse.Namespace) -> dict[str, Any]:
    """--attention-kernel, --fusion and --dispatcher where given: the framework's kernels the step is timed by."""
    return {
        k: v
        for k, v in (
            ("attention_kernel", args.attention_kernel),
            ("fusion", args.fusion),
            ("dispatcher", args.dispatcher),
        )
        if v is not None
    }


def _precision(args: argparse.Namespace, job: Any) -> str:
    """--precision, else the Megatron job's, else the post's."""
    return args.precision or (job.step["precision"] if job is not None else "post")


def _gpu(args: argparse.Namespace) -> tuple[Any, str]:
    """--gpu's preset, and its key in the hardware table as the clock looks it up (--gpu H200 is h200)."""
    from ..estimate.traffic import gpu_spec

    return gpu_spec(args.gpu), args.gpu.lower()


def _overlap(args: argparse.Namespace, job: Any) -> tuple[str, ...]:
    from ..clock.overlaps import PLAN, parse

    if args.overlap is None and job is not None:
        return tuple(job.overlap)
    return parse(args.overlap or "none", PLAN)


def _seq(args: argparse.Namespace, job: Any) -> int:
    """`memory --seq`, or the job's --seq-length, or 4,096."""
    return args.seq or (job.seq if job is not None else None) or 4096


def _print_job(args: argparse.Namespace, sources: Sources) -> None:
    """Where the model came from, before the answer: a Megatron job's flags, or a config's fields."""
    if sources.megatron is not None:
        from .megatron import print_job

        print_job(sources.megatron, args)
    if sources.job is not None and not args.json:
        from ..render.job_text import read_job_lines

        print(printable_lines(read_job_lines(sources.job)) + "\n")
    if sources.config is not None:
        from ..render.estimate_text import config_lines

        print(printable_lines(config_lines(sources.config_path, sources.config)) + "\n")


def _print_emitted(emitted: dict) -> int:
    """--emit: the file alone on stdout (so it redirects to a file), what it cannot hold on stderr."""
    import sys

    sys.stdout.write(emitted["text"])
    for note in emitted["notes"]:
        print(f"parasim: note: {note}", file=sys.stderr)
    return 0


def _print_written(out: dict, plan: Any) -> None:
    from ..megatron.args import describe
    from .megatron import print_written

    print_written(f"as a Megatron-LM job on {describe(plan.world, plan.gpus_per_node)}", out)


def _print_stages(stages: dict) -> None:
    """One line for uneven stages: how the layers sit, which stage needs the most memory, which is slowest."""
    if len(set(stages["layers"])) > 1:
        slowest = f", the slowest stage {stages['slowest']}" if stages["slowest"] else ""
        print(f"{stages['said']} (the most memory on stage {stages['most_memory']}{slowest})")


def _units(args: argparse.Namespace) -> Units:
    from ..job.query import GIB

    return GIB if args.gib else Units()


def _usable(args: argparse.Namespace, gpu: Any) -> float:
    return args.usable * _units(args).size if args.usable else gpu.usable


def query_of(args: argparse.Namespace) -> JobQuery:
    """`parasim memory`'s flags as the job they describe (each file they name read once)."""
    model, sources = _model(args)
    job = sources.plan_job
    seq = _seq(args, job)
    # check-layout and memory --critic score a layout Megatron-Core refuses for MoE without SP; the rest refuse it
    scored = getattr(args, "critic", False) or getattr(args, "func", None) is cmd_check_layout
    plan, (gpu, key) = _plan(args, model, job, seq, scored), _gpu(args)
    return JobQuery(model, plan, seq, key, _usable(args, gpu), _overlap(args, job), _units(args), sources)


def cmd_memory(args: argparse.Namespace) -> int:
    from ..estimate.memory import assumption_words, fit_words
    from ..job import memory_report

    q = query_of(args)
    if args.app:
        if args.json or args.symbolic or args.plot or args.emit or args.critic:
            raise UsageError(
                "--app shows the estimator live: give it without --json, --symbolic, --plot, --emit or --critic"
            )
        from ..tui.estimator_app import open_estimator

        open_estimator(q)
        return 0
    model, plan, seq, unit, name = q.model, q.plan, q.seq, q.units.size, q.units.name
    report = memory_report(
        q,
        critic=args.critic,
        written=args.megatron_args,
        against=args.routing if args.symbolic else None,
        progress=progress_line,
        emit=args.emit,
    )
    out, bd, gpu = report.to_dict(), report.breakdown, report.gpu
    if args.plot:
        from ..render.plots import plot_memory

        plot_memory(model, plan, seq, unit, name, args.plot, q.usable, gpu)
    if args.json:
        print_json(out)
        return 0
    if args.emit:
        return _print_emitted(out["emitted"])
    _print_job(args, q.sources)
    from rich.console import Console
    from ..render.estimate_text import print_memory, spread

    console = Console(highlight=False)
    _print_stages(out["stages"])
    print_memory(
        console,
        f"{markup_safe(model.name)}, {spread(plan.label(), plan.world)}, s = {seq:,} "
        f"(stage {bd.stage + 1} of {plan.pp})",
        bd,
        out,
        fit_words(bd.total, q.usable, gpu.name, gpu.memory, bool(args.usable), unit, name),
        assumption_words(out["assumes"], plan.cp),
        gpu.name,
        unit,
        name,
    )
    if args.symbolic:
        from ..render.against import print_compare

        print_compare(console, out["run"], unit, name)
    if args.megatron_args:
        _print_written(out["megatron_args"], plan)
    if args.critic:
        from ..render.estimate_text import critic_lines

        print(printable_lines(critic_lines(out["critic"], unit, name)))
    return 0


def cmd_check_layout(args: argparse.Namespace) -> int:
    from ..clock.critic import check_layout

    q = query_of(args)
    assert q.seq is not None  # query_of gives every query its sequence (a flag, the job's, or 4096)
    found = check_layout(q.model, q.plan, q.seq, q.gpu, q.overlap, q.usable)
    if args.json:
        print_json({**found.to_dict(), "unit": q.units.name, **q.sources.to_dict()})
        return 0
    _print_job(args, q.sources)
    from ..render.estimate_text import layout_check_lines

    print(printable_lines(layout_check_lines(found, q.units.size, q.units.name)))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    model, sources = _model(args)
    job = sources.plan_job
    gpu, key = _gpu(args)
    units = _units(args)
    unit, name = units.size, units.name
    usable = _usable(args, gpu)
    if args.search and args.symbolic:
        raise UsageError("--symbolic runs one layout: give its sizes instead of --search")
    if args.search and args.emit:
        raise UsageError("--emit writes one layout's plan: give its sizes instead of --search")
    if (args.by == "time" or args.seq is not None or args.global_batch is not None) and not args.search:
        raise UsageError("--by, --seq and --global-batch rank a search: give --search")
    if args.by != "time" and (args.seq is not None or args.global_batch is not None):
        raise UsageError("--seq and --global-batch set the step --by time ranks layouts by: give --by time")
    if args.search and args.by == "time":
        return _search_by_time(args, model, sources, usable, units, (gpu, key))
    if args.search:
        from ..job.search import search_report

        report = search_report(_search_query(args, model, sources, usable, units), written=args.megatron_args)
        result = report.to_dict()
        if args.plot:
            from ..render.plots import plot_search

            plot_search(result, args.plot)
        if args.json:
            print_json(result)
            return 0
        _print_job(args, sources)
        from ..render.estimate_text import search_lines

        print(printable_lines(search_lines(model.name, result, name)))
        for row in result["nodes"] if args.megatron_args else ():
            best = row["best"]
            if best is not None and "megatron_args" in best:
                from ..megatron.args import describe
                from .megatron import print_written

                print_written(
                    f"{best['label']} at {best['seq_length']:,} tokens, as a Megatron-LM job on "
                    f"{describe(best['world'], args.gpus_per_node)}",
                    best["megatron_args"],
                )
        return 0
    if args.plot:
        raise UsageError("fit --plot needs --search")
    if args.symbolic:
        return _fit_against_run(args, model, sources, usable, units)
    from ..job import fit_report

    plan = _plan(args, model, job)
    report = fit_report(
        JobQuery(model, plan, None, key, usable, _overlap(args, job), units, sources),
        written=args.megatron_args,
        emit=args.emit,
    )
    out, f = report.to_dict(), report.fit
    if args.json:
        print_json(out)
        return 0
    if args.emit:
        if "emitted" not in out:
            raise UsageError("nothing fits this layout: no plan to write (--emit)")
        return _print_emitted(out["emitted"])
    _print_job(args, sources)
    _print_stages(out["stages"])
    from ..render.estimate_text import fit_lines

    print(printable_lines(fit_lines(model.name, plan.label(), plan.world, f, out, gpu.name, unit, name)))
    if "megatron_args" in out:
        _print_written(out["megatron_args"], plan)
    return 0


def _search_query(args: argparse.Namespace, model: Any, sources: Sources, usable: float, units: Units) -> Any:
    """fit --search's flags as the search they ask for."""
    from ..estimate.fit import parse_nodes
    from ..job.search import SearchQuery

    return SearchQuery(
        model,
        parse_nodes(args.nodes),
        usable,
        _search_choices(args, sources.plan_job),
        args.gpus_per_node,
        args.top,
        units,
        sources,
    )


def _search_by_time(
    args: argparse.Namespace, model: Any, sources: Sources, usable: float, units: Units, gpu: tuple[Any, str]
) -> int:
    """`fit --search --by time`: the layouts that fit, ranked by the step's time, and why each loses."""
    from ..job.search import time_search_report

    if args.megatron_args or args.plot:
        raise UsageError("--megatron-args and --plot go with --by length")
    report = time_search_report(
        _search_query(args, model, sources, usable, units),
        args.seq or 4096,
        args.global_batch or 1024,
        gpu[1],
        _overlap(args, sources.plan_job),
    )
    result = report.to_dict()
    if args.json:
        print_json(result)
        return 0
    _print_job(args, sources)
    from ..render.estimate_text import time_search_lines

    print(printable_lines(time_search_lines(model.name, result, gpu[0].name)))
    return 0


def _fit_against_run(args: argparse.Namespace, model: Any, sources: Sources, usable: float, units: Units) -> int:
    from ..job import fit_run_report
    from ..render.against import print_fit

    plan = _plan(args, model, sources.plan_job)
    q = JobQuery(model, plan, None, _gpu(args)[1], usable, _overlap(args, sources.plan_job), units, sources)
    out = fit_run_report(q, args.routing, progress=progress_line).to_dict()
    if args.json:
        print_json(out)
        return 0
    print_fit(out, units.size, units.name)
    return 0

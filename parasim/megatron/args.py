"""A plan written back as Megatron-LM flags and the torchrun line that runs it: what `--megatron-args` prints.
Reading these flags with `--megatron` gives the same layout and step (tests/unit/megatron/test_megatron.py). A plan made
from a job (`--megatron FILE`) is written back as that job: its precision, its positions, its tokenizer and
every flag parasim does not model, as read, with only what parasim decides (the layout, the step, the
shapes) in parasim's words (tests/unit/megatron/test_megatron_roundtrip.py)."""

from __future__ import annotations

import re
from math import gcd
from typing import Any

from ..layout.precision import precision as precision_of
from .flags import NEAREST_PRECISION, PRECISION_FLAGS, SHARDING
from .pipeline import pipeline_args

OVERLAP_FLAGS = {
    "grad-reduce": "--overlap-grad-reduce",
    "prefetch": "--overlap-param-gather",
    "tp": "--tp-comm-overlap",
    "p2p": "--overlap-p2p-communication",
}
WIDTH = 100  # a printed line, continued with a backslash past it
# flags a job gives that parasim reads but does not write (it takes what they mean and writes nothing for it,
# or would write something else): written back as the job gives them
AS_READ = frozenset(
    (
        "--vocab-size",
        "--tokenizer-type",
        "--vocab-file",
        "--make-vocab-size-divisible-by",
        "--moe-token-dispatcher-type",
        "--use-flash-attn",
        "--attention-backend",
        "--hidden-dropout",
        "--attention-dropout",
        "--position-embedding-type",
        "--max-position-embeddings",
        "--no-position-embedding",
    )
)


def model_args(
    model: Any, seq: int | None, partial: bool = False, job: Any = None, tp: int = 1, dispatcher: str = "alltoall"
) -> list[str]:
    """The flags of a model's shapes, an MoE model's with its token `dispatcher` (estimate/dispatch.py); `partial`:
    only the sizes it states (a layout's model: the sizes its rules check), none of the defaults a whole model
    has. With the `job` the model came from, what parasim does not model is left to the job's own flags: the
    positions (rotary or learned, and how many), a dispatcher parasim does not time, and the vocabulary where
    it is the job's (its tokenizer, padded as Megatron pads it for TP `tp`)."""
    out: list[str] = []

    def add(flag: str, value: Any) -> None:
        if value is not None:
            out.extend([flag, str(value)])

    if model is None:
        return out
    add("--num-layers", model.layers)
    add("--hidden-size", model.hidden)
    add("--num-attention-heads", model.heads)
    if model.kv_heads is not None and model.heads is not None and model.kv_heads != model.heads:
        out.append("--group-query-attention")
        add("--num-query-groups", model.kv_heads)
    if partial:
        if model.experts:
            out += ["--num-experts", str(model.experts)]
        return out + _unmodelled_model_args(model, seq, job, dispatcher)
    if model.latent:
        out.append("--multi-latent-attention")
        add("--q-lora-rank", model.q_lora_rank)
        add("--kv-lora-rank", model.kv_lora_rank)
        add("--qk-head-dim", model.qk_nope_head_dim)
        add("--qk-pos-emb-head-dim", model.qk_rope_head_dim)
        add("--v-head-dim", model.v_head_dim)
    elif model.head_size is not None:
        add("--kv-channels", model.head_size)
    if model.hidden is not None:
        # a width the model states (or a gated MLP's, whose default Megatron takes as 8/3 h and parasim as 4h);
        # otherwise both take 4h
        add("--ffn-hidden-size", model.ffn if model.ffn is not None or not model.gated else model.ffn_size)
    if model.gated:
        out.append("--swiglu")
    if model.norm == "rmsnorm":
        out.extend(["--normalization", "RMSNorm"])
    if not model.bias:
        out.append("--disable-bias-linear")
    if not model.tied_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    # the job's own vocabulary is left to its flags, padded for the plan's TP or (a model read at the job's TP, as
    # fit --search reads it) for the job's
    if job is None or model.vocab not in (_job_vocab(job, tp), _job_vocab(job, job.layout["tp"])):
        add("--vocab-size", model.vocab)
    if model.experts:
        add("--num-experts", model.experts)
        add("--moe-router-topk", model.top_k)
        add("--moe-ffn-hidden-size", model.expert_ffn)  # unstated: both take the dense width
        if model.shared_experts:
            add("--moe-shared-expert-intermediate-size", model.shared_experts * model.shared_size)
        if model.dense_layers:
            add("--moe-layer-freq", f"([0]*{model.dense_layers}+[1]*{model.layers - model.dense_layers})")
        add("--moe-router-num-groups", model.expert_groups)
        add("--moe-router-group-topk", model.groups_kept)
    return out + _unmodelled_model_args(model, seq, job, dispatcher)


def _unmodelled_model_args(model: Any, seq: int | None, job: Any, dispatcher: str = "alltoall") -> list[str]:
    """What a new job needs beside the shapes: an MoE model's token dispatcher (NCCL's all-to-all unless the plan
    names DeepEP's or HybridEP's flex kernels), rotary positions, as many positions as the sequence; each left
    to the `job`'s own flags where it gives them (its positions where they hold the sequence, its dispatcher
    where the plan keeps the all-to-all: one parasim does not time, such as allgather, stays the job's)."""
    given = {} if job is None else job.given
    out = []
    if model.experts and (dispatcher != "alltoall" or "--moe-token-dispatcher-type" not in given):
        out += (
            ["--moe-token-dispatcher-type", "alltoall"]
            if dispatcher == "alltoall"
            else ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", dispatcher]
        )
    if job is None:  # Megatron-LM's default is learned absolute positions: a job that says nothing keeps them
        out += ["--position-embedding-type", "rope"]
    if seq is not None:
        out += ["--seq-length", str(seq)] + (
            [] if _holds(given.get("--max-position-embeddings"), seq) else ["--max-position-embeddings", str(seq)]
        )
    return out


def _holds(most: list[str] | None, seq: int) -> bool:
    """Whether a job's --max-position-embeddings (its words) holds `seq` positions, so that it is written back as
    the job gives it: Megatron-LM refuses a --seq-length past it (arguments.py asserts max_position_embeddings >=
    seq_length), so a longer sequence is written with as many positions."""
    return bool(most) and re.fullmatch(r"[0-9]{1,15}", most[0]) is not None and int(most[0]) >= seq


def _job_vocab(job: Any, tp: int) -> int | None:
    """The vocabulary the job's own flags give, padded as Megatron pads it for TP `tp` (None: they give none)."""
    from .job import padded_vocab

    own = job.model.get("vocab")
    return None if own is None else padded_vocab(own, job.model["vocab_padding"], tp)


def layout_args(layout: Any, experts: bool) -> list[str]:
    """The flags of a layout's degrees, SP, ZeRO stage and rank order."""
    out = [
        "--tensor-model-parallel-size",
        str(layout.tp),
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--context-parallel-size",
        str(layout.cp),
    ]
    if experts or layout.ep > 1:
        out += ["--expert-model-parallel-size", str(layout.ep), "--expert-tensor-parallel-size", str(layout.etp or 1)]
    if layout.sp and layout.tp > 1:
        out.append("--sequence-parallel")
    if layout.order == "tp-cp-ep-pp-dp":
        out.append("--use-tp-pp-dp-mapping")
    if layout.zero == 1:
        out.append("--use-distributed-optimizer")
    elif layout.zero in (2, 3):
        strategy = next(k for k, v in SHARDING.items() if v == layout.zero)
        out += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
    return out


def step_args(plan: Any, overlap: tuple[str, ...] = ()) -> list[str]:
    """The flags of a plan's step: batch, recomputation, attention, dropout, precision, overlap (its model
    chunks per GPU go with the layers on stages: megatron/pipeline.py)."""
    out = ["--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.micro_batch * plan.m * plan.dp)]
    if plan.recompute == "selective":
        out += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if not plan.flash:
        out += ["--attention-backend", "unfused"]
    if not plan.dropout:
        out += ["--hidden-dropout", "0.0", "--attention-dropout", "0.0"]
    out += list(PRECISION_FLAGS[megatron_precision(plan.precision)])
    out += [OVERLAP_FLAGS[o] for o in overlap if o in OVERLAP_FLAGS]
    return out


def megatron_precision(name: str) -> str:
    """The layout/precision.py entry Megatron-LM runs for the plan's: its own, or the nearest it has flags for."""
    return name if name in PRECISION_FLAGS else NEAREST_PRECISION[name]


def precision_notes(name: str) -> list[str]:
    """What changes when a precision Megatron-LM has no flags for is written as the nearest one it has."""
    if name in PRECISION_FLAGS:
        return []
    near = megatron_precision(name)
    mine, theirs = precision_of(name), precision_of(near)
    flags = " ".join(PRECISION_FLAGS[near]) or "no precision flag (FP32)"
    return [
        f"precision {name} has no Megatron-LM flags: written as {near} ({flags}), {theirs.per_param():g} bytes "
        f"a parameter of model state where {name} keeps {mine.per_param():g} (parasim memory --precision {near} "
        "counts the job as written)"
    ]


def megatron_args(model: Any, plan: Any, seq: int | None, overlap: tuple[str, ...] = (), job: Any = None) -> list[str]:
    """Every flag of a plan: the model's shapes, the layout, its layers on stages, the step; with the `job` the
    plan came from, then every flag of the job parasim does not write itself or re-derive, as the job gives
    it: what it leaves out (named under "not modelled"), what changes nothing it counts, what it does not
    know, and what it reads but writes no flag for (AS_READ)."""
    out = (
        model_args(model, seq, job=job, tp=plan.tp, dispatcher=plan.dispatcher)
        + layout_args(plan, bool(model is not None and model.experts))
        + pipeline_args(model, plan)
        + step_args(plan, overlap)
    )
    return out if job is None else out + job_rest(job, out)


def job_rest(job: Any, written: list[str]) -> list[str]:
    """The flags of `job` to write after parasim's own (`written`): every flag parasim does not write or
    re-derive, as the job gives it."""
    mine = {w for w in written if w.startswith("--")}
    out: list[str] = []
    for flag, values in job.given.items():
        if flag not in mine and (flag not in job.read or flag in job.left or flag in AS_READ):
            out += [flag, *values]
    return out


def torchrun_words(world: int, gpus_per_node: int) -> list[str]:
    """torchrun for `world` processes, `gpus_per_node` per node: the same line on every node, each with its
    NODE_RANK (and the first node's address as MASTER_ADDR)."""
    per_node = per_node_of(world, gpus_per_node)
    return [
        "torchrun",
        "--nnodes",
        str(world // per_node),
        "--nproc-per-node",
        str(per_node),
        "--node-rank",
        "${NODE_RANK:-0}",
        "--master-addr",
        "${MASTER_ADDR:-localhost}",
        "--master-port",
        "29500",
    ]


def script_text(args: list[str], world: int, gpus_per_node: int, program: str = "pretrain_gpt.py") -> str:
    """The torchrun line with `args`, a flag and its value kept together, continued past WIDTH columns: text
    a shell runs as it is, and `--megatron` reads back."""
    lines = _wrap(torchrun_words(world, gpus_per_node), "    ", quote=False)
    lines[0] = lines[0].lstrip()
    return " \\\n".join(lines + ["    " + program] + _wrap(args, "    "))


def _wrap(words: list[str], indent: str, quote: bool = True) -> list[str]:
    """Words in lines of at most WIDTH - 2 columns (room for the ` \\`), a flag kept with its values."""
    groups: list[str] = []
    for word in words:
        shown = _quoted(word) if quote else word
        if word.startswith("--") or not groups:
            groups.append(shown)
        else:
            groups[-1] += " " + shown
    lines, line = [], ""
    for g in groups:
        if line and len(indent) + len(line) + 1 + len(g) > WIDTH - 2:
            lines.append(indent + line)
            line = ""
        line = f"{line} {g}" if line else g
    if line:
        lines.append(indent + line)
    return lines


def _quoted(word: str) -> str:
    """A word as the shell must see it to hand it on unchanged: as it is when it holds nothing the shell reads
    (flags, numbers, paths), else single-quoted (a pattern such as ([0]*3+[1]*58), a value with quotes or spaces
    in it, as a script's own quoting left it)."""
    import shlex

    return shlex.quote(word)


def per_node_of(world: int, gpus_per_node: int) -> int:
    """Processes per node for `world`: every GPU of a node when the nodes divide it, else the most each node
    can run for equal nodes (torchrun starts as many on every node): 12 on nodes of 8 is 3 nodes of 4."""
    return gpus_per_node if world % gpus_per_node == 0 else gcd(world, gpus_per_node)


def nodes_of(world: int, gpus_per_node: int) -> int:
    return world // per_node_of(world, gpus_per_node)


def describe(world: int, gpus_per_node: int) -> str:
    """Where the line runs, in words."""
    n = nodes_of(world, gpus_per_node)
    return f"{world:,} GPUs: {n} node{'s' if n != 1 else ''} of {per_node_of(world, gpus_per_node)}" + (
        f" (run it on every node, NODE_RANK 0 to {n - 1}, MASTER_ADDR the first node's address)" if n > 1 else ""
    )


def as_dict(model: Any, plan: Any, seq: int | None, overlap: tuple[str, ...] = (), job: Any = None) -> dict[str, Any]:
    """--json: the flags, the torchrun line that runs them, and what they do not carry over ("notes")."""
    args = megatron_args(model, plan, seq, overlap, job)
    return {
        "args": args,
        "torchrun": script_text(args, plan.world, plan.gpus_per_node),
        "nodes": nodes_of(plan.world, plan.gpus_per_node),
        "gpus_per_node": per_node_of(plan.world, plan.gpus_per_node),
        "notes": precision_notes(plan.precision),
    }

"""A plan written back as Megatron-LM flags and the torchrun line that runs it: what `--megatron-args` prints.
Reading these flags with `--megatron` gives the same layout and step (tests/test_megatron.py)."""
from __future__ import annotations

from math import gcd
from typing import Any

from .flags import SHARDING
from .pipeline import pipeline_args

OVERLAP_FLAGS = {"grad-reduce": "--overlap-grad-reduce", "prefetch": "--overlap-param-gather",
                 "tp": "--tp-comm-overlap", "p2p": "--overlap-p2p-communication"}
WIDTH = 100  # a printed line, continued with a backslash past it


def model_args(model: Any, seq: int | None, partial: bool = False) -> list[str]:
    """The flags of a model's shapes; `partial`: only the sizes it states (a layout's model: the sizes its
    rules check), none of the defaults a whole model has."""
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
            out += ["--num-experts", str(model.experts), "--moe-token-dispatcher-type", "alltoall"]
        out += ["--position-embedding-type", "rope"]
        if seq is not None:
            out += ["--seq-length", str(seq), "--max-position-embeddings", str(seq)]
        return out
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
        add("--ffn-hidden-size", model.ffn_size)
    if model.gated:
        out.append("--swiglu")
    if model.norm == "rmsnorm":
        out.extend(["--normalization", "RMSNorm"])
    if not model.bias:
        out.append("--disable-bias-linear")
    if not model.tied_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    add("--vocab-size", model.vocab)
    if model.experts:
        add("--num-experts", model.experts)
        add("--moe-router-topk", model.top_k)
        add("--moe-ffn-hidden-size", model.expert_size)
        if model.shared_experts:
            add("--moe-shared-expert-intermediate-size", model.shared_experts * model.shared_size)
        if model.dense_layers:
            add("--moe-layer-freq", f"([0]*{model.dense_layers}+[1]*{model.layers - model.dense_layers})")
        out.extend(["--moe-token-dispatcher-type", "alltoall"])
    out.extend(["--position-embedding-type", "rope"])
    if seq is not None:
        add("--seq-length", seq)
        add("--max-position-embeddings", seq)
    return out


def layout_args(layout: Any, experts: bool) -> list[str]:
    """The flags of a layout's degrees, SP, ZeRO stage and rank order."""
    out = ["--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp),
           "--context-parallel-size", str(layout.cp)]
    if experts or layout.ep > 1:
        out += ["--expert-model-parallel-size", str(layout.ep), "--expert-tensor-parallel-size",
                str(layout.etp or 1)]
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
    out = ["--micro-batch-size", str(plan.micro_batch),
           "--global-batch-size", str(plan.micro_batch * plan.m * plan.dp)]
    if plan.recompute == "selective":
        out += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if not plan.flash:
        out += ["--attention-backend", "unfused"]
    if not plan.dropout:
        out += ["--hidden-dropout", "0.0", "--attention-dropout", "0.0"]
    out.append("--bf16")
    out += [OVERLAP_FLAGS[o] for o in overlap if o in OVERLAP_FLAGS]
    return out


def megatron_args(model: Any, plan: Any, seq: int | None, overlap: tuple[str, ...] = ()) -> list[str]:
    """Every flag of a plan: the model's shapes, the layout, its layers on stages, the step."""
    return model_args(model, seq) + layout_args(plan, bool(model is not None and model.experts)) + \
        pipeline_args(model, plan) + step_args(plan, overlap)


def torchrun_words(world: int, gpus_per_node: int) -> list[str]:
    """torchrun for `world` processes, `gpus_per_node` per node: the same line on every node, each with its
    NODE_RANK (and the first node's address as MASTER_ADDR)."""
    per_node = per_node_of(world, gpus_per_node)
    return ["torchrun", "--nnodes", str(world // per_node), "--nproc-per-node", str(per_node), "--node-rank", "${NODE_RANK:-0}",
            "--master-addr", "${MASTER_ADDR:-localhost}", "--master-port", "29500"]


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
    """A word as the shell must see it: a pattern such as ([0]*3+[1]*58) in single quotes."""
    return f"'{word}'" if any(c in word for c in "()[]*$ ") and not word.startswith("${") else word


def per_node_of(world: int, gpus_per_node: int) -> int:
    """Processes per node for `world`: every GPU of a node when the nodes divide it, else the most each node
    can run for equal nodes (torchrun starts as many on every node): 12 on nodes of 8 is 3 nodes of 4."""
    return gpus_per_node if world % gpus_per_node == 0 else gcd(world, gpus_per_node)


def nodes_of(world: int, gpus_per_node: int) -> int:
    return world // per_node_of(world, gpus_per_node)


def describe(world: int, gpus_per_node: int) -> str:
    """Where the line runs, in words."""
    n = nodes_of(world, gpus_per_node)
    return (f"{world:,} GPUs: {n} node{'s' if n != 1 else ''} of {per_node_of(world, gpus_per_node)}"
            + (f" (run it on every node, NODE_RANK 0 to {n - 1}, MASTER_ADDR the first node's address)" if n > 1
               else ""))


def as_dict(model: Any, plan: Any, seq: int | None, overlap: tuple[str, ...] = ()) -> dict[str, Any]:
    """--json: the flags, and the torchrun line that runs them."""
    args = megatron_args(model, plan, seq, overlap)
    return {"args": args, "torchrun": script_text(args, plan.world, plan.gpus_per_node),
            "nodes": nodes_of(plan.world, plan.gpus_per_node),
            "gpus_per_node": per_node_of(plan.world, plan.gpus_per_node)}

"""A torchtitan train config (the TOML files torchtitan shipped until 2026-02, still in circulation: run as
`--job.config_file FILE`) as parasim's model, layout and step, every field accounted for.

The model is a name and a flavour looked up in torchtitan's own table (`[model] name = "llama3"`, `flavor =
"70B"`); parasim holds Llama 3's flavours as torchtitan@238fa99 torchtitan/models/llama3/__init__.py states them
(FLAVORS), and takes any other model from --config. The layout is FSDP2 over data_parallel_shard_degree (-1:
the GPUs left over, so the count comes from --gpus) times context_parallel_degree, which parasim plans as ZeRO-3;
TP always with sequence parallelism; parameters kept in FP32 and gathered in training.mixed_precision_param
(precision fsdp2). Field names and defaults: torchtitan@238fa99 torchtitan/config/job_config.py
(tests/data/jobs/SURVEY.md, section 3a). torchtitan's later Python config registry (`--module llama3 --config
llama3_70b`) is read by job/torchtitan_registry.py, into the fields these files share, with this table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..estimate.memory import RECOMPUTE
from ..limits import read_bounded
from .read import (
    NO_EFFECT,
    UNMODELLED,
    USED,
    JobField,
    ReadJob,
    Written,
    account,
    layout_defaults,
    leaves,
    plural,
    set_field,
    step_defaults,
    tree_of,
    with_sets,
)

TITLE = "torchtitan train config"
_P = "parallelism."


@dataclass(frozen=True)
class Flavor:
    """One of torchtitan's Llama 3 flavours: TransformerModelArgs' fields (vocab_size 128,256 by default)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None
    ffn_dim_multiplier: float | None
    multiple_of: int
    vocab_size: int = 128256

    def ffn(self) -> int:
        """The MLP's width as torchtitan's FeedForward computes it (models/llama3/model/model.py): two thirds of
        4 x dim, times the multiplier, rounded up to a multiple of `multiple_of`."""
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def said(self) -> str:
        return (
            f"{self.n_layers} layers, hidden {self.dim}, {self.n_heads} heads ({self.n_kv_heads or self.n_heads} KV), "
            f"MLP {self.ffn()}, vocabulary {self.vocab_size:,}"
        )

    def model_fields(self) -> dict[str, Any]:
        """ModelSpec's fields for this flavour (Llama 3: SwiGLU, RMSNorm, no biases)."""
        return dict(
            layers=self.n_layers,
            hidden=self.dim,
            heads=self.n_heads,
            kv_heads=self.n_kv_heads,
            ffn=self.ffn(),
            vocab=self.vocab_size,
            gated=True,
            norm="rmsnorm",
            bias=False,
        )


# torchtitan@238fa99, torchtitan/models/llama3/__init__.py, llama3_args (multiple_of 256 is TransformerModelArgs'
# default where a flavour gives none)
FLAVORS: dict[tuple[str, str], Flavor] = {
    ("llama3", "debugmodel"): Flavor(256, 6, 16, None, None, 256, vocab_size=2048),
    ("llama3", "8B"): Flavor(4096, 32, 32, 8, 1.3, 1024),
    ("llama3", "70B"): Flavor(8192, 80, 64, 8, 1.3, 4096),
    ("llama3", "405B"): Flavor(16384, 126, 128, 8, 1.2, 4096),
}

FIELDS: tuple[JobField, ...] = (
    *(JobField(name, USED) for name in ("model.name", "model.flavor", "model.converters")),
    *(JobField(f"training.{name}", USED) for name in ("local_batch_size", "global_batch_size", "seq_len")),
    JobField("training.mixed_precision_param", USED),
    *(
        JobField(_P + name, USED)
        for name in (
            "data_parallel_replicate_degree",
            "data_parallel_shard_degree",
            "tensor_parallel_degree",
            "pipeline_parallel_degree",
            "context_parallel_degree",
            "expert_parallel_degree",
            "expert_tensor_parallel_degree",
            "pipeline_parallel_microbatch_size",
            "enable_async_tensor_parallel",
        )
    ),
    JobField("activation_checkpoint.mode", USED),
    JobField("compile.enable", USED),
    JobField("compile.components", USED),
    JobField("optimizer.name", USED),
    JobField("quantize.linear.float8.enable_fsdp_float8_all_gather", USED),
    JobField(
        "training.mixed_precision_reduce", UNMODELLED, "the dtype gradients are reduced in: fsdp2 reduces in FP32"
    ),
    JobField(
        "training.enable_cpu_offload",
        UNMODELLED,
        "FSDP's parameters, gradients and optimizer in host memory: parasim counts every byte on the GPU",
    ),
    JobField(
        _P + "pipeline_parallel_schedule",
        UNMODELLED,
        "the pipeline schedule: parasim plans 1F1B's memory "
        "and time (give --schedule on `parasim schedule` to compare)",
    ),
    JobField(
        _P + "fsdp_reshard_after_forward",
        UNMODELLED,
        "whether FSDP frees gathered weights after forward: parasim frees and gathers again in backward",
    ),
    JobField(_P + "disable_loss_parallel", UNMODELLED, "the loss over the whole vocabulary on every TP rank"),
    JobField(
        "activation_checkpoint.selective_ac_option",
        UNMODELLED,
        "torchtitan's selective policy: 'op' keeps "
        "the products' outputs and recomputes the rest, an integer checkpoints every n-th layer; parasim's "
        "selective recomputes attention's core (Megatron's)",
    ),
    JobField("quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", NO_EFFECT),
    JobField(
        "quantize.linear.float8.filter_fqns",
        UNMODELLED,
        "layers kept out of FP8: parasim runs every product of the plan's precision in it",
    ),
    JobField("quantize.grouped_mm.float8.**", UNMODELLED, "FP8 experts' grouped products"),
    JobField("quantize.**", UNMODELLED, "quantized training settings parasim has no entry for"),
    *(
        JobField(name, NO_EFFECT)
        for name in (
            "job.**",
            "profiling.**",
            "metrics.**",
            "model.hf_assets_path",
            "model.tokenizer_path",
            "optimizer.lr",
            "optimizer.eps",
            "optimizer.weight_decay",
            "optimizer.implementation",
            "lr_scheduler.**",
            "training.max_norm",
            "training.steps",
            "training.dataset",
            "training.dataset_path",
            "training.seed",
            "training.deterministic",
            "checkpoint.**",
            "validation.**",
            "comm.**",
            "fault_tolerance.**",
            "memory_estimation.**",
            "experimental.**",
        )
    ),
)


def looks_like(tree: Any) -> bool:
    """A torchtitan config has a [model] name and flavour, or a [parallelism] table of its degrees."""
    if not isinstance(tree, dict):
        return False
    model, grid = tree.get("model"), tree.get("parallelism")
    return (isinstance(model, dict) and "flavor" in model) or (
        isinstance(grid, dict) and any(k.endswith("_degree") for k in grid)
    )


def toml_tree(data: bytes) -> Any:
    """A file's tables where it is TOML; None where it is not (or this Python has no tomllib: 3.10)."""
    try:
        import tomllib
    except ImportError:
        return None
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None


def parse(data: bytes, path: str) -> Any:
    """The TOML file `path`'s tables, or one line saying why not."""
    tree = toml_tree(data)
    if tree is None:
        import sys

        why = "reading TOML needs Python 3.11 or later (tomllib)" if sys.version_info < (3, 11) else "not a TOML file"
        raise UsageError(f"{path}: {why}")
    return tree


def read(path: str, sets: tuple[str, ...] = ()) -> ReadJob:
    """The torchtitan train config at `path` as parasim's job."""
    tree = parse(read_bounded(path, "torchtitan config"), path)
    job = ReadJob(
        path, "torchtitan", TITLE, values=with_sets(leaves(tree, path, "a torchtitan train config"), sets), sets=sets
    )
    _model(job)
    degrees = read_degrees(job)
    micro, microbatches, batch = read_batch(job, degrees)
    recompute = read_recompute(job)
    job.step = step_defaults(
        micro_batch=micro,
        microbatches=microbatches,
        global_batch=batch,
        recompute=recompute,
        precision=_precision(job),
        fusion=read_fusion(job),
        attention_kernel="fa2",  # PyTorch's scaled_dot_product_attention, whose flash backend is FlashAttention-2
    )
    # FSDP2 gathers the next layer and reduce-scatters beside compute; DDP all-reduces its buckets beside backward
    job.overlap += ["grad-reduce", "prefetch"] if job.layout["zero"] == 3 else ["grad-reduce"]
    async_tp = job.values.get(_P + "enable_async_tensor_parallel")
    if async_tp is not None:
        if not isinstance(async_tp, bool):
            raise UsageError(f"{path}: {_P}enable_async_tensor_parallel must be true or false, got {async_tp!r}")
        job.use(
            _P + "enable_async_tensor_parallel",
            "TP's collectives beside the products (--overlap tp)" if async_tp else "off",
        )
        if async_tp:
            job.overlap.append("tp")
    read_optimizer(job)
    account(job, FIELDS)
    return job


def _model(job: ReadJob) -> None:
    name, flavor = job.values.get("model.name"), job.values.get("model.flavor")
    f = FLAVORS.get((str(name), str(flavor)))
    if f is None:
        if name is not None:
            job.use("model.name", "a model parasim has no flavour table for (give its config.json by --config)")
        if flavor is not None:
            job.use("model.flavor", "(its sizes: from --config)")
        job.model_name = f"{name} {flavor}"
        return
    job.use("model.name", "torchtitan's Llama 3")
    job.use("model.flavor", f"{f.said()} (torchtitan's flavour table)")
    job.model = f.model_fields()


def read_degrees(job: ReadJob) -> dict[str, int | None]:
    """TP x CP x PP x (replicate x shard) DP; EP and ETP for MoE models. A shard degree of -1 is what the GPUs
    leave: the count then comes from --gpus."""
    shard_given = job.values.get(_P + "data_parallel_shard_degree")
    shard = None if shard_given == -1 else job.size(_P + "data_parallel_shard_degree")
    if shard_given is not None:
        job.use(
            _P + "data_parallel_shard_degree",
            "FSDP over the GPUs left over (ZeRO-3)" if shard is None else f"FSDP {shard} (ZeRO-3 over it x CP)",
        )
    replicate = job.size(_P + "data_parallel_replicate_degree") or 1
    if _P + "data_parallel_replicate_degree" in job.values:
        job.use(_P + "data_parallel_replicate_degree", f"{replicate} replica{'s' if replicate != 1 else ''}")
    if replicate > 1 and shard is not None and shard > 1:
        job.unmodelled.append(
            f"{_P}data_parallel_replicate_degree {replicate} with FSDP: HSDP, sharded within a replica and "
            f"all-reduced across replicas; parasim shards over the whole DP"
        )
    d = {}
    for axis, name in (
        ("tp", "tensor"),
        ("pp", "pipeline"),
        ("cp", "context"),
        ("ep", "expert"),
        ("etp", "expert_tensor"),
    ):
        d[axis] = job.size(f"{_P}{name}_parallel_degree") or 1
        if f"{_P}{name}_parallel_degree" in job.values:
            job.use(
                f"{_P}{name}_parallel_degree",
                f"{axis.upper()} {d[axis]}" + (" with SP" if axis == "tp" and d[axis] > 1 else ""),
            )
    # FSDP shards over the shard degree times CP (torchtitan's dp_shard_cp mesh): off only where both are 1
    zero = 0 if shard == 1 and d["cp"] == 1 else 3
    # with EP, the experts' TP is the file's (torchtitan's default: 1); without, TP's (a dense model has no other)
    etp = {"etp": d["etp"]} if d["ep"] > 1 else {}
    job.layout = layout_defaults(tp=d["tp"], cp=d["cp"], pp=d["pp"], ep=d["ep"], sp=d["tp"] > 1, zero=zero, **etp)
    if shard is not None:
        job.world = replicate * shard * d["tp"] * d["cp"] * d["pp"]
    else:
        job.assumed.append("FSDP takes the GPUs left over (a shard degree of -1): give --gpus N (without it, DP 1)")
    return {**d, "dp": None if shard is None else replicate * shard}


def read_batch(job: ReadJob, d: dict[str, int | None]) -> tuple[int, int | None, int | None]:
    """A GPU's sequences at once, the micro-batches a step and the global batch. Without PP a rank runs its
    local batch at once; with PP in micro-batches of pipeline_parallel_microbatch_size. The global batch
    (default -1: local x DP, one step) holds any further accumulation (train.py)."""
    local = job.size("training.local_batch_size") or 8  # job_config.py's default
    if "training.local_batch_size" in job.values:
        job.use("training.local_batch_size", f"{plural(local, 'sequence')} a DP rank a step")
    seq = job.size("training.seq_len")
    job.seq = seq if seq is not None else 2048
    if seq is not None:
        job.use("training.seq_len", f"sequences of {seq:,} tokens")
    else:
        job.assumed.append("no training.seq_len: torchtitan's default, 2,048 tokens")
    micro, count = local, 1
    if d["pp"] and d["pp"] > 1:
        micro = job.size(_P + "pipeline_parallel_microbatch_size") or 1
        if _P + "pipeline_parallel_microbatch_size" in job.values:
            job.use(_P + "pipeline_parallel_microbatch_size", f"micro-batches of {plural(micro, 'sequence')}")
        if local % micro:
            job.contradictions.append(
                f"training.local_batch_size {local} is not a multiple of the PP micro-batch {micro} "
                "(torchtitan refuses it)"
            )
        count = max(1, local // micro)
    given = job.values.get("training.global_batch_size")
    batch = job.size("training.global_batch_size") if given not in (None, -1) else None
    if given is not None:
        job.use(
            "training.global_batch_size", "local x DP (one step)" if batch is None else f"{batch:,} sequences a step"
        )
    if batch is not None and d["dp"]:
        if batch % (local * d["dp"]):
            job.contradictions.append(
                f"training.global_batch_size {batch:,} is not a multiple of local {local} x DP {d['dp']} "
                "(torchtitan refuses it)"
            )
    return micro, count, batch


def read_recompute(job: ReadJob) -> str:
    mode = job.values.get("activation_checkpoint.mode")
    if mode is None:
        job.assumed.append("no activation_checkpoint.mode: torchtitan's default, selective")
        return "selective"
    if mode not in RECOMPUTE:  # torchtitan's names are Megatron's: none, selective, full
        raise UsageError(f"{job.path}: activation_checkpoint.mode must be one of {', '.join(RECOMPUTE)}, got {mode!r}")
    job.use("activation_checkpoint.mode", f"{mode} recomputation")
    return str(mode)


def _precision(job: ReadJob) -> str:
    """fsdp2: FP32 parameters gathered in BF16; with torchao's FP8 linears fsdp2-fp8, gathered in FP8 where
    enable_fsdp_float8_all_gather says."""
    param = job.values.get("training.mixed_precision_param", "bfloat16")
    if "training.mixed_precision_param" in job.values:
        job.use("training.mixed_precision_param", f"weights gathered in {param}")
    converters = job.values.get("model.converters") or []
    if "model.converters" in job.values:
        job.use("model.converters", "torchao's FP8 linears" if "float8" in converters else "none parasim models")
    float8 = "float8" in converters
    gather = False
    if not float8:
        for name in [n for n in job.values if n.startswith("quantize.")]:  # settings of a converter not on
            job.read.add(name)
            job.no_effect.append(name)
    else:
        gather = bool(job.values.get("quantize.linear.float8.enable_fsdp_float8_all_gather"))
        if "quantize.linear.float8.enable_fsdp_float8_all_gather" in job.values:
            job.use(
                "quantize.linear.float8.enable_fsdp_float8_all_gather", "weights gathered in FP8" if gather else "off"
            )
    return precision_name(job, param, float8, gather)


def precision_name(job: ReadJob, param: Any, float8: bool, gather: bool) -> str:
    """The precision entry of a torchtitan job (either form): FP32 parameters gathered in `param` (fsdp2), with
    torchao's FP8 linears fsdp2-fp8 (gathered in FP8: fsdp2-fp8-gather); FP32 where the parameters are (and no FP8),
    or where TP or PP run without FSDP (torchtitan's maybe_enable_amp: mixed precision only under FSDP, HSDP or
    CP)."""
    if param == "float32" and not float8:
        return "fp32"
    if param != "bfloat16":
        raise UsageError(f"{job.path}: training.mixed_precision_param {param!r}: parasim has bfloat16 and float32")
    if float8:
        return "fsdp2-fp8-gather" if gather else "fsdp2-fp8"
    grid = job.layout
    if grid["zero"] == 0 and (grid["tp"] > 1 or grid["pp"] > 1):
        job.assumed.append("no FSDP with TP or PP: torchtitan trains in FP32 (precision fp32)")
        return "fp32"
    return "fsdp2"


def read_fusion(job: ReadJob) -> str:
    """torch.compile of the model fuses its elementwise work (timed as Megatron's fused kernels); without it
    each operation is a kernel of its own (torch-eager)."""
    enable = job.values.get("compile.enable")
    parts = job.values.get("compile.components", ["model", "loss"])
    if enable is not None:
        job.use("compile.enable", "torch.compile" if enable else "eager: a kernel per operation")
    if "compile.components" in job.values:
        if enable:
            job.use("compile.components", "the model's layers compiled" if "model" in parts else "the layers eager")
        else:
            job.read.add("compile.components")
            job.no_effect.append("compile.components")
    return "megatron" if enable and "model" in parts else "torch-eager"


def read_optimizer(job: ReadJob) -> None:
    name = job.values.get("optimizer.name")
    if name is None:
        return
    if str(name).lower() in ("adam", "adamw"):
        job.use("optimizer.name", "two FP32 moments a parameter")
    else:
        job.read.add("optimizer.name")
        job.unmodelled.append(f"optimizer.name {name!r}: parasim counts Adam's two moments a parameter")


def toml_text(tree: dict[str, Any]) -> str:
    """Tables of scalars and lists as TOML (what torchtitan's files hold): each table under its dotted header,
    a table's own values before its sub-tables."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # TOML's basic strings escape as JSON does
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise UsageError(f"a value TOML cannot hold here: {v!r}")

    def table(node: dict[str, Any], name: str) -> None:
        scalars = [(k, v) for k, v in node.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in node.items() if isinstance(v, dict)]
        if name and (scalars or not tables):
            lines.extend(["", f"[{name}]"])
        lines.extend(f"{k} = {value(v)}" for k, v in scalars)
        for k, v in tables:
            table(v, f"{name}.{k}" if name else k)

    table(tree, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def flavor_of(model: Any) -> tuple[str, str] | None:
    """The (name, flavour) of torchtitan's table whose shapes are `model`'s, if one is."""
    for key, f in FLAVORS.items():
        if (model.layers, model.hidden, model.heads, model.kv, model.ffn_size, model.vocab) == (
            f.n_layers,
            f.dim,
            f.n_heads,
            f.n_kv_heads or f.n_heads,
            f.ffn(),
            f.vocab_size,
        ):
            return key
    return None


def write(model: Any, plan: Any, seq: int, overlap: tuple[str, ...], job: ReadJob | None = None) -> Written:
    """`plan` as a torchtitan train config (TOML): the model's flavour, the batch, sequence, degrees,
    recomputation, compile and FP8 settings; over the `job` read from a torchtitan file, whose other fields
    come back as written. What torchtitan runs otherwise than the plan says is in the notes."""
    tree = tree_of(job if job is not None and job.format == "torchtitan" else None)
    notes = []
    flavor = flavor_of(model)
    if flavor is not None:
        set_field(tree, "model.name", flavor[0])
        set_field(tree, "model.flavor", flavor[1])
    else:
        notes.append(f"{model.name}: not one of torchtitan's Llama 3 flavours; [model] names your model's own")
    if plan.pp > 1:
        local = plan.micro_batch * plan.m
        set_field(tree, _P + "pipeline_parallel_microbatch_size", plan.micro_batch)
        steps = 1
    else:
        local, steps = plan.micro_batch, plan.m
    set_field(tree, "training.local_batch_size", local)
    set_field(tree, "training.global_batch_size", local * plan.dp * steps)
    set_field(tree, "training.seq_len", seq)
    replicate, shard = (1, plan.dp) if plan.zero else (plan.dp, 1)
    set_field(tree, _P + "data_parallel_replicate_degree", replicate)  # both, always: an absent shard degree is -1
    set_field(tree, _P + "data_parallel_shard_degree", shard)
    for name, v in (
        ("tensor_parallel_degree", plan.tp),
        ("pipeline_parallel_degree", plan.pp),
        ("context_parallel_degree", plan.cp),
        ("expert_parallel_degree", plan.ep),
        ("expert_tensor_parallel_degree", plan.etp),
    ):
        if v > 1 or _P + name in (job.values if job is not None and job.format == "torchtitan" else {}):
            set_field(tree, _P + name, v)
    if "tp" in overlap or _P + "enable_async_tensor_parallel" in tree.get("parallelism", {}):
        set_field(tree, _P + "enable_async_tensor_parallel", "tp" in overlap)
    set_field(tree, "activation_checkpoint.mode", plan.recompute)
    set_field(tree, "compile.enable", plan.fusion != "torch-eager")
    if plan.fusion != "torch-eager":
        set_field(tree, "compile.components", ["model", "loss"])
    precision = plan.precision
    if precision not in ("fsdp2", "fsdp2-fp8", "fsdp2-fp8-gather", "fp32"):
        notes.append(f"precision {precision}: torchtitan keeps FP32 weights gathered in BF16 (written as fsdp2)")
        precision = "fsdp2"
    set_field(tree, "training.mixed_precision_param", "float32" if precision == "fp32" else "bfloat16")
    converters = [c for c in tree.get("model", {}).get("converters", []) if c != "float8"]
    if precision.startswith("fsdp2-fp8"):
        converters.append("float8")
        set_field(tree, "quantize.linear.float8.enable_fsdp_float8_all_gather", precision == "fsdp2-fp8-gather")
    if converters or "converters" in tree.get("model", {}):
        set_field(tree, "model.converters", converters)
    if plan.zero in (1, 2):
        notes.append(f"ZeRO-{plan.zero}: torchtitan's FSDP shards the weights too (written as FSDP: ZeRO-3)")
    if plan.tp > 1 and not plan.sp:
        notes.append("TP without SP: torchtitan's TP always splits the sequence between its layers")
    notes += amp_note(plan)
    return Written("torchtitan", toml_text(tree), tuple(notes))


def amp_note(plan: Any) -> list[str]:
    """torchtitan's maybe_enable_amp: without FSDP, TP or PP train in FP32 whatever the plan's precision says."""
    if plan.zero == 0 and (plan.tp > 1 or plan.pp > 1) and plan.precision != "fp32":
        return [f"DDP with TP or PP: torchtitan trains in FP32 there (its maybe_enable_amp), not {plan.precision}"]
    return []

"""A DeepSpeed config (the ds_config JSON handed to `deepspeed.initialize` or the Hugging Face Trainer) as
parasim's plan: its ZeRO stage, batch, precision and AutoTP degree, every field accounted for.

The file never describes the model (that is the `torch.nn.Module` the code passes in), so a command takes
the model from beside it (--config, --model or sizes). Nor does it give the GPU count: DeepSpeed asserts
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x DP
(deepspeed/runtime/config.py, `_batch_assertion`), so where all three are numbers DP follows, and otherwise
the command's --gpus does. "auto" is a value the Hugging Face integrations fill from their own arguments before
DeepSpeed reads the file (accelerate's utils/dataclasses.py); parasim takes its own default and says so.
JobField names and meanings: deepspeedai/DeepSpeed@edaa722, deepspeed/runtime/config.py and zero/config.py
(tests/data/jobs/SURVEY.md, section 1).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import UsageError
from ..limits import brief, read_bounded, read_json
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

TITLE = "DeepSpeed config"
_Z = "zero_optimization."
_HOST = "parasim counts every byte on the GPU and times no PCIe transfer"
_BUCKET = "a bucket's buffer and how many collectives a step launches are not counted"
ADAM = ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam")  # optimizers that keep two moments a parameter

FIELDS: tuple[JobField, ...] = (
    JobField("train_batch_size", USED),
    JobField("train_micro_batch_size_per_gpu", USED),
    JobField("gradient_accumulation_steps", USED),
    JobField(_Z + "stage", USED),
    JobField("fp16.enabled", USED),
    JobField("bf16.enabled", USED),
    JobField("tensor_parallel.autotp_size", USED),
    JobField(_Z + "overlap_comm", USED),
    JobField("optimizer.type", USED),
    JobField(_Z + "reduce_scatter", USED),
    JobField(_Z + "allgather_partitions", USED),
    JobField(
        _Z + "offload_optimizer.device", UNMODELLED, f"the optimizer's states and step kept in host memory: {_HOST}"
    ),
    JobField(_Z + "offload_param.device", UNMODELLED, f"ZeRO-3's parameter shards kept in host memory: {_HOST}"),
    JobField(_Z + "offload_optimizer.**", NO_EFFECT),  # how the offload runs (pinned buffers, NVMe path, ratio)
    JobField(_Z + "offload_param.**", NO_EFFECT),
    JobField(_Z + "cpu_offload", UNMODELLED, f"the old name of offload_optimizer to the CPU: {_HOST}"),
    JobField(_Z + "cpu_offload_params", UNMODELLED, f"the old name of offload_param to the CPU: {_HOST}"),
    *(
        JobField(_Z + name, UNMODELLED, f"gradient and parameter buckets: {_BUCKET}")
        for name in ("reduce_bucket_size", "allgather_bucket_size")
    ),
    *(
        JobField(_Z + prefix + name, UNMODELLED, words)
        for prefix in ("stage3_", "")
        for name, words in (
            ("prefetch_bucket_size", "how much ZeRO-3 gathers ahead of use: parasim's prefetch holds one layer"),
            ("max_live_parameters", "gathered parameters ZeRO-3 keeps before it frees: parasim frees each layer's"),
            ("max_reuse_distance", "gathered parameters kept for reuse soon after: parasim gathers again"),
            ("param_persistence_threshold", "parameters smaller than this stay whole on every GPU: parasim shards all"),
        )
    ),
    JobField(
        _Z + "sub_group_size", UNMODELLED, "the optimizer steps this many parameters at a time: its buffers not counted"
    ),
    JobField(
        _Z + "contiguous_gradients",
        UNMODELLED,
        "gradients copied into one buffer as backward makes them: fragmentation, which parasim counts nowhere",
    ),
    JobField(_Z + "round_robin_gradients", UNMODELLED, "the order gradients are copied to the host under offload"),
    JobField(_Z + "zero_hpz_partition_size", UNMODELLED, "ZeRO++'s second copy of the weights inside a node"),
    JobField(_Z + "zero_quantized_weights", UNMODELLED, "ZeRO++ gathers weights as INT8: parasim gathers 16-bit"),
    JobField(_Z + "zero_quantized_gradients", UNMODELLED, "ZeRO++ reduces gradients as INT4: parasim reduces 16-bit"),
    JobField(_Z + "mics_shard_size", UNMODELLED, "MiCS shards within groups of this size, replicated across them"),
    *(
        JobField(_Z + name, NO_EFFECT)
        for name in (
            "stage3_gather_16bit_weights_on_model_save",
            "gather_16bit_weights_on_model_save",
            "ignore_unused_parameters",
            "load_from_fp32_weights",
            "elastic_checkpoint",
            "legacy_stage1",
        )
    ),
    JobField(
        "bf16.bf16_master_weights_and_grads",
        UNMODELLED,
        "no FP32 master weights or gradients: parasim counts the FP32 copy",
    ),
    JobField("bf16.bf16_optimizer_states", UNMODELLED, "Adam's moments in BF16: parasim counts them in FP32"),
    JobField("fp16.**", NO_EFFECT),  # loss scaling
    JobField("bf16.**", NO_EFFECT),
    JobField(
        "data_types.grad_accum_dtype", UNMODELLED, "the dtype gradients accumulate in: parasim takes the precision's"
    ),
    JobField(
        "communication_data_type", UNMODELLED, "the dtype gradients are reduced in: parasim takes the precision's"
    ),
    JobField(
        "activation_checkpointing.**",
        UNMODELLED,
        "settings of deepspeed.checkpointing, which acts only where the "
        "model's code calls it: the file does not turn recomputation on (give --recompute)",
    ),
    JobField(
        "sequence_parallel_size",
        UNMODELLED,
        "DeepSpeed-Ulysses: attention heads exchanged by all-to-all; parasim's CP is ring attention",
    ),
    JobField("expert_parallel.**", UNMODELLED, "AutoEP's expert parallelism: give --ep"),
    JobField("tensor_parallel.**", NO_EFFECT),
    JobField(
        "pipeline.**",
        UNMODELLED,
        "the pipeline engine's settings: its stages come from the model's PipelineModule, not the file (give --pp)",
    ),
    JobField("compile.**", UNMODELLED, "torch.compile: fused kernels, which parasim's --fusion chooses"),
    JobField("elasticity.**", UNMODELLED, "elastic training: batch and GPU count chosen at launch"),
    JobField("aio.**", UNMODELLED, f"NVMe offload's I/O: {_HOST}"),
    JobField("amp.**", UNMODELLED, "NVIDIA Apex's automatic mixed precision: parasim takes FP32"),
    JobField("data_efficiency.**", UNMODELLED, "curriculum learning and token dropping: sequences shorter than given"),
    JobField("curriculum_learning.**", UNMODELLED, "curriculum learning: sequences shorter than given early on"),
    *(
        JobField(name, NO_EFFECT)
        for name in (
            "optimizer.params.**",
            "scheduler.**",
            "gradient_clipping",
            "steps_per_print",
            "wall_clock_breakdown",
            "dump_state",
            "memory_breakdown",
            "prescale_gradients",
            "gradient_predivide_factor",
            "zero_allow_untested_optimizer",
            "zero_force_ds_cpu_optimizer",
            "tensorboard.**",
            "wandb.**",
            "csv_monitor.**",
            "comet.**",
            "monitor_config.**",
            "flops_profiler.**",
            "comms_logger.**",
            "checkpoint.**",
            "seed",
        )
    ),
)


def looks_like(tree: Any) -> bool:
    """A ds_config has at least one of DeepSpeed's own top-level fields."""
    marks = ("train_micro_batch_size_per_gpu", "train_batch_size", "zero_optimization", "gradient_accumulation_steps")
    return isinstance(tree, dict) and any(k in tree for k in marks)


def read(path: str, sets: tuple[str, ...] = ()) -> ReadJob:
    """The DeepSpeed config at `path` as parasim's plan."""
    tree = read_json(read_bounded(path, "DeepSpeed config"), path, "a DeepSpeed config (ds_config JSON)")
    job = ReadJob(path, "deepspeed", TITLE, values=with_sets(leaves(tree, path, "a DeepSpeed config"), sets), sets=sets)
    tp = _tp(job)
    zero = _zero(job)
    micro, dp, acc = _batch(job)
    # DP, where the batch fields give it, is the layout's (--pp or --gpus given beside the file keep or change it)
    job.layout = layout_defaults(tp=tp, zero=zero, **({"dp": dp} if dp is not None else {}))
    batch = job.size("train_batch_size")
    job.step = step_defaults(micro_batch=micro or 1, precision=_precision(job), microbatches=acc, global_batch=batch)
    if micro == 0:
        job.step["micro_from_batch"] = True
    job.assumed.append("the file gives no sequence length (give --seq S; without it, 4,096 tokens)")
    if dp is None:
        job.assumed.append("the file does not say how many GPUs (give --gpus N; without it, DP 1)")
    overlap = job.values.get(_Z + "overlap_comm")
    if overlap is not None:
        if not isinstance(overlap, bool):
            raise UsageError(f"{path}: zero_optimization.overlap_comm must be true or false, got {brief(overlap)}")
        job.use(_Z + "overlap_comm", "reductions beside backward (--overlap grad-reduce)" if overlap else "off")
        if overlap:
            job.overlap.append("grad-reduce")
    for name in ("offload_optimizer.device", "offload_param.device"):
        if job.values.get(_Z + name) == "none":
            job.use(_Z + name, "no offload")
    _optimizer(job)
    _flagged_false(
        job,
        "reduce_scatter",
        "gradients reduced by all-reduce and each GPU keeps its share: twice "
        "the bytes of the reduce-scatter parasim times",
    )
    _flagged_false(
        job,
        "allgather_partitions",
        "updated shards sent by a broadcast from each owner, not one all-gather: the same bytes in more collectives",
    )
    account(job, FIELDS)
    return job


def _tp(job: ReadJob) -> int:
    tp = job.size("tensor_parallel.autotp_size", least=0)
    if tp is None:
        return 1
    job.use("tensor_parallel.autotp_size", f"TP {max(tp, 1)} (AutoTP splits every linear layer; 0 is off)")
    return max(tp, 1)


def _zero(job: ReadJob) -> int:
    stage = job.size(_Z + "stage", least=0)
    if stage is None:
        job.assumed.append("no zero_optimization.stage: ZeRO off (DeepSpeed's default, stage 0)")
        return 0
    if stage > 3:
        from ..errors import UsageError

        raise UsageError(f"{job.path}: zero_optimization.stage must be 0 to 3, got {stage}")
    words = (
        "off: every GPU holds the whole model state",
        "optimizer states sharded over DP",
        "optimizer states and gradients sharded over DP",
        "weights, gradients and optimizer states sharded over DP",
    )
    job.use(_Z + "stage", f"ZeRO-{stage} ({words[stage]})")
    return stage


def _batch(job: ReadJob) -> tuple[int, int | None, int | None]:
    """The micro-batch (sequences a GPU runs at once), DP where the three batch fields give it and the
    micro-batches a step (accumulation) where given. DeepSpeed fills any one of the three from the other two
    and DP (config.py, `_set_batch_related_parameters`); without DP only all three give it."""
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    batch, micro, acc = (job.size(n) for n in names)
    for n in names:
        if job.values.get(n) == "auto":
            job.read.add(n)
            job.assumed.append(
                f'{n} is "auto" (the Hugging Face Trainer or accelerate fills it from its own arguments): '
                + ("parasim takes 1 (give --micro-batch B)" if n == names[1] else "parasim leaves it open")
            )
    dp = None
    if batch is not None and micro is not None and acc is not None:
        if batch % (micro * acc):
            job.contradictions.append(
                f"train_batch_size {batch:,} is not train_micro_batch_size_per_gpu {micro} x "
                f"gradient_accumulation_steps {acc} x a whole DP (DeepSpeed refuses it): parasim takes DP "
                f"{max(1, batch // (micro * acc)):,}"
            )
        dp = max(1, batch // (micro * acc))
    if batch is not None:
        job.use(names[0], f"{plural(batch, 'sequence')} a step, all replicas together")
    if micro is not None:
        job.use(names[1], f"a micro-batch of {plural(micro, 'sequence')} a GPU")
    if acc is not None:
        job.use(names[2], f"{plural(acc, 'micro-batch')} a step")
    # said only where the equation holds (else a contradiction says why not)
    if dp is not None and micro is not None and acc is not None and batch == dp * micro * acc:
        job.used.append(("(the three together)", f"DP {dp:,} = {batch:,} / ({micro} x {acc})"))
    if micro is None and batch is not None:
        # DeepSpeed fills the micro-batch from the batch: batch / (accumulation x DP), accumulation 1 where not
        # given; DP is the GPUs', known once the plan is made (megatron/job.py's plan_of: "micro_from_batch")
        job.assumed.append(
            f"no train_micro_batch_size_per_gpu: DeepSpeed takes train_batch_size / (gradient_accumulation_steps "
            f"x DP) = {batch:,} / ({acc or 1} x DP) once DP is known"
        )
        return 0, dp, acc or 1
    return micro or 1, dp, acc


def _precision(job: ReadJob) -> str:
    fp16, bf16 = job.values.get("fp16.enabled"), job.values.get("bf16.enabled")
    if fp16 is True and bf16 is True:
        job.contradictions.append("fp16 and bf16 both enabled (DeepSpeed refuses it): parasim takes bf16")
    if bf16 is True:
        job.use("bf16.enabled", "BF16 weights and gradients, FP32 master weights and Adam (precision post)")
        return "post"
    if fp16 is True:
        job.use("fp16.enabled", "FP16 weights and gradients, FP32 master weights and Adam (precision deepspeed-fp16)")
        return "deepspeed-fp16"
    if fp16 == "auto" and bf16 is False:  # the Trainer may turn FP16 on; BF16 is off
        job.read.update(("fp16.enabled", "bf16.enabled"))
        job.assumed.append(
            'fp16.enabled is "auto" and bf16.enabled false: parasim takes FP16 (precision deepspeed-fp16; give '
            "--precision fp32 if the Trainer runs without --fp16)"
        )
        return "deepspeed-fp16"
    if "auto" in (fp16, bf16):
        for n in ("fp16.enabled", "bf16.enabled"):
            if job.values.get(n) == "auto":
                job.read.add(n)
        job.assumed.append(
            'fp16.enabled and bf16.enabled are "auto" (the Trainer\'s --bf16 or --fp16 decides): parasim takes BF16 '
            "(precision post; give --precision deepspeed-fp16 for FP16)"
        )
        return "post"
    for n in ("fp16.enabled", "bf16.enabled"):
        job.use(n, "off")
    return "fp32"


def _optimizer(job: ReadJob) -> None:
    kind = job.values.get("optimizer.type")
    if kind is None:
        return
    if isinstance(kind, str) and kind.replace("_", "").lower() in ADAM:
        job.use("optimizer.type", "Adam: two FP32 moments a parameter, as parasim counts")
    else:
        job.read.add("optimizer.type")
        job.unmodelled.append(f"optimizer.type {kind!r}: parasim counts Adam's two moments a parameter")


def _flagged_false(job: ReadJob, name: str, words: str) -> None:
    """A ZeRO switch whose default parasim models: true is read as it, false left out with `words`."""
    v = job.values.get(_Z + name)
    if v is None:
        return
    if v is False:
        job.read.add(_Z + name)
        job.unmodelled.append(f"{_Z}{name} false: {words}")
    else:
        job.use(_Z + name, "as parasim models it")


# the precision entries DeepSpeed has a switch for, and the switch
PRECISION_SWITCH = {"post": "bf16", "deepspeed-fp16": "fp16", "fp32": None}


def write(model: Any, plan: Any, seq: int, overlap: tuple[str, ...], job: ReadJob | None = None) -> Written:
    """`plan` as a ds_config: the batch fields (all three, so DeepSpeed's arithmetic gives back the plan's DP),
    the ZeRO stage, the precision switch, AutoTP's degree and overlap_comm; over the `job` read from a DeepSpeed
    file, whose other fields come back as written. What DeepSpeed's config cannot hold (pipeline stages, CP,
    experts, SP, recomputation: set in the model's code) is said in the notes."""
    tree = tree_of(job if job is not None and job.format == "deepspeed" else None)
    for name, value in (
        ("train_batch_size", plan.micro_batch * plan.m * plan.dp),
        ("train_micro_batch_size_per_gpu", plan.micro_batch),
        ("gradient_accumulation_steps", plan.m),
        (_Z + "stage", plan.zero),
        (_Z + "overlap_comm", "grad-reduce" in overlap),
    ):
        set_field(tree, name, value)
    notes = []
    switch = PRECISION_SWITCH.get(plan.precision, "bf16")
    if plan.precision not in PRECISION_SWITCH:
        notes.append(f"precision {plan.precision} has no DeepSpeed switch: written as bf16 (precision post)")
    for name in ("fp16", "bf16"):
        set_field(tree, f"{name}.enabled", name == switch)
    if plan.tp > 1 or "tensor_parallel" in tree:
        set_field(tree, "tensor_parallel.autotp_size", plan.tp if plan.tp > 1 else 0)
    said = {
        "pp": "pipeline stages come from the model's PipelineModule",
        "cp": "context parallelism (DeepSpeed's sequence_parallel_size is Ulysses, not ring attention)",
        "ep": "expert parallelism is set where the model builds its MoE layers",
    }
    for axis, words in said.items():
        if getattr(plan, axis) > 1:
            notes.append(f"{axis.upper()} {getattr(plan, axis)}: not in a ds_config ({words})")
    if plan.recompute != "none":
        notes.append(f"{plan.recompute} recomputation: the model's code turns it on (gradient checkpointing)")
    if seq:
        notes.append(f"sequences of {seq:,} tokens: the data loader's, not the config's")
    return Written("deepspeed", json.dumps(tree, indent=2) + "\n", tuple(notes))

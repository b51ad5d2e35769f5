"""A picotron job (the config.json its create_config.py writes from template/base_config.json and train.py
reads) as parasim's model overrides, layout and step, every field accounted for.

picotron names a Hugging Face model by its id and sets three of its sizes (train.py loads the id's config and
puts num_hidden_layers, num_attention_heads and num_key_value_heads in its place), so a command takes that
model's config.json from beside the file (--config) and the file's three sizes over it. Its grid is TP x CP x
PP x DP, DP plain replication with gradients all-reduced over CP x DP (no ZeRO), pipelines run "1f1b" or "afab"
(all forward, all backward), and train.py computes in BF16 where the GPU has it. JobField names and what train.py
does with them: huggingface/picotron@59714b1 (tests/data/jobs/SURVEY.md, section 2).
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

TITLE = "picotron config"
GRID = ("distributed.tp_size", "distributed.cp_size", "distributed.pp_size", "distributed.dp_size")  # its 4-D grid
ENGINES = {"1f1b": "1F1B", "afab": "all forward, then all backward (GPipe's order)"}

FIELDS: tuple[JobField, ...] = (
    *(JobField(name, USED) for name in GRID),
    JobField("distributed.pp_engine", USED),
    JobField("model.name", USED),
    *(JobField(f"model.{n}", USED) for n in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads")),
    JobField("training.seq_length", USED),
    JobField("training.micro_batch_size", USED),
    JobField("training.gradient_accumulation_steps", USED),
    JobField("distributed.use_cpu", USED),
    JobField("distributed.backend", NO_EFFECT),
    # train.py never reads these two (it takes BF16 where the GPU has it, and FlashAttention from FLASH_ATTEN)
    JobField("model.dtype", NO_EFFECT),
    JobField("model.use_flash_attention", NO_EFFECT),
    JobField("model.use_fused_adam", NO_EFFECT),  # the same Adam states, in one kernel
    JobField("environment.FLASH_ATTEN", USED),
    JobField("environment.**", NO_EFFECT),
    JobField("training.local_batch_size", UNMODELLED, "an older template's field, not read by train.py now"),
    *(
        JobField(name, NO_EFFECT)
        for name in (
            "training.seed",
            "training.learning_rate",
            "training.total_train_steps",
            "training.num_samples",
            "training.max_tokens",
            "dataset.**",
            "checkpoint.**",
            "logging.**",
        )
    ),
)


def looks_like(tree: Any) -> bool:
    """picotron's file has a "distributed" section with its grid's sizes."""
    grid = tree.get("distributed") if isinstance(tree, dict) else None
    return isinstance(grid, dict) and any(name.split(".")[1] in grid for name in GRID)


def read(path: str, sets: tuple[str, ...] = ()) -> ReadJob:
    """The picotron config at `path` as parasim's job."""
    tree = read_json(read_bounded(path, "picotron config"), path, "a picotron config.json")
    job = ReadJob(path, "picotron", TITLE, values=with_sets(leaves(tree, path, "a picotron config"), sets), sets=sets)
    sizes = {_axis(name): job.size(name) or 1 for name in GRID}
    for name in GRID:
        if name in job.values:
            job.use(name, f"{_axis(name).upper()} {sizes[_axis(name)]}")
    engine = job.values.get("distributed.pp_engine")
    if engine is not None:
        if not isinstance(engine, str) or engine not in ENGINES:
            raise UsageError(
                f"{path}: distributed.pp_engine must be 1f1b or afab (train.py refuses others), got {brief(engine)}"
            )
        job.use("distributed.pp_engine", ENGINES[engine])
        if engine == "afab" and sizes["pp"] > 1:
            job.unmodelled.append(
                'distributed.pp_engine "afab": every micro-batch\'s activations held at once on each stage; '
                "parasim plans 1F1B's (at most PP in flight)"
            )
    if job.values.get("distributed.use_cpu") is True:
        job.read.add("distributed.use_cpu")
        job.unmodelled.append("distributed.use_cpu true: ranks on CPUs over gloo; parasim plans GPUs")
    else:
        job.use("distributed.use_cpu", "GPUs")
    job.layout = layout_defaults(tp=sizes["tp"], cp=sizes["cp"], pp=sizes["pp"], zero=0)
    job.world = sizes["tp"] * sizes["cp"] * sizes["pp"] * sizes["dp"]
    _model(job)
    micro = job.size("training.micro_batch_size")
    acc = job.size("training.gradient_accumulation_steps")
    if micro is not None:
        job.use("training.micro_batch_size", f"a micro-batch of {plural(micro, 'sequence')} a DP rank")
    if acc is not None:
        job.use("training.gradient_accumulation_steps", f"{plural(acc, 'micro-batch')} a step")
    job.seq = job.size("training.seq_length")
    if job.seq is not None:
        job.use("training.seq_length", f"sequences of {job.seq:,} tokens")
        if job.seq % sizes["cp"]:
            job.contradictions.append(
                f"training.seq_length {job.seq:,} does not divide over CP {sizes['cp']} (train.py refuses it)"
            )
    flash = job.values.get("environment.FLASH_ATTEN")
    if flash is not None:
        # "0": PyTorch's scaled_dot_product_attention (model.py), which keeps no scores either
        job.use("environment.FLASH_ATTEN", "FlashAttention" if str(flash) == "1" else "PyTorch's SDPA")
    job.step = step_defaults(
        micro_batch=micro or 1,
        microbatches=acc,
        precision="bf16-pure" if sizes["dp"] == 1 else "bf16-pure-dp",
    )
    job.overlap.append("grad-reduce")  # picotron's buckets all-reduce as backward fills them (async_op=True)
    job.assumed.append(
        "precision: train.py casts the model to BF16 on a GPU that has it (FP32 otherwise) and AdamW keeps its "
        "moments in BF16 too; with DP > 1 gradients gather in FP32 buckets, all-reduced in FP32 beside backward "
        f"(precision {job.step['precision']}, overlap grad-reduce)"
    )
    account(job, FIELDS)
    return job


def _axis(name: str) -> str:
    """distributed.tp_size's axis: tp."""
    return name.split(".")[1].removesuffix("_size")


def _model(job: ReadJob) -> None:
    """The model's id, and the sizes the file sets over that model's own config."""
    name = job.values.get("model.name")
    if name is not None:
        job.model_name = str(name)
        job.use("model.name", "the Hugging Face model (give its config.json by --config)")
    for field_, key, words in (
        ("model.num_hidden_layers", "layers", "layers"),
        ("model.num_attention_heads", "heads", "attention heads"),
        ("model.num_key_value_heads", "kv_heads", "key/value heads"),
    ):
        v = job.size(field_)
        if v is not None:
            job.model[key] = v
            job.use(field_, f"{v} {words}, in place of the model's own")


def write(model: Any, plan: Any, seq: int, overlap: tuple[str, ...], job: ReadJob | None = None) -> Written:
    """`plan` as picotron's config.json: its grid, engine, sequence, micro-batch and accumulation, and the
    model's three sizes picotron sets over its Hugging Face model; over the `job` read from a picotron file,
    whose other fields come back as written. What picotron cannot run is said in the notes."""
    tree = tree_of(job if job is not None and job.format == "picotron" else None)
    for name, value in (
        *((g, getattr(plan, _axis(g))) for g in GRID),
        ("distributed.pp_engine", tree.get("distributed", {}).get("pp_engine", "1f1b")),
        ("model.num_hidden_layers", model.layers),
        ("model.num_attention_heads", model.heads),
        ("model.num_key_value_heads", model.kv),
        ("training.seq_length", seq),
        ("training.micro_batch_size", plan.micro_batch),
        ("training.gradient_accumulation_steps", plan.m),
    ):
        set_field(tree, name, value)
    if "name" not in tree["model"]:
        tree["model"]["name"] = model.name  # picotron loads this id's config: the user's own model goes here
    notes = []
    if plan.zero:
        notes.append(f"ZeRO-{plan.zero}: picotron's DP replicates the model state (written as plain DP)")
    if plan.sp:
        notes.append("SP: picotron's TP keeps whole activations between its layers")
    if plan.ep > 1 or model.experts:
        notes.append("experts: picotron's models are dense")
    if plan.recompute != "none":
        notes.append(f"{plan.recompute} recomputation: picotron keeps every activation")
    if plan.precision != ("bf16-pure" if plan.dp == 1 else "bf16-pure-dp"):
        notes.append(f"precision {plan.precision}: picotron trains the model cast to BF16 (bf16-pure, FP32 DP buckets)")
    if job is None or job.format != "picotron":
        notes.append(
            "written without a picotron file: only the fields parasim plans; picotron's train.py also reads its "
            "template's environment, dataset, logging and training settings (template/base_config.json), and "
            "model.name must be a Hugging Face model id"
        )
    return Written("picotron", json.dumps(tree, indent=4) + "\n", tuple(notes))

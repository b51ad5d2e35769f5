"""torchtitan's Python config registry (since 2026-02, torchtitan@9810191 "Config System Refactor: TOML to Python
Dataclass Registry"), as parasim's model, layout and step: `--job config_registry.py:llama3_70b` reads the function
a torchtitan run names by `--module llama3 --config llama3_70b`, and `--job-set parallelism.tensor_parallel_degree=8`
stands for the run's `--parallelism.tensor_parallel_degree 8`.

The file is never imported or run (it imports torchtitan): its syntax tree is read, and only what a config function
writes plainly is taken: literals, arithmetic on numbers, the function's own names, another function of the same
file (`config = llama3_debugmodel()` then `config.training.steps = 10`), and calls, whose keyword arguments are the
config's fields. An expression parasim cannot work out is kept as its text and named where it matters.

Fields, flattened to dotted names as the TOML files had them: a job_config class (TrainingConfig, ParallelismConfig,
CompileConfig, ...) is a table of its keyword arguments; any other call also gives its own field, the call in words
(`activation_checkpoint` = "FullAC.Config()", `model_spec` = 'model_registry("70B")', `loss` =
"ChunkedLossWrapper.Config(...)"). The fields the TOML files share keep torchtitan.py's meanings and table; the
registry's own (token-based batch sizes, the AC class, the converters, the chunked loss, compile's async TP) are
read here. Field names and defaults: torchtitan@b5bcd76 torchtitan/config/configs.py
(tests/data/jobs/torchtitan/torchtitan_configs.py) and models/llama3/config_registry.py.
"""

from __future__ import annotations

import ast
from typing import Any

from ..errors import UsageError
from ..limits import brief, read_bounded
from .torchtitan import FIELDS as TOML_FIELDS
from .torchtitan import (
    FLAVORS,
    amp_note,
    precision_name,
    flavor_of,
    read_batch,
    read_degrees,
    read_fusion,
    read_optimizer,
    read_recompute,
)
from .read import (
    FIELDS_AT_MOST,
    NO_EFFECT,
    UNMODELLED,
    USED,
    JobField,
    ReadJob,
    account,
    plural,
    step_defaults,
    with_sets,
    Written,
)

TITLE = "torchtitan config function"
_P = "parallelism."
CALLS_AT_MOST = 8  # config functions one may call in turn (the registry's deepest is 2: debugmodel -> float8)
# job_config's classes: a call of one is a table of its fields, not a field of its own
CONTAINERS = (
    "Trainer.Config",
    "TrainingConfig",
    "ParallelismConfig",
    "CompileConfig",
    "CommConfig",
    "DebugConfig",
    "ActivationCheckpointConfig",  # the registry's first form (torchtitan@9810191): its mode is a field
    "ModelConvertersContainer.Config",
)
CONVERTERS = ("model_spec.converters", "model_converters.converters")  # the registry's second form, then its first
CALL, ARGS = "(call)", "(args)"  # a call's name and positional arguments, inside the dict of its keywords
ARITHMETIC = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


class Opaque(str):
    """An expression parasim does not work out (a condition, another module's function): kept as its text."""


FIELDS: tuple[JobField, ...] = (
    JobField("model_spec", USED),
    *(JobField(name, USED) for name in CONVERTERS),
    JobField("model_spec.**", UNMODELLED, "model options parasim has no entry for (kernels, attention backends)"),
    JobField("training.num_tokens_per_microbatch_per_dp_rank", USED),
    JobField("training.max_context_length", USED),
    JobField("training.num_tokens_per_train_step", USED),
    JobField(_P + "num_pp_microbatches", USED),
    JobField(_P + "enable_sequence_parallel", USED),
    JobField("compile.enable_async_tensor_parallel", USED),
    JobField(_P + "enable_async_tensor_parallel", USED),
    JobField("activation_checkpoint", USED),
    JobField("activation_checkpoint.**", UNMODELLED, "the AC policy's settings: parasim's recomputation is Megatron's"),
    JobField("loss", USED),
    JobField("optimizer", USED),
    JobField("training.dtype", UNMODELLED, "the parameters' dtype outside FSDP's mixed precision"),
    JobField(_P + "spmd_backend", NO_EFFECT),
    JobField(_P + "enable_fsdp_symm_mem", UNMODELLED, "FSDP's collectives over symmetric memory: timed as NCCL's"),
    *(
        JobField(name, NO_EFFECT)
        for name in (
            "hf_assets_path",
            "loss.**",
            "optimizer.**",
            "profiler",
            "profiler.**",
            "metrics",
            "metrics.**",
            "dataloader",
            "dataloader.**",
            "checkpoint",
            "checkpoint.**",
            "validator",
            "validator.**",
            "lr_scheduler",
            "lr_scheduler.**",
            "debug.**",
            "training.gc_freq",
            "training.gc_debug",
            "training.disable_cuda_graphs",
        )
    ),
    *TOML_FIELDS,
)


# -- the syntax tree, read ------------------------------------------------------------------------------------
def split_path(given: str) -> tuple[str, str | None]:
    """`FILE.py:FUNCTION` as (FILE.py, FUNCTION); a path without a function as (path, None)."""
    path, colon, fn = given.rpartition(":")
    if colon and path.endswith(".py") and fn.isidentifier():
        return path, fn
    return given, None


def looks_like_path(given: str) -> bool:
    return split_path(given)[0].endswith(".py")


def registry_values(given: str) -> tuple[str, dict[str, Any]]:
    """The config function's fields, flattened (dotted name -> value), and the function's name."""
    path, fn = split_path(given)
    text = read_bounded(path, "torchtitan config registry").decode("utf-8-sig", errors="replace")
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path}: not a Python file parasim can read ({brief(str(exc))})") from None
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    configs = [name for name, f in funcs.items() if f.returns is not None and "Config" in ast.unparse(f.returns)]
    if fn is None:
        shown = ", ".join(configs[:12]) + (", ..." if len(configs) > 12 else "")
        raise UsageError(f"{path}: name the config function as {path}:NAME (torchtitan's --config NAME): {shown}")
    if fn not in funcs:
        raise UsageError(f"{path}: no function {fn!r} (its config functions: {', '.join(configs[:12]) or 'none'})")
    try:
        config = _Reader(path, funcs).function(fn, 0)
    except RecursionError:
        raise UsageError(f"{path}: {fn} nests too deeply to read") from None
    if not isinstance(config, dict) or config.get(CALL) != "Trainer.Config":
        raise UsageError(f"{path}: {fn} does not return a Trainer.Config parasim can read")
    values: dict[str, Any] = {}
    _flatten(config, "", values)
    return fn, values


class _Reader:
    """Works out a config function's return value from its syntax, never running it."""

    def __init__(self, path: str, funcs: dict[str, ast.FunctionDef]) -> None:
        self.path, self.funcs = path, funcs

    def function(self, name: str, depth: int) -> Any:
        if depth > CALLS_AT_MOST:
            raise UsageError(f"{self.path}: {name}: config functions call each other more than {CALLS_AT_MOST} deep")
        env: dict[str, Any] = {}
        for stmt in self.funcs[name].body:
            if isinstance(stmt, ast.Return):
                return self.value(stmt.value, env, depth) if stmt.value is not None else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self.assign(stmt.targets[0], self.value(stmt.value, env, depth), env)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            elif isinstance(stmt, (ast.Assert, ast.Import, ast.ImportFrom, ast.FunctionDef)):
                continue  # a check, an import or a helper: none sets a field (a helper's result is an expression)
            else:
                raise UsageError(
                    f"{self.path}:{stmt.lineno}: {name}: parasim reads a config function's plain assignments and its "
                    f"return, not {brief(ast.unparse(stmt).splitlines()[0])}"
                )
        raise UsageError(f"{self.path}: {name} returns nothing")

    def assign(self, target: ast.expr, value: Any, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        chain: list[str] = []
        node: ast.expr = target
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or not isinstance(env.get(node.id), dict):
            raise UsageError(f"{self.path}:{target.lineno}: cannot follow {brief(ast.unparse(target))}")
        here = env[node.id]
        for key in chain[:-1]:
            here = here.setdefault(key, {})
            if not isinstance(here, dict):
                raise UsageError(f"{self.path}:{target.lineno}: {brief(ast.unparse(target))} sets inside a value")
        here[chain[-1]] = value

    def value(self, node: ast.expr, env: dict[str, Any], depth: int) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(x, env, depth) for x in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.value(node.operand, env, depth)
            return -v if _number(v) else Opaque(ast.unparse(node))
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            a, b = self.value(node.left, env, depth), self.value(node.right, env, depth)
            # sizes only: small enough that a product stays bounded, and no division by zero
            if _number(a) and _number(b) and abs(a) < 2**31 and abs(b) < 2**31 and (b or type(node.op) is ast.Add):
                return ARITHMETIC[type(node.op)](a, b)
            return Opaque(ast.unparse(node))
        if isinstance(node, ast.Name):
            return env.get(node.id, Opaque(node.id))
        if isinstance(node, ast.Attribute):
            base = self.value(node.value, env, depth)
            if isinstance(base, dict) and node.attr in base:
                return base[node.attr]
            return Opaque(ast.unparse(node))
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            if callee in self.funcs and not node.args and not node.keywords:
                return self.function(callee, depth + 1)  # a config built on another's (each call builds anew)
            out: dict[str, Any] = {CALL: callee, ARGS: [self.value(a, env, depth) for a in node.args]}
            for kw in node.keywords:
                if kw.arg is None:
                    return Opaque(ast.unparse(node))  # **kwargs: fields parasim cannot name
                out[kw.arg] = self.value(kw.value, env, depth)
            return out
        return Opaque(ast.unparse(node))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def call_text(call: dict[str, Any], whole: bool = False) -> str:
    """A call in words: its name and positional arguments, and `...` for its keywords (all of them, `whole`)."""
    parts = [_text(a) for a in call[ARGS]]
    keywords = [(k, v) for k, v in call.items() if k not in (CALL, ARGS)]
    if whole:
        parts += [f"{k}={_text(v)}" for k, v in keywords]
    elif keywords:
        parts.append("...")
    return f"{call[CALL]}({', '.join(parts)})"


def _text(v: Any) -> str:
    if isinstance(v, dict) and CALL in v:
        return call_text(v, whole=True)
    if isinstance(v, Opaque):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_text(x) for x in v) + "]"
    return repr(v)


def _flatten(node: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    if len(out) > FIELDS_AT_MOST:
        raise UsageError(f"a torchtitan config with more than {FIELDS_AT_MOST:,} fields")
    if CALL in node and node[CALL] not in CONTAINERS and prefix:
        out[prefix] = call_text(node)
    for k, v in node.items():
        if k in (CALL, ARGS):
            continue
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            _flatten(v, name, out)
        elif isinstance(v, list):
            out[name] = [call_text(x, whole=True) if isinstance(x, dict) and CALL in x else x for x in v]
        else:
            out[name] = str(v) if isinstance(v, Opaque) else v


# -- the job ----------------------------------------------------------------------------------------------------
def read(given: str, sets: tuple[str, ...] = ()) -> ReadJob:
    """The config function `given` (FILE.py:NAME) as parasim's job, each of `sets` (NAME=VALUE, torchtitan's
    command-line overrides) in place of the function's field."""
    fn, values = registry_values(given)
    job = ReadJob(given, "torchtitan-py", TITLE, values=with_sets(values, sets), sets=sets)
    _model(job, fn)
    degrees = read_degrees(job)
    if job.values.get(_P + "enable_sequence_parallel") is not None:
        sp = _flag(job, _P + "enable_sequence_parallel")
        job.use(_P + "enable_sequence_parallel", "TP splits the sequence between its layers (SP)" if sp else "off")
        job.layout["sp"] = sp and job.layout["tp"] > 1
    micro, microbatches, batch = _batch(job, degrees)
    job.step = step_defaults(
        micro_batch=micro,
        microbatches=microbatches,
        global_batch=batch,
        recompute=_recompute(job),
        precision=_precision(job),
        fusion=read_fusion(job),
        attention_kernel="fa2",  # PyTorch's scaled_dot_product_attention, as the TOML form
        chunked_loss=_loss(job),
    )
    job.overlap += ["grad-reduce", "prefetch"] if job.layout["zero"] == 3 else ["grad-reduce"]
    for name in ("compile.enable_async_tensor_parallel", _P + "enable_async_tensor_parallel"):  # now, then at first
        if job.values.get(name) is None:
            continue
        on = _flag(job, name)
        job.use(name, "TP's collectives beside the products (--overlap tp)" if on else "off")
        if on and "tp" not in job.overlap:
            job.overlap.append("tp")
    _optimizer(job)
    account(job, FIELDS)
    return job


def _flag(job: ReadJob, name: str) -> bool:
    v = job.values[name]
    if not isinstance(v, bool):
        raise UsageError(f"{job.path}: {name} must be True or False, got {brief(v)}")
    return v


def _model(job: ReadJob, fn: str) -> None:
    """model_registry("70B") in a module named for its model (torchtitan's `--module llama3`): the module is the
    function name's first part (llama3_70b); its flavour from torchtitan's table."""
    spec = job.values.get("model_spec")
    module = fn.split("_", 1)[0]
    call = ast.parse(spec, mode="eval").body if isinstance(spec, str) and spec.startswith("model_registry(") else None
    args = call.args if isinstance(call, ast.Call) else []
    flavor = str(args[0].value) if args and isinstance(args[0], ast.Constant) else None
    f = FLAVORS.get((module, str(flavor)))
    if f is None:
        if spec is not None:
            job.use("model_spec", f"{module} {flavor}: no flavour table in parasim (give its config.json by --config)")
        job.model_name = f"{module} {flavor}"
        return
    job.use("model_spec", f"torchtitan's {module} {flavor}: {f.said()}")
    job.model = f.model_fields()


def _batch(job: ReadJob, d: dict[str, int | None]) -> tuple[int, int | None, int | None]:
    """Token-based sizes (configs.py's TrainingConfig): a DP rank's tokens in one forward over the context length
    is its micro-batch of sequences; with PP, num_pp_microbatches of them; the step's tokens (default -1: one
    forward of every DP rank, times the micro-batches) give the global batch. The registry's first form
    (local_batch_size and seq_len) is read as the TOML files are."""
    if "training.local_batch_size" in job.values or "training.seq_len" in job.values:
        return read_batch(job, d)
    tokens = job.size("training.num_tokens_per_microbatch_per_dp_rank") or 16384  # configs.py's defaults
    context = job.size("training.max_context_length") or 2048
    job.seq = context
    micro = max(1, tokens // context)
    for name, value, said in (
        ("training.max_context_length", context, f"sequences of {context:,} tokens"),
        ("training.num_tokens_per_microbatch_per_dp_rank", tokens, f"{plural(micro, 'sequence')} a DP rank a forward"),
    ):
        if name in job.values:
            job.use(name, said)
        else:
            job.assumed.append(f"no {name}: torchtitan's default, {value:,}")
    if tokens % context:
        job.contradictions.append(
            f"training.num_tokens_per_microbatch_per_dp_rank {tokens:,} is not a multiple of max_context_length "
            f"{context:,}: parasim plans {plural(max(1, tokens // context), 'whole sequence')}"
        )
    count = 1
    if d["pp"] and d["pp"] > 1:
        count = job.size(_P + "num_pp_microbatches") or 1
        if _P + "num_pp_microbatches" in job.values:
            job.use(_P + "num_pp_microbatches", f"{plural(count, 'micro-batch')} a step")
    elif _P + "num_pp_microbatches" in job.values:
        job.read.add(_P + "num_pp_microbatches")
        job.no_effect.append(_P + "num_pp_microbatches")  # configs.py: ignored without PP
    step = job.values.get("training.num_tokens_per_train_step")
    batch = None
    if step not in (None, -1):
        total = job.size("training.num_tokens_per_train_step") or 0
        batch = max(1, total // context)
        job.use("training.num_tokens_per_train_step", f"{plural(batch, 'sequence')} a step")
        if d["dp"] and total % (tokens * count * d["dp"]):
            job.contradictions.append(
                f"training.num_tokens_per_train_step {total:,} is not a multiple of a step's forwards "
                f"({tokens:,} x {count} x DP {d['dp']}; torchtitan refuses it)"
            )
    elif step == -1:
        job.use("training.num_tokens_per_train_step", "one forward of every DP rank (x the PP micro-batches)")
    return micro, count, batch


def _recompute(job: ReadJob) -> str:
    """The AC class: FullAC full, SelectiveAC selective, NoAC none; the first registry's
    ActivationCheckpointConfig(mode=...) by its mode."""
    mode = job.values.get("activation_checkpoint.mode")
    if mode is not None:
        job.read.add("activation_checkpoint")
        return read_recompute(job)
    ac = job.values.get("activation_checkpoint")
    if ac is None:
        job.assumed.append("no activation_checkpoint: parasim assumes none")
        return "none"
    name = str(ac).split("(", 1)[0].split(".", 1)[0]
    kinds = {"FullAC": "full", "SelectiveAC": "selective", "NoAC": "none"}
    if name not in kinds:
        raise UsageError(f"{job.path}: activation_checkpoint {brief(ac)}: parasim knows FullAC, SelectiveAC and NoAC")
    job.use(
        "activation_checkpoint",
        f"{kinds[name]} recomputation" + (" (parasim's selective: Megatron's)" if name == "SelectiveAC" else ""),
    )
    return kinds[name]


def _precision(job: ReadJob) -> str:
    """torchtitan's mixed precision (training.mixed_precision_param) with the model's converters: torchao's FP8
    linears (Float8LinearConverter) as fsdp2-fp8; MXFP8 and NVFP4 linears have no entry in parasim."""
    field = next((name for name in CONVERTERS if name in job.values), CONVERTERS[0])
    converters = job.values.get(field)
    float8 = gather = False
    if converters is not None:
        calls = [str(c) for c in (converters if isinstance(converters, list) else [converters])]
        names = [c.split("(", 1)[0] for c in calls]
        float8 = "Float8LinearConverter.Config" in names
        # torchao's FP8 all-gather of FSDP's shards is off unless the converter turns it on (Float8LinearConfig)
        gather = any(
            n == "Float8LinearConverter.Config" and _keyword(c, "enable_fsdp_float8_all_gather") is True
            for n, c in zip(names, calls)
        )
        others = [n for n in names if n != "Float8LinearConverter.Config"]
        fp8 = "torchao's FP8 linears" + (", weights gathered in FP8" if gather else "")
        if others:  # one line for the field: what parasim leaves out, and the FP8 linears it takes
            job.read.add(field)
            job.unmodelled.append(
                f"{field} {', '.join(others)}: model converters parasim has no entry for (planned without them)"
                + (f"; {fp8} taken" if float8 else "")
            )
        else:
            job.use(field, fp8 if float8 else "none")
    param = job.values.get("training.mixed_precision_param", "bfloat16")
    if "training.mixed_precision_param" in job.values:
        job.use("training.mixed_precision_param", f"weights gathered in {param}")
    return precision_name(job, param, float8, gather)


def _keyword(call: str, name: str) -> Any:
    """The constant value of keyword `name` in a call as call_text writes it (None where absent or not a constant)."""
    try:
        node = ast.parse(call, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == name and isinstance(kw.value, ast.Constant):
                return kw.value.value
    return None


def _loss(job: ReadJob) -> bool:
    """ChunkedLossWrapper computes the loss a chunk of the sequence at a time: the whole logits never exist."""
    loss = job.values.get("loss")
    if loss is None:
        return False
    chunked = str(loss).startswith("ChunkedLossWrapper")
    job.use(
        "loss",
        "the loss in chunks: the whole logits never exist (--chunked-loss)" if chunked else "the whole logits at once",
    )
    return chunked


def _optimizer(job: ReadJob) -> None:
    """default_adamw(...), or OptimizersContainer.Config(name=...) whose default name is AdamW."""
    opt, name = job.values.get("optimizer"), job.values.get("optimizer.name")
    if opt is None and name is None:
        return
    if name is not None:
        read_optimizer(job)  # the TOML form's field and words
        job.read.add("optimizer")
        return
    adam = "adam" in str(opt).lower() or str(opt).startswith("OptimizersContainer.Config")
    if adam:
        job.use(
            "optimizer",
            "Adam: two FP32 moments a parameter" + ("" if "adam" in str(opt).lower() else " (AdamW, its default)"),
        )
    else:
        job.read.add("optimizer")
        job.unmodelled.append(f"optimizer {brief(opt)}: parasim counts Adam's two moments a parameter")


__all__ = ["read", "looks_like_path", "split_path", "registry_values", "FIELDS", "TITLE"]


# -- the plan written as a config function ----------------------------------------------------------------------
AC_CLASS = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}


def write(model: Any, plan: Any, seq: int, overlap: tuple[str, ...], job: ReadJob | None = None) -> Written:
    """`plan` as a torchtitan config function named as torchtitan names its own, after the model's module
    (llama3_parasim_plan), to add to the model's config_registry.py and run by `--config`: over the function `job`
    was read from where there is one (`config = llama3_70b()`, then each field the plan sets, as torchtitan's own
    derived configs are written), else a Trainer.Config of its own. What torchtitan runs otherwise than the plan
    says is in the notes."""
    base = job if job is not None and job.format == "torchtitan-py" else None
    notes: list[str] = []
    lines = []
    flavor = flavor_of(model)
    module = flavor[0] if flavor else (split_path(base.path)[1] or "model").split("_", 1)[0] if base else "model"
    fn = f"{module}_parasim_plan"
    if flavor is None:
        notes.append(f"{model.name}: not one of torchtitan's Llama 3 flavours: model_spec names your model's own")
    fp8 = plan.precision in ("fsdp2-fp8", "fsdp2-fp8-gather")
    converters = (
        f", converters=[Float8LinearConverter.Config(enable_fsdp_float8_all_gather="
        f"{plan.precision == 'fsdp2-fp8-gather'})]"
        if fp8
        else ""
    )
    spec = f"model_registry({(flavor[1] if flavor else 'YOUR_FLAVOR')!r}{converters})"
    if base is None:
        lines.append(
            "    config = Trainer.Config(\n"
            f"        model_spec={spec},\n"
            "        optimizer=default_adamw(),\n"
            "        training=TrainingConfig(),\n"
            "        parallelism=ParallelismConfig(),\n"
            "        compile=CompileConfig(),\n"
            "    )"
        )
    else:
        lines.append(f"    config = {split_path(base.path)[1]}()")

        def fp8_of(precision: str) -> str | None:
            return precision if precision.startswith("fsdp2-fp8") else None

        if fp8_of(plan.precision) != fp8_of(base.step["precision"]):  # the converters live in the model's spec
            lines.append(f"    config.model_spec = {spec}")
            notes.append(
                "model_spec written anew for its FP8 converter: other options of the base's model_spec are not kept"
            )
    fields: list[tuple[str, Any]] = [
        ("training.max_context_length", seq),
        ("training.num_tokens_per_microbatch_per_dp_rank", plan.micro_batch * seq),
        ("training.num_tokens_per_train_step", plan.micro_batch * seq * plan.m * plan.dp),
    ]
    replicate, shard = (1, plan.dp) if plan.zero else (plan.dp, 1)
    fields += [(_P + "data_parallel_replicate_degree", replicate), (_P + "data_parallel_shard_degree", shard)]
    for name, v in (
        ("tensor_parallel_degree", plan.tp),
        ("pipeline_parallel_degree", plan.pp),
        ("context_parallel_degree", plan.cp),
        ("expert_parallel_degree", plan.ep),
        ("expert_tensor_parallel_degree", plan.etp),
    ):
        if v > 1 or (base is not None and _P + name in base.values):
            fields.append((_P + name, v))
    if plan.pp > 1:
        fields.append((_P + "num_pp_microbatches", plan.m))
    if plan.tp > 1 and not plan.sp:
        fields.append((_P + "enable_sequence_parallel", False))
    compiled = plan.fusion != "torch-eager"
    fields += [("compile.enable", compiled), ("compile.enable_async_tensor_parallel", "tp" in overlap)]
    if compiled:
        fields.append(("compile.components", ["model", "loss"]))
    fields.append(("training.mixed_precision_param", "float32" if plan.precision == "fp32" else "bfloat16"))
    lines += [f"    config.{name} = {value!r}" for name, value in fields]
    if plan.recompute in AC_CLASS:
        lines.append(f"    config.activation_checkpoint = {AC_CLASS[plan.recompute]}")
    elif base is not None and base.step["recompute"] != "none":
        notes.append("no recomputation: remove activation_checkpoint from the function it is built on")
    if plan.chunked_loss != (base is not None and base.step.get("chunked_loss", False)):
        loss = (
            "ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config())"
            if plan.chunked_loss
            else "CrossEntropyLoss.Config()"
        )
        lines.append(f"    config.loss = {loss}")
    if plan.precision not in ("fsdp2", "fsdp2-fp8", "fsdp2-fp8-gather", "fp32"):
        notes.append(f"precision {plan.precision}: torchtitan keeps FP32 weights gathered in BF16 (written as fsdp2)")
    if plan.zero in (1, 2):
        notes.append(f"ZeRO-{plan.zero}: torchtitan's FSDP shards the weights too (written as FSDP: ZeRO-3)")
    notes += amp_note(plan)
    head = (
        f"# parasim's plan: {plan.label()} on {plan.world:,} GPUs, sequences of {seq:,} tokens.\n"
        f"# Add it to the model's config_registry.py and run torchtitan with --module {module} --config {fn}.\n"
        f"def {fn}() -> Trainer.Config:\n"
    )
    return Written("torchtitan-py", head + "\n".join(lines) + "\n    return config\n", tuple(notes))

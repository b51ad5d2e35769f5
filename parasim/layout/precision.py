"""Training precision, one place: the dtype of each kind of tensor a training step keeps or sends, with the
frameworks' conventions as named entries. Memory (estimate/memory.py), traffic (estimate/traffic.py), the
plan's clock (clock/plan.py), the bytes a run holds (dp/held.py) and the arrays of a run at real size
(symbolic ranks compute in these dtypes, so the trace's bytes are the job's) all read the entry a run or a
plan names, so one job has one answer everywhere.

What a GPU keeps per parameter follows from three groups, each sharded from its own ZeRO stage on:
  weights    `params`                                        (ZeRO-3 / FSDP shards them)
  gradients  `grads`                                         (ZeRO-2)
  optimizer  `master` + `main_grads` + 2 x `adam` (m and v)  (ZeRO-1, Megatron's distributed optimizer)
`master` is None where the parameters are already FP32 (no second copy); `main_grads` is the optimizer's own
FP32 copy of its gradients, made where the gradient buffer is 16-bit (Megatron copies its shard of the reduced
grads into FP32 main grads; with FP32 grads the buffer itself is the main grad).

Virtual and real ranks compute in float64 for exact lessons whatever entry a run names (`Context.dtype_for`);
symbolic ranks, whose arrays are shapes and dtypes only, compute in the entry's dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..errors import UsageError

# the dtype names an entry may use, and their sizes (numpy's, with ml_dtypes' bfloat16 and float8)
ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
SHORT = {
    "float64": "FP64",
    "float32": "FP32",
    "bfloat16": "BF16",
    "float16": "FP16",
    "float8_e4m3fn": "FP8",
    "float8_e5m2": "FP8 (E5M2)",
}
# the kinds of tensor a run computes with (what `Context.dtype_for` takes), as opposed to what it only keeps
COMPUTE_KINDS = ("compute", "activations", "grad_reduce", "dispatch", "combine", "logits")


@dataclass(frozen=True)
class Fp8Scaling:
    """How an FP8 recipe turns a 16-bit operand into FP8 before a product, and what that pass moves.

    Each quantized operand is read `reads` times (current scaling reads it once for its amax, then again to cast;
    delayed scaling takes the scale from earlier steps' amax history and reads once) and written twice in FP8:
    itself and its transpose, since Hopper's FP8 products take only the "TN" layout and each operand is used in
    two products (the input in the forward and the weight's gradient; the output's gradient in both backward
    products; the weight in the forward and the input's gradient)."""

    name: str
    words: str
    reads: int
    source: str

    @property
    def bytes_per_value(self) -> int:
        return 2 * self.reads + 2 * 1  # 16-bit reads; the FP8 copy and its transpose, one byte each


_TE_FP8 = (
    "TransformerEngine docs, 'FP8 Delayed Scaling': current scaling 'requires two tensor reads per "
    "quantization: one to compute amax, one to cast', delayed scaling one; 'Performance considerations, "
    "handling transposes': on Hopper some FP8 tensors must be physically transposed (cuBLASLt's FP8 "
    "products take the TN layout only), so a quantization writes the tensor and its transpose"
)
FP8_SCALINGS: dict[str, Fp8Scaling] = {
    s.name: s
    for s in (
        Fp8Scaling("delayed", "delayed scaling (the scale from earlier steps' amax history)", 1, _TE_FP8),
        Fp8Scaling("current", "current (per-tensor) scaling: each tensor's own amax, read first", 2, _TE_FP8),
        Fp8Scaling(
            "blockwise",
            "blockwise scaling (a scale per tile, found inside the cast kernel)",
            1,
            "DeepSeek-V3 technical report (arXiv 2412.19437), section 3.3.2: 1x128 tiles of activations and "
            "128x128 blocks of weights, the scale computed online from each tile's amax; " + _TE_FP8,
        ),
    )
}


@dataclass(frozen=True)
class Precision:
    """The dtype of each kind of tensor in a training step (names as numpy/ml_dtypes spell them)."""

    name: str
    title: str  # in words, for a learner
    params: str  # the parameters as the model keeps them between steps
    compute: str  # the weights the products read, and what ZeRO-3 / FSDP all-gathers
    grads: str  # the gradient buffer backward accumulates into
    grad_reduce: str  # the values of the data-parallel reduction (all-reduce or reduce-scatter)
    master: str | None  # FP32 master weights the optimizer updates (None: the parameters are already FP32)
    main_grads: str | None  # the optimizer's own FP32 copy of its gradients (None: the buffer is its main grad)
    adam: str  # Adam's first and second moments, each
    activations: str  # what layers keep for backward and send between TP, CP and PP ranks
    dispatch: str  # the tokens an EP all-to-all sends to their experts
    combine: str  # the expert outputs the all-to-all brings back
    logits: str  # the output layer's logits, as the loss reads them
    source: str  # where the convention is written down
    products: str = "bfloat16"  # the dtype the matrix products run in (FP8 where a recipe quantizes their inputs)
    fp8_scaling: str | None = None  # FP8_SCALINGS' name where the products are FP8: how their operands are cast

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in ("name", "title", "source", "fp8_scaling") and v is not None and v not in ITEMSIZE:
                raise UsageError(f"precision {self.name}: {f.name} dtype {v!r} is not one of {', '.join(ITEMSIZE)}")
        if self.fp8 != (self.fp8_scaling is not None) or (self.fp8 and self.fp8_scaling not in FP8_SCALINGS):
            raise UsageError(
                f"precision {self.name}: FP8 products need one of the FP8 scalings "
                f"({', '.join(FP8_SCALINGS)}), and only they take one"
            )

    @property
    def fp8(self) -> bool:
        """Whether the matrix products run in FP8."""
        return self.products.startswith("float8")

    @property
    def scaling(self) -> Fp8Scaling | None:
        """How the FP8 products' operands are cast (None for 16-bit products)."""
        return FP8_SCALINGS[self.fp8_scaling] if self.fp8_scaling else None

    def bytes(self, kind: str) -> int:
        """Bytes of one value of `kind` (a field name); 0 for a copy this convention does not keep."""
        dtype = getattr(self, kind)
        return 0 if dtype is None else ITEMSIZE[dtype]

    @property
    def weight_bytes(self) -> int:
        return self.bytes("params")

    @property
    def grad_bytes(self) -> int:
        return self.bytes("grads")

    @property
    def optimizer_bytes(self) -> int:
        """What the optimizer keeps per parameter: master weights, main gradients, Adam's m and v."""
        return self.bytes("master") + self.bytes("main_grads") + 2 * self.bytes("adam")

    def per_param(self, shards: dict[str, float] | None = None) -> float:
        """Bytes of model state per parameter, each group divided by its shards ({"weights", "gradients",
        "optimizer"} -> ways it is split; 1 where absent)."""
        s = shards or {}
        return (
            self.weight_bytes / s.get("weights", 1)
            + self.grad_bytes / s.get("gradients", 1)
            + self.optimizer_bytes / s.get("optimizer", 1)
        )

    def dtype(self, kind: str) -> np.dtype:
        """The numpy dtype of `kind` (bfloat16 and float8 from ml_dtypes)."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 with numpy)

        return np.dtype(getattr(self, kind))

    def short(self, kind: str) -> str:
        """`kind`'s dtype as a learner reads it: BF16, FP32, FP8."""
        return SHORT[getattr(self, kind)]

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["bytes_per_param"] = {
            "weights": self.weight_bytes,
            "gradients": self.grad_bytes,
            "optimizer": self.optimizer_bytes,
        }
        return out


_MEGATRON = (
    "Megatron-LM: megatron/training/arguments.py (bf16 accumulates and reduces gradients in FP32 unless "
    "--grad-reduce-in-bf16), docs/source/api-guide/dist_optimizer.md (bytes per parameter: 18 or "
    "6 + 12/d with 16-bit params and FP32 grads, 20 or 4 + 16/d with 16-bit grads, 16 or 8 + 8/d in FP32)"
)

# One entry per convention; everything else reads this table.
PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            "post",
            "the post's mixed precision: BF16 weights and gradients, FP32 master weights and Adam",
            params="bfloat16",
            compute="bfloat16",
            grads="bfloat16",
            grad_reduce="bfloat16",
            master="float32",
            main_grads=None,
            adam="float32",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="float32",
            source="the Ultra-Scale Playbook, 'Mixed precision training': 2 + 2 bytes of BF16 weights and "
            "gradients, 4 + 4 + 4 of FP32 master weights and Adam moments per parameter",
        ),
        Precision(
            "megatron-bf16",
            "Megatron-LM --bf16: BF16 weights, FP32 gradients (accumulated and reduced in FP32)",
            params="bfloat16",
            compute="bfloat16",
            grads="float32",
            grad_reduce="float32",
            master="float32",
            main_grads=None,
            adam="float32",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="float32",
            source=_MEGATRON,
        ),
        Precision(
            "megatron-bf16-reduce-bf16",
            "Megatron-LM --bf16 --grad-reduce-in-bf16: BF16 gradients, an FP32 copy of the optimizer's share",
            params="bfloat16",
            compute="bfloat16",
            grads="bfloat16",
            grad_reduce="bfloat16",
            master="float32",
            main_grads="float32",
            adam="float32",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="float32",
            source=_MEGATRON,
        ),
        Precision(
            "megatron-fp16",
            "Megatron-LM --fp16: FP16 weights and gradients, FP32 main gradients, master weights and Adam",
            params="float16",
            compute="float16",
            grads="float16",
            grad_reduce="float16",
            master="float32",
            main_grads="float32",
            adam="float32",
            activations="float16",
            dispatch="float16",
            combine="float16",
            logits="float32",
            source=_MEGATRON,
        ),
        Precision(
            "megatron-fp16-grads-fp32",
            "Megatron-LM --fp16 --accumulate-allreduce-grads-in-fp32",
            params="float16",
            compute="float16",
            grads="float32",
            grad_reduce="float32",
            master="float32",
            main_grads=None,
            adam="float32",
            activations="float16",
            dispatch="float16",
            combine="float16",
            logits="float32",
            source=_MEGATRON,
        ),
        Precision(
            "deepspeed-fp16",
            "DeepSpeed with fp16.enabled: FP16 weights and gradients, FP32 master weights and Adam",
            params="float16",
            compute="float16",
            grads="float16",
            grad_reduce="float16",
            master="float32",
            main_grads=None,
            adam="float32",
            activations="float16",
            dispatch="float16",
            combine="float16",
            logits="float32",
            source="ZeRO (Rajbhandari et al., arXiv:1910.02054), section 3.1: FP16 parameters and gradients, an "
            "FP32 copy of the parameters, momentum and variance: 2 + 2 + 12 bytes a parameter",
        ),
        Precision(
            "bf16-pure",
            "BF16 throughout, no FP32 copy: the model cast to BF16 and trained by torch's AdamW, whose moments "
            "take the parameters' dtype (picotron)",
            params="bfloat16",
            compute="bfloat16",
            grads="bfloat16",
            grad_reduce="bfloat16",
            master=None,
            main_grads=None,
            adam="bfloat16",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="bfloat16",
            source="huggingface/picotron@59714b1 train.py: model.to(dtype) with dtype torch.bfloat16 where the GPU "
            "has it, then torch.optim.AdamW(model.parameters()); torch/optim/adamw.py makes exp_avg and exp_avg_sq "
            "with torch.zeros_like(p): 2 + 2 + 2 + 2 bytes a parameter",
        ),
        Precision(
            "bf16-pure-dp",
            "BF16 model and AdamW moments, gradients accumulated and all-reduced in FP32 (picotron with DP > 1)",
            params="bfloat16",
            compute="bfloat16",
            grads="float32",
            grad_reduce="float32",
            master=None,
            main_grads="bfloat16",
            adam="bfloat16",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="bfloat16",
            source="huggingface/picotron@59714b1 train.py (DataParallelBucket(model, grad_type=torch.float32) with "
            "DP > 1) and picotron/data_parallel/data_parallel.py: an FP32 main_grad for every parameter, all-reduced "
            "in FP32, then p.grad = main_grad.to(BF16) for AdamW: 2 + 4 + 2 + 2 + 2 bytes a parameter",
        ),
        Precision(
            "fp32",
            "FP32 throughout (Megatron-LM without --bf16 or --fp16)",
            params="float32",
            compute="float32",
            grads="float32",
            grad_reduce="float32",
            master=None,
            main_grads=None,
            adam="float32",
            activations="float32",
            dispatch="float32",
            combine="float32",
            logits="float32",
            source=_MEGATRON,
        ),
        Precision(
            "fp64",
            "FP64 throughout: what an exact run computes in (parasim's virtual ranks)",
            params="float64",
            compute="float64",
            grads="float64",
            grad_reduce="float64",
            master=None,
            main_grads=None,
            adam="float64",
            activations="float64",
            dispatch="float64",
            combine="float64",
            logits="float64",
            source="parasim: virtual ranks compute every value in float64 so that every layout matches the "
            "unsplit model to rounding (a symbolic run at this precision records the same bytes)",
        ),
        Precision(
            "fsdp2",
            "PyTorch FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), as "
            "torchtitan trains: FP32 sharded parameters gathered as BF16, gradients reduced in FP32",
            params="float32",
            compute="bfloat16",
            grads="float32",
            grad_reduce="float32",
            master=None,
            main_grads=None,
            adam="float32",
            activations="bfloat16",
            dispatch="bfloat16",
            combine="bfloat16",
            logits="float32",
            source="torch.distributed.fsdp.MixedPrecisionPolicy (the sharded parameters stay in their FP32 "
            "dtype; param_dtype is the all-gathered copy, reduce_dtype the reduce-scatter's); "
            "torchtitan's default mixed_precision_param='bfloat16', mixed_precision_reduce='float32'",
        ),
        Precision(
            "deepseek-v3",
            "DeepSeek-V3's FP8 training: FP8 products and dispatch, BF16 combine, BF16 Adam moments",
            params="bfloat16",
            compute="bfloat16",
            grads="float32",
            grad_reduce="float32",
            master="float32",
            main_grads=None,
            adam="bfloat16",
            activations="bfloat16",
            dispatch="float8_e4m3fn",
            combine="bfloat16",
            logits="float32",
            products="float8_e4m3fn",
            fp8_scaling="blockwise",
            source="DeepSeek-V3 technical report (arXiv 2412.19437), section 3.3: the GEMMs of the linear "
            "layers in FP8 (Fprop, Dgrad, Wgrad), activations quantized to FP8 before the MoE dispatch, the combine kept in BF16; FP32 master weights and gradients, "
            "BF16 AdamW moments (a BF16 working copy of the weights is parasim's assumption)",
        ),
    )
}


# FP8 recipes: the entry of the framework's 16-bit convention with its linear layers' products in FP8 (the
# output layer and an MoE router stay BF16: clock/plan.py); the weights kept, gathered and reduced as before.
# Megatron-LM's --fp8-recipe on either of its BF16 conventions (megatron/flags.py writes and reads the flags)
_MEGATRON_FP8 = "megatron/training/arguments.py: --fp8-format, --fp8-recipe (TransformerEngine's linears)"
MEGATRON_FP8 = {
    "delayed": ("delayed", "delayed scaling"),
    "tensorwise": ("current", "current per-tensor scaling"),
    "blockwise": ("blockwise", "blockwise scaling, as DeepSeek-V3 trained"),
}
_E4M3 = "float8_e4m3fn"
# (the entry built on, the name, its title, the FP8 scaling, the source, the dtypes it changes besides the products)
_FP8: list[tuple[str, str, str, str, str, dict[str, str]]] = [
    (
        base,
        f"{base}-fp8-{recipe}",
        f"{PRECISIONS[base].title}, with FP8 linears: {words} (--fp8-recipe {recipe})",
        scaling,
        _MEGATRON_FP8,
        {},
    )
    for base in ("megatron-bf16", "megatron-bf16-reduce-bf16")
    for recipe, (scaling, words) in MEGATRON_FP8.items()
]
_FP8 += [
    (
        "fsdp2",
        "fsdp2-fp8",
        "torchtitan's FSDP2 with torchao's Float8 linears (dynamic per-tensor scaling), weights gathered in BF16",
        "current",
        "torchao.float8 Float8Linear, dynamic tensorwise scaling (torchtitan's [float8] "
        "enable_float8_linear; enable_fsdp_float8_all_gather off by default)",
        {},
    ),
    (
        "fsdp2",
        "fsdp2-fp8-gather",
        "torchtitan's FSDP2 with torchao's Float8 linears, the weights cast to FP8 before FSDP gathers them",
        "current",
        "torchao.float8 Float8Linear with torchtitan's enable_fsdp_float8_all_gather: "
        "the shards are cast, then gathered in FP8",
        {"compute": _E4M3},
    ),
]
# Megatron-LM's --fp8-param-gather (NeMo's fp8_params / fp8_param_gather, MLPerf's FP8_PARAMS): the model keeps
# its weights as FP8 tensors between steps (the distributed optimizer keeps FP32 master copies) and all-gathers
# them in FP8, so the weights held and the gather's bytes are one a value
_MEGATRON_GATHER = (
    "megatron/training/arguments.py --fp8-param-gather: 'Keep the compute param in fp8 (do not use "
    "any other intermediate dtype) and perform the param all-gather in fp8.'"
)
_FP8 += [
    (
        f"{base}-fp8-{recipe}",
        f"{base}-fp8-{recipe}-gather",
        f"{PRECISIONS[base].title}, with FP8 linears: {words} (--fp8-recipe {recipe}), the weights kept and "
        "all-gathered in FP8 (--fp8-param-gather)",
        scaling,
        _MEGATRON_GATHER,
        {"compute": _E4M3, "params": _E4M3},
    )
    for base in ("megatron-bf16", "megatron-bf16-reduce-bf16")
    for recipe, (scaling, words) in MEGATRON_FP8.items()
]
for _base, _name, _title, _scaling, _source, _dtypes in _FP8:  # each builds on an entry made before it
    PRECISIONS[_name] = replace(
        PRECISIONS[_base],
        name=_name,
        title=_title,
        products=_E4M3,
        fp8_scaling=_scaling,
        source=f"{PRECISIONS[_base].source}; {_source}",
        **_dtypes,
    )


def precision(name: str | Precision | None) -> Precision:
    """The entry named `name` (a Precision is returned as is; None is the post's)."""
    if isinstance(name, Precision):
        return name
    key = "post" if name is None else name
    if key not in PRECISIONS:
        raise UsageError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return PRECISIONS[key]

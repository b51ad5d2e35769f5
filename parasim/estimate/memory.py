"""Memory per GPU, itemised: model state (weights, gradients, Adam under ZeRO 0-3), activations per layer
(Korthikanti et al.), the pipeline's in-flight micro-batches, the recomputation working set and the logits.

Every quantity here is a polynomial in the sequence length s of degree at most 2 (the s^2 is the attention
scores, kept only without FlashAttention), written as coefficients (a, b, c): bytes = a + b*s + c*s^2.
The same arithmetic runs on scalars (one layout) and on numpy arrays (a whole search at once), so there is
one formula, not two. Bytes are bytes; the CLI turns them into GB (1e9) or GiB.

Model state is counted at the plan's precision (layout/precision.py: the post's 2 + 2 + 12 bytes per
parameter by default; Megatron-LM's FP32 main gradients for a Megatron job, 18 or 6 + 12/d). Activations count
what the engine's layers keep for backward (`parasim.nn.Saved`): 2 bytes per value (16-bit training), 1 per
dropout-mask value. For the post's model that is 34*s*b*h per layer, or s*b*h*(10 + 24/t) with TP alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..errors import UsageError
from ..layout import Layout, ModelSpec
from ..layout.precision import Precision
from ..layout.precision import precision as precision_of
from ..layout.stages import alike_starts, stage_layers

RECOMPUTE = ("none", "selective", "full")
GATHERED = "ZeRO-3 gathered layers"  # the item named in tables, JSON and the live view


@dataclass(frozen=True)
class Plan(Layout):
    """A Layout plus the training choices that change memory: no second layout. dp is the data-parallel
    size (not counting CP), derived from `world` when only that is given. ETP defaults to 1 here (experts
    whole on each EP rank, DeepSeek's and the search's choice); the layout rules are Layout's."""

    etp: int = 1
    recompute: str = "none"
    flash: bool = True  # FlashAttention: the s x s scores are never kept
    dropout: bool = True  # dropout masks kept (1 byte per value), as Korthikanti et al. count them
    micro_batch: int = 1
    microbatches: int | None = None  # default: pp (1F1B's first stage then holds pp of them)
    chunked_loss: bool = False  # the loss in chunks: the whole-sequence logits never exist
    working_layers: int = 2  # full recomputation re-runs one layer while the next one's grads arrive
    # ZeRO-3 / FSDP: layers whose whole weights are gathered at once (the one computing and the one prefetched
    # behind it, as FSDP2 and DeepSpeed prefetch; the engine's dp/zero3.py gathers one at a time)
    gathered_layers: int = 2
    chunks: int = 1  # model chunks per GPU (interleaved 1F1B): the step's bubble shrinks by it (clock/plan.py);
    # memory counts 1F1B's in-flight micro-batches, as without interleaving
    precision: str = "post"  # layout/precision.py's entry: the dtype of each kind of tensor
    # the attention kernel the framework runs (estimate/kernels.KERNELS: "cudnn", "fa3", "fa2", "fa1"); None: the
    # first of those measured on the GPU type. PyTorch's SDPA and the flash-attn 2 package run FlashAttention-2 on an H100
    # where TransformerEngine runs a FlashAttention-3-class kernel: the clock times each at its own measured share
    attention_kernel: str | None = None
    # how the framework splits a layer's elementwise work into kernels (estimate/fusion.FUSIONS): Megatron's fused
    # ones, or eager PyTorch's one kernel per operation (torchtitan without torch.compile)
    fusion: str = "megatron"
    # how an MoE layer's tokens reach their experts (estimate/dispatch.DISPATCHERS): each top-k copy through NCCL's
    # all-to-all, or once to each GPU and node that needs it (DeepEP, HybridEP)
    dispatcher: str = "alltoall"

    def __post_init__(self) -> None:
        super().__post_init__()
        precision_of(self.precision)  # an unknown name is refused here, in one line
        from .kernels import KERNELS
        from .dispatch import DISPATCHERS
        from .fusion import FUSIONS

        if self.fusion not in FUSIONS:
            raise UsageError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if self.dispatcher not in DISPATCHERS:
            raise UsageError(f"dispatcher must be one of {', '.join(DISPATCHERS)}, got {self.dispatcher!r}")
        if self.attention_kernel is not None and self.attention_kernel not in KERNELS:
            raise UsageError(f"attention kernel must be one of {', '.join(KERNELS)}, got {self.attention_kernel!r}")
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        for f in ("micro_batch", "working_layers", "gathered_layers", "chunks"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise UsageError(f"{f} must be a positive integer, got {v!r}")
        if self.microbatches is not None and self.microbatches < 1:
            raise UsageError(f"microbatches must be a positive integer, got {self.microbatches!r}")

    @classmethod
    def of(cls, layout: Layout, **choices: Any) -> "Plan":
        """The plan of `layout` (its degrees, SP, split, ZeRO stage, model) with the training `choices`
        given (flash, dropout, recompute, microbatches, ...) and the estimator's defaults for the rest: what
        the real-size trace runs, so that it counts what `parasim memory` counts."""
        given = {f.name: getattr(layout, f.name) for f in fields(Layout) if f.init}
        return cls(**given, **choices)

    @property
    def rc(self) -> int:
        return RECOMPUTE.index(self.recompute)

    @property
    def m(self) -> int:
        return self.microbatches or self.pp

    def check(self, model: ModelSpec, seq: int | None = None) -> "Plan":
        """This plan with `model` attached, after the layout rules that involve it (heads divide by tp,
        layers by pp, experts by ep, and with `seq` given, CP's split of the sequence and SP's): Layout's,
        raising LayoutError, so `parasim memory` and `parasim layout` refuse a layout in the same words."""
        if seq is not None:
            replace(self, model=replace(model, seq=seq))  # the rules on the sequence; the estimate takes seq apart
        return replace(self, model=model)

    def label(self) -> str:
        parts = [f"TP{self.tp}"] if self.tp > 1 else []
        parts += ["SP"] if self.sp else []
        parts += [f"{a.upper()}{getattr(self, a)}" for a in ("cp", "pp", "ep") if getattr(self, a) > 1]
        parts += [f"ETP{self.etp}"] if self.etp > 1 else []  # the experts split as attention is
        parts += [f"DP{self.dp}"] if self.dp > 1 else []
        if self.zero != 1 and self.dp * self.cp > 1:
            parts.append(f"ZeRO-{self.zero}")
        parts += [f"{self.recompute} recompute"] if self.recompute != "none" else []
        return " + ".join(parts) or "one GPU"

    @property
    def dtypes(self) -> Precision:
        """The plan's precision entry."""
        return precision_of(self.precision)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "sp": self.sp,
            "cp": self.cp,
            "cp_comm": self.cp_comm,
            "zigzag": self.zigzag,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "etp": self.etp,
            "world": self.world,
            "zero": self.zero,
            "recompute": self.recompute,
            "flash": self.flash,
            "micro_batch": self.micro_batch,
            "microbatches": self.m,
            "chunks": self.chunks,
            "chunked_loss": self.chunked_loss,
            "precision": self.precision,
            "attention_kernel": self.attention_kernel,
            "fusion": self.fusion,
            "dispatcher": self.dispatcher,
            "label": self.label(),
        }


# -- what the model assumes, in words ---------------------------------------------------------------
# Each choice that changes what a GPU keeps, and the words a learner reads for it beside every figure this
# model gives (parasim memory, and the real-size trace, whose step runs the same plan): one table.
ASSUMPTION_WORDS: dict[tuple[str, Any], str] = {
    ("flash", True): "attention scores not kept (FlashAttention: recomputed in backward)",
    ("flash", False): "attention scores kept (s x s per head and layer: no FlashAttention)",
    ("ring", True): "attention scores not kept (CP's attention, a ring or an all-gather, keeps only q, k, v, the "
    "output and its log-sum-exp)",
    ("dropout", True): "dropout masks kept (1 byte a value)",
    ("dropout", False): "no dropout masks",
    ("recompute", "none"): "no activation recomputation",
    ("recompute", "selective"): "selective recomputation (the attention scores recomputed, not kept)",
    ("recompute", "full"): "full recomputation (each layer keeps only its input and runs again in backward)",
}


def assumptions(plan: Plan) -> dict[str, Any]:
    """The choices of `plan` that change what a GPU keeps, as fields: {"flash", "dropout", "recompute"}."""
    return {"flash": bool(plan.flash), "dropout": bool(plan.dropout), "recompute": plan.recompute}


def assumption_words(assumed: dict[str, Any], cp: int = 1) -> list[str]:
    """`assumptions(...)` in words, one clause per choice (under CP, ring attention keeps no scores either
    way)."""
    scores = ("ring", True) if cp > 1 and not assumed["flash"] else ("flash", assumed["flash"])
    return [
        ASSUMPTION_WORDS[scores],
        ASSUMPTION_WORDS[("dropout", assumed["dropout"])],
        ASSUMPTION_WORDS[("recompute", assumed["recompute"])],
    ]


def _article(name: str) -> str:
    """'an' before a name said with a vowel sound first (an H200, an A100), 'a' otherwise (a B200)."""
    return "an" if name[:1].upper() in "AEFHILMNORSX" else "a"


def fit_words(
    nbytes: float, usable: float, gpu_name: str, card: float, given: bool = False, unit: float = 1e9, name: str = "GB"
) -> str:
    """Whether `nbytes` fits in `usable` bytes of one GPU (`gpu_name`, `card` bytes on it), said plainly;
    `given`: the usable figure is the learner's, not the GPU preset's."""
    room = f"the {usable / unit:,.1f} {name} " + (
        "usable you gave"
        if given
        else f"{_article(gpu_name)} {gpu_name} leaves for training ({card / unit:,.0f} {name} on the card)"
    )
    if nbytes > usable:
        return f"does NOT fit: more than the GPU holds: {nbytes / unit:,.2f} {name} against {room}"
    return f"fits: {nbytes / unit:,.2f} {name} of {room}"


# -- one layer, per local token -----------------------------------------------------------------------
def layer_bytes_per_token(
    h: Any,
    heads: Any,
    kv: Any,
    ffn: Any,
    tp: Any,
    sp: Any,
    *,
    mats: Any = 2,
    dropout: Any = True,
    top_k: Any = 0,
    expert_ffn: Any = 0,
    shared: Any = 0,
    etp: Any = 1,
    shared_ffn: Any = None,
    value_bytes: Any = 2,
) -> Any:
    """Bytes one layer keeps for backward per token this rank holds (before SP splits it), scores aside:
    `value_bytes` per activation value (2 in 16-bit training), 1 per dropout-mask value.

    With top_k > 0 the MLP is an MoE layer: each token's top_k copies visit experts of width expert_ffn
    (split over etp), plus `shared` always-on experts of width shared_ffn (default expert_ffn) split over TP
    like a dense MLP."""
    v = value_bytes
    x = np.where(sp, tp, 1)  # SP splits the norms, dropouts and residual inputs by t too
    d = h / heads
    kv_local = np.where(kv >= tp, kv / tp, 1) * d  # kv heads split over TP, or replicated when fewer
    drop = np.where(dropout, 1, 0)
    norms = v * (2 * h / x)  # LN1 and LN2 inputs
    attention = v * (h / x + h / tp + 2 * kv_local + h / tp)  # QKV input, Q, K and V, the output's input
    dense_mlp = v * (h / x + mats * ffn / tp)  # fc1 input, then act input + fc2 input (or SwiGLU's three)
    shared_width = expert_ffn if shared_ffn is None else shared_ffn
    moe_mlp = v * (h / x + top_k * (h + mats * expert_ffn / etp) / x + mats * shared * shared_width / tp)
    masks = drop * 2 * h / x  # the two dropout masks after attention and MLP, a byte a value
    return norms + attention + np.where(top_k > 0, moe_mlp, dense_mlp) + masks


def scores_bytes_per_token_key(
    heads: Any, tp: Any, flash: Any, cp: Any, dropout: Any = True, value_bytes: Any = 2
) -> Any:
    """Bytes per (local token x key) kept for the attention scores: softmax output, and with dropout its
    mask and dropped output (5 bytes in 16-bit training, Korthikanti's 5as^2b). Zero with FlashAttention, and
    under CP, whose ring attention keeps only q, k, v, the output and its log-sum-exp."""
    per = value_bytes + (1 + value_bytes) * np.where(dropout, 1, 0)
    return np.where(flash | (cp > 1), 0, heads / tp * per)


# -- a stage of the pipeline --------------------------------------------------------------------------
def items(model: ModelSpec, p: Any, stage: Any) -> dict[str, tuple[Any, Any, Any]]:
    """Memory of one GPU of pipeline `stage`, item by item, as (a, b, c): bytes = a + b*s + c*s^2.

    `p` is a Plan or anything with the same attributes as arrays (plus `rc`, `m` and one `precision` name)."""
    tp, cp, pp, etp = p.tp, p.cp, p.pp, p.etp
    dtypes = precision_of(p.precision)

    def state(nbytes: int, from_stage: int) -> Any:
        return nbytes * held_params(model, p, from_stage)

    zero = 0 * tp * 1.0
    dense_n, moe_n = stage_layers(model, pp, stage)
    act = dtypes.bytes("activations")
    common = dict(
        h=model.hidden,
        heads=model.heads,
        kv=model.kv,
        ffn=model.ffn_size,
        tp=tp,
        sp=p.sp,
        mats=model.mlp_mats,
        dropout=p.dropout,
        value_bytes=act,
    )
    per_dense = layer_bytes_per_token(**common)
    per_moe = (
        layer_bytes_per_token(
            **common,
            top_k=model.top_k,
            expert_ffn=model.expert_size,
            shared=model.shared_experts,
            etp=etp,
            shared_ffn=model.shared_size,
        )
        if model.experts
        else per_dense
    )
    # selective recomputation drops exactly the scores; so does FlashAttention
    score = scores_bytes_per_token_key(model.heads, tp, p.flash | (p.rc == 1), cp, p.dropout, act)
    tokens = p.micro_batch / cp  # local tokens per unit of s
    full = p.rc == 2
    kept_lin = np.where(
        full, act * model.hidden / np.where(p.sp, tp, 1) * (dense_n + moe_n), per_dense * dense_n + per_moe * moe_n
    )
    kept_quad = np.where(full, 0, score * (dense_n + moe_n))
    held = np.minimum(pp - stage, p.m)  # 1F1B: stage i holds min(p - i, m) micro-batches
    work_lin = np.where(full, p.working_layers * np.maximum(per_dense * (dense_n > 0), per_moe * (moe_n > 0)), 0)
    gathered = gathered_bytes(model, p, dense_n, moe_n)
    last = stage == pp - 1
    logits = np.where(last & ~np.asarray(p.chunked_loss, dtype=bool), dtypes.bytes("logits") * model.vocab / tp, 0)
    return {
        "weights": (state(dtypes.weight_bytes, 3), zero, zero),
        "gradients": (state(dtypes.grad_bytes, 2), zero, zero),
        "optimizer": (state(dtypes.optimizer_bytes, 1), zero, zero),
        "activations": (zero, tokens * kept_lin, tokens * kept_quad),
        "in-flight micro-batches": (zero, (held - 1) * tokens * kept_lin, (held - 1) * tokens * kept_quad),
        "recompute working set": (zero, tokens * work_lin, tokens * np.where(full, p.working_layers * score, 0)),
        "logits": (zero, tokens * logits, zero),
        GATHERED: (gathered, zero, zero),
    }


def gathered_bytes(model: ModelSpec, p: Any, dense_n: Any, moe_n: Any) -> Any:
    """ZeRO-3's working set on one GPU: the whole weights of `p.gathered_layers` layers at once, in the dtype the
    products read, and one layer's whole gradient before its reduce-scatter (in the gradient buffer's dtype), for
    the largest layer the stage holds. Only the parts ZeRO-3 shards are gathered: a layer's dense weights where
    DP x CP > 1, its experts where the expert-data-parallel group is. An MoE layer at EP 1 gathers every expert:
    the reason ZeRO-3 alone does not train a large MoE model. (The embedding and output layer, gathered once
    each, are not counted.)"""
    dtypes = precision_of(p.precision)
    tp, cp, dp, ep, etp = p.tp, p.cp, p.dp, p.ep, p.etp
    c = model.counted()
    scale = model.total_params() / sum(c.values())  # to a stated total, as held_params counts
    layers, moe = model.size("layers"), model.moe_layers
    attention_norms = (c["attention"] + c["norms"]) / layers
    dense_layer = attention_norms + c["dense mlp"] / max(layers - moe, 1)
    moe_dense = attention_norms + (c["shared experts"] + c["router"]) / max(moe, 1)
    moe_experts = c["routed experts"] / max(moe, 1)
    sharded = p.zero >= 3
    dense_on = sharded & (dp * cp > 1)
    edp = tp * cp * dp / (etp * ep)
    experts_on = sharded & (edp > 1)
    per_dense = np.where(dense_on & (dense_n > 0), dense_layer / tp, 0)
    per_moe = np.where(dense_on, moe_dense / tp, 0) + np.where(experts_on, moe_experts / (etp * ep), 0)
    per_layer = scale * np.maximum(per_dense, np.where(moe_n > 0, per_moe, 0))
    return per_layer * (p.gathered_layers * dtypes.bytes("compute") + dtypes.grad_bytes)


# (the s^2 terms: scores are kept per local query token, s*b/cp of them, for every one of the s keys)


def held_params(model: ModelSpec, p: Any, from_stage: int = 4) -> Any:
    """Parameters one GPU keeps of a state sharded from ZeRO stage `from_stage` on (the default, 4: none is):
    its TP/PP share of the dense ones and its ETP/EP/PP share of the experts, each divided by its data-parallel
    group where the plan's ZeRO stage shards it (Megatron shards over DP x CP, and the experts over the
    expert-data-parallel group)."""
    tp, cp, pp, dp, ep, etp = p.tp, p.cp, p.pp, p.dp, p.ep, p.etp
    edp = tp * cp * pp * dp / (etp * ep * pp)
    experts = model.expert_params()
    dense = model.total_params() - experts
    shard_d = np.where(p.zero >= from_stage, dp * cp, 1)
    shard_e = np.where(p.zero >= from_stage, edp, 1)
    return dense / (tp * pp) / shard_d + experts / (etp * ep * pp) / shard_e


def stages_of(model: ModelSpec, p: Any) -> list[Any]:
    """The stages worth checking, by the model's rule for its layers on stages (layout/stages.py): the first of
    every run of stages that hold alike layers (under 1F1B the earliest holds the most micro-batches in
    flight) and the last (the logits). Stage indices, or columns of them for a column of plans; some repeat."""
    return alike_starts(model, p.pp)


def totals(model: ModelSpec, p: Any, stage: Any) -> tuple[Any, Any, Any]:
    a = b = c = 0.0
    for ia, ib, ic in items(model, p, stage).values():
        a, b, c = a + ia, b + ib, c + ic
    return a, b, c


@dataclass
class Breakdown:
    """Memory of the binding stage at one sequence length, by item, in bytes."""

    model: ModelSpec
    plan: Plan
    seq: int
    stage: int
    items: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.items.values())

    @property
    def model_state(self) -> float:
        return self.items["weights"] + self.items["gradients"] + self.items["optimizer"]

    def shown(self) -> dict[str, float]:
        """The items a table shows: ZeRO-3's gathered layers only where the plan runs ZeRO-3 (elsewhere the
        row is zero by definition, and a learner reading ZeRO-1 has no use for it); --json keeps every item."""
        return {k: v for k, v in self.items.items() if k != GATHERED or self.plan.zero >= 3}

    def to_dict(self, unit: float = 1e9) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "layout": self.plan.to_dict(),
            "seq": self.seq,
            "stage": self.stage + 1,
            "unit_bytes": unit,
            "items": {k: v / unit for k, v in self.items.items()},
            "model_state": self.model_state / unit,
            "total": self.total / unit,
            "params_held": self.params_held,
            "bytes_per_param": self.model_state / self.params_held,
            "precision": self.plan.dtypes.to_dict(),
        }

    @property
    def params_held(self) -> float:
        """The parameters this GPU keeps (its share of the model), whether or not ZeRO shards their state."""
        return float(held_params(self.model, self.plan))


def breakdown(model: ModelSpec, plan: Plan, seq: int) -> Breakdown:
    """Itemised memory at sequence length `seq` on the stage that needs the most (the earliest of equals)."""
    best: Breakdown | None = None
    for stage in sorted({int(s) for s in stages_of(model, plan)}):
        got = {k: float(a + b * seq + c * seq * seq) for k, (a, b, c) in items(model, plan, stage).items()}
        bd = Breakdown(model, plan, seq, stage, got)
        if best is None or bd.total > best.total:
            best = bd
    assert best is not None
    return best


def layer_saved_bytes(
    h: int,
    heads: int,
    kv: int,
    ffn: int,
    seq: int,
    batch: int,
    tp: int,
    sp: bool,
    cp: int = 1,
    flash: bool = True,
    dropout: bool = True,
    mats: int = 2,
) -> float:
    """What one rank keeps for backward for one layer on one micro-batch of `batch` sequences of `seq`
    tokens: the number tests/refs/test_estimate_crosscheck.py compares with the engine's `Saved`."""
    tokens = seq * batch / cp
    lin = layer_bytes_per_token(h, heads, kv, ffn, tp, sp, mats=mats, dropout=dropout)
    return float(tokens * lin + tokens * seq * scores_bytes_per_token_key(heads, tp, flash, cp, dropout))

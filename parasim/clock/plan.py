"""A training step's time from a plan, without running it: the clock's costs (costs.py) applied to what one
GPU of the slowest pipeline stage does, micro-batch by micro-batch, through the pipeline schedule's shape.

For real sizes no run is needed: a layer's work is a few products and elementwise passes whose sizes
follow from the shapes. What one GPU does for one micro-batch on one layer:
- products: the weight matrices (QKV, output, MLP; the top-k experts of an MoE layer) at 2 FLOPs per
  multiply-add per token, split over TP; the attention products QK^T and PV, 4 s_q s_k h FLOPs per
  sequence, halved by a causal mask where FlashAttention skips the masked blocks; backward twice the
  forward (FlashAttention's backward 2.5 times: it recomputes the scores); recomputation adds forwards.
- elementwise passes (ELEMENTWISE): bytes read and written per value, over the GPU's memory bandwidth.
- TP collectives on the activations (all-reduce, or all-gather and reduce-scatter under SP), CP's K/V
  ring, EP's all-to-alls, each by the ring or pair cost of costs.py over the link its group uses.
The pipeline runs m micro-batches through p stages in (m + (p-1)/v) micro-batch times of its slowest stage
(1F1B; v model chunks per GPU when interleaved), each stage sending its activations on. Every stage that
differs is timed: its layers by the model's rule (layout/stages.py: uneven stages hold more or fewer, the
dense ones lead), the output layer and its loss on the last. Then the data-parallel gradient
reduction, the parameter all-gather of a sharded optimizer and the optimizer's pass over its state.
Overlap switches (clock/overlaps.py, those modelled in a plan's step) hide a
communication behind the compute the frameworks run it beside.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..comm.hops import ACROSS, INSIDE, crossing_share
from ..layout import KINDS
from ..layout.precision import Precision
from ..layout.precision import precision as precision_of
from ..layout.stages import alike_starts, stage_layers
from .costs import Machine, pairs_seconds, ring_seconds
from .overlaps import PLAN, check
from .costs import machine as machine_of


# Elementwise passes of one layer's forward: (name, the tensor it runs over, bytes read and written per value
# of it). "act": the activations [tokens, hidden] (split over TP under SP, whole on each TP rank without);
# "ffn": the MLP's hidden [tokens, ffn / TP]; "scores": the attention scores [b, heads / TP, s_q, s_k], only
# where FlashAttention does not keep them inside its kernel. 16-bit values are 2 bytes, a dropout mask 1.
# A backward pass moves about twice its forward's bytes (it reads what the forward read and the incoming
# gradient, and writes the gradient): BACKWARD_BYTES.
ELEMENTWISE: tuple[tuple[str, str, float, float], ...] = (
    # name, over, bytes per value with dropout, without
    ("input norm", "act", 4, 4),  # read x, write norm(x)
    ("attention bias, dropout, residual", "act", 7, 6),  # read out and residual, write sum (and a mask)
    ("post-attention norm", "act", 4, 4),
    ("MLP activation", "ffn", 4, 4),  # GeLU: read, write (a gated MLP reads two: GATED_EXTRA)
    ("MLP bias, dropout, residual", "act", 7, 6),
    ("softmax (scale, mask)", "scores", 4, 4),  # read scores, write probabilities
    ("attention dropout", "scores", 5, 0),  # read, write, mask
)
GATED_EXTRA = 2  # a gated MLP's activation reads a second input of the same size
PERMUTE_PASSES = 2  # an MoE layer's forward permutes its tokens into expert order and unpermutes them back
BYTES_16 = 2  # the 16-bit values ELEMENTWISE's bytes count
BACKWARD_BYTES = 2.0


def adam_bytes(p: Precision) -> int:
    """Memory bytes the optimizer's pass moves per parameter it updates: it reads the master weight (or the
    weight itself where there is none), the gradient (its main copy where one is kept), m and v, and writes
    the master weight, m and v, and the 16-bit weight the model reads where that is a second copy. Megatron's
    BF16 step: 4 + 4 + 8 read, 4 + 8 + 2 written, 30 bytes."""
    weight = p.bytes("master") or p.bytes("params")
    grad = p.bytes("main_grads") or p.bytes("grads")
    return weight + grad + 2 * p.bytes("adam") + weight + 2 * p.bytes("adam") + (p.bytes("params") if p.master else 0)


@dataclass(frozen=True)
class Run:
    """What the step runs: the layout's degrees, the batch and the training choices that change time."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    chunks: int = 1  # model chunks per GPU (interleaved 1F1B)
    micro_batch: int = 1
    global_batch: int = 1  # sequences per step, all replicas
    seq: int = 2048
    recompute: str = "none"  # none, selective, full
    flash: bool = True
    dropout: bool = False
    distributed_optimizer: bool = False  # ZeRO-1: reduce-scatter gradients, all-gather parameters
    fsdp: bool = False  # ZeRO-3: parameters gathered for forward and backward, gradients reduce-scattered
    gpus_per_node: int = 8
    overlap: tuple[str, ...] = ()
    # layout/precision.py's entry; Megatron-LM's BF16 convention by default, the one the published runs the
    # clock is validated on train with (clock/published.py)
    precision: str = "megatron-bf16"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)


def _share(run: Run, group: str, pattern: str = "ring") -> float:
    """The share of a group kind's hops that cross a node (Megatron-Core's groups of the run's layout,
    mesh.KINDS' names; comm/hops.py counts them)."""
    from ..layout import Layout
    layout = Layout(tp=run.tp, cp=run.cp, pp=run.pp, dp=run.dp, ep=run.ep, etp=1 if run.ep > 1 else None,
                    gpus_per_node=run.gpus_per_node)
    _, generator, axes = next(k for k in KINDS if k[0] == group)
    return crossing_share(layout.rank_groups(generator, axes), pattern, run.gpus_per_node)


def _link(run: Run, group: str, pattern: str = "ring") -> str:
    """The link a ring or chain of that group kind goes at: the network when any of its hops crosses (each
    step waits for its slowest hop), else NVLink."""
    return ACROSS if _share(run, group, pattern) else INSIDE


def _ring(m: Machine, op_phases: int, t: int, buffer: float, where: str) -> float:
    """One ring collective over t ranks on a buffer of `buffer` bytes (each sends phases x (t-1)/t of it)."""
    return ring_seconds(op_phases, t, op_phases * (t - 1) / t * buffer, where, m) if t > 1 else 0.0


def layer_forward(model: Any, run: Run, m: Machine, moe: bool) -> dict[str, float]:
    """Seconds of one layer's forward on one micro-batch on one GPU, by part; and its product seconds
    ("products"), which TP overlap can hide a collective behind."""
    h, tp, cp, s = model.hidden, run.tp, run.cp, run.seq
    tokens = run.micro_batch * s / cp
    mats = model.attention_params() / tp
    routed = tokens / (tp if run.sp else 1)  # the tokens this GPU routes (each TP rank its own share under SP)
    if moe:
        mats += (model.top_k * model.mlp_params(model.expert_size)
                 + model.shared_experts * model.mlp_params(model.shared_size)) / tp
        # the MLP's hidden values: each token's top-k copies through an expert's width, and the shared experts'
        ffn_values = tokens * (model.top_k * model.expert_size + model.shared_experts * model.shared_size) / tp
    else:
        mats += model.mlp_params(model.ffn_size) / tp
        ffn_values = tokens * model.ffn_size / tp
    # the router: every routed token's scores for every expert, a product of its own (hidden x experts)
    router = 2 * routed * h * model.experts if moe else 0.0
    matmul = (2 * tokens * mats + router) / (m.peak_flops * m.efficiency["matmul"])
    causal = 0.5 if run.flash else 1.0
    attn_flops = 4 * tokens * s * h / tp * causal
    attention = attn_flops / (m.peak_flops * m.efficiency["attention"])
    act = tokens * h / (tp if run.sp else 1)
    sizes = {"act": act, "ffn": ffn_values,
             "scores": 0.0 if run.flash else run.micro_batch * model.heads / tp * (s / cp) * s}
    elementwise = 0.0
    for _, over, with_dropout, without in ELEMENTWISE:
        per = with_dropout if run.dropout else without
        if over == "ffn" and model.gated:
            per += GATED_EXTRA
        elementwise += sizes[over] * per
    if moe:  # the tokens put in expert order for the dispatch and back in token order after the combine, each
        # pass reading what it moves and writing it elsewhere: the routed tokens and their top-k copies
        elementwise += PERMUTE_PASSES * routed * h * (1 + model.top_k) * BYTES_16
    elementwise /= m.hbm
    return {"matmul": matmul, "attention": attention, "elementwise": elementwise, "attn_flops": attn_flops,
            "scores_bytes": sizes["scores"] * 9}


def stage_parts(model: Any, run: Run, m: Machine, dense_n: int, moe_n: int, last: bool) -> tuple[dict[str, float],
                                                                                               float]:
    """Seconds of one micro-batch on one GPU of a stage holding `dense_n` dense and `moe_n` MoE layers (and,
    on the `last` stage, the output layer and its loss), by part; and its product seconds."""
    h, tp, cp = model.hidden, run.tp, run.cp
    dt = precision_of(run.precision)
    act = dt.bytes("activations")
    tokens = run.micro_batch * run.seq / cp
    act_bytes = tokens * h * act
    recompute = {"none": 0.0, "selective": 0.0, "full": 1.0}[run.recompute]
    bwd_attn = 2.5 if run.flash else 2.0
    parts = {k: 0.0 for k in ("matmul", "attention", "elementwise", "tp", "cp", "ep", "logits")}
    products = 0.0
    for n, is_moe in ((dense_n, False), (moe_n, True)):
        if not n:
            continue
        f = layer_forward(model, run, m, is_moe)
        parts["matmul"] += n * f["matmul"] * (1 + 2 + recompute)
        attn_passes = 1 + bwd_attn + recompute + (1.0 if run.recompute == "selective" else 0.0)
        parts["attention"] += n * f["attention"] * attn_passes
        parts["elementwise"] += n * f["elementwise"] * (1 + BACKWARD_BYTES + recompute)
        if run.recompute == "selective" and not run.flash:
            parts["elementwise"] += n * f["scores_bytes"] * act / m.hbm
        products += n * f["matmul"] * (1 + 2 + recompute)
        # TP: per block (attention, and a dense MLP), forward and backward, as estimate/traffic.layer_traffic
        blocks = 1 if is_moe else 2
        where = _link(run, "tp")
        if tp > 1 and run.sp:
            ag, rs = blocks * (recompute + 2 + 1), blocks * (recompute + 1 + 1)
            tp_s = ag * _ring(m, 1, tp, act_bytes, where) + rs * _ring(m, 1, tp, act_bytes, where)
        elif tp > 1:
            tp_s = blocks * (recompute + 2) * _ring(m, 2, tp, act_bytes, where)
        else:
            tp_s = 0.0
        parts["tp"] += n * tp_s
        if cp > 1:  # K and V of every other CP rank, forward; and back with their gradients, backward
            kv = tokens * 2 * model.kv * model.head_dim * act / tp
            parts["cp"] += n * ring_seconds(1, cp, (cp - 1) * kv, _link(run, "cp"), m) * (1 + recompute + 2)
        if is_moe and run.ep > 1:  # dispatch and combine, forward and backward
            values = tokens / (tp if run.sp else 1) * model.top_k * h * (run.ep - 1) / run.ep
            share = _share(run, "ep", "pairs")  # pairs in other nodes go over the network, beside NVLink
            # toward the experts (the dispatch, and backward its outputs' gradients) and home (the combine, and
            # backward the tokens' gradients), each in its own dtype: (1 + recompute) forwards, one backward
            for kind in ("dispatch", "combine"):
                sent = values * dt.bytes(kind)
                parts["ep"] += n * (2 + recompute) * pairs_seconds(sent * (1 - share), sent * share, m)
    if last:  # the output layer and its loss
        logit_flops = 2 * tokens * h * model.vocab / tp
        parts["logits"] = 3 * logit_flops / (m.peak_flops * m.efficiency["matmul"]) + \
            tokens * model.vocab / tp * dt.bytes("logits") * 3 / m.hbm  # logits written, read, gradient written
    return parts, products


def _exposed(run: Run, parts: dict[str, float], products: float) -> tuple[float, float]:
    """(seconds of a micro-batch on a stage with what the overlap switches hide taken off, TP seconds hidden)."""
    hidden_tp = min(parts["tp"], products) if "tp" in run.overlap else 0.0
    hidden_cp = min(parts["cp"], parts["attention"]) if "cp" in run.overlap else 0.0
    return sum(parts.values()) - hidden_tp - hidden_cp, hidden_tp


def step_time(model: Any, run: Run, m: Machine) -> dict[str, Any]:
    """Seconds of one training step, set by the slowest pipeline stage's GPU, by part, with the critical
    path's shares. Every stage that differs (its layers by the model's rule, layout/stages.py; the logits on
    the last) is timed; the slowest paces 1F1B's steady state and its bubble alike, and is named (from 1)."""
    check(run.overlap, PLAN)
    h, tp, cp, pp, v = model.hidden, run.tp, run.cp, run.pp, run.chunks
    dt = precision_of(run.precision)
    tokens = run.micro_batch * run.seq / cp
    act_bytes = tokens * h * dt.bytes("activations")
    slowest = None
    for stage in sorted({int(s) for s in alike_starts(model, pp)}):
        dense_n, moe_n = (int(x) for x in stage_layers(model, pp, stage))
        parts, products = stage_parts(model, run, m, dense_n, moe_n, stage == pp - 1)
        per_mb, hidden_tp = _exposed(run, parts, products)
        if slowest is None or per_mb > slowest[0]:  # the earliest of equals
            slowest = (per_mb, stage, parts, hidden_tp)
    assert slowest is not None
    per_mb, stage, parts, hidden_tp = slowest
    # pipeline: each micro-batch's activations go to the next stage and its gradient comes back, per chunk
    p2p = 0.0
    if pp > 1:
        sent = act_bytes / (tp if run.sp else 1)
        where = _link(run, "pp", "chain")
        p2p = 2 * v * (m.latency[where] + sent / m.rate(where))
    exposed_p2p = 0.0 if "p2p" in run.overlap else p2p
    mb = run.microbatches
    pipeline = (mb + (pp - 1) / v) * (per_mb + exposed_p2p)
    # data parallel: the gradients of this GPU's parameters, once per step
    dense = model.total_params() - model.expert_params()
    local = dense / (tp * pp) + model.expert_params() / (run.ep * pp)
    dpg = run.dp * cp
    where = _link(run, "dp-cp")
    if run.fsdp or run.distributed_optimizer:
        grads = _ring(m, 1, dpg, local * dt.bytes("grad_reduce"), where)
        params = _ring(m, 1, dpg, local * dt.bytes("compute"), where)
    else:
        grads, params = _ring(m, 2, dpg, local * dt.bytes("grad_reduce"), where), 0.0
    if run.fsdp:  # ZeRO-3 gathers the parameters for the forward and again for the backward, every micro-batch
        params *= 2 * mb
    last_backward = per_mb * 2 / 3
    exposed_grads = max(0.0, grads - last_backward) if "grad-reduce" in run.overlap else grads
    first_forward = per_mb / 3 * (mb if run.fsdp else 1)
    exposed_params = max(0.0, params - first_forward) if "prefetch" in run.overlap else params
    updated = local / (dpg if (run.fsdp or run.distributed_optimizer) else 1)
    optimizer = updated * adam_bytes(dt) / m.hbm
    step = pipeline + exposed_grads + exposed_params + optimizer
    return {"step_s": step, "per_microbatch_s": per_mb, "microbatches": mb, "slowest_stage": stage + 1,
            "bubble_s": (pp - 1) / v * (per_mb + exposed_p2p), "p2p_s": p2p, "exposed_p2p_s": exposed_p2p,
            "parts_per_microbatch_s": parts, "tp_hidden_s": hidden_tp, "dp_grads_s": grads,
            "exposed_grads_s": exposed_grads, "dp_params_s": params, "exposed_params_s": exposed_params,
            "optimizer_s": optimizer, "gpu": m.name}


def run_of(plan: Any, seq: int, overlap: tuple[str, ...] = ()) -> Run:
    """The Run of an estimator's Plan (its degrees and training choices) at `seq` tokens: what `parasim
    memory` and `parasim fit` time."""
    return Run(tp=plan.tp, pp=plan.pp, dp=plan.dp, cp=plan.cp, ep=plan.ep, sp=plan.sp,
               micro_batch=plan.micro_batch, global_batch=plan.micro_batch * plan.m * plan.dp, seq=seq,
               recompute=plan.recompute, flash=plan.flash, dropout=plan.dropout,
               distributed_optimizer=plan.zero in (1, 2), fsdp=plan.zero == 3, gpus_per_node=plan.gpus_per_node,
               overlap=overlap, chunks=plan.chunks, precision=plan.precision)


def plan_time(model: Any, plan: Any, seq: int, gpu: str, overlap: tuple[str, ...] = ()) -> dict[str, Any]:
    """`step_time` of an estimator's plan on GPU type `gpu`, with tokens per second per GPU and MFU (the
    model's FLOPs without recomputation, over the step and the GPUs' dense peak)."""
    from ..estimate.traffic import step_flops
    run = run_of(plan, seq, overlap)
    m = machine_of(gpu, plan.gpus_per_node)
    t = step_time(model, run, m)
    tokens = run.global_batch * seq
    model_flops = step_flops(model, replace(plan, recompute="none"), seq)["total"]
    return {**t, "tokens_per_s_per_gpu": tokens / t["step_s"] / run.world,
            "mfu": model_flops / (t["step_s"] * run.world * m.peak_flops), "overlap": list(overlap)}

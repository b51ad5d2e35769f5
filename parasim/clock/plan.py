"""A training step's time from a plan, without running it: the clock's costs (costs.py) applied to what one
GPU of the slowest pipeline stage does, micro-batch by micro-batch, through the pipeline schedule's shape.

For real sizes no run is needed: a layer's work is a few products and elementwise passes whose sizes
follow from the shapes. What one GPU does for one micro-batch on one layer:
- products: the weight matrices (QKV, output, MLP; the top-k experts of an MoE layer) at 2 FLOPs per
  multiply-add per token, split over TP; the attention products QK^T and PV, 4 s_q s_k h FLOPs per
  sequence, halved by a causal mask where FlashAttention skips the masked blocks; backward twice the
  forward (FlashAttention's backward 2.5 times: it recomputes the scores); recomputation adds forwards.
- elementwise passes (estimate/fusion.py: the framework's kernels): bytes read and written per value, over the
  GPU's memory bandwidth.
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

from dataclasses import replace
from typing import Any

from ..comm.hops import ACROSS, INSIDE, crossing_share
from ..layout.precision import Precision
from ..layout.precision import precision as precision_of
from ..layout.stages import alike_starts, stage_layers
from ..estimate.memory import Plan
from ..estimate.traffic import once_per_gpu, plan_groups
from .costs import Machine, collective_seconds, p2p_seconds, pairs_seconds
from ..estimate.kernels import tp_overlap_efficiency
from .kernels_time import Linear, attention_seconds, gemm_seconds, hbm_rate, linear_seconds
from .overlaps import PLAN, check
from .costs import machine as machine_of
from ..estimate.fusion import FUSIONS


PERMUTE_PASSES = 2  # an MoE layer's forward permutes its tokens into expert order and unpermutes them back
BYTES_16 = 2  # the 16-bit values the fusion tables' bytes count
BACKWARD_BYTES = 2.0


def adam_bytes(p: Precision) -> int:
    """Memory bytes the optimizer's pass moves per parameter it updates: it reads the master weight (or the
    weight itself where there is none), the gradient (its main copy where one is kept), m and v, and writes
    the master weight, m and v, and the 16-bit weight the model reads where that is a second copy. Megatron's
    BF16 step: 4 + 4 + 8 read, 4 + 8 + 2 written, 30 bytes."""
    weight = p.bytes("master") or p.bytes("params")
    grad = p.bytes("main_grads") or p.bytes("grads")
    return weight + grad + 2 * p.bytes("adam") + weight + 2 * p.bytes("adam") + (p.bytes("params") if p.master else 0)


def sequences(plan: Plan) -> int:
    """Sequences one optimizer step takes, over every replica: micro-batch x micro-batches x DP."""
    return plan.micro_batch * plan.m * plan.dp


def _sharded(plan: Plan) -> bool:
    """Gradients reduce-scattered and parameters all-gathered once a step: a sharded optimizer (ZeRO-1 and -2,
    Megatron's distributed optimizer); ZeRO-3 gathers layer by layer instead (`step_time`)."""
    return plan.zero in (1, 2)


def _share(plan: Plan, group: str, pattern: str = "ring") -> float:
    """The share of a group kind's hops that cross a node (Megatron-Core's groups of the run's layout,
    mesh.GROUP_KINDS' names; comm/hops.py counts them)."""
    return crossing_share(plan_groups(plan, group), pattern, plan.gpus_per_node)


def _link(plan: Plan, group: str, pattern: str = "ring") -> str:
    """The link a ring or chain of that group kind goes at: the network when any of its hops crosses (each
    step waits for its slowest hop), else NVLink."""
    return ACROSS if _share(plan, group, pattern) else INSIDE


def _ring(m: Machine, op: str, t: int, buffer: float, where: str) -> float:
    """One ring collective `op` over t ranks on a buffer of `buffer` bytes, at its own measured bandwidth:
    `collective_seconds`."""
    return collective_seconds(m, op, t, buffer, where)


def _routed(plan: Plan, seq: int) -> float:
    """Tokens one GPU routes to experts in a micro-batch: its CP share of the sequences, and under SP its TP
    rank's share of those (each routes its own)."""
    return plan.micro_batch * seq / plan.cp / (plan.tp if plan.sp else 1)


def layer_linears(model: Any, plan: Plan, seq: int, moe: bool) -> list[Linear]:
    """The products of one layer's forward on one GPU for one micro-batch, each at its own shape: attention's
    input projections (Q, K, V, split over TP) and its output; a dense MLP's up (with a gated MLP's gate) and
    down projections over TP; an MoE layer's router, its GPU's experts (each receiving its share of the routed
    tokens' top-k copies: rows = routed tokens x k x EP / experts, whole on the GPU at ETP 1) and its shared
    experts over TP."""
    h, tp, cp = model.hidden, plan.tp, plan.cp
    tokens = plan.micro_batch * seq / cp
    out_width = model.heads * (model.v_head_dim if model.latent else model.head_dim)  # the output's input
    qkv = model.attention_params() / h - out_width  # every input projection's outputs, together
    up = model.mlp_mats - 1  # an MLP's matrices that read the hidden state (SwiGLU's gate and up)
    lins = [Linear(tokens, h, qkv / tp), Linear(tokens, out_width / tp, h)]
    if not moe:
        return lins + [Linear(tokens, h, up * model.ffn_size / tp), Linear(tokens, model.ffn_size / tp, h)]
    routed = _routed(plan, seq)
    local = max(1, model.experts // plan.ep)
    rows = routed * model.top_k * plan.ep / model.experts  # copies one expert of this GPU works on, on average
    fe = model.expert_size
    lins += [Linear(routed, h, model.experts), Linear(rows, h, up * fe, count=local), Linear(rows, fe, h, count=local)]
    if model.shared_experts:
        width = model.shared_experts * model.shared_size / tp
        lins += [Linear(tokens, h, up * width), Linear(tokens, width, h)]
    return lins


def _linear(m: Machine, lin: Linear, scaling: Any) -> tuple[float, float, float, float]:
    """(forward, backward, forward cast, backward cast) of one linear layer: its products (clock/kernels_time.py) in
    FP8 where `scaling` (a recipe's layout/precision.Fp8Scaling) is given, else BF16; under FP8 each forward casts
    its input and its weight and each backward the output's gradient (bytes: the recipe's per value)."""
    f, b = linear_seconds(m.memo, m.key, m.peak_flops, lin, "bf16" if scaling is None else "fp8")
    if scaling is None:
        return f, b, 0.0, 0.0
    cast_f = (lin.rows + lin.n_out) * lin.k_in * lin.count * scaling.bytes_per_value
    return f, b, cast_f, lin.rows * lin.n_out * lin.count * scaling.bytes_per_value


def _ffn_values(model: Any, plan: Plan, seq: int, moe: bool) -> float:
    """Values an MLP's activation runs over on one GPU for one micro-batch: the hidden width of every expert a
    token visits (its top k and the shared ones), or the dense MLP's."""
    tokens = plan.micro_batch * seq / plan.cp
    if moe:
        return tokens * (model.top_k * model.expert_size + model.shared_experts * model.shared_size) / plan.tp
    return tokens * model.ffn_size / plan.tp


def _activation_bytes(model: Any, plan: Plan, values: float) -> float:
    """Bytes the MLP's activation pass moves over `values` under the plan's kernel split (estimate/fusion.py)."""
    fusion = FUSIONS[plan.fusion]
    return values * sum(
        (with_dropout if plan.dropout else without) + (fusion.gated_extra if model.gated else 0)
        for _, over, with_dropout, without in fusion.passes
        if over == "ffn"
    )


def _permute_bytes(model: Any, plan: Plan, seq: int) -> float:
    """Bytes an MoE layer's forward moves putting its tokens in expert order for the dispatch and back in token
    order after the combine, each pass reading what it moves and writing it elsewhere: the routed tokens and
    their top-k copies."""
    return PERMUTE_PASSES * _routed(plan, seq) * model.hidden * (1 + model.top_k) * BYTES_16


def ep_seconds(model: Any, plan: Plan, seq: int, m: Machine) -> dict[str, float]:
    """Seconds of one pass of an MoE layer's two EP all-to-alls on one GPU for one micro-batch: "dispatch"
    (toward the experts; backward, the experts' output gradients) and "combine" (home again; backward, the
    tokens' gradients), each in its own dtype, what crosses nodes over the network beside what goes over
    NVLink. What is sent is the plan's dispatcher's (estimate/dispatch.py): NCCL's all-to-all sends each of the
    routed tokens' top-k copies, the pairs in other nodes over the network; DeepEP and HybridEP send a token
    once to each other GPU that needs it over NVLink (forwarded there from its node's RDMA copy) and once to
    each node over the network, counted as DeepEP's measured rate counts them (estimate/traffic.ep_destinations,
    with the model's group-limited routing)."""
    if plan.ep < 2:
        return {"dispatch": 0.0, "combine": 0.0}
    dt = precision_of(plan.precision)
    routed = _routed(plan, seq)
    once = once_per_gpu(model, plan)
    if once is not None:
        gpus, nodes = once
        inside, across = routed * gpus * model.hidden, routed * nodes * model.hidden
    else:
        values = routed * model.top_k * model.hidden * (plan.ep - 1) / plan.ep
        share = _share(plan, "ep", "pairs")
        inside, across = values * (1 - share), values * share
    return {
        kind: pairs_seconds(inside * dt.bytes(kind), across * dt.bytes(kind), m, plan.ep)
        for kind in ("dispatch", "combine")
    }


def moe_block(model: Any, plan: Plan, seq: int, m: Machine) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of an MoE layer's MLP block on one GPU for one micro-batch, item by item, as
    `layer_forward` and `stage_parts` time them: the router's product, the experts' and the shared experts'
    products (with their FP8 casts under an FP8 recipe), the activation and the permutation passes, and the EP
    all-to-alls. What `parasim validate moe-layer` holds against a measured layer."""
    scaling = precision_of(plan.precision).scaling
    rate = hbm_rate(m.memo, m.key, m.hbm)
    router, *experts = layer_linears(model, plan, seq, True)[2:]
    out = {"router": _linear(m, router, None)[:2]}
    casts = [0.0, 0.0]
    for name, lins in (("experts", experts[:2]), ("shared experts", experts[2:])):
        parts = [_linear(m, lin, scaling) for lin in lins]
        out[name] = (sum(p[0] for p in parts), sum(p[1] for p in parts))
        casts = [casts[0] + sum(p[2] for p in parts) / rate, casts[1] + sum(p[3] for p in parts) / rate]
    if scaling is not None:
        out["FP8 casts"] = (casts[0], casts[1])
    act = _activation_bytes(model, plan, _ffn_values(model, plan, seq, True)) / rate
    perm = _permute_bytes(model, plan, seq) / rate
    out["activation"] = (act, BACKWARD_BYTES * act)
    out["permutation"] = (perm, BACKWARD_BYTES * perm)
    out.update({kind: (s, s) for kind, s in ep_seconds(model, plan, seq, m).items()})
    return out


def layer_forward(model: Any, plan: Plan, seq: int, m: Machine, moe: bool) -> dict[str, float]:
    """Seconds of one layer on one micro-batch on one GPU, by part: its products forward ("matmul") and backward
    ("matmul_bwd"), each at the share of peak a product of its shape measures (clock/kernels_time.py);
    attention forward and backward at FlashAttention's measured share for the sequence and head size (without
    FlashAttention: its two batched products per head, as products); elementwise passes at the measured HBM
    rate; under an FP8 recipe, the linear layers' products in FP8 and their casts at the same rate ("fp8_casts"
    forward, "fp8_casts_bwd" backward: layout/precision.FP8_SCALINGS' bytes a value)."""
    h, tp, cp, s = model.hidden, plan.tp, plan.cp, seq
    tokens = plan.micro_batch * s / cp
    fwd = bwd = cast_fwd = cast_bwd = 0.0
    scaling = precision_of(plan.precision).scaling
    router = 2 if moe else None  # the router's product (the third of an MoE layer's): kept in BF16 by FP8 recipes
    for i, lin in enumerate(layer_linears(model, plan, seq, moe)):
        f, b, cf, cb = _linear(m, lin, None if i == router else scaling)
        fwd, bwd, cast_fwd, cast_bwd = fwd + f, bwd + b, cast_fwd + cf, cast_bwd + cb
    causal = 0.5 if plan.flash else 1.0
    attn_flops = 4 * tokens * s * h / tp * causal
    heads = max(1, model.heads // tp) * plan.micro_batch
    if plan.flash:  # a ring step of CP computes a block of s/cp queries against s/cp keys
        attn_fwd, attn_bwd = attention_seconds(
            m.memo, m.key, m.peak_flops, attn_flops, s // cp, model.head_dim, True, 2.5, plan.attention_kernel
        )
    else:  # the scores made whole: QK^T (s/cp x d @ d x s) and PV (s/cp x s @ s x d) per head, backward twice
        d, q = model.head_dim, max(1, int(s // cp))
        per_head = gemm_seconds(m.memo, m.key, m.peak_flops, q, s, d) + gemm_seconds(
            m.memo, m.key, m.peak_flops, q, d, s
        )
        attn_fwd, attn_bwd = heads * per_head, 2 * heads * per_head
    act = tokens * h / (tp if plan.sp else 1)
    heads_width = tokens * h / tp
    qk = heads_width * (1 + model.kv / model.heads)
    sizes = {
        "act": act,
        "heads": heads_width,
        "qk": qk,
        "kvrep": qk if model.kv < model.heads else 0.0,
        "scores": 0.0 if plan.flash else plan.micro_batch * model.heads / tp * (s / cp) * s,
    }
    fusion = FUSIONS[plan.fusion]
    elementwise = _activation_bytes(model, plan, _ffn_values(model, plan, seq, moe))
    for _, over, with_dropout, without in fusion.passes:
        if over != "ffn":
            elementwise += sizes[over] * (with_dropout if plan.dropout else without)
    if moe:
        elementwise += _permute_bytes(model, plan, seq)
    rate = hbm_rate(m.memo, m.key, m.hbm)
    return {
        "matmul": fwd,
        "matmul_bwd": bwd,
        "attention": attn_fwd,
        "attention_bwd": attn_bwd,
        "elementwise": elementwise / rate,
        "fp8_casts": cast_fwd / rate,
        "fp8_casts_bwd": cast_bwd / rate,
        "attn_flops": attn_flops,
        "scores_bytes": sizes["scores"] * 9,
    }


def stage_parts(
    model: Any, plan: Plan, seq: int, m: Machine, dense_n: int, moe_n: int, last: bool
) -> tuple[dict[str, float], float]:
    """Seconds of one micro-batch on one GPU of a stage holding `dense_n` dense and `moe_n` MoE layers (and,
    on the `last` stage, the output layer and its loss), by part; and its product seconds."""
    h, tp, cp = model.hidden, plan.tp, plan.cp
    dt = precision_of(plan.precision)
    act = dt.bytes("activations")
    tokens = plan.micro_batch * seq / cp
    act_bytes = tokens * h * act
    recompute = {"none": 0.0, "selective": 0.0, "full": 1.0}[plan.recompute]
    parts = {k: 0.0 for k in ("matmul", "attention", "elementwise", "tp", "cp", "ep", "logits")}
    products = 0.0
    for n, is_moe in ((dense_n, False), (moe_n, True)):
        if not n:
            continue
        f = layer_forward(model, plan, seq, m, is_moe)
        layer_products = f["matmul"] * (1 + recompute) + f["matmul_bwd"]
        parts["matmul"] += n * layer_products
        again = recompute + (1.0 if plan.recompute == "selective" else 0.0)  # forwards of attention run again
        parts["attention"] += n * (f["attention"] * (1 + again) + f["attention_bwd"])
        parts["elementwise"] += n * f["elementwise"] * (1 + BACKWARD_BYTES + recompute)
        parts["elementwise"] += n * (f["fp8_casts"] * (1 + recompute) + f["fp8_casts_bwd"])  # FP8 recipes only
        if plan.recompute == "selective" and not plan.flash:
            parts["elementwise"] += n * f["scores_bytes"] / hbm_rate(m.memo, m.key, m.hbm)  # already bytes
        products += n * layer_products
        # TP: per block (attention, and a dense MLP), forward and backward, as estimate/traffic.layer_traffic
        blocks = 1 if is_moe else 2
        where = _link(plan, "tp")
        if tp > 1 and plan.sp:
            ag, rs = blocks * (recompute + 2 + 1), blocks * (recompute + 1 + 1)
            tp_s = ag * _ring(m, "all_gather", tp, act_bytes, where) + rs * _ring(
                m, "reduce_scatter", tp, act_bytes, where
            )
        elif tp > 1:
            tp_s = blocks * (recompute + 2) * _ring(m, "all_reduce", tp, act_bytes, where)
        else:
            tp_s = 0.0
        parts["tp"] += n * tp_s
        if cp > 1:  # K and V of every other CP rank, forward; and back with their gradients, backward
            kv = tokens * 2 * model.kv * model.head_dim * act / tp
            # a ring of cp - 1 passes of every other rank's K and V: an all-gather of the cp blocks, in time
            parts["cp"] += n * collective_seconds(m, "all_gather", cp, cp * kv, _link(plan, "cp")) * (1 + recompute + 2)
        if is_moe and plan.ep > 1:  # dispatch and combine: (1 + recompute) forwards, one backward
            parts["ep"] += n * (2 + recompute) * sum(ep_seconds(model, plan, seq, m).values())
    if last:  # the output layer and its loss: a product over the vocabulary's TP share, forward and backward
        fwd, bwd = linear_seconds(m.memo, m.key, m.peak_flops, Linear(tokens, h, model.vocab / tp))
        per_logit = FUSIONS[plan.fusion].logits_bytes or dt.bytes("logits") * 3  # written, read, gradient written
        parts["logits"] = fwd + bwd + tokens * model.vocab / tp * per_logit / hbm_rate(m.memo, m.key, m.hbm)
    return parts, products


def _exposed(
    overlap: tuple[str, ...], parts: dict[str, float], products: float, slowdown: float, tp_hides: float
) -> tuple[float, dict[str, float]]:
    """(seconds of a micro-batch on a stage with what the overlap switches hide taken off, the seconds each of
    TP, CP and EP saves so: what it hides less what the compute beside it slows). A
    hidden collective is not free: the compute it runs beside slows by `slowdown` of the time they overlap
    (its kernels hold SMs and memory bandwidth: `overlap_cost`). TP's overlap hides `tp_hides` of its
    collectives' time beside the products, as measured of the overlapping kernels with that cost inside
    (estimate/kernels.tp_overlap_efficiency). DualPipe pairs a forward and a backward chunk, so one's EP
    all-to-alls run beside the other's compute."""
    hidden_tp = tp_hides * min(parts["tp"], products) if "tp" in overlap else 0.0
    hidden_cp = min(parts["cp"], parts["attention"]) if "cp" in overlap else 0.0
    compute = parts["matmul"] + parts["attention"] + parts["elementwise"]
    hidden_ep = min(parts["ep"], compute) if "dualpipe" in overlap else 0.0
    saved = {"tp": hidden_tp, "cp": hidden_cp * (1 - slowdown), "ep": hidden_ep * (1 - slowdown)}
    return sum(parts.values()) - sum(saved.values()), saved


def _fsdp_exposed(
    g: float, per_mb: float, mb: int, layers: int, overlapped: bool, slow: float, shares: tuple[float, ...]
) -> float:
    """Seconds ZeRO-3 / FSDP leaves exposed of its layer-by-layer collectives (`g`: one layer's, the all-gather
    of its weights or the reduce-scatter of its gradients, at its own size and latency), in each pass of every
    micro-batch (`shares`: the passes' parts of a micro-batch's compute, 1/3 forward and 2/3 backward). Without
    overlap every layer waits for its own; with it (FSDP's prefetch, one layer ahead, as FSDP2 and DeepSpeed
    default to), each layer's collective runs while the layer before computes, so only the first waits, a
    layer's collective longer than a layer's compute waits for the rest, and what hides slows the compute beside
    it by `slow`."""
    if not overlapped:
        return mb * len(shares) * layers * g
    out = 0.0
    for share in shares:
        c = per_mb * share / layers
        out += g + (layers - 1) * (max(0.0, g - c) + slow * min(g, c))
    return mb * out


def overlap_cost(m: Machine) -> float:
    """The share by which compute slows while a collective runs beside it (estimate/kernels.overlap_slowdown:
    a measured mean over A100 and H100 training kernels; never zero, so an overlap never comes for free)."""
    from ..estimate.kernels import overlap_slowdown

    return overlap_slowdown(m.key).value


def step_time(model: Any, plan: Plan, seq: int, m: Machine, overlap: tuple[str, ...] = ()) -> dict[str, Any]:
    """Seconds of one training step of `plan` (estimate/memory.Plan: the layout, its ZeRO stage, micro-batches
    and training choices, the one type `parasim memory` and `fit` plan with) at `seq` tokens a sequence with
    the `overlap` switches on, set by the slowest pipeline stage's GPU, by part, with the critical path's
    shares. Every stage that differs (its layers by the model's rule, layout/stages.py; the logits on
    the last) is timed; the slowest paces 1F1B's steady state and its bubble alike, and is named (from 1)."""
    check(overlap, PLAN)
    h, tp, cp, pp, v = model.hidden, plan.tp, plan.cp, plan.pp, plan.chunks
    dt = precision_of(plan.precision)
    tokens = plan.micro_batch * seq / cp
    act_bytes = tokens * h * dt.bytes("activations")
    slowest = None
    slow = overlap_cost(m)
    tp_hides = tp_overlap_efficiency(m.key).value if "tp" in overlap and tp > 1 else 0.0
    for stage in sorted({int(s) for s in alike_starts(model, pp)}):
        dense_n, moe_n = (int(x) for x in stage_layers(model, pp, stage))
        parts, products = stage_parts(model, plan, seq, m, dense_n, moe_n, stage == pp - 1)
        per_mb, saved = _exposed(overlap, parts, products, slow, tp_hides)
        if slowest is None or per_mb > slowest[0]:  # the earliest of equals
            slowest = (per_mb, stage, parts, saved)
    assert slowest is not None
    per_mb, stage, parts, saved = slowest
    # pipeline: each micro-batch's activations go to the next stage and its gradient comes back, per chunk
    p2p = 0.0
    if pp > 1:
        sent = act_bytes / (tp if plan.sp else 1)
        where = _link(plan, "pp", "chain")
        p2p = 2 * v * p2p_seconds(m, sent, where)
    # hidden (Megatron's p2p overlap, DualPipe's pairs), a send still slows the compute beside it
    # (Megatron-LM turns --overlap-p2p-communication off without interleaving: no model chunks, no p2p credit)
    hides_p2p = ("p2p" in overlap and v > 1) or "dualpipe" in overlap
    exposed_p2p = slow * p2p if hides_p2p else p2p
    mb = plan.m
    pipeline = (mb + (pp - 1) / v) * (per_mb + exposed_p2p)
    # data parallel: the gradients of this GPU's parameters, once per step, each over its own group as
    # Megatron-Core builds them: the dense ones over dp x cp, the experts' (whole on each EP rank at ETP 1) over
    # the expert-data-parallel group, world / (EP x PP) GPUs
    dense = model.total_params() - model.expert_params()
    shares = [(dense / (tp * pp), plan.dp * cp, "dp-cp")]
    if model.expert_params():
        shares.append((model.expert_params() / (plan.ep * pp), plan.world // (plan.ep * pp), "expert-dp"))
    layers = max(1, sum(int(x) for x in stage_layers(model, pp, stage)))
    # ZeRO-3 gathers layer by layer, each layer's collective at its own size and latency, and reduces the same way
    # but under a pipeline, where one post-backward reduces the stage's whole (below): `params` and `grads` are then
    # one such collective, not the step's
    per_layer = layers if plan.zero == 3 else 1
    grad_share = 1 if pp > 1 else per_layer
    grads = params = 0.0
    for local, group, kind in shares:
        where = _link(plan, kind)
        if plan.zero == 3 or _sharded(plan):
            grads += _ring(m, "reduce_scatter", group, local / grad_share * dt.bytes("grad_reduce"), where)
            params += _ring(m, "all_gather", group, local / per_layer * dt.bytes("compute"), where)
        else:
            grads += _ring(m, "all_reduce", group, local * dt.bytes("grad_reduce"), where)
    # an overlapped reduction or gather hides behind compute up to the compute's length, and slows what it hides
    # behind by `slow` of the time they share
    if plan.zero == 3 and pp > 1:  # FSDP2 under torch.distributed.pipelining (torchtitan): each stage's layers
        # are gathered in the first forward and kept (reshard_after_forward=False, set_reshard_after_backward(False)
        # for every backward but the last), and the gradients are reduce-scattered once, by the manual post-backward
        # after the last backward (pipelining/stage.py, backward_maybe_with_nosync): nothing to hide them behind
        exposed_params = _fsdp_exposed(params, per_mb, 1, layers, "prefetch" in overlap, slow, (1 / 3,))
        exposed_grads, params = grads, layers * params
    elif plan.zero == 3:  # ZeRO-3 / FSDP, layer by layer: `_fsdp_exposed`
        exposed_params = _fsdp_exposed(params, per_mb, mb, layers, "prefetch" in overlap, slow, (1 / 3, 2 / 3))
        exposed_grads = _fsdp_exposed(grads, per_mb, mb, layers, "grad-reduce" in overlap, slow, (2 / 3,))
        params, grads = 2 * mb * layers * params, mb * layers * grads
    else:
        last_backward = per_mb * 2 / 3
        exposed_grads = grads - min(grads, last_backward) * (1 - slow) if "grad-reduce" in overlap else grads
        first_forward = per_mb / 3
        exposed_params = params - min(params, first_forward) * (1 - slow) if "prefetch" in overlap else params
    updated = sum(local / (group if plan.zero else 1) for local, group, _ in shares)
    optimizer = updated * adam_bytes(dt) / m.hbm
    step = pipeline + exposed_grads + exposed_params + optimizer
    return {
        "step_s": step,
        "per_microbatch_s": per_mb,
        "microbatches": mb,
        "slowest_stage": stage + 1,
        "bubble_s": (pp - 1) / v * (per_mb + exposed_p2p),
        "p2p_s": p2p,
        "exposed_p2p_s": exposed_p2p,
        "parts_per_microbatch_s": parts,
        "tp_hidden_s": saved["tp"],
        "cp_hidden_s": saved["cp"],
        "ep_hidden_s": saved["ep"],
        "dp_grads_s": grads,
        "exposed_grads_s": exposed_grads,
        "dp_params_s": params,
        "exposed_params_s": exposed_params,
        "optimizer_s": optimizer,
        "gpu": m.name,
        "dispatcher": plan.dispatcher if model.experts else None,
    }


def plan_time(model: Any, plan: Plan, seq: int, gpu: str, overlap: tuple[str, ...] = ()) -> dict[str, Any]:
    """`step_time` of `plan` on GPU type `gpu`, with tokens per second per GPU and MFU (the model's FLOPs
    without recomputation, over the step and the GPUs' dense peak)."""
    from ..estimate.traffic import step_flops

    m = machine_of(gpu, plan.gpus_per_node)
    t = step_time(model, plan, seq, m, overlap)
    tokens = sequences(plan) * seq
    model_flops = step_flops(model, replace(plan, recompute="none"), seq)["total"]
    return {
        **t,
        "tokens_per_s_per_gpu": tokens / t["step_s"] / plan.world,
        "mfu": model_flops / (t["step_s"] * plan.world * m.peak_flops),
        "overlap": list(overlap),
    }

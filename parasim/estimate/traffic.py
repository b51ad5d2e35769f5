"""Traffic, FLOPs and time per training step.

Bytes are what one rank sends, per collective kind and axis, under the ring algorithm: an all-reduce of
an N-byte buffer over t ranks sends 2(t-1)/t * N, a reduce-scatter or all-gather (t-1)/t * N (N the whole
buffer). The per-layer counts follow the engine's layers call for call (parasim/nn), and
tests/refs/test_estimate_crosscheck.py holds them to the trace. Time is the clock's (parasim/clock/plan.py),
which times these layers' work and collectives on a GPU type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..comm.hops import crossing_share
from ..comm.ops import bus_factor
from ..errors import UsageError
from ..layout import AXES, GROUP_KINDS, LayoutError
from ..layout.stages import most_layers, stage_layers
from .memory import Plan
from ..layout import ModelSpec

Key = tuple[str, str]  # (axis, op): ("tp", "all_reduce"), ("cp", "p2p"), ...


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory: float  # bytes on the card
    usable: float  # bytes left for training after the CUDA context, NCCL buffers and fragmentation
    peak_flops: float  # dense bf16 FLOP/s
    nvlink: float  # bytes/s per direction per GPU inside a node
    network: float  # bytes/s per GPU across nodes
    gpus_per_node: int = 8
    hbm: float = 0.0  # memory bandwidth, bytes/s


def gpu_presets() -> dict[str, GpuSpec]:
    """The GPU types of the hardware table (estimate/hardware.py: datasheet figures, each with its source)."""
    from .hardware import GPUS

    return {
        key: GpuSpec(
            g.name,
            g.memory.value,
            g.usable.value,
            g.peak_flops.value,
            g.nvlink.value,
            g.network.value,
            g.gpus_per_node,
            g.hbm.value,
        )
        for key, g in GPUS.items()
    }


def gpu_spec(name: str, what: str = "GPU") -> GpuSpec:
    """The GPU type called `name` (any case), or one line naming the types there are: what a command and a
    notebook both ask for (`what` is the flag or field that named it)."""
    table = gpu_presets()
    if name.lower() not in table:
        raise UsageError(f"unknown {what} {name!r}; presets: {', '.join(table)}")
    return table[name.lower()]


def _add(out: dict[Key, float], key: Key, nbytes: float) -> None:
    if nbytes:
        out[key] = out.get(key, 0.0) + nbytes


def ring(op: str, nbytes: float, t: int) -> float:
    """Bytes one rank sends in a ring collective over t ranks on an nbytes buffer: its op's bus factor
    (comm/ops.bus_factor: 2(t-1)/t for an all-reduce) of the buffer."""
    if t <= 1:
        return 0.0
    return bus_factor(op, t) * nbytes  # an unknown op is a KeyError, not a silent 1


def layer_traffic(
    h: int,
    heads: int,
    tokens: int,
    tp: int,
    sp: bool,
    cp: int,
    *,
    itemsize: int = 2,
    bias: bool = True,
    norm_params: int = 2,
    recompute: bool = False,
    experts: int = 0,
    grad_itemsize: int | None = None,
    kv_heads: int | None = None,
    cp_comm: str = "p2p",
) -> dict[Key, float]:
    """One layer's forward and backward on one micro-batch: bytes one rank sends, by (axis, op).

    tokens: the tokens this CP rank holds (s*b/cp), before SP splits them. norm_params: 2 for LayerNorm
    (weight and bias), 1 for RMSNorm. recompute: full recomputation runs the forward's collectives twice.
    experts: an MoE layer of that many experts (ETP 1), whose MLP block has no TP collectives of its own
    (under SP each TP rank routes its own tokens; `moe_traffic` counts its EP all-to-alls), and whose router,
    whole on every TP rank, sums its gradient over TP under SP. `itemsize`: an activation's bytes;
    `grad_itemsize` (default the same): a weight gradient's as the data-parallel reduction sums it (Megatron sums
    those replicated weights' FP32 main gradients). `cp_comm`: how CP ranks share K and V (layout/mesh.CP_COMMS),
    `kv_heads` (default `heads`) the K/V heads an all-gather moves."""
    out: dict[Key, float] = {}
    act = tokens * h * itemsize  # one whole activation [s/cp, b, h]
    fwd = 2 if recompute else 1
    blocks = 1 if experts else 2  # TP-split blocks: attention, and a dense MLP
    if tp > 1 and not sp:
        # f and g: one all-reduce after each block forward, one before each block backward
        _add(out, ("tp", "all_reduce"), blocks * (fwd + 1) * ring("all_reduce", act, tp))
    elif tp > 1:
        # forward: gather before QKV (and fc1), reduce-scatter after out-proj (and fc2); backward: a
        # column block gathers its saved input again and reduce-scatters dx, a row block gathers dy
        _add(out, ("tp", "all_gather"), blocks * (fwd + 2) * ring("all_gather", act, tp))
        _add(out, ("tp", "reduce_scatter"), blocks * (fwd + 1) * ring("reduce_scatter", act, tp))
        # each rank saw only its tokens: the replicated norm weights' (and row biases', and the router's)
        # grads are summed
        small = 2 * norm_params + (blocks if bias else 0) + experts
        grad = itemsize if grad_itemsize is None else grad_itemsize
        _add(out, ("tp", "all_reduce"), small * ring("all_reduce", h * grad, tp))
    # this rank's K (or V): its tokens at its TP rank's K/V heads (a K/V head replicated where TP has more ranks)
    kv = tokens * max((kv_heads or heads) // tp, 1) * (h // heads) * itemsize
    if cp > 1 and cp_comm == "all_gather":
        # K and V gathered forward and again backward; dK and dV, summed over every rank's queries, reduce-scattered
        _add(out, ("cp", "all_gather"), (fwd + 1) * 2 * ring("all_gather", cp * kv, cp))
        _add(out, ("cp", "reduce_scatter"), 2 * ring("reduce_scatter", cp * kv, cp))
    elif cp > 1:
        # ring attention: K and V go round cp-1 times forward; backward K, V, dK, dV cp-1 times and
        # dK, dV one more hop home
        _add(out, ("cp", "p2p"), (fwd * 2 * (cp - 1) + 4 * (cp - 1) + 2) * kv)
    return out


def moe_traffic(
    h: int,
    tokens_routed: float,
    top_k: int,
    ep: int,
    itemsize: int = 2,
    recompute: bool = False,
    experts: int = 0,
    back_itemsize: int | None = None,
    copies: float | None = None,
) -> dict[Key, float]:
    """One MoE layer: dispatch and combine all-to-alls forward and again backward. Each of a rank's
    routed tokens goes to top_k experts, (ep-1)/ep of them elsewhere (uniform routing, no same-GPU dedup);
    `copies` given, each goes to that many other GPUs instead (a dispatcher that sends a token once to each
    GPU that needs it: `ep_destinations`).
    `itemsize` is the bytes of a value sent toward the experts (the dispatch, and backward the gradients of
    the experts' outputs), `back_itemsize` (default the same) of one coming home (the combine, and backward
    the gradients of the tokens): DeepSeek-V3 sends the first in FP8 and the second in BF16.

    experts: when given (E > 0), the dict also holds ("ep", "all_to_all_dedup"): the same passes counted
    the engine's way, one row per (token, remote GPU) under uniform routing, gates riding with the
    dispatch rows (see ep_expected_bytes). It is an alternative figure for the same traffic, not extra
    traffic: add up one key or the other, never both."""
    if ep <= 1:
        return {}
    back = itemsize if back_itemsize is None else back_itemsize
    values = tokens_routed * h * (top_k * (ep - 1) / ep if copies is None else copies)
    fwd = 2 if recompute else 1
    out = {("ep", "all_to_all"): (fwd + 1) * values * (itemsize + back)}
    if experts:
        e = ep_expected_bytes(tokens_routed, top_k, experts, ep, h, itemsize, back)
        out[("ep", "all_to_all_dedup")] = (
            fwd * (e["dispatch"] + e["combine"]) + e["combine backward"] + e["dispatch backward"]
        )
    return out


def etp_traffic(
    h: int, tokens_routed: float, top_k: int, etp: int, itemsize: int = 2, recompute: bool = False
) -> dict[Key, float]:
    """One MoE layer's expert-tensor-parallel collectives on one micro-batch: bytes one GPU sends, by (axis, op).
    `step_traffic` leaves them out (its MoE layers are ETP 1's, as the clock times every expert whole on its
    GPU); `parasim check-layout`'s etp-1 rule counts them here.

    Where they come from: Megatron-Core's all-to-all token dispatcher (megatron/core/transformer/moe/
    token_dispatcher.py, MoEAlltoAllTokenDispatcher). After the EP all-to-all a GPU holds the copies routed to its
    experts, under balanced routing as many as it sent: tokens_routed x top_k rows of h values. It all-gathers
    them over the ETP group (dispatch_postprocess: gather_from_sequence_parallel_region over the expert
    tensor-parallel group), so that each ETP rank runs its slice of every local expert on all etp x rows, and
    reduce-scatters the partial outputs back before the combine (combine_preprocess:
    reduce_scatter_to_sequence_parallel_region). Backward, each becomes the other. With B = etp x rows x h x
    itemsize the gathered buffer, one GPU sends per MoE layer and micro-batch

        all-gather:      (fwd + 1) x (etp - 1)/etp x B
        reduce-scatter:  (fwd + 1) x (etp - 1)/etp x B

    fwd = 2 under full recomputation (the forward, its collectives with it, runs again), else 1. The routing
    weights gathered beside the tokens, one value a row, are left out."""
    if etp <= 1:
        return {}
    gathered = etp * tokens_routed * top_k * h * itemsize
    fwd = 2 if recompute else 1
    return {
        ("etp", "all_gather"): (fwd + 1) * ring("all_gather", gathered, etp),
        ("etp", "reduce_scatter"): (fwd + 1) * ring("reduce_scatter", gathered, etp),
    }


# The four EP all-to-alls, in the order one MoE layer runs them.
EP_PASSES = ("dispatch", "combine", "combine backward", "dispatch backward")


def ep_bytes_from_routing(
    routing: Sequence[Sequence[Sequence[int]]], ep: int, experts: int, hidden: int, bytes_per: int = 2
) -> list[dict[str, int]]:
    """Bytes each EP rank sends in each of the four all-to-alls, given the actual routing.

    routing[r][t] lists the experts token t of EP rank r chose. Experts sit in contiguous blocks of
    E/ep per rank. A token crosses to each other rank owning at least one of its experts exactly once
    (two experts on one GPU share the row); a row kept on its own rank costs nothing. Dispatch rows carry
    the hidden state and the E/ep gates of the receiving rank's experts; combine rows carry the hidden
    state only. Backward retraces both: combine backward sends the dispatch rows' routes with h values,
    dispatch backward returns the combine routes with h + E/ep values (input and gate gradients)."""
    if len(routing) != ep or experts % ep:
        raise LayoutError(f"need one routing per EP rank ({ep}) and experts ({experts}) divisible by ep")
    per = experts // ep
    out_rows = [0] * ep  # rows a rank sends as a token's home
    in_rows = [0] * ep  # rows a rank receives as an expert holder (and sends back in combine)
    for home, tokens in enumerate(routing):
        for chosen in tokens:
            for dest in {e // per for e in chosen} - {home}:
                out_rows[home] += 1
                in_rows[dest] += 1
    wide, narrow = (hidden + per) * bytes_per, hidden * bytes_per
    return [
        {
            "dispatch": out_rows[r] * wide,
            "combine": in_rows[r] * narrow,
            "combine backward": out_rows[r] * narrow,
            "dispatch backward": in_rows[r] * wide,
        }
        for r in range(ep)
    ]


def plan_groups(plan: Plan, kind: str) -> list[list[int]]:
    """The rank groups of that kind (Megatron-Core's, mesh.GROUP_KINDS' names: "tp", "ep", "dp-cp", ...) the plan's
    layout builds."""
    _, generator, axes = next(k for k in GROUP_KINDS if k[0] == kind)
    return plan.rank_groups(generator, axes)


def group_per_node(plan: Plan, kind: str) -> int:
    """GPUs of the first group of that kind that share its first member's node."""
    first = [int(r) for r in plan_groups(plan, kind)[0]]
    return sum(r // plan.gpus_per_node == first[0] // plan.gpus_per_node for r in first)


def once_per_gpu(model: ModelSpec, plan: Plan) -> tuple[float, float] | None:
    """`ep_destinations` of the plan's EP group and the model's routing where the plan's dispatcher sends a token
    once to each GPU and node (estimate/dispatch.py: DeepEP, HybridEP); None where it sends each top-k copy."""
    from .dispatch import DISPATCHERS

    if not DISPATCHERS[plan.dispatcher].once_per_gpu:
        return None
    return ep_destinations(
        model.top_k, model.experts, plan.ep, group_per_node(plan, "ep"), model.expert_groups, model.groups_kept
    )


def ep_expected_rows(tokens: float, k: int, experts: int, ep: int) -> float:
    """Expected (token, remote GPU) rows one GPU dispatches when each token picks k distinct experts
    uniformly out of E, E/ep per GPU: each of the ep - 1 other GPUs is needed unless all k picks miss
    its block, which happens with probability C(E - E/ep, k) / C(E, k) (`ep_destinations`)."""
    return tokens * ep_destinations(k, experts, ep)[0]


def _needed(pool: int, block: int, k: int) -> float:
    """The chance that k distinct picks out of `pool` experts hit a given `block` of them."""
    return 1.0 if block >= pool else 1.0 - math.comb(pool - block, k) / math.comb(pool, k)


def _hit(block: int, k: int, experts: int, groups: int, kept: int) -> float:
    """The chance a token needs a run of `block` experts (a GPU's, a node's) when it picks k of the experts of
    `kept` of `groups` equal groups, the groups it keeps as likely as any others (balanced routing). A run that
    holds whole groups is needed when j >= 1 of them are kept (hypergeometric) and a pick falls in them; a run
    inside one group when that group is kept and a pick falls in the run."""
    size = experts // groups
    pool = size * kept
    if block < size:
        return kept / groups * _needed(pool, block, k)
    held = block // size
    return sum(
        math.comb(held, j) * math.comb(groups - held, kept - j) / math.comb(groups, kept) * _needed(pool, j * size, k)
        for j in range(1, min(held, kept) + 1)
    )


def ep_destinations(
    k: int, experts: int, ep: int, per_node: int | None = None, groups: int | None = None, kept: int | None = None
) -> tuple[float, float]:
    """Expected (other GPUs, nodes) a token needs when it picks k distinct experts, E/ep to a GPU in order and
    `per_node` of the EP group's GPUs to a node (None: the group in one node): what a dispatcher that sends a
    token once to each GPU, and across nodes once to each node, sends (estimate/dispatch.py). The nodes count the
    token's own, as DeepEP's measured RDMA bandwidth counts them (tests/test_internode.py at 2be0d4f8: a token's
    distinct nodes, `rdma_idx` made unique, own node included, times hidden x 2 bytes); 0 for a group in one
    node.

    The picks are uniform over every expert, or under group-limited routing over the experts of `kept` of
    `groups` equal groups of consecutive experts (`_hit`: the chance a GPU's or a node's experts are needed),
    with GPUs and nodes holding whole groups or lying inside one (DeepSeek-V3: a group is a node's worth).
    Routing that balances the load makes every GPU of the group as likely a destination as any other, the
    token's own included: (ep - 1)/ep of the GPUs it needs are others."""
    if ep <= 1:
        return 0.0, 0.0
    groups, kept = (1, 1) if groups is None else (groups, kept)
    per_gpu = experts // ep
    gpus = ep * _hit(per_gpu, k, experts, groups, kept) * (ep - 1) / ep
    per_node = ep if per_node is None else min(per_node, ep)
    if per_node >= ep:
        return gpus, 0.0
    return gpus, ep / per_node * _hit(per_gpu * per_node, k, experts, groups, kept)


def ep_expected_bytes(
    tokens: float, k: int, experts: int, ep: int, hidden: int, bytes_per: int = 2, back_bytes: int | None = None
) -> dict[str, float]:
    """Expected bytes one GPU sends in each EP all-to-all under uniform routing, counted the engine's way
    (ep_bytes_from_routing). By symmetry a GPU receives, and so sends back, as many rows as it sends.
    `bytes_per`: a value sent toward the experts; `back_bytes` (default the same): one coming home."""
    rows = ep_expected_rows(tokens, k, experts, ep)
    back = bytes_per if back_bytes is None else back_bytes
    per = experts // max(ep, 1)
    return {
        "dispatch": rows * (hidden + per) * bytes_per,
        "combine": rows * hidden * back,
        "combine backward": rows * hidden * bytes_per,
        "dispatch backward": rows * (hidden + per) * back,
    }


def dp_traffic(
    local_params: float, shard: int, zero: int, itemsize: int = 2, param_itemsize: int | None = None
) -> dict[Key, float]:
    """Per step over the data-parallel (dp x cp) group. Plain DP all-reduces the gradients; ZeRO-1/2
    reduce-scatter them and all-gather the updated weights (the same values); ZeRO-3 gathers the weights
    again for backward: 3 passes where DP makes 2. `itemsize`: a gradient's bytes as reduced; `param_itemsize`
    (default the same): a weight's as gathered (Megatron reduces FP32 gradients and gathers BF16 weights)."""
    if shard <= 1:
        return {}
    if zero == 0:
        return {("dp", "all_reduce"): ring("all_reduce", local_params * itemsize, shard)}
    gathers = 2 if zero == 3 else 1
    weights = local_params * (itemsize if param_itemsize is None else param_itemsize)
    return {
        ("dp", "reduce_scatter"): ring("reduce_scatter", local_params * itemsize, shard),
        ("dp", "all_gather"): gathers * ring("all_gather", weights, shard),
    }


def pp_traffic(act_bytes: float, microbatches: int, pp: int) -> dict[Key, float]:
    """The busiest stage: a middle stage sends each micro-batch's activation on and its gradient back."""
    if pp <= 1:
        return {}
    return {("pp", "p2p"): act_bytes * microbatches * (2 if pp > 2 else 1)}


def step_traffic(model: ModelSpec, plan: Plan, seq: int, itemsize: int | None = None) -> dict[Key, float]:
    """Bytes one GPU of the busiest stage sends in one step (all micro-batches), by (axis, op): the stage with
    the most layers by the model's rule (layout/stages.py), of those the most MoE layers. Each kind of value is
    at the plan's precision (activations, gradients as reduced, weights as gathered, the EP dispatch and
    combine), or every value `itemsize` bytes when given (a run that computes in one dtype)."""
    dt = plan.dtypes
    size = {k: itemsize or dt.bytes(k) for k in ("activations", "grad_reduce", "compute", "dispatch", "combine")}
    tokens = seq * plan.micro_batch / plan.cp
    dense_n, moe = (int(x) for x in stage_layers(model, plan.pp, most_layers(model, plan.pp)))
    layers = dense_n + moe
    full = plan.recompute == "full"
    out: dict[Key, float] = {}
    kinds = ((layers - moe, 0), (moe, model.experts))  # dense layers (first), then MoE layers, on that stage
    for n, experts in kinds:
        per = layer_traffic(
            model.hidden,
            model.heads,
            int(tokens),
            plan.tp,
            plan.sp,
            plan.cp,
            itemsize=size["activations"],
            bias=model.bias,
            norm_params=2 if model.norm == "layernorm" else 1,
            recompute=full,
            experts=experts,
            grad_itemsize=size["grad_reduce"],
            kv_heads=model.kv,
            cp_comm=plan.cp_comm,
        )
        for k, v in per.items():
            # under SP the only TP all-reduce sums the SP-split weights' gradients, once per step as Megatron's
            # finalize_model_grads does (the engine too: partial_sums="step"), not once per micro-batch
            once = plan.sp and k == ("tp", "all_reduce")
            _add(out, k, v * n * (1 if once else plan.m))
    if moe:
        x = plan.tp if plan.sp else 1
        once = once_per_gpu(model, plan)
        copies = None if once is None else once[0]
        for k, v in moe_traffic(
            model.hidden,
            tokens / x,
            model.top_k,
            plan.ep,
            size["dispatch"],
            full,
            back_itemsize=size["combine"],
            copies=copies,
        ).items():
            _add(out, k, v * moe * plan.m)
    act = tokens / (plan.tp if plan.sp else 1) * model.hidden * size["activations"]
    for k, v in pp_traffic(act, plan.m, plan.pp).items():
        _add(out, k, v)
    experts = model.expert_params()
    dense_local = (model.total_params() - experts) / (plan.tp * plan.pp)
    for k, v in dp_traffic(dense_local, plan.dp * plan.cp, plan.zero, size["grad_reduce"], size["compute"]).items():
        _add(out, k, v)
    if experts:
        edp = plan.edp
        for k, v in dp_traffic(
            experts / (plan.etp * plan.ep * plan.pp), edp, plan.zero, size["grad_reduce"], size["compute"]
        ).items():
            _add(out, ("edp", k[1]), v)
    return out


# -- FLOPs and time -------------------------------------------------------------------------------------
def attention_flops(model: ModelSpec, seq: int, recompute: str = "none", causal: bool = True) -> float:
    """Attention-score FLOPs for one sequence, forward + backward (twice forward) + recomputed forward:
    QK^T and PV are 2*s^2*h each per layer, halved by a causal mask."""
    fwd = 4.0 * seq * seq * model.hidden * model.layers * (0.5 if causal else 1.0)
    return fwd * (3 + (1 if recompute in ("full", "selective") else 0))


def step_flops(model: ModelSpec, plan: Plan, seq: int) -> dict[str, float]:
    """FLOPs of one step on all GPUs: matmuls (2 per parameter per token forward, the output head
    included) and attention scores; backward is twice forward; recomputation adds forward work."""
    seqs = plan.micro_batch * plan.m * plan.dp  # sequences in one step, all replicas
    fwd_lin = 2.0 * (model.active_params() + model.vocab * model.hidden) * seq
    lin = fwd_lin * (3 + (1 if plan.recompute == "full" else 0)) * seqs
    attn = attention_flops(model, seq, plan.recompute) * seqs
    return {"matmul": lin, "attention": attn, "total": lin + attn}


def across_share(plan: Plan, axis: str, gpus_per_node: int) -> float:
    """The share of `axis`'s bytes, all its groups together, that cross a node boundary, counted hop by hop
    (comm/hops.py, as the engine's trace counts them): a DP ring of 8 over two nodes crosses on 2 of its 8
    hops, so a quarter of its bytes go over the network. Read from the layout's own groups, in their
    member order, so either rank order Megatron-Core builds gives its own answer."""
    a = AXES[axis]  # the group its bytes go over, and how they travel there (layout/axes.py)
    return crossing_share(plan_groups(plan, a.traffic), a.hops, gpus_per_node)


def inside_node(plan: Plan, axis: str, gpus_per_node: int) -> bool:
    """Does every group over `axis` stay inside one node (no hop of it crosses)?"""
    return across_share(plan, axis, gpus_per_node) == 0.0

"""The clock audit: one or more tests for each bug an independent audit planted in the clock and the plan model
(and that the rest of the suite let through). Each docstring names the planted change its test catches.

Every expected value is worked out here, outside the code under test: from the hardware table's constants
(estimate/hardware.py: NCCL's latencies), the measured tables read point by point (estimate/kernels.py: a
collective's bus bandwidth for its size, a product's share of peak for its shape, the overlap slowdown), a
model's published size (the post's 27B: 27e9 parameters, 60 layers) or a shape's arithmetic. Never by calling
the function under test.

Where a test that should hold fails on the code as it is, it is marked xfail(strict=True) with the reason: a
real bug found by the audit, left for its own fix.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

import parasim
from parasim.clock import machine, simulate
from parasim.clock.plan import plan_time
from parasim.clock.timeline import Timeline, summary
from parasim.engine.context import Context
from parasim.estimate.hardware import GPUS, LATENCY
from parasim.estimate.kernels import collective_bandwidth, gemm_efficiency, overlap_slowdown
from parasim.estimate.memory import Plan
from parasim.estimate.models import get_model
from parasim.estimate.traffic import across_share, step_traffic
from parasim.layout import ModelSpec
from parasim.comm.trace import Event, Trace
from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[3]  # the checkout whose parasim these tests hold (a subprocess imports it)
CALL, INSIDE, ACROSS = (LATENCY[k].value for k in ("call", "inside", "across"))  # NCCL's latencies, seconds
SLOW = overlap_slowdown("h200").value  # compute beside communication slows by this share of their overlap
BF16 = 2  # bytes a value: the post's precision, in which a run at real size draws and sends its arrays


def busbw(op: str, buffer: float, where: str, t: int, gpu: str = "h200") -> float:
    """The bus bandwidth the measured table gives a collective `op` of a `buffer`-byte whole buffer over t GPUs."""
    return collective_bandwidth(gpu, op, int(buffer), where, t).value


def product(m: int, n: int, k: int, gpu: str = "h200") -> float:
    """Seconds of one (m x k) @ (k x n) product at the share of peak the kernel table measures for its shape."""
    return 2 * m * n * k / (GPUS[gpu].peak_flops.value * gemm_efficiency(gpu, m, n, k).value)


def the(trace: Trace, op: str) -> Event:
    """The one event of `trace` that is an `op`."""
    (e,) = [e for e in trace.events if e.op == op]
    return e


def seconds(tl: Timeline, e: Event) -> float:
    start, end = tl.events[e.seq]
    return end - start


# -- 1. a chain collective pays one latency per hop -------------------------------------------------------
def _rooted(ctx: Context) -> None:
    """Three rooted collectives over 4 ranks, on 1,024 float64 values (an exact run: timed at BF16's 2 bytes a
    value, so 2,048 bytes on the wire where 8,192 were recorded)."""
    x = ctx.xp.ones((1024,), dtype=ctx.xp.float64)
    ctx.comm.broadcast(x, src=0)
    ctx.comm.reduce(x, dst=0)
    ctx.comm.scatter(x, src=0)


def p2p_rate(nbytes: float, where: str) -> float:
    """A point-to-point send's rate over `where` (costs.py's rule, worked out here from the table): a two-member
    all-gather of twice the bytes, each member moving one half to the other."""
    return busbw("all_gather", 2 * nbytes, where, 2)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_a_broadcast_or_reduce_pays_the_latency_of_every_hop_of_its_chain(op: str) -> None:
    """Catches bug 1 (clock/costs.py `_chain`: `len(hops) * m.latency[where]` changed to `m.latency[where]`, one
    hop's latency for the whole chain). A broadcast over 4 ranks forwards the buffer 0 -> 1 -> 2 -> 3 (a reduce
    runs that chain backwards): 3 hops, each adding its latency, plus the call's, and the 2,048 bytes crossing
    once at the slowest hop's point-to-point rate. Inside a node: 3 x NVLink's latency; on nodes of 2 GPUs the
    hop 1-2 crosses, so the chain goes at the network's pace and every one of its 3 hops pays the network's."""
    trace = parasim.run(_rooted, 4).trace
    e = the(trace, op)
    nbytes = 1024 * BF16
    inside = CALL + 3 * INSIDE + nbytes / p2p_rate(nbytes, "inside")
    assert seconds(simulate(trace, machine("h200")), e) == pytest.approx(inside, rel=1e-12)
    across = CALL + 3 * ACROSS + nbytes / p2p_rate(nbytes, "across")
    assert seconds(simulate(trace, machine("h200", gpus_per_node=2)), e) == pytest.approx(across, rel=1e-12)


def test_a_scatter_sends_each_chunk_from_its_root_with_its_own_latency() -> None:
    """Catches bug 1 on the other rooted collective (clock/costs.py `_root`: one latency for all the root's
    sends). The root of a scatter over 4 ranks sends each of the 3 others its 256-value chunk (512 bytes at
    BF16), one after another. On nodes of 2: 0 -> 1 stays inside (the measured rate holds its latency); 0 -> 2
    and 0 -> 3 cross, each paying the network's latency on top."""
    trace = parasim.run(_rooted, 4).trace
    chunk = 256 * BF16
    want = (CALL + chunk / p2p_rate(chunk, "inside")
            + 2 * (ACROSS + chunk / p2p_rate(chunk, "across")))
    assert seconds(simulate(trace, machine("h200", gpus_per_node=2)), the(trace, "scatter")) == pytest.approx(
        want, rel=1e-12)


# -- 2. and 3. grad-reduce hides the data-parallel gradient reductions ------------------------------------
SIDE = 8192  # a real-size layer: 8192 x 8192 products
MM = product(SIDE, SIDE, SIDE)


def _grads_then_backward(group: str) -> Callable[[Context], None]:
    """A layer's weight gradient (one product), all-reduced over the data-parallel group `group` (plain DP, no
    sharding: 8192 x 8192 BF16 values, 128 MiB), while the layer below's backward (one more product) goes on."""
    def program(ctx: Context) -> None:
        xp = ctx.xp
        dp = ctx.new_group([0, 1], group)
        x = ctx.rng.normal((SIDE, SIDE))
        grad = xp.matmul(x, x)
        ctx.comm.all_reduce(grad, group=dp)
        xp.matmul(x, x)
    return program


def _check_grad_reduce_hides(group: str) -> None:
    trace = parasim.run(_grads_then_backward(group), 2, "symbolic").trace
    m = machine("h200")  # both ranks in one node
    buffer = SIDE * SIDE * BF16
    ar = buffer * 2 * (2 - 1) / 2 / busbw("all_reduce", buffer, "inside", 2)  # each moves 2(t-1)/t of it
    assert ar < MM  # the all-reduce fits behind the product that follows it
    off = simulate(trace, m)
    assert off.step == pytest.approx(MM + ar + MM, rel=1e-9)  # the rank waits for its gradients
    on = simulate(trace, m, ("grad-reduce",))
    # the all-reduce runs beside the next product, which slows by SLOW of their overlap (the whole all-reduce)
    assert on.step == pytest.approx(MM + MM + SLOW * ar, rel=1e-9)
    e = the(trace, "all_reduce")
    assert on.events[e.seq] == pytest.approx((MM, MM + ar), rel=1e-9)  # the same call, no longer waited for


def test_grad_reduce_hides_a_plain_dp_all_reduce_on_the_trace() -> None:
    """Catches bug 2 on the trace clock (clock/overlaps.py `_is_grad_reduce` no longer picking a plain-DP
    all-reduce, only ZeRO's reduce-scatter): with `--overlap grad-reduce` the gradients' all-reduce over "dp"
    runs beside the backward that follows it."""
    _check_grad_reduce_hides("dp")


def test_grad_reduce_hides_an_expert_dp_all_reduce_on_the_trace() -> None:
    """Catches bug 3 on the trace clock (clock/overlaps.py DP_GROUPS without "expert-dp"): the experts'
    gradients, summed over the expert-data-parallel group, are data-parallel reductions too, hidden alike."""
    _check_grad_reduce_hides("expert-dp")


MODEL_27B = get_model("27b")
PARAMS_27B, LAYERS_27B = 27e9, 60  # the post's model: 27e9 parameters in 60 layers
SEQ = 4096


def test_the_27b_presets_size_is_the_posts() -> None:
    """The plan tests below price the 27B model's reductions from its published size: hold the preset to it."""
    assert MODEL_27B.total_params() == PARAMS_27B and MODEL_27B.layers == LAYERS_27B


def test_grad_reduce_hides_a_plain_dp_all_reduce_in_the_plan() -> None:
    """Catches bug 2 in the plan (clock/plan.py's `exposed_grads` left whole under `--overlap grad-reduce` for
    plain DP). The 27B model on 8 GPUs of a node, plain DP (ZeRO 0), one micro-batch: the gradients, 27e9 BF16
    values, are all-reduced, each GPU moving 2 x 7/8 of the 54 GB at the busbw measured for that size. Behind
    the backward (2/3 of a micro-batch, longer than the all-reduce) only the slowdown it causes stays exposed."""
    plan = Plan(dp=8, zero=0)
    buffer = PARAMS_27B * BF16
    grads = buffer * 2 * 7 / 8 / busbw("all_reduce", buffer, "inside", 8)
    off = plan_time(MODEL_27B, plan, SEQ, "h200")
    on = plan_time(MODEL_27B, plan, SEQ, "h200", ("grad-reduce",))
    assert off["dp_grads_s"] == pytest.approx(grads, rel=1e-9)
    assert off["exposed_grads_s"] == pytest.approx(grads, rel=1e-9)
    assert grads < on["per_microbatch_s"] * 2 / 3  # all of it fits behind the backward
    assert on["exposed_grads_s"] == pytest.approx(SLOW * grads, rel=1e-9)
    assert on["step_s"] == pytest.approx(off["step_s"] - (1 - SLOW) * grads, rel=1e-9)


# -- 3. the expert-data-parallel group in the estimator ---------------------------------------------------
# A small MoE model: 2 layers, hidden 1024, 8 experts of width 512 (no biases, a plain two-matrix MLP), top 2.
TINY_MOE = ModelSpec(name="tiny-moe", layers=2, hidden=1024, heads=8, vocab=1000, experts=8, top_k=2,
                     expert_ffn=512, bias=False)
EXPERT_PARAMS = 2 * 8 * 2 * 1024 * 512  # layers x experts x (up and down: 2 x hidden x width)


def test_the_experts_gradients_are_reduced_over_expert_dp_in_the_traffic() -> None:
    """Catches bug 3 in the estimator (estimate/traffic.py: the experts' reduction over "expert-dp", the "edp"
    axis, dropped or sent over the dense DP group). 4 GPUs, EP 2, DP 4, ZeRO-1: each GPU holds half the experts
    (EXPERT_PARAMS / 2) and shares them with the one other GPU of its expert-DP group (edp = 4 / 2 = 2), so it
    reduce-scatters, then all-gathers, (2-1)/2 of their BF16 bytes; the dense rest goes over DP 4. Megatron
    builds expert groups with EP fastest, so expert-DP pairs ranks 0-2 and 1-3: on nodes of 2 GPUs every hop of
    those rings crosses, where the dense DP ring 0-1-2-3 crosses on 2 hops of its 4."""
    plan = Plan(ep=2, dp=4, zero=1, gpus_per_node=2).check(TINY_MOE)
    assert TINY_MOE.expert_params() == EXPERT_PARAMS
    got = step_traffic(TINY_MOE, plan, SEQ)
    experts = EXPERT_PARAMS / 2 * BF16 * (2 - 1) / 2
    dense = (TINY_MOE.total_params() - EXPERT_PARAMS) * BF16 * (4 - 1) / 4
    assert got[("edp", "reduce_scatter")] == pytest.approx(experts, rel=1e-12)
    assert got[("edp", "all_gather")] == pytest.approx(experts, rel=1e-12)
    assert got[("dp", "reduce_scatter")] == pytest.approx(dense, rel=1e-12)
    assert across_share(plan, "edp", 2) == 1.0
    assert across_share(plan, "dp", 2) == 0.5


# -- 4. prefetch issues the parameter all-gathers early ----------------------------------------------------
def _layer_then_gather(group: str) -> Callable[[Context], None]:
    """Layer i computes (one product), then ZeRO-3 all-gathers layer i+1's weight over `group` (each of the 2
    ranks holds half of it: 4096 x 8192 BF16 values, 64 MiB) and layer i+1 computes (one product)."""
    def program(ctx: Context) -> None:
        xp = ctx.xp
        dp = ctx.new_group([0, 1], group)
        x = ctx.rng.normal((SIDE, SIDE))
        xp.matmul(x, x)
        shard = ctx.rng.normal((SIDE // 2, SIDE))
        ctx.comm.all_gather(shard, group=dp)
        xp.matmul(x, x)
    return program


def _gather_seconds() -> float:
    buffer = SIDE * SIDE * BF16  # the whole weight, gathered
    return buffer * (2 - 1) / 2 / busbw("all_gather", buffer, "inside", 2)


def _check_prefetch_issues_early(group: str) -> None:
    trace = parasim.run(_layer_then_gather(group), 2, "symbolic").trace
    m = machine("h200")
    ag = _gather_seconds()
    e = the(trace, "all_gather")
    off = simulate(trace, m)
    assert off.events[e.seq] == pytest.approx((MM, MM + ag), rel=1e-9)  # after layer i, which it then holds up
    assert off.step == pytest.approx(MM + ag + MM, rel=1e-9)
    on = simulate(trace, m, ("prefetch",))
    # issued before layer i's product, which it runs beside: it starts when that product starts
    start, end = on.events[e.seq]
    assert start == 0.0 and end == pytest.approx(ag, rel=1e-9)
    assert on.step < off.step


def test_prefetch_issues_a_zero3_weight_all_gather_before_the_layer_before_it() -> None:
    """Catches bug 4 on the trace clock (`--overlap prefetch` having no effect: clock/overlaps.py
    `_is_param_gather` or the timeline's "early" issue): a weight all-gather over "dp" starts when the
    product before it starts, not after it."""
    _check_prefetch_issues_early("dp")


def test_prefetch_issues_an_expert_dp_weight_all_gather_early_too() -> None:
    """Catches bug 3 for the gathers (clock/overlaps.py DP_GROUPS without "expert-dp"): a ZeRO-3 gather of the
    experts' weights over the expert-data-parallel group is prefetched like a dense weight's."""
    _check_prefetch_issues_early("expert-dp")


def test_a_prefetched_gather_hides_behind_the_product_before_it_and_slows_it() -> None:
    """What prefetch should give (the step's compute is never shorter than the rank's compute): the gather runs
    beside layer i's product, which slows by SLOW of their overlap (the whole gather: it is shorter), and layer
    i+1's product starts when layer i's ends."""
    trace = parasim.run(_layer_then_gather("dp"), 2, "symbolic").trace
    ag = _gather_seconds()
    assert ag < MM
    on = simulate(trace, machine("h200"), ("prefetch",))
    first, second = sorted((s for s in on.spans if s.kind == "compute" and s.ranks == (0,)), key=lambda s: s.start)
    assert second.start >= first.end
    assert on.step == pytest.approx(MM + SLOW * ag + MM, rel=1e-9)


def test_prefetch_hides_the_distributed_optimizers_weight_all_gather_in_the_plan() -> None:
    """Catches bug 4 in the plan (clock/plan.py `exposed_params` left whole under `--overlap prefetch` with
    Megatron's distributed optimizer). The 27B model, ZeRO-1 over 8 GPUs of a node: the updated BF16 weights,
    54 GB, are all-gathered (each GPU moving 7/8 of them); prefetched, the gather runs behind the first forward
    (a third of a micro-batch, longer than it), leaving only the slowdown it causes."""
    plan = Plan(dp=8, zero=1)
    buffer = PARAMS_27B * BF16
    params = buffer * 7 / 8 / busbw("all_gather", buffer, "inside", 8)
    off = plan_time(MODEL_27B, plan, SEQ, "h200")
    on = plan_time(MODEL_27B, plan, SEQ, "h200", ("prefetch",))
    assert off["dp_params_s"] == pytest.approx(params, rel=1e-9)
    assert off["exposed_params_s"] == pytest.approx(params, rel=1e-9)
    assert params < on["per_microbatch_s"] / 3
    assert on["exposed_params_s"] == pytest.approx(SLOW * params, rel=1e-9)
    assert on["step_s"] == pytest.approx(off["step_s"] - (1 - SLOW) * params, rel=1e-9)


def test_prefetch_hides_fsdps_layer_by_layer_gathers_in_the_plan() -> None:
    """Catches bug 4 for ZeRO-3 / FSDP (clock/plan.py `_fsdp_exposed` ignoring prefetch). The 27B model, ZeRO-3
    over 8 GPUs of a node, one micro-batch: the weights are gathered layer by layer for the forward and again for
    the backward, each layer's all-gather of 1/60 of the 54 GB at the bandwidth measured for its own size, 2 x 60
    of them in all. Without prefetch every layer waits for its own gather. With it, each layer's gather runs
    while the layer before computes, so in each pass only the first layer waits for its gather, and the other
    59, each shorter than a layer's compute, only slow it: per pass G + 59 x SLOW x G."""
    plan = Plan(dp=8, zero=3)
    layer = PARAMS_27B * BF16 / LAYERS_27B
    per_layer = layer * 7 / 8 / busbw("all_gather", layer, "inside", 8)
    off = plan_time(MODEL_27B, plan, SEQ, "h200")
    on = plan_time(MODEL_27B, plan, SEQ, "h200", ("prefetch",))
    assert off["dp_params_s"] == pytest.approx(2 * LAYERS_27B * per_layer, rel=1e-9)
    assert off["exposed_params_s"] == pytest.approx(2 * LAYERS_27B * per_layer, rel=1e-9)
    assert per_layer < on["per_microbatch_s"] / 3 / LAYERS_27B  # a layer's gather fits behind a layer's forward
    want = 2 * (per_layer + (LAYERS_27B - 1) * SLOW * per_layer)
    assert on["exposed_params_s"] == pytest.approx(want, rel=1e-9)


# -- 5. idle time ------------------------------------------------------------------------------------------
def _uneven_backward(ctx: Context) -> None:
    """Both ranks compute one product, all-reduce a 1024 x 1024 BF16 gradient bucket (2 MiB) over "dp", and
    compute one more product beside it; rank 0 then computes a third product alone."""
    xp = ctx.xp
    dp = ctx.new_group([0, 1], "dp")
    x = ctx.rng.normal((SIDE, SIDE))
    xp.matmul(x, x)
    ctx.comm.all_reduce(ctx.rng.normal((1024, 1024)), group=dp)
    xp.matmul(x, x)
    if ctx.rank == 0:
        xp.matmul(x, x)


def test_idle_time_is_the_step_less_the_ranks_compute_not_less_its_communication() -> None:
    """Catches bug 5 (clock/timeline.py `Timeline.idle` computed as the step less the rank's communication).
    With grad-reduce on, the bucket's all-reduce (ar) runs beside the next product on both ranks, each slowed
    by SLOW x ar. Rank 0 computes 3 products, rank 1 two: the step is 3 MM + SLOW ar, and rank 1 sits idle the
    last MM of it. Its communication is wholly hidden behind its own compute, so every reading of idle (the step
    less the compute, or less the compute and the exposed communication) says MM; the step less its
    communication would say 3 MM + SLOW ar - ar."""
    trace = parasim.run(_uneven_backward, 2, "symbolic").trace
    bucket = 1024 * 1024 * BF16
    ar = bucket * 2 * (2 - 1) / 2 / busbw("all_reduce", bucket, "inside", 2)
    assert ar < MM
    tl = simulate(trace, machine("h200"), ("grad-reduce",))
    assert tl.step == pytest.approx(3 * MM + SLOW * ar, rel=1e-9)
    assert tl.busy == pytest.approx([3 * MM + SLOW * ar, 2 * MM + SLOW * ar], rel=1e-9)
    assert tl.comm == pytest.approx([ar, ar], rel=1e-9)
    assert tl.idle(0) == pytest.approx(0.0, abs=1e-12)
    assert tl.idle(1) == pytest.approx(MM, rel=1e-9)
    assert abs(tl.idle(1) - (tl.step - tl.comm[1])) > ar  # the planted reading is far off
    s = summary(tl, trace)
    assert s["compute_us"] == pytest.approx([(3 * MM + SLOW * ar) * 1e6, (2 * MM + SLOW * ar) * 1e6], rel=1e-9)
    assert s["comm_us"] == pytest.approx([ar * 1e6] * 2, rel=1e-9)


def _one_waits(ctx: Context) -> None:
    """Rank 0 computes two products, rank 1 one; then a 2 MiB all-reduce, and nothing after it."""
    xp = ctx.xp
    x = ctx.rng.normal((SIDE, SIDE))
    for _ in range(2 - ctx.rank):
        xp.matmul(x, x)
    ctx.comm.all_reduce(ctx.rng.normal((1024, 1024)))


def test_a_rank_waiting_for_its_peer_is_idle_for_the_wait_only() -> None:
    """No overlap: rank 1 finishes its product MM early and waits MM for rank 0 at the all-reduce, then both
    run it (ar, exposed on both). Idle, as HTA and a reader of 'computes, communicates and waits' count it:
    rank 1's wait, MM, and nothing for rank 0."""
    trace = parasim.run(_one_waits, 2, "symbolic").trace
    bucket = 1024 * 1024 * BF16
    ar = bucket / busbw("all_reduce", bucket, "inside", 2)
    tl = simulate(trace, machine("h200"))
    assert tl.step == pytest.approx(2 * MM + ar, rel=1e-9)
    assert [tl.idle(0), tl.idle(1)] == pytest.approx([0.0, MM], rel=1e-9, abs=1e-12)


# -- 6. EP under SP: each TP rank routes its own tokens ------------------------------------------------------
def test_the_plans_ep_all_to_alls_under_sp_carry_one_tp_ranks_tokens() -> None:
    """Catches bug 6 in the plan (clock/plan.py `stage_parts`: the all-to-all's values not divided by TP under
    SP). TINY_MOE with TP 2 + SP and EP 2 (a node), 4,096 tokens: each TP rank routes its own 2,048, each to its
    top 2 experts, half of which are on the other EP rank: 2,048 x 2 x 1,024 / 2 = 2,097,152 values, 2 bytes
    each, in the dispatch and again in the combine. Each all-to-all costs NCCL's call latency plus its bytes at
    the all-to-all rate measured for a group of 2 on the whole buffer (2x a member's sent bytes); dispatch and
    combine run forward and backward, in each of the 2 MoE layers."""
    plan = Plan(tp=2, sp=True, ep=2).check(TINY_MOE)
    sent = SEQ / 2 * 2 * 1024 * (2 - 1) / 2 * BF16
    one = CALL + sent / busbw("all_to_all", sent * 2 / (2 - 1), "inside", 2)
    want = 2 * 2 * (one + one)  # layers x (forward, backward) x (dispatch, combine)
    got = plan_time(TINY_MOE, plan, SEQ, "h200")["parts_per_microbatch_s"]["ep"]
    assert got == pytest.approx(want, rel=1e-12)


def test_the_traffics_ep_bytes_under_sp_are_one_tp_ranks_tokens() -> None:
    """Catches bug 6 in the estimator (estimate/traffic.py `step_traffic` not dividing the routed tokens by TP
    under SP): the same plan's all-to-all bytes per GPU, 2,097,152 values x (2 + 2 bytes: dispatch and
    combine) x 2 (forward and backward) x 2 MoE layers = 33,554,432."""
    plan = Plan(tp=2, sp=True, ep=2).check(TINY_MOE)
    want = SEQ / 2 * 2 * 1024 * (2 - 1) / 2 * (BF16 + BF16) * 2 * 2
    assert want == 33_554_432
    assert step_traffic(TINY_MOE, plan, SEQ)[("ep", "all_to_all")] == pytest.approx(want, rel=1e-12)


# -- 7. tensordot with integer axes -------------------------------------------------------------------------
def _tensordots(ctx: Context) -> None:
    """Two tensordots with integer axes, each followed by a barrier so its work stands alone before it."""
    xp = ctx.xp
    a = ctx.rng.normal((4, 3, 5))
    xp.tensordot(a, ctx.rng.normal((5, 7)), axes=1)  # sums a's last dim (5): out (4, 3, 7)
    ctx.comm.barrier()
    xp.tensordot(a, ctx.rng.normal((3, 5, 6)), axes=2)  # sums a's last two dims (3 x 5 = 15): out (4, 6)
    ctx.comm.barrier()


@pytest.mark.parametrize("backend", ["virtual", "symbolic"])
def test_a_tensordot_with_integer_axes_counts_its_output_times_its_summed_dims(backend: str) -> None:
    """Catches bug 7 (engine/work.py `counted_tensordot` counting the wrong dims for an integer `axes`; the
    symbolic array's tensordot likewise): 2 FLOPs per multiply-add, one per output value per summed value.
    axes=1 on (4, 3, 5) . (5, 7): 84 outputs x 5 summed = 2 x 420 = 840 FLOPs, an (4 x 5) @ (5 x 21) product
    as the clock times it (m the output's first dim, n the rest). axes=2 on (4, 3, 5) . (3, 5, 6): 24 outputs x
    15 summed = 720 FLOPs, (4 x 15) @ (15 x 6)."""
    trace = parasim.run(_tensordots, 2, backend).trace
    first, second = trace.events
    for e, flops, shape in ((first, 2 * (4 * 3 * 7) * 5, (4, 21, 5)), (second, 2 * (4 * 6) * (3 * 5), (4, 6, 15))):
        for mem in e.members:
            assert dict(mem.work) == {"matmul": flops}
            assert mem.work.gemms == {("matmul", *shape): 1}


# -- 8. a time limit names the user's line -------------------------------------------------------------------
SPINNER = textwrap.dedent("""\
    WORLD = 2


    def spin(ctx):
        x = ctx.xp.ones((64, 64))
        while ctx.rank == 1:
            x = ctx.xp.matmul(x, x) / 64  # rank 1 spins here, mostly inside parasim's counted product
        return ctx.comm.all_reduce(ctx.xp.ones(2))
    """)
SPIN_LINE = re.compile(r"stopped at prog\.py:[67] \(in spin\)")  # the loop's lines


def _first_line(stderr: str) -> str:
    return stderr.strip().splitlines()[0] if stderr.strip() else ""


@pytest.mark.timeout(120)
def test_a_user_program_that_loops_forever_is_named_at_its_own_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches bug 8 on virtual ranks (comm/watchdog.py `where` stopping at an engine frame: the loop is stopped
    inside parasim/engine/work.py's counted matmul, below array-api-compat's, and the message must walk up to
    the user's file). `parasim check prog.py:spin --timeout 1`: rank 1 loops forever; the one-line error names
    prog.py at the loop's line, not a file of parasim or of a library it calls."""
    monkeypatch.chdir(tmp_path)  # sites are named from the working directory
    (tmp_path / "prog.py").write_text(SPINNER)
    out = cli("check", "prog.py:spin", "--world", "2", "--timeout", "1")
    line = _first_line(out.stderr)
    assert out.returncode == 1, out.stderr
    assert "rank 1 ran for 1 s without reaching a collective" in line, out.stderr
    assert SPIN_LINE.search(line), out.stderr
    assert "parasim/" not in line and "site-packages" not in line, out.stderr


@pytest.mark.slow  # real ranks: a few seconds to start torch in each
@pytest.mark.timeout(120)
def test_a_user_program_that_loops_forever_on_real_ranks_is_named_at_its_own_line(tmp_path: Path) -> None:
    """Catches bug 8 on real ranks (comm/watchdog.py `frame_text`, which comm/rank_errors.py `answer_where`
    calls on the raw frame a stuck rank was interrupted in: there the loop is inside parasim/engine/torch_xp.py).
    `parasim run prog.py:spin --nproc 2 --timeout 1` (gloo, local processes): the one-line error names prog.py
    at the loop's line."""
    pytest.importorskip("torch")
    (tmp_path / "prog.py").write_text(SPINNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "parasim", "run", "prog.py:spin", "--nproc", "2", "--timeout", "1"],
                         capture_output=True, text=True, timeout=100, cwd=tmp_path, env=env)
    line = _first_line(out.stderr)
    assert out.returncode == 1, out.stderr
    assert "rank 1 ran for 1 s without reaching a collective" in line, out.stderr
    assert SPIN_LINE.search(line), out.stderr
    assert "parasim/" not in line, out.stderr


def _spins_on_symbolic_arrays(ctx: Context) -> None:
    x = ctx.rng.normal((64, 64))
    while ctx.rank == 1:
        x = (x + x) * x - x  # symbolic spin
    ctx.comm.all_reduce(x)


@pytest.mark.timeout(120)
def test_a_program_looping_on_symbolic_ranks_is_named_at_its_own_line() -> None:
    """The library's time limit on symbolic ranks: the loop's arithmetic runs in parasim's symbolic arrays, and
    the message must still name this file's line. Three runs, so that one stop that happens to land on the
    program's own frame cannot pass for the rule."""
    with open(__file__) as f:
        (n,) = [i for i, text in enumerate(f, 1) if text.rstrip().endswith("# symbolic spin")]
    for _ in range(3):
        with pytest.raises(parasim.TimedOut) as got:
            parasim.run(_spins_on_symbolic_arrays, 2, "symbolic", timeout=0.5)
        first = str(got.value).splitlines()[0]
        # the loop's body or its `while` line (a stop can land on either, under load): the program's own lines
        assert any(f"test_clock_audit.py:{k} (in _spins_on_symbolic_arrays)" in first for k in (n - 1, n)), first

"""The clock's second audit: tests for realistic slips in the clock (clock/costs.py, timeline.py, plan.py,
kernels_time.py, uncertainty.py, published.py, report.py) that the rest of the suite let through when they were
planted one at a time. Each test's docstring names the slip it catches.

Every expected value is worked out here, never by calling the function under test: from NCCL's latencies in the
hardware table (estimate/hardware.py), the measured tables read point by point (estimate/kernels.py: a
collective's bus bandwidth for its size, a product's share of peak for its shape, FlashAttention's share, the
streaming rate, the overlap slowdown), a model's shapes and the arithmetic written out in each test. Runs are
symbolic (real-size shapes, no arrays), so each test takes well under a second.
"""
from __future__ import annotations

import pytest

import parasim
from parasim.clock import machine, simulate
from parasim.clock.plan import plan_time
from parasim.clock.report import ClockChoice, clock_report
from parasim.clock.timeline import by_phase, event_time, summary
from parasim.engine.context import Context
from parasim.estimate.hardware import GPUS, LATENCY
from parasim.estimate.kernels import (attention_efficiency, collective_bandwidth, gemm_efficiency, memory_efficiency,
                                      overlap_slowdown)
from parasim.estimate.memory import Plan
from parasim.layout import ModelSpec
from parasim.comm.trace import Event, Trace

CALL, INSIDE, ACROSS = (LATENCY[k].value for k in ("call", "inside", "across"))  # NCCL's latencies, seconds
SLOW = overlap_slowdown("h200").value  # compute beside communication slows by this share of their overlap
BF16 = 2  # bytes a value of a real-size run's arrays


def busbw(op: str, buffer: float, where: str, t: int, gpu: str = "h200") -> float:
    """The bus bandwidth the measured table gives a collective `op` of a `buffer`-byte whole buffer over t GPUs."""
    return collective_bandwidth(gpu, op, int(buffer), where, t).value


def product(m: int, n: int, k: int, gpu: str = "h200") -> float:
    """Seconds of one (m x k) @ (k x n) product at the share of peak the kernel table measures for its shape."""
    return 2 * m * n * k / (GPUS[gpu].peak_flops.value * gemm_efficiency(gpu, m, n, k).value)


def the(trace: Trace, op: str, nth: int = 0) -> Event:
    """The nth event of `trace` that is an `op`."""
    return [e for e in trace.events if e.op == op][nth]


BIG, SMALL = 8192, 1024
MM, mm = product(BIG, BIG, BIG), product(SMALL, SMALL, SMALL)  # a real layer's product, and a small one
BUCKET = BIG * BIG * BF16  # a 128 MiB BF16 buffer
AR2 = BUCKET * 2 * (2 - 1) / 2 / busbw("all_reduce", BUCKET, "inside", 2)  # its all-reduce over 2 GPUs of a node
AG2 = BUCKET * (2 - 1) / 2 / busbw("all_gather", BUCKET, "inside", 2)  # gathering it from two halves


def test_the_worked_sizes_order_as_the_tests_below_need() -> None:
    """The trace tests below rest on these orders: a small product is shorter than the big buffer's
    collectives, which are shorter than a real layer's product."""
    assert mm < AG2 < MM and mm < AR2 < MM


# -- timeline: a prefetched gather longer than the compute it hides behind --------------------------------
def _small_then_gather(ctx: Context) -> None:
    """A small product (layer i), then layer i+1's weight all-gathered over "dp" (two halves of a 128 MiB BF16
    buffer), then layer i+1's big product, which needs the gathered weight."""
    xp = ctx.xp
    dp = ctx.new_group([0, 1], "dp")
    a = ctx.rng.normal((SMALL, SMALL))
    xp.matmul(a, a)
    ctx.comm.all_gather(ctx.rng.normal((BIG // 2, BIG)), group=dp)
    x = ctx.rng.normal((BIG, BIG))
    xp.matmul(x, x)


def test_a_prefetched_gather_longer_than_the_product_before_it_is_still_waited_for() -> None:
    """Catches the timeline's "early" issue forgetting the gathered result (clock/timeline.py: after a
    prefetched gather, the rank goes on at the end of the compute it hid behind even when the gather ends
    later). With prefetch the gather (AG2) starts with the small product (mm < AG2); the small product slows by
    SLOW x mm, the whole of it overlapping the gather; layer i+1's product needs the weight, so it starts at
    AG2: the step is AG2 + MM, and its critical path is the gather, then the product."""
    trace = parasim.run(_small_then_gather, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"), ("prefetch",))
    assert tl.events[the(trace, "all_gather").seq] == pytest.approx((0.0, AG2), rel=1e-9, abs=1e-15)
    assert tl.step == pytest.approx(AG2 + MM, rel=1e-9)
    assert tl.busy == pytest.approx([mm * (1 + SLOW) + MM] * 2, rel=1e-9)
    assert [s.kind for s in tl.critical] == ["comm", "compute"]
    assert sum(s.seconds for s in tl.critical) == pytest.approx(tl.step, rel=1e-9)


# -- timeline: one communication stream per GPU --------------------------------------------------------------
def _two_buckets(ctx: Context) -> None:
    """A product, two gradient buckets all-reduced over "dp" one after the other, then the next product."""
    xp = ctx.xp
    dp = ctx.new_group([0, 1], "dp")
    x = ctx.rng.normal((BIG, BIG))
    xp.matmul(x, x)
    ctx.comm.all_reduce(ctx.rng.normal((BIG, BIG)), group=dp)
    ctx.comm.all_reduce(ctx.rng.normal((BIG, BIG)), group=dp)
    xp.matmul(x, x)


def test_overlapped_calls_of_one_gpu_run_one_after_the_other_on_its_stream() -> None:
    """Catches a collective that ignores its members' busy communication stream (clock/timeline.py: the start
    taken from the issue times alone) and a rank's communication seconds kept for its last call only
    (`comm[r] = secs`). With grad-reduce both buckets are issued at MM, when the rank goes on computing; the
    second waits for the first on the GPU's one communication stream: [MM, MM + AR2], then
    [MM + AR2, MM + 2 AR2]. The next product runs beside both (2 AR2 < MM of it), slowing by SLOW x 2 AR2."""
    trace = parasim.run(_two_buckets, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"), ("grad-reduce",))
    first, second = the(trace, "all_reduce", 0), the(trace, "all_reduce", 1)
    assert tl.events[first.seq] == pytest.approx((MM, MM + AR2), rel=1e-9)
    assert tl.events[second.seq] == pytest.approx((MM + AR2, MM + 2 * AR2), rel=1e-9)
    assert tl.comm == pytest.approx([2 * AR2] * 2, rel=1e-9)
    assert tl.step == pytest.approx(2 * MM + SLOW * 2 * AR2, rel=1e-9)


# -- timeline: a phase's end is its last span's end -----------------------------------------------------------
def _bucket_beside_small(ctx: Context) -> None:
    """A product, a 128 MiB gradient bucket all-reduced over "dp", and a small product after it."""
    xp = ctx.xp
    dp = ctx.new_group([0, 1], "dp")
    x = ctx.rng.normal((BIG, BIG))
    xp.matmul(x, x)
    ctx.comm.all_reduce(ctx.rng.normal((BIG, BIG)), group=dp)
    a = ctx.rng.normal((SMALL, SMALL))
    xp.matmul(a, a)


def test_a_phase_ends_with_its_latest_span_not_its_last_started() -> None:
    """Catches `by_phase` taking a phase's end from the span that started last rather than the one that ended
    last (clock/timeline.py). With grad-reduce the bucket's all-reduce [MM, MM + AR2] runs beside the small
    product that starts with it at MM and ends first (mm (1 + SLOW) < AR2): the phase ends with the
    all-reduce, at the step's end MM + AR2; the rank computed MM + mm (1 + SLOW) and communicated AR2."""
    trace = parasim.run(_bucket_beside_small, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"), ("grad-reduce",))
    assert tl.step == pytest.approx(MM + AR2, rel=1e-9)
    (row,) = by_phase(trace, tl, 1).values()
    assert row["start"] == 0.0
    assert row["end"] == pytest.approx(MM + AR2, rel=1e-9)
    assert row["compute"] == pytest.approx(MM + mm * (1 + SLOW), rel=1e-9)
    assert row["comm"] == pytest.approx(AR2, rel=1e-9)


# -- timeline: the critical path follows the member that was last ------------------------------------------
def _rank1_later(ctx: Context) -> None:
    """Rank 0 computes one product, rank 1 two; then both all-reduce a 128 MiB bucket."""
    xp = ctx.xp
    x = ctx.rng.normal((BIG, BIG))
    for _ in range(1 + ctx.rank):
        xp.matmul(x, x)
    ctx.comm.all_reduce(ctx.rng.normal((BIG, BIG)))


def test_the_critical_path_goes_back_through_the_member_that_issued_last() -> None:
    """Catches a collective remembering the first member's compute as what it waited for, not the member that
    issued it last (clock/timeline.py's `pred`). Rank 1 issues the all-reduce at 2 MM, rank 0 at MM: the
    call starts at 2 MM and waited for rank 1, so the critical path is rank 1's compute (its two products, one
    span before the call), then the call, and adds up to the step, 2 MM + AR2."""
    trace = parasim.run(_rank1_later, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"))
    assert tl.step == pytest.approx(2 * MM + AR2, rel=1e-9)
    assert [(s.kind, s.ranks) for s in tl.critical] == [("compute", (1,)), ("comm", (0, 1))]
    assert tl.critical[0].seconds == pytest.approx(2 * MM, rel=1e-9)
    assert sum(s.seconds for s in tl.critical) == pytest.approx(tl.step, rel=1e-9)
    assert [tl.idle(0), tl.idle(1)] == pytest.approx([MM, 0.0], rel=1e-9, abs=1e-12)


# -- plan: the pipeline's shape ---------------------------------------------------------------------------
SEQ = 4096
SMALL_MODEL = ModelSpec(layers=4, hidden=1024, heads=8, vocab=1000)  # a small dense model, heads of 128
ADAM_POST = 4 + 2 + 2 * 4 + 4 + 2 * 4 + 2  # the post's precision: FP32 master, BF16 grads, FP32 m and v, BF16 copy


def test_an_interleaved_pipeline_of_tp_sp_stages_on_two_nodes_by_hand() -> None:
    """Catches the bubble not shrinking with model chunks ((m + p - 1) for (m + (p-1)/v)), the bubble reported
    without the sends, one send per micro-batch for all its chunks (2 for 2v), the send not divided by TP under
    SP, and the optimizer's pass over every layer's parameters rather than this stage's (clock/plan.py
    `step_time`). SMALL_MODEL on TP 2 + SP, PP 2 with 2 chunks a GPU, 4 micro-batches, on nodes of 2 GPUs: the
    pipeline's pairs (0-2, 1-3) cross nodes. Each chunk sends one TP rank's share of the activations, 4,096 x
    1,024 / 2 BF16 values (4 MiB), forward and its gradient back: 2 x 2 sends a micro-batch, each the network's
    latency and its bytes at the two-member rate measured across. The step is (4 + (2-1)/2) micro-batch
    times of the slowest stage (its per-micro-batch time, read from the plan, plus its sends), then the
    optimizer's pass (no DP: nothing to reduce): a quarter of the parameters (TP 2 x PP 2) at 28 bytes each over
    the HBM's datasheet rate."""
    plan = Plan(tp=2, sp=True, pp=2, chunks=2, microbatches=4, gpus_per_node=2).check(SMALL_MODEL, SEQ)
    t = plan_time(SMALL_MODEL, plan, SEQ, "h200")
    sent = SEQ * 1024 / 2 * BF16
    assert sent == 4 * 2 ** 20
    p2p = 2 * 2 * (ACROSS + sent / busbw("all_gather", 2 * sent, "across", 2))
    assert t["p2p_s"] == pytest.approx(p2p, rel=1e-12)
    assert t["exposed_p2p_s"] == pytest.approx(p2p, rel=1e-12)
    per_mb = t["per_microbatch_s"]
    assert t["bubble_s"] == pytest.approx((2 - 1) / 2 * (per_mb + p2p), rel=1e-12)
    optimizer = SMALL_MODEL.total_params() / (2 * 2) * ADAM_POST / GPUS["h200"].hbm.value
    assert t["optimizer_s"] == pytest.approx(optimizer, rel=1e-12)
    assert t["dp_grads_s"] == 0.0 and t["dp_params_s"] == 0.0
    assert t["step_s"] == pytest.approx((4 + (2 - 1) / 2) * (per_mb + p2p) + optimizer, rel=1e-12)


# -- plan: TP, CP and EP collectives of a micro-batch -----------------------------------------------------
TINY_MOE = ModelSpec(name="tiny-moe", layers=2, hidden=1024, heads=8, vocab=1000, experts=8, top_k=2,
                     expert_ffn=512, bias=False)  # two MoE layers, 8 experts of width 512, top 2
ACT = SEQ * 1024 * BF16  # one micro-batch's activations, whole: 4,096 tokens x 1,024 BF16 values (8 MiB)


def ring2(op: str, buffer: float) -> float:
    """A ring collective over the 2 GPUs of a node on a `buffer`-byte whole buffer: each member moves its bus factor
    of it, 2(t-1)/t for an all-reduce and (t-1)/t for a gather or a reduce-scatter, at the busbw measured."""
    moved = buffer * (2 * (2 - 1) / 2 if op == "all_reduce" else (2 - 1) / 2)
    return moved / busbw(op, buffer, "inside", 2)


def parts(model: ModelSpec, plan: Plan) -> dict[str, float]:
    return plan_time(model, plan, SEQ, "h200")["parts_per_microbatch_s"]


def test_tp_under_sp_gathers_four_times_and_reduce_scatters_three_a_block_with_full_recompute() -> None:
    """Catches the all-gathers and reduce-scatters of SP counted the other way round, and TP's all-reduces not
    repeated by a recomputed forward (clock/plan.py `stage_parts`). Per block (attention, the MLP) a forward
    all-gathers its input and reduce-scatters its output, a backward all-gathers twice (the input again, for
    the weight's gradient, and the output's gradient) and reduce-scatters once; full recomputation runs the
    forward again: 1 + 2 + 1 = 4 all-gathers, 1 + 1 + 1 = 3 reduce-scatters, each on the whole activations.
    Without SP, an all-reduce per forward and one per backward: 1 + 1 + 1 = 3. 4 layers of 2 blocks."""
    sp = parts(SMALL_MODEL, Plan(tp=2, sp=True, recompute="full").check(SMALL_MODEL, SEQ))["tp"]
    assert sp == pytest.approx(4 * 2 * (4 * ring2("all_gather", ACT) + 3 * ring2("reduce_scatter", ACT)), rel=1e-12)
    ar = parts(SMALL_MODEL, Plan(tp=2, recompute="full").check(SMALL_MODEL, SEQ))["tp"]
    assert ar == pytest.approx(4 * 2 * 3 * ring2("all_reduce", ACT), rel=1e-12)


def test_an_moe_layers_tp_collectives_are_its_attentions_only() -> None:
    """Catches an MoE layer's TP collectives counted for two blocks (clock/plan.py: `blocks = 2` for every
    layer): its experts are whole on each GPU (ETP 1), so only attention gathers and reduce-scatters over TP:
    per layer 3 all-gathers and 2 reduce-scatters without recomputation, TINY_MOE's 2 layers."""
    got = parts(TINY_MOE, Plan(tp=2, sp=True).check(TINY_MOE, SEQ))["tp"]
    assert got == pytest.approx(2 * (3 * ring2("all_gather", ACT) + 2 * ring2("reduce_scatter", ACT)), rel=1e-12)


def test_cps_kv_ring_carries_one_tp_ranks_heads_forward_and_twice_backward() -> None:
    """Catches CP's K and V not divided by TP, and the ring counted once backward instead of twice (K and V
    again, and their gradients back) (clock/plan.py `stage_parts`). SMALL_MODEL on TP 2 and CP 2: each CP rank
    holds 2,048 tokens, whose K and V on one TP rank are 2,048 x 2 x 8 heads x 128 / 2 BF16 values (4 MiB);
    the ring passes every other rank's block: an all-gather of the 2 blocks, once forward and twice backward,
    in each of the 4 layers."""
    kv = SEQ / 2 * 2 * 8 * 128 / 2 * BF16
    assert kv == 4 * 2 ** 20
    got = parts(SMALL_MODEL, Plan(tp=2, cp=2).check(SMALL_MODEL, SEQ))["cp"]
    assert got == pytest.approx(4 * 3 * ring2("all_gather", 2 * kv), rel=1e-12)


def test_a_recomputed_forward_dispatches_and_combines_again() -> None:
    """Catches EP's all-to-alls left out of a recomputed forward (clock/plan.py: `(2 + recompute)` passes taken
    as 2). TINY_MOE on EP 2 (and DP 2) in a node, full recomputation: each GPU routes 4,096 tokens to their top 2 experts,
    half of them on the other GPU, 4,096 x 2 x 1,024 / 2 BF16 values sent in the dispatch and again in the
    combine, each all-to-all NCCL's call latency plus its bytes at the all-to-all rate measured for 2 GPUs on
    the whole buffer (twice a member's sent bytes); forward, recomputed forward and backward, 2 layers."""
    sent = SEQ * 2 * 1024 / 2 * BF16
    one = CALL + sent / busbw("all_to_all", sent * 2, "inside", 2)
    got = parts(TINY_MOE, Plan(ep=2, dp=2, recompute="full").check(TINY_MOE, SEQ))["ep"]
    assert got == pytest.approx(2 * 3 * (one + one), rel=1e-12)


# -- plan: recomputation ------------------------------------------------------------------------------------
def test_recomputation_runs_again_the_forwards_it_drops() -> None:
    """Catches the recomputed forward's products never counted, selective recomputation not running
    attention's forward again, and the elementwise passes not recomputed under full recomputation
    (clock/plan.py `stage_parts`). SMALL_MODEL, one H200, 4,096 tokens, FlashAttention: full recomputation adds
    each of the 4 layers' forward once more (its products: QKV 4,096 x 1,024 @ 1,024 x 3,072, the output's and
    the MLP's at their shapes; its causal attention, 4 s^2 h / 2 FLOPs at FlashAttention's forward share; its
    elementwise passes, Megatron's fused table with dropout: 4 + 7 + 4 + 7 bytes an activation value, 4 an MLP
    value, at the measured streaming rate); selective recomputation adds attention's forward only."""
    def got(recompute: str) -> dict[str, float]:
        return parts(SMALL_MODEL, Plan(recompute=recompute))
    none, sel, full = got("none"), got("selective"), got("full")
    products = (product(SEQ, 3072, 1024) + product(SEQ, 1024, 1024) + product(SEQ, 4096, 1024)
                + product(SEQ, 1024, 4096))
    attention = 4 * SEQ * SEQ * 1024 / 2 / (GPUS["h200"].peak_flops.value
                                            * attention_efficiency("h200", SEQ, 128, True, False, None).value)
    stream = GPUS["h200"].hbm.value * memory_efficiency("h200", "scale").value
    elementwise = (SEQ * 1024 * (4 + 7 + 4 + 7) + SEQ * 4096 * 4) / stream
    assert full["matmul"] - none["matmul"] == pytest.approx(4 * products, rel=1e-9)
    assert full["attention"] - none["attention"] == pytest.approx(4 * attention, rel=1e-9)
    assert full["elementwise"] - none["elementwise"] == pytest.approx(4 * elementwise, rel=1e-9)
    assert sel["matmul"] == pytest.approx(none["matmul"], rel=1e-12)
    assert sel["attention"] - none["attention"] == pytest.approx(4 * attention, rel=1e-9)
    assert sel["elementwise"] == pytest.approx(none["elementwise"], rel=1e-12)


# -- plan: data parallelism ---------------------------------------------------------------------------------
def test_plain_dp_updates_every_parameter_on_every_gpu() -> None:
    """Catches the optimizer's pass divided over the DP group without a sharded optimizer (clock/plan.py:
    `local / group` whatever the ZeRO stage). Plain DP over 2 GPUs (ZeRO 0): each GPU updates all of
    SMALL_MODEL's parameters, 28 bytes each (the post's precision), at the HBM's datasheet rate; under ZeRO-1
    each updates half of them."""
    hbm = GPUS["h200"].hbm.value
    plain = plan_time(SMALL_MODEL, Plan(dp=2, zero=0), SEQ, "h200")
    assert plain["optimizer_s"] == pytest.approx(SMALL_MODEL.total_params() * ADAM_POST / hbm, rel=1e-12)
    zero1 = plan_time(SMALL_MODEL, Plan(dp=2, zero=1), SEQ, "h200")
    assert zero1["optimizer_s"] == pytest.approx(SMALL_MODEL.total_params() / 2 * ADAM_POST / hbm, rel=1e-12)


def test_gradients_longer_than_the_backward_stay_exposed_past_it() -> None:
    """Catches the overlap's slowdown applied with the wrong sign, and the gradients hidden behind a third of a
    micro-batch instead of its backward, two thirds (clock/plan.py `step_time`). SMALL_MODEL on 512 tokens,
    plain DP over 2 GPUs on nodes of 1: the gradients' all-reduce, 52,387,840 BF16 values, crosses nodes and
    pays NCCL's call latency and 2 step latencies on top of its bytes (2 x 1/2 of the buffer each) at the
    network's measured busbw. It is longer than the backward, so with grad-reduce the backward (2/3 of the
    micro-batch, read from the plan) hides that much of it, at the cost of the slowdown on that part."""
    assert SMALL_MODEL.total_params() == 52_387_840
    model_bytes = SMALL_MODEL.total_params() * BF16
    plan = Plan(dp=2, zero=0, gpus_per_node=1)
    grads = CALL + 2 * ACROSS + model_bytes / busbw("all_reduce", model_bytes, "across", 2)
    off = plan_time(SMALL_MODEL, plan, 512, "h200")
    on = plan_time(SMALL_MODEL, plan, 512, "h200", ("grad-reduce",))
    assert off["dp_grads_s"] == pytest.approx(grads, rel=1e-12)
    backward = on["per_microbatch_s"] * 2 / 3
    assert backward < grads
    assert on["exposed_grads_s"] == pytest.approx(grads - backward * (1 - SLOW), rel=1e-12)
    assert on["step_s"] == pytest.approx(off["step_s"] - backward * (1 - SLOW), rel=1e-12)


def test_zero3_pays_each_layers_collective_its_own_latency() -> None:
    """Catches ZeRO-3's layer-by-layer gathers timed as a share of one whole-model gather (its latency divided
    among the layers; clock/plan.py `step_time`): ZeRO-3 over 2 GPUs on nodes of 1, no overlap, SMALL_MODEL's 4
    layers (the stage's parameters spread evenly over them), one micro-batch: each layer's all-gather of a 4th of
    the BF16 weights crosses the network, paying NCCL's call and step latency of its own, twice (forward and
    backward)."""
    layer = SMALL_MODEL.total_params() * BF16 / 4
    gather = CALL + ACROSS + layer / 2 / busbw("all_gather", layer, "across", 2)
    off = plan_time(SMALL_MODEL, Plan(dp=2, zero=3, gpus_per_node=1), 512, "h200")
    assert off["dp_params_s"] == pytest.approx(2 * 4 * gather, rel=1e-12)
    assert off["exposed_params_s"] == pytest.approx(2 * 4 * gather, rel=1e-12)


def test_weights_gathered_longer_than_the_first_forward_stay_exposed_past_it() -> None:
    """The same for the distributed optimizer's weight all-gather under prefetch: ZeRO-1 over 2 GPUs on nodes of
    1, the BF16 weights all-gathered (each member moving 1/2 of them) across, longer than the first forward (a
    third of a micro-batch), which hides that much of it and slows by SLOW of it."""
    model_bytes = SMALL_MODEL.total_params() * BF16
    plan = Plan(dp=2, zero=1, gpus_per_node=1)
    params = CALL + ACROSS + model_bytes / 2 / busbw("all_gather", model_bytes, "across", 2)
    on = plan_time(SMALL_MODEL, plan, 512, "h200", ("prefetch",))
    assert on["dp_params_s"] == pytest.approx(params, rel=1e-12)
    forward = on["per_microbatch_s"] / 3
    assert forward < params
    assert on["exposed_params_s"] == pytest.approx(params - forward * (1 - SLOW), rel=1e-12)


# -- plan: what the TP and CP switches hide -------------------------------------------------------------------
# what a switch hides of the compute's length: TP, TransformerEngine's measured net share (the Flux paper's 20% on
# an H800, read by Hopper), the slowdown inside it; CP, all of it less the slowdown it causes
@pytest.mark.parametrize("switch, plan, comm, behind, hides", [
    ("tp", Plan(tp=2, gpus_per_node=1), "tp", "matmul", 0.20),  # TP over the network: longer than the products
    ("cp", Plan(cp=2, gpus_per_node=1), "cp", "attention", 1 - SLOW),  # CP's ring across: longer than attention
])
def test_an_overlapped_collective_hides_no_more_than_the_compute_beside_it(switch: str, plan: Plan, comm: str,
                                                                          behind: str, hides: float) -> None:
    """Catches a switch hiding the whole collective however short the compute beside it, CP's ring hidden
    behind every product rather than the attention it feeds, and the overlap's slowdown added to what is
    hidden rather than taken from it (clock/plan.py `_exposed`). With each group across nodes of 1 GPU, the
    collectives (parts[comm], read from the plan without the switch) outlast the compute they run beside
    (parts[behind]): the switch hides its share of that compute's length."""
    off = plan_time(SMALL_MODEL, plan.check(SMALL_MODEL, SEQ), SEQ, "h200")
    on = plan_time(SMALL_MODEL, plan.check(SMALL_MODEL, SEQ), SEQ, "h200", (switch,))
    p = off["parts_per_microbatch_s"]
    assert p[comm] > p[behind] > 0
    assert on["per_microbatch_s"] == pytest.approx(off["per_microbatch_s"] - p[behind] * hides, rel=1e-12)


# -- plan: an MoE layer's products ------------------------------------------------------------------------------
def linear(rows: int, k_in: int, n_out: int, count: int = 1) -> float:
    """Forward and backward seconds of `count` alike linear layers: rows x k_in @ k_in x n_out forward, then the
    input's gradient (rows x n_out @ n_out x k_in) and the weight's (k_in x rows @ rows x n_out), each product at
    the share its own shape measures."""
    return count * (product(rows, n_out, k_in) + product(rows, k_in, n_out) + product(k_in, n_out, rows))


def test_an_moe_layers_products_at_their_shapes() -> None:
    """Catches an expert's rows not multiplied by EP, every expert of the model counted on one GPU, a linear
    layer's backward taken as twice its forward, and the backward of a GPU's experts counted for one of them
    (clock/plan.py `layer_linears`, clock/kernels_time.py `linear_seconds`). TINY_MOE on TP 2 + SP and EP 2,
    4,096 tokens: attention's QKV (1,024 -> 3,072 / 2) and output (512 -> 1,024) over every token; each TP rank
    routes its own 2,048 (the router, 1,024 -> 8); each of the GPU's 8 / 2 = 4 experts takes 2,048 x top 2 x
    EP 2 / 8 experts = 1,024 rows through its up (1,024 -> 512) and down (512 -> 1,024) products. 2 layers."""
    got = parts(TINY_MOE, Plan(tp=2, sp=True, ep=2).check(TINY_MOE, SEQ))["matmul"]
    layer = (linear(SEQ, 1024, 1536) + linear(SEQ, 512, 1024) + linear(2048, 1024, 8)
             + linear(1024, 1024, 512, count=4) + linear(1024, 512, 1024, count=4))
    assert got == pytest.approx(2 * layer, rel=1e-12)


# -- timeline: what the exports and the summary say ---------------------------------------------------------
def test_the_exported_times_and_the_summary_are_the_timelines_in_microseconds() -> None:
    """Catches a unit slip in the compute times an event carries (microseconds for its start, milliseconds for
    its end) and the critical path's communication reported as its compute (clock/timeline.py `event_time`,
    `summary`). In `_rank1_later` the all-reduce runs [2 MM, 2 MM + AR2]; before it rank 0 computed [0, MM] and
    rank 1 [0, 2 MM]; the critical path is rank 1's 2 MM of compute, then AR2 of communication."""
    trace = parasim.run(_rank1_later, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"))
    e = the(trace, "all_reduce")
    t = event_time(tl, e)
    assert (t["start_us"], t["end_us"]) == pytest.approx((2 * MM * 1e6, (2 * MM + AR2) * 1e6), rel=1e-9)
    assert t["before"] == [[0, 0.0, pytest.approx(MM * 1e6, rel=1e-9)], [1, 0.0, pytest.approx(2 * MM * 1e6, rel=1e-9)]]
    s = summary(tl, trace)
    assert s["step_us"] == pytest.approx((2 * MM + AR2) * 1e6, rel=1e-9)
    assert s["critical_compute_us"] == pytest.approx(2 * MM * 1e6, rel=1e-9)
    assert s["critical_comm_us"] == pytest.approx(AR2 * 1e6, rel=1e-9)


def _exact_bucket(ctx: Context) -> None:
    """An exact run: a 64 x 64 product, 1,024 float64 values all-reduced over "dp" (timed at BF16's 2 bytes a
    value: 2,048 bytes), and another product."""
    xp = ctx.xp
    dp = ctx.new_group([0, 1], "dp")
    x = xp.ones((64, 64), dtype=xp.float64)
    xp.matmul(x, x)
    ctx.comm.all_reduce(xp.ones((1024,), dtype=xp.float64), group=dp)
    xp.matmul(x, x)


def test_the_report_of_a_switch_that_is_on_compares_with_the_step_without_it() -> None:
    """Catches the report timing "without the switch" with the switch still on (clock/report.py
    `clock_report`: the chosen switches kept as they are for the step without it), which says the switch
    saves nothing. Without grad-reduce the rank waits for the all-reduce (ar, longer than a product p): the
    step is p + ar + p; with it the second product runs beside the all-reduce and the step ends with the
    all-reduce, p + ar: the switch saves p."""
    trace = parasim.run(_exact_bucket, 2).trace
    p = product(64, 64, 64)
    ar = 2048 * 2 * (2 - 1) / 2 / busbw("all_reduce", 2048, "inside", 2)
    assert p * (1 + SLOW) < ar
    out = clock_report(trace, ClockChoice(overlap=("grad-reduce",)))
    row = out["switches"]["grad-reduce"]
    assert row["on"] is True and out["exact"] is True
    assert row["step_on_us"] == pytest.approx((p + ar) * 1e6, rel=1e-9)
    assert row["step_off_us"] == pytest.approx((2 * p + ar) * 1e6, rel=1e-9)
    assert row["saves_us"] == pytest.approx(p * 1e6, rel=1e-6)


def _rank1_tail(ctx: Context) -> None:
    """Both ranks all-reduce a 128 MiB bucket; then rank 1 alone computes a product."""
    x = ctx.rng.normal((BIG, BIG))
    ctx.comm.all_reduce(ctx.rng.normal((BIG, BIG)))
    if ctx.rank == 1:
        ctx.xp.matmul(x, x)


def test_the_critical_path_ends_on_the_rank_that_finishes_last() -> None:
    """Catches the critical path read back from rank 0 whichever rank ends the step (clock/timeline.py). Rank
    1's product after the all-reduce ends the step at AR2 + MM: the path is the all-reduce, then that product."""
    trace = parasim.run(_rank1_tail, 2, "symbolic").trace
    tl = simulate(trace, machine("h200"))
    assert tl.step == pytest.approx(AR2 + MM, rel=1e-9)
    assert [(s.kind, s.ranks) for s in tl.critical] == [("comm", (0, 1)), ("compute", (1,))]
    assert sum(s.seconds for s in tl.critical) == pytest.approx(tl.step, rel=1e-9)

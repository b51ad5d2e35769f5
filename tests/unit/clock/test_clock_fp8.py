"""FP8 training on the clock, and FSDP under a pipeline: each expected value is worked out here from the
measured tables and the recipes' sources, never by calling the function under test.

1. A run its source says trained in FP8 is timed with FP8 products (before, the label was never read).
2. FP8 products cost their casts: each forward casts its input and weight, each backward its output's gradient;
   a cast reads the 16-bit tensor once (delayed scaling) or twice (current scaling: once for the amax) and
   writes it and its transpose in FP8 (TransformerEngine's docs: Hopper's FP8 products take the TN layout).
3. FSDP2 under torch.distributed.pipelining gathers a stage's weights once a step and reduce-scatters its
   gradients once, after the last backward (torch/distributed/pipelining/stage.py).
"""
from __future__ import annotations

import pytest

from parasim.clock.plan import plan_time
from parasim.clock.runs import RUNS, PublishedRun, training_plan
from parasim.estimate.memory import Plan
from parasim.errors import UsageError
from parasim.layout import ModelSpec
from parasim.layout.precision import Precision, precision

SEQ = 4096
MODEL = ModelSpec(layers=2, hidden=1024, heads=8, vocab=1000)  # MHA, a plain MLP of 4h
# the streaming rate an elementwise pass gets on an H100: FlashMLA's 3,000 GB/s (estimate/kernels.py MEMORY)
H100_STREAM = 3000e9


def test_fp8_casts_are_the_inputs_weights_and_gradients_bytes_at_the_measured_stream_rate():
    """One H100, 4,096 tokens, no recomputation. Per layer, the four products (tokens x k) @ (k x n): QKV
    1024 -> 3072, out 1024 -> 1024, up 1024 -> 4096, down 4096 -> 1024. Forward casts (tokens + n) x k values
    each: 7,340,032 + 5,242,880 + 8,388,608 + 20,971,520 = 41,943,040; backward casts tokens x n:
    4096 x 9216 = 37,748,736. Current scaling moves 2 x 2 + 2 bytes a value, delayed 2 + 2."""
    values = 2 * (41_943_040 + 37_748_736)
    bf16 = plan_time(MODEL, Plan(precision="megatron-bf16", recompute="none"), SEQ, "h100")
    for name, per_value in (("megatron-bf16-fp8-tensorwise", 6), ("megatron-bf16-fp8-delayed", 4)):
        fp8 = plan_time(MODEL, Plan(precision=name, recompute="none"), SEQ, "h100")
        extra = fp8["parts_per_microbatch_s"]["elementwise"] - bf16["parts_per_microbatch_s"]["elementwise"]
        assert extra == pytest.approx(values * per_value / H100_STREAM, rel=1e-9), name
        assert fp8["parts_per_microbatch_s"]["matmul"] < 0.6 * bf16["parts_per_microbatch_s"]["matmul"]


def test_a_recomputed_forward_casts_its_inputs_and_weights_again():
    """Full recomputation runs each forward twice: the forward casts (41,943,040 values a layer) twice, the
    backward's (37,748,736) once; current scaling, 6 bytes a value."""
    values = 2 * (2 * 41_943_040 + 37_748_736)
    name = "megatron-bf16-fp8-tensorwise"
    bf16 = plan_time(MODEL, Plan(precision="megatron-bf16", recompute="full"), SEQ, "h100")
    fp8 = plan_time(MODEL, Plan(precision=name, recompute="full"), SEQ, "h100")
    extra = fp8["parts_per_microbatch_s"]["elementwise"] - bf16["parts_per_microbatch_s"]["elementwise"]
    assert extra == pytest.approx(values * 6 / H100_STREAM, rel=1e-9)


def test_fp8_products_need_a_scaling_and_only_they_take_one():
    base = precision("megatron-bf16")
    fields = {k: getattr(base, k) for k in base.__dataclass_fields__}
    with pytest.raises(UsageError, match="FP8 products need one of the FP8 scalings"):
        Precision(**{**fields, "products": "float8_e4m3fn"})
    with pytest.raises(UsageError, match="FP8 products need one of the FP8 scalings"):
        Precision(**{**fields, "fp8_scaling": "delayed"})
    assert precision("fsdp2-fp8-gather").compute == "float8_e4m3fn"
    assert precision("fsdp2-fp8").compute == "bfloat16"


def test_every_run_said_to_train_in_fp8_is_timed_in_fp8_and_no_other():
    said = {r.key for r in RUNS if r.precision == "fp8"}
    timed = {r.key for r in RUNS if precision(r.plan.precision).fp8}
    assert said == timed and len(said) >= 12
    with pytest.raises(AssertionError):
        PublishedRun("x", RUNS[0].source, "x", "h100", 8, MODEL, training_plan(8, dp=8), SEQ, 1.0,
                     "tokens/s per GPU", precision="fp8")


def test_fsdp_under_a_pipeline_gathers_and_reduces_once_a_step():
    """ZeRO-3 over DP 2 with PP 2: the weights' all-gather and the gradients' reduce-scatter are each one
    collective a step, however many micro-batches, and the reduce-scatter waits after the last backward
    (exposed whole, even with --overlap grad-reduce). Without a pipeline, FSDP gathers twice and reduces once a
    micro-batch."""
    model = ModelSpec(layers=4, hidden=1024, heads=8, vocab=1000)
    overlap = ("grad-reduce", "prefetch")

    def at(pp: int, m: int) -> dict:
        plan = Plan(pp=pp, dp=2, zero=3, micro_batch=1, microbatches=m, recompute="none", precision="fsdp2")
        return plan_time(model, plan, SEQ, "h100", overlap)
    one, four = at(2, 1), at(2, 4)
    assert four["dp_params_s"] == pytest.approx(one["dp_params_s"], rel=1e-12)
    assert four["exposed_params_s"] == pytest.approx(one["exposed_params_s"], rel=1e-12)
    assert four["dp_grads_s"] == pytest.approx(one["dp_grads_s"], rel=1e-12)
    assert four["exposed_grads_s"] == pytest.approx(four["dp_grads_s"], rel=1e-12)
    flat_one, flat_four = at(1, 1), at(1, 4)
    assert flat_four["dp_params_s"] == pytest.approx(4 * flat_one["dp_params_s"], rel=1e-12)
    assert flat_four["dp_grads_s"] == pytest.approx(4 * flat_one["dp_grads_s"], rel=1e-12)
    assert flat_four["exposed_params_s"] > 2 * flat_one["exposed_params_s"]


def test_fp8_parameter_gathers_send_one_byte_a_weight():
    """Megatron's --fp8-param-gather (the precision's -gather form): the distributed optimizer's all-gather of a
    27B model's weights over 4 replicas (TP 8 a node, so the group crosses nodes) moves one byte a weight where
    the BF16 gather moves two, each at the measured across-node rate; the weights kept are one byte too."""
    from dataclasses import replace as swap
    from parasim.clock.costs import collective_seconds, machine as machine_of
    from parasim.clock.plan import step_time
    from parasim.estimate import get_model
    from parasim.estimate.kernels import ACROSS
    from parasim.layout.precision import precision
    model = get_model("27b")
    plan = Plan(tp=8, dp=4, zero=1, microbatches=4, precision="megatron-bf16-fp8-delayed-gather")
    m = machine_of("h100", 8)
    local = model.total_params() / 8  # a dense model: each GPU's TP share of every weight
    gathered = step_time(model, plan, 4096, m)["dp_params_s"]
    assert gathered == pytest.approx(collective_seconds(m, "all_gather", 4, local * 1, ACROSS), rel=1e-12)
    bf16 = step_time(model, swap(plan, precision="megatron-bf16-fp8-delayed"), 4096, m)["dp_params_s"]
    assert bf16 == pytest.approx(collective_seconds(m, "all_gather", 4, local * 2, ACROSS), rel=1e-12)
    assert precision(plan.precision).weight_bytes == 1 and precision("megatron-bf16-fp8-delayed").weight_bytes == 2

"""What a mutation audit of the training precision (layout/precision.py and everything that reads it) found
unguarded: each test here fails for one wrong line the rest of the suite let pass. Expected values are worked
out by hand in the test, never from the function tested: the bytes of each dtype, and what costs.py's docstring
says a transfer costs, read point by point from the measured tables (estimate/kernels.py): a collective inside a
node moves its bus factor times its whole buffer at the bus bandwidth measured for that buffer's size, an
all-to-all's call adds NCCL's call latency, an elementwise pass streams at the measured share of HBM, a product
runs at the share of peak measured for its shape. Since the measured bandwidth changes with the size, a precision's
seconds are worked out whole at its own bytes, not as a difference from another's."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import parasim
from parasim.clock import machine
from parasim.clock.costs import value_bytes, wire_scale
from parasim.clock.plan import adam_bytes, plan_time, step_time
from parasim.clock.runs import training_plan
from parasim.clock.timeline import simulate
from parasim.comm.interface import dtype_name
from parasim.estimate import get_model
from parasim.estimate.hardware import GPUS, LATENCY
from parasim.estimate.kernels import collective_bandwidth, gemm_efficiency, memory_efficiency
from parasim.estimate.memory import Plan, breakdown
from parasim.estimate.traffic import dp_traffic, ep_expected_bytes, ep_expected_rows, step_traffic
from parasim.layout.precision import precision

H200 = GPUS["h200"]
CALL = LATENCY["call"].value
HBM = H200.hbm.value


def busbw(op: str, buffer: float, t: int) -> float:
    """The bus bandwidth measured on an H200 node for `op` over t GPUs on a whole buffer of `buffer` bytes."""
    return collective_bandwidth("h200", op, int(buffer), "inside", t).value


def product(m: int, n: int, k: int) -> float:
    """Seconds of one (m x k) @ (k x n) product on an H200 at the share of peak measured for its shape."""
    return 2 * m * n * k / (H200.peak_flops.value * gemm_efficiency("h200", m, n, k).value)


# -- the estimator's traffic ----------------------------------------------------------------------------
def test_plain_data_parallel_all_reduces_the_gradients_in_their_reduce_dtype():
    """Without ZeRO the one collective is the gradients' all-reduce: 2 (t-1)/t of them at 4 bytes a value
    (Megatron's FP32), whatever the weights are gathered in, since nothing is gathered."""
    assert dp_traffic(1000, 4, 0, itemsize=4, param_itemsize=2) == {("dp", "all_reduce"): 2 * 3 / 4 * 1000 * 4}
    model = get_model("27b")
    t = step_traffic(model, Plan(dp=8, zero=0, precision="megatron-bf16"), 4096)
    assert t[("dp", "all_reduce")] == pytest.approx(2 * 7 / 8 * 27e9 * 4)


def test_pipeline_sends_move_activations_not_gradients_dtype():
    """Megatron's BF16 job on PP 4 (m = 4 micro-batches): each micro-batch's activation [4096, h] goes on in
    BF16 and its gradient comes back in BF16, though its data-parallel gradients are FP32."""
    model = get_model("27b")
    t = step_traffic(model, Plan(pp=4, precision="megatron-bf16"), 4096)
    assert t[("pp", "p2p")] == 4096 * 6144 * 2 * 4 * 2


def test_expert_data_parallel_reduces_fp32_gradients_and_gathers_bf16_weights():
    """DeepSeek-V3 at EP 8 over 16 GPUs under Megatron's BF16: the experts' data-parallel group is 2 GPUs;
    each reduce-scatters its experts' FP32 gradients (4 bytes) and all-gathers their BF16 weights (2)."""
    model = get_model("deepseek-v3")
    t = step_traffic(model, Plan(ep=8, dp=16, zero=1, precision="megatron-bf16"), 4096)
    local = model.expert_params() / 8  # one GPU's experts: an eighth of them (ETP 1, PP 1)
    assert t[("edp", "reduce_scatter")] == pytest.approx(local * 4 / 2)
    assert t[("edp", "all_gather")] == pytest.approx(local * 2 / 2)


def test_an_all_to_all_with_one_dtype_sends_every_direction_in_it():
    """Without a dtype for the way home, both ways go at the dispatch's bytes (1 here: FP8 every way)."""
    rows = ep_expected_rows(64, 2, 8, 4)
    got = ep_expected_bytes(64, 2, 8, 4, 16, 1)
    assert got == pytest.approx({"dispatch": rows * 18, "combine": rows * 16, "combine backward": rows * 16,
                                 "dispatch backward": rows * 18})


# -- the estimator's memory -----------------------------------------------------------------------------
def test_memory_json_names_every_dtype_of_its_precision():
    """`memory --json`'s "precision": Megatron-LM's --bf16 job, field by field (FP32 gradients, no second FP32
    copy of them, FP32 master weights and Adam) with its bytes per parameter, 2 + 4 + 12."""
    out = breakdown(get_model("27b"), Plan(precision="megatron-bf16"), 1024).to_dict()["precision"]
    assert isinstance(out.pop("title"), str) and isinstance(out.pop("source"), str)
    assert out == {"name": "megatron-bf16", "params": "bfloat16", "compute": "bfloat16", "grads": "float32",
                   "grad_reduce": "float32", "master": "float32", "main_grads": None, "adam": "float32",
                   "activations": "bfloat16", "dispatch": "bfloat16", "combine": "bfloat16", "logits": "float32",
                   "products": "bfloat16", "fp8_scaling": None, "bytes_per_param": {"weights": 2, "gradients": 4, "optimizer": 12}}


# -- the clock's plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, moved", [
    ("fp64", 8 + 8 + 16 + 8 + 16),  # no master copy: the FP64 weight read and written, FP64 gradient, m and v
    ("fsdp2", 4 + 4 + 8 + 4 + 8),  # FP32 sharded parameters are the master: nothing else to write
])
def test_the_optimizers_pass_without_a_master_copy_reads_and_writes_the_weights(name, moved):
    assert adam_bytes(precision(name)) == moved


def _step(model, name: str, seq: int = 2048, global_batch: int = 1, sharding: str = "none", **kw):
    """The clock's step of `model` at precision `name`: the layout `kw` with its `sharding` (clock/runs.SHARDING's
    name), no dropout, `global_batch` sequences of `seq` tokens."""
    plan = training_plan(global_batch, sharding, precision=name, **kw)
    return step_time(model, plan, seq, machine("h200"))


def _parts(name: str, **kw):
    return _step(get_model("27b"), name, **kw)


def test_the_clock_moves_activations_at_their_precisions_size():
    """27B on TP 2 x CP 2 x PP 2 (one node), the last stage's 30 layers and 2,048 tokens a GPU, each transfer at
    the activations' bytes of its precision (the post's BF16, 2; FP32, 4; FP64, 8): TP's all-reduces of
    [2048, h] (2 per layer, forward and backward: each member moves 2(t-1)/t = 1 of the buffer), CP's K/V ring
    (an all-gather over 2 of both ranks' K and V, 48 heads x 128 over TP: each moves its half; once forward and
    twice backward) and the pipeline's sends of [2048, h] (forward and back; a send at a two-member all-gather
    of twice its bytes). The logits are FP32 in the post and in FP32 alike (4 bytes), FP64 in FP64 (8): their
    product over the vocabulary's TP half, forward and backward, and their three passes (written, read by the
    loss, gradient written) at the measured streaming rate."""
    run = dict(tp=2, cp=2, pp=2, seq=4096)
    tokens, layers, h, vocab = 4096 // 2, 60 // 2, 6144, 131072 // 2
    stream = HBM * memory_efficiency("h200", "scale").value
    matmul = product(tokens, vocab, h) + product(tokens, h, vocab) + product(h, vocab, tokens)
    for name, size, logits in (("post", 2, 4), ("fp32", 4, 4), ("fp64", 8, 8)):
        got = _parts(name, **run)
        assert got["slowest_stage"] == 2, name
        parts = got["parts_per_microbatch_s"]
        act = tokens * h * size
        assert parts["tp"] == pytest.approx(layers * 4 * act / busbw("all_reduce", act, 2), rel=1e-9), name
        kv = tokens * 2 * 48 * 128 * size / 2  # one rank's K and V
        assert parts["cp"] == pytest.approx(layers * 3 * kv / busbw("all_gather", 2 * kv, 2), rel=1e-9), name
        assert got["p2p_s"] == pytest.approx(2 * act / busbw("all_gather", 2 * act, 2), rel=1e-9), name
        want = matmul + tokens * vocab * logits * 3 / stream
        assert parts["logits"] == pytest.approx(want, rel=1e-9), name


def test_the_clock_sends_each_direction_of_the_all_to_all_in_its_dtype():
    """DeepSeek-V3 at EP 8 in one node, 58 MoE layers: each of a GPU's all-to-alls is a buffer of its 4,096
    tokens' 8 copies of h = 7,168 values, 7/8 of which leave it, at the busbw measured for the buffer's size
    plus the call's latency; once forward and once backward each way. DeepSeek-V3's FP8 dispatch (toward the
    experts, and backward the gradients of their outputs) moves a byte a value, its BF16 combine 2; the post's
    BF16 both ways 2."""
    model = get_model("deepseek-v3")
    kw = dict(ep=8, dp=8, seq=4096, global_batch=8)

    def one(size: int) -> float:
        buffer = 4096 * 8 * 7168 * size
        return CALL + buffer * 7 / 8 / busbw("all_to_all", buffer, 8)
    for name, dispatch, combine in (("post", 2, 2), ("deepseek-v3", 1, 2)):
        got = _step(model, name, **kw)["parts_per_microbatch_s"]["ep"]
        assert got == pytest.approx(58 * 2 * (one(dispatch) + one(combine)), rel=1e-9), name


def _one_phase_ring(buffer: float, t: int = 8, op: str = "all_gather") -> float:
    """A reduce-scatter or all-gather over t GPUs of a node on a whole buffer of `buffer` bytes: each moves
    (t-1)/t of it, at the op's own measured busbw."""
    return buffer * (t - 1) / t / busbw(op, buffer, t)


def test_fsdp2_gathers_bf16_and_reduces_fp32():
    """FSDP2 (FP32 sharded parameters gathered as BF16, gradients reduced in FP32) and the post's BF16 both
    ways, ZeRO-3 over 8 GPUs of a node, one micro-batch: the 27e9 parameters gathered twice (forward and
    backward) at 2 bytes in both; the gradients reduce-scattered once, at 4 bytes under FSDP2, 2 in the post;
    each layer by layer, 60 collectives of a 60th, each at the busbw measured for its size."""
    kw = dict(dp=8, sharding="zero-3", global_batch=8, seq=4096)
    for name, reduced in (("post", 2), ("fsdp2", 4)):
        got = _parts(name, **kw)
        assert got["dp_params_s"] == pytest.approx(2 * 60 * _one_phase_ring(27e9 * 2 / 60), rel=1e-9), name
        assert got["dp_grads_s"] == pytest.approx(60 * _one_phase_ring(27e9 * reduced / 60, op="reduce_scatter"),
                                                  rel=1e-9), name


@pytest.mark.parametrize("name, moved", [("post", 28), ("fp64", 56)])
def test_the_optimizers_seconds_are_its_bytes_over_the_memorys_rate(name, moved):
    """ZeRO-1 over 8: each GPU updates an eighth of the 27e9 parameters, moving `moved` bytes each (the post:
    FP32 master, BF16 gradient, FP32 m and v read; master, m, v and the BF16 copy written)."""
    got = _parts(name, dp=8, sharding="zero-1", global_batch=8)["optimizer_s"]
    assert got == pytest.approx(27e9 / 8 * moved / HBM, rel=1e-12)


def test_plan_time_times_the_plans_precision():
    """`parasim memory`'s time of a plan reads its precision: ZeRO-1 over 8 GPUs of a node reduce-scatters
    Megatron's FP32 gradients (4 bytes a value) but the post's BF16 ones (2), and all-gathers both's BF16
    weights (2)."""
    model = get_model("27b")
    for name, reduced in (("post", 2), ("megatron-bf16", 4)):
        got = plan_time(model, Plan(dp=8, zero=1, precision=name), 4096, "h200")
        assert got["dp_grads_s"] == pytest.approx(_one_phase_ring(27e9 * reduced, op="reduce_scatter"), rel=1e-9), name
        assert got["dp_params_s"] == pytest.approx(_one_phase_ring(27e9 * 2), rel=1e-9), name


# -- the clock's costs of a run -------------------------------------------------------------------------
def _all_reduce(ctx):
    ctx.comm.all_reduce(ctx.xp.ones((1024,), dtype=ctx.xp.float64))


@pytest.mark.parametrize("name, size", [("post", 2), ("megatron-bf16", 2), ("fp32", 4), ("fp64", 8)])
def test_an_exact_runs_values_are_timed_at_its_precisions_activation_size(name, size):
    """An exact run's float64 stands for its precision's activations (Megatron's BF16 job: 2 bytes, though its
    gradients are FP32): a ring all-reduce over 4 GPUs of a node on a buffer of 1,024 values at that size, each
    member moving 2(t-1)/t of it at the busbw measured for the buffer's size."""
    trace = parasim.run(_all_reduce, 4, precision=name).trace
    assert value_bytes(trace) == size
    (e,) = trace.events
    assert wire_scale(e, {"value_bytes": size}) == size / 8
    buffer = 1024 * size
    want = buffer * 2 * 3 / 4 / busbw("all_reduce", buffer, 4)
    assert simulate(trace, machine("h200")).events[e.seq][1] == pytest.approx(want, rel=1e-12)


# -- a run's context: the dtypes it makes and casts to ---------------------------------------------------
def _made(ctx):
    xp = ctx.xp
    x = ctx.rng.normal((4,))
    return {"literal": dtype_name(ctx.asarray([1.0, 2.0]).dtype),
            "literal as told": dtype_name(ctx.asarray([1.0], "float32").dtype),
            "xp literal": dtype_name(xp.asarray([0.5, 1.5]).dtype), "xp ints": dtype_name(xp.asarray([1, 2]).dtype),
            "zeros": dtype_name(xp.zeros((2, 3)).dtype), "full": dtype_name(xp.full((2,), 0.5).dtype),
            "full ints": dtype_name(xp.full((2,), 3).dtype), "draw": dtype_name(x.dtype),
            "master": dtype_name(ctx.dtype_for("master")), "cast in place": ctx.cast(x, "compute") is x}


@pytest.mark.parametrize("name, floats, master", [
    ("megatron-bf16", "bfloat16", "float32"),  # FP32 gradients, but BF16 weights and inputs
    ("fsdp2", "bfloat16", "float32"),  # FP32 parameters, BF16 products
    ("fp32", "float32", "float32"),  # no master copy: the parameters' own dtype
    ("fp64", "float64", "float64"),
])
def test_a_run_at_real_size_makes_its_floats_in_the_compute_dtype(name, floats, master):
    got = parasim.run(_made, 1, backend="symbolic", precision=name).values[0]
    assert got == {"literal": floats, "literal as told": "float32", "xp literal": floats, "xp ints": "int64",
                   "zeros": floats, "full": floats, "full ints": "int64", "draw": floats, "master": master,
                   "cast in place": True}


def test_an_exact_run_casts_nothing():
    """On virtual ranks an array keeps the dtype the program made it in, float32 here, whatever kind it is
    sent as: the same array, not a copy."""
    def program(ctx):
        x = ctx.xp.ones((3,), dtype=ctx.xp.float32)
        y = ctx.cast(x, "grad_reduce")
        return y is x, dtype_name(y.dtype)
    assert parasim.run(program, 1, precision="megatron-bf16").values[0] == (True, "float32")


def test_seeded_draws_default_to_the_float_they_are_given():
    from parasim.engine.context import Rng
    rng = Rng(0, (0,), lambda a: a, "float32")
    assert rng.normal((2,)).dtype == np.float32 and rng.uniform((2,)).dtype == np.float32
    assert rng.normal((2,), "float64").dtype == np.float64
    assert Rng(0, (0,), lambda a: a).normal((2,)).dtype == np.float64


def test_a_context_at_real_size_makes_literals_in_the_compute_dtype():
    """A Context not exact (what a backend computing in the training dtypes makes) takes its precision's compute
    dtype for literals and draws; an exact one float64."""
    from parasim.engine.context import Context

    def ctx(exact: bool) -> Context:
        return Context(0, 1, None, np, 0, None, lambda a: a, "megatron-bf16", exact=exact)
    assert ctx(False).asarray([1.0]).dtype == ml_dtypes.bfloat16
    assert ctx(False).rng.normal((2,)).dtype == ml_dtypes.bfloat16
    assert ctx(True).asarray([1.0]).dtype == np.float64


@pytest.mark.parametrize("backend, exact", [("virtual", True), ("symbolic", False)])
def test_the_trace_says_which_precision_the_run_stands_for(backend, exact):
    trace = parasim.run(_all_reduce, 2, backend=backend, precision="fp32").trace
    assert trace.meta["precision"] == {"name": "fp32", "exact": exact}


# -- symbolic arrays: a training step's dtypes --------------------------------------------------------------
def _sym(dtype: str, shape=(4,)):
    from parasim.engine.symbolic.array import SymArray
    return SymArray(shape, dtype, None)


@pytest.mark.parametrize("a, b, want", [
    ("bfloat16", "float32", "float32"),  # the widest float: an FP32 operand keeps FP32
    ("float8_e4m3fn", "bfloat16", "bfloat16"),  # numpy finds float32; a kernel gives the wider of the two
    ("float16", "int64", "float16"),  # numpy widens to float64; a kernel keeps the float's width
    ("bfloat16", "int64", "bfloat16"),
])
def test_a_narrow_float_with_another_array_keeps_the_widest_floats_width(a, b, want):
    assert dtype_name((_sym(a) * _sym(b)).dtype) == want
    assert dtype_name((_sym(b) + _sym(a)).dtype) == want


def test_an_fp8_array_scaled_by_a_python_float_stays_fp8():
    assert dtype_name((_sym("float8_e4m3fn") * 0.5).dtype) == "float8_e4m3fn"


def test_dtypes_numpy_cannot_combine_are_refused_as_numpy_refuses_them():
    """Two datetimes do not add in numpy; without a 16- or 8-bit float among them the symbolic rule is numpy's,
    its refusal included."""
    from parasim.engine.symbolic.array import _result_dtype
    dt = (np.dtype("datetime64[s]"), np.dtype("datetime64[s]"))
    with pytest.raises(TypeError):
        np.add.resolve_dtypes(dt + (None,))
    with pytest.raises(TypeError):
        _result_dtype(np.add, dt)


# -- ZeRO-1 at real size: what it keeps and sends ---------------------------------------------------------
def _zero1(ctx):
    from parasim.dp.zero import Zero1Adam
    g = ctx.new_group([0, 1], "dp")
    opt = Zero1Adam(ctx, g, {"w": ctx.shared_rng("w").normal((8,))})
    kept = [dtype_name(a.dtype) for a in (opt.master, opt.m, opt.v)]
    opt.step({"w": ctx.rng.normal((8,))})
    return kept


@pytest.mark.parametrize("name, kept, reduced", [
    ("post", ["float32"] * 3, "bfloat16"),  # FP32 master weights and moments; BF16 gradients reduced
    ("megatron-bf16", ["float32"] * 3, "float32"),
    ("deepseek-v3", ["float32", "bfloat16", "bfloat16"], "float32"),  # BF16 moments
])
def test_zero1_keeps_fp32_master_weights_and_sends_each_kind_in_its_dtype(name, kept, reduced):
    result = parasim.run(_zero1, 2, backend="symbolic", precision=name)
    assert result.values == [kept, kept]
    sent = {e.op: {t.dtype for m in e.members for t in m.ins} for e in result.trace.events}
    assert sent == {"reduce_scatter": {reduced}, "all_gather": {"bfloat16"}}  # the weights gathered in BF16


# -- what DP, ZeRO-1/2 and ZeRO-3 hold, at a precision whose gradients are not its weights' size --------------
def _sharded(stage: int, name: str):
    from parasim.dp.sharded import ShardedAdam
    from tests.unit.dp.test_dp import LR, _grads, _model

    def program(ctx):
        stack = _model(ctx)  # 1,200 parameters
        grads = _grads(ctx, stack, [ctx.rank])
        opt = ShardedAdam(ctx, ctx.new_group(range(4), "dp"), stack.params(), stage, lr=LR)
        opt.step(grads)
        return opt.held()
    return parasim.run(program, 4, precision=name)


# bytes of a weight, a gradient and the optimizer's state per value: Megatron's BF16 (FP32 gradients, FP32 master
# weights and Adam), DeepSeek-V3's (the same with BF16 moments: 4 + 2 + 2)
SIZES = {"megatron-bf16": (2, 4, 12), "deepseek-v3": (2, 4, 8)}


@pytest.mark.parametrize("name", SIZES)
@pytest.mark.parametrize("stage, whole_grads, whole_state", [(0, True, True), (1, True, False), (2, False, False)])
def test_dp_and_zero_hold_each_kind_at_its_precisions_size(stage, whole_grads, whole_state, name):
    """1,200 parameters over 4 GPUs: ZeRO-1 keeps a quarter of the optimizer's state (300 values), ZeRO-2 a
    quarter of the gradients too; while ZeRO-2 reduces its one bucket, that bucket's 1,200 gradients as well."""
    w, g, o = SIZES[name]
    result = _sharded(stage, name)
    held = {"weights": 1200 * w, "gradients": (1200 if whole_grads else 300) * g,
            "optimizer": (1200 if whole_state else 300) * o}
    assert result.values == [held] * 4
    bucket = 0 if whole_grads else 1200 * g
    assert result.trace.peak(0)["by_kind"] == {**held, "gradients": held["gradients"] + bucket, "activations": 0,
                                               "gathered": 0}


def _zero3(ctx):
    from parasim.dp.zero3 import Zero3
    from parasim.nn.layer import Stack
    from tests.unit.dp.test_dp import LR, _grads, _model
    layers = [Zero3(ctx, layer, ctx.new_group(range(8), "dp"), lr=LR) for layer in _model(ctx).layers]
    _grads(ctx, Stack(layers), [ctx.rank])
    for z in layers:
        z.step()
    return {k: sum(z.held()[k] for z in layers) for k in ("weights", "gradients", "optimizer")}


@pytest.mark.parametrize("name, held, peak", [
    # two layers of 600 parameters over 8 GPUs: a shard of 75 each; BF16 weights, FP32 gradients, 12 bytes state
    ("megatron-bf16", {"weights": 2 * 75 * 2, "gradients": 2 * 75 * 4, "optimizer": 2 * 75 * 12},
     # the last layer's backward first: its 600 weights gathered in BF16 and its whole FP32 gradient
     {"gathered": 600 * 2, "gradients": 2 * 75 * 4 + 600 * 4}),
    # FSDP2: FP32 shards (no master copy: 8 bytes of Adam's state), gathered in BF16
    ("fsdp2", {"weights": 2 * 75 * 4, "gradients": 2 * 75 * 4, "optimizer": 2 * 75 * 8},
     {"gathered": 600 * 2, "gradients": 2 * 75 * 4 + 600 * 4}),
])
def test_zero3_holds_shards_at_its_precision_and_gathers_the_compute_dtype(name, held, peak):
    result = parasim.run(_zero3, 8, precision=name)
    assert result.values[0] == held
    assert result.trace.peak(0)["by_kind"] == {**held, **peak, "activations": 0}  # the shards held all along


# -- the MoE layer's wire: each direction in its dtype, back in the activations' once arrived ----------------
def _moe_step(name):
    from parasim.train.step import make_step
    from parasim.layout import Layout, ModelSpec
    model = ModelSpec(name="small", layers=2, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, seq=8,
                      bias=False)
    layout = Layout(dp=2, ep=2, etp=1, model=model)
    return parasim.run(make_step(layout, m=1), layout.world, backend="symbolic", precision=name).trace


def _a2a_dtypes(trace) -> dict[str, set]:
    """The dtypes each EP all-to-all sends, by what it carries ("dispatch", "combine backward", ...)."""
    out: dict[str, set] = {}
    for e in trace.events:
        if e.group.name == "ep":
            out.setdefault(e.label.split(": ")[0].split("moe ")[1], set()).update(t.dtype for m in e.members
                                                                                   for t in m.ins)
    return out


def _wide_wire():
    """A precision whose all-to-alls send FP32 both ways while its activations stay BF16 (no framework's
    default: it tells a value sent wider than it is kept from one kept as sent)."""
    from dataclasses import replace
    return replace(precision("post"), name="wide-wire", dispatch="float32", combine="float32")


@pytest.mark.parametrize("name, toward, home", [
    ("deepseek-v3", "float8_e4m3fn", "bfloat16"),  # FP8 to the experts, BF16 home
    ("wide-wire", "float32", "float32"),
])
def test_the_moe_layer_sends_each_way_in_its_dtype_and_keeps_bf16(name, toward, home):
    """Toward the experts: the dispatch and, backward, the gradients of their outputs ("combine backward");
    home: the combine and the gradients of the tokens and gates ("dispatch backward"). What arrives is kept
    and computed on in the activations' BF16: the peak of activations is the post's, BF16 every way."""
    trace = _moe_step(_wide_wire() if name == "wide-wire" else name)
    assert _a2a_dtypes(trace) == {"dispatch": {toward}, "combine backward": {toward}, "combine": {home},
                                  "dispatch backward": {home}}
    post = _moe_step("post")
    assert _a2a_dtypes(post) == dict.fromkeys(("dispatch", "combine backward", "combine", "dispatch backward"),
                                              {"bfloat16"})
    assert trace.peak(0)["by_kind"]["activations"] == post.peak(0)["by_kind"]["activations"]


# -- the table itself and the plan that names it ---------------------------------------------------------------
def test_each_dtypes_size_is_numpys():
    from parasim.layout.precision import ITEMSIZE
    for name, size in ITEMSIZE.items():
        assert size == np.dtype(getattr(ml_dtypes, name, None) or name).itemsize, name


def test_an_entry_with_a_dtype_it_cannot_size_is_refused_in_one_line():
    from dataclasses import replace

    from parasim.errors import UsageError
    with pytest.raises(UsageError, match="dispatch dtype 'float9'"):
        replace(precision("post"), dispatch="float9")


def test_an_fp8_e5m2_dispatch_is_a_byte_a_value():
    from dataclasses import replace
    assert replace(precision("post"), dispatch="float8_e5m2").bytes("dispatch") == 1


def test_model_state_per_parameter_divides_each_group_by_its_own_shards():
    """The post's 2 + 2 + 12 bytes: the gradients over 2 (ZeRO-2's share of a pair), nothing else split."""
    assert precision("post").per_param({"gradients": 2}) == 2 + 1 + 12
    assert precision("post").per_param({"weights": 2}) == 1 + 2 + 12


def test_a_plan_refuses_a_precision_it_does_not_know_and_names_the_one_it_has():
    from parasim.errors import UsageError
    with pytest.raises(UsageError, match="unknown precision 'bf17'"):
        Plan(precision="bf17")
    assert Plan(precision="fp32").to_dict()["precision"] == "fp32"


def test_a_megatron_fp16_job_with_fp32_gradients_reduces_them_in_fp32():
    """--fp16 --accumulate-allreduce-grads-in-fp32: FP32 gradients reduce-scattered (4 bytes), FP16 weights
    gathered (2), ZeRO-1 over 8."""
    t = step_traffic(get_model("27b"), Plan(dp=8, zero=1, precision="megatron-fp16-grads-fp32"), 4096)
    assert t[("dp", "reduce_scatter")] == pytest.approx(27e9 * 4 * 7 / 8)
    assert t[("dp", "all_gather")] == pytest.approx(27e9 * 2 * 7 / 8)


def test_kept_attention_scores_are_counted_at_the_activations_size():
    """Without FlashAttention a layer keeps, per (query, key) of each of its heads/tp heads, the softmax output
    and with dropout its output and a 1-byte mask: FP32, 4 + 4 + 1 bytes; without dropout 4."""
    from parasim.estimate.memory import scores_bytes_per_token_key
    assert scores_bytes_per_token_key(8, 2, False, 1, True, 4) == 8 / 2 * (4 + 4 + 1)
    assert scores_bytes_per_token_key(8, 2, False, 1, False, 4) == 8 / 2 * 4


def test_full_recomputation_keeps_each_layers_input_at_the_activations_size():
    """Full recomputation keeps one [s, b, h] input per layer: 60 layers of h = 6,144, 4 bytes a value in FP32
    (per token of the one micro-batch, no TP), 2 in BF16."""
    from parasim.estimate.memory import items
    model = get_model("27b")
    for name, size in (("fp32", 4), ("post", 2)):
        got = items(model, Plan(recompute="full", precision=name), 0)["activations"][1]
        assert got == 60 * 6144 * size, name


@pytest.mark.slow
def test_real_ranks_are_exact_and_say_which_precision_they_stand_for():
    """gloo on 2 processes: float64 values, like virtual ranks, standing for Megatron's BF16 job."""
    trace = parasim.run(_all_reduce, 2, backend="gloo", precision="megatron-bf16").trace
    assert trace.meta["precision"] == {"name": "megatron-bf16", "exact": True}
    assert {t.dtype for e in trace.events for m in e.members for t in m.ins} == {"float64"}


# -- the estimator against a run at real size, at precisions other than the post's ----------------------------
def _explained(c) -> dict:
    out = {r["item"]: (r["estimate"] - r["run"], sum(r["parts"].values())) for r in c["rows"]}
    out.update({(t["axis"], t["op"]): (t["estimate"] - t["run"], sum(t["parts"].values())) for t in c["traffic"]})
    return out


@pytest.mark.parametrize("name, reduced", [("megatron-bf16", 4), ("deepseek-v3", 4), ("fp32", 4), ("post", 2)])
def test_odd_shapes_are_explained_at_each_precision(name, reduced):
    """tests/unit/train/test_against.py's odd model (DP 16, expert-DP 4: both ZeRO-1 buffers padded) at other precisions:
    every difference between the estimate and the run is its parts, the padding's at the precision's bytes:
    the expert buffer's one padding value, 3/4 of it sent in the reduce-scatter at the gradients' reduce size."""
    from parasim.train.against import compare
    from parasim.layout import ModelSpec
    model = ModelSpec(name="odd", layers=2, hidden=8, heads=2, vocab=16, ffn=9, experts=4, top_k=2, expert_ffn=3,
                      dense_layers=1)
    c = compare(model, Plan(dp=16, ep=4, precision=name), 8)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-9), item
    traffic = {(t["axis"], t["op"]): t["parts"] for t in c["traffic"]}
    assert traffic[("edp", "reduce_scatter")]["ZeRO-1 pads each share to equal size"] == -3 / 4 * 1 * reduced


@pytest.mark.parametrize("name", ["deepseek-v3", "megatron-bf16"])
def test_an_moe_model_under_sp_is_explained_at_each_precision(name):
    """The 16-GPU example's model under TP 2 + SP, EP 4 (tests/unit/train/test_against.py's), its all-to-alls at
    DeepSeek-V3's FP8 dispatch and its activations at Megatron's BF16: every difference is its parts."""
    from parasim.train.against import compare
    c = compare(get_model("moe16"), Plan(tp=2, sp=True, dp=2, ep=4, precision=name), 64)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-9), item
    assert {t["axis"] for t in c["traffic"]} >= {"ep", "tp", "dp"}


@pytest.mark.parametrize("recompute, forwards", [("none", 1), ("full", 2)])
@pytest.mark.parametrize("name, out, home, act", [("deepseek-v3", 1, 2, 2), ("fp32", 4, 4, 4)])
def test_a_top4_moe_is_explained_with_each_ways_bytes(name, out, home, act, recompute, forwards):
    """8 experts, top 4, on EP 2 (4 experts a GPU), 16 tokens, 2 MoE layers, balanced routing: each token picks
    two experts on each GPU. The estimate sends K x 1/2 = 2 copies a token away, the run one row (with its 4
    gates); the run's 32 received rows a layer against the estimate's K x 16 = 64 kept."""
    from parasim.train.against import compare
    from parasim.layout import ModelSpec
    model = ModelSpec(name="top4", layers=2, hidden=8, heads=2, vocab=16, ffn=16, experts=8, top_k=4)
    c = compare(model, Plan(dp=2, ep=2, recompute=recompute, precision=name), 16)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-9), item
    (ep,) = [t["parts"] for t in c["traffic"] if t["axis"] == "ep"]
    layers, copies, away, h = 2, 32, 16, 8
    # dispatch (and its recompute) toward the experts, combine home; backward one of each, the other way round
    assert ep["a token goes once per GPU holding its picks (the estimate sends each of its K copies)"] == \
        layers * (forwards + 1) * (out + home) * h * (copies - away)
    assert ep["the gates ride with the dispatched rows and their gradients (E/ep values a row)"] == \
        -layers * (forwards * out + home) * 4 * away  # gates go out with the tokens, their gradients come home
    kept = {r["item"]: r["parts"] for r in c["rows"]}["activations (kept, in flight, recompute working set)"]
    kept_layers = 1 if recompute == "full" else layers  # full recomputation: one layer's working set differs
    assert kept["dispatched rows: K copies a token in the estimate, once per GPU in the run"] == \
        kept_layers * act * h * (64 - 32)


def test_fit_search_ranks_layouts_at_the_precision_it_is_given():
    """`fit --search --precision fp32`: the best layout on one node is searched at FP32 (its row says so) and
    its longest sequence is the one `fit` finds for that layout alone, at FP32."""
    import json

    from parasim.estimate import fit, gpu_presets
    from tests.conftest import cli
    r = cli("fit", "--model", "27b", "--search", "--nodes", "1", "--precision", "fp32", "--json")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["nodes"][0]["best"]
    assert best["precision"] == "fp32"
    plan = Plan(**{k: best[k] for k in ("tp", "sp", "cp", "pp", "dp", "ep", "etp", "zero", "recompute", "flash",
                                        "micro_batch", "microbatches", "chunked_loss")}, precision="fp32")
    assert best["max_seq_tokens"] == int(fit(get_model("27b"), plan, gpu_presets()["h200"].usable).seq)



"""Training precision in one place (layout/precision.py): Megatron-LM's own bytes-per-parameter table, a
Megatron job's dtypes as its flags set them, and one answer for one job in memory, traffic and the clock.

Megatron-LM's table (docs/source/api-guide/dist_optimizer.md), d the data-parallel size:
    16-bit params, 16-bit grads   20   4 + 16/d
    16-bit params, FP32 grads     18   6 + 12/d
    FP32 params, FP32 grads       16   8 +  8/d
Every expected value below is typed from that table or worked out by hand in the test."""
from __future__ import annotations

import json

import pytest

from parasim.estimate import get_model
from parasim.estimate.memory import Plan, breakdown
from parasim.estimate.traffic import step_traffic
from parasim.layout.precision import PRECISIONS, precision
from tests.conftest import cli

# (flags, Megatron's bytes per parameter without the distributed optimizer, with it as (a, b): a + b/d)
MEGATRON_TABLE = [
    (["--bf16"], 18, (6, 12)),
    (["--bf16", "--accumulate-allreduce-grads-in-fp32"], 18, (6, 12)),
    (["--bf16", "--grad-reduce-in-bf16"], 20, (4, 16)),
    (["--fp16"], 20, (4, 16)),
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], 18, (6, 12)),
    ([], 16, (8, 8)),
]


def _job(tmp_path, flags: list[str], dp: int, distributed: bool) -> str:
    """A dense GPT on dp GPUs (TP 1, PP 1), as a Megatron-LM launch script."""
    path = tmp_path / "job.sh"
    path.write_text(
        f"torchrun --nproc_per_node {dp} pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 4 --seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 "
        f"--global-batch-size {dp} --vocab-size 1024 "
        + " ".join(flags + (["--use-distributed-optimizer"] if distributed else [])) + "\n")
    return str(path)


@pytest.mark.parametrize("flags, plain, sharded", MEGATRON_TABLE, ids=[" ".join(f) or "fp32" for f, _, _ in MEGATRON_TABLE])
@pytest.mark.parametrize("dp", [1, 4, 8])
def test_memory_of_a_megatron_job_is_megatron_s_own_table(tmp_path, flags, plain, sharded, dp):
    for distributed, want in ((False, plain), (True, sharded[0] + sharded[1] / dp)):
        r = cli("memory", "--megatron", _job(tmp_path, flags, dp, distributed), "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["bytes_per_param"] == pytest.approx(want), (flags, dp, distributed)
        # the whole model on every GPU (TP 1, PP 1): what it holds is every parameter
        assert out["params_held"] == out["params"]


def test_the_post_counts_two_two_and_twelve():
    p = precision("post")
    assert (p.weight_bytes, p.grad_bytes, p.optimizer_bytes) == (2, 2, 12)
    assert p.per_param() == 16 and p.per_param({"optimizer": 4, "gradients": 4}) == 2 + 0.5 + 3


def test_an_unknown_precision_is_one_line(tmp_path):
    r = cli("memory", "--model", "27b", "--precision", "bf17")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bf17" in r.stderr


def test_bytes_per_parameter_divide_by_what_the_gpu_holds():
    """DeepSeek-V3 at PP 16 x EP 64: each GPU holds 1/16 of the dense parameters and 1/(64 x 16) of the experts;
    its model state per parameter it holds is at least the 2 bytes of its weights."""
    model = get_model("deepseek-v3")
    plan = Plan(pp=16, ep=64, dp=128, zero=1)
    out = breakdown(model, plan, 4096).to_dict()
    experts = model.expert_params()
    held = (model.total_params() - experts) / 16 + experts / (64 * 16)
    assert out["params_held"] == pytest.approx(held)
    edp = 2048 // (64 * 16)
    state = 2 * held + 2 * held + 12 * ((model.total_params() - experts) / 16 / 128 + experts / (64 * 16) / edp)
    assert out["model_state"] * 1e9 == pytest.approx(state)
    assert out["bytes_per_param"] == pytest.approx(state / held) and out["bytes_per_param"] > 4


def test_traffic_reduces_gradients_and_gathers_weights_each_in_its_own_dtype():
    """Megatron's BF16 job reduce-scatters FP32 gradients (4 bytes) and all-gathers BF16 weights (2 bytes);
    the post's convention sends both in BF16."""
    model = get_model("27b")
    p = Plan(dp=8, zero=1, precision="megatron-bf16")
    t = step_traffic(model, p, 4096)
    local = model.total_params()
    assert t[("dp", "reduce_scatter")] == pytest.approx(local * 4 * 7 / 8)
    assert t[("dp", "all_gather")] == pytest.approx(local * 2 * 7 / 8)
    post = step_traffic(model, Plan(dp=8, zero=1), 4096)
    assert post[("dp", "reduce_scatter")] == pytest.approx(local * 2 * 7 / 8)


def test_an_fp8_dispatch_halves_what_goes_to_the_experts():
    """DeepSeek-V3's convention: tokens go to their experts in FP8 (1 byte), come home in BF16 (2 bytes)."""
    model = get_model("deepseek-v3")
    bf16 = step_traffic(model, Plan(ep=8, dp=8, precision="post"), 4096)
    fp8 = step_traffic(model, Plan(ep=8, dp=8, precision="deepseek-v3"), 4096)
    # each direction carries the same values: (1 + 2) bytes where BF16 takes (2 + 2)
    assert fp8[("ep", "all_to_all")] / bf16[("ep", "all_to_all")] == pytest.approx(3 / 4)


def test_every_entry_names_its_source_and_only_known_dtypes():
    for p in PRECISIONS.values():
        assert p.source and p.title
        assert p.per_param() >= 8  # at least a weight and a gradient and Adam's two moments in some form


@pytest.mark.parametrize("argv, words", [
    (["trace", "--precision", "fp32"], "--precision is a choice of a real-size step"),
    (["trace", "--megatron-env", "X=1", "--gpu", "0"], "give it by --megatron FILE"),
    (["memory", "--model", "27b", "--precision", "bf17"], "invalid choice: 'bf17'"),
])
def test_precision_and_script_variables_where_they_mean_nothing_are_one_line(argv, words):
    r = cli(*argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_a_symbolic_trace_at_real_size_takes_a_precision():
    """`trace --symbolic --layout megatron-8.3b --precision megatron-bf16 --gpu 0`: the data-parallel gradients
    reduced in FP32 (4 bytes), the weights gathered in BF16 (2): twice the bytes for the same values."""
    r = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--precision", "megatron-bf16", "--gpu", "0",
            "--seq", "1024", "--json")
    assert r.returncode == 0, r.stderr
    does = {(d["group"], d["op"]): d["sent"] for d in json.loads(r.stdout)["does"]}
    assert does[("dp-cp", "reduce_scatter")] == 2 * does[("dp-cp", "all_gather")]


def test_each_direction_of_an_all_to_all_moves_in_its_own_dtype():
    """Toward the experts (the dispatch, and backward the gradients of their outputs) at 1 byte a value, home
    (the combine, and backward the gradients of the tokens and gates) at 2: DeepSeek-V3's FP8 dispatch."""
    from parasim.estimate.traffic import ep_expected_bytes, ep_expected_rows
    rows = ep_expected_rows(64, 2, 8, 4)
    got = ep_expected_bytes(64, 2, 8, 4, 16, 1, 2)
    assert got == pytest.approx({"dispatch": rows * (16 + 2) * 1, "combine": rows * 16 * 2,
                                 "combine backward": rows * 16 * 1, "dispatch backward": rows * (16 + 2) * 2})


@pytest.mark.parametrize("name, moved", [
    ("megatron-bf16", 4 + 4 + 8 + 4 + 8 + 2),  # reads FP32 master, FP32 grad, m, v; writes master, m, v, BF16 copy
    ("post", 4 + 2 + 8 + 4 + 8 + 2),  # the gradient it reads is BF16
    ("megatron-fp16", 4 + 4 + 8 + 4 + 8 + 2),  # it reads its FP32 copy of the gradient
    ("fp32", 4 + 4 + 8 + 4 + 8),  # no master copy: the FP32 weight is read and written once
    ("deepseek-v3", 4 + 4 + 4 + 4 + 4 + 2),  # BF16 moments
])
def test_the_optimizers_pass_moves_what_its_precision_keeps(name, moved):
    from parasim.clock.plan import adam_bytes
    assert adam_bytes(precision(name)) == moved


@pytest.mark.parametrize("dtype, unit", [("float64", 2), ("float32", 4), ("bfloat16", 2), ("float8_e4m3fn", 1)])
def test_what_a_layer_keeps_is_counted_at_its_own_size_an_exact_runs_float64_at_16_bits(dtype, unit):
    import ml_dtypes  # noqa: F401
    import numpy as np

    from parasim.nn import Saved
    saved = Saved()
    saved.keep("L0", "x", np.zeros((3, 5), dtype=dtype))
    saved.keep("L0", "mask", np.zeros((3, 5), dtype=dtype), unit=1)
    assert saved.bytes() == 15 * unit + 15


def test_an_fp32_plan_counts_four_bytes_an_activation():
    """The same layer at FP32 keeps twice the bytes of BF16, masks aside (1 byte a value either way)."""
    from parasim.estimate.memory import items
    model = get_model("27b")
    bf16, fp32 = (items(model, Plan(tp=8, sp=True, precision=p), 0)["activations"][1] for p in ("post", "fp32"))
    no_masks = {p: items(model, Plan(tp=8, sp=True, dropout=False, precision=p), 0)["activations"][1]
                for p in ("post", "fp32")}
    assert no_masks["fp32"] == 2 * no_masks["post"]
    assert fp32 - bf16 == no_masks["fp32"] - no_masks["post"]  # the masks are the same bytes in both

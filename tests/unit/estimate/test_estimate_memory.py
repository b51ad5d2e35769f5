"""The memory estimator item by item, on models small enough to work out by hand. Each expected number is
derived in a comment from first principles: 2 bytes per kept activation value (1 per dropout-mask value),
weights 2 bytes/param, gradients 2, Adam 12, sharded over dp*cp by ZeRO stage >= 3/2/1, logits 4 bytes x
vocab/tp per token on the last stage. Korthikanti et al.: 34*h bytes per token per layer without TP,
h*(10 + 24/t) with TP alone, 34*h/t with TP + SP (kv = heads, ffn = 4h, two MLP matrices)."""
from __future__ import annotations

import numpy as np
import pytest

from parasim.errors import UsageError
from parasim.estimate.memory import (Plan, breakdown, items, layer_bytes_per_token, layer_saved_bytes,
                                     scores_bytes_per_token_key, stage_layers, stages_of, totals)
from parasim.layout import SPREAD, ModelSpec
from parasim.layout import LayoutError

# 4 layers, h = 8, ffn = 32: 34h = 272 bytes per token per layer; tp 2: 8*(10 + 12) = 176; tp 2 + SP: 136
D = ModelSpec("tiny", layers=4, hidden=8, heads=2, vocab=10, params=1600)
# 2 dense layers then 2 MoE layers (4 experts of width 8, top-2, one shared expert), h = 4, ffn = 16
MOE = ModelSpec("tiny-moe", layers=4, hidden=4, heads=2, vocab=8, experts=4, top_k=2, expert_ffn=8,
                shared_experts=1, dense_layers=2)
KEYS = ["weights", "gradients", "optimizer", "activations", "in-flight micro-batches", "recompute working set",
        "logits", "ZeRO-3 gathered layers"]


# -- Plan: its checks, its label, its dict ------------------------------------------------------------
INT_FIELDS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "working_layers", "gathered_layers")


@pytest.mark.parametrize("field", INT_FIELDS)
def test_plan_integer_fields_start_at_one(field):
    assert getattr(Plan(**{field: 1}), field) == 1
    room = {"dp": 2} if field in ("ep", "etp") else {}  # two experts' ranks need two GPUs (a layout rule)
    assert getattr(Plan(**{field: np.int64(2)}, **room), field) == 2  # numpy integers count as integers
    for bad in (0, True, 2.0):  # just below the range, a bool, a float
        with pytest.raises(UsageError, match=f"{field} must be a positive integer"):
            Plan(**{field: bad})


def test_plan_choices_at_their_boundaries():
    assert Plan(microbatches=1).m == 1 and Plan(pp=4).m == 4  # m defaults to pp
    with pytest.raises(UsageError, match="microbatches must be a positive integer"):
        Plan(microbatches=0)
    assert [Plan(zero=z).zero for z in (0, 3)] == [0, 3]
    for z in (-1, 4):
        with pytest.raises(UsageError, match="ZeRO stage must be 0, 1, 2 or 3"):
            Plan(zero=z)
    assert Plan(recompute="full").rc == 2
    with pytest.raises(UsageError, match="recompute must be one of none, selective, full"):
        Plan(recompute="half")


@pytest.mark.parametrize("model, ok, bad, needle", [
    (D, dict(tp=2, sp=True), dict(sp=True), "sequence parallelism needs tp > 1"),
    # world 2 holds EP 2 (edp 1); world 1 does not
    (MOE, dict(dp=2, ep=2), dict(ep=2), "world 1 is not divisible by etp\\*ep\\*pp = 2"),
    (MOE, dict(cp=2, ep=2), dict(tp=2, sp=True, etp=2, ep=2), "world 2 is not divisible by etp\\*ep\\*pp = 4"),
    # ETP 1 under TP 2 (the expert MLPs unsplit) is a layout of its own, and MoE with TP needs SP
    (MOE, dict(tp=2, sp=True, ep=2, etp=1), dict(tp=2, ep=2, etp=1), "needs sequence parallelism"),
    (MOE, dict(tp=2, sp=True, etp=2), dict(dp=8, ep=8), "experts 4 do not divide by ep 8"),
    (D, dict(dp=2), dict(dp=2, ep=2), "ep 2 needs a model with experts"),
    (D, dict(pp=4), dict(pp=3), "layers 4 do not divide by pp 3"),
    (ModelSpec("u", layers=4, hidden=8, heads=2, vocab=10, stages=SPREAD), dict(pp=4), dict(pp=5),
     "pp 5 exceeds layers 4"),
])
def test_plan_check_at_the_boundary(model, ok, bad, needle):
    """A plan is a Layout: its rules fire when it is made, or when a model is attached."""
    Plan(**ok).check(model)  # the valid neighbour passes
    with pytest.raises(LayoutError, match=needle):
        Plan(**bad).check(model)


@pytest.mark.parametrize("plan, label", [
    (Plan(), "one GPU"),
    (Plan(zero=0), "one GPU"),  # no dp x cp group: no ZeRO to name
    (Plan(tp=2), "TP2"),
    (Plan(tp=2, sp=True, recompute="selective"), "TP2 + SP + selective recompute"),
    (Plan(tp=2, sp=True, cp=2, pp=2, ep=2, dp=2), "TP2 + SP + CP2 + PP2 + EP2 + DP2"),  # ZeRO-1 is the default
    (Plan(dp=2, zero=0), "DP2 + ZeRO-0"),
    (Plan(dp=2, zero=2), "DP2 + ZeRO-2"),
    (Plan(cp=2, zero=3, recompute="full"), "CP2 + ZeRO-3 + full recompute"),
    (Plan(tp=2, ep=2, etp=2, dp=2), "TP2 + EP2 + ETP2 + DP2"),  # the experts split as attention is
])
def test_plan_label(plan, label):
    assert plan.label() == label


def test_plan_to_dict():
    p = Plan(tp=2, sp=True, cp=2, pp=2, dp=2, ep=2, etp=1, zero=3, recompute="full", flash=False, micro_batch=2,
             microbatches=4, chunked_loss=True, cp_comm="all_gather", zigzag=False, chunks=2)
    assert p.to_dict() == {
        "tp": 2, "sp": True, "cp": 2, "cp_comm": "all_gather", "zigzag": False, "pp": 2, "dp": 2, "ep": 2, "etp": 1,
        "world": 16, "zero": 3, "recompute": "full", "flash": False, "micro_batch": 2, "microbatches": 4, "chunks": 2,
        "chunked_loss": True,
        "precision": "post", "attention_kernel": None, "fusion": "megatron", "dispatcher": "alltoall",
        "label": "TP2 + SP + CP2 + PP2 + EP2 + DP2 + ZeRO-3 + full recompute"}


# -- one layer, per token ---------------------------------------------------------------------------
@pytest.mark.parametrize("args, kw, want", [
    ((8, 2, 2, 32, 1, False), {}, 272),  # 34h
    ((8, 2, 2, 32, 2, False), {}, 176),  # h(10 + 24/2)
    ((8, 2, 2, 32, 2, True), {}, 136),  # 34h/2
    ((8, 2, 2, 32, 1, False), dict(dropout=False), 256),  # 34h less the two 1-byte masks, 2h
    ((8, 2, 2, 32, 1, False), dict(mats=3), 336),  # SwiGLU keeps a third ffn-wide input: + 2 * 32
    # GQA, 1 kv head of dim 2 replicated on both TP ranks: LN 2*2h = 32, attention 2*(h + h/2 + 2*2 + h/2)
    # = 40, MLP 2*(h + 2*32/2) = 80, masks 2h = 16
    ((8, 4, 1, 32, 2, False), {}, 168),
    # h = 4, top-1 of experts of width 8, no shared ones: LN 16, attention 2*(4 + 4 + 8 + 4) = 40, MLP the
    # router input 4 plus the copy's input 4 and its 2 x 8 values, 2*(4 + 20) = 48, masks 8
    ((4, 2, 2, 16, 1, False), dict(top_k=1, expert_ffn=8), 112),
    ((4, 2, 2, 16, 1, False), dict(top_k=2, expert_ffn=8), 152),  # a second copy: MLP 2*(4 + 2*20) = 88
    ((4, 2, 2, 16, 1, False), dict(top_k=2, expert_ffn=8, shared=1), 184),  # the shared expert: + 2*16
    # TP 2 + SP, ETP 2, two shared SwiGLU experts: LN 2*4 = 8, attention 2*(2 + 2 + 2*2 + 2) = 20, MLP
    # 2*(router 2 + 2 copies x (4 + 3*8/2) / 2 + 3 * 2 shared * 8 / 2) = 2*(2 + 16 + 24) = 84, masks 4
    ((4, 2, 2, 16, 2, True), dict(mats=3, top_k=2, expert_ffn=8, shared=2, etp=2), 116),
])
def test_layer_bytes_per_token(args, kw, want):
    assert float(layer_bytes_per_token(*args, **kw)) == want


@pytest.mark.parametrize("args, kw, want", [
    ((4, 2, False, 1), {}, 10),  # 2 local heads x 5 bytes: softmax output 2, dropout mask 1, dropped output 2
    ((4, 2, False, 1), dict(dropout=False), 4),  # the softmax output alone
    ((4, 2, True, 1), {}, 0),  # FlashAttention keeps no scores
    ((4, 2, False, 2), {}, 0),  # nor does CP's ring attention
])
def test_scores_bytes_per_token_key(args, kw, want):
    assert float(scores_bytes_per_token_key(*args, **kw)) == want


@pytest.mark.parametrize("kw, want", [
    (dict(seq=4, batch=2, tp=1, sp=False), 8 * 272),  # 8 tokens x 34h, flash by default
    (dict(seq=4, batch=2, tp=2, sp=False, flash=False), 8 * 176 + 8 * 4 * 5),  # + scores: 4 keys, 1 head x 5
    (dict(seq=4, batch=3, tp=1, sp=False, cp=2, flash=False), 6 * 272),  # CP: 12/2 local tokens, no scores
    # no dropout, SwiGLU: 272 - 16 (masks) + 64 (third matrix) = 320; scores 2 heads x 2 bytes
    (dict(seq=4, batch=2, tp=1, sp=False, flash=False, dropout=False, mats=3), 8 * 320 + 8 * 4 * 4),
])
def test_layer_saved_bytes(kw, want):
    assert layer_saved_bytes(8, 2, 2, 32, **kw) == want


# -- stages ----------------------------------------------------------------------------------------
def moe_model(layers, dense_layers, **kw):
    return ModelSpec("m", layers=layers, hidden=4, heads=2, vocab=8, experts=4, top_k=2, dense_layers=dense_layers,
                     stages=SPREAD, **kw)


@pytest.mark.parametrize("model, pp, want", [
    (D, 2, [(2, 0), (2, 0)]),
    (moe_model(5, 0), 2, [(0, 3), (0, 2)]),  # uneven: ceil(5/2) = 3 on the first stage
    (moe_model(4, 1), 2, [(1, 1), (0, 2)]),  # the one dense layer leads
    (moe_model(4, 3), 2, [(2, 0), (1, 1)]),
    (moe_model(5, 0), 4, [(0, 2), (0, 1), (0, 1), (0, 1)]),  # as even as can be: no stage left empty
    (moe_model(61, 3), 16, [(3, 1)] + [(0, 4)] * 12 + [(0, 3)] * 3),  # DeepSeek-V3's 61 over PP 16
])
def test_stage_layers(model, pp, want):
    assert [tuple(float(x) for x in stage_layers(model, pp, s)) for s in range(pp)] == want


def test_stages_of():
    # an even split: every middle stage holds what the first holds, so the first and last alone can bind
    assert {int(s) for s in stages_of(D, Plan(pp=4))} == {0, 3} and {int(s) for s in stages_of(D, Plan())} == {0}


# -- items: (a, b, c) with bytes = a + b*s + c*s^2 ----------------------------------------------------
def assert_items(model, plan, stage, want):
    got = items(model, plan, stage)
    assert list(got) == KEYS
    for k in KEYS:
        assert tuple(float(v) for v in got[k]) == pytest.approx(want.get(k, (0, 0, 0))), k


ONE = {"weights": (3200, 0, 0), "gradients": (3200, 0, 0), "optimizer": (19200, 0, 0)}  # 1600 params x 2, 2, 12
TP2 = {"weights": (1600, 0, 0), "gradients": (1600, 0, 0), "optimizer": (9600, 0, 0)}  # 800 params per rank
PP = {"weights": (800, 0, 0), "gradients": (800, 0, 0), "optimizer": (4800, 0, 0)}  # 400 params per rank


@pytest.mark.parametrize("plan, stage, want", [
    (Plan(), 0, {**ONE, "activations": (0, 4 * 272, 0), "logits": (0, 4 * 10, 0)}),
    (Plan(chunked_loss=True), 0, {**ONE, "activations": (0, 4 * 272, 0)}),  # no whole-sequence logits
    # scores: per layer heads/tp x 5 bytes = 5 per token and key; logits split over TP
    (Plan(tp=2, flash=False), 0, {**TP2, "activations": (0, 4 * 176, 4 * 5), "logits": (0, 20, 0)}),
    # no dropout: 136 less the 1-byte masks 2h/2 = 128 per layer; scores 2 bytes (softmax only)
    (Plan(tp=2, sp=True, flash=False, dropout=False), 0,
     {**TP2, "activations": (0, 4 * 128, 4 * 2), "logits": (0, 20, 0)}),
    # CP 2, micro-batch 3: 1.5 local tokens per unit of s, ring attention keeps no scores, ZeRO-1 halves Adam
    (Plan(cp=2, micro_batch=3, flash=False), 0,
     {**ONE, "optimizer": (9600, 0, 0), "activations": (0, 1.5 * 4 * 272, 0), "logits": (0, 1.5 * 40, 0)}),
    (Plan(tp=2, recompute="selective", flash=False), 0,  # selective drops exactly the scores
     {**TP2, "activations": (0, 4 * 176, 0), "logits": (0, 20, 0)}),
    # full: each layer keeps its input (2 bytes x h/2 with SP); 2 layers re-run at full size, scores included
    (Plan(tp=2, sp=True, recompute="full", flash=False), 0,
     {**TP2, "activations": (0, 4 * 8, 0), "recompute working set": (0, 2 * 136, 2 * 5), "logits": (0, 20, 0)}),
    (Plan(recompute="full", working_layers=3), 0,
     {**ONE, "activations": (0, 4 * 16, 0), "recompute working set": (0, 3 * 272, 0), "logits": (0, 40, 0)}),
    # PP 2 (m = 2): stage 0 holds 2 micro-batches of its 2 layers, the last stage 1 and the logits
    (Plan(tp=2, pp=2), 0, {**PP, "activations": (0, 2 * 176, 0), "in-flight micro-batches": (0, 2 * 176, 0)}),
    (Plan(tp=2, pp=2), 1, {**PP, "activations": (0, 2 * 176, 0), "logits": (0, 20, 0)}),
    # PP 4, 8 micro-batches: stage 1 holds min(4 - 1, 8) = 3, so 2 more than the one it works on
    (Plan(pp=4, microbatches=8, flash=False), 1,
     {**PP, "activations": (0, 272, 10), "in-flight micro-batches": (0, 2 * 272, 2 * 10)}),
    (Plan(pp=4, microbatches=2), 0, {**PP, "activations": (0, 272, 0), "in-flight micro-batches": (0, 272, 0)}),
    # micro-batch 2: 2 tokens per unit of s on the 2 layers (272 and scores 10 each), and one more in flight
    (Plan(pp=2, micro_batch=2, flash=False), 0,
     {**TP2, "activations": (0, 2 * 2 * 272, 2 * 2 * 10), "in-flight micro-batches": (0, 2 * 2 * 272, 2 * 2 * 10)}),
    (Plan(pp=4, microbatches=8), 3, {**PP, "activations": (0, 272, 0), "logits": (0, 40, 0)}),
])
def test_dense_items(plan, stage, want):
    assert_items(D, plan, stage, want)


def test_swiglu_layers_keep_a_third_mlp_input():
    gated = ModelSpec("g", layers=4, hidden=8, heads=2, vocab=10, params=1600, gated=True)
    assert float(items(gated, Plan(), 0)["activations"][1]) == 4 * (272 + 2 * 32)  # + 2 bytes x ffn per layer


# MOE per token: dense layers 34h = 136; MoE layers LN 16 + attention 40 + MLP 2*(4 + 2*(4 + 16) + 16) = 120
# + masks 8 = 184. Parameters 1280, of them 512 in routed experts (2 layers x 4 experts x 2 x 4 x 8).
MOE_ONE = {"weights": (2560, 0, 0), "gradients": (2560, 0, 0), "optimizer": (15360, 0, 0)}


@pytest.mark.parametrize("plan, want", [
    (Plan(), {**MOE_ONE, "activations": (0, 2 * 136 + 2 * 184, 0), "logits": (0, 32, 0)}),
    # full: 4 layer inputs of 2h; the working set is 2 of the larger (MoE) layer, and their scores (2 x 10)
    (Plan(recompute="full", flash=False),
     {**MOE_ONE, "activations": (0, 4 * 8, 0), "recompute working set": (0, 2 * 184, 2 * 10), "logits": (0, 32, 0)}),
    # TP 2 + SP, ETP 2: dense 136/2 = 68; MoE LN 8 + attention 20 + MLP 2*(2 + 2*(4 + 8)/2 + 8) = 44 + masks
    # 4 = 76; every parameter split in 2 (experts over ETP); scores 1 local head x 5 bytes on all 4 layers
    (Plan(tp=2, sp=True, etp=2, flash=False),
     {"weights": (1280, 0, 0), "gradients": (1280, 0, 0), "optimizer": (7680, 0, 0),
      "activations": (0, 2 * 68 + 2 * 76, 4 * 5), "logits": (0, 16, 0)}),
])
def test_moe_items(plan, want):
    plan.check(MOE)
    assert (MOE.total_params(), MOE.expert_params()) == (1280, 512)  # the counts the sums start from
    assert_items(MOE, plan, 0, want)


@pytest.mark.parametrize("zero, want", [
    # 16 GPUs, dense part 768 / (tp*pp = 4) = 192 per rank, expert part 512 / (etp*ep*pp = 8) = 64;
    # ZeRO shards the first over dp*cp = 4 (48), the second over edp = 16/8 = 2 (32)
    (0, (2 * 256, 2 * 256, 12 * 256)),
    (1, (2 * 256, 2 * 256, 12 * 80)),
    (2, (2 * 256, 2 * 80, 12 * 80)),
    (3, (2 * 80, 2 * 80, 12 * 80)),
])
def test_moe_model_state_by_zero_stage(zero, want):
    plan = Plan(tp=2, sp=True, cp=2, pp=2, dp=2, ep=2, etp=2, zero=zero)
    plan.check(MOE)
    got = items(MOE, plan, 0)
    assert tuple(float(got[k][0]) for k in ("weights", "gradients", "optimizer")) == want


# ZeRO-3's working set on MOE, by hand: attention 4*4*2 + 4*(2*2*2) = 64 per layer, norms 2h = 8; a dense layer
# 64 + 8 + MLP 2*4*16 = 200; an MoE layer 64 + 8 + shared 2*4*8 = 64 + router 4*4 = 16 = 152 beside its routed
# experts 4 x 2*4*8 = 256. Post precision: weights gathered in 2 bytes, gradients 2; Megatron's: 2 and 4.
@pytest.mark.parametrize("plan, stage, want", [
    (Plan(dp=4, zero=3), 0, (152 + 256) * (2 * 2 + 2)),  # the MoE layer, whole, twice, and its gradient once
    (Plan(dp=4, zero=3, gathered_layers=1), 0, (152 + 256) * (2 + 2)),
    (Plan(dp=4, zero=3, precision="megatron-bf16"), 0, (152 + 256) * (2 * 2 + 4)),
    (Plan(dp=4, zero=2), 0, 0),  # below stage 3 the weights stay whole: nothing gathered
    (Plan(dp=4, ep=4, zero=3), 0, 200 * 6),  # EP 4 over 4 GPUs: each expert on one, not sharded, not gathered
    (Plan(tp=2, sp=True, dp=2, ep=2, zero=3), 0, (152 / 2 + 256 / 2) * 6),  # TP halves the dense part, EP the experts
    (Plan(pp=2, dp=2, zero=3), 0, 200 * 6),  # the first stage holds the two dense layers
    (Plan(pp=2, dp=2, zero=3), 1, 408 * 6),  # the second the two MoE layers
    (Plan(cp=2, zero=3), 0, 408 * 6),  # ZeRO shards over DP x CP, so CP alone gathers too
    (Plan(zero=3), 0, 0),  # one GPU: nothing to gather from
])
def test_zero3_gathers_the_stages_largest_layer(plan, stage, want):
    plan.check(MOE)
    got = items(MOE, plan, stage)["ZeRO-3 gathered layers"]
    assert tuple(float(v) for v in got) == (want, 0, 0)


@pytest.mark.parametrize("expert_ffn, stage, work", [
    (8, 1, 2 * 136),  # a dense stage re-runs dense layers
    (8, 2, 2 * 184),  # an MoE stage its (larger) MoE layers
    (2, 1, 2 * 136),
    (2, 2, 2 * 112),  # narrow experts: MLP 2*(4 + 2*(4 + 4) + 4) = 48, so 16 + 40 + 48 + 8
])
def test_full_recompute_working_set_is_the_stage_layer_kind(expert_ffn, stage, work):
    model = moe_model(4, 2, expert_ffn=expert_ffn, shared_experts=1)
    got = items(model, Plan(pp=4, recompute="full"), stage)  # one layer per stage
    assert float(got["recompute working set"][1]) == work
    assert float(got["activations"][1]) == 8  # that layer's input, 2 bytes x h
    assert float(got["in-flight micro-batches"][1]) == (4 - stage - 1) * 8


def test_totals_sum_the_items():
    # TP 2 without flash: state 1600 + 1600 + 9600; b 4 layers x 176 + logits 20; c 4 layers x 5
    assert tuple(float(x) for x in totals(D, Plan(tp=2, flash=False), 0)) == (12800, 724, 20)


# -- breakdown: the binding stage at one length -------------------------------------------------------
def test_breakdown_and_its_dict():
    # PP 2 at s = 10: stage 0 holds 2 micro-batches (2 x 352 x 10), the last 1 plus logits (200): stage 0 binds
    bd = breakdown(D, Plan(tp=2, pp=2), 10)
    assert (bd.stage, bd.seq, bd.total, bd.model_state) == (0, 10, 13440, 6400)
    out = bd.to_dict(1000)
    assert out.pop("precision")["name"] == "post"
    assert out == {
        "model": "tiny", "seq": 10, "stage": 1, "unit_bytes": 1000, "model_state": 6.4, "total": 13.44,
        "params_held": 400.0, "bytes_per_param": 16.0,  # 6400 bytes over the 400 parameters this rank holds
        "items": {"weights": 0.8, "gradients": 0.8, "optimizer": 4.8, "activations": 3.52,
                  "in-flight micro-batches": 3.52, "recompute working set": 0.0, "logits": 0.0,
                  "ZeRO-3 gathered layers": 0.0},
        "layout": {"tp": 2, "sp": False, "cp": 1, "cp_comm": "p2p", "zigzag": True, "pp": 2, "dp": 1, "ep": 1,
                   "etp": 1, "world": 4, "zero": 1, "recompute": "none", "flash": True, "micro_batch": 1,
                   "microbatches": 2, "chunks": 1, "chunked_loss": False,
                   "precision": "post", "attention_kernel": None, "fusion": "megatron", "dispatcher": "alltoall", "label": "TP2 + PP2"}}
    assert bd.to_dict()["unit_bytes"] == 1e9 and bd.to_dict()["total"] == pytest.approx(13440e-9)


@pytest.mark.parametrize("plan, stage, total", [
    (Plan(tp=2, pp=2, microbatches=1), 1, 6400 + 352 * 10 + 20 * 10),  # one micro-batch: the logits bind
    (Plan(tp=2, pp=2, microbatches=1, chunked_loss=True), 0, 6400 + 352 * 10),  # a tie goes to the first stage
    (Plan(tp=2, pp=4, microbatches=1), 3, 3200 + 176 * 10 + 20 * 10),  # the last of four stages, not the third
])
def test_breakdown_picks_the_binding_stage(plan, stage, total):
    bd = breakdown(D, plan, 10)
    assert (bd.stage, bd.total) == (stage, total)


def test_a_plans_names_are_checked_when_it_is_made():
    """A precision, fusion, dispatcher or attention kernel that parasim does not know is one line at once; each
    one it knows is taken."""
    for kernel in ("cudnn", "fa3", "fa2", "fa1", None):
        assert Plan(world=1, attention_kernel=kernel).attention_kernel == kernel
    with pytest.raises(UsageError, match=r"^attention kernel must be one of cudnn, fa3, fa2, fa1, got 'fa4'$"):
        Plan(world=1, attention_kernel="fa4")
    with pytest.raises(UsageError, match="fp7"):
        Plan(world=1, precision="fp7")


def test_activations_at_four_bytes_a_value_keep_masks_at_one():
    """fp32 training: each kept value takes 4 bytes, a dropout mask still 1. Korthikanti's 34 sbh at 2 bytes is
    32 sbh of values (16 sbh of them) and 2 sbh of masks, so 66 sbh at 4 bytes; the scores' 5 as^2 b (softmax 2,
    its dropout's output 2, mask 1) become 9 as^2 b. D: h = 8, a = 2, s = 16, 4 layers."""
    s, h, a, layers = 16, 8, 2, 4
    flash = breakdown(D, Plan(precision="fp32"), s).items["activations"]
    naive = breakdown(D, Plan(precision="fp32", flash=False), s).items["activations"]
    assert flash == layers * 66 * s * h
    assert naive - flash == layers * 9 * a * s * s


def test_a_shared_expert_of_its_own_width_keeps_its_own_activations():
    """A shared expert twice as wide as the routed ones (Qwen2-MoE's kind): the MoE layers keep what
    layer_bytes_per_token gives for that width, not the routed experts' width."""
    wide = ModelSpec("tiny-moe", layers=4, hidden=4, heads=2, vocab=8, experts=4, top_k=2, expert_ffn=8,
                     shared_experts=1, shared_expert_ffn=16, dense_layers=2)
    s = 8
    got = breakdown(wide, Plan(), s).items["activations"] - breakdown(MOE, Plan(), s).items["activations"]
    kw = dict(h=4, heads=2, kv=2, ffn=wide.ffn_size, tp=1, sp=False, mats=wide.mlp_mats, dropout=True, top_k=2,
              expert_ffn=8, shared=1, etp=1)
    per_token = layer_bytes_per_token(**kw, shared_ffn=16) - layer_bytes_per_token(**kw, shared_ffn=8)
    assert per_token > 0 and got == 2 * s * per_token  # the two MoE layers


def test_a_plans_precision_and_attention_kernel_are_checked_when_it_is_made():
    with pytest.raises(UsageError, match="nonsense"):
        Plan(precision="nonsense")
    with pytest.raises(UsageError, match="nonsense"):
        Plan(attention_kernel="nonsense")
    assert [Plan(attention_kernel=k).attention_kernel for k in ("cudnn", "fa3", "fa2", "fa1")] == [
        "cudnn", "fa3", "fa2", "fa1"]

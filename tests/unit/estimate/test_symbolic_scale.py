"""The estimator against symbolic runs at real size: the 27B model's whole training step (train/step.py,
ranks folded) at each of the post's nine longest-sequence layouts, at the longest sequence the estimator
finds for it. A GPU's activations at its peak equal the estimator's (activations, the micro-batches 1F1B
keeps in flight, and under full recomputation one layer's working set: the engine re-runs one layer at a
time, the estimator's default allows two); its weights, gradients and optimizer share equal the estimator's
per-layer parameter count in the training dtypes (the post's: 2 bytes of weights, 2 of gradients, 12 of FP32
master weights and Adam moments a value). (The estimator's model state counts the preset's round 27e9
parameters and the embeddings, which the step has no layer for: tested against the layers instead.)"""
from dataclasses import replace

import pytest

import parasim
from parasim.estimate import Plan, breakdown, fit, get_model, gpu_presets
from parasim.estimate.fit import LONGEST_ROWS
from parasim.estimate.models import layer_param_count
from parasim.train.step import make_step
from parasim.layout import Layout
from parasim.engine.symbolic.fold import fold_of

ROWS = [(label, kw) for _, label, kw in LONGEST_ROWS]


@pytest.mark.parametrize("label, kw", ROWS, ids=[f"row{k}" for k in range(len(ROWS))])
def test_a_27b_step_at_its_longest_sequence_holds_what_the_estimator_says(label, kw):
    model = get_model("27b")
    # the engine models no dropout under CP; under full recomputation it re-runs one layer at a time
    plan = Plan(**kw, dropout=kw.get("cp", 1) == 1, working_layers=1)
    step = 2 * plan.cp * plan.tp
    seq = int(fit(model, Plan(**kw), gpu_presets()["h200"].usable).seq) // step * step
    layout = Layout(tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, sp=plan.sp,
                    model=replace(model, seq=seq, flash=plan.flash, dropout=0.1 if plan.dropout else 0.0))
    result = parasim.run(make_step(layout, m=plan.pp, recompute=plan.recompute), layout.world, backend="symbolic",
                         fold=fold_of(layout))
    held = result.trace.peak(0)["by_kind"]  # GPU 0: the first stage, which keeps the most micro-batches
    est = breakdown(model, plan, seq).items
    assert held["activations"] == est["activations"] + est["in-flight micro-batches"] + \
        est["recompute working set"], label
    params = layer_param_count(model.hidden, model.heads, model.kv, model.ffn_size, plan.tp, model.bias)
    mine = params * (model.layers // plan.pp)
    assert held["weights"] == 2 * mine and held["gradients"] == 2 * mine
    group = plan.dp * plan.cp  # ZeRO-1 shares the optimizer state over dp x cp, padded to equal shares
    assert 0 <= held["optimizer"] - 12 * mine / group < 12 * group


GATHERED = [(k, label, {**kw, "cp_comm": "all_gather"}) for k, (label, kw) in enumerate(ROWS) if kw.get("cp", 1) > 1]


@pytest.mark.parametrize("label, kw, precision", [(label, kw, "post") for label, kw in ROWS]
                         + [(label, kw, "megatron-bf16") for label, kw in ROWS[5:6]]
                         + [(label, kw, "post") for _, label, kw in GATHERED],
                         ids=[f"row{k}" for k in range(len(ROWS))] + ["row5-megatron"]
                         + [f"row{k}-cp-all-gather" for k, _, _ in GATHERED])
def test_a_27b_steps_bytes_per_axis_are_the_estimators(label, kw, precision):
    """What the busiest GPU sends per (axis, collective) in one step at 4,096 tokens, the run at the plan's
    precision, against `step_traffic` at the same precision; the data-parallel sums against `dp_traffic` over
    the layers' own parameters (the estimator's model state counts the preset's round 27e9 and the embeddings),
    gradients reduced at the precision's (the post's BF16, 2 bytes; Megatron's FP32, 4) and weights gathered in
    BF16 (2)."""
    from parasim.estimate.traffic import dp_traffic, step_traffic
    model, seq = get_model("27b"), 4096
    plan = Plan(**kw, dropout=kw.get("cp", 1) == 1, precision=precision)
    layout = Layout(tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, sp=plan.sp, cp_comm=plan.cp_comm,
                    model=replace(model, seq=seq, flash=plan.flash, dropout=0.1 if plan.dropout else 0.0))
    trace = parasim.run(make_step(layout, m=plan.pp, recompute=plan.recompute), layout.world, backend="symbolic",
                        fold=fold_of(layout), precision=precision).trace
    sent: dict = {}
    for e in trace.events:
        for m in e.members:
            key = (e.group.name.replace("dp-cp", "dp"), e.op)
            sent.setdefault(key, {}).setdefault(m.rank, 0)
            sent[key][m.rank] += m.sent
    busiest = {k: max(v.values()) for k, v in sent.items() if max(v.values())}
    want = {k: v for k, v in step_traffic(model, plan, seq).items() if k[0] != "dp"}
    params = layer_param_count(model.hidden, model.heads, model.kv, model.ffn_size, plan.tp, model.bias)
    reduced = {"post": 2, "megatron-bf16": 4}[precision]
    want.update(dp_traffic(params * model.layers / plan.pp, plan.dp * plan.cp, 1, itemsize=reduced, param_itemsize=2))
    assert busiest == pytest.approx(want, rel=1e-12), label

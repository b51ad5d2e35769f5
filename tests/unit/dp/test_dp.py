"""Data parallelism and ZeRO-1/2 as one optimizer: every stage's Adam step equals one device's, with and
without gradient buckets; what a rank holds, in the post's training dtypes, is 16, 5.5 and 3.75 bytes per
parameter at dp = 8; ZeRO's reduce-scatter + all-gather move the bytes DP's all-reduce moves."""
import numpy as np
import pytest

import parasim
from parasim.dp.sharded import ShardedAdam
from parasim.errors import UsageError
from parasim.train.whole import whole_layers
from parasim.layout import ModelSpec
from parasim.nn import Saved
from parasim.nn.layer import Stack

SHAPE = ModelSpec(hidden=8, heads=2, ffn=16)  # 600 parameters per layer (biases included): 1200 in all
LR = 0.01


def _model(ctx):
    return Stack(whole_layers(ctx, SHAPE, 0, 2))  # the examples' small model, whole on each rank


def _grads(ctx, stack, seqs):
    for s in seqs:  # each sequence's loss sum(y * target); gradients accumulate over the sequences
        y, cache = stack.forward(ctx.shared_rng(f"x{s}").normal((4, 1, 8)), Saved())
        stack.backward(cache, ctx.shared_rng(f"t{s}").normal((4, 1, 8)))
    return stack.grads


def _adam(w, g, m, v, t, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
    """Adam written out here (Kingma and Ba), so the reference does not use the optimizers under test."""
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    return w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), m, v


def _one_device(n, steps=1, per_rank=1):
    """All n ranks' sequences on one device: the gradient of the mean over ranks of their losses, Adam."""
    def program(ctx):
        stack = _model(ctx)
        w = stack.params()
        m, v = ({k: np.zeros_like(x) for k, x in w.items()} for _ in range(2))
        for t in range(1, steps + 1):
            for layer in stack.layers:
                layer.zero_grad()
            seqs = [(t, r, i) for r in range(n) for i in range(per_rank)] if steps > 1 else range(n)
            grads = {k: g / n for k, g in _grads(ctx, stack, seqs).items()}
            for k in w:
                w[k], m[k], v[k] = _adam(w[k], grads[k], m[k], v[k], t)
            stack.load(w)
        return w
    return parasim.run(program, 1).values[0]


def _data_parallel(n, stage, bucket=None):
    def program(ctx):
        stack = _model(ctx)
        grads = _grads(ctx, stack, [ctx.rank])
        opt = ShardedAdam(ctx, ctx.new_group(range(n), "dp"), stack.params(), stage, lr=LR, bucket=bucket)
        return opt.step(grads), opt.held()
    return parasim.run(program, n)


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("bucket", [None, 100, 7])
def test_every_stage_steps_like_one_device(stage, bucket):
    want = _one_device(4)
    res = _data_parallel(4, stage, bucket)
    for new, _ in res.values:
        assert set(new) == set(want)
        for k in want:
            assert np.max(np.abs(new[k] - want[k])) < 1e-12, k
    if bucket == 7:  # buckets of 7 values (8 for ZeRO: a bucket splits evenly over 4): many collectives
        assert len(res.trace.events) >= 1200 // 8


def test_bytes_per_parameter_held_at_dp_8():
    """16 (DP: 2 + 2 + 12), 5.5 (ZeRO-1: 2 + 2 + 12/8), 3.75 (ZeRO-2: 2 + 2/8 + 12/8), from the arrays kept."""
    per = {}
    for stage in (0, 1, 2):
        held = _data_parallel(8, stage).values[0][1]
        per[stage] = sum(held.values()) / 1200
    assert per == {0: 16.0, 1: 5.5, 2: 3.75}


def test_zero_moves_the_bytes_dp_moves():
    sent = {s: sum(m.sent for e in _data_parallel(4, s).trace.events for m in e.members) for s in (0, 1, 2)}
    assert sent[0] == sent[1] == sent[2] > 0


def test_bad_settings_are_refused():
    def program(ctx):
        with pytest.raises(UsageError, match="ZeRO stage must be 0, 1 or 2 here"):
            ShardedAdam(ctx, ctx.new_group([0], "dp"), {"w": ctx.xp.ones(2)}, 3)
        with pytest.raises(UsageError, match="bucket must hold at least one value"):
            ShardedAdam(ctx, ctx.new_group([0], "dp"), {"w": ctx.xp.ones(2)}, 1, bucket=0)
    parasim.run(program, 1)


def _zero3(n):
    from parasim.dp.zero3 import Zero3

    def program(ctx):
        dp = ctx.new_group(range(n), "dp")
        plain = _model(ctx)
        layers = [Zero3(ctx, layer, dp, lr=LR) for layer in plain.layers]
        stack = Stack(layers)
        assert all(w.size == 0 for w in plain.layers[0].params().values())  # sharded at rest: nothing whole
        _grads(ctx, stack, [ctx.rank])
        for z in layers:
            z.step()
        held = {k: sum(z.held()[k] for z in layers) for k in ("weights", "gradients", "optimizer")}
        return stack.params(), held, max(z.peak_gathered for z in layers)
    return parasim.run(program, n)


def test_zero3_steps_like_one_device_and_holds_2_bytes_per_parameter():
    want = _one_device(4)
    for new, _, _ in _zero3(4).values:
        for k in want:
            assert np.max(np.abs(new[k] - want[k])) < 1e-12, k
    res = _zero3(8)
    _, held, peak = res.values[0]
    assert sum(held.values()) / 1200 == 2.0  # (2 + 2 + 12) / 8
    assert peak == 600 + 600 // 8  # while a layer is gathered: its 600 values whole, beside its shard


def test_zero3_moves_one_and_a_half_times_dp():
    """Per step: all-gather before forward and before backward, reduce-scatter after: 3 halves of the
    all-reduce DP does (the checks' own gathers left out)."""
    def sent(res, skip=""):
        return sum(m.sent for e in res.trace.events for m in e.members if not (skip and skip in e.label))
    assert sent(_zero3(4), "for a check") == 1.5 * sent(_data_parallel(4, 0))


def test_zero3_accumulates_micro_batches_and_steps_again_like_one_device():
    """Two backward passes per step (two micro-batches), two steps: each backward's gradient is
    reduce-scattered and added to the shard, and the layer forgets it (no double count)."""
    from parasim.dp.zero3 import Zero3
    n = 4
    want = _one_device(n, steps=2, per_rank=2)

    def program(ctx):
        dp = ctx.new_group(range(n), "dp")
        layers = [Zero3(ctx, layer, dp, lr=LR) for layer in _model(ctx).layers]
        stack = Stack(layers)
        for t in (1, 2):
            _grads(ctx, stack, [(t, ctx.rank, 0), (t, ctx.rank, 1)])
            for z in layers:
                z.step()
        return stack.params()
    res = parasim.run(program, n)
    assert sum(e.op == "reduce_scatter" for e in res.trace.events) == 2 * 2 * 2  # layers x micro-batches x steps
    # the key bias's gradient is zero but for rounding (softmax ignores a shift of every key), and Adam turns
    # that noise into steps of lr * noise / eps: those weights agree to 1e-10, every other one to 1e-12
    for new in res.values:
        for k in want:
            tol = 1e-9 if k.endswith("qkv.bias") else 1e-12
            assert np.max(np.abs(new[k] - want[k])) < tol, k


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_clipping_by_the_global_norm_equals_one_device(stage):
    """Every stage clips the averaged gradient by the norm one device would compute (ZeRO adds its shares'
    squares with one all-reduce), then takes Adam's step."""
    n, max_norm = 4, 0.5

    def one(ctx):
        stack = _model(ctx)
        grads = {k: g / n for k, g in _grads(ctx, stack, range(n)).items()}
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        coef = min(1.0, max_norm / (norm + 1e-6))
        w = stack.params()
        return coef, {k: _adam(w[k], grads[k] * coef, 0, 0, 1)[0] for k in w}
    coef, want = parasim.run(one, 1).values[0]
    assert coef < 0.5  # the clip bites

    def program(ctx):
        stack = _model(ctx)
        opt = ShardedAdam(ctx, ctx.new_group(range(n), "dp"), stack.params(), stage, lr=LR, bucket=100)
        return opt.step(_grads(ctx, stack, [ctx.rank]), max_norm=max_norm)
    res = parasim.run(program, n)
    for new in res.values:
        for k in want:
            assert np.max(np.abs(new[k] - want[k])) < 1e-12, k
    extra = [e for e in res.trace.events if "clipping" in (e.label or "")]
    assert len(extra) == (0 if stage == 0 else 1)  # DP holds the whole averaged gradient already

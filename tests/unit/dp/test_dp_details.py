"""What a DP/ZeRO step's values cannot show: which group each collective runs on and its label, how the
buckets and the padding fall, and under which names and sizes each buffer is held. Expected values are
written out here."""
import numpy as np
import pytest

import parasim
from parasim.dp.sharded import ShardedAdam
from parasim.dp.zero3 import Zero3
from parasim.layout import ModelSpec
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights

LR, EPS = 0.01, 1e-8
G = np.arange(1.0, 11.0)  # rank r's gradient of the 10-value weight is G * (r + 1)


def _pairs(ctx):
    """Two data-parallel groups of two ({0, 1} and {2, 3}); each rank gets its own."""
    groups = [ctx.new_group(pair, "dp") for pair in ([0, 1], [2, 3])]
    return groups[ctx.rank // 2]


def _sharded(stage, bucket=None):
    def program(ctx):
        g = _pairs(ctx)
        opt = ShardedAdam(ctx, g, {"w": ctx.asarray(np.zeros(10))}, stage, lr=LR, bucket=bucket)
        before = opt.held()
        new = opt.step({"w": ctx.asarray(G * (ctx.rank + 1))})
        return new["w"], before, opt.held(), [opt.ranges(me) for me in range(2)]
    return parasim.run(program, 4)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_step_over_a_group_of_two_averages_that_pair_only(stage):
    res = _sharded(stage)
    for r, (new, *_rest) in enumerate(res.values):
        mean = G * (1.5 if r < 2 else 3.5)  # the pair's average: (1 + 2) / 2 or (3 + 4) / 2 times G
        assert np.allclose(new, -LR * mean / (np.abs(mean) + EPS), rtol=0, atol=1e-15)  # Adam's first step
    assert {(e.group.name, e.group.ranks) for e in res.trace.events} == {("dp", (0, 1)), ("dp", (2, 3))}


def test_labels_buckets_and_padding():
    """10 values over a pair: DP's buckets of 3 are 3, 3, 3, 1; ZeRO's split evenly over the pair, so
    buckets of 3 become 2 (the largest even size below), five of them; without buckets ZeRO pads to 10."""
    dp = _sharded(0, bucket=3)
    assert [e.members[0].ins[0].shape for e in dp.trace.events if 0 in e.ranks] == [(3,), (3,), (3,), (1,)]
    assert {e.label for e in dp.trace.events} == {"DP over dp: all-reduce a gradient bucket"}
    z1 = _sharded(1, bucket=3)
    ops = [(e.op, e.members[0].ins[0].shape, e.label) for e in z1.trace.events if 0 in e.ranks]
    assert ops == [("reduce_scatter", (2,), "ZeRO-1 over dp: reduce-scatter a gradient bucket")] * 5 + [
        ("all_gather", (1,), "ZeRO-1 over dp: all-gather updated weights")] * 5
    assert z1.values[0][3] == [[(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)], [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]]
    assert _sharded(2).values[0][3] == [[(0, 5)], [(5, 10)]]
    assert _sharded(0).values[0][3] == [[(0, 10)], [(0, 10)]]
    one = _sharded(0, bucket=1)  # a bucket of one value is allowed
    assert sum(1 for e in one.trace.events if 0 in e.ranks) == 10


def test_odd_sizes_are_padded_to_equal_shares():
    def program(ctx):
        g = _pairs(ctx)
        opt = ShardedAdam(ctx, g, {"w": ctx.asarray(np.zeros(7))}, 1, lr=LR)
        new = opt.step({"w": ctx.asarray(np.arange(1.0, 8.0))})
        return new["w"], opt.ranges(), opt.padded
    for r, (new, ranges, padded) in enumerate(parasim.run(program, 4).values):
        assert padded == 8 and ranges == ([(0, 4)] if r % 2 == 0 else [(4, 8)])
        assert new.shape == (7,) and np.allclose(new, -LR * np.ones(7), atol=1e-9)


@pytest.mark.parametrize("stage, want", [
    (0, ({"weights": 20, "gradients": 20, "optimizer": 120}, {"weights": 20, "gradients": 20, "optimizer": 120})),
    (1, ({"weights": 20, "gradients": 20, "optimizer": 60}, {"weights": 20, "gradients": 20, "optimizer": 60})),
    (2, ({"weights": 20, "gradients": 20, "optimizer": 60}, {"weights": 20, "gradients": 10, "optimizer": 60})),
])
def test_held_before_and_after_a_step(stage, want):
    _, before, after, _ = _sharded(stage).values[0]
    assert (before, after) == want


def test_what_the_trace_is_told_a_sharded_optimizer_holds():
    t = _sharded(2, bucket=4).trace
    held = [(m.text, m.data.get("kind", "freed"), m.data["bytes"]) for m in t.marks if m.kind == "held" and m.rank == 0]
    bucket, freed = ("ZeRO-2 over dp: a whole gradient bucket", "gradients"), ("ZeRO-2 over dp: a whole gradient bucket", "freed", 0)
    assert held == [("ZeRO-2 over dp: weights", "weights", 20), ("ZeRO-2 over dp: gradients", "gradients", 10),
                    ("ZeRO-2 over dp: optimizer state", "optimizer", 60),
                    (*bucket, 8), freed, (*bucket, 8), freed, (*bucket, 4), freed]
    named = _sharded(1).trace
    assert {m.text.split(":")[0] for m in named.marks if m.kind == "held"} == {"ZeRO-1 over dp"}


SHAPE = ModelSpec(hidden=8, heads=2, ffn=16)  # 600 values per layer


def _zero3(keyed=True):
    def program(ctx):
        g = _pairs(ctx)
        layer = TransformerLayer(ParallelContext(ctx), SHAPE, layer_weights(ctx, SHAPE, "L0"), key="L0")
        if not keyed:
            del layer.key
        z = Zero3(ctx, layer, g, lr=LR)
        y, cache = z.forward(ctx.shared_rng(f"x{ctx.rank}").normal((4, 1, 8)), Saved())
        z.backward(cache, ctx.shared_rng(f"t{ctx.rank}").normal((4, 1, 8)))
        z.step()
        shard = z.shard.copy()
        whole = z.params()
        return shard, whole, z.m.shape, z.v.shape
    return parasim.run(program, 4)


def test_zero3_collectives_run_on_its_group_with_their_labels():
    res = _zero3()
    ev = [(e.op, e.group.ranks, e.label) for e in res.trace.events if 0 in e.ranks]
    name = "ZeRO-3 over dp: L0"
    assert ev == [("all_gather", (0, 1), f"{name}: all-gather weights before forward"),
                  ("all_gather", (0, 1), f"{name}: all-gather weights before backward"),
                  ("reduce_scatter", (0, 1), f"{name}: reduce-scatter gradients"),
                  ("all_gather", (0, 1), f"{name}: all-gather for a check")]
    shard, whole, m_shape, v_shape = res.values[0]
    assert shard.shape == m_shape == v_shape == (300,)  # Adam's moments: arrays of the shard's size
    assert sum(w.size for w in whole.values()) == 600
    held = [(m.text, m.data["bytes"]) for m in res.trace.marks if m.kind == "held" and m.rank == 0]
    assert held[:3] == [(f"{name}: weight shard", 600), (f"{name}: gradient shard", 600),
                        (f"{name}: optimizer shard", 3600)]
    assert (f"{name}: gathered weights", 1200) in held and (f"{name}: whole gradient", 1200) in held
    plain = _zero3(keyed=False)
    assert plain.trace.events[0].label == "ZeRO-3 over dp: layer: all-gather weights before forward"


def test_zero3_pads_an_odd_layer_and_loads_new_weights_into_its_shard():
    odd = ModelSpec(hidden=8, heads=2, ffn=15)  # 583 values: a pair holds 292 each, one of them padding

    def program(ctx):
        g = _pairs(ctx)
        layer = TransformerLayer(ParallelContext(ctx), odd, layer_weights(ctx, odd, "L0"), key="L0")
        first = {k: w.copy() for k, w in layer.params().items()}
        z = Zero3(ctx, layer, g, lr=LR)
        assert z.m.shape == z.v.shape == (292,)  # Adam's moments start as zeros of the shard's size
        shape, back = z.shard.shape, z.params()
        z.load({"ln1.weight": first["ln1.weight"] + 1})
        return first, shape, back, z.params()
    for first, shape, back, loaded in parasim.run(program, 4).values:
        assert shape == (292,) and sum(w.size for w in first.values()) == 583
        assert all(np.array_equal(back[k], first[k]) for k in first)
        assert np.array_equal(loaded["ln1.weight"], first["ln1.weight"] + 1)
        assert all(np.array_equal(loaded[k], first[k]) for k in first if k != "ln1.weight")


def test_plain_dp_does_not_pad():
    def program(ctx):
        return ShardedAdam(ctx, _pairs(ctx), {"w": ctx.asarray(np.zeros(7))}, 0).padded
    assert parasim.run(program, 4).values == [7] * 4


def test_default_learning_rate_is_adams_usual_one():
    """torch.optim.Adam's default, 1e-3, for both optimizers when none is given."""
    def program(ctx):
        layer = TransformerLayer(ParallelContext(ctx), SHAPE, layer_weights(ctx, SHAPE, "L0"), key="L0")
        g = ctx.new_group([0], "dp")
        return ShardedAdam(ctx, g, {"w": ctx.asarray(np.zeros(3))}, 0).lr, Zero3(ctx, layer, g).lr
    assert parasim.run(program, 1).values[0] == (1e-3, 1e-3)

"""Small pieces of parasim.nn checked by hand: placements' names, which vocabulary rows a rank owns,
gradients that add up over repeated backward passes (micro-batches)."""
import numpy as np
import pytest

import parasim
from layer_check import run_parallel
from parasim.nn import Saved, ParallelContext
from parasim.nn.core import Partial, Replicate, Shard
from parasim.nn.embedding import VocabParallelEmbedding, owned_one_hot
from parasim.layout import ModelSpec


def test_placements_name_themselves():
    assert [str(p) for p in (Replicate(), Shard(1), Partial())] == ["replicated", "sharded on dim 1", "partial sum"]


def test_each_rank_owns_a_contiguous_block_of_the_vocabulary():
    ids = np.array([[0, 3, 4, 7, 5]])

    def prog(ctx):
        return owned_one_hot(ParallelContext(ctx, ctx.new_group([0, 1], "tp")), ctx.asarray(ids, "int64"), 8)

    rank0, rank1 = parasim.run(prog, world=2).values
    # rank 0 owns ids 0-3 (columns 0-3), rank 1 ids 4-7; a row is all zero where the other rank owns the id
    assert rank0.dtype == np.float64
    assert rank0[0].tolist() == [[1, 0, 0, 0], [0, 0, 0, 1], [0] * 4, [0] * 4, [0] * 4]
    assert rank1[0].tolist() == [[0] * 4, [0] * 4, [1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]]
    shapes = [(x.shape, x.dtype) for x in parasim.run(prog, world=2, backend="symbolic").values]
    assert shapes == [((1, 5, 4), np.float64)] * 2  # on symbolic ranks too: a block of 8 // 2 ids each


def test_embedding_grads_add_up_over_backward_passes():
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1], [3], [1]])  # [s=3, b=1]: token 1 twice
    dy = np.arange(9.0).reshape(3, 1, 3)

    def prog(ctx):
        emb = VocabParallelEmbedding(ParallelContext(ctx), table)
        y, cache = emb.forward(ctx.asarray(ids, "int64"), Saved())
        emb.backward(cache, ctx.asarray(dy))
        once = emb.grads["weight"].copy()
        emb.backward(cache, ctx.asarray(dy))
        return y, once, emb.grads["weight"]

    ((y, once, twice),) = parasim.run(prog, world=1).values
    assert y[:, 0].tolist() == [table[1].tolist(), table[3].tolist(), table[1].tolist()]
    # row 1 gets dy of tokens 0 and 2, row 3 that of token 1, rows 0 and 2 nothing
    assert once.tolist() == [[0, 0, 0], [0 + 6, 1 + 7, 2 + 8], [0, 0, 0], [3, 4, 5]]
    assert twice.tolist() == (2 * once).tolist()


def test_zero1_first_step_moves_each_weight_by_lr_against_its_summed_gradient():
    from parasim.dp.zero import Zero1Adam
    w = np.arange(5.0) / 10

    def prog(ctx):
        g = ctx.new_group([0, 1], "dp")
        opt = Zero1Adam(ctx, g, {"w": ctx.asarray(w, "float32"), "b": ctx.asarray([[1.0]], "float32")})
        grads = {"w": ctx.asarray([1.0, -2.0, 3.0, -1.0, 0.5], "float32") * (ctx.rank + 1),
                 "b": ctx.asarray([[-1.0]], "float32")}
        new, sq = opt.step(grads)
        return new, sq, opt.state_elements

    res = parasim.run(prog, world=2)
    # Adam's first step is m_hat / sqrt(v_hat) = g / |g|: each weight moves by lr (1e-3 by default)
    # against the sign of its gradient summed over the two ranks
    for new, sq, state in res.values:
        assert new["w"].dtype == np.float32 and new["w"].shape == (5,) and new["b"].shape == (1, 1)
        assert np.allclose(new["w"], w - 1e-3 * np.array([1, -1, 1, -1, 1]), atol=1e-6)
        assert np.allclose(new["b"], [[1.0 + 1e-3]], atol=1e-6)
        assert state == 3 * 3  # 6 values padded to 2 shares of 3: master, m and v of one share
    # the summed gradient is 3x rank 0's; the flat buffer (keys sorted: b, w) is [b, w0..w4], split 3 + 3
    assert res.values[0][1] == pytest.approx({"b": 4.0, "w": 9 * (1 + 4)})
    assert res.values[1][1] == pytest.approx({"w": 9 * (9 + 1 + 0.25), "b": 0.0})
    assert [(e.op, e.label) for e in res.trace.events] == [
        ("reduce_scatter", "zero-1: reduce-scatter the gradients"), ("all_gather", "zero-1: all-gather the updated weights")]


@pytest.mark.parametrize("shape", [
    ModelSpec(hidden=8, heads=2, kv_heads=1, dropout=0.2, act="relu", norm="rmsnorm"),
    ModelSpec(hidden=8, heads=2, dropout=0.2, experts=4, top_k=2)])
def test_a_float32_layer_stays_float32(shape):
    """Nothing inside a layer may fall back to float64 (numpy's default): real runs train in 16 or 32 bits."""
    res = run_parallel(shape, 2, True, 4, 2, dtype="float32")
    for v in res.values:
        assert v["y"].dtype == v["dx"].dtype == np.float32
        assert {k: g.dtype for k, g in v["grads"].items()} == {k: np.float32 for k in v["grads"]}


def test_zero1_pads_in_the_weights_dtype():
    """One float32 tensor of 5 over 2 ranks: the flat buffer is padded to 6 with float32 zeros, so the
    shares, Adam's m and v, and the updated weight all stay float32."""
    from parasim.dp.zero import Zero1Adam

    def prog(ctx):
        opt = Zero1Adam(ctx, ctx.new_group([0, 1], "dp"), {"w": ctx.asarray(np.arange(5.0), "float32")})
        shapes = [(a.shape, a.dtype) for a in (opt.master, opt.m, opt.v)]
        new, _ = opt.step({"w": ctx.asarray(np.ones(5), "float32")})
        return shapes, new["w"]

    for shapes, w in parasim.run(prog, world=2).values:
        assert shapes == [((3,), np.float32)] * 3
        assert w.dtype == np.float32 and np.allclose(w, np.arange(5.0) - 1e-3, atol=1e-6)


@pytest.mark.parametrize("experts", [0, 2])
def test_a_layer_loads_what_it_is_given_and_nothing_else(experts):
    """params() names every weight (TP shards, and with experts the router and each expert's own);
    load() replaces the named ones and leaves the rest."""
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=4, heads=2, ffn=8, experts=experts, top_k=1 if experts else 0)

    def prog(ctx):
        given = layer_weights(ctx, shape, "L0")
        layer = TransformerLayer(ParallelContext(ctx), shape, given, key="L0")
        before = {k: np.array(v, copy=True) for k, v in layer.params().items()}
        changed = "moe.expert2.w1" if experts else "mlp.fc1.weight"
        layer.load({changed: before[changed] + 1.0})
        return before, layer.params(), changed, given

    before, after, changed, given = parasim.run(prog, world=1).values[0]
    for e in range(1, experts + 1):  # expert n (counted from 1) is the layer's weights' expert n - 1
        assert np.array_equal(before[f"moe.expert{e}.w1"], given[f"experts.{e - 1}.w1"])
    mlp = (["moe.router"] + [f"moe.expert{e}.{w}" for e in (1, 2) for w in ("w1", "b1", "w2", "b2")] if experts
           else ["mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"])
    assert sorted(after) == sorted(["ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.out.weight",
                                    "attn.out.bias", "ln2.weight", "ln2.bias", *mlp])
    for k, v in after.items():
        assert np.array_equal(v, before[k] + 1.0 if k == changed else before[k]), k


def test_dropout_keeps_its_mask_at_one_byte_an_element():
    from parasim.nn.dropout import Dropout

    def prog(ctx):
        saved = Saved()
        drop = Dropout(ParallelContext(ctx), 0.5, "k")
        y, mask = drop.forward(ctx.xp.ones((2, 3)), saved, (2, 3))
        named = Dropout(ParallelContext(ctx), 0.5, "k", name="attn.dropout")
        named.forward(ctx.xp.ones((2, 3)), saved, (2, 3))
        return saved.by_name(), y, mask

    by_name, y, mask = parasim.run(prog, world=1).values[0]
    assert by_name == {"dropout.mask": 6, "attn.dropout.mask": 6}  # the default name, then a given one
    assert np.array_equal(y, mask * 2.0)  # kept elements scaled by 1 / (1 - p)


def test_a_shard_owns_its_memory():
    """Rank 1 of 2 takes columns 2-3 of a 2x4 tensor as a copy: writing to it leaves the whole tensor as it
    was (on virtual ranks every rank slices the same array)."""
    full = np.arange(8.0).reshape(2, 4)

    def prog(ctx):
        piece = ParallelContext(ctx, ctx.new_group([0, 1], "tp")).shard(full, 1)
        got = piece.copy()
        piece[...] = -1.0
        return got

    assert parasim.run(prog, world=2).values[1].tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert full.tolist() == np.arange(8.0).reshape(2, 4).tolist()


@pytest.mark.parametrize("dtype, ok", [("float32", True), ("complex64", True), ("bfloat16", True), ("int32", False)])
def test_avg_needs_a_floating_dtype(dtype, ok):
    """bfloat16 comes as a torch dtype name (numpy has none)."""
    from parasim.comm.interface import check_reduce_op
    from parasim.errors import CollectiveError
    if ok:
        check_reduce_op("avg", dtype)
    else:
        with pytest.raises(CollectiveError, match="op='avg' needs a floating dtype, got int32"):
            check_reduce_op("avg", dtype)


def test_a_layer_defaults_to_key_and_name_layer():
    """The default key seeds the dropout masks exactly as key="layer" does, and the default name labels
    what forward keeps."""
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=4, heads=2, ffn=8, dropout=0.5)

    def prog(ctx):
        x = ctx.shared_rng("x").normal((3, 1, 4))
        out = []
        for kw in ({}, {"key": "layer", "name": "layer"}, {"key": "other"}):
            saved = Saved()
            y, _ = TransformerLayer(ParallelContext(ctx), shape, layer_weights(ctx, shape, "L0"), **kw).forward(x, saved)
            out.append((y, sorted(saved.by_name())))
        return out

    (y0, names0), (y1, names1), (y2, _) = parasim.run(prog, world=1).values[0]
    assert np.array_equal(y0, y1) and not np.array_equal(y0, y2) and names0 == names1
    assert "layer.attn dropout.mask" in names0 and all(n.startswith("layer.") for n in names0)


def test_an_moe_layer_passes_its_name_and_activation_on():
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=4, heads=2, ffn=8, experts=2, top_k=1, act="relu", dropout=0.0)

    def prog(ctx):
        layer = TransformerLayer(ParallelContext(ctx), shape, layer_weights(ctx, shape, "L0"), name="L0")
        saved = Saved()
        layer.forward(ctx.shared_rng("x").normal((3, 1, 4)), saved)
        return layer.mlp.act, sorted(saved.by_name())

    act, names = parasim.run(prog, world=1).values[0]
    assert act == "relu" and "L0.moe.router input" in names and all(n.startswith("L0.") for n in names)


def test_drawn_weights_are_scaled_to_their_fan_in():
    """Matrices have std rows^-1/2 (activations stay about 1), biases std 0.1, and no two weights share a
    draw. h = 256, ffn = 1024: stds 1/16 and 1/32 within 3%."""
    from parasim.nn.layer import layer_weights
    shape = ModelSpec(hidden=256, heads=4, ffn=1024)
    (w,) = parasim.run(lambda ctx: layer_weights(ctx, shape, "L0"), world=1).values
    assert abs(np.std(w["wq"]) * 16 - 1) < 0.03 and abs(np.std(w["w2"]) * 32 - 1) < 0.03
    assert abs(np.std(w["b1"]) / 0.1 - 1) < 0.1 and abs(np.std(w["bq"]) / 0.1 - 1) < 0.15
    for n in ("ln1", "ln2"):  # norms start near the identity: weights about 1, biases about 0, std 0.1
        assert abs(np.mean(w[f"{n}.weight"]) - 1) < 0.03 and abs(np.std(w[f"{n}.weight"]) / 0.1 - 1) < 0.15
        assert abs(np.std(w[f"{n}.bias"]) / 0.1 - 1) < 0.15
    mats = [w[k] for k in ("wq", "wk", "wv", "wo")]
    assert not any(np.array_equal(a, b) for i, a in enumerate(mats) for b in mats[i + 1:])


def test_attention_defaults_to_key_and_name_attn_and_keeps_its_softmax():
    """Default key and name are "attn": the dropout mask is drawn as with key="attn", what forward keeps is
    labelled "attn ...", and without flash the softmax is kept (flash=True keeps no [s, s] tensor)."""
    from parasim.nn.attention import AttentionOptions, AttentionWeights, HeadCounts, ParallelAttention
    rng = np.random.default_rng(0)
    w = {k: rng.normal(size=(4, 4)) for k in ("wq", "wk", "wv", "wo")}

    def prog(ctx):
        x = ctx.shared_rng("x").normal((3, 1, 4))
        out = []
        for kw in ({}, {"key": "attn", "name": "attn", "flash": False}, {"key": "other"}, {"flash": True},
                   {"dropout": 0.0}):
            saved = Saved()
            opts = {"dropout": 0.5, **{k: v for k, v in kw.items() if k in ("dropout", "flash")}}
            names = {k: v for k, v in kw.items() if k in ("key", "name")}
            attn = ParallelAttention(ParallelContext(ctx), AttentionWeights.of({k: ctx.asarray(v) for k, v in w.items()}),
                                     HeadCounts(2), AttentionOptions(**opts), **names)
            y, cache = attn.forward(x, saved)
            # cache[4]: what backward reuses of the softmax; flash keeps nothing there and recomputes
            out.append((y, sorted(saved.by_name()), cache[4] is None))
        return out

    (y0, n0, f0), (y1, n1, _), (y2, _, _), (y3, n3, f3), (_, n4, f4) = parasim.run(prog, world=1).values[0]
    assert (f0, f3, f4) == (False, True, False)
    assert n4 == sorted(["attn.qkv.input", "attn.q", "attn.k", "attn.v", "attn.softmax", "attn.out.input"])
    assert np.array_equal(y0, y1) and not np.array_equal(y0, y2) and n0 == n1
    assert np.array_equal(y0, y3)  # flash recomputes the same mask in backward; forward is the same
    # the two linears keep their inputs; q, k, v; the softmax, its dropout mask and the dropped probabilities
    assert n0 == sorted(["attn.qkv.input", "attn.q", "attn.k", "attn.v", "attn.softmax", "attn.softmax dropout mask",
                         "attn.softmax dropout output", "attn.out.input"])
    assert n3 == sorted(["attn.qkv.input", "attn.q", "attn.k", "attn.v", "attn.out.input"])


def test_attention_under_cp_keeps_q_k_and_v_by_name():
    """With the sequence split over CP ranks, forward keeps this rank's q, k and v (for the ring's backward)
    under the attention's name, and no [s, s] softmax."""
    from parasim.layout import Layout
    from parasim.nn.attention import AttentionWeights, HeadCounts, ParallelAttention
    rng = np.random.default_rng(1)
    w = {k: rng.normal(size=(4, 4)) for k in ("wq", "wk", "wv", "wo")}

    def prog(ctx):
        t = ParallelContext(ctx, None, cp_group=ctx.groups["cp"], seq=4, cp_split="contiguous")
        attn = ParallelAttention(t, AttentionWeights.of({k: ctx.asarray(v) for k, v in w.items()}), HeadCounts(2),
                                 name="A")
        saved = Saved()
        attn.forward(ctx.shared_rng("x").normal((2, 1, 4)), saved)  # this rank's 2 of the 4 positions
        return saved.by_name()

    for kept in parasim.run(prog, layout=Layout(cp=2)).values:
        # q, k, v: [b=1, heads=2, s=2, d=2] = 8 values each, 2 bytes a value
        assert kept == {"A.qkv.input": 16, "A.q": 16, "A.k": 16, "A.v": 16, "A.out.input": 16}


def test_the_softmax_subtracts_each_rows_own_maximum():
    """Row 0 of the scores is ~1768, row 1 is ~0.7: a shift by the largest score of all rows would
    underflow row 1 to 0/0. Each row is shifted by its own maximum, so row 1 is the softmax of
    [0, 1/sqrt(2)] worked by hand."""
    from parasim.nn.attention import AttentionWeights, HeadCounts, ParallelAttention
    eye = np.eye(2)

    def prog(ctx):
        attn = ParallelAttention(ParallelContext(ctx), AttentionWeights(*(ctx.asarray(eye) for _ in range(4))),
                                 HeadCounts(1))
        x = ctx.asarray(np.array([[[50.0, 0.0]], [[0.0, 1.0]]]))  # [s=2, b=1, h=2]: q = k = x
        probs = attn._probs(*attn._split(attn.qkv.forward(x, Saved())[0])[:2])
        return probs[0, 0]

    (probs,) = parasim.run(prog, world=1).values
    e = np.exp(1 / np.sqrt(2))
    assert np.allclose(probs, [[1.0, 0.0], [1 / (1 + e), e / (1 + e)]], rtol=0, atol=1e-15)


@pytest.mark.parametrize("tp, cp, sp, want", [
    # SP over tp 2 without CP: rank r holds rows r*2, r*2+1 of the 4 (s=4 split 2 a rank)
    (2, 1, True, {0: ([0, 1], 4), 1: ([2, 3], 4)}),
    # TP without SP: each rank holds all 4 rows
    (2, 1, False, {0: ([0, 1, 2, 3], 4), 1: ([0, 1, 2, 3], 4)}),
    # CP 2, zigzag: rank 0 holds chunks 0 and 3 of 4 (positions 0, 3), rank 1 chunks 1 and 2
    (1, 2, False, {0: ([0, 3], 4), 1: ([1, 2], 4)}),
    # one rank, given no sequence length: every row of what it was given
    (1, 1, False, {0: ([0, 1, 2, 3], 4)}),
])
def test_a_layer_marks_its_out_and_grads_with_the_rows_each_rank_holds(tp, cp, sp, want):
    """With a tag, a layer marks its output and the gradient of its input as `tag.key.out`, `tag.key.in.grad`
    (and after-attn, after-attn.grad), each with the rows of the whole sequence this rank holds, out of s; with
    no tag nothing is marked. Rows written out by hand for s = 4."""
    from parasim.layout import Layout
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=4, heads=2, ffn=8, dropout=0.0)
    s = 4

    def prog(ctx):
        par = ParallelContext(ctx, ctx.groups["tp"] if tp > 1 else None, sp=sp,
                              cp_group=ctx.groups["cp"] if cp > 1 else None, seq=s if ctx.world > 1 else 0,
                              cp_split="zigzag")
        layer = TransformerLayer(par, shape, layer_weights(ctx, shape, "L0"), key="L0")
        n = len(par.token_positions()) if ctx.world > 1 else s
        x = ctx.shared_rng("x").normal((n, 1, 4))
        y, cache = layer.forward(x, Saved())  # no tag: no marks
        y, cache = layer.forward(x, Saved(tag="A"))
        layer.backward(cache, ctx.shared_rng("dy").normal((n, 1, 4)))

    trace = parasim.run(prog, layout=Layout(tp=tp, cp=cp)).trace
    marks = [m for m in trace.marks if m.kind == "tensor" and m.text.startswith("A.L0.")]
    assert sorted({m.text for m in marks}) == ["A.L0.after-attn", "A.L0.after-attn.grad", "A.L0.in.grad", "A.L0.out"]
    for m in marks:
        assert (m.data["rows"], m.data["size"]) == want[m.rank], (m.text, m.rank)
        assert m.data["placement"] == "Replicate()" and m.data["shape"] == [len(want[m.rank][0]), 1, 4]


def test_linear_grads_add_up_over_backward_passes():
    """Two backward passes of a column- and a row-parallel linear (one rank): each weight's and bias's gradient is
    the sum of both, written out: x^T dy and the sum of dy over tokens, for dy then 2 dy."""
    from parasim.nn.linear import ColumnParallelLinear, RowParallelLinear
    x = np.arange(6.0).reshape(3, 1, 2)                      # [s=3, b=1, in=2]
    dy = np.array([[[1.0, -1.0]], [[2.0, 0.5]], [[0.0, 3.0]]])  # [3, 1, out=2]

    def prog(ctx):
        out = []
        for make in (ColumnParallelLinear, RowParallelLinear):
            layer = make(ParallelContext(ctx), ctx.asarray(np.eye(2)), ctx.asarray(np.zeros(2)))
            _, cache = layer.forward(ctx.asarray(x), Saved())
            layer.backward(cache, ctx.asarray(dy))
            layer.backward(cache, ctx.asarray(2 * dy))
            out.append((layer.grads["weight"], layer.grads["bias"]))
        return out

    want_w = 3 * np.einsum("sbi,sbo->io", x, dy)  # dy + 2 dy
    want_b = 3 * dy.sum(axis=(0, 1))
    for w, b in parasim.run(prog, world=1).values[0]:
        assert np.allclose(w, want_w, rtol=0, atol=1e-12) and np.allclose(b, want_b, rtol=0, atol=1e-12)


def test_an_moe_layer_sends_its_tokens_over_its_ep_group():
    """Two ranks, EP 2: the layer's MoE block dispatches and combines over the context's EP group."""
    from parasim.layout import Layout
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=4, heads=2, ffn=8, experts=2, top_k=1, dropout=0.0)

    def prog(ctx):
        layer = TransformerLayer(ParallelContext.from_layout(ctx), shape, layer_weights(ctx, shape, "L0"), key="L0")
        y, cache = layer.forward(ctx.shared_rng("x").normal((3, 1, 4)), Saved())
        layer.backward(cache, ctx.xp.ones_like(y))

    events = parasim.run(prog, layout=Layout(ep=2, dp=2, model=shape)).trace.events
    a2a = [(e.group.name, e.group.ranks) for e in events if e.op == "all_to_all"]
    assert len(a2a) == 4 and set(a2a) == {("ep", (0, 1))}

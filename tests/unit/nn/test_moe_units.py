"""The MoE block's bookkeeping on a routing chosen by hand: what forward keeps (by layer and name), every
all-to-all with its words and bytes, the router-gradient sum under SP, bias-free experts, weights that are
the layer's own, and the helpers' edge cases (no tokens, large or uneven router scores)."""
import numpy as np
import pytest

import parasim
from parasim.nn import Saved, ParallelContext
from parasim.nn.moe import MoE, add_at, gather_rounds, one_hot, softmax, split_rows

# h = 2, four experts (two per EP rank). Token logits are x @ ROUTER: [1, 0] -> [2, 0, 0, 1] picks expert 0,
# [0, 1] -> [0, 0, 3, 0] picks 2, [1, 1] -> [2, 0, 3, 1] picks 2, [-1, 0] -> [-2, 0, 0, -1] picks 1 (a tie
# between experts 1 and 2 goes to the lower index).
ROUTER = np.array([[2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 3.0, 0.0]])
TOKENS = [np.array([[[1.0, 0.0]], [[0.0, 1.0]]]), np.array([[[1.0, 1.0]], [[-1.0, 0.0]]])]  # per rank, [2, 1, 2]


def _experts(f: int = 3, bias: bool = True) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"w1": rng.normal(size=(2, f)), "b1": rng.normal(size=f) if bias else None,
             "w2": rng.normal(size=(f, 2)), "b2": rng.normal(size=2) if bias else None} for _ in range(4)]


def _ep_run(experts: list[dict], act: str = "gelu"):
    def program(ctx):
        moe = MoE(ParallelContext(ctx), ctx.new_group(range(2), "ep"), ROUTER, experts, 1, act=act)
        saved = Saved()
        y, cache = moe.forward(TOKENS[ctx.rank], saved)
        moe.backward(cache, np.ones_like(y))
        return {"y": y, "saved": saved.by_name(), "routing": moe.last_routing}
    return parasim.run(program, 2)


def test_what_forward_keeps_and_sends():
    """Rank 0 routes its tokens to experts 0 and 2, rank 1 to 2 and 1 (k = 1, so each gate is 1). Each rank
    receives two rows: rank 0 one for expert 1 and one for expert 2 (1-based names), rank 1 both for
    expert 3, and expert 4 gets nothing, so keeps nothing. 2 bytes an element; f = 3."""
    res = _ep_run(_experts())
    assert [[[e for e, _ in r] for r in v["routing"]] for v in res.values] == [[[0], [2]], [[2], [1]]]
    assert res.values[0]["saved"] == {"moe.router input": 8, "moe.dispatched tokens": 8,
                                      "moe.expert1.activation input": 6, "moe.expert1.fc2 input": 6,
                                      "moe.expert2.activation input": 6, "moe.expert2.fc2 input": 6}
    assert res.values[1]["saved"] == {"moe.router input": 8, "moe.dispatched tokens": 8,
                                      "moe.expert3.activation input": 12, "moe.expert3.fc2 input": 12}
    # one row crosses each way in each all-to-all: a token and its rank's 2 gates (4 float64), an output or
    # an output gradient (2), an input gradient and 2 gate gradients (4)
    got = [(e.label, [m.sent for m in e.members]) for e in res.trace.events]
    assert got == [("moe dispatch: tokens (and their gates) to the ranks holding their experts", [32, 32]),
                   ("moe combine: expert outputs back to each token's rank", [16, 16]),
                   ("moe combine backward: output gradients out to the experts", [16, 16]),
                   ("moe dispatch backward: input and gate gradients home", [32, 32])]


def test_bias_free_experts():
    """Experts without biases, ReLU: with one expert per token and gate 1, y = relu(x @ w1) @ w2."""
    experts = _experts(bias=False)
    res = _ep_run(experts, act="relu")
    for v, x in zip(res.values, TOKENS):
        for t, ((e, gate),) in enumerate(v["routing"]):
            want = np.maximum(x[t, 0] @ experts[e]["w1"], 0) @ experts[e]["w2"]
            assert gate == 1.0 and np.allclose(v["y"][t, 0], want, rtol=0, atol=1e-12)


def test_an_ep_group_of_one_sends_nothing_and_the_weights_are_the_layers_own():
    experts = _experts()

    def program(ctx):
        moe = MoE(ParallelContext(ctx), ctx.new_group([0], "ep"), ROUTER, experts, 1)
        assert moe.last_routing == []  # nothing routed yet
        before = moe.router.copy(), experts[0]["w1"].copy()
        ROUTER[0, 0] += 1.0
        experts[0]["w1"][0, 0] += 1.0  # the caller changes its arrays; the layer holds copies
        try:
            assert np.array_equal(moe.router, before[0]) and np.array_equal(moe.experts[0]["w1"], before[1])
        finally:
            ROUTER[0, 0] -= 1.0
        y, cache = moe.forward(TOKENS[0], Saved())
        moe.backward(cache, np.ones_like(y))
    assert parasim.run(program, 1).trace.events == []


def test_router_gradient_is_summed_over_tp_under_sp():
    """EP = TP = 2 with SP: each rank routed only its own tokens, so the router gradient is an all-reduce
    over the TP pair, after the four all-to-alls."""
    def program(ctx):
        g = ctx.new_group(range(2), "tp")
        moe = MoE(ParallelContext(ctx, g, sp=True), g, ROUTER, _experts(), 1)
        y, cache = moe.forward(TOKENS[ctx.rank], Saved())
        moe.backward(cache, np.ones_like(y))
        return moe.grads["router"]
    res = parasim.run(program, 2)
    assert [(e.op, e.label.split(":")[0]) for e in res.trace.events] == [
        ("all_to_all", "moe dispatch"), ("all_to_all", "moe combine"), ("all_to_all", "moe combine backward"),
        ("all_to_all", "moe dispatch backward"), ("all_reduce", "moe backward")]
    assert res.trace.events[-1].label == "moe backward: sum router grad (SP)"
    assert np.array_equal(res.values[0], res.values[1])


def test_ep_across_tp_pairs_needs_no_sp():
    """TP pairs {0, 1} and {2, 3} without SP hold the same tokens within a pair; EP runs across the pairs
    ({0, 2} and {1, 3}), so no EP group holds a token twice. Backward is allowed, and each TP rank's
    gradients equal those of a run with no TP at all on the same two shards."""
    experts = _experts()

    def with_tp(ctx):
        tps = [ctx.new_group(r, "tp") for r in ([0, 1], [2, 3])]  # every rank makes every group
        eps = [ctx.new_group(r, "ep") for r in ([0, 2], [1, 3])]
        tp, ep = tps[ctx.rank // 2], eps[ctx.rank % 2]
        moe = MoE(ParallelContext(ctx, tp), ep, ROUTER, experts, 1)
        y, cache = moe.forward(TOKENS[ctx.rank // 2], Saved())
        moe.backward(cache, np.ones_like(y))
        return moe.grads

    def without_tp(ctx):
        moe = MoE(ParallelContext(ctx), ctx.new_group(range(2), "ep"), ROUTER, experts, 1)
        y, cache = moe.forward(TOKENS[ctx.rank], Saved())
        moe.backward(cache, np.ones_like(y))
        return moe.grads
    got, want = parasim.run(with_tp, 4).values, parasim.run(without_tp, 2).values
    for rank, grads in enumerate(got):
        ref = want[rank // 2]
        assert grads.keys() == ref.keys() and all(np.allclose(grads[k], ref[k], rtol=0, atol=1e-12) for k in ref)


def test_softmax_is_shifted_per_row():
    """Scores of 1000 overflow exp() unless each row is shifted by its own maximum."""
    out = softmax(np, np.array([[1000.0, 1000.0], [0.0, np.log(3.0)]]))
    assert np.allclose(out, [[0.5, 0.5], [0.25, 0.75]], rtol=0, atol=1e-15)
    assert softmax(np, np.zeros((0, 3))).shape == (0, 3)


def test_helpers_with_no_tokens():
    """A rank that routes no token still builds [0, k, E] choices, and adding no rows leaves zeros."""
    assert one_hot(np, [], 2, 4, np.float64).shape == (0, 2, 4)
    assert np.array_equal(one_hot(np, [[1, 0]], 2, 3, np.float64), [[[0, 1, 0], [1, 0, 0]]])
    assert one_hot(np, np.array([[2, 0]]), 2, 3, "float32").dtype == np.float32
    out = add_at(np, np.zeros((5, 3)), [], np.zeros((0, 3)))
    assert out.shape == (5, 3) and not out.any() and gather_rounds([], 5) == []
    assert np.array_equal(add_at(np, np.zeros((4, 1)), [3, 0], np.array([[1.0], [2.0]])), [[2.0], [0.0], [0.0], [1.0]])
    assert [len(b) for b in split_rows(np.zeros((5, 2)), [2, 0, 3])] == [2, 0, 3]


def test_add_at_adds_a_named_row_in_order_as_numpys_add_at_does():
    """Rows for a position named more than once are added one after another, in their order: the very sums
    of np.add.at (floats whose sum depends on the order: 0.5 + 1e16 + 1 - 1e16 is 0, 0.5 + 1 + 1e16 - 1e16 is
    2 and 0.5 + 1e16 - 1e16 + 1 is 1.5)."""
    idx = [2, 0, 2, 2, 1, 0]
    rows = np.array([[1e16], [5.0], [1.0], [-1e16], [3.0], [-5.0]])
    want = np.full((4, 1), 0.5)
    np.add.at(want, idx, rows)
    got = add_at(np, np.full((4, 1), 0.5), idx, rows)
    assert got.tolist() == want.tolist() == [[0.5], [3.5], [0.0], [0.5]]
    assert len(gather_rounds(idx, 4)) == 3  # position 2 is named three times
    assert [r.tolist() for r in gather_rounds([1, 1], 3)] == [[0, 1, 0], [0, 2, 0]]
    big = gather_rounds([70000, 5, 70000], 70001)  # positions past 16 bits: sorted as they are
    assert [(int(r[5]), int(r[70000])) for r in big] == [(2, 1), (0, 3)]


@pytest.mark.parametrize("args, rule", [((ROUTER, _experts()[:3], 1), "3 experts do not split evenly"),
                                        ((ROUTER, _experts(), 5), "top_k must be between 1 and")])
def test_bad_moe(args, rule):
    from parasim.layout import LayoutError

    def program(ctx):
        MoE(ParallelContext(ctx), ctx.new_group(range(2), "ep"), *args)
    with pytest.raises(LayoutError, match=rule):
        parasim.run(program, 2)


def _rounds_by_hand(idx: list[int], n: int) -> list[list[int]]:
    """gather_rounds' answer worked out one row at a time: row i goes to the first round where its position
    is still free, so a position's rows keep their order across rounds."""
    rounds: list[list[int]] = []
    for i, at in enumerate(idx):
        r = next((r for r in rounds if r[at] == 0), None)
        if r is None:
            rounds.append(r := [0] * n)
        r[at] = i + 1
    return rounds


@pytest.mark.parametrize("idx, n", [
    ([int(v) for v in np.random.default_rng(1).integers(0, 7, size=300)], 9),  # many repeats: argsort must be stable
    ([5, 65541, 5], 70001),  # 65541 is 5 in 16 bits: positions past 16 bits must not be sorted as 16-bit keys
    ([3, 1, 3], 4),
    ([4, 0, 2], 5),  # no position twice: one round
])
def test_gather_rounds_against_rows_added_one_at_a_time(idx, n):
    got = gather_rounds(idx, n)
    assert [r.tolist() for r in got] == _rounds_by_hand(idx, n)
    assert all(r.dtype.kind == "i" for r in got)  # index arrays
    flat = gather_rounds(np.array(idx).reshape(-1, 1), n)  # any shape of positions is read as one list
    assert [r.tolist() for r in flat] == _rounds_by_hand(idx, n)


def test_expert_and_router_placements():
    """Where each weight lives, as checkpoints and gradient groups read it: the router whole on every rank
    (no SP); each expert's weights on one EP rank (Shard(0) of the expert list), and over expert-TP w1 and b1
    by columns, w2 by rows, b2 a partial sum."""
    from parasim.layout.placement import Partial, Replicate, Shard

    def program(ctx):
        etp_g = [ctx.new_group([d, d + 1], "expert-tp") for d in (0, 2)][ctx.rank // 2]
        eps = [ctx.new_group([r, r + 2], "ep") for r in range(2)]
        with_etp = MoE(ParallelContext(ctx, etp_group=etp_g), eps[ctx.rank % 2], ROUTER, _experts(4), 1, etp=etp_g)
        whole = MoE(ParallelContext(ctx), eps[ctx.rank % 2], ROUTER, _experts(), 1)
        return with_etp.placements, whole.placements
    res = parasim.run(program, 4)
    with_etp, whole = res.values[2]  # EP rank 1: experts 3 and 4
    assert with_etp == {"router": {"tp": Replicate()},
                        **{f"expert{e}.{k}": {"ep": Shard(0), "etp": p} for e in (3, 4)
                           for k, p in (("w1", Shard(1)), ("b1", Shard(0)), ("w2", Shard(0)), ("b2", Partial()))}}
    assert whole == {"router": {"tp": Replicate()},
                     **{f"expert{e}.{k}": {"ep": Shard(0)} for e in (3, 4) for k in ("w1", "b1", "w2", "b2")}}


def test_a_partial_gradient_over_a_one_rank_group_is_not_summed():
    """Under SP the router's gradient is partial over TP; with a TP group of one rank it is already whole, so
    no all-reduce is made for it (an all-reduce over one rank moves nothing, but it would be a step to show)."""
    def program(ctx):
        moe = MoE(ParallelContext(ctx, tp_group=ctx.new_group([0], "tp"), sp=True), None, ROUTER, _experts(), 1)
        y, cache = moe.forward(TOKENS[0], Saved())
        moe.backward(cache, np.ones_like(y))
        return moe.grads["router"].shape
    res = parasim.run(program, 1)
    assert res.values == [(2, 4)] and [e.op for e in res.trace.events] == []


def test_top_k_may_be_every_expert():
    """k = E is allowed (each token goes to every expert, gates a softmax over all four scores), k = 0 is not:
    the gates of [1, 0]'s scores [2, 0, 0, 1] worked out by hand."""
    from parasim.layout import LayoutError

    def program(ctx):
        moe = MoE(ParallelContext(ctx), None, ROUTER, _experts(), 4)
        moe.forward(np.array([[[1.0, 0.0]]]), Saved())
        return moe.last_routing[0]
    picks = parasim.run(program, 1).values[0]
    z = np.exp(np.array([2.0, 1.0, 0.0, 0.0]))
    assert [e for e, _ in picks] == [0, 3, 1, 2] and np.allclose([g for _, g in picks], z / z.sum())
    with pytest.raises(LayoutError, match="top_k must be between 1 and"):
        parasim.run(lambda ctx: MoE(ParallelContext(ctx), None, ROUTER, _experts(), 0), 1)


def test_the_blocks_weights_are_named_by_expert_counted_over_the_whole_layer():
    """params() and load() name expert n (counted from 1 over all the layer's experts) and the router; on EP
    rank 1 of 2, the four experts' last two are the local ones, expert3 the first of them."""
    def program(ctx):
        experts = _experts()
        moe = MoE(ParallelContext(ctx), ctx.new_group(range(2), "ep"), ROUTER, experts, 1)
        mine = range(2 * ctx.rank, 2 * ctx.rank + 2)
        got = moe.params()
        assert sorted(got) == sorted(["router"] + [f"expert{e + 1}.{w}" for e in mine for w in ("w1", "b1", "w2", "b2")])
        same = all(np.array_equal(got[f"expert{e + 1}.{w}"], experts[e][w]) for e in mine for w in ("w1", "w2"))
        moe.load({f"expert{mine[1] + 1}.b1": got[f"expert{mine[1] + 1}.b1"] + 1.0, "router": got["router"] * 2})
        after = moe.params()
        moved = np.array_equal(after[f"expert{mine[1] + 1}.b1"], experts[mine[1]]["b1"] + 1.0)
        kept = np.array_equal(after[f"expert{mine[0] + 1}.b1"], experts[mine[0]]["b1"])
        return same, moved, kept, np.array_equal(after["router"], got["router"] * 2)

    assert parasim.run(program, 2).values == [(True, True, True, True)] * 2


def test_tokens_cross_the_ep_group_in_the_runs_dispatch_and_combine_dtypes():
    """DeepSeek-V3's precision on symbolic ranks: toward the experts (the dispatch, and backward the gradients of
    their outputs) in FP8, home (the combine, the tokens' and gates' gradients) in BF16; the post's precision
    sends all four in BF16."""
    from parasim.nn.core import LayerOptions
    from parasim.nn.routing import Routing
    experts = _experts()

    def program(ctx):
        par = ParallelContext(ctx, options=LayerOptions(routing=Routing.parse("balanced")))
        weights = [{k: None if v is None else ctx.asarray(v) for k, v in e.items()} for e in experts]
        moe = MoE(par, ctx.new_group(range(2), "ep"), ctx.asarray(ROUTER), weights, 1)
        y, cache = moe.forward(ctx.asarray(TOKENS[ctx.rank]), Saved())
        moe.backward(cache, ctx.xp.ones_like(y))

    def wire(precision):
        trace = parasim.run(program, 2, "symbolic", precision=precision).trace
        return [(e.label.split(":")[0], {t.dtype for m in e.members for t in m.ins}) for e in trace.events
                if e.op == "all_to_all"]

    fp8, bf16 = {"float8_e4m3fn"}, {"bfloat16"}
    assert wire("deepseek-v3") == [("moe dispatch", fp8), ("moe combine", bf16), ("moe combine backward", fp8),
                                   ("moe dispatch backward", bf16)]
    assert wire("post") == [("moe dispatch", bf16), ("moe combine", bf16), ("moe combine backward", bf16),
                            ("moe dispatch backward", bf16)]

"""Placements are executable: one declaration per weight cuts it, names the group its gradient is summed
over, and reassembles it. Moving a declaration moves the sum, with no other edit."""
import numpy as np
import pytest

import parasim
from parasim.layout import Layout, LayoutError
from parasim.nn import ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.layout.placement import Partial, Replicate, Shard, assemble, data_axes, grad_group, local, sum_axes

H, F, N_EXP, K, TOKENS = 4, 6, 4, 2, 8


@pytest.mark.parametrize("placed, axes, group", [
    ({"tp": Shard(1)}, ("dp", "cp"), "dp-cp"),  # a TP shard: summed over the data axes only
    ({"tp": Replicate()}, ("dp", "cp"), "dp-cp"),
    ({"tp": Partial()}, ("tp", "dp", "cp"), "tp-dp-cp"),  # SP's partial sums join the data sum
    ({"ep": Shard(0)}, ("edp",), "expert-dp"),  # an expert: summed over expert-dp
    ({}, ("dp", "cp"), "dp-cp"),
])
def test_the_sum_group_follows_the_declaration(placed, axes, group):
    assert sum_axes(placed) == axes
    assert grad_group(placed) == group


def test_data_axes_alone_name_the_data_parallel_group():
    assert grad_group({"tp": Partial()}, data_axes({"tp": Partial()})) == "dp-cp"
    with pytest.raises(LayoutError, match="no expert group of the layout spans axes cp"):
        grad_group({"ep": Shard(0)}, ("cp",))


@pytest.mark.parametrize("p", [Shard(0), Shard(1), Replicate(), Partial()])
def test_cut_then_assemble_gives_the_whole_back(p):
    whole = np.arange(24.0).reshape(4, 6)
    pieces = [local(whole, p, 2, i, np) for i in range(2)]
    if isinstance(p, Shard):  # each rank's slice, by hand
        want = [whole[:2], whole[2:]] if p.dim == 0 else [whole[:, :3], whole[:, 3:]]
        assert all(np.array_equal(a, b) for a, b in zip(pieces, want))
    if isinstance(p, Partial):  # partial sums of the whole: halves that add up to it
        pieces = [whole / 2, whole / 2]
    assert np.array_equal(assemble(pieces, p, np), whole)
    with pytest.raises(LayoutError, match="size 6 of dim 1 does not divide by the group's 4 ranks"):
        local(whole, Shard(1), 4, 0, np)


def _router_grad(router_placement=None):
    """One MoE block on 2 ranks, TP + SP (each rank routes its half of the tokens), EP over the same ranks.
    `router_placement` replaces the router's declared placement, and nothing else."""
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "tp") if ctx.world > 1 else None
        tp = ParallelContext(ctx, group, sp=ctx.world > 1, ep_group=group)
        router = ctx.shared_rng("router").normal((H, N_EXP))
        experts = [{"w1": ctx.shared_rng(f"e{e}.w1").normal((H, F)), "w2": ctx.shared_rng(f"e{e}.w2").normal((F, H))}
                   for e in range(N_EXP)]
        moe = MoE(tp, group, router, experts, K)
        if router_placement is not None:
            moe.placements["router"] = router_placement
        n = TOKENS // ctx.world
        x = ctx.shared_rng("x").normal((TOKENS, 1, H))[ctx.rank * n:(ctx.rank + 1) * n]
        dy = ctx.shared_rng("dy").normal((TOKENS, 1, H))[ctx.rank * n:(ctx.rank + 1) * n]
        _, cache = moe.forward(x, Saved())
        moe.backward(cache, dy)
        return {"router": moe.grads["router"], "group": grad_group(moe.placements["router"])}
    return program


def test_moving_the_router_placement_moves_its_gradient_sum():
    whole = parasim.run(_router_grad(), 1).values[0]["router"]  # one rank, every token: the true gradient
    declared = parasim.run(_router_grad(), 2)  # as the MoE block declares it under SP: Partial over tp
    moved = parasim.run(_router_grad({"tp": Replicate()}), 2)  # the one edit: declared replicated instead

    def router_sums(res):
        return [(e.op, e.group.name) for e in res.trace.events if "router grad" in (e.label or "")]
    assert router_sums(declared) == [("all_reduce", "tp")]
    assert [v["group"] for v in declared.values] == ["tp-dp-cp"] * 2
    for v in declared.values:
        assert np.allclose(v["router"], whole, rtol=0, atol=1e-12)
    # moved: no TP sum, a data-parallel group without tp, and each rank keeps only its own tokens' part
    assert router_sums(moved) == []
    assert [v["group"] for v in moved.values] == ["dp-cp"] * 2
    parts = [v["router"] for v in moved.values]
    assert not np.allclose(parts[0], whole) and np.allclose(assemble(parts, Partial(), np), whole, atol=1e-12)


def test_moe16_sums_each_gradient_over_the_group_its_placement_names(monkeypatch):
    """The 16-GPU example's ZeRO-1 groups come from the placements: declare the experts dense (no EP
    split) and their gradients move from expert-dp to dp-cp, with no edit to the example."""
    from parasim.examples.moe16 import make_program

    def groups(result):
        return sorted({e.group.name for e in result.trace.events if e.phase == "gradient sync"})
    # tp: the SP-split weights' partial gradients, summed over TP once per step before ZeRO
    assert groups(parasim.run(make_program(None), 16)) == ["dp-cp", "expert-dp", "tp"]
    real_init = MoE.__init__

    def dense_experts(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.placements.update({k: {"tp": Replicate()} for k in self.placements if k != "router"})
    monkeypatch.setattr(MoE, "__init__", dense_experts)
    assert groups(parasim.run(make_program(None), 16)) == ["dp-cp", "tp"]


@pytest.mark.parametrize("experts, sp", [(0, False), (0, True), (4, True)])
def test_every_layer_follows_the_protocol(experts, sp):
    """A layer, its parts and a stack offer forward, backward, params, grads, load and placements, under one
    set of names; `load` puts weights back where `params` found them."""
    from parasim.layout import ModelSpec
    from parasim.nn import Layer
    from parasim.nn.layer import Stack, TransformerLayer, layer_weights
    shape = ModelSpec(hidden=8, heads=2, ffn=8, experts=experts, top_k=2 if experts else None)

    def program(ctx):
        group = ctx.new_group(range(ctx.world), "tp")
        tp = ParallelContext(ctx, group, sp=sp, ep_group=group if experts else None)
        layer = TransformerLayer(tp, shape, layer_weights(ctx, shape, "L0"), key="L0")
        stack = Stack([layer])
        x = ctx.shared_rng("x").normal((4 // (2 if sp else 1), 1, 8))
        y, cache = stack.forward(x, Saved())
        stack.backward(cache, y)
        parts = [layer, layer.ln1, layer.attn, layer.attn.qkv, layer.attn.out, layer.ln2, layer.mlp, stack]
        assert all(isinstance(p, Layer) for p in parts)
        for p in parts:
            assert set(p.params()) == set(p.grads) == set(p.placements), type(p).__name__
        assert all(k.startswith("L0.") for k in stack.params())
        doubled = {k: 2 * w for k, w in stack.params().items()}
        stack.load(doubled)
        return all(np.array_equal(stack.params()[k], w) for k, w in doubled.items())
    assert parasim.run(program, 2).values == [True, True]


def test_a_parallel_context_from_a_layout():
    """The context of a rank in a layout: its TP, CP and EP groups, SP and the split from the layout."""
    from parasim.layout import preset
    layout = preset("moe16")

    def program(ctx):
        pc = ParallelContext.from_layout(ctx, layout)
        return [pc.tp_group.ranks, pc.cp_group.ranks, pc.ep_group.ranks, pc.sp, pc.cp_split, pc.seq]
    got = parasim.run(program, layout=layout).values
    groups = layout.groups()
    for r, (tp, cp, ep, sp, split, seq) in enumerate(got):
        mine = {name: next(g for g in groups[name] if r in g) for name in ("tp", "cp", "ep")}
        assert (list(tp), list(cp), list(ep)) == (mine["tp"], mine["cp"], mine["ep"])
        assert (sp, split, seq) == (True, "contiguous", 8)


def test_a_parallel_context_from_another_layout_than_the_runs():
    """A layout given to from_layout is the one whose groups the context takes (the run's is TP 2 x DP 2, the
    one given TP 4); a layout without a model has no sequence, so no positions."""
    def program(ctx):
        pc = ParallelContext.from_layout(ctx, Layout(tp=4))
        return pc.tp_group.ranks, pc.cp_positions()
    got = parasim.run(program, layout=Layout(tp=2, dp=2)).values
    assert got == [((0, 1, 2, 3), [])] * 4


def test_a_parallel_context_knows_its_place_in_each_group():
    """Each group's world size and this rank's place in it, read against the layout's own lists of groups
    (expert TP narrower than TP, so the two cannot stand in for each other; no group: 1 and 0)."""
    layout = Layout(tp=4, cp=2, ep=2, etp=2, sp=True)

    def program(ctx):
        pc = ParallelContext.from_layout(ctx, layout)
        alone = ParallelContext(ctx)
        return [(pc.tp_world_size, pc.tp_rank), (pc.cp_world_size, pc.cp_rank), (pc.etp_world_size, pc.etp_rank),
                (alone.tp_world_size, alone.tp_rank, alone.cp_world_size, alone.cp_rank, alone.etp_world_size,
                 alone.etp_rank)]
    groups = layout.groups()
    for r, (tp, cp, etp, alone) in enumerate(parasim.run(program, layout=layout).values):
        for got, name in ((tp, "tp"), (cp, "cp"), (etp, "expert-tp")):
            (mine,) = [g for g in groups[name] if r in g]
            assert got == (len(mine), mine.index(r)), (r, name)
        assert alone == (1, 0, 1, 0, 1, 0)


def test_a_settled_sum_names_the_layer_line_and_other_partial_axes_are_refused():
    """settle's all-reduce is the layer's call (its site is the layer's line); a Partial over an axis no
    layer can sum is an error, while a Partial over a data axis is left to data-parallel code."""
    from parasim.layout.placement import settle

    def program(ctx):
        tp = ParallelContext(ctx, ctx.new_group([0, 1], "tp"))
        g = ctx.xp.ones(2)
        assert settle(tp, {"dp": Partial()}, g, "x") is g  # data axes: not summed here
        with pytest.raises(LayoutError, match="partial over ep: layers sum partial gradients over tp and etp only"):
            settle(tp, {"ep": Partial()}, g, "x")
        return settle(tp, {"tp": Partial()}, g, "sum")  # this line is the site
    res = parasim.run(program, 2)
    (e,) = res.trace.events
    assert all(m.site.startswith("tests/unit/layout/test_placement.py:") for m in e.members)
    assert [list(v) for v in res.values] == [[2.0, 2.0]] * 2


@pytest.mark.parametrize("p", [Replicate(), Shard(0)])
def test_a_local_piece_owns_its_memory_and_one_replica_is_the_whole(p):
    whole = np.arange(8.0).reshape(4, 2)
    piece = local(whole, p, 2, 1, np)
    piece[0, 0] = -1.0  # a rank updating its piece leaves the whole (and every other rank's piece) alone
    assert whole[0, 0] == 0.0 and whole[2, 0] == 4.0
    assert np.array_equal(assemble([whole], Replicate(), np), whole)  # a group of one


def test_zero1_step_names_its_groups_and_counts_state_per_kind():
    """One weight, one rank: ZeRO-1 over the dense weights' group (dp-cp), labelled so; Adam keeps 3 values
    per parameter (master, m, v), all of them on a group of one."""
    from parasim.dp.zero import zero1_step
    from parasim.layout import Layout

    class One:
        placements = {"w": {"tp": Replicate()}}

        def __init__(self, ctx):
            self.w, self.grads = ctx.xp.ones(3), {"w": ctx.xp.ones(3)}

        def params(self):
            return {"w": self.w}

    def program(ctx):
        new, sq, state = zero1_step(ctx, One(ctx), 0.1)
        return new["w"], sq, state
    res = parasim.run(program, layout=Layout())
    new, sq, state = res.values[0]
    assert state == {"dense": [9, 9]} and sq == {"w": 3.0}
    assert np.allclose(new, 1.0 - 0.1)  # Adam's first step moves each weight by lr (sign of the gradient)
    assert {e.label for e in res.trace.events} == {"ZeRO-1 over dp-cp: reduce-scatter the gradients",
                                                   "ZeRO-1 over dp-cp: all-gather the updated weights"}

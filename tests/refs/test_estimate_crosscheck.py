"""The estimator against the engine on small shapes: for every layout drawn, the bytes the engine's layers
keep for backward equal the estimator's activation bytes, and the bytes each rank sends, per axis and
collective kind in the trace, equal the estimator's traffic. A drift in either fails here."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parasim
from parasim.estimate.memory import layer_saved_bytes
from parasim.estimate.models import layer_param_count
from parasim.estimate.traffic import (EP_PASSES, dp_traffic, ep_bytes_from_routing, ep_expected_rows, layer_traffic,
                                      moe_traffic, pp_traffic)
from parasim.layout import Layout
from parasim.nn import Saved, ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec
from parasim.nn.moe import MoE

ITEM = 8  # the engine computes in float64: 8 bytes per value on the wire


def sent_by_axis(trace, rank: int) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for e in trace.events:
        for m in e.members:
            if m.rank == rank and m.sent:
                key = (e.group.name.replace("dp-cp", "dp"), e.op)
                out[key] = out.get(key, 0) + m.sent
    return out


def run_layer(shape: ModelSpec, tp: int, cp: int, dp: int, sp: bool, s: int, b: int, zero: int | None):
    """One layer forward and backward on a tp x cp x dp layout; then, if `zero` is given, the gradients'
    data-parallel reduction as ZeRO does it (or plain DP's all-reduce for stage 0)."""
    def program(ctx):
        t = ParallelContext(ctx, ctx.groups["tp"] if tp > 1 else None, sp=sp and tp > 1,
                      cp_group=ctx.groups["cp"] if cp > 1 else None, seq=s)
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0")
        pos = t.token_positions()  # its CP slice, then its SP share
        idx = ctx.xp.asarray(pos)
        x = ctx.xp.take(ctx.shared_rng("x").normal((s, b, shape.hidden)), idx, axis=0)
        dy = ctx.xp.take(ctx.shared_rng("dy").normal((s, b, shape.hidden)), idx, axis=0)
        saved = Saved()
        _, cache = layer.forward(x, saved)
        layer.backward(cache, dy)
        grads = layer.grads
        n_params = int(sum(int(np.prod(g.shape)) for g in grads.values()))
        if zero is not None and dp * cp > 1:
            flat = ctx.xp.concat([ctx.xp.reshape(g, (-1,)) for g in grads.values()])
            group = ctx.groups["dp-cp"]
            pad = (-flat.shape[0]) % group.size  # equal shards, as Megatron pads its flat gradient buffers
            flat = ctx.xp.concat([flat, ctx.xp.zeros(pad, dtype=flat.dtype)]) if pad else flat
            if zero == 0:
                ctx.comm.all_reduce(flat, group=group, label="DP: all-reduce the gradients")
            else:
                mine = ctx.comm.reduce_scatter(flat, group=group, label="ZeRO: reduce-scatter the gradients")
                for _ in range(2 if zero == 3 else 1):  # ZeRO-3 gathers the weights for forward and backward
                    ctx.comm.all_gather(mine, group=group, label="ZeRO: all-gather the weights")
        return {"saved": saved.bytes(), "params": n_params}
    return parasim.run(program, layout=Layout(tp=tp, cp=cp, dp=dp), seed=0)


@st.composite
def layouts(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2])) if tp * cp < 8 else 1
    heads = tp * draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([k for k in (1, 2, heads) if heads % k == 0 and (k % tp == 0 or tp % k == 0)]))
    sp = draw(st.booleans()) and tp > 1
    dropout = 0.0 if cp > 1 else draw(st.sampled_from([0.0, 0.1]))  # ring attention models no dropout
    shape = ModelSpec(hidden=heads * draw(st.sampled_from([2, 4])), heads=heads, kv_heads=kv,
                       ffn=tp * draw(st.sampled_from([2, 3])), dropout=dropout, bias=draw(st.booleans()),
                       norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), flash=draw(st.booleans()))
    s = 2 * cp * tp * draw(st.integers(1, 2))
    return shape, tp, cp, dp, sp, s, draw(st.integers(1, 2)), draw(st.sampled_from([None, 0, 1, 2, 3]))


def check(shape: ModelSpec, tp: int, cp: int, dp: int, sp: bool, s: int, b: int, zero: int | None) -> None:
    res = run_layer(shape, tp, cp, dp, sp, s, b, zero)
    h, norm_params = shape.hidden, 1 if shape.norm == "rmsnorm" else 2
    saved = layer_saved_bytes(h, shape.heads, shape.kv, shape.ffn_size, s, b, tp, sp, cp, flash=shape.flash,
                              dropout=shape.dropout > 0)
    assert {v["saved"] for v in res.values} == {saved}
    params = layer_param_count(h, shape.heads, shape.kv, shape.ffn_size, tp, shape.bias, norm_params)
    assert {v["params"] for v in res.values} == {params}
    want = layer_traffic(h, shape.heads, s * b // cp, tp, sp, cp, itemsize=ITEM, bias=shape.bias,
                         norm_params=norm_params, kv_heads=shape.kv)  # CP's K and V travel at their own heads
    if zero is not None:
        pad = (-params) % (dp * cp)
        want.update(dp_traffic(params + pad, dp * cp, zero, itemsize=ITEM))
    for rank in range(res.trace.world):
        got = sent_by_axis(res.trace, rank)
        assert set(got) == set(want), (rank, got, want)
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-12), (rank, k)


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_estimator_equals_engine_on_drawn_layouts(case):
    check(*case)


@pytest.mark.parametrize("tp, cp, dp, sp, flash, zero", [
    (2, 1, 1, False, False, None), (4, 1, 1, True, True, None), (2, 2, 1, True, True, None),
    (1, 2, 2, False, True, 1), (2, 1, 2, True, True, 3), (2, 1, 2, False, False, 0), (4, 2, 1, True, True, 2)])
def test_estimator_equals_engine_on_the_post_combinations(tp, cp, dp, sp, flash, zero):
    shape = ModelSpec(hidden=4 * tp, heads=tp * 2, dropout=0.0 if cp > 1 else 0.1, flash=flash)
    check(shape, tp, cp, dp, sp, 4 * cp * tp, 2, zero)


@pytest.mark.parametrize("pp, m", [(2, 2), (4, 4), (3, 5)])
def test_pipeline_p2p_bytes_equal_the_estimate(pp, m):
    """The busiest stage of a 1F1B run sends what pp_traffic says: activations on, gradients back."""
    from parasim.examples.pipeline import BATCH, SEQ, SHAPE, pipeline_run
    res = parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", m), pp)
    busiest = max(sum(mm.sent for e in res.trace.events if e.op == "p2p" for mm in e.members if mm.rank == r)
                  for r in range(pp))
    want = pp_traffic(SEQ * BATCH * SHAPE.hidden * ITEM, m, pp)[("pp", "p2p")]
    assert busiest == want


# -- expert parallelism: the MoE block's all-to-alls ----------------------------------------------------
def run_moe(ep: int, n: int, h: int, n_exp: int, k: int, backward: bool = True, seed: int = 0):
    """The MoE block on ep ranks (the EP group is the whole world), n tokens each, random router and
    experts; forward, and backward unless told not to. Each rank returns its routing."""
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "ep") if ctx.world > 1 else None
        router = ctx.shared_rng("router").normal((h, n_exp))
        experts = [{"w1": ctx.shared_rng(f"e{e}.w1").normal((h, 2 * h)),
                    "w2": ctx.shared_rng(f"e{e}.w2").normal((2 * h, h))} for e in range(n_exp)]
        moe = MoE(ParallelContext(ctx), group, router, experts, k)
        x = ctx.shared_rng("x").normal((ep * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        y, cache = moe.forward(x, Saved())
        if backward:
            moe.backward(cache, ctx.shared_rng("dy").normal((ep * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n])
        return [[e for e, _ in token] for token in moe.last_routing]
    return parasim.run(program, ep, seed=seed)


def ep_sent(trace, ep: int) -> list[dict[str, int]]:
    """Bytes each rank sent in each all-to-all, keyed by the pass its label names."""
    out: list[dict[str, int]] = [dict.fromkeys(EP_PASSES, 0) for _ in range(ep)]
    for e in trace.events:
        assert e.op == "all_to_all"  # the block alone talks only over EP
        name = e.label.split(": ")[0].removeprefix("moe ")
        for m in e.members:
            out[m.rank][name] += m.sent
    return out


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 6),
       st.integers(0, 3))
def test_ep_bytes_equal_the_engine(ep, per, k, h, n, seed):
    """For whatever routing the engine's router picks, the estimator's per-rank bytes for dispatch,
    combine and their backward equal the trace's, byte for byte."""
    n_exp = ep * per
    k = min(k, n_exp)
    res = run_moe(ep, n, h, n_exp, k, seed=seed)
    want = ep_bytes_from_routing(res.values, ep, n_exp, h, bytes_per=ITEM)
    assert ep_sent(res.trace, ep) == want
    if ep == 1:
        assert not res.trace.events and all(v == 0 for v in want[0].values())


def test_ep_dispatch_rows_match_the_expected_dedup_count():
    """4 ranks x 256 tokens, E = 8, top-2, a random router: the rows dispatched come within 10% of the
    uniform-routing expectation and below the (token, expert) pair count, which the dedup undercuts.
    Fixed seed: the same routing on every run."""
    ep, n, h, n_exp, k = 4, 256, 8, 8, 2
    res = run_moe(ep, n, h, n_exp, k, backward=False, seed=1)
    wide = (h + n_exp // ep) * ITEM
    rows = sum(m.sent for e in res.trace.events if e.label.startswith("moe dispatch:") for m in e.members) / wide
    expected = ep * ep_expected_rows(n, k, n_exp, ep)
    pairs = ep * n * k * (ep - 1) / ep
    assert abs(rows - expected) <= 0.1 * expected, (rows, expected)
    assert rows < pairs
    # the estimator's EP entry carries both figures; at this h the gates make the dedup rows wider
    est = moe_traffic(h, n, k, ep, itemsize=ITEM, experts=n_exp)
    assert est[("ep", "all_to_all")] == 4 * n * k * h * ITEM * (ep - 1) / ep
    assert est[("ep", "all_to_all_dedup")] == pytest.approx(
        ep_expected_rows(n, k, n_exp, ep) * (4 * h + 2 * n_exp // ep) * ITEM)

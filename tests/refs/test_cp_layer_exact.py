"""A transformer layer split by CP (ring attention, contiguous or zigzag) together with TP and SP equals
torch autograd on the unsplit layer in float64. Weight gradients are partial sums over the CP ranks
(each saw its own tokens): the dp-cp reduction adds them up."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import parasim  # noqa: E402
from layer_check import SEED, layer_grads, reference  # noqa: E402
from parasim.layout import Layout  # noqa: E402
from parasim.nn import Saved, ParallelContext  # noqa: E402
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec


def run_cp(shape: ModelSpec, tp: int, cp: int, sp: bool, split: str, s: int, b: int):
    def program(ctx):
        t = ParallelContext(ctx, ctx.groups["tp"] if tp > 1 else None, sp=sp and tp > 1, cp_group=ctx.groups["cp"],
                            seq=s, cp_split=split)
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0")
        pos = t.token_positions()  # its CP slice, then its SP share
        idx = ctx.xp.asarray(pos)
        x = ctx.xp.take(ctx.shared_rng("x").normal((s, b, shape.hidden)), idx, axis=0)
        dy = ctx.xp.take(ctx.shared_rng("dy").normal((s, b, shape.hidden)), idx, axis=0)
        y, cache = layer.forward(x, Saved())
        dx = layer.backward(cache, dy)
        return {"pos": pos, "y": y, "dx": dx, "grads": layer.grads, "cp": ctx.coords.cp, "tp": ctx.coords.tp}
    return parasim.run(program, layout=Layout(tp=tp, cp=cp), seed=SEED).values


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2]), cp=st.integers(1, 4), sp=st.booleans(),
       split=st.sampled_from(["contiguous", "zigzag"]), chunk=st.integers(1, 2), kv=st.sampled_from([1, 2]))
@example(tp=2, cp=4, sp=True, split="contiguous", chunk=1, kv=1)  # one token per rank, always tried
def test_cp_tp_sp_layer_equals_torch(tp, cp, sp, split, chunk, kv):
    shape = ModelSpec(hidden=8, heads=2, kv_heads=kv, dropout=0.0)
    # chunk 1: one token per CP rank (contiguous), or per TP rank under SP
    s, b = (cp if split == "contiguous" else 2 * cp) * (tp if sp else 1) * chunk, 1
    vals = run_cp(shape, tp, cp, sp, split, s, b)
    ry, rdx, rg = reference(shape, s, b)
    y, dx = np.zeros_like(ry), np.zeros_like(rdx)
    for v in vals:
        y[v["pos"]], dx[v["pos"]] = v["y"], v["dx"]
    assert np.max(np.abs(y - ry)) < 1e-10 and np.max(np.abs(dx - rdx)) < 1e-10
    grads = {}
    for c in range(cp):  # each CP rank's TP group gives its tokens' gradients; CP ranks add up (dp-cp)
        ranks = sorted((v for v in vals if v["cp"] == c), key=lambda v: v["tp"])
        for k, g in layer_grads([v["grads"] for v in ranks], shape, tp).items():
            grads[k] = grads.get(k, 0) + g
    for k in rg:
        assert np.max(np.abs(grads[k] - rg[k])) < 1e-10, k

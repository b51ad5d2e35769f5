"""The attention block alone, on one rank and on two TP ranks, against torch autograd in float64: output,
input gradient and every weight gradient, with grouped kv heads, biases, dropout on the probabilities
(the mask drawn from the same shared stream) and flash (softmax recomputed in backward). Small and quick:
the first place an error in attention's forward or backward shows."""
import math

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from torch_ref import vjp  # noqa: E402

import parasim  # noqa: E402
from parasim.nn import Saved, ParallelContext  # noqa: E402
from parasim.nn.attention import AttentionOptions, AttentionWeights, HeadCounts, ParallelAttention  # noqa: E402

S, B, H = 4, 2, 8


def reference(x, wq, wk, wv, wo, bq, bk, bv, bo, heads, kv, keep, p):
    """Unsplit causal attention: y = softmax(q k^T / sqrt(d)) (dropped) v, projected."""
    s, b, h = x.shape
    d = h // heads
    q = (x @ wq + bq).reshape(s, b, heads, d).permute(1, 2, 0, 3)
    k = (x @ wk + bk).reshape(s, b, kv, d).permute(1, 2, 0, 3).repeat_interleave(heads // kv, dim=1)
    v = (x @ wv + bv).reshape(s, b, kv, d).permute(1, 2, 0, 3).repeat_interleave(heads // kv, dim=1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1),
                                                                   -math.inf)
    probs = torch.softmax(scores, dim=-1)
    if p:
        probs = probs * keep / (1 - p)
    o = (probs @ v).permute(2, 0, 1, 3).reshape(s, b, h)
    return o @ wo + bo


@pytest.mark.parametrize("heads, kv, p, flash", [(4, 4, 0.0, False), (4, 2, 0.0, False), (4, 1, 0.5, False),
                                                 (4, 2, 0.5, True)])
@pytest.mark.parametrize("tp", [1, 2])
def test_attention_equals_torch_autograd(tp, heads, kv, p, flash):
    d = H // heads
    rng = np.random.default_rng(7)
    w = {"wq": rng.normal(size=(H, heads * d)), "wk": rng.normal(size=(H, kv * d)),
         "wv": rng.normal(size=(H, kv * d)), "wo": rng.normal(size=(heads * d, H)) / 3,
         "bq": rng.normal(size=heads * d), "bk": rng.normal(size=kv * d), "bv": rng.normal(size=kv * d),
         "bo": rng.normal(size=H)}
    x, dy = rng.normal(size=(S, B, H)) / 2, rng.normal(size=(S, B, H))

    def prog(ctx):
        group = ctx.new_group(range(tp), "tp") if tp > 1 else None
        weights = AttentionWeights.of({k: ctx.asarray(v) for k, v in w.items()})
        a = ParallelAttention(ParallelContext(ctx, group), weights, HeadCounts(heads, kv),
                              AttentionOptions(dropout=p, flash=flash), key="A")
        keep = ctx.shared_rng("A.probs").uniform((B, heads, S, S)) >= p  # the mask's own stream, whole
        y, cache = a.forward(ctx.asarray(x), Saved())
        dx = a.backward(cache, ctx.asarray(dy))
        return {"y": y, "dx": dx, "keep": keep, "grads": a.grads, "q": a.q_heads, "kv": a.kv_local}

    ranks = parasim.run(prog, world=tp).values
    keep = ranks[0]["keep"].astype(float)
    names = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")
    y, grads = vjp(lambda x_, *ws: reference(x_, *ws, heads, kv, torch.tensor(keep), p), [x, *(w[k] for k in names)],
                   dy)
    g = dict(zip(names, grads[1:]))
    close = lambda a, b: np.allclose(a, b, rtol=1e-12, atol=1e-12)  # noqa: E731
    kv_sum: dict[tuple, list] = {}  # kv heads replicated on several ranks: each holds a partial sum
    for r in ranks:
        assert close(r["y"], y) and close(r["dx"], grads[0])
        nq = len(r["q"]) * d
        gw, gb = r["grads"]["qkv.weight"], r["grads"]["qkv.bias"]
        # this rank's columns of the fused [wq | wk | wv]: its q heads, then its kv heads' k and v
        assert close(gw[:, :nq], g["wq"].reshape(H, heads, d)[:, r["q"]].reshape(H, -1))
        assert close(gb[:nq], g["bq"].reshape(heads, d)[r["q"]].ravel())
        kv_sum.setdefault(tuple(r["kv"]), []).append((gw[:, nq:], gb[nq:]))
        assert close(r["grads"]["out.weight"], g["wo"].reshape(heads, d, H)[r["q"]].reshape(-1, H))
        # the output bias is added once, after the all-reduce: its gradient is whole on every rank
        assert close(r["grads"]["out.bias"], g["bo"])
    assert len(kv_sum) == min(tp, kv)
    for kvh, parts in kv_sum.items():
        idx = list(kvh)
        want_w = np.concatenate([g["wk"].reshape(H, kv, d)[:, idx].reshape(H, -1),
                                 g["wv"].reshape(H, kv, d)[:, idx].reshape(H, -1)], axis=1)
        want_b = np.concatenate([g["bk"].reshape(kv, d)[idx].ravel(), g["bv"].reshape(kv, d)[idx].ravel()])
        assert close(sum(w for w, _ in parts), want_w) and close(sum(b for _, b in parts), want_b)

"""Ring attention run on CP ranks and full attention in torch autograd, on the same shared draws: what the
ring's exactness tests (test_ring_exact, test_edge_sizes) hold against each other."""
from __future__ import annotations

import math

import numpy as np

import parasim
from layer_check import SEED
from parasim.engine.context import Rng
from parasim.layout import Layout, ModelSpec
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.nn.ring_attention import RingAttention


def full(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The whole tensor `name` that every rank draws its share of (the ranks' shared stream)."""
    return Rng(0, (1, *name.encode()), lambda a: a).normal(shape)


def run_ring(cp: int, seq: int, b: int, heads: int, d: int, causal: bool, split: str) -> list[dict]:
    """Each CP rank's positions, output, q/k/v gradients and work, ring attention forward and backward."""
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "cp") if ctx.world > 1 else None
        ring = RingAttention(ctx, group, seq, split=split, causal=causal)
        pos = ctx.xp.asarray(ring.pos[ring.r])

        def take(name):  # this rank's positions of the whole tensor
            return ctx.xp.take(ctx.shared_rng(name).normal((b, heads, seq, d)), pos, axis=2)
        q, k, v, do = take("q"), take("k"), take("v"), take("do")
        out, cache = ring.forward(q, k, v)
        dq, dk, dv = ring.backward(cache, do)
        return {"pos": ring.pos[ring.r], "out": out, "dq": dq, "dk": dk, "dv": dv, "work": ring.work}
    return parasim.run(program, cp).values


def gather(values: list[dict], key: str, seq: int) -> np.ndarray:
    """The whole sequence of `key` put back together from the ranks' positions."""
    out = np.zeros_like(values[0][key][:, :, :1].repeat(seq, axis=2))
    for v in values:
        out[:, :, v["pos"]] = v[key]
    return out


def torch_attention(seq: int, b: int, heads: int, d: int, causal: bool) -> tuple[np.ndarray, ...]:
    """(output, dq, dk, dv) of full attention on the whole sequence, by torch autograd in float64."""
    import torch
    q, k, v = (torch.tensor(full(n, (b, heads, seq, d)), requires_grad=True) for n in "qkv")
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), -math.inf)
    out = torch.softmax(s, -1) @ v
    (out * torch.tensor(full("do", (b, heads, seq, d)))).sum().backward()
    return out.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def run_cp_layer(shape: ModelSpec, tp: int, cp: int, sp: bool, split: str, s: int, comm: str = "p2p"):
    """A whole transformer layer forward and backward on a TP x CP layout (CP's exchange `comm`), on the shared
    draws layer_check's torch reference takes: the run, each rank's values its positions, output, input gradient,
    weight gradients and coordinates."""
    def program(ctx):
        t = ParallelContext(ctx, ctx.groups["tp"] if tp > 1 else None, sp=sp, cp_group=ctx.groups["cp"], seq=s,
                            cp_split=split, cp_comm=comm)
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0")
        idx = ctx.xp.asarray(t.token_positions())
        x = ctx.xp.take(ctx.shared_rng("x").normal((s, 1, shape.hidden)), idx, axis=0)
        dy = ctx.xp.take(ctx.shared_rng("dy").normal((s, 1, shape.hidden)), idx, axis=0)
        y, cache = layer.forward(x, Saved())
        dx = layer.backward(cache, dy)
        return {"pos": t.token_positions(), "y": y, "dx": dx, "grads": layer.grads, "cp": ctx.coords.cp,
                "tp": ctx.coords.tp}
    return parasim.run(program, layout=Layout(tp=tp, cp=cp, sp=sp, cp_comm=comm), seed=SEED)

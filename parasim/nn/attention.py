"""Causal multi-head self-attention with heads split over TP ranks, grouped-query attention included.

Q, K and V come from one fused column-parallel weight whose columns are grouped by head: a rank holds
some heads entirely, because softmax needs complete scores and a score spans every dim of its head. So
scores, softmax and weighted values need no communication; the output projection is row-parallel.
With fewer kv heads than TP ranks each kv head is replicated on tp/kv ranks; its weight gradient is then
a partial sum over those ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..comm.interface import Array
from ..layout import LayoutError, check_heads
from .core import ParallelContext, Saved, Weights
from .dropout import dropout_mask
from .linear import ColumnParallelLinear, RowParallelLinear


def head_split(heads: int, kv_heads: int, t: int, r: int) -> tuple[list[int], list[int]]:
    """(q heads, kv heads) of TP rank r: q heads split evenly; kv heads split when kv >= t, else replicated."""
    check_heads(heads, kv_heads, t)
    per = heads // t
    q = list(range(r * per, (r + 1) * per))
    if kv_heads >= t:
        kvp = kv_heads // t
        return q, list(range(r * kvp, (r + 1) * kvp))
    return q, [r // (t // kv_heads)]


@dataclass(frozen=True)
class AttentionWeights:
    """The attention block's weights, whole: Q, K and V ([hidden, heads x d], kv heads for K and V), the
    output projection ([heads x d, hidden]) and their biases (None: no bias)."""

    wq: Array
    wk: Array
    wv: Array
    wo: Array
    bq: Any = None
    bk: Any = None
    bv: Any = None
    bo: Any = None

    @classmethod
    def of(cls, weights: Mapping[str, Any]) -> AttentionWeights:
        """Those of a layer's weights (`layer_weights`' names; a bias not there is None)."""
        return cls(**{f.name: weights.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class HeadCounts:
    """How many query heads, and how many key/value heads they share (None: as many, no grouping)."""

    heads: int
    kv_heads: int | None = None

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads


@dataclass(frozen=True)
class AttentionOptions:
    """How attention runs: dropout on its probabilities, and FlashAttention's recompute of the softmax in
    backward instead of keeping it."""

    dropout: float = 0.0
    flash: bool = False


class ParallelAttention(Weights):
    def __init__(
        self,
        par: ParallelContext,
        weights: AttentionWeights,
        heads: HeadCounts,
        options: AttentionOptions = AttentionOptions(),
        key: str = "attn",
        name: str = "attn",
    ):
        xp, w_ = par.xp, weights
        self.par, self.name, self.key, self.p, self.flash = par, name, key, options.dropout, options.flash
        self.heads, self.kv_heads = heads.heads, heads.kv
        self.d = w_.wq.shape[1] // self.heads
        self.q_heads, self.kv_local = head_split(self.heads, self.kv_heads, par.tp_world_size, par.tp_rank)
        d = self.d
        nq = self.heads * d

        def head_cols(heads: list[int], start: int) -> np.ndarray:
            """The columns of `heads` (d each) in the block of the fused weight that begins at `start`."""
            return (start + np.asarray(heads, dtype=np.int64)[:, None] * d + np.arange(d)).reshape(-1)

        # q's heads, then k's and v's local ones (128 heads of 128 at real size: built as arrays, not lists)
        kv_start = nq + self.kv_heads * d
        cols = np.concatenate(
            [head_cols(self.q_heads, 0), head_cols(self.kv_local, nq), head_cols(self.kv_local, kv_start)]
        )
        w = xp.concat([w_.wq, w_.wk, w_.wv], axis=1)
        b = None if w_.bq is None else xp.concat([w_.bq, w_.bk, w_.bv], axis=0)
        self.qkv = ColumnParallelLinear(par, w, b, name=f"{name}.qkv", columns=cols)
        self.out = RowParallelLinear(par, w_.wo, w_.bo, name=f"{name}.out")
        # each local q head reads the local kv head of its group
        group = self.heads // self.kv_heads
        self.kv_of = [self.kv_local.index(h // group) for h in self.q_heads]

    def _split(self, y: Array) -> tuple[Any, Any, Any]:
        """[s, b, cols] -> q [b, hq, s, d], k and v [b, hkv, s, d]."""
        xp, d = self.par.xp, self.d
        s, b = y.shape[0], y.shape[1]
        nq, nk = len(self.q_heads) * d, len(self.kv_local) * d

        def heads(part: Array, n: int) -> Array:
            return xp.permute_dims(xp.reshape(part, (s, b, n, d)), (1, 2, 0, 3))

        return (
            heads(y[..., :nq], len(self.q_heads)),
            heads(y[..., nq : nq + nk], len(self.kv_local)),
            heads(y[..., nq + nk :], len(self.kv_local)),
        )

    def _probs(self, q: Array, k: Array) -> Array:
        xp = self.par.xp
        kk = xp.take(k, xp.asarray(self.kv_of), axis=1)  # the kv head each q head reads
        scores = xp.matmul(q, xp.permute_dims(kk, (0, 1, 3, 2))) / math.sqrt(self.d)
        s = scores.shape[-1]
        causal = xp.arange(s)[None, :] > xp.arange(s)[:, None]  # key after query: masked
        scores = xp.where(causal, xp.full_like(scores, -math.inf), scores)
        scores = scores - xp.max(scores, axis=-1, keepdims=True)
        e = xp.exp(scores)
        return e / xp.sum(e, axis=-1, keepdims=True)

    def _mask(self, probs: Array) -> Any:
        b, _, s, _ = probs.shape
        return dropout_mask(
            self.par,
            f"{self.key}.probs",
            (b, self.heads, s, s),
            self.p,
            probs.dtype,
            (slice(None), slice(self.q_heads[0], self.q_heads[-1] + 1)),
        )

    def _ring(self):
        """CP's attention: a ring of K/V transfers (p2p) or K/V all-gathered (all_gather), as the layout says."""
        from .gathered_attention import GatheredAttention
        from .ring_attention import RingAttention

        par = self.par
        if self.p:
            raise LayoutError("attention-probability dropout is not modelled with context parallelism")
        kind, name = (GatheredAttention, "gather") if par.cp_comm == "all_gather" else (RingAttention, "ring")
        # K and V go at their own heads, each q head's copy made where it is read
        return kind(
            par.ctx,
            par.cp_group,
            par.seq,
            split=par.cp_split,
            causal=True,
            name=f"{self.name}.{name}",
            kv_of=self.kv_of,
            fold=self._fold,
        )

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        xp = self.par.xp
        y, c_qkv = self.qkv.forward(x, saved)
        q, k, v = self._split(y)
        if self.par.cp_world_size > 1:  # the sequence is split over CP ranks: attend around the ring
            for label, a in (("q", q), ("k", k), ("v", v)):
                saved.keep(self.name, label, a)
            ring = self._ring()
            o, c_ring = ring.forward(q, k, v)  # K and V at their own heads
            b_, hq, s, d = o.shape
            o = xp.reshape(xp.permute_dims(o, (2, 0, 1, 3)), (s, b_, hq * d))
            out, c_out = self.out.forward(o, saved)
            return out, (c_qkv, q, k, v, ("ring", ring, c_ring), c_out)
        for label, a in (("q", q), ("k", k), ("v", v)):
            saved.keep(self.name, label, a)
        probs = self._probs(q, k)
        mask = self._mask(probs) if self.p else None
        dropped = probs if mask is None else probs * mask / (1.0 - self.p)
        if not self.flash:  # FlashAttention recomputes these in backward instead of keeping them
            saved.keep(self.name, "softmax", probs)
            if mask is not None:
                saved.keep(self.name, "softmax dropout mask", mask, unit=1)
                saved.keep(self.name, "softmax dropout output", dropped)
        vv = xp.take(v, xp.asarray(self.kv_of), axis=1)
        o = xp.matmul(dropped, vv)  # [b, hq, s, d]
        b_, hq, s, d = o.shape
        o = xp.reshape(xp.permute_dims(o, (2, 0, 1, 3)), (s, b_, hq * d))
        out, c_out = self.out.forward(o, saved)
        return out, (c_qkv, q, k, v, None if self.flash else (probs, mask, dropped), c_out)

    def backward(self, cache: tuple, dy: Array) -> Array:
        xp = self.par.xp
        c_qkv, q, k, v, kept, c_out = cache
        if kept is not None and isinstance(kept[0], str):  # ("ring", ring, its cache)
            _, ring, c_ring = kept
            do = self.out.backward(c_out, dy)
            s, b_ = do.shape[0], do.shape[1]
            do = xp.permute_dims(xp.reshape(do, (s, b_, len(self.q_heads), self.d)), (1, 2, 0, 3))
            dq, dk, dv = ring.backward(c_ring, do)  # dK and dV at K's and V's own heads
            return self._qkv_backward(c_qkv, dq, dk, dv, s, b_)
        if kept is None:
            probs = self._probs(q, k)
            mask = self._mask(probs) if self.p else None
            dropped = probs if mask is None else probs * mask / (1.0 - self.p)
        else:
            probs, mask, dropped = kept
        do = self.out.backward(c_out, dy)  # [s, b, hq*d]
        s, b_ = do.shape[0], do.shape[1]
        do = xp.permute_dims(xp.reshape(do, (s, b_, len(self.q_heads), self.d)), (1, 2, 0, 3))
        idx = xp.asarray(self.kv_of)
        vv = xp.take(v, idx, axis=1)
        d_dropped = xp.matmul(do, xp.permute_dims(vv, (0, 1, 3, 2)))
        dvv = xp.matmul(xp.permute_dims(dropped, (0, 1, 3, 2)), do)
        dprobs = d_dropped if mask is None else d_dropped * mask / (1.0 - self.p)
        dscores = probs * (dprobs - xp.sum(dprobs * probs, axis=-1, keepdims=True)) / math.sqrt(self.d)
        kk = xp.take(k, idx, axis=1)
        dq = xp.matmul(dscores, kk)
        dkk = xp.matmul(xp.permute_dims(dscores, (0, 1, 3, 2)), q)
        return self._qkv_backward(c_qkv, dq, self._fold(dkk, k.shape), self._fold(dvv, v.shape), s, b_)

    def _qkv_backward(self, c_qkv: tuple, dq: Array, dk: Array, dv: Array, s: int, b_: int) -> Any:
        xp = self.par.xp

        def cols(a: Array) -> Any:  # [b, h, s, d] -> [s, b, h*d]
            return xp.reshape(xp.permute_dims(a, (2, 0, 1, 3)), (s, b_, a.shape[1] * self.d))

        return self.qkv.backward(c_qkv, xp.concat([cols(dq), cols(dk), cols(dv)], axis=-1))

    def _fold(self, per_q: Array, shape: tuple) -> Array:
        """Sum the gradients of q heads that share a kv head onto that kv head."""
        xp = self.par.xp
        if list(self.kv_of) == list(range(shape[1])):  # one q head per kv head: nothing to sum
            return per_q
        parts = []
        sharing: dict[int, list[int]] = {}  # kv head -> the q heads that read it
        for i, kv in enumerate(self.kv_of):
            sharing.setdefault(kv, []).append(i)
        for j in range(shape[1]):
            heads = sharing[j]
            parts.append(sum(per_q[:, i : i + 1] for i in heads[1:]) + per_q[:, heads[0] : heads[0] + 1])
        return xp.concat(parts, axis=1)

    @property
    def grads(self) -> dict[str, Any]:
        return {
            **{f"qkv.{k}": v for k, v in self.qkv.grads.items()},
            **{f"out.{k}": v for k, v in self.out.grads.items()},
        }

    @property
    def placements(self) -> dict[str, dict]:
        """Q, K and V's columns by head, then the output's rows (kv heads fewer than TP ranks are replicated
        on tp/kv ranks: their columns' gradients are partial over those ranks, which checks sum by hand)."""
        return {
            **{f"qkv.{k}": p for k, p in self.qkv.placements.items() if getattr(self.qkv, k) is not None},
            **{f"out.{k}": p for k, p in self.out.placements.items() if getattr(self.out, k) is not None},
        }

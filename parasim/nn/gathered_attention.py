"""Context parallelism by all-gather: each CP rank gathers the whole sequence's keys and values, then attends its
own queries to them. Llama 3 trained its long-context stage this way (the Llama 3 paper, section 3.3.2: K and V
all-gathered, the local Q chunk attended, the split balanced for the causal mask); Megatron-Core calls it
`--cp-comm-type all_gather` (TransformerEngine's attention with K/V all-gather).

Against the ring (ring_attention.py) it trades overlap for simplicity: K and V move in one collective each
before attention, not a chunk per step beside it, and the causal mask is applied to the gathered sequence at
once. Backward gathers K and V again (nothing of the whole sequence is kept between the passes) and hands every
rank the gradients of its own keys and values with a reduce-scatter: each rank's dK and dV are sums over every
rank's queries. Only collectives, and under the zigzag split every CP rank's work alike: a run that folds ranks
doing the same work folds CP ranks like TP ranks."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ..comm.interface import Array, Group
from ..engine.context import Context
from .ring_attention import SequenceSplit

SEQ_DIM = 2  # q, k, v are [batch, heads, sequence, head size]


class GatheredAttention:
    """Causal (or not) attention of q [b, heads, s_local, d] against the whole sequence's k, v over a CP group,
    K and V gathered; the same calls as RingAttention (`forward`, `backward`).

    K and V travel at their own heads (a grouped-query model's few): `kv_of` names the K/V head each q head
    reads, and each q head's copy is made after the gather; `fold(per_q, shape)` sums the q heads' gradients
    back onto their K/V head before the reduce-scatter sends them home. Without them K and V come at q's heads."""

    def __init__(
        self,
        ctx: Context,
        group: Group | None,
        seq: int,
        split: str,
        causal: bool,
        name: str = "gather",
        kv_of: Sequence[int] | None = None,
        fold: Callable[[Any, tuple], Any] | None = None,
    ):
        self.ctx, self.group, self.causal, self.name = ctx, group, causal, name
        self.kv_of, self.fold = kv_of, fold
        self.cp = 1 if group is None else group.size
        self.r = 0 if group is None else group.group_rank(ctx.rank)
        self.sequence = SequenceSplit(split, seq, self.cp)

    def _mask(self) -> Any:
        """True where a gathered key comes after the query (masked), or None without masking. The gathered
        sequence holds every CP rank's positions in group order (what an all-gather along it gives)."""
        if not self.causal:
            return None
        xp = self.ctx.xp
        q = self.sequence.index(self.r, xp)
        k = xp.concat([self.sequence.index(i, xp) for i in range(self.cp)])
        return k[None, :] > q[:, None]

    def _flops(self, b: int, heads: int, d: int) -> float:
        """QK^T and PV over the keys each query sees (2 flops a multiply-add), in blocks of the fine split as the
        ring counts them: a block before the diagonal whole, a diagonal block half."""
        seq = self.sequence
        blocks = sum(
            1.0 if not self.causal or k < q else 0.5 if k == q else 0.0
            for q in seq.chunks[self.r]
            for k in range(seq.seq // seq.fine)
        )
        return blocks * 4 * b * heads * seq.fine * seq.fine * d

    def _gather(self, a: Array, what: str) -> Any:
        if self.group is None:
            return a
        return self.ctx.comm.all_gather(a, dim=SEQ_DIM, group=self.group, label=f"{self.name}: gather {what}")

    def _heads(self, a: Array) -> Any:
        """Each q head's copy of its K/V head."""
        return a if self.kv_of is None else self.ctx.xp.take(a, self.ctx.xp.asarray(self.kv_of), axis=1)

    def _scores(self, q: Array, k: Array) -> Any:
        xp = self.ctx.xp
        scores = xp.matmul(q, xp.permute_dims(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(q.shape[-1]))
        mask = self._mask()
        return scores if mask is None else xp.where(mask, xp.full_like(scores, -math.inf), scores)

    def forward(self, q: Array, k: Array, v: Array) -> tuple[Array, tuple]:
        xp = self.ctx.xp
        b, heads, _, d = q.shape
        kg, vg = self._heads(self._gather(k, "K")), self._heads(self._gather(v, "V"))
        scores = self._scores(q, kg)
        m = xp.max(scores, axis=-1)  # every query sees at least itself: no row is all masked
        p = xp.exp(scores - m[..., None])
        l = xp.sum(p, axis=-1)
        out = xp.matmul(p, vg) / l[..., None]
        self.ctx.compute(f"{self.name}: attend to the gathered K/V", self._flops(b, heads, d))
        return out, (q, k, v, out, m + xp.log(l))

    def backward(self, cache: tuple, dout: Array) -> tuple[Any, Any, Any]:
        """dq, dk, dv of this rank's chunk: K and V gathered again; dK and dV summed over the group's queries and
        scattered back to the ranks that hold them."""
        xp = self.ctx.xp
        q, k, v, out, lse = cache
        scale = 1.0 / math.sqrt(q.shape[-1])
        kg, vg = self._heads(self._gather(k, "K again")), self._heads(self._gather(v, "V again"))
        p = xp.exp(self._scores(q, kg) - lse[..., None])  # the softmax weights, from the kept log-sum-exp
        delta = xp.sum(dout * out, axis=-1)  # rowsum(dO * O): the softmax backward's correction term
        dvg = xp.matmul(xp.permute_dims(p, (0, 1, 3, 2)), dout)
        ds = p * (xp.matmul(dout, xp.permute_dims(vg, (0, 1, 3, 2))) - delta[..., None]) * scale
        dq = xp.matmul(ds, kg)
        dkg = xp.matmul(xp.permute_dims(ds, (0, 1, 3, 2)), q)
        if self.fold is not None:  # each K/V head's gradient: the sum of its q heads'
            whole = (k.shape[0], k.shape[1], dkg.shape[SEQ_DIM], k.shape[3])
            dkg, dvg = self.fold(dkg, whole), self.fold(dvg, whole)
        if self.group is None:
            return dq, dkg, dvg
        comm, g = self.ctx.comm, self.group
        dk = comm.reduce_scatter(dkg, dim=SEQ_DIM, group=g, label=f"{self.name} backward: reduce-scatter dK")
        dv = comm.reduce_scatter(dvg, dim=SEQ_DIM, group=g, label=f"{self.name} backward: reduce-scatter dV")
        return dq, dk, dv

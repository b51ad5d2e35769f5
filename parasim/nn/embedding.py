"""Vocabulary-parallel embedding and cross-entropy: the vocabulary is split over TP ranks.

The embedding table is split by rows (tokens): a rank looks up the tokens it owns, zeros for the rest,
and g's all-reduce (a reduce-scatter under SP) assembles every token's vector. The output layer is a
column-parallel linear, so each rank holds the logits of its slice of the vocabulary; the loss then needs
only three small all-reduces (the max, the sum of exponentials, the target's logit), never the whole
logits on one rank.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .core import ParallelContext, Saved, Shard, Weights


def owned_one_hot(par: ParallelContext, ids: Array, vocab: int) -> Array:
    """A one-hot of each token over this rank's vocabulary slice (all zero for tokens it does not own)."""
    n = vocab // par.tp_world_size
    mine = par.xp.arange(n) + par.tp_rank * n  # the token ids this rank owns: a contiguous block
    return par.xp.astype(ids[..., None] == mine, par.xp.float64)


class VocabParallelEmbedding(Weights):
    def __init__(self, par: ParallelContext, weight: Array, name: str = "embedding"):
        self.par, self.name, self.vocab = par, name, weight.shape[0]
        self.placements = {"weight": {"tp": Shard(0)}}  # rows of the vocabulary
        self.weight = par.shard(weight, 0)
        self.grads: dict[str, Any] = {}

    def forward(self, ids: Array, saved: Saved) -> tuple[Array, tuple]:
        """ids [s, b] (whole sequence on every rank) -> [s, b, h] (this rank's tokens under SP)."""
        par, xp = self.par, self.par.xp
        onehot = owned_one_hot(par, ids, self.vocab)
        partial = xp.matmul(onehot, self.weight)  # a row lookup, written as a product the backward can reuse
        y = par.scatter_seq(partial, f"{self.name}: reduce-scatter") if par.sp else par.g_forward(partial)
        return y, (onehot,)

    def backward(self, cache: tuple, dy: Array) -> None:
        par, xp = self.par, self.par.xp
        (onehot,) = cache
        full = par.gather_seq(dy, f"{self.name} backward: all-gather") if par.sp else par.g_backward(dy)
        g = xp.tensordot(onehot, full, axes=([0, 1], [0, 1]))  # each owned row sums the grads of its tokens
        self.grads["weight"] = g if "weight" not in self.grads else self.grads["weight"] + g


class VocabParallelCrossEntropy:
    """Mean cross-entropy over all tokens from logits sharded on the vocabulary dim."""

    def __init__(self, par: ParallelContext, vocab: int, name: str = "loss"):
        self.par, self.vocab, self.name = par, vocab, name

    def forward(self, logits: Array, targets: Array, saved: Saved) -> tuple[Array, tuple]:
        par, xp = self.par, self.par.xp
        comm, group, alone = par.comm, par.tp_group, par.tp_world_size == 1
        local_max = xp.max(logits, axis=-1)
        m = local_max if alone else comm.all_reduce(local_max, op="max", group=group, label="loss: max logit")
        e = xp.exp(logits - m[..., None])
        local_sum = xp.sum(e, axis=-1)
        total = local_sum if alone else comm.all_reduce(local_sum, group=group, label="loss: sum of exp")
        onehot = owned_one_hot(par, targets, self.vocab)
        local_target = xp.sum(onehot * (logits - m[..., None]), axis=-1)
        target = local_target if alone else comm.all_reduce(local_target, group=group, label="loss: target logit")
        losses = xp.log(total) - target
        saved.keep(self.name, "softmax", e)
        count = 1
        for n in losses.shape:
            count *= int(n)
        return xp.sum(losses) / count, (e, total, onehot, count)

    def backward(self, cache: tuple) -> Array:
        """d(mean loss)/d(logits) of this rank's vocabulary slice: (softmax - onehot) / tokens. No communication."""
        e, total, onehot, count = cache
        return (e / total[..., None] - onehot) / count

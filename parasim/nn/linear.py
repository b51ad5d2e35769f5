"""Column- and row-parallel linear layers (Megatron-LM), forward and backward side by side.

A column-parallel layer splits its weight by output columns: every rank sees the whole input and makes
finished values for its own columns, so a nonlinearity can follow with no communication. A row-parallel
layer splits its weight by input rows: each rank multiplies its slice of the input and holds a partial
sum, which one all-reduce (g) completes, or a reduce-scatter under sequence parallelism.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .core import ParallelContext, Saved, Weights
from ..layout.placement import Partial, Replicate, Shard, settle


def _weight_grad(xp: Any, x: Array, dy: Array) -> Array:
    """dW = sum over every leading dim of x^T dy: [.., in] x [.., out] -> [in, out]."""
    lead = list(range(x.ndim - 1))
    return xp.tensordot(x, dy, axes=(lead, lead))


def _bias_grad(xp: Any, dy: Array) -> Array:
    return xp.sum(dy, axis=tuple(range(dy.ndim - 1)))


def mark_output(par: ParallelContext, tag: str | None, name: str, y: Array, p: Array, rows: Array) -> None:
    """With a tag (`Saved.tag`), mark a layer's output for `parasim check` as `tag.name.out`: placed `p` over
    TP, and with CP the rows (sequence positions) this rank holds of the whole sequence (a method giving
    them: asked only when marking)."""
    if tag is not None:
        rows = rows() if callable(rows) else rows
        par.ctx.mark(f"{tag}.{name}.out", y, p, par.tp_group, rows=rows, size=par.seq if rows is not None else None)


class _Linear(Weights):
    """What both linear layers share: the weight gradients they add up over backward passes."""

    grads: dict[str, Any]

    def _accumulate(self, key: str, g: Array) -> None:
        self.grads[key] = g if key not in self.grads else self.grads[key] + g


class ColumnParallelLinear(_Linear):
    """y_i = x W[:, block i] (+ b_i). Input replicated (sequence-sharded under SP), output sharded on its last dim."""

    def __init__(
        self, par: ParallelContext, weight: Array, bias: Array = None, name: str = "column", columns: Array = None
    ):
        """`columns`: this rank's column indices of `weight`, when the even split does not apply (attention
        takes whole heads of Q, K and V in one fused weight, and may replicate kv heads)."""
        self.par, self.name, self.even = par, name, columns is None
        # input replicated (Shard(0) of the sequence under SP), output sharded on its last dim; each
        # instance its own declaration, so moving one layer's placement moves no other's
        self.placements = {"weight": {"tp": Shard(1)}, "bias": {"tp": Shard(0)}}
        if columns is None:
            self.weight = par.shard(weight, 1)
            self.bias = None if bias is None else par.shard(bias, 0)
        else:
            idx = par.xp.asarray(columns)
            self.weight = par.xp.take(weight, idx, axis=1)
            self.bias = None if bias is None else par.xp.take(bias, idx, axis=0)
        self.grads: dict[str, Any] = {}

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        par, xp = self.par, self.par.xp
        # f: every rank needs the whole input. Under SP the input arrives split by sequence: gather it.
        full = par.gather_seq(x, f"{self.name}: all-gather the sequence") if par.sp else par.f_forward(x)
        saved.keep(self.name, "input", x if par.sp else full)  # SP keeps only its shard, gathers again later
        y = xp.matmul(full, self.weight)
        if self.bias is not None:
            y = y + self.bias
        if self.even:  # chosen columns (attention's fused heads) are no one slice: a placement cannot say them
            rows = par.cp_positions if par.cp_world_size > 1 else None
            mark_output(par, saved.tag, self.name, y, Shard(y.ndim - 1), rows)
        return y, (x,)

    def backward(self, cache: tuple, dy: Array) -> Array:
        par, xp = self.par, self.par.xp
        (x,) = cache

        def weights() -> None:
            full = par.gather_seq(x, f"{self.name} backward: all-gather the sequence again") if par.sp else x
            self._accumulate("weight", _weight_grad(xp, full, dy))
            if self.bias is not None:
                self._accumulate("bias", _bias_grad(xp, dy))

        par.weight_grad(weights)
        dx = xp.matmul(dy, xp.permute_dims(self.weight, (1, 0)))  # a partial sum: this rank's columns only
        # the backward of f (a copy) is a sum over ranks; under SP the sum lands back on sequence shards
        return par.scatter_seq(dx, f"{self.name} backward: reduce-scatter") if par.sp else par.f_backward(dx)


class RowParallelLinear(_Linear):
    """y = sum_i x_i W[block i, :] (+ b). Input sharded on its last dim, output replicated (sequence-sharded
    under SP) once the partial sums are reduced."""

    def __init__(self, par: ParallelContext, weight: Array, bias: Array = None, name: str = "row"):
        self.par, self.name = par, name
        # input sharded on its last dim; output a partial sum until g (or SP's reduce-scatter) sums it.
        # The bias is added after the sum, whole on every rank; under SP each rank adds it to its own
        # tokens only, so its gradient is a partial sum over TP.
        self.placements = {"weight": {"tp": Shard(0)}, "bias": {"tp": Partial() if par.sp else Replicate()}}
        self.weight = par.shard(weight, 0)
        self.bias = None if bias is None else par.xp.asarray(bias, copy=True)
        self.grads: dict[str, Any] = {}

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        par, xp = self.par, self.par.xp
        saved.keep(self.name, "input", x)
        partial = xp.matmul(x, self.weight)
        y = par.scatter_seq(partial, f"{self.name}: reduce-scatter the sequence") if par.sp else par.g_forward(partial)
        if self.bias is not None:
            y = y + self.bias
        if par.cp_world_size > 1:  # each rank's tokens: its CP slice, and under SP its share of that
            mark_output(par, saved.tag, self.name, y, Replicate(), par.token_positions if par.sp else par.cp_positions)
        else:
            mark_output(par, saved.tag, self.name, y, Shard(0) if par.sp else Replicate(), None)
        return y, (x,)

    def backward(self, cache: tuple, dy: Array) -> Array:
        par, xp = self.par, self.par.xp
        (x,) = cache

        def bias() -> None:
            db = _bias_grad(xp, dy)
            db = settle(par, self.placements["bias"], db, f"{self.name} backward: sum bias grad (SP)")
            self._accumulate("bias", db)

        if self.bias is not None:
            par.weight_grad(bias)
        full = par.gather_seq(dy, f"{self.name} backward: all-gather the sequence") if par.sp else par.g_backward(dy)
        par.weight_grad(lambda: self._accumulate("weight", _weight_grad(xp, x, full)))
        return xp.matmul(full, xp.permute_dims(self.weight, (1, 0)))

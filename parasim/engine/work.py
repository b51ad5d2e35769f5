"""The work a rank's own computation does between its collectives: FLOPs by kind, counted as the program runs.

The clock (parasim/clock) times a rank's compute from these counts: the FLOPs a rank did since its previous
event are the compute that stands before that event on the rank's timeline (trace.Member.work), and what it
did after its last event is the step's tail (trace.meta["tail_work"]).

Kinds, each timed at its own efficiency (estimate/hardware.py):
- "matmul": a product with a weight (a 2-D operand): the linear layers, the experts, the router, and the
  weight gradients (tensordot).
- "attention": a product of two activations (both operands batched, 3-D or more): QK^T and PV, forward and
  backward, which run at another share of peak than the weight products (FlashAttention's kernels).
A product counts 2 FLOPs per multiply-add: every output value took k multiply-adds, k the summed length.
Each product's shape is kept beside the totals (`Work.gemms`: (kind, m, n, k) -> how many), so the clock
times each one at the share of peak a product of its shape measures (clock/kernels_time.py).

Beside the FLOPs, the roundings: each product adds k (its summed length) and each sum or mean the terms it
added, for the rank that ran it. Added up, they bound how many roundings any one value of the rank went
through in ctx.xp's products and sums, which is what engine/tolerance.py needs to say how far a real rank's
arithmetic may drift from a virtual rank's (arithmetic outside ctx.xp is not seen).
"""

from __future__ import annotations

from math import prod
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from ..comm.trace import Work
from .tolerance import reduced

WORK_KINDS = ("matmul", "attention")
Shape = tuple[int, int, int, int]  # (m, n, k, how many): `how many` (m x k) @ (k x n) products


def matmul_work(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int]) -> tuple[str, int, Shape]:
    """(kind, FLOPs, shape) of `a @ b`: rows m of `a`'s last two dims (1 for a vector), the summed k, the columns
    n of `b` (1 for a vector), and the products its batch dims hold."""
    kind = "attention" if len(a_shape) >= 3 and len(b_shape) >= 3 else "matmul"
    k = a_shape[-1] if a_shape else 1
    m = a_shape[-2] if len(a_shape) >= 2 else 1
    n = b_shape[-1] if len(b_shape) >= 2 else 1
    return kind, 2 * prod(out_shape) * k, (int(m), int(n), int(k), max(1, int(prod(out_shape) // max(1, m * n))))


def tensordot_work(out_shape: Sequence[int], summed: int) -> tuple[str, int, Shape]:
    """(kind, FLOPs, shape) of a tensordot whose summed dims hold `summed` values: a weight's gradient, an
    (m x summed) @ (summed x n) product, m the output's first dim and n the rest."""
    m = out_shape[0] if out_shape else 1
    return "matmul", 2 * prod(out_shape) * summed, (int(m), int(prod(out_shape[1:])), int(summed), 1)


class Meter:
    """Each rank's FLOPs by kind, counted for the rank whose turn it is (`turn`: the run's scheduler
    answers), and handed out once (`take`): the work since the rank's last event."""

    __slots__ = ("turn", "since", "total", "roundings", "busy")

    def __init__(self, world: int, turn: Callable[[], int]):
        self.turn = turn
        self.since: list[Work] = [Work() for _ in range(world)]
        self.total = [0] * world
        self.roundings = [0] * world  # each rank's products' summed lengths and its sums' additions, added up
        # the ranks whose `since` may hold work (every one that does): a collective whose members computed nothing
        # since their last event, a loop of them, asks nothing of each member (`take_all`)
        self.busy: set[int] = set()

    def add(self, kind: str, flops: int, shape: Shape | None = None) -> None:
        r = self.turn()
        self.busy.add(r)
        got = self.since[r]
        got[kind] = got.get(kind, 0) + flops
        if shape is not None:
            key = (kind, shape[0], shape[1], shape[2])
            got.gemms[key] = got.gemms.get(key, 0) + shape[3]
        self.total[r] += flops

    def round(self, k: int) -> None:
        """The rank whose turn it is made an operation whose every result went through k roundings."""
        self.roundings[self.turn()] += k

    def take(self, rank: int) -> Work | None:
        """The work `rank` did since it was last taken (None: none)."""
        got = self.since[rank]
        if not got:
            return None
        self.since[rank] = Work()
        self.busy.discard(rank)
        return got

    def put(self, rank: int, work: Work) -> None:
        """`work` as what `rank` did since its last event (a repeated call's, engine/symbolic/repeat.py)."""
        self.since[rank] = work
        self.busy.add(rank)

    def take_all(self, ranks: Sequence[int]) -> list[Work | None]:
        """`take` of each of `ranks`, in one call (every member of every collective: the hot path)."""
        busy = self.busy
        if not busy:
            return [None] * len(ranks)
        since = self.since
        out: list[Work | None] = []
        for r in ranks:
            got = since[r]
            if got:
                since[r] = Work()
                out.append(got)
            else:
                out.append(None)
        busy.difference_update(ranks)
        return out


def counting(xp: Any, meter: Meter) -> Any:
    """`xp` with its products counted on `meter`: every name of the namespace as it is, matmul and
    tensordot wrapped (the two products the layers use). Built once per run: a copy of the namespace's
    names, so every other call costs nothing more."""
    ns = SimpleNamespace(**vars(xp))  # __name__ included: a program may ask which namespace it has
    matmul, tensordot, asarray = xp.matmul, xp.tensordot, xp.asarray

    def counted_matmul(a: Any, b: Any, /, **kw: Any) -> Any:
        out = matmul(a, b, **kw)
        meter.add(*matmul_work(a.shape, b.shape, out.shape))
        meter.round(a.shape[-1] if a.shape else 1)
        return out

    def counted_tensordot(a: Any, b: Any, /, *, axes: Any = 2) -> Any:
        out = tensordot(a, b, axes=axes)
        sa = asarray(a).shape
        if isinstance(axes, int):
            summed = prod(sa[len(sa) - axes :]) if axes else 1
        else:
            first = axes[0]
            summed = prod(sa[k] for k in ([first] if isinstance(first, int) else first))
        meter.add(*tensordot_work(out.shape, summed))
        meter.round(summed)
        return out

    def summing(fn: Callable[..., Any], divides: bool) -> Callable[..., Any]:
        """fn (a sum, or a mean: one rounding more, its division) with its additions counted."""

        def counted(x: Any, /, *args: Any, **kw: Any) -> Any:
            out = fn(x, *args, **kw)
            meter.round(reduced(int(np.size(x)), int(np.size(out)), divides))
            return out

        return counted

    ns.matmul, ns.tensordot = counted_matmul, counted_tensordot
    ns.sum, ns.mean = summing(xp.sum, False), summing(xp.mean, True)
    return ns

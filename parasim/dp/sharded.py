"""Data parallelism and ZeRO stages 1 and 2 as one Adam optimizer over a data-parallel group.

Every rank of the group holds a copy of the weights and computed gradients on its own data. What differs
between the stages is what a rank keeps and which collectives move the gradients (Rajbhandari et al.):

    stage 0 (DP)   all-reduce (average) the gradients; Adam on every weight, everywhere
    stage 1        reduce-scatter (average): each rank gets its 1/n share of the summed gradient; Adam on
                   that share only (1/n of the optimizer state); all-gather the updated weights
    stage 2        stage 1's collectives, and a rank keeps only its gradient share (the full gradient is
                   freed as soon as it is reduced)

Gradients travel in buckets (several tensors in one flat buffer, as DDP does) of at most `bucket` values.
`held()` counts what this rank keeps after a step, from the arrays themselves, in the training dtypes the
post uses: 2-byte weights and gradients, 4-byte fp32 master weights and Adam moments (12 bytes/param); the
same buffers are told to the trace as they are made and dropped (dp/held.py), so the engine counts them at
every event.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Group
from ..errors import UsageError
from .clip import check_max_norm, clip_coefficient
from .flat import FlatBuffer
from .held import Holdings
from .zero import adam
from ..engine.context import Context

STAGES = (0, 1, 2)


class ShardedAdam:
    def __init__(
        self,
        ctx: Context,
        group: Group,
        params: dict[str, Any],
        stage: int,
        lr: float = 1e-3,
        bucket: int | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        name: str | None = None,
    ) -> None:
        if stage not in STAGES:
            raise UsageError(f"ZeRO stage must be 0, 1 or 2 here, got {stage!r}")
        if bucket is not None and bucket < 1:
            raise UsageError(f"bucket must hold at least one value, got {bucket!r}")
        xp = ctx.xp
        self.ctx, self.group, self.stage, self.lr, self.betas, self.eps = ctx, group, stage, lr, betas, eps
        self.name = name or ("DP" if stage == 0 else f"ZeRO-{stage}") + f" over {group.name}"
        self.buf = FlatBuffer(params, group.size if stage else 1)
        self.total, self.padded = self.buf.total, self.buf.padded
        self.bucket = bucket or self.padded
        self.me = group.group_rank(ctx.rank)
        self.weights = self._flat(params)  # this rank's copy of every weight (the model's, flat)
        self.master = xp.asarray(self._mine(self.weights), copy=True)  # fp32 master copy of its part
        self.m, self.v = xp.zeros_like(self.master), xp.zeros_like(self.master)
        self.grad = None  # what this rank keeps of the gradient after a step
        self.t = 0
        self.holdings = Holdings(ctx, self.name)
        share, sizes = int(self.master.shape[0]), ctx.precision
        self.holdings.hold("weights", self.total * sizes.weight_bytes, "weights")
        # DP and ZeRO-1 keep a whole gradient buffer; ZeRO-2 keeps its share and reduces buckets as they fill
        self.holdings.hold("gradients", (share if stage == 2 else self.total) * sizes.grad_bytes, "gradients")
        self.holdings.hold("optimizer state", share * sizes.optimizer_bytes, "optimizer")

    def _flat(self, tensors: dict[str, Any]) -> Any:
        return self.buf.flat(self.ctx.xp, tensors)

    def _buckets(self) -> list[tuple[int, int]]:
        """[lo, hi) of each bucket; for ZeRO every bucket splits evenly over the group."""
        step = self.bucket if not self.stage else max(self.group.size, self.bucket - self.bucket % self.group.size)
        return [(lo, min(lo + step, self.padded)) for lo in range(0, self.padded, step)]

    def ranges(self, me: int | None = None) -> list[tuple[int, int]]:
        """[lo, hi) in the flat buffer of each piece group rank `me` (default: this rank) owns: all of it
        (DP), or its slice of every bucket (ZeRO: what a bucket's reduce-scatter hands it); its share is these
        pieces end to end."""
        if not self.stage:
            return [(0, self.padded)]
        n, me = self.group.size, self.me if me is None else me
        return [(lo + me * (hi - lo) // n, lo + (me + 1) * (hi - lo) // n) for lo, hi in self._buckets()]

    def _mine(self, flat: Any) -> Any:
        return self.ctx.xp.concat([flat[lo:hi] for lo, hi in self.ranges()])

    def step(self, grads: dict[str, Any], max_norm: float | None = None) -> dict[str, Any]:
        """Average the gradients over the group, update with Adam, and return every weight, updated. With
        `max_norm`, the averaged gradient is first clipped by its global norm (under ZeRO each rank holds a
        share: one all-reduce of the shares' sums of squares)."""
        check_max_norm(max_norm)
        xp, comm, g = self.ctx.xp, self.ctx.comm, self.group
        flat = self._flat(grads)
        if self.stage == 0:
            parts = [
                comm.all_reduce(flat[lo:hi], "avg", group=g, label=f"{self.name}: all-reduce a gradient bucket")
                for lo, hi in self._buckets()
            ]
            mine = xp.concat(parts)
        else:  # each bucket reduce-scattered: this rank's slice of every bucket, laid end to end in its share
            parts = []
            for lo, hi in self._buckets():
                if self.stage == 2:  # the bucket's whole gradients live only until they are reduced
                    self.holdings.hold(
                        "a whole gradient bucket", (hi - lo) * self.ctx.precision.grad_bytes, "gradients"
                    )
                parts.append(
                    comm.reduce_scatter(
                        flat[lo:hi], op="avg", group=g, label=f"{self.name}: reduce-scatter a gradient bucket"
                    )
                )
                if self.stage == 2:
                    self.holdings.free("a whole gradient bucket")
            mine = xp.concat(parts)
        if max_norm is not None:
            sq = float(xp.sum(mine * mine))
            if self.stage:  # shares are disjoint pieces of one gradient: add them up over the group
                sq = float(
                    comm.all_reduce(
                        self.ctx.asarray([sq]),
                        group=g,
                        label=f"{self.name}: add up the gradient shares' squares (clipping)",
                    )[0]
                )
            mine = mine * clip_coefficient(sq**0.5, max_norm)
        self.share_grad = mine  # the averaged (and clipped) gradient over `ranges()`
        self.grad = flat if self.stage == 1 else mine  # averaged (DP), local and whole (ZeRO-1), a share (ZeRO-2)
        self.t += 1
        self.master, self.m, self.v = adam(xp, self.master, self.m, self.v, mine, self.t, self.lr, self.betas, self.eps)
        if self.stage == 0:
            self.weights = self.master
        else:  # every bucket's slices back from every rank, in bucket order
            width = [(hi - lo) // g.size for lo, hi in self._buckets()]
            start, gathered = 0, []
            for w in width:
                gathered.append(
                    comm.all_gather(
                        self.master[start : start + w], group=g, label=f"{self.name}: all-gather updated weights"
                    )
                )
                start += w
            self.weights = xp.concat(gathered)
        return self.buf.unflat(xp, self.weights)

    def held(self) -> dict[str, int]:
        """Bytes this rank keeps between steps, counted from its arrays in the precision's dtypes: weights (the
        whole copy), gradients (whole, or the share under ZeRO-2), optimizer state (master, m, v of its share)."""
        grads = self.total if self.grad is None else min(int(self.grad.shape[0]), self.total)
        sizes = self.ctx.precision
        return {
            "weights": self.total * sizes.weight_bytes,
            "gradients": grads * sizes.grad_bytes,
            "optimizer": int(self.master.shape[0]) * sizes.optimizer_bytes,
        }

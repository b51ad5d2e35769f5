"""ZeRO-3 (the idea behind FSDP): weights sharded at rest, gathered one layer at a time.

Each rank of the data-parallel group keeps 1/n of a layer's weights (and of their gradients and Adam
state). Just before the layer's forward the shards are all-gathered into the whole weights, which are
freed after it; the same again before its backward. Right after the layer's backward its gradients are
reduce-scattered (averaged), so a rank receives the gradient of its own shard and the whole gradient is
dropped, and at the step Adam updates the shard where it lies: nothing is gathered then. Per step that
is two all-gathers and one reduce-scatter of the weights' size, 1.5 times data parallelism's all-reduce.
The buffers are told to the trace as they come and go (dp/held.py), so the transient peak of a gathered
layer shows at its event.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Group
from ..nn.core import Wrapper
from .flat import FlatBuffer
from .held import Holdings
from .zero import adam
from ..engine.context import Context


class Zero3(Wrapper):
    """A layer (the layer protocol, and `zero_grad`) whose weights live sharded over `group`; it follows the
    protocol too."""

    def __init__(
        self,
        ctx: Context,
        layer: Any,
        group: Group,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        xp = ctx.xp
        self.ctx, self.layer, self.group, self.lr, self.betas, self.eps = ctx, layer, group, lr, betas, eps
        self.key = getattr(layer, "key", "layer")  # a Stack names weights by it
        self.name = f"ZeRO-3 over {group.name}: {self.key}"
        whole = layer.params()
        self.buf = FlatBuffer(whole, group.size)
        self.keys, self.padded = self.buf.keys, self.buf.padded
        share = self.padded // group.size
        me = group.group_rank(ctx.rank)
        self.shard = xp.asarray(self._flat(whole)[me * share : (me + 1) * share], copy=True)  # fp32 master
        self.m, self.v = xp.zeros_like(self.shard), xp.zeros_like(self.shard)
        self.grad = xp.zeros_like(self.shard)  # this shard's gradient, averaged over the group
        self.t = 0
        self.peak_gathered = 0  # the most values this rank held at once for this layer (shard + gathered)
        self.holdings = Holdings(ctx, self.name)
        sizes = ctx.precision
        self.holdings.hold("weight shard", share * sizes.weight_bytes, "weights")
        self.holdings.hold("gradient shard", share * sizes.grad_bytes, "gradients")
        self.holdings.hold("optimizer shard", share * sizes.optimizer_bytes, "optimizer")
        self._free()

    # -- the whole weights, only while they are needed ----------------------------------------------
    def _flat(self, tensors: dict[str, Any]) -> Any:
        return self.buf.flat(self.ctx.xp, tensors)

    def _unflat(self, flat: Any) -> dict[str, Any]:
        return self.buf.unflat(self.ctx.xp, flat)

    def _gather(self, why: str) -> None:
        # the buffer, then the fill, in the dtype the products read
        self.holdings.hold("gathered weights", self.padded * self.ctx.precision.bytes("compute"), "gathered")
        whole = self.ctx.comm.all_gather(self.shard, group=self.group, label=f"{self.name}: all-gather weights {why}")
        self.layer.load(self._unflat(whole))
        self.peak_gathered = max(self.peak_gathered, self.padded + int(self.shard.shape[0]))

    def _free(self) -> None:
        """Drop the whole weights: the layer holds empty arrays until the next gather (a use before it fails)."""
        empty = self.ctx.xp.zeros((0,), dtype=self.shard.dtype)
        self.layer.load({k: empty for k in self.keys})
        if "gathered weights" in self.holdings.live:
            self.holdings.free("gathered weights")

    # -- the layer protocol (placements and grads pass through: Wrapper) -------------------------------
    def params(self) -> dict[str, Any]:
        """The whole weights, gathered (for checks; training never needs them whole outside a layer's use)."""
        whole = self.ctx.comm.all_gather(self.shard, group=self.group, label=f"{self.name}: all-gather for a check")
        return self._unflat(whole)

    def load(self, new: dict[str, Any]) -> None:
        n, me = self.group.size, self.group.group_rank(self.ctx.rank)
        share = self.padded // n
        self.shard = self._flat({**self.params(), **new})[me * share : (me + 1) * share]

    def forward(self, x: Any, saved: Any) -> tuple[Any, Any]:
        self._gather("before forward")
        try:
            return self.layer.forward(x, saved)
        finally:
            self._free()

    def backward(self, cache: Any, dy: Any) -> Any:
        self._gather("before backward")
        try:
            dx = self.layer.backward(cache, dy)
            # the layer's whole gradient is made while its weights are still gathered: both count at once
            self.holdings.hold("whole gradient", self.padded * self.ctx.precision.grad_bytes, "gradients")
        finally:
            self._free()
        self._reduce()
        return dx

    def _reduce(self) -> None:
        """Reduce-scatter (average) the gradient this backward produced, add it to this rank's shard, and
        let the layer forget it: the next backward (another micro-batch) starts from zero."""
        whole = self._flat(self.layer.grads)
        self.grad = self.grad + self.ctx.comm.reduce_scatter(
            whole, op="avg", group=self.group, label=f"{self.name}: reduce-scatter gradients"
        )
        self.layer.zero_grad()
        self.holdings.free("whole gradient")

    def step(self) -> None:
        """Update this rank's shard with Adam from its reduced gradient; the next step starts from zero."""
        xp = self.ctx.xp
        self.t += 1
        self.shard, self.m, self.v = adam(
            xp, self.shard, self.m, self.v, self.grad, self.t, self.lr, self.betas, self.eps
        )
        self.last_grad, self.grad = self.grad, xp.zeros_like(self.shard)

    def held(self) -> dict[str, int]:
        """Bytes kept between steps, in the training dtypes: a shard of the weights, of the gradients and of
        Adam's state (master, m, v)."""
        share, sizes = int(self.shard.shape[0]), self.ctx.precision
        return {
            "weights": share * sizes.weight_bytes,
            "gradients": share * sizes.grad_bytes,
            "optimizer": share * sizes.optimizer_bytes,
        }

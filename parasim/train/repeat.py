"""A layer whose calls repeat: on symbolic ranks, every micro-batch of a stage runs its layers on arrays of the
same shapes, so each layer's forward (and backward) at a shape does the same work each time: the backend runs
it once and tells the trace its events again for the others (Context.repeat; engine/symbolic/repeat.py). On
virtual and real ranks it is the layer itself. DeepSeek-V3's step at 2,048 GPUs runs each stage's 16
micro-batches' layers once instead of 16 times.

The training step wraps its layers in it only where a call's work depends on shapes alone: no values
(symbolic ranks), routing that draws alike on every call (or no experts), no split backward (zero-bubble's W
runs the weight-gradient work a backward queued); a forward whose data is tagged (`parasim check` marks
name the data) runs every time."""

from __future__ import annotations

from typing import Any

from ..engine.context import Context
from ..nn.core import Saved, Wrapper
from ..nn.routing import POLICIES, Routing


class _Cache:
    """A forward's cache, wrapped so that each call's is an object of its own (a repeated call hands back the
    first call's cache, and the wrappers above key their held bytes by the cache's identity)."""

    __slots__ = ("inner", "tag")

    def __init__(self, inner: Any, tag: str | None) -> None:
        self.inner, self.tag = inner, tag


class RepeatedLayer(Wrapper):
    """`layer`, its forward and backward repeated at a shape after the first (see the module's text)."""

    def __init__(self, ctx: Context, layer: Any) -> None:
        self.ctx, self.layer = ctx, layer
        self.key = getattr(layer, "key", "layer")
        self.name = getattr(layer, "name", self.key)
        self._memo: dict = {}  # this layer's calls on this rank: (direction, shape, dtype) -> the call to repeat

    def __getattr__(self, name: str) -> Any:
        """The layer's own parts (its shape, its MLP), for a stage that looks inside its layers (moe16's)."""
        if name == "layer":  # not set yet (a copy being made): no layer to ask
            raise AttributeError(name)
        return getattr(self.layer, name)

    def forward(self, x: Any, saved: Saved) -> tuple[Any, _Cache]:
        if saved.tag is not None:  # it marks what it hands on for `parasim check`, under the data's name
            y, cache = self.layer.forward(x, saved)
            return y, _Cache(cache, saved.tag)
        n = len(saved.items)

        def call() -> tuple[Any, Any, tuple]:
            y, cache = self.layer.forward(x, saved)
            return y, cache, tuple(saved.items[n:])

        (y, cache, kept), again = self.ctx.repeat(self._memo, ("forward", tuple(x.shape), str(x.dtype)), call)
        if again:  # what the first call kept for its backward, kept again
            saved.items.extend(kept)
        return y, _Cache(cache, None)

    def backward(self, cache: _Cache, dy: Any) -> Any:
        if cache.tag is not None:
            return self.layer.backward(cache.inner, dy)
        dx, _ = self.ctx.repeat(
            self._memo, ("backward", tuple(dy.shape), str(dy.dtype)), lambda: self.layer.backward(cache.inner, dy)
        )
        return dx


def repeats(ctx: Context, experts: int, routing: Routing | None, split_backward: bool) -> bool:
    """Whether a step's layer calls may repeat on `ctx` (the module's conditions; a forward that tags its data
    runs every time)."""
    alike = not experts or (routing is not None and POLICIES[routing.kind].alike)
    return ctx.symbolic and alike and not split_backward

"""What a rank keeps, told to the trace as it changes (`ctx.hold` / `ctx.free`), so that the engine can add
up the bytes of every rank at every event and find each rank's peak.

Sizes are counted in the training dtypes of the run's precision (`ctx.precision`, layout/precision.py: by
default the post's 2-byte weights and gradients and 12 bytes of FP32 master weights and Adam moments per
value), whatever dtype the run computes in: an exact run stays float64, the bytes are those of a real
training step.
"""

from __future__ import annotations

from typing import Any

from ..nn.core import Wrapper
from ..engine.context import Context


class Holdings:
    """The buffers one optimizer or wrapper told the trace about, under `prefix`, so it can drop them all."""

    def __init__(self, ctx: Context, prefix: str) -> None:
        self.ctx, self.prefix, self.live = ctx, prefix, set()

    def hold(self, what: str, nbytes: int, kind: str) -> None:
        self.ctx.hold(f"{self.prefix}: {what}", nbytes, kind)
        self.live.add(what)

    def free(self, what: str) -> None:
        self.ctx.free(f"{self.prefix}: {what}")
        self.live.discard(what)

    def release(self) -> None:
        """Free everything still held (the end of a run, or before another technique takes over)."""
        for what in sorted(self.live):
            self.free(what)


class HeldActivations(Wrapper):
    """A layer (the layer protocol) whose saved activations are held from its forward until its backward:
    the bytes its forward adds to `saved` (Korthikanti et al.'s units, see nn.core.Saved)."""

    def __init__(self, ctx: Context, layer: Any) -> None:
        self.layer = layer
        self.key = getattr(layer, "key", "layer")
        self.holdings = Holdings(ctx, self.key)
        self.forwards = 0
        self.names: dict[int, str] = {}  # each cache's own name: micro-batches in flight are held side by side

    def forward(self, x: Any, saved: Any) -> tuple[Any, Any]:
        before = saved.bytes()
        y, cache = self.layer.forward(x, saved)
        self.forwards += 1
        name = self.names[id(cache)] = "activations" + (f" ({self.forwards})" if self.forwards > 1 else "")
        self.holdings.hold(name, saved.bytes() - before, "activations")
        return y, cache

    def backward(self, cache: Any, dy: Any) -> Any:
        dx = self.layer.backward(cache, dy)
        self.holdings.free(self.names.pop(id(cache)))
        return dx


class Recomputed(Wrapper):
    """A layer under full recomputation (Korthikanti et al., 2022): forward keeps only the layer's input,
    and backward runs the forward again (its collectives too) just before running backward through it. The
    trace is told the input, held from forward to backward, and the recomputed forward's working set, held
    while that layer's backward runs."""

    def __init__(self, ctx: Context, layer: Any) -> None:
        self.layer = layer
        self.key = getattr(layer, "key", "layer")
        self.holdings = Holdings(ctx, self.key)
        self.forwards = 0

    def forward(self, x: Any, saved: Any) -> tuple[Any, Any]:
        from ..nn.core import Saved

        y, _ = self.layer.forward(x, Saved(tag=saved.tag))  # nothing of it is kept
        before = saved.bytes()
        saved.keep(self.key, "input", x)
        self.forwards += 1
        name = "input" + (f" ({self.forwards})" if self.forwards > 1 else "")
        self.holdings.hold(name, saved.bytes() - before, "activations")
        return y, (x, saved.tag, name)

    def backward(self, cache: Any, dy: Any) -> Any:
        from ..nn.core import Saved

        x, tag, name = cache
        work = Saved(tag=tag)
        _, again = self.layer.forward(x, work)  # the forward once more, keeping what backward needs
        self.holdings.hold("recompute working set", work.bytes(), "activations")
        dx = self.layer.backward(again, dy)
        self.holdings.free("recompute working set")
        self.holdings.free(name)
        return dx

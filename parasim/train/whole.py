"""The examples' models whole on one rank: their layers, the loss every example trains, and forward and
backward over a few batches. The one-device references that split runs are checked against are written
with these (lessons/zero.py's, pp_vs_zero3's, the pipeline lessons', moe16's), and so are the stages of
the pipeline lessons, so each model is built, and its loss defined, in one place.

The loss is sum(y * target) / n: its gradient with respect to the output y is target / n, so backward
starts from the target itself and nothing in the loss can differ between a split run and its reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..layout import ModelSpec
from ..nn import ParallelContext, Saved
from ..nn.layer import Stack, TransformerLayer, layer_weights
from ..engine.context import Context


def whole_layers(
    ctx: Context, shape: ModelSpec, first: int, count: int, name: str | None = None
) -> list[TransformerLayer]:
    """Layers first .. first+count-1 of `shape`, each whole (no tensor parallelism), their weights drawn
    from the streams of their keys L{i}, as every split run draws them; `name`: each layer's display name,
    with {i} its index and {n} its number from 1 ("L{i}", "layer {n}"; None: the layer's default)."""
    tp = ParallelContext(ctx)
    return [
        TransformerLayer(
            tp,
            shape,
            layer_weights(ctx, shape, f"L{i}"),
            key=f"L{i}",
            **({} if name is None else {"name": name.format(i=i, n=i + 1)}),
        )
        for i in range(first, first + count)
    ]


def sequences(ctx: Context, what: str, ids: Iterable[int], seq: int, hidden: int) -> Any:
    """Sequences `ids` side by side on the batch dimension, [seq, len(ids), hidden]; each drawn from its own
    stream (f"{what}{id}": "x3" is sequence 3's input, "t3" its target), so every split of a batch sees the
    very same numbers."""
    return ctx.xp.concat([ctx.shared_rng(f"{what}{s}").normal((seq, 1, hidden)) for s in ids], axis=1)


def dot_loss(xp: Any, y: Any, target: Any, n: int = 1) -> tuple[float, Any]:
    """The examples' loss, sum(y * target) / n, and its gradient with respect to y, target / n."""
    if n == 1:  # no division: the target itself, as the runs this replaced handed it on
        return float(xp.sum(y * target)), target
    return float(xp.sum(y * target)) / n, target / n


def forward_backward(
    ctx: Context, stack: Stack, batches: Iterable[tuple[Any, Any]], n: int = 1, tag: str | None = None
) -> float:
    """Forward and backward of `stack` on each (input, target) in turn, the gradients adding up in the
    layers; the summed loss. `tag`: the data's name, so the layers mark what they make (`Saved.tag`)."""
    total = 0.0
    for x, target in batches:
        y, cache = stack.forward(x, Saved(tag=tag))
        loss, dy = dot_loss(ctx.xp, y, target, n)
        total += loss
        stack.backward(cache, dy)
    return total

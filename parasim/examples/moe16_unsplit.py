"""The moe16 example's step on one device: the reference every split run of it is checked against (the
lessons' checks, `parasim trace`'s exactness, `parasim check --reference`). The whole model over every
sequence, the same scripted routes as the split run, the whole gradient clipped by its own norm when asked,
then Adam."""

from __future__ import annotations

import math
from typing import Any

from ..dp.clip import clip_coefficient
from ..dp.zero import Zero1Adam
from ..nn.layer import Stack
from .moe16 import LR, embed, scripted, target_of, words_of
from ..train.whole import forward_backward, whole_layers
from ..engine.context import Context


def unsplit_run(
    ctx: Context, model: Any, seqs: list[str], routing: str = "learned", max_norm: float | None = None
) -> dict:
    """`model` on one device over sequences `seqs`: the reference every split run is checked against; with
    `max_norm`, the whole gradient clipped by its norm before Adam, as on one device."""
    layers = whole_layers(ctx, model, 0, model.layers, "layer {n}")
    stack = Stack(layers)
    total = 0.0
    for seq in seqs:
        for layer in layers if model.experts else []:  # the same scripted routes as the split run
            layer.mlp.scripted = scripted(seq, range(len(words_of(seq))), routing)
        # tagged with the sequence: the layers mark what they make under the split run's names
        total += forward_backward(
            ctx, stack, [(embed(ctx, seq, model.hidden), target_of(ctx, seq, model.hidden))], tag=seq
        )
    grads = stack.grads
    norm = math.sqrt(sum(float(ctx.xp.sum(g * g)) for g in grads.values()))  # one device: nothing to count twice
    if max_norm is not None:
        coef = clip_coefficient(norm, max_norm)
        grads = {k: g * coef for k, g in grads.items()}
    one = ctx.new_group([0], "dp")
    new, _ = Zero1Adam(ctx, one, stack.params(), lr=LR).step(grads)  # a group of one: plain Adam
    return {"loss": total, "grad_sq": _squares(ctx, stack.grads), "weight_sq": _squares(ctx, new), "grad_norm": norm}


def _squares(ctx: Context, tensors: dict[str, Any]) -> dict[str, float]:
    return {k: float(ctx.xp.sum(w * w)) for k, w in tensors.items()}

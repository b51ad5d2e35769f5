"""One flat buffer for many tensors, as DDP and ZeRO keep gradients and weights: a fixed order of names
(the same on every rank, so buffers line up) and zero padding to a multiple of the group's size."""

from __future__ import annotations

from math import prod
from typing import Any


class FlatBuffer:
    def __init__(self, tensors: dict[str, Any], multiple: int = 1) -> None:
        self.keys = sorted(tensors)
        self.shapes = {k: tuple(int(d) for d in tensors[k].shape) for k in self.keys}
        self.sizes = {k: prod(s) for k, s in self.shapes.items()}
        self.total = sum(self.sizes.values())
        self.padded = self.total + (-self.total) % multiple  # equal shares, as ZeRO pads

    def flat(self, xp: Any, tensors: dict[str, Any]) -> Any:
        parts = [xp.reshape(tensors[k], (-1,)) for k in self.keys]
        if self.padded > self.total:
            parts.append(xp.zeros(self.padded - self.total, dtype=parts[0].dtype))
        return xp.concat(parts)

    def unflat(self, xp: Any, flat: Any) -> dict[str, Any]:
        out, start = {}, 0
        for k in self.keys:
            out[k] = xp.reshape(flat[start : start + self.sizes[k]], self.shapes[k])
            start += self.sizes[k]
        return out

"""Dropout with a seeded mask. The mask of the whole tensor is drawn from a stream every rank shares and
each rank takes its slice, so split and unsplit runs drop exactly the same elements."""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .core import Saved, ParallelContext


def dropout_mask(
    par: ParallelContext, key: str, shape: tuple[int, ...], p: float, dtype: Any, index: tuple = ()
) -> Any:
    """The keep-mask (1 kept, 0 dropped) of the whole `shape` in `dtype` (the masked tensor's: a float64
    mask would promote a float32 layer), sliced by `index` for this rank."""
    keep = par.ctx.shared_rng(key).uniform(shape) >= p
    return par.xp.astype(keep, dtype)[index]  # index () is the whole mask


class Dropout:
    def __init__(self, par: ParallelContext, p: float, key: str, name: str = "dropout"):
        self.par, self.p, self.key, self.name = par, p, key, name

    def forward(self, x: Array, saved: Saved, full_shape: tuple[int, ...], index: tuple = ()) -> tuple[Any, Any]:
        """`full_shape`: the tensor's shape on one device; `index`: this rank's slice of it."""
        if self.p == 0:
            return x, None
        mask = dropout_mask(self.par, self.key, full_shape, self.p, x.dtype, index)
        saved.keep(self.name, "mask", mask, unit=1)
        return x * mask / (1.0 - self.p), mask

    def backward(self, mask: Array, dy: Array) -> Array:
        return dy if mask is None else dy * mask / (1.0 - self.p)

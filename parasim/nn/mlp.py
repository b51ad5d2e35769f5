"""The MLP block: column-parallel, nonlinearity, row-parallel. One all-reduce forward (g) and one backward
(f) per block; under SP an all-gather and a reduce-scatter in each direction instead."""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .activations import ACTIVATIONS
from .core import ParallelContext, Saved, Weights
from .linear import ColumnParallelLinear, RowParallelLinear


class ParallelMLP(Weights):
    def __init__(
        self,
        par: ParallelContext,
        w1: Array,
        w2: Array,
        b1: Array = None,
        b2: Array = None,
        act: str = "gelu",
        name: str = "mlp",
    ):
        self.par, self.name, self.act = par, name, act
        self.fc1 = ColumnParallelLinear(par, w1, b1, name=f"{name}.fc1")
        self.fc2 = RowParallelLinear(par, w2, b2, name=f"{name}.fc2")

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        xp = self.par.xp
        h, c1 = self.fc1.forward(x, saved)
        saved.keep(self.name, "activation input", h)
        a = ACTIVATIONS[self.act][0](xp, h)
        y, c2 = self.fc2.forward(a, saved)
        return y, (c1, h, c2)

    def backward(self, cache: tuple, dy: Array) -> Array:
        c1, h, c2 = cache
        da = self.fc2.backward(c2, dy)
        dh = ACTIVATIONS[self.act][1](self.par.xp, h, da)
        return self.fc1.backward(c1, dh)

    @property
    def grads(self) -> dict[str, Any]:
        return {
            **{f"fc1.{k}": v for k, v in self.fc1.grads.items()},
            **{f"fc2.{k}": v for k, v in self.fc2.grads.items()},
        }

    @property
    def placements(self) -> dict[str, dict]:
        return {
            **{f"fc1.{k}": p for k, p in self.fc1.placements.items() if getattr(self.fc1, k) is not None},
            **{f"fc2.{k}": p for k, p in self.fc2.placements.items() if getattr(self.fc2, k) is not None},
        }

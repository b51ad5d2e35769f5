"""LayerNorm and RMSNorm over the hidden dim. Each token is normalised alone, so under sequence
parallelism a rank normalises its own tokens; its weight gradients are then partial sums over TP."""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .core import ParallelContext, Saved, Weights
from ..layout.placement import Partial, Replicate, settle


class LayerNorm(Weights):
    def __init__(
        self,
        par: ParallelContext,
        weight: Array,
        bias: Array | None,
        eps: float = 1e-5,
        name: str = "ln",
        rms: bool = False,
    ):
        xp = par.xp
        self.par, self.name, self.eps, self.rms = par, name, eps, rms
        self.weight = xp.asarray(weight, copy=True)
        self.bias = None if bias is None or rms else xp.asarray(bias, copy=True)
        # whole on every TP rank; under SP each rank normalises its own tokens: a partial gradient
        over_tp = Partial() if par.sp else Replicate()
        self.placements = {k: {"tp": over_tp} for k in ("weight", "bias") if getattr(self, k) is not None}
        self.grads: dict[str, Any] = {}

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        xp = self.par.xp
        saved.keep(self.name, "input", x)
        if self.rms:
            rstd = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + self.eps)
            xhat = x * rstd
        else:
            mu = xp.mean(x, axis=-1, keepdims=True)
            var = xp.mean((x - mu) ** 2, axis=-1, keepdims=True)
            rstd = 1.0 / xp.sqrt(var + self.eps)
            xhat = (x - mu) * rstd
        y = xhat * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y, (xhat, rstd)  # kept as functions of the input (counted above), as a fused kernel would

    def backward(self, cache: tuple, dy: Array) -> Array:
        par, xp = self.par, self.par.xp
        xhat, rstd = cache
        lead = tuple(range(dy.ndim - 1))

        def weights() -> None:
            grads = {"weight": xp.sum(dy * xhat, axis=lead)}
            if self.bias is not None:
                grads["bias"] = xp.sum(dy, axis=lead)
            for k, g in grads.items():
                g = settle(par, self.placements[k], g, f"{self.name} backward: sum {k} grad (SP)")
                self.grads[k] = g if k not in self.grads else self.grads[k] + g

        par.weight_grad(weights)
        dxhat = dy * self.weight
        if self.rms:
            return rstd * (dxhat - xhat * xp.mean(dxhat * xhat, axis=-1, keepdims=True))
        return rstd * (
            dxhat - xp.mean(dxhat, axis=-1, keepdims=True) - xhat * xp.mean(dxhat * xhat, axis=-1, keepdims=True)
        )

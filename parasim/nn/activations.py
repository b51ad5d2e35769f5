"""Element-wise nonlinearities, forward and backward. They act on one rank's own columns, so no
communication: the reason the first MLP weight is split by columns."""

from __future__ import annotations

import math
from typing import Any

from ..comm.interface import Array


def relu(xp: Any, x: Array) -> Array:
    return xp.where(x > 0, x, xp.zeros_like(x))


def relu_backward(xp: Any, x: Array, dy: Array) -> Array:
    """ReLU'(0) = 0, as in PyTorch."""
    return xp.where(x > 0, dy, xp.zeros_like(dy))


_C = math.sqrt(2.0 / math.pi)


def gelu(xp: Any, x: Array) -> Array:
    """GeLU, tanh form (PyTorch's approximate='tanh')."""
    return 0.5 * x * (1.0 + xp.tanh(_C * (x + 0.044715 * x * x * x)))


def gelu_backward(xp: Any, x: Array, dy: Array) -> Array:
    inner = _C * (x + 0.044715 * x * x * x)
    th = xp.tanh(inner)
    d_inner = _C * (1.0 + 3 * 0.044715 * x * x)
    return dy * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * d_inner)


ACTIVATIONS = {"relu": (relu, relu_backward), "gelu": (gelu, gelu_backward)}

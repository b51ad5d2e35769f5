"""Torch references of the UNSPLIT computations that parasim.nn splits over ranks.

Plain float64 functions on torch tensors, differentiated by torch's autograd, so a test can compare a
split forward and hand-written backward with what one device would compute. Activations use Megatron's
[seq, batch, hidden] layout; weights are [in, out] (y = x @ w + b), as parasim.nn stores them.
No parasim imports: this is the independent side of the comparison.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch


def tensor(a, requires_grad: bool = False) -> torch.Tensor | None:
    """A float64 torch tensor from an array (None stays None)."""
    if a is None:
        return None
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=requires_grad)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [.., in] @ w [in, out] (+ b [out])."""
    y = x @ w
    return y if b is None else y + b


def activation(x: torch.Tensor, act: str) -> torch.Tensor:
    """'relu' as torch (ReLU'(0) = 0), or 'gelu' in its tanh form (torch's approximate='tanh')."""
    if act == "relu":
        return torch.nn.functional.relu(x)
    if act == "gelu":
        return torch.nn.functional.gelu(x, approximate="tanh")
    raise ValueError(f"unknown activation {act!r}")


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
        act: str) -> torch.Tensor:
    """The transformer MLP block: fc1 [h, ffn], nonlinearity, fc2 [ffn, h]."""
    return linear(activation(linear(x, w1, b1), act), w2, b2)


def vjp(fn: Callable[..., torch.Tensor], args: Sequence, dy) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """Run fn(*args) on float64 tensors and backpropagate loss = sum(y * dy).

    args: arrays (or None, passed through), or non-array values (strings, numbers) passed as they are.
    Returns y and the gradient of every array argument (None where the argument was not an array).
    """
    ts = [tensor(a, requires_grad=True) if _is_array(a) else a for a in args]
    y = fn(*ts)
    (y * tensor(dy)).sum().backward()
    grads = [t.grad.numpy() if isinstance(t, torch.Tensor) else None for t in ts]
    return y.detach().numpy(), grads


def _is_array(a) -> bool:
    return a is not None and hasattr(a, "shape") and hasattr(a, "dtype")

"""`ctx.xp` on real ranks: torch's array namespace (array_api_compat.torch), taking dtype names as numpy's does;
and the roundings a real rank's torch arithmetic makes, counted.

A program is written once for every backend, and on virtual ranks `ctx.xp.ones(4, dtype="bfloat16")` is
numpy's call, which takes a dtype's name. torch's functions take only torch dtypes, so the same line would
fail on real ranks; here a name given as `dtype=` (or as astype's, finfo's and iinfo's dtype) becomes the
torch dtype of that name first. Everything else is the namespace's own.

`counting_roundings()` sees every torch function a rank's program calls, `x @ w` and `x.sum()` included
(a torch function mode: torch hands it each call), and adds up the roundings of its products and reductions,
so that engine/compare.py can say how far the rank's values may drift from numpy's on virtual ranks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from .tolerance import reduced

# torch's functions that round, by their __name__: a product sums over its first operand's last dim, a reduction
# over the values each result gathers (a mean divides once more), a softmax or running sum along its dim
PRODUCTS = ("matmul", "__matmul__", "mm", "bmm", "mv", "dot", "inner", "vdot", "linear", "addmm", "baddbmm")
PAIRS = ("tensordot", "einsum")  # summed length from the sizes: sqrt(|a| |b| / |out|)
SUMS = {
    "sum": False,
    "nansum": False,
    "mean": True,
    "nanmean": True,
    "var": True,
    "std": True,
    "norm": True,
    "logsumexp": True,
}
ALONG = ("softmax", "log_softmax", "cumsum", "cumprod")

_POSITIONAL = {"astype": 1, "finfo": 0, "iinfo": 0}  # functions whose dtype may come as a positional argument


class TorchNamespace:
    """array_api_compat.torch with dtype names accepted wherever a dtype is."""

    def __init__(self, xp: Any):
        self._xp = xp
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = self._wrapped.get(name)
        if fn is not None:
            return fn
        value = getattr(self._xp, name)
        if not callable(value) or isinstance(value, type):
            return value
        at = _POSITIONAL.get(name)

        def named(*args: Any, **kw: Any) -> Any:
            if isinstance(kw.get("dtype"), str):
                kw["dtype"] = torch_dtype(kw["dtype"])
            if at is not None and len(args) > at and isinstance(args[at], str):
                args = (*args[:at], torch_dtype(args[at]), *args[at + 1 :])
            return value(*args, **kw)

        named.__name__ = name
        named.__doc__ = value.__doc__
        self._wrapped[name] = named
        return named

    def __dir__(self) -> list[str]:
        return dir(self._xp)


def torch_dtype(name: str) -> Any:
    """The torch dtype called `name` ("bfloat16", "float32", "int64", ...), or one line naming the problem."""
    import torch

    from ..errors import UsageError
    from ..comm.interface import dtype_name

    try:
        canonical = dtype_name(name)  # "f4" -> "float32", as numpy reads names
    except Exception:  # a name numpy cannot read at all
        canonical = name
    found = getattr(torch, canonical, None)
    if not isinstance(found, torch.dtype):
        raise UsageError(f"{name!r} is not a dtype torch has (float64, float32, float16, bfloat16, int64, ...)")
    return found


def roundings_of(name: str, args: tuple, kwargs: dict, out: Any) -> int:
    """The roundings each result of one torch call made (0: none counted, such as an elementwise function)."""
    tensors = [a for a in args if hasattr(a, "shape") and hasattr(a, "numel")]
    if not tensors:
        tensors = [a for a in (kwargs.get("input"), kwargs.get("other")) if hasattr(a, "shape")]
    if not tensors:
        return 0
    first = tensors[1] if name in ("addmm", "baddbmm") and len(tensors) > 1 else tensors[0]
    if name in PRODUCTS:
        return int(first.shape[-1]) if first.dim() else 1
    size = getattr(out, "numel", None)
    if name in PAIRS and len(tensors) >= 2 and size is not None:
        return max(1, round((tensors[0].numel() * tensors[1].numel() / max(1, size())) ** 0.5))
    if name in SUMS and size is not None:
        return reduced(first.numel(), size(), SUMS[name])
    if name in ALONG:
        dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else -1)
        return int(first.shape[dim]) if first.dim() else 0
    return 0


def counting_roundings() -> Any:
    """A context manager (a torch function mode) whose `count` adds up the roundings of every torch call made
    inside it (`roundings_of`), the program's own `x @ w` and `x.sum()` included."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            with contextlib.suppress(Exception):  # counting never breaks a call: an odd signature counts nothing
                self.count += roundings_of(getattr(func, "__name__", ""), args, kwargs, out)
            return out

    return Count()

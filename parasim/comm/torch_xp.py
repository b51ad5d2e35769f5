"""`ctx.xp` on real ranks: torch's array namespace (array_api_compat.torch), taking dtype names as numpy's does.

A program is written once for every backend, and on virtual ranks `ctx.xp.ones(4, dtype="bfloat16")` is
numpy's call, which takes a dtype's name. torch's functions take only torch dtypes, so the same line would
fail on real ranks; here a name given as `dtype=` (or as astype's, finfo's and iinfo's dtype) becomes the
torch dtype of that name first. Everything else is the namespace's own.
"""
from __future__ import annotations

from typing import Any, Callable

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
                args = (*args[:at], torch_dtype(args[at]), *args[at + 1:])
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
    from .interface import dtype_name
    try:
        canonical = dtype_name(name)  # "f4" -> "float32", as numpy reads names
    except Exception:  # a name numpy cannot read at all
        canonical = name
    found = getattr(torch, canonical, None)
    if not isinstance(found, torch.dtype):
        raise UsageError(f"{name!r} is not a dtype torch has (float64, float32, float16, bfloat16, int64, ...)")
    return found

"""What a symbolic rank's program is handed for `ctx.xp` and for its random draws: the array namespace the
layers call (the names of array_api_compat's numpy), on `SymArray`s, and draws that make arrays of the
asked shape without drawing anything. Both belong to a run (`SymbolicRun`): what they make is that run's."""

from __future__ import annotations

import builtins  # the namespace's own `bool` is numpy's dtype
from typing import Any, Sequence

import numpy as np

from . import array as sa
from .array import SymArray, SymbolicRun


def _sym(x: Any) -> bool:
    return isinstance(x, SymArray)


class SymbolicNamespace:
    """`ctx.xp` on symbolic ranks. Every array made here is symbolic, index lists (`asarray` of Python
    ints, `arange`) included: they take part by their shapes. Elementwise functions are numpy's ufuncs,
    which hand SymArrays to `SymArray.__array_ufunc__`. `run`: the run the arrays made here belong to
    (None: arrays of no run, which count no FLOPs)."""

    def __init__(self, run: SymbolicRun | None = None):
        self.run = run

    float64, float32, float16, int64, int32, int8, uint8, bool = (
        np.float64,
        np.float32,
        np.float16,
        np.int64,
        np.int32,
        np.int8,
        np.uint8,
        np.bool_,
    )
    newaxis = None
    exp, log, sqrt, tanh, maximum, minimum, abs, sign = (
        np.exp,
        np.log,
        np.sqrt,
        np.tanh,
        np.maximum,
        np.minimum,
        np.abs,
        np.sign,
    )
    matmul, multiply, add, subtract, divide = np.matmul, np.multiply, np.add, np.subtract, np.divide

    def asarray(self, x: Any, dtype: Any = None, copy: Any = None, **_: Any) -> Any:
        """Symbolic, whatever it is given: a list of positions or a one-hot table built from Python
        values becomes an array of that shape (a 100,000-token causal mask is never made)."""
        if _sym(x):
            return x if dtype is None else x.astype(dtype)
        if isinstance(x, (list, tuple)) and x and _sym(x[0]):  # a list of arrays
            out = sa.stack(x)
            return out if dtype is None else out.astype(dtype)
        if isinstance(x, np.ndarray):
            return SymArray(x.shape, dtype if dtype is not None else x.dtype, self.run)
        shape, first = [], x  # nested Python lists: their lengths, and the first value's type
        while isinstance(first, (list, tuple, range)):
            shape.append(len(first))
            if not len(first):
                break
            first = first[0]
        kind = np.float64 if isinstance(first, (list, tuple, range)) else np.asarray(first).dtype
        if kind == np.float64:  # Python floats: the run's float
            kind = self._float
        return SymArray(shape, dtype if dtype is not None else kind, self.run)

    @property
    def _float(self) -> np.dtype:
        """The run's float: what zeros, draws and float literals are made in (float64 outside any run)."""
        return self.run.float_dtype if self.run is not None else np.dtype(np.float64)

    @staticmethod
    def astype(x: Any, dtype: Any, copy: builtins.bool = True) -> Any:
        return x.astype(dtype)

    def zeros(self, shape: Any, dtype: Any = None, **_: Any) -> SymArray:
        return SymArray(
            (shape,) if isinstance(shape, (int, np.integer)) else shape,
            self._float if dtype is None else dtype,
            self.run,
        )

    ones = empty = zeros

    def full(self, shape: Any, fill_value: Any, dtype: Any = None, **_: Any) -> SymArray:
        given = np.result_type(fill_value)
        return SymArray(
            (shape,) if isinstance(shape, (int, np.integer)) else shape,
            dtype if dtype is not None else self._float if given == np.float64 else given,
            self.run,
        )

    def arange(self, *args: Any, dtype: Any = None, **_: Any) -> SymArray:
        return SymArray((len(range(*args)),), dtype if dtype is not None else np.int64, self.run)

    def zeros_like(self, x: Any, dtype: Any = None, **_: Any) -> Any:
        return sa.like(x, dtype, run=self.run) if _sym(x) else np.zeros_like(x, dtype=dtype)

    ones_like = empty_like = zeros_like

    def full_like(self, x: Any, fill_value: Any, dtype: Any = None, **_: Any) -> Any:
        return sa.like(x, dtype, run=self.run) if _sym(x) else np.full_like(x, fill_value, dtype=dtype)

    sum, mean, max, min, all, any = (
        staticmethod(np.sum),
        staticmethod(np.mean),
        staticmethod(np.max),
        staticmethod(np.min),
        staticmethod(np.all),
        staticmethod(np.any),
    )

    @staticmethod
    def concat(arrays: Sequence[Any], axis: int | None = 0) -> Any:
        return np.concatenate(list(arrays), axis=axis)

    @staticmethod
    def stack(arrays: Sequence[Any], axis: int = 0) -> Any:
        return np.stack(list(arrays), axis=axis)

    @staticmethod
    def permute_dims(x: Any, axes: Sequence[int]) -> Any:
        return np.transpose(x, axes)

    @staticmethod
    def reshape(x: Any, shape: Sequence[int], **_: Any) -> Any:
        return np.reshape(x, shape)

    @staticmethod
    def take(x: Any, indices: Any, axis: int | None = None) -> Any:
        return np.take(x, indices, axis=axis)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        if any(_sym(v) for v in (cond, a, b)):
            return sa.where(cond, a, b)
        return np.where(cond, a, b)

    @staticmethod
    def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
        return np.tensordot(a, b, axes=axes)

    @staticmethod
    def split(x: Any, sections: Any, axis: int = 0) -> Any:
        return np.split(x, sections, axis=axis)

    @staticmethod
    def argsort(x: Any, axis: int = -1, descending: builtins.bool = False, stable: builtins.bool = True) -> Any:
        """An order is the values' own information: refused for a symbolic array (`SymbolicValueError`)."""
        if _sym(x):
            return np.argsort(x)
        import array_api_compat.numpy as values  # an index list of Python's or numpy's: its order

        # array_api_compat makes its functions at import, out of its type stubs' sight
        return values.argsort(x, axis=axis, descending=descending, stable=stable)  # type: ignore[attr-defined]

    @staticmethod
    def nonzero(x: Any) -> Any:
        """Where the values are nonzero: refused for a symbolic array (`SymbolicValueError`)."""
        return np.nonzero(x)


class SymbolicRng:
    """`ctx.rng` and `ctx.shared_rng(name)` on symbolic ranks: arrays of the asked shape and dtype (of `run`),
    nothing drawn."""

    def __init__(self, run: SymbolicRun | None = None):
        self.run = run

    def _float(self, dtype: Any) -> Any:
        return dtype if dtype is not None else self.run.float_dtype if self.run is not None else "float64"

    def _drawn(self, shape: Sequence[int], dtype: Any) -> SymArray:
        return SymArray(shape, dtype, None) if self.run is None else self.run.drawn(shape, dtype)

    def normal(self, shape: Sequence[int], dtype: Any = None, mean: float = 0.0, std: float = 1.0) -> SymArray:
        return self._drawn(shape, self._float(dtype))

    def uniform(self, shape: Sequence[int], low: float = 0.0, high: float = 1.0, dtype: Any = None) -> SymArray:
        return self._drawn(shape, self._float(dtype))

    def integers(self, low: int, high: int, shape: Sequence[int], dtype: Any = "int64") -> SymArray:
        return SymArray(shape, dtype, self.run)

    def permutation(self, n: int) -> SymArray:
        return SymArray((n,), "int64", self.run)

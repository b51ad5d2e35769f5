"""Arrays that carry a shape and a dtype and nothing else, for runs at real sizes.

A `SymArray` answers everything a layer or a collective asks of an array that does not need its values:
`shape`, `dtype`, `nbytes`, indexing, arithmetic, matmul, reductions, concatenation and splitting. numpy's
own functions and ufuncs accept it (`__array_function__`, `__array_ufunc__`), so the op table's numpy
kernels run on it unchanged. Nothing is allocated: a 7168 x 18432 weight costs a few bytes. Asking for a
value that would steer the run (`int(x)`, `bool(x)`, an index, an order: `argsort`, `nonzero`) fails with
`SymbolicValueError`, naming what was asked; `float(x)` is NaN and `x.tolist()` NaNs (a loss printed, a
small array shown in a note).

Each array names the `SymbolicRun` it belongs to (None: made outside any run), which all of the run's arrays
share: the memo of the shape rules, one array per shape for slices (arrays without values of one shape and
dtype stand for each other), and each rank's matmul FLOPs.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np

from ...comm.interface import BFLOAT16, FLOAT8
from ..work import Meter, matmul_work, tensordot_work
from ...errors import ParasimError
from .shapes import axis_of as _axis
from .shapes import indexed_shape, matmul_shape, sliced_shape

SHOWN = 4096  # tolist() answers NaNs up to this many elements (notes show small arrays), then fails
MEMO = 50_000  # keys a run's memo keeps before it starts again (a run's layers use a few hundred)


class SymbolicValueError(ParasimError):
    """A symbolic run was asked for a value: shapes and bytes are all it has."""


class SymbolicRun:
    """What the arrays of one symbolic run share. `memo`: (ufunc, shapes, dtypes, dtype asked) -> (shape,
    dtype), as a layer applies the same few ops to the same shapes over and over and the answer is a pure
    function of the key; `meter`: each rank's product FLOPs by kind (engine/work.py), counted for the rank
    whose turn it is (`turn`, which the run's scheduler answers)."""

    __slots__ = ("memo", "slices", "cuts", "meter", "float_dtype")

    def __init__(self, world: int, turn: Callable[[], int], float_dtype: Any = "float64"):
        self.memo: dict = {}
        self.slices: dict = {}  # (shape, dtype) -> the one array every slice and draw of that shape is
        self.cuts: dict = {}  # (shape, dtype, start, stop) -> x[start:stop] of an array of that shape and dtype
        self.meter = Meter(world, turn)
        # what draws, zeros and float literals are made in: the run's training dtype (BF16 at real size)
        self.float_dtype = np.dtype(float_dtype)

    @property
    def flops(self) -> list[int]:
        """Each rank's product FLOPs over the whole run."""
        return self.meter.total

    def drawn(self, shape: Sequence[int], dtype: Any) -> "SymArray":
        """The run's array for a draw of `shape` in `dtype`: nothing in a draw can change, so every draw of one
        shape may be one array (DeepSeek-V3's layers draw 60,000 weights of a few shapes)."""
        return self._one((tuple(shape), dtype), lambda: SymArray(shape, dtype, self))

    def slice_of(self, shape: tuple[int, ...], dtype: np.dtype) -> "SymArray":
        """The run's array of `shape` and `dtype` for a slice: an array cut into many blocks of a few sizes
        (an all-to-all's chunks over 64 ranks) makes a few arrays, and the trace a few records."""
        return self._one((shape, dtype), lambda: _made(shape, dtype, self))

    def _one(self, key: tuple, make: Callable[[], "SymArray"]) -> "SymArray":
        """The one array kept for `key` (a shape and a dtype), made the first time it is asked for."""
        got = self.slices.get(key)
        if got is None:
            if len(self.slices) > MEMO:
                self.slices.clear()
            got = self.slices[key] = make()
        return got


def _dt(x: Any) -> Any:
    """What numpy's dtype resolution takes for an operand: a dtype, or a Python scalar's type (weak)."""
    if type(x) is SymArray or isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(bool)
    if isinstance(x, (int, float, complex)):
        return type(x)
    return np.asarray(x).dtype


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if type(x) is SymArray or isinstance(x, (np.ndarray, np.generic)) else np.shape(x)


def _run_of(arrays: Sequence[Any]) -> SymbolicRun | None:
    """The run of the first operand that has one (an operand made outside any run has none)."""
    for x in arrays:
        if type(x) is SymArray and x.run is not None:
            return x.run
    return None


class SymArray:
    """An array of `shape` and `dtype` whose values are never held."""

    __slots__ = ("shape", "dtype", "size", "nbytes", "run")
    __array_priority__ = 100  # numpy defers to us in mixed arithmetic
    __hash__ = None  # type: ignore[assignment]  # == is elementwise, as for numpy arrays

    def __init__(self, shape: Sequence[int | np.integer], dtype: Any = "float64", run: SymbolicRun | None = None):
        dims = tuple(int(n) for n in shape)
        if any(n < 0 for n in dims):
            raise ValueError(f"negative dimension in shape {dims}")
        self.shape, self.dtype, self.size = dims, np.dtype(dtype), math.prod(dims)
        self.nbytes = self.size * self.dtype.itemsize
        self.run = run

    # -- what an array says about itself ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def T(self) -> "SymArray":
        return _made(self.shape[::-1], self.dtype, self.run)

    @property
    def mT(self) -> "SymArray":
        return _made(self.shape[:-2] + self.shape[-1:] + self.shape[-2:-1], self.dtype, self.run)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __iter__(self) -> Any:
        """Its rows, as numpy's iteration gives them (one array stands for every row: they are alike)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return itertools.repeat(_made(self.shape[1:], self.dtype, self.run), self.shape[0])

    def __repr__(self) -> str:
        return f"SymArray({self.shape}, {self.dtype})"

    def copy(self) -> "SymArray":
        return self  # nothing in it can change: a copy may be the array itself

    def astype(self, dtype: Any, copy: bool = True) -> "SymArray":
        return SymArray(self.shape, dtype, self.run)

    def reshape(self, *shape: Any) -> "SymArray":
        return reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def transpose(self, *axes: Any) -> "SymArray":
        return permute_dims(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else (axes or None))

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> "SymArray":
        return reduction(self, axis, keepdims, dtype)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> "SymArray":
        return reduction(self, axis, keepdims, dtype or _mean_dtype(self.dtype))

    def max(self, axis: Any = None, keepdims: bool = False) -> "SymArray":
        return reduction(self, axis, keepdims, self.dtype)  # an extreme keeps the dtype (a sum widens ints)

    min = max

    # -- values: there are none ----------------------------------------------------------------
    def _no_value(self, what: str) -> Any:
        raise SymbolicValueError(
            f"{what} of a symbolic {self.dtype} array of shape {self.shape}: a symbolic run "
            "has shapes and bytes, no values"
        )

    def __float__(self) -> float:
        # NaN, the float that is no value: a loss or a norm printed or passed on stays visibly unknown,
        # and the program goes on (shapes and bytes never depend on it); `int()` and `bool()` still fail,
        # since an index or a branch taken on a value would change what the run does
        if self.size != 1:
            return self._no_value("float()")
        return float("nan")

    def __int__(self) -> int:
        return self._no_value("int()")

    def __bool__(self) -> bool:
        return self._no_value("the truth value")

    def __index__(self) -> int:
        return self._no_value("an index taken from the value")

    def tolist(self) -> Any:
        """Nested lists of NaN (the values it does not have), for small arrays a note may show."""
        if self.size > SHOWN:
            return self._no_value("tolist()")
        return np.full(self.shape, np.nan).tolist()

    def item(self) -> Any:
        return self._no_value("item()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._no_value("conversion to a numpy array")

    def __neg__(self) -> "SymArray":  # a sign or bit flip keeps the shape and dtype
        return _made(self.shape, self.dtype, self.run)

    __pos__ = __abs__ = __invert__ = __neg__

    # -- indexing --------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> "SymArray":
        run = self.run
        if run is not None and type(index) is slice and index.step is None and self.shape:
            # x[a:b], the most common index (an all-to-all's chunks, one slice per member): looked up
            key = (self.shape, self.dtype, index.start, index.stop)
            got = run.cuts.get(key)
            if got is None:
                if len(run.cuts) > MEMO:
                    run.cuts.clear()
                cut = sliced_shape(self.shape, index)
                assert cut is not None  # one slice of a shape with a dim always has its rule's answer
                got = run.cuts[key] = run.slice_of(cut, self.dtype)
            return got
        shape = sliced_shape(self.shape, index)
        if shape is None:
            return _made(indexed_shape(self.shape, index), self.dtype, self.run)
        return _made(shape, self.dtype, None) if self.run is None else self.run.slice_of(shape, self.dtype)

    def __setitem__(self, index: Any, value: Any) -> None:
        indexed_shape(self.shape, index)  # a bad index still fails; the values stay unknown

    # -- numpy's protocols -------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, out: Any = None, **kw: Any) -> Any:
        if method == "__call__":
            result = _ufunc_call(ufunc, inputs, kw)
        elif method == "reduce":
            result = reduction(inputs[0], kw.get("axis", 0), kw.get("keepdims", False), kw.get("dtype"))
        else:
            return NotImplemented
        if out is not None:  # in place: the shape and dtype stay the out array's
            target = out[0] if isinstance(out, tuple) else out
            return target
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        rule = FUNCTIONS.get(func.__name__)
        if rule is None:
            return NotImplemented
        return rule(*args, **kwargs)


def _made(shape: tuple[int, ...], dtype: np.dtype, run: SymbolicRun | None) -> SymArray:
    """A SymArray from a shape rule's own result (a tuple of ints, a numpy dtype): no checks to repeat, as a
    run at real size makes hundreds of thousands of them."""
    out = object.__new__(SymArray)
    out.shape, out.dtype, out.size = shape, dtype, math.prod(shape)
    out.nbytes = out.size * dtype.itemsize
    out.run = run
    return out


def _binary(name: str, reflected: bool = False):
    ufunc = getattr(np, name)

    def op(self: SymArray, other: Any) -> SymArray:
        return _ufunc_call(ufunc, (other, self) if reflected else (self, other), {})

    return op


for _name, _ufunc_name in (
    ("add", "add"),
    ("sub", "subtract"),
    ("mul", "multiply"),
    ("truediv", "true_divide"),
    ("floordiv", "floor_divide"),
    ("mod", "remainder"),
    ("pow", "power"),
    ("matmul", "matmul"),
    ("and", "logical_and"),
    ("or", "logical_or"),
):
    setattr(SymArray, f"__{_name}__", _binary(_ufunc_name))
    setattr(SymArray, f"__r{_name}__", _binary(_ufunc_name, reflected=True))
    setattr(SymArray, f"__i{_name}__", _binary(_ufunc_name))
for _name, _ufunc_name in (
    ("lt", "less"),
    ("le", "less_equal"),
    ("gt", "greater"),
    ("ge", "greater_equal"),
    ("eq", "equal"),
    ("ne", "not_equal"),
):
    setattr(SymArray, f"__{_name}__", _binary(_ufunc_name))


def _ufunc_call(ufunc: np.ufunc, inputs: Sequence[Any], kw: dict) -> SymArray:
    run, shapes, dtypes = None, [], []
    for x in inputs:  # the hot path of a run at real size: one pass, symbolic operands first
        if type(x) is SymArray:
            shapes.append(x.shape)
            dtypes.append(x.dtype)
            if run is None:
                run = x.run
        elif type(x) is float or type(x) is int:  # a Python scalar: no shape, and its type is weak
            shapes.append(())
            dtypes.append(type(x))
        else:
            shapes.append(_shape(x))
            dtypes.append(_dt(x))
    shape_t, dtype_t = tuple(shapes), tuple(dtypes)
    key = (ufunc, shape_t, dtype_t, kw.get("dtype"))
    known = None if run is None else run.memo.get(key)
    if known is None:
        shape = matmul_shape(*shape_t) if ufunc is np.matmul else np.broadcast_shapes(*shape_t)
        if kw.get("dtype") is not None:
            out_dtype = np.dtype(kw["dtype"])
        else:
            out_dtype = _result_dtype(ufunc, dtype_t)
        known = (shape, out_dtype)
        if run is not None:
            if len(run.memo) > MEMO:  # a bounded memo of a pure rule
                run.memo.clear()
            run.memo[key] = known
    if ufunc is np.matmul and run is not None:  # 2 FLOPs per multiply-add: every output value took k of them
        run.meter.add(*matmul_work(shape_t[0], shape_t[1], known[0]))
    return _made(known[0], known[1], run)


NARROW = (BFLOAT16, np.dtype(np.float16), *FLOAT8)  # the floats a GPU's kernels keep in their own width


def _result_dtype(ufunc: np.ufunc, dtypes: tuple) -> np.dtype:
    """The dtype of `ufunc` on operands of `dtypes` (a Python scalar's type stands for a weak scalar). numpy's
    rule, except where an array operand is a 16- or 8-bit float: there a training step's kernels give the
    widest floating array operand's dtype (a BF16 GEMM gives BF16, scaling by 0.5 keeps BF16), where numpy
    would widen ml_dtypes' types to float32 or find no common type for FP8 and BF16."""
    arrays = [d for d in dtypes if isinstance(d, np.dtype)]
    narrow = any(d in NARROW for d in arrays)
    try:
        out = ufunc.resolve_dtypes(dtypes + (None,) * ufunc.nout)[-1]
    except (TypeError, ValueError):  # numpy's DTypePromotionError is a TypeError
        if not narrow:
            raise
        return _widest(arrays)
    if narrow and (out.kind in "fV" or out in NARROW):
        return _widest(arrays)
    return out


def _widest(arrays: list[np.dtype]) -> np.dtype:
    """The first of the widest floating dtypes among an operation's array operands."""
    floats = [d for d in arrays if d.kind == "f" or d in NARROW]
    return max(floats, key=lambda d: d.itemsize)


# -- functions (numpy's, through __array_function__; also the symbolic namespace's) ------------------


def reduction(x: SymArray, axis: Any = None, keepdims: bool = False, dtype: Any = None, **_: Any) -> SymArray:
    nd = x.ndim
    axes = set(
        range(nd) if axis is None else [_axis(a, nd) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    )
    shape = tuple(1 if k in axes else n for k, n in enumerate(x.shape) if keepdims or k not in axes)
    if dtype is None:
        dtype = x.dtype if x.dtype.kind not in "bui" else (np.int64 if x.dtype.kind != "u" else np.uint64)
    return SymArray(shape, dtype, x.run)


def _reduce_same_dtype(x: SymArray, axis: Any = None, keepdims: bool = False, **kw: Any) -> SymArray:
    return reduction(x, axis, keepdims, x.dtype)


def _all(x: Any, axis: Any = None, keepdims: bool = False, **_: Any) -> SymArray:
    return reduction(x, axis, keepdims, bool)


def _mean_dtype(dtype: np.dtype) -> np.dtype:
    """numpy's mean keeps a float dtype (bfloat16 too, whose kind is 'V') and averages anything else in float64."""
    return dtype if dtype.kind in "fc" or dtype == BFLOAT16 else np.dtype(np.float64)


def _mean(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False, **_: Any) -> SymArray:
    return reduction(x, axis, keepdims, dtype or _mean_dtype(x.dtype))


def concat(arrays: Sequence[Any], axis: int | None = 0, **_: Any) -> SymArray:
    arrays = list(arrays)
    if axis is None:
        return SymArray(
            (sum(math.prod(_shape(a)) for a in arrays),), np.result_type(*[_dt(a) for a in arrays]), _run_of(arrays)
        )
    every = [_shape(a) for a in arrays]  # an all-to-all's chunks: a few shapes, many times
    first = every[0]
    ax = _axis(axis, len(first))
    for s in set(every):
        if len(s) != len(first) or any(p != q for k, (p, q) in enumerate(zip(s, first)) if k != ax):
            raise ValueError(f"concatenate: shapes {first} and {s} differ off axis {ax}")
    total = sum([s[ax] for s in every])
    return _made(first[:ax] + (total,) + first[ax + 1 :], np.result_type(*{_dt(a) for a in arrays}), _run_of(arrays))


def stack(arrays: Sequence[Any], axis: int = 0, **_: Any) -> SymArray:
    arrays = list(arrays)
    first = _shape(arrays[0])
    if any(_shape(a) != first for a in arrays):
        raise ValueError("stack: every array must have the same shape")
    ax = _axis(axis, len(first) + 1)
    return _made(first[:ax] + (len(arrays),) + first[ax:], np.result_type(*[_dt(a) for a in arrays]), _run_of(arrays))


def split(x: SymArray, sections: Any, axis: int = 0) -> list[SymArray]:
    ax = _axis(axis, x.ndim)
    n = x.shape[ax]
    if isinstance(sections, (int, np.integer)):
        if n % int(sections):
            raise ValueError("array split does not result in an equal division")
        cuts = [n // int(sections) * k for k in range(1, int(sections))]
    else:
        cuts = [int(c) for c in sections]
    edges = [0] + cuts + [n]
    return [
        _made(x.shape[:ax] + (max(0, min(b, n) - min(a, n)),) + x.shape[ax + 1 :], x.dtype, x.run)
        for a, b in zip(edges, edges[1:])
    ]


def reshape(x: SymArray, shape: Any, **_: Any) -> SymArray:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    if shape.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if known == 0 or x.size % known:
            raise ValueError(f"cannot reshape an array of size {x.size} into shape {shape}")
        shape = tuple(x.size // known if n == -1 else n for n in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape an array of size {x.size} into shape {shape}")
    return _made(shape, x.dtype, x.run)


def permute_dims(x: SymArray, axes: Any = None) -> SymArray:
    axes = tuple(range(x.ndim))[::-1] if axes is None else tuple(_axis(a, x.ndim) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"axes {axes} do not permute {x.ndim} dims")
    return _made(tuple(x.shape[a] for a in axes), x.dtype, x.run)


def moveaxis(x: SymArray, source: int, destination: int) -> SymArray:
    order = [a for a in range(x.ndim) if a != _axis(source, x.ndim)]
    order.insert(_axis(destination, x.ndim), _axis(source, x.ndim))
    return permute_dims(x, order)


def take(x: SymArray, indices: Any, axis: int | None = None, **_: Any) -> SymArray:
    if axis is None:
        return SymArray(_shape(indices), x.dtype, x.run)
    ax = _axis(axis, x.ndim)
    return _made(x.shape[:ax] + tuple(_shape(indices)) + x.shape[ax + 1 :], x.dtype, x.run)


def tensordot(a: Any, b: Any, axes: Any = 2) -> SymArray:
    sa, sb = _shape(a), _shape(b)
    if isinstance(axes, (int, np.integer)):
        ia, ib = list(range(len(sa) - int(axes), len(sa))), list(range(int(axes)))
    else:
        ia, ib = (
            [axes[0]] if isinstance(axes[0], int) else list(axes[0]),
            [axes[1]] if isinstance(axes[1], int) else list(axes[1]),
        )
    ia, ib = [_axis(k, len(sa)) for k in ia], [_axis(k, len(sb)) for k in ib]
    if [sa[k] for k in ia] != [sb[k] for k in ib]:
        raise ValueError(f"tensordot: summed dims of {sa} and {sb} differ")
    shape = tuple(n for k, n in enumerate(sa) if k not in ia) + tuple(n for k, n in enumerate(sb) if k not in ib)
    run = _run_of((a, b))
    if run is not None:  # a multiply-add per summed value
        run.meter.add(*tensordot_work(shape, math.prod(sa[k] for k in ia)))
    return SymArray(shape, np.result_type(_dt(a), _dt(b)), run)


def where(cond: Any, a: Any, b: Any) -> SymArray:
    return SymArray(
        np.broadcast_shapes(_shape(cond), _shape(a), _shape(b)), np.result_type(_dt(a), _dt(b)), _run_of((cond, a, b))
    )


def like(x: Any, dtype: Any = None, shape: Any = None, run: SymbolicRun | None = None, **_: Any) -> SymArray:
    return SymArray(
        _shape(x) if shape is None else shape,
        dtype if dtype is not None else _dt(x),
        run if run is not None else _run_of((x,)),
    )


def _full_like(x: Any, fill_value: Any, dtype: Any = None, **kw: Any) -> SymArray:
    return like(x, dtype, **kw)


def _copy(x: Any, **_: Any) -> SymArray:
    return SymArray(_shape(x), _dt(x), _run_of((x,)))


def _broadcast_to(x: Any, shape: Any, **_: Any) -> SymArray:
    if np.broadcast_shapes(_shape(x), tuple(shape)) != tuple(shape):  # x must fit inside the shape asked
        raise ValueError(f"cannot broadcast an array of shape {_shape(x)} to {tuple(shape)}")
    return SymArray(tuple(shape), _dt(x), _run_of((x,)))


def _expand_dims(x: Any, axis: int) -> SymArray:
    s = list(_shape(x))
    s.insert(_axis(axis, len(s) + 1), 1)
    return SymArray(s, _dt(x), _run_of((x,)))


def _squeeze(x: Any, axis: Any = None) -> SymArray:
    s = _shape(x)
    drop = (
        {k for k, n in enumerate(s) if n == 1}
        if axis is None
        else {_axis(a, len(s)) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
    )
    return SymArray(tuple(n for k, n in enumerate(s) if k not in drop), _dt(x), _run_of((x,)))


def _shape_of(x: Any) -> tuple[int, ...]:
    return _shape(x)


def _ndim(x: Any) -> int:
    return len(_shape(x))


def _size(x: Any, axis: Any = None) -> int:
    return math.prod(_shape(x)) if axis is None else _shape(x)[axis]


def _refuse(name: str, x: Any, *_: Any, **__: Any) -> Any:
    """A function whose answer is positions picked by value (an order, the nonzeros): refused, naming it."""
    if isinstance(x, SymArray):
        return x._no_value(f"{name}()")
    raise SymbolicValueError(f"{name}() of a symbolic array: a symbolic run has shapes and bytes, no values")


def _by_value(name: str) -> Callable[..., Any]:
    # _refuse is a module function, which a mutation tester switches at call time; this line runs once, at
    # import (FUNCTIONS below), before any mutant can be switched on, so it is not mutated
    return functools.partial(_refuse, name)  # pragma: no mutate


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": reduction,
    "prod": reduction,
    "max": _reduce_same_dtype,
    "min": _reduce_same_dtype,
    "amax": _reduce_same_dtype,
    "amin": _reduce_same_dtype,
    "mean": _mean,
    "all": _all,
    "any": _all,
    "concatenate": concat,
    "concat": concat,
    "stack": stack,
    "split": split,
    "array_split": split,
    "reshape": reshape,
    "transpose": permute_dims,
    "permute_dims": permute_dims,
    "moveaxis": moveaxis,
    "take": take,
    "tensordot": tensordot,
    "where": where,
    "empty_like": like,
    "zeros_like": like,
    "ones_like": like,
    "full_like": _full_like,
    "copy": _copy,
    "broadcast_to": _broadcast_to,
    "expand_dims": _expand_dims,
    "squeeze": _squeeze,
    "shape": _shape_of,
    "ndim": _ndim,
    "size": _size,
    # positions picked by value (an order, the nonzeros): the values are the answer, and there are none
    **{
        name: _by_value(name)
        for name in ("argsort", "argmax", "argmin", "nonzero", "flatnonzero", "argwhere", "unique")
    },
}

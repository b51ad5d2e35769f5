"""Arrays that carry a shape and a dtype and nothing else, for runs at real sizes.

A `SymArray` answers everything a layer or a collective asks of an array that does not need its values:
`shape`, `dtype`, `nbytes`, indexing, arithmetic, matmul, reductions, concatenation and splitting. numpy's
own functions and ufuncs accept it (`__array_function__`, `__array_ufunc__`), so the op table's numpy
kernels run on it unchanged. Nothing is allocated: a 7168 x 18432 weight costs a few bytes. Asking for a
value that would steer the run (`int(x)`, `bool(x)`, an index) fails with `SymbolicValueError`, naming
what was asked; `float(x)` is NaN and `x.tolist()` NaNs (a loss printed, a small array shown in a note).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from greenlet import getcurrent

from ..comm.interface import BFLOAT16
from ..errors import ParasimError


SHOWN = 4096  # tolist() answers NaNs up to this many elements (notes show small arrays), then fails


class SymbolicValueError(ParasimError):
    """A symbolic run was asked for a value: shapes and bytes are all it has."""


def _dt(x: Any) -> Any:
    """What numpy's dtype resolution takes for an operand: a dtype, or a Python scalar's type (weak)."""
    if isinstance(x, (SymArray, np.ndarray, np.generic)):
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(bool)
    if isinstance(x, (int, float, complex)):
        return type(x)
    return np.asarray(x).dtype


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, (SymArray, np.ndarray, np.generic)) else np.shape(x)


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim if ndim else 0


class SymArray:
    """An array of `shape` and `dtype` whose values are never held."""

    __slots__ = ("shape", "dtype", "size", "nbytes")
    __array_priority__ = 100  # numpy defers to us in mixed arithmetic

    def __init__(self, shape: Sequence[int], dtype: Any = "float64"):
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        self.shape, self.dtype, self.size = shape, np.dtype(dtype), math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize

    # -- what an array says about itself ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def T(self) -> "SymArray":
        return _made(self.shape[::-1], self.dtype)

    @property
    def mT(self) -> "SymArray":
        return _made(self.shape[:-2] + self.shape[-1:] + self.shape[-2:-1], self.dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"SymArray({self.shape}, {self.dtype})"

    def copy(self) -> "SymArray":
        return self  # nothing in it can change: a copy may be the array itself

    def astype(self, dtype: Any, copy: bool = True) -> "SymArray":
        return SymArray(self.shape, dtype)

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
        raise SymbolicValueError(f"{what} of a symbolic {self.dtype} array of shape {self.shape}: a symbolic run "
                                 "has shapes and bytes, no values")

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

    # -- indexing --------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> "SymArray":
        return _made(_sliced(self.shape, index) or indexed_shape(self.shape, index), self.dtype)

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


def _made(shape: tuple[int, ...], dtype: np.dtype) -> SymArray:
    """A SymArray from a shape rule's own result (a tuple of ints, a numpy dtype): no checks to repeat, as a
    run at real size makes hundreds of thousands of them."""
    out = object.__new__(SymArray)
    out.shape, out.dtype, out.size = shape, dtype, math.prod(shape)
    out.nbytes = out.size * dtype.itemsize
    return out


def _binary(name: str, reflected: bool = False):
    ufunc = getattr(np, name)

    def op(self: SymArray, other: Any) -> SymArray:
        return _ufunc_call(ufunc, (other, self) if reflected else (self, other), {})
    return op


for _name, _ufunc_name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                           ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "power"),
                           ("matmul", "matmul"), ("and", "logical_and"), ("or", "logical_or")):
    setattr(SymArray, f"__{_name}__", _binary(_ufunc_name))
    setattr(SymArray, f"__r{_name}__", _binary(_ufunc_name, reflected=True))
    setattr(SymArray, f"__i{_name}__", _binary(_ufunc_name))
for _name, _ufunc_name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                           ("eq", "equal"), ("ne", "not_equal")):
    setattr(SymArray, f"__{_name}__", _binary(_ufunc_name))
SymArray.__hash__ = None  # type: ignore[assignment]  (== is elementwise, as for numpy arrays)
SymArray.__neg__ = lambda self: _made(self.shape, self.dtype)  # type: ignore[assignment]
SymArray.__pos__ = SymArray.__neg__  # type: ignore[assignment]
SymArray.__abs__ = SymArray.__neg__  # type: ignore[assignment]
SymArray.__invert__ = SymArray.__neg__  # type: ignore[assignment]


def _ufunc_call(ufunc: np.ufunc, inputs: Sequence[Any], kw: dict) -> SymArray:
    shapes = tuple([_shape(x) for x in inputs])
    dtypes = tuple([_dt(x) for x in inputs])
    key = (ufunc, shapes, dtypes, kw.get("dtype"))
    known = _UFUNC_RESULTS.get(key)
    if known is None:
        shape = matmul_shape(*shapes) if ufunc is np.matmul else np.broadcast_shapes(*shapes)
        if kw.get("dtype") is not None:
            out_dtype = np.dtype(kw["dtype"])
        else:
            out_dtype = ufunc.resolve_dtypes(dtypes + (None,) * ufunc.nout)[-1]
        if len(_UFUNC_RESULTS) > MEMO:  # a bounded memo of a pure rule
            _UFUNC_RESULTS.clear()
        known = _UFUNC_RESULTS[key] = (shape, out_dtype)
    if ufunc is np.matmul:  # 2 FLOPs per multiply-add: every output value took k of them
        _count(2 * math.prod(known[0]) * shapes[0][-1])
    return _made(*known)


def _count(flops: int) -> None:
    """Add FLOPs to the rank running now: the engine gives each rank's greenlet a `flops` count (a symbolic
    run reads it back per rank); outside a run there is nobody to count for."""
    g = getcurrent()
    if hasattr(g, "flops"):
        g.flops += flops


# (ufunc, shapes, dtypes, dtype asked) -> (shape, dtype): a layer applies the same few ops to the same shapes
# over and over; the answer is a pure function of the key, so it is worked out once
_UFUNC_RESULTS: dict = {}
MEMO = 50_000  # keys kept before the memo starts again (a run's layers use a few hundred)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's matmul rule: (..., n, k) @ (..., k, m) -> (..., n, m); a 1-D operand loses its dim."""
    if not a or not b:
        raise ValueError("matmul: an operand is 0-d")
    a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: shapes {a} and {b} do not align ({a2[-1]} != {b2[-2]})")
    out = np.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _sliced(shape: tuple[int, ...], index: Any) -> tuple[int, ...] | None:
    """x[a:b] or x[:, a:b] (slices alone, no more than the dims): the common case, worked out quickly; None
    for any other index (indexed_shape's general rule)."""
    items = index if type(index) is tuple else (index,)
    if len(items) > len(shape) or not all([type(i) is slice for i in items]):
        return None
    return tuple([len(range(*i.indices(n))) for i, n in zip(items, shape)]) + shape[len(items):]


def indexed_shape(shape: tuple[int, ...], index: Any) -> tuple[int, ...]:
    """The shape of x[index] for slices, integers, None, Ellipsis and integer (or boolean numpy) arrays."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise IndexError("an index can only have a single ellipsis")
    used = sum(1 for i in items if i is not None and i is not Ellipsis and not _is_bool(i))
    used += sum(np.ndim(i) for i in items if _is_bool(i))
    if used > len(shape):
        raise IndexError(f"too many indices for an array of {len(shape)} dims")
    at = next((k for k, i in enumerate(items) if i is Ellipsis), None)
    if at is not None:
        items[at:at + 1] = [slice(None)] * (len(shape) - used)
    else:
        items += [slice(None)] * (len(shape) - used)
    out: list[Any] = []  # dims, with one ("adv", k) placeholder per advanced index
    adv_shapes, adv_at, dim = [], [], 0
    for i in items:
        if i is None:
            out.append(1)
        elif isinstance(i, slice):
            out.append(len(range(*i.indices(shape[dim]))))
            dim += 1
        elif isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            if not -shape[dim] <= int(i) < shape[dim]:
                raise IndexError(f"index {int(i)} is out of bounds for a dim of size {shape[dim]}")
            dim += 1
        elif _is_bool(i):
            mask = np.asarray(i)
            if mask.shape != shape[dim:dim + mask.ndim]:
                raise IndexError(f"boolean index of shape {mask.shape} does not match {shape[dim:dim + mask.ndim]}")
            adv_shapes.append((int(mask.sum()),))
            adv_at.append(len(out))
            out.append(("adv",))
            dim += mask.ndim
        else:  # an integer array (or list), numpy or symbolic
            ishape = i.shape if isinstance(i, SymArray) else np.shape(i)
            if not isinstance(i, SymArray):
                arr = np.asarray(i)
                if arr.size and arr.dtype.kind not in "iu":
                    raise IndexError(f"arrays used as indices must be of integer type, not {arr.dtype}")
                if arr.size and (arr.max() >= shape[dim] or arr.min() < -shape[dim]):
                    raise IndexError(f"an index is out of bounds for a dim of size {shape[dim]}")
            adv_shapes.append(tuple(ishape))
            adv_at.append(len(out))
            out.append(("adv",))
            dim += 1
    if not adv_shapes:
        return tuple(out)
    adv = np.broadcast_shapes(*adv_shapes)
    plain = [d for d in out if not isinstance(d, tuple)]
    together = adv_at == list(range(adv_at[0], adv_at[0] + len(adv_at)))  # adjacent: they stay in place
    if together:
        first = adv_at[0]
        before = [d for d in out[:first] if not isinstance(d, tuple)]
        return tuple(before) + adv + tuple(plain[len(before):])
    return adv + tuple(plain)  # apart: numpy puts the broadcast index dims first


def _is_bool(i: Any) -> bool:
    return isinstance(i, (np.ndarray, list)) and np.asarray(i).dtype == bool


# -- functions (numpy's, through __array_function__; also the symbolic namespace's) ------------------

def reduction(x: SymArray, axis: Any = None, keepdims: bool = False, dtype: Any = None, **_: Any) -> SymArray:
    nd = x.ndim
    axes = range(nd) if axis is None else [_axis(a, nd) for a in (axis if isinstance(axis, (tuple, list)) else
                                                                    (axis,))]
    axes = set(axes)
    shape = tuple(1 if k in axes else n for k, n in enumerate(x.shape) if keepdims or k not in axes)
    if dtype is None:
        dtype = x.dtype if x.dtype.kind not in "bui" else (np.int64 if x.dtype.kind != "u" else np.uint64)
    return SymArray(shape, dtype)


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
        return SymArray((sum(math.prod(_shape(a)) for a in arrays),), np.result_type(*[_dt(a) for a in arrays]))
    first = _shape(arrays[0])
    ax = _axis(axis, len(first))
    for a in arrays[1:]:
        s = _shape(a)
        if len(s) != len(first) or any(p != q for k, (p, q) in enumerate(zip(s, first)) if k != ax):
            raise ValueError(f"concatenate: shapes {first} and {s} differ off axis {ax}")
    total = sum(_shape(a)[ax] for a in arrays)
    return _made(first[:ax] + (total,) + first[ax + 1:], np.result_type(*[_dt(a) for a in arrays]))


def stack(arrays: Sequence[Any], axis: int = 0, **_: Any) -> SymArray:
    arrays = list(arrays)
    first = _shape(arrays[0])
    if any(_shape(a) != first for a in arrays):
        raise ValueError("stack: every array must have the same shape")
    ax = _axis(axis, len(first) + 1)
    return _made(first[:ax] + (len(arrays),) + first[ax:], np.result_type(*[_dt(a) for a in arrays]))


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
    return [_made(x.shape[:ax] + (max(0, min(b, n) - min(a, n)),) + x.shape[ax + 1:], x.dtype)
            for a, b in zip(edges, edges[1:])]


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
    return _made(shape, x.dtype)


def permute_dims(x: SymArray, axes: Any = None) -> SymArray:
    axes = tuple(range(x.ndim))[::-1] if axes is None else tuple(_axis(a, x.ndim) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"axes {axes} do not permute {x.ndim} dims")
    return _made(tuple(x.shape[a] for a in axes), x.dtype)


def moveaxis(x: SymArray, source: int, destination: int) -> SymArray:
    order = [a for a in range(x.ndim) if a != _axis(source, x.ndim)]
    order.insert(_axis(destination, x.ndim), _axis(source, x.ndim))
    return permute_dims(x, order)


def take(x: SymArray, indices: Any, axis: int | None = None, **_: Any) -> SymArray:
    if axis is None:
        return SymArray(_shape(indices), x.dtype)
    ax = _axis(axis, x.ndim)
    return _made(x.shape[:ax] + tuple(_shape(indices)) + x.shape[ax + 1:], x.dtype)


def tensordot(a: Any, b: Any, axes: Any = 2) -> SymArray:
    sa, sb = _shape(a), _shape(b)
    if isinstance(axes, (int, np.integer)):
        ia, ib = list(range(len(sa) - int(axes), len(sa))), list(range(int(axes)))
    else:
        ia, ib = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
                  [axes[1]] if isinstance(axes[1], int) else list(axes[1]))
    ia, ib = [_axis(k, len(sa)) for k in ia], [_axis(k, len(sb)) for k in ib]
    if [sa[k] for k in ia] != [sb[k] for k in ib]:
        raise ValueError(f"tensordot: summed dims of {sa} and {sb} differ")
    shape = tuple(n for k, n in enumerate(sa) if k not in ia) + tuple(n for k, n in enumerate(sb) if k not in ib)
    _count(2 * math.prod(shape) * math.prod(sa[k] for k in ia))  # a multiply-add per summed value
    return SymArray(shape, np.result_type(_dt(a), _dt(b)))


def where(cond: Any, a: Any, b: Any) -> SymArray:
    return SymArray(np.broadcast_shapes(_shape(cond), _shape(a), _shape(b)), np.result_type(_dt(a), _dt(b)))


def like(x: Any, dtype: Any = None, shape: Any = None, **_: Any) -> SymArray:
    return SymArray(_shape(x) if shape is None else shape, dtype if dtype is not None else _dt(x))


def _full_like(x: Any, fill_value: Any, dtype: Any = None, **kw: Any) -> SymArray:
    return like(x, dtype, **kw)


def _copy(x: Any, **_: Any) -> SymArray:
    return SymArray(_shape(x), _dt(x))


def _broadcast_to(x: Any, shape: Any, **_: Any) -> SymArray:
    if np.broadcast_shapes(_shape(x), tuple(shape)) != tuple(shape):  # x must fit inside the shape asked
        raise ValueError(f"cannot broadcast an array of shape {_shape(x)} to {tuple(shape)}")
    return SymArray(tuple(shape), _dt(x))


def _expand_dims(x: Any, axis: int) -> SymArray:
    s = list(_shape(x))
    s.insert(_axis(axis, len(s) + 1), 1)
    return SymArray(s, _dt(x))


def _squeeze(x: Any, axis: Any = None) -> SymArray:
    s = _shape(x)
    drop = {k for k, n in enumerate(s) if n == 1} if axis is None else {
        _axis(a, len(s)) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
    return SymArray(tuple(n for k, n in enumerate(s) if k not in drop), _dt(x))


def _shape_of(x: Any) -> tuple[int, ...]:
    return _shape(x)


def _ndim(x: Any) -> int:
    return len(_shape(x))


def _size(x: Any, axis: Any = None) -> int:
    return math.prod(_shape(x)) if axis is None else _shape(x)[axis]


FUNCTIONS = {
    "sum": reduction, "prod": reduction, "max": _reduce_same_dtype, "min": _reduce_same_dtype,
    "amax": _reduce_same_dtype, "amin": _reduce_same_dtype, "mean": _mean, "all": _all, "any": _all,
    "concatenate": concat, "concat": concat, "stack": stack, "split": split, "array_split": split,
    "reshape": reshape, "transpose": permute_dims, "permute_dims": permute_dims, "moveaxis": moveaxis,
    "take": take, "tensordot": tensordot, "where": where, "empty_like": like, "zeros_like": like, "ones_like": like,
    "full_like": _full_like, "copy": _copy, "broadcast_to": _broadcast_to, "expand_dims": _expand_dims,
    "squeeze": _squeeze, "shape": _shape_of, "ndim": _ndim, "size": _size,
}

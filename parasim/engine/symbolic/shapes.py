"""The shape rules that need no array at all: an axis in range, numpy's matmul rule, and the shape an index
gives (slices, integers, None, Ellipsis, integer and boolean index arrays). Pure functions of shapes."""

from __future__ import annotations

from typing import Any

import numpy as np


def axis_of(axis: int, ndim: int) -> int:
    """`axis` counted from 0 (a negative one from the end), or numpy's AxisError."""
    if not -ndim <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim if ndim else 0


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


def sliced_shape(shape: tuple[int, ...], index: Any) -> tuple[int, ...] | None:
    """x[a:b] or x[:, a:b] (slices alone, no more than the dims): the common case, worked out quickly; None
    for any other index (indexed_shape's general rule)."""
    items = index if type(index) is tuple else (index,)
    if len(items) > len(shape) or not all([type(i) is slice for i in items]):
        return None
    return tuple([len(range(*i.indices(n))) for i, n in zip(items, shape)]) + shape[len(items) :]


def _has_values(i: Any) -> bool:
    """An index whose values are at hand (Python's or numpy's), so its bounds can be checked; any other
    array (one without values) counts by its shape alone."""
    return isinstance(i, (list, tuple, np.ndarray, np.generic))


def _is_bool(i: Any) -> bool:
    return isinstance(i, (np.ndarray, list)) and np.asarray(i).dtype == bool


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
        items[at : at + 1] = [slice(None)] * (len(shape) - used)
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
            if mask.shape != shape[dim : dim + mask.ndim]:
                raise IndexError(f"boolean index of shape {mask.shape} does not match {shape[dim : dim + mask.ndim]}")
            adv_shapes.append((int(mask.sum()),))
            adv_at.append(len(out))
            out.append(("adv",))
            dim += mask.ndim
        else:  # an integer array (or list), with values or without
            if _has_values(i):
                arr = np.asarray(i)
                if arr.size and arr.dtype.kind not in "iu":
                    raise IndexError(f"arrays used as indices must be of integer type, not {arr.dtype}")
                if arr.size and (arr.max() >= shape[dim] or arr.min() < -shape[dim]):
                    raise IndexError(f"an index is out of bounds for a dim of size {shape[dim]}")
                ishape = arr.shape
            else:
                ishape = tuple(i.shape)
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
        return tuple(before) + adv + tuple(plain[len(before) :])
    return adv + tuple(plain)  # apart: numpy puts the broadcast index dims first

"""Numpy helpers the op table's kernels share (ops.py holds the kernels themselves).

Reductions run in group order, ((x0 + x1) + x2) + ..., so results are the same on every run, and every
member gets an array of its own. max and min propagate NaN (numpy's maximum and minimum, as torch.maximum).

Sums of 16-bit floats (float16, bfloat16) are the exception: every addition rounds to 11 or 8 significant
bits, so the order of the additions shows in the result, and they run in the order gloo adds them
(`ring_sum`), bit for bit. Gloo's all-reduce and reduce are rings (gloo/allreduce.cc, gloo/reduce.cc):
the flat buffer is cut into one chunk per member, in torch's member order (ascending global rank), and
chunk c travels c-1 -> c-2 -> ... -> c, each member adding its own values to the running sum it received
(an addition in float32, rounded once to the dtype). So chunk c of member values x is
x[c] + (x[c+1] + (... + (x[c-2] + x[c-1]))), indices mod t. A chunk is 2 segments of ceil(n / 2t)
elements while a segment stays under gloo's 1 MiB; past that, more segments per chunk, sized by the
rules in `ring_chunk`. torch runs gloo's reduce-scatter as an all-reduce of the whole input buffer. We
found this order by experiment (torch 2.13, gloo on CPU, 2, 3, 4 and 8 ranks, sizes from 1 element to
3.5 M, values whose sums round differently in every other order) and by reading gloo's source.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .interface import BFLOAT16, Group


def _nan_quiet(fn: Any) -> Any:
    """`fn` with numpy's 'invalid value' warning off: max and min propagate NaN on purpose, and ml_dtypes
    before 0.7 warns when bfloat16 does."""

    def quiet(*args: Any, **kw: Any) -> Any:
        with np.errstate(invalid="ignore"):
            return fn(*args, **kw)

    return quiet


COMBINE = {"sum": np.add, "avg": np.add, "max": _nan_quiet(np.maximum), "min": _nan_quiet(np.minimum)}
SEGMENT = 1 << 20  # gloo's largest segment, in bytes (AllreduceOptionsImpl::kMaxSegmentSize)


def reduce(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Reduce in group order into a fresh array."""
    fn = COMBINE[op]
    if len(xs) == 1:
        out = xs[0].copy()
    elif not isinstance(xs[0], np.ndarray):  # symbolic: the signature check made the inputs alike in shape and
        out = fn(xs[0], xs[1])  # dtype, so one step has the result's (128 members: one, not 127)
    elif (
        fn is np.add and xs[0].ndim
    ):  # the operator: the same additions, without a keyword call's cost (tiny calls: most of it)
        out = xs[0] + xs[1]
        for x in xs[2:]:
            out += x
    else:
        out = fn(xs[0], xs[1], out=np.empty_like(xs[0]))
        for x in xs[2:]:
            fn(out, x, out=out)
    return mean(out, op, len(xs))


def mean(out: np.ndarray, op: str, t: int) -> np.ndarray:
    """The average from the sum, in place, in the sum's dtype (gloo has no average either: it divides the sum)."""
    if op == "avg":
        np.divide(out, t, out=out)
    return out


def ordered_sum(xs: Sequence[Any], op: str) -> bool:
    """Whether a reduction of `xs` runs in gloo's order (`ring_sum`): a sum of 16-bit float values. Symbolic
    arrays have no values to round."""
    if op not in ("sum", "avg") or not isinstance(xs[0], np.ndarray):
        return False
    dt = xs[0].dtype  # asked by kind and size: a dtype's name is worked out in Python, microseconds a call
    return (dt.kind == "f" and dt.itemsize == 2) or dt == BFLOAT16


def torch_members(g: Group) -> list[int]:
    """Our member index of each of torch's members: torch orders a group's ranks ascending, we keep the order
    given."""
    return sorted(range(g.size), key=g.ranks.__getitem__)


def ring_chunk(n: int, itemsize: int, t: int, reduce_only: bool = False) -> int:
    """Elements in each member's chunk when gloo's ring reduces n elements over t members: all-reduce's
    segment rule, or (reduce_only) gloo's reduce's, which differ once a segment would pass 1 MiB."""
    size, most = n * itemsize, itemsize * max(1, SEGMENT // itemsize)
    if reduce_only:
        segment = _up(min(-(-size // (2 * t)), most), itemsize)
        segments = _up(max(-(-size // segment), 2 * t), t)
    else:
        segments = _up(max(-(-size // most), 2 * t), t)
        segment = _up(-(-size // segments), itemsize)
    return segments // t * segment // itemsize


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def ring_sum(flat: Sequence[np.ndarray], reduce_only: bool = False) -> np.ndarray:
    """The sum of equal-length 1-D arrays (one per member, in torch's member order) in gloo's ring order:
    element e of chunk c is x[c] + (x[c+1] + (... + (x[c-2] + x[c-1]))), each addition rounded to the dtype."""
    t, n = len(flat), flat[0].size
    if t == 1 or n == 0:
        return flat[0].copy()
    x = np.stack(flat)
    cols = np.arange(n)
    owner = cols // ring_chunk(n, x.itemsize, t, reduce_only)  # the member that ends up holding the element
    out = x[(owner - 1) % t, cols]
    for k in range(2, t + 1):
        out = x[(owner - k) % t, cols] + out  # the k-th member down the ring adds its own value to what arrived
    return out


def copies(out: np.ndarray, t: int) -> list[np.ndarray]:
    """One result for each of t members, each an array of its own."""
    return [out, *map(type(out).copy, [out] * (t - 1))]  # copied in C, not a loop of calls: a tiny call costs it


def ring_moved(g: Group, hops: list[dict]) -> list[tuple[int, int]]:
    """Bytes each member sent and received, counted from the recorded hops."""
    sent = dict.fromkeys(g.ranks, 0)
    recv = dict.fromkeys(g.ranks, 0)
    for hop in hops:
        for tr in hop["transfers"]:
            sent[tr["src"]] += tr["bytes"]
            recv[tr["dst"]] += tr["bytes"]
    return [(sent[r], recv[r]) for r in g.ranks]


def arrays(v: Any) -> tuple | list:
    """A call's input or result as a list of arrays: none (barrier, a reduce's non-root), one, or several."""
    return () if v is None else v if type(v) is list else (v,)

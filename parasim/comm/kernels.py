"""Numpy helpers the op table's kernels share (ops.py holds the kernels themselves).

Reductions run in group order, ((x0 + x1) + x2) + ..., so results are the same on every run, and every
member gets an array of its own.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .interface import Group

COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}


def reduce(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Reduce in group order into a fresh array."""
    fn = COMBINE[op]
    if len(xs) == 1:
        out = xs[0].copy()
    elif not isinstance(xs[0], np.ndarray):  # symbolic: the signature check made the inputs alike in shape and
        out = fn(xs[0], xs[1])               # dtype, so one step has the result's (128 members: one, not 127)
    else:
        out = fn(xs[0], xs[1], out=np.empty_like(xs[0]))
        for x in xs[2:]:
            fn(out, x, out=out)
    if op == "avg":
        np.divide(out, len(xs), out=out)
    return out


def copies(out: np.ndarray, t: int) -> list[np.ndarray]:
    """One result for each of t members, each an array of its own."""
    return [out] + [out.copy() for _ in range(t - 1)]


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

"""What each collective computes, on numpy arrays, for all members at once.

Each kernel takes the members' inputs in group order and returns (outputs in group order, ring hops or
None, [(sent, received) bytes per member]). Reductions run in group order, ((x0 + x1) + x2) + ..., so
results are the same on every run. Every member gets an array of its own.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import ring
from .interface import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, REDUCE_SCATTER, Group,
                        broadcast_bytes, ring_bytes)

COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}


def reduce(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Reduce in group order into a fresh array."""
    fn = COMBINE[op]
    if len(xs) == 1:
        out = xs[0].copy()
    else:
        out = fn(xs[0], xs[1], out=np.empty_like(xs[0]))
        for x in xs[2:]:
            fn(out, x, out=out)
    if op == "avg":
        np.divide(out, len(xs), out=out)
    return out


def _ring_moved(g: Group, hops: list[dict]) -> list[tuple[int, int]]:
    """Bytes each member sent and received, counted from the recorded hops."""
    sent = dict.fromkeys(g.ranks, 0)
    recv = dict.fromkeys(g.ranks, 0)
    for hop in hops:
        for tr in hop["transfers"]:
            sent[tr["src"]] += tr["bytes"]
            recv[tr["dst"]] += tr["bytes"]
    return [(sent[r], recv[r]) for r in g.ranks]


def _copies(out: np.ndarray, t: int) -> list[np.ndarray]:
    return [out] + [out.copy() for _ in range(t - 1)]


def all_reduce(inputs, g: Group, params: dict, keep: int):
    t, op = g.size, params["op"]
    if params["algo"] == "ring":
        outs, hops = ring.ring_all_reduce(inputs, g.ranks, COMBINE[op], t if op == "avg" else None, keep)
        return outs, hops, _ring_moved(g, hops)
    x = inputs[0]
    return _copies(reduce(inputs, op), t), None, ring_bytes(ALL_REDUCE, x.nbytes, t, x.itemsize)


def reduce_scatter(inputs, g: Group, params: dict, keep: int):
    t, op, dim = g.size, params["op"], params["dim"]
    if params["algo"] == "ring":
        outs, hops = ring.ring_reduce_scatter(inputs, g.ranks, dim, COMBINE[op], t if op == "avg" else None,
                                              keep)
        return outs, hops, _ring_moved(g, hops)
    parts = [np.split(x, t, axis=dim) for x in inputs]
    x = inputs[0]
    return ([reduce([p[i] for p in parts], op) for i in range(t)], None,
            ring_bytes(REDUCE_SCATTER, x.nbytes, t, x.itemsize))


def all_gather(inputs, g: Group, params: dict, keep: int):
    t, dim = g.size, params["dim"]
    if params["algo"] == "ring":
        outs, hops = ring.ring_all_gather(inputs, g.ranks, dim, keep)
        return outs, hops, _ring_moved(g, hops)
    out = np.concatenate(inputs, axis=dim)
    return _copies(out, t), None, ring_bytes(ALL_GATHER, out.nbytes, t, out.itemsize)


def all_to_all(inputs, g: Group, params: dict, keep: int):
    t = g.size
    outs = [[inputs[i][j].copy() for i in range(t)] for j in range(t)]
    moved = [(sum(c.nbytes for j, c in enumerate(inputs[i]) if j != i),
              sum(inputs[k][i].nbytes for k in range(t) if k != i)) for i in range(t)]
    return outs, None, moved


def broadcast(inputs, g: Group, params: dict, keep: int):
    t, src = g.size, g.ranks.index(params["src"])
    x = inputs[src]
    return [x.copy() for _ in range(t)], None, [broadcast_bytes(x.nbytes, t, i, src) for i in range(t)]


def barrier(inputs, g: Group, params: dict, keep: int):
    return [None] * g.size, None, [(0, 0)] * g.size


KERNELS = {ALL_REDUCE: all_reduce, REDUCE_SCATTER: reduce_scatter, ALL_GATHER: all_gather,
           ALL_TO_ALL: all_to_all, BROADCAST: broadcast, BARRIER: barrier}

"""The ring algorithm, hop by hop, on numpy buffers: for teaching, not speed.

Member i always sends to member i+1. A reduce-scatter takes t-1 hops: at hop k member i passes its
running sum of chunk i-k-1 on, and the receiver adds its own part, so after t-1 hops member i holds the
finished chunk i. An all-gather takes t-1 more hops: at hop k member i passes chunk i-k on. All-reduce is
the two in a row. Every transfer is recorded, so the bytes each member moves are measured, not assumed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

Reduce = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _values(a: np.ndarray, keep: int):
    return a.tolist() if keep and a.size <= keep else None


def _reduce_scatter_hops(bufs: list[list[np.ndarray]], ranks: tuple[int, ...], reduce: Reduce,
                         keep: int, hops: list[dict]) -> None:
    t = len(bufs)
    for k in range(t - 1):
        moves = []
        for i in range(t):
            c = (i - k - 1) % t
            moves.append((i, c, bufs[i][c].copy()))
        for i, c, payload in moves:
            j = (i + 1) % t
            bufs[j][c] = reduce(payload, bufs[j][c])
        hops.append({"phase": "reduce-scatter", "hop": k, "transfers": [
            {"src": ranks[i], "dst": ranks[(i + 1) % t], "chunk": c, "bytes": int(p.nbytes),
             "value": _values(p, keep)} for i, c, p in moves]})


def _all_gather_hops(bufs: list[list[np.ndarray]], ranks: tuple[int, ...], keep: int,
                     hops: list[dict]) -> None:
    t = len(bufs)
    for k in range(t - 1):
        moves = [(i, (i - k) % t, bufs[i][(i - k) % t].copy()) for i in range(t)]
        for i, c, payload in moves:
            bufs[(i + 1) % t][c] = payload
        hops.append({"phase": "all-gather", "hop": k, "transfers": [
            {"src": ranks[i], "dst": ranks[(i + 1) % t], "chunk": c, "bytes": int(p.nbytes),
             "value": _values(p, keep)} for i, c, p in moves]})


def ring_all_reduce(inputs: list[np.ndarray], ranks: tuple[int, ...], reduce: Reduce, scale: float | None,
                    keep: int) -> tuple[list[np.ndarray], list[dict]]:
    """All-reduce as reduce-scatter then all-gather on flat chunks; `scale` divides each finished chunk (avg)."""
    t = len(inputs)
    shape = inputs[0].shape
    bufs = [[c.copy() for c in np.array_split(x.reshape(-1), t)] for x in inputs]
    hops: list[dict] = []
    _reduce_scatter_hops(bufs, ranks, reduce, keep, hops)
    if scale is not None:
        for i in range(t):
            bufs[i][i] = (bufs[i][i] / scale).astype(inputs[0].dtype)
    _all_gather_hops(bufs, ranks, keep, hops)
    return [np.concatenate(b).reshape(shape) for b in bufs], hops


def ring_reduce_scatter(inputs: list[np.ndarray], ranks: tuple[int, ...], dim: int, reduce: Reduce,
                        scale: float | None, keep: int) -> tuple[list[np.ndarray], list[dict]]:
    t = len(inputs)
    bufs = [[c.copy() for c in np.split(x, t, axis=dim)] for x in inputs]
    hops: list[dict] = []
    _reduce_scatter_hops(bufs, ranks, reduce, keep, hops)
    outs = [bufs[i][i] for i in range(t)]
    if scale is not None:
        outs = [(o / scale).astype(inputs[0].dtype) for o in outs]
    return outs, hops


def ring_all_gather(inputs: list[np.ndarray], ranks: tuple[int, ...], dim: int,
                    keep: int) -> tuple[list[np.ndarray], list[dict]]:
    t = len(inputs)
    bufs: list[list] = [[None] * t for _ in range(t)]  # member i starts with only its own chunk
    for i in range(t):
        bufs[i][i] = inputs[i].copy()
    hops: list[dict] = []
    _all_gather_hops(bufs, ranks, keep, hops)
    return [np.concatenate(b, axis=dim) for b in bufs], hops

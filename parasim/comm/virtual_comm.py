"""The collective interface of one virtual rank: each call is checked locally, then joins the shared
VirtualWorld (virtual.py), which matches it with the other members' calls."""
from __future__ import annotations

import numpy as np

from ..errors import CollectiveError
from .interface import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, REDUCE_SCATTER, Comm, call_site,
                        check_algo, check_divisible, check_reduce_op, describe, dtype_name, norm_dim, site_name)
from .virtual import NUMERIC, VirtualWorld, _check_array


class VirtualComm(Comm):
    """The collective interface of one virtual rank: checks the call locally, then joins the world."""

    def __init__(self, world: VirtualWorld, rank: int):
        self._w = world
        self.rank = rank
        self.world = world.world

    def _algo(self, algo: str | None) -> str:
        if algo is None:
            return self._w.algo
        check_algo(algo)
        return algo

    def all_reduce(self, x, op="sum", *, group=None, label=None, algo=None):
        # The hot path of the per-call benchmark, so the common case is inlined.
        site = call_site()
        if type(x) is not np.ndarray or x.dtype.kind not in NUMERIC:
            _check_array(x, ALL_REDUCE)
        w = self._w
        g = w.world_group if group is None else w.resolve(self.rank, group, ALL_REDUCE)
        if op != "sum":
            check_reduce_op(op, x.dtype)
        algo = w.algo if algo is None else self._algo(algo)
        return w.collective(
            self.rank, ALL_REDUCE, x, (ALL_REDUCE, x.shape, x.dtype, op, algo),
            lambda: describe(ALL_REDUCE, x, op=op, algo=algo),
            {"op": op, "algo": algo}, g, label, site)

    def reduce_scatter(self, x, dim=0, *, op="sum", group=None, label=None, algo=None):
        site = call_site()
        _check_array(x, REDUCE_SCATTER)
        g = self._w.resolve(self.rank, group, REDUCE_SCATTER)
        check_reduce_op(op, x.dtype)
        dim = norm_dim(dim, x.ndim, REDUCE_SCATTER)
        check_divisible(x.shape, dim, g.size, REDUCE_SCATTER)
        algo = self._algo(algo)
        return self._w.collective(
            self.rank, REDUCE_SCATTER, x, (REDUCE_SCATTER, x.shape, x.dtype, dim, op, algo),
            lambda: describe(REDUCE_SCATTER, x, dim=dim, op=op, algo=algo),
            {"op": op, "dim": dim, "algo": algo}, g, label, site)

    def all_gather(self, x, dim=0, *, group=None, label=None, algo=None):
        site = call_site()
        _check_array(x, ALL_GATHER)
        g = self._w.resolve(self.rank, group, ALL_GATHER)
        dim = norm_dim(dim, x.ndim, ALL_GATHER)
        algo = self._algo(algo)
        return self._w.collective(
            self.rank, ALL_GATHER, x, (ALL_GATHER, x.shape, x.dtype, dim, algo),
            lambda: describe(ALL_GATHER, x, dim=dim, algo=algo),
            {"dim": dim, "algo": algo}, g, label, site)

    def all_to_all(self, chunks, dim=0, *, group=None, label=None):
        site = call_site()
        g = self._w.resolve(self.rank, group, ALL_TO_ALL)
        chunks = list(chunks)
        if len(chunks) != g.size:
            raise CollectiveError(f"all_to_all: {len(chunks)} chunks for a group of {g.size} ({g})")
        for c in chunks:
            _check_array(c, ALL_TO_ALL)
        first = chunks[0]
        dim = norm_dim(dim, first.ndim, ALL_TO_ALL)
        rest = first.shape[:dim] + first.shape[dim + 1:]
        for c in chunks:
            if c.ndim != first.ndim or c.shape[:dim] + c.shape[dim + 1:] != rest or c.dtype != first.dtype:
                raise CollectiveError(f"all_to_all: chunks must agree in dtype and in every dim but {dim}; got "
                                      f"{[(c.shape, dtype_name(c.dtype)) for c in chunks]}")
        return self._w.collective(
            self.rank, ALL_TO_ALL, chunks, (ALL_TO_ALL, first.ndim, dim, rest, first.dtype),
            lambda: describe(ALL_TO_ALL, chunks, dim=dim),
            {"dim": dim}, g, label, site)

    def broadcast(self, x, src, *, group=None, label=None):
        site = call_site()
        _check_array(x, BROADCAST)
        g = self._w.resolve(self.rank, group, BROADCAST)
        if src not in g.ranks:
            raise CollectiveError(f"broadcast: src rank {src} is not a member of group {g}")
        return self._w.collective(
            self.rank, BROADCAST, x, (BROADCAST, x.shape, x.dtype, int(src)),
            lambda: describe(BROADCAST, x, src=src),
            {"src": int(src)}, g, label, site)

    def barrier(self, *, group=None, label=None):
        site = call_site()
        g = self._w.resolve(self.rank, group, BARRIER)
        self._w.collective(self.rank, BARRIER, None, (BARRIER,), lambda: describe(BARRIER), {}, g, label, site)

    def exchange(self, ops, *, group=None, label=None, tags=None):
        site = call_site()
        g = self._w.resolve(self.rank, group, "exchange")
        return self._w.exchange(self.rank, list(ops), g, label, site, tags)

    def new_group(self, ranks, name):
        return self._w.new_group(self.rank, ranks, name, site_name(call_site()))

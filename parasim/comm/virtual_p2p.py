"""Point-to-point on virtual ranks: a send and a receive meet only when both sides have posted (a
rendezvous, the strictest real-backend behaviour, so a program that runs here does not hang on NCCL or
gloo); what a transfer may carry, and the trace's record of an array's shape and dtype."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
from greenlet import GreenletExit

from ..errors import CollectiveError
from .sites import SiteNames
from .trace import Event, Member, Tensor
from .interface import (
    P2P,
    Group,
    Recv,
    Send,
    check_peer,
    describe_p2p,
    dtype_name,
    numeric,
    p2p_mismatch_error,
    recv_dtype,
    site_name,
)

_member = tuple.__new__  # builds a record without NamedTuple's Python-level __new__ (hot path)


class Batch:
    """One rank's `exchange`: its posted sends and receives."""

    __slots__ = ("rank", "pending", "results", "clock0", "maxstep", "site", "label", "group", "posts", "tags")

    def __init__(self, rank, nrecv, clock0, site, label, group, tags=None):
        self.rank, self.pending, self.results = rank, 0, [None] * nrecv
        self.clock0 = self.maxstep = clock0
        self.site, self.label, self.group, self.posts, self.tags = site, label, group, [], tags


class Post:
    __slots__ = ("batch", "peer", "x", "shape", "dtype", "slot", "matched", "label")

    def __init__(self, batch, peer, x=None, shape=None, dtype=None, slot=-1, label=None):
        self.batch, self.peer, self.x, self.shape, self.dtype, self.slot = batch, peer, x, shape, dtype, slot
        self.matched, self.label = False, label

    def describe(self) -> str:
        if self.x is not None:
            return describe_p2p(True, self.peer, self.x.shape, self.x.dtype)
        return describe_p2p(False, self.peer, self.shape, self.dtype)


class PointToPoint:
    """The point-to-point part of the virtual world (comm/virtual.py): `exchange` posts a rank's sends and
    receives and completes those whose other side is there."""

    # what the world it is part of holds and does (comm/virtual.py VirtualWorld): declared for the type checker
    aborted: bool
    ranks: list
    ready: deque
    keep: int
    sends: dict[tuple[int, int], deque]
    recvs: dict[tuple[int, int], deque]
    events: list[Event]
    site_names: SiteNames
    _thread: int
    _tensors: dict
    _check: Callable[[Any, str], None]
    _wait: Callable[[Any, Any], None]
    _off_thread: Callable[[int, str, tuple[str, int]], None]
    _work: Callable[[int], dict | None]
    _room: Callable[[int], bool]

    def _peer(self, peer: int, rank: int) -> int:
        """The rank that answers `rank`'s point-to-point call to `peer`: the peer itself."""
        return peer

    # -- point-to-point --------------------------------------------------------------------------
    def exchange(
        self,
        rank: int,
        ops: Sequence[Send | Recv],
        group: Group,
        label: str | None,
        site: tuple[str, int],
        tags: dict | None = None,
    ) -> list:
        if self.aborted:
            raise GreenletExit()
        if threading.get_ident() != self._thread:
            self._off_thread(rank, "point-to-point", site)
        st = self.ranks[rank]
        nrecv = sum(isinstance(o, Recv) for o in ops)
        batch = Batch(rank, nrecv, st.clock, site, label, group, tags)
        posts = []
        for o in ops:  # check the whole batch before posting any of it
            if isinstance(o, Send):
                self._check(o.x, "send")
                posts.append(
                    Post(batch, self._peer(check_peer(o.dst, rank, group, "send to"), rank), x=o.x, label=o.label)
                )
            elif isinstance(o, Recv):
                peer = self._peer(check_peer(o.src, rank, group, "recv from"), rank)
                name = recv_dtype(o, peer)
                try:
                    shape = tuple(int(n) for n in o.shape)
                    dtype = np.dtype(name)
                    if dtype.kind not in NUMERIC:
                        raise TypeError
                except (TypeError, ValueError):
                    raise CollectiveError(
                        f"recv from rank {peer}: bad shape {o.shape!r} or dtype {o.dtype!r}"
                    ) from None
                posts.append(
                    Post(batch, peer, shape=shape, dtype=dtype, slot=sum(p.x is None for p in posts), label=o.label)
                )
            else:
                raise CollectiveError(f"exchange takes Send and Recv entries, got {type(o).__name__}")
        batch.posts = posts
        batch.pending = len(posts)
        for p in posts:
            if p.x is not None:
                key, mine, theirs = (rank, p.peer), self.sends, self.recvs
            else:
                key, mine, theirs = (p.peer, rank), self.recvs, self.sends
            queue = theirs.get(key)
            if queue:
                other = queue.popleft()
                self._transfer(p, other, rank) if p.x is not None else self._transfer(other, p, rank)
            else:
                mine.setdefault(key, deque()).append(p)
        if batch.pending:
            self._wait(st, batch)
        st.clock = batch.maxstep
        return batch.results

    def _transfer(self, s: Post, r: Post, current: int) -> None:
        x = s.x
        if x.shape != r.shape or x.dtype != r.dtype:
            raise p2p_mismatch_error(
                s.batch.rank,
                f"{s.describe()} at {site_name(s.batch.site)}",
                r.batch.rank,
                f"{r.describe()} at {site_name(r.batch.site)}",
            )
        r.batch.results[r.slot] = x.copy()
        s.matched = r.matched = True
        step = 1 + max(s.batch.clock0, r.batch.clock0)
        n = int(x.nbytes)
        keep = bool(self.keep) and x.size <= self.keep and self._room(x.size)
        val = (x.tolist(),) if keep else None
        src, dst = s.batch.rank, r.batch.rank
        t = tensor_record(x, self._tensors)
        members = [
            Member(src, (t,), (), n, 0, self.site_names(s.batch.site), val, () if keep else None, self._work(src)),
            Member(dst, (), (t,), 0, n, self.site_names(r.batch.site), () if keep else None, val, self._work(dst)),
        ]
        self.events.append(
            Event(
                len(self.events),
                step,
                "p2p",
                P2P,
                s.batch.group,
                members,
                s.label or r.label or s.batch.label or r.batch.label,
                self.ranks[src].phase,
                {"src": src, "dst": dst},
                None,
                None,
                s.batch.tags or r.batch.tags,
            )
        )
        for b in (s.batch, r.batch):
            b.pending -= 1
            if step > b.maxstep:
                b.maxstep = step
            if b.pending == 0 and b.rank != current:
                self.ready.append(self.ranks[b.rank].glet)


def tensor_record(x: Any, made: dict) -> Tensor:
    """The trace's record of an array's shape and dtype; one record per kind (`made`: the run's), since an
    all-to-all over 64 ranks has 8,192 of them and most are alike."""
    key = (x.shape, x.dtype)
    t = made.get(key)
    if t is None:
        t = made[key] = _member(Tensor, (x.shape, dtype_name(x.dtype)))
    return t


# numpy dtype kinds that hold numbers whatever the dtype: no strings, objects or dates.
NUMBER_KINDS = frozenset("biufc")
# The kinds a receive may allocate: those, and 'V' for bfloat16 (ml_dtypes gives it that kind). Raw bytes and
# records are 'V' too, but their names ("void64") name no dtype, so a receive of one is refused before this.
NUMERIC = NUMBER_KINDS | {"V"}


def check_array(x: Any, op: str) -> None:
    """What a virtual rank may send or reduce: a numpy array of numbers."""
    if type(x) is not np.ndarray and not isinstance(x, np.ndarray):
        raise CollectiveError(f"{op} expects a numpy array on virtual ranks, got {type(x).__name__}")
    if not numeric(x.dtype):
        raise CollectiveError(f"{op} expects numbers, got an array of dtype {x.dtype}")

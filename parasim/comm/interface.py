"""The collective interface: what every backend implements, and the rules they share.

A program talks to other ranks only through a `Comm`. The virtual backend (numpy, one process) and the
torch.distributed backend implement the same methods with the same semantics, so layer code is written
once. Everything here is backend-neutral: groups, point-to-point op records, argument checks, the
bytes each rank moves under the ring algorithm, and how a call site is named.
"""
from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..errors import CollectiveError, CollectiveMismatch

REDUCE_OPS = ("sum", "avg", "max", "min")
ALGOS = ("direct", "ring")

# Collective op names as they appear in the trace.
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"
ALL_TO_ALL, BROADCAST, BARRIER, P2P = "all_to_all", "broadcast", "barrier", "p2p"


@dataclass(frozen=True)
class Group:
    """An ordered set of global ranks that run collectives together. `name` is the axis (tp, dp, ...)."""

    ranks: tuple[int, ...]
    name: str
    index: int = 0  # creation order in the run; identical on every rank
    size: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.ranks))  # a plain attribute: read on every collective

    def group_rank(self, rank: int) -> int:
        """Index of global `rank` inside the group."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise CollectiveError(f"rank {rank} is not a member of group {self}") from None

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks

    def __str__(self) -> str:
        return f"{self.name}{ranks_text(self.ranks)}"


def rank_list(ranks: Sequence[int]) -> str:
    """Ranks in brackets, runs of three or more consecutive ones as a range: [0-2, 5, 7, 9-1023]."""
    parts, i, n = [], 0, len(ranks)
    while i < n:
        j = i
        while j + 1 < n and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i:j + 1])
        i = j + 1
    return "[" + ", ".join(parts) + "]"


def ranks_text(ranks: Sequence[int]) -> str:
    """A list of ranks as errors write it: in full up to 16, as ranges beyond (an error about 2,048 ranks
    stays a line, not 10 KB)."""
    return str(list(ranks)) if len(ranks) <= 16 else rank_list(ranks)


def by_text(texts: dict[int, str], indent: str = "  ") -> list[str]:
    """One line per distinct text, naming the ranks that share it (in order of their first rank):
    a fault among thousands of ranks reads as a few lines."""
    shared: dict[str, list[int]] = {}
    for r in sorted(texts):
        shared.setdefault(texts[r], []).append(r)
    return [f"{indent}rank {rs[0]}: {t}" if len(rs) == 1 else f"{indent}ranks {rank_list(rs)[1:-1]}: {t}"
            for t, rs in shared.items()]


@dataclass(frozen=True)
class Send:
    """Point-to-point: send array `x` to global rank `dst` (one entry of an `exchange`)."""

    x: Any
    dst: int


@dataclass(frozen=True)
class Recv:
    """Point-to-point: receive an array of `shape` and `dtype` from global rank `src`.

    Shape and dtype are required because a real backend must allocate the buffer before data arrives.
    """

    src: int
    shape: tuple[int, ...]
    dtype: Any


class Comm(ABC):
    """The collective interface. Functional: every call returns new arrays and leaves inputs untouched.

    `group=None` means every rank. `label` is free text shown in the trace. Ranks (`src`, `dst`) are
    global ranks. Collectives on one group are matched in call order, as NCCL and gloo match them.
    """

    rank: int
    world: int

    @abstractmethod
    def all_reduce(self, x, op: str = "sum", *, group: Group | None = None, label: str | None = None,
                   algo: str | None = None):
        """Element-wise reduction over the group; every member gets the whole result."""

    @abstractmethod
    def reduce_scatter(self, x, dim: int = 0, *, op: str = "sum", group: Group | None = None,
                       label: str | None = None, algo: str | None = None):
        """Reduce over the group, then member i keeps chunk i of `dim` (size must divide evenly)."""

    @abstractmethod
    def all_gather(self, x, dim: int = 0, *, group: Group | None = None, label: str | None = None,
                   algo: str | None = None):
        """Concatenate every member's `x` along `dim`, in group order."""

    @abstractmethod
    def all_to_all(self, chunks: Sequence[Any], dim: int = 0, *, group: Group | None = None,
                   label: str | None = None) -> list:
        """Member i sends chunks[j] to member j; returns the chunks received, in group order.

        Chunks may differ in size along `dim` (MoE dispatch); other dims and dtype must agree.
        """

    @abstractmethod
    def broadcast(self, x, src: int, *, group: Group | None = None, label: str | None = None):
        """Every member gets a copy of `src`'s `x`; the others pass a buffer of the same shape and dtype."""

    @abstractmethod
    def exchange(self, ops: Sequence[Send | Recv], *, group: Group | None = None,
                 label: str | None = None, tags: dict | None = None) -> list:
        """Post a batch of sends and receives at once (like batch_isend_irecv); returns received arrays
        in the order of the Recv entries. Rings and pipelines use it so that no pair waits on the other.
        `tags`: fields for screens to read beside the label's words (a pipeline's slot)."""

    @abstractmethod
    def barrier(self, *, group: Group | None = None, label: str | None = None) -> None:
        """Wait until every member arrived."""

    @abstractmethod
    def new_group(self, ranks: Sequence[int], name: str) -> Group:
        """Create a group. Every rank must call it for every group, in the same order (torch's rule)."""

    def send(self, x, dst: int, *, group: Group | None = None, label: str | None = None) -> None:
        """Blocking send; completes when `dst` posts the matching receive."""
        self.exchange([Send(x, dst)], group=group, label=label)

    def recv(self, src: int, shape: Sequence[int], dtype, *, group: Group | None = None,
             label: str | None = None):
        """Blocking receive of an array of `shape` and `dtype` from `src`."""
        return self.exchange([Recv(src, tuple(shape), dtype)], group=group, label=label)[0]


# ---------------------------------------------------------------------------------------------
# Shared rules: dtype names, argument checks, bytes under the ring algorithm, call sites.

@lru_cache(maxsize=64)
def dtype_name(dtype: Any) -> str:
    """'float32' for numpy and torch dtypes alike."""
    name = str(dtype)
    if name.startswith("torch."):
        return name[6:]
    try:
        return np.dtype(dtype).name  # also np.float32 (a scalar type) and "f4"
    except TypeError:
        return name


def group_members(ranks: Any, world: int, name: str, site: str) -> tuple[int, ...]:
    """The global ranks of a new group, as given: whole numbers (not strings, floats or bools, which
    would be silently coerced), distinct, inside the world."""
    try:
        given = list(ranks)
    except TypeError:
        raise CollectiveError(f"new_group {name} at {site}: ranks must be a list of integers, got {ranks!r:.60}") \
            from None
    bad = [r for r in given if isinstance(r, bool) or not isinstance(r, (int, np.integer))]
    if bad:
        raise CollectiveError(f"new_group {name} at {site}: ranks must be integers, got {bad[0]!r:.60}")
    members = tuple(int(r) for r in given)
    if not members or len(set(members)) != len(members) or not all(0 <= r < world for r in members):
        raise CollectiveError(f"new_group {name}{list(members)} at {site}: ranks must be distinct and in "
                              f"0..{world - 1}")
    return members


def check_reduce_op(op: str, dtype: Any) -> None:
    if op not in REDUCE_OPS:
        raise CollectiveError(f"unknown reduce op {op!r}; use one of {', '.join(REDUCE_OPS)}")
    if op == "avg" and not dtype_name(dtype).startswith(("float", "complex", "bfloat")):
        raise CollectiveError(f"op='avg' needs a floating dtype, got {dtype_name(dtype)}")


def check_algo(algo: str) -> None:
    if algo not in ALGOS:
        raise CollectiveError(f"unknown algo {algo!r}; use one of {', '.join(ALGOS)}")


def norm_dim(dim: int, ndim: int, op: str) -> int:
    if not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise CollectiveError(f"{op}: dim {dim!r} is out of range for an array with {ndim} dims")
    return int(dim) % ndim  # a plain int: it goes into the trace's JSON


def check_divisible(shape: tuple[int, ...], dim: int, t: int, op: str) -> None:
    if shape[dim] % t:
        raise CollectiveError(f"{op}: size {shape[dim]} of dim {dim} does not divide by the group size {t}")


def check_peer(peer: Any, rank: int, group: Group, what: str) -> int:
    """A point-to-point peer: a global rank in `group`, not the caller itself."""
    if not isinstance(peer, (int, np.integer)) or int(peer) not in group.ranks:
        raise CollectiveError(f"{what} rank {peer!r}: not a member of group {group}")
    if int(peer) == rank:
        raise CollectiveError(f"{what} rank {peer}: a rank cannot send to or receive from itself")
    return int(peer)


def recv_dtype(o: Recv, peer: int) -> str:
    """The dtype name a receive allocates. Missing is an error, not float64: numpy and torch would each
    fill in a default of their own, and a real backend cannot learn it from data that has not arrived."""
    if o.dtype is None:
        raise CollectiveError(f"recv from rank {peer}: no dtype given (the buffer is allocated before data arrives)")
    return dtype_name(o.dtype)


def chunk_sizes(n: int, t: int) -> list[int]:
    """How the ring splits n elements into t chunks (the first n % t chunks one larger)."""
    base, extra = divmod(n, t)
    return [base + (i < extra) for i in range(t)]


@lru_cache(maxsize=1024)
def ring_bytes(op: str, nbytes: int, t: int, itemsize: int = 1) -> tuple[tuple[int, int], ...]:
    """(sent, received) bytes of each member, in group order, under the ring algorithm.

    `nbytes` is the full buffer: the input of all_reduce and reduce_scatter, the output of all_gather.
    A ring reduce-scatter or all-gather moves every chunk but one, (t-1)/t of the buffer; all-reduce is
    both, 2(t-1)/t. With uneven chunks, member i never sends the chunk it ends up owning.
    """
    if t == 1:
        return ((0, 0),)
    sizes = [n * itemsize for n in chunk_sizes(nbytes // itemsize, t)]
    total = sum(sizes)
    # reduce-scatter: member i sends chunks i-1, ..., i-(t-1) and receives chunks i-2, ..., i-t (= i).
    rs = [(total - sizes[i], total - sizes[i - 1]) for i in range(t)]
    # all-gather: member i sends chunks i, ..., i-(t-2) and receives every chunk but its own.
    ag = [(total - sizes[(i + 1) % t], total - sizes[i]) for i in range(t)]
    if op == REDUCE_SCATTER:
        return tuple(rs)
    if op == ALL_GATHER:
        return tuple(ag)
    if op == ALL_REDUCE:
        return tuple((a[0] + b[0], a[1] + b[1]) for a, b in zip(rs, ag))
    raise ValueError(op)


def broadcast_bytes(nbytes: int, t: int, group_rank: int, src_group_rank: int) -> tuple[int, int]:
    """A chain from src around the ring: every member but the last forwards the buffer once."""
    pos = (group_rank - src_group_rank) % t
    return (nbytes if pos < t - 1 else 0), (nbytes if pos > 0 else 0)


def describe(call: str, x: Any = None, /, **params: Any) -> str:
    """How a call is named in errors, the same on every backend: all_reduce(shape=(2,), dtype=float64, op=sum,
    algo=direct). It names every parameter the members of a group must agree on; torchdist compares these
    texts across ranks, so a parameter left out here would go unchecked on real ranks."""
    if call == BARRIER:
        return "barrier()"
    if call == ALL_TO_ALL:
        head = f"chunks={[tuple(c.shape) for c in x]}, dtype={dtype_name(x[0].dtype)}"
    else:
        head = f"shape={tuple(x.shape)}, dtype={dtype_name(x.dtype)}"
    return f"{call}({', '.join([head] + [f'{k}={v}' for k, v in params.items()])})"


def describe_p2p(send: bool, peer: int, shape: Sequence[int], dtype: Any) -> str:
    what, prep = ("send", "to") if send else ("recv", "from")
    return f"{what}(shape={tuple(shape)}, dtype={dtype_name(dtype)}) {prep} rank {peer}"


def mismatch_error(call: int, group: Group, calls: dict[int, str | None]) -> CollectiveMismatch:
    """The error for members of `group` whose call #`call` on it differ. calls: rank -> 'desc at site'."""
    lines = by_text({r: calls.get(r) or "not arrived yet" for r in group.ranks})
    arrived = [r for r in group.ranks if calls.get(r)]
    return CollectiveMismatch(
        f"collective call #{call} on group {group} does not match across ranks:\n" + "\n".join(lines),
        [calls[r] for r in arrived], arrived)


def p2p_mismatch_error(src: int, send_call: str, dst: int, recv_call: str) -> CollectiveMismatch:
    return CollectiveMismatch(f"point-to-point transfer does not match:\n  rank {src}: {send_call}\n"
                              f"  rank {dst}: {recv_call}", [send_call, recv_call], [src, dst])


_COMM_DIR = os.path.dirname(os.path.abspath(__file__))
_PKG_DIR = os.path.dirname(_COMM_DIR)
_PKG_ROOT = os.path.dirname(_PKG_DIR)
# Frames in these files are wrappers around the interface; a call site names the line that called them.
# So are a mutation tester's trampolines (mutmut puts one between every caller and every function).
_WRAPPERS = (_COMM_DIR, os.path.join(_PKG_DIR, "engine", "context.py"))
_TRAMPOLINE = os.path.join("mutmut", "mutation", "trampoline.py")


@lru_cache(maxsize=512)
def short_path(filename: str) -> str:
    """A stable, readable name for a source file: relative to the checkout (or site-packages), else cwd."""
    path = os.path.abspath(filename)
    for base in (_PKG_ROOT, os.getcwd()):
        if path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return path


def call_site(depth: int = 2) -> tuple[str, int]:
    """(file, line) of the first caller outside parasim.comm and the context (a layer's line, not ours).

    Kept raw on the hot path; `site_name` turns it into 'file:line' when an event is recorded."""
    frame = sys._getframe(depth)
    while (frame.f_code.co_filename.startswith(_WRAPPERS) or frame.f_code.co_filename.endswith(_TRAMPOLINE)) \
            and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


@lru_cache(maxsize=4096)
def site_name(site: tuple[str, int]) -> str:
    return f"{short_path(site[0])}:{site[1]}"

"""The collective interface: the public calls, checked once here for every backend, and the rules they share.

A program talks to other ranks only through a `Comm`. Each call checks its arguments, then hands itself to
the backend (virtual: numpy in one process; torchdist: torch.distributed), which finds what the op does in
the op table (ops.py). Also here: groups, point-to-point entries, the bytes each rank moves under the ring.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from ..errors import CollectiveError, UsageError
from .ring import RINGS, RingStep, ring_steps
from .sites import SiteMemo, call_site, short_path, site_name  # noqa: F401 (the names every backend imports from here)
from .texts import by_text, mismatch_error, p2p_mismatch_error, rank_list, ranks_text  # noqa: F401 (likewise)

# An array as a program holds it: a numpy array on virtual ranks, a torch tensor on real ranks, a SymbolicArray
# (shapes only) on symbolic ranks. Layers are written once for the three (through `ctx.xp`), so the name says
# the role a value plays, not its class.
Array = Any

REDUCE_OPS = ("sum", "avg", "max", "min")
ALGOS = ("direct", "ring")

# Collective op names as they appear in the trace.
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"
ALL_TO_ALL, BROADCAST, BARRIER, P2P = "all_to_all", "broadcast", "barrier", "p2p"
REDUCE, SCATTER = "reduce", "scatter"
# the ops with a public method of their own below (its checks, its signature): `Comm.call` hands them to it
METHODS = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST, REDUCE, SCATTER, BARRIER)


@dataclass(frozen=True)
class Group:
    """An ordered set of global ranks that run collectives together. `name` is the axis (tp, dp, ...)."""

    ranks: tuple[int, ...]
    name: str
    index: int = 0  # creation order in the run; identical on every rank
    size: int = field(init=False, compare=False, repr=False)
    # the ring worked out on this group, once in its run: steps by kind, (sent, received) by (op, nbytes, itemsize)
    _ring: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.ranks))  # a plain attribute: read on every collective

    def ring_steps(self, kind: str) -> tuple[RingStep, ...]:
        """`ring.ring_steps` of this group's size, worked out once: every ring call on the group plays them."""
        steps = self._ring.get(kind)
        if steps is None:
            steps = self._ring[kind] = ring_steps(self.size, kind)
        return steps

    def ring_bytes(self, op: str, nbytes: int, itemsize: int) -> tuple[tuple[int, int], ...]:
        """`ring_bytes` of a buffer on this group, worked out once: every collective with a ring formula asks
        for it, once per member (the count walks all 2(t-1) steps of the ring)."""
        key = (op, nbytes, itemsize)
        moved = self._ring.get(key)
        if moved is None:
            moved = self._ring[key] = ring_bytes(op, nbytes, self.size, itemsize)
        return moved

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


@dataclass(frozen=True)
class Send:
    """Point-to-point: send array `x` to global rank `dst` (one entry of an `exchange`); `label`, where given,
    names this transfer in the trace instead of the exchange's label (a ring passing K and V apart)."""

    x: Any
    dst: int
    label: str | None = None


@dataclass(frozen=True)
class Recv:
    """Point-to-point: receive an array of `shape` and `dtype` from global rank `src`.

    Shape and dtype are required because a real backend must allocate the buffer before data arrives.
    `label`: as Send's (the receiving side's name for the same transfer).
    """

    src: int
    shape: tuple[int, ...]
    dtype: Any
    label: str | None = None


class Comm(ABC):
    """The collective interface. Functional: every call returns new arrays and leaves inputs untouched.

    `group=None` means every rank. `label` is free text shown in the trace. Ranks (`src`, `dst`) are
    global ranks. Collectives on one group are matched in call order, as NCCL and gloo match them.

    Each public call checks its arguments here, once for every backend, and hands the call to the backend's
    `_collective` with the op's name (its entry in ops.OPS), its params as the trace records them, and a
    signature the members must agree on. A backend implements only the hooks at the end of the class.
    """

    rank: int
    world: int
    algo: str  # the run's default algorithm ("direct" or "ring")
    _sites: SiteMemo | None = None  # the run's memo of call sites (sites.call_site), where the backend keeps one

    def all_reduce(
        self, x, op: str = "sum", *, group: Group | None = None, label: str | None = None, algo: str | None = None
    ):
        """Element-wise reduction over the group; every member gets the whole result."""
        site = call_site(2, self._sites)  # the hot path of the per-call benchmark: the common case checks little
        g = self._checked(x, group, ALL_REDUCE)
        if op != "sum":
            check_reduce_op(op, x.dtype)
        algo = self.algo if algo is None else _algo(algo)
        return self._collective(ALL_REDUCE, x, {"op": op, "algo": algo}, g, label, site)

    def reduce_scatter(
        self,
        x,
        dim: int = 0,
        *,
        op: str = "sum",
        group: Group | None = None,
        label: str | None = None,
        algo: str | None = None,
    ):
        """Reduce over the group, then member i keeps chunk i of `dim` (size must divide evenly)."""
        site = call_site(2, self._sites)
        g = self._checked(x, group, REDUCE_SCATTER)
        check_reduce_op(op, x.dtype)
        dim = norm_dim(dim, x.ndim, REDUCE_SCATTER)
        check_divisible(tuple(x.shape), dim, g.size, REDUCE_SCATTER)
        algo = self.algo if algo is None else _algo(algo)
        return self._collective(
            REDUCE_SCATTER,
            x,
            {"op": op, "dim": dim, "algo": algo},
            g,
            label,
            site,
        )

    def all_gather(
        self, x, dim: int = 0, *, group: Group | None = None, label: str | None = None, algo: str | None = None
    ):
        """Concatenate every member's `x` along `dim`, in group order."""
        site = call_site(2, self._sites)
        g = self._checked(x, group, ALL_GATHER)
        dim = norm_dim(dim, x.ndim, ALL_GATHER)
        algo = self.algo if algo is None else _algo(algo)
        return self._collective(
            ALL_GATHER,
            x,
            {"dim": dim, "algo": algo},
            g,
            label,
            site,
        )

    def all_to_all(
        self, chunks: Sequence[Any], dim: int = 0, *, group: Group | None = None, label: str | None = None
    ) -> list:
        """Member i sends chunks[j] to member j; returns the chunks received, in group order.

        Chunks may differ in size along `dim` (MoE dispatch); other dims and dtype must agree.
        """
        site = call_site(2, self._sites)
        g = self._group(group, ALL_TO_ALL)
        chunks = list(chunks)
        if len(chunks) != g.size:
            raise CollectiveError(f"all_to_all: {len(chunks)} chunks for a group of {g.size} ({g})")
        distinct = list({id(c): c for c in chunks}.values())  # a chunk sent to many members is checked once
        for c in distinct:
            self._check_array(c, ALL_TO_ALL)
        first = chunks[0]
        dim = norm_dim(dim, first.ndim, ALL_TO_ALL)
        rest = tuple(first.shape[:dim]) + tuple(first.shape[dim + 1 :])
        for c in distinct:
            if (
                c.ndim != first.ndim
                or tuple(c.shape[:dim]) + tuple(c.shape[dim + 1 :]) != rest
                or c.dtype != first.dtype
            ):
                raise CollectiveError(
                    f"all_to_all: chunks must agree in dtype and in every dim but {dim}; got "
                    f"{[(tuple(c.shape), dtype_name(c.dtype)) for c in chunks]}"
                )
        # sizes along dim may differ between members: the signature leaves them out
        sig = (ALL_TO_ALL, first.ndim, dim, rest, dtype_name(first.dtype))
        return self._collective(ALL_TO_ALL, chunks, {"dim": dim}, g, label, site, sig)

    def broadcast(self, x, src: int, *, group: Group | None = None, label: str | None = None):
        """Every member gets a copy of `src`'s `x`; the others pass a buffer of the same shape and dtype."""
        site = call_site(2, self._sites)
        g = self._checked(x, group, BROADCAST)
        src = check_root(src, g, BROADCAST, "src")
        return self._collective(BROADCAST, x, {"src": src}, g, label, site)

    def reduce(self, x, dst: int, op: str = "sum", *, group: Group | None = None, label: str | None = None):
        """Element-wise reduction over the group into member `dst`, which gets the result; the other members
        get None (torch leaves their buffer undefined: a rank must not use a value it does not have)."""
        site = call_site(2, self._sites)
        g = self._checked(x, group, REDUCE)
        check_reduce_op(op, x.dtype)
        dst = check_root(dst, g, REDUCE, "dst")
        return self._collective(REDUCE, x, {"op": op, "dst": dst}, g, label, site)

    def scatter(self, x, src: int, dim: int = 0, *, group: Group | None = None, label: str | None = None):
        """Member `src` splits its `x` into equal chunks along `dim`, one per member; member i gets chunk i.
        The others pass an array of the same shape and dtype, whose values are not read (as for broadcast)."""
        site = call_site(2, self._sites)
        g = self._checked(x, group, SCATTER)
        src = check_root(src, g, SCATTER, "src")
        dim = norm_dim(dim, x.ndim, SCATTER)
        check_divisible(tuple(x.shape), dim, g.size, SCATTER)
        return self._collective(SCATTER, x, {"dim": dim, "src": src}, g, label, site)

    def barrier(self, *, group: Group | None = None, label: str | None = None) -> None:
        """Wait until every member arrived."""
        site = call_site(2, self._sites)
        g = self._group(group, BARRIER)
        self._collective(BARRIER, None, {}, g, label, site, (BARRIER,))

    def call(self, op: str, x: Any = None, /, *, group: Group | None = None, label: str | None = None, **params):
        """Run collective `op` of the op table (comm/ops.OPS) by its name, its params as the trace records them:
        how a collective without a public method of its own is called (`x` an array, a list of chunks, or None
        as its entry `takes`), and how a record of one is made again. The methods above check their own
        arguments (`call` hands those ops to them); any other entry's kernel meets what is given, and the members
        must agree on all of it. A name the op table lacks is refused by the backend, which reads the table."""
        if op in METHODS:
            args = () if x is None else (x,)
            return getattr(self, op)(*args, group=group, label=label, **params)
        site = call_site(2, self._sites)
        if not isinstance(op, str):
            raise CollectiveError(f"call: the op is a name of the op table, not {op!r:.60}")
        g = self._group(group, op)
        for a in x if isinstance(x, (list, tuple)) else [] if x is None else [x]:
            self._check_array(a, op)
        sig = None if not isinstance(x, (list, tuple)) else (op, len(x), *params.values())
        return self._collective(op, x, dict(params), g, label, site, sig)

    def send(self, x, dst: int, *, group: Group | None = None, label: str | None = None) -> None:
        """Blocking send; completes when `dst` posts the matching receive."""
        self.exchange([Send(x, dst)], group=group, label=label)

    def recv(self, src: int, shape: Sequence[int], dtype, *, group: Group | None = None, label: str | None = None):
        """Blocking receive of an array of `shape` and `dtype` from `src`."""
        return self.exchange([Recv(src, tuple(shape), dtype)], group=group, label=label)[0]

    # -- what a backend implements ------------------------------------------------------------------
    @abstractmethod
    def _check_array(self, x: Any, op: str) -> None:
        """Raise CollectiveError unless `x` is an array this backend can send (numpy on virtual ranks)."""

    @abstractmethod
    def _group(self, group: Group | None, op: str) -> Group:
        """The group a call runs on (None: the world), checked: created in this run, the caller a member."""

    def _checked(self, x: Any, group: Group | None, op: str) -> Group:
        """`x` checked (`_check_array`), then the group the call runs on (`_group`): the two hooks of a call that
        sends one array, in one, which a backend may answer faster for its usual case."""
        self._check_array(x, op)
        return self._group(group, op)

    @abstractmethod
    def _collective(
        self,
        op: str,
        x: Any,
        params: dict,
        group: Group,
        label: str | None,
        site: tuple[str, int],
        sig: tuple | None = None,
    ) -> Any:
        """Run a checked call of op `op` (ops.OPS[op]). `sig` (None: `signature(op, x, params)`) is what every
        member's call must agree on; `describe(op, x, **params)` names the call in errors."""

    @abstractmethod
    def exchange(
        self,
        ops: Sequence[Send | Recv],
        *,
        group: Group | None = None,
        label: str | None = None,
        tags: dict | None = None,
    ) -> list:
        """Post a batch of sends and receives at once (like batch_isend_irecv); returns received arrays
        in the order of the Recv entries. Rings and pipelines use it so that no pair waits on the other.
        `tags`: fields for screens to read beside the label's words (a pipeline's slot)."""

    @abstractmethod
    def new_group(self, ranks: Sequence[int], name: str) -> Group:
        """Create a group. Every rank must call it for every group, in the same order (torch's rule)."""

    def new_groups(self, groups: Sequence[tuple[Sequence[int], str]]) -> list[Group]:
        """Create many groups, in order, as new_group would one by one (a layout's: tens of thousands at real
        size; a backend may make them in one go)."""
        return [self.new_group(ranks, name) for ranks, name in groups]


def signature(op: str, x: Any, params: dict) -> tuple:
    """What the members of a call must agree on: the op, the input's shape and dtype, every param."""
    return (op,) if x is None else (op, tuple(x.shape), x.dtype, *params.values())


def _algo(algo: str) -> str:
    check_algo(algo)
    return algo


# ---------------------------------------------------------------------------------------------
# Shared rules: dtype names, argument checks, bytes under the ring algorithm, call sites.

# numpy has no bfloat16 of its own; ml_dtypes gives it one (np.dtype("bfloat16") works once it is imported,
# and its arithmetic rounds to bfloat16 after every operation, as a GPU's does). Its kind is 'V', the kind of
# raw and structured records too, so "is this a number" asks for it by name.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
HALF_FLOATS = ("float16", "bfloat16")  # 16-bit floats: every addition rounds to 11 or 8 significant bits
# ml_dtypes' 8-bit floats, which a run at real size sends where a framework sends FP8 (DeepSeek-V3's dispatch)
FLOAT8 = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))


def dtype_name(dtype: Any) -> str:
    """'float32' (or 'bfloat16') for numpy and torch dtypes alike."""
    name = str(dtype)
    if name.startswith("torch."):
        return name[6:]
    try:
        return np.dtype(dtype).name  # also np.float32 (a scalar type), "f4" and ml_dtypes.bfloat16
    except TypeError:
        return name


def numeric(dtype: Any) -> bool:
    """Whether a numpy dtype holds numbers a real backend can carry: bool, integers, floats (bfloat16
    included), complex; not strings, objects, dates, raw bytes or records."""
    d = np.dtype(dtype)
    return d.kind in "biufc" or d == BFLOAT16 or d in FLOAT8


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of a dtype name or object ("bfloat16", "float32", np.float16, torch.bfloat16, ...), one
    that holds numbers; anything else is refused in one line."""
    try:
        d = np.dtype(dtype_name(dtype) if str(dtype).startswith("torch.") else dtype)
    except (TypeError, ValueError):
        raise UsageError(
            f"unknown dtype {dtype!r}; use a name such as bfloat16, float16, float32, float64 or int64"
        ) from None
    if not numeric(d):
        raise UsageError(
            f"dtype {dtype!r} holds no numbers; use bfloat16, float16, float32, float64, an integer type or bool"
        )
    return d


def floating(dtype: Any) -> bool:
    """Whether a numpy or torch dtype is a real floating type (float16, bfloat16, float32, float64)."""
    return dtype_name(dtype).startswith(("float", "bfloat"))


def group_members(ranks: Any, world: int, name: str, site: str) -> tuple[int, ...]:
    """The global ranks of a new group, as given: whole numbers (not strings, floats or bools, which
    would be silently coerced), distinct, inside the world."""
    try:
        given = list(ranks)
    except TypeError:
        raise CollectiveError(
            f"new_group {name} at {site}: ranks must be a list of integers, got {ranks!r:.60}"
        ) from None
    bad = [r for r in given if isinstance(r, bool) or not isinstance(r, (int, np.integer))]
    if bad:
        raise CollectiveError(f"new_group {name} at {site}: ranks must be integers, got {bad[0]!r:.60}")
    members = tuple(int(r) for r in given)
    if not members or len(set(members)) != len(members) or not all(0 <= r < world for r in members):
        raise CollectiveError(
            f"new_group {name}{list(members)} at {site}: ranks must be distinct and in 0..{world - 1}"
        )
    return members


def check_reduce_op(op: str, dtype: Any) -> None:
    if op not in REDUCE_OPS:
        raise CollectiveError(f"unknown reduce op {op!r}; use one of {', '.join(REDUCE_OPS)}")
    if op == "avg" and not (floating(dtype) or dtype_name(dtype).startswith("complex")):
        raise CollectiveError(f"op='avg' needs a floating dtype, got {dtype_name(dtype)}")


def check_algo(algo: str) -> None:
    if algo not in ALGOS:
        raise CollectiveError(f"unknown algo {algo!r}; use one of {', '.join(ALGOS)}")


def norm_dim(dim: int, ndim: int, op: str) -> int:
    if not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise CollectiveError(f"{op}: dim {dim!r} is out of range for an array with {ndim} dims")
    return int(dim) % ndim  # a plain int: it goes into the trace's JSON


def check_root(root: Any, group: Group, op: str, what: str) -> int:
    """The root of a broadcast, reduce or scatter: a global rank in the group."""
    if root not in group.ranks:
        raise CollectiveError(f"{op}: {what} rank {root} is not a member of group {group}")
    return int(root)  # a plain int: it goes into the trace's JSON


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


def ring_bytes(op: str, nbytes: int, t: int, itemsize: int = 1) -> tuple[tuple[int, int], ...]:
    """(sent, received) bytes of each member, in group order, under the ring algorithm: the sizes of the
    chunks each member sends and receives over the ring's steps (ring.ring_steps).

    `nbytes` is the full buffer: the input of all_reduce and reduce_scatter, the output of all_gather.
    A ring reduce-scatter or all-gather moves every chunk but one, (t-1)/t of the buffer; all-reduce is
    both, 2(t-1)/t. With uneven chunks, member i never sends the chunk it ends up owning.
    """
    if op not in RINGS:
        raise ValueError(op)
    sizes = [n * itemsize for n in chunk_sizes(nbytes // itemsize, t)]
    steps = ring_steps(t, op)
    if sizes[0] == sizes[-1]:  # equal chunks (the usual case at scale): each step moves one chunk per member
        return ((len(steps) * sizes[0],) * 2,) * t
    sent, received = [0] * t, [0] * t
    for step in steps:
        sent = [b + sizes[c] for b, c in zip(sent, step.send)]
        received = [b + sizes[c] for b, c in zip(received, step.recv)]
    return tuple(zip(sent, received))


def broadcast_bytes(nbytes: int, t: int, group_rank: int, src_group_rank: int) -> tuple[int, int]:
    """A chain from src around the ring: every member but the last forwards the buffer once."""
    pos = (group_rank - src_group_rank) % t
    return (nbytes if pos < t - 1 else 0), (nbytes if pos > 0 else 0)


def describe(call: str, x: Any = None, /, **params: Any) -> str:
    """How a call is named in errors, the same on every backend: all_reduce(shape=(2,), dtype=float64, op=sum,
    algo=direct). It names every parameter the members of a group must agree on (`signature`)."""
    if x is None:  # a barrier
        head = []
    elif isinstance(x, (list, tuple)):  # an all-to-all's chunks
        head = [f"chunks={[tuple(c.shape) for c in x]}"] + [f"dtype={dtype_name(x[0].dtype)}"] * bool(x)
    else:
        head = [f"shape={tuple(x.shape)}, dtype={dtype_name(x.dtype)}"]
    return f"{call}({', '.join(head + [f'{k}={v}' for k, v in params.items()])})"


def describe_p2p(send: bool, peer: int, shape: Sequence[int], dtype: Any) -> str:
    what, prep = ("send", "to") if send else ("recv", "from")
    return f"{what}(shape={tuple(shape)}, dtype={dtype_name(dtype)}) {prep} rank {peer}"

"""The parallel context of a rank (its groups and its place in each), the layer protocol, the conjugate
operators f and g (and their sequence-parallel forms), and the record of what forward keeps for backward."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, runtime_checkable

from ..comm.interface import Group
from ..layout import LayoutError
from .placement import Partial, Replicate, Shard, local

__all__ = ["Partial", "Replicate", "Shard", "ParallelContext", "Saved", "Layer", "Weights"]  # placements: placement.py


@dataclass
class ParallelContext:
    """What a layer needs to know about its rank: the comm, the array namespace, and its groups (TP, CP,
    EP) with its place in each. Built by hand for a lesson's few ranks, or from a Layout (`from_layout`)."""

    ctx: Any
    group: Group | None = None  # None: no tensor parallelism (one rank holds everything)
    sp: bool = False  # sequence parallelism on top of TP
    cp: Group | None = None  # context parallelism: the sequence is split over this group for the whole layer
    seq: int = 0  # the whole sequence length (needed with cp)
    split: str = "zigzag"  # how cp splits the sequence: "contiguous" or "zigzag"
    ep: Group | None = None  # expert parallelism: the MoE block's experts are split over this group
    etp: Group | None = None  # expert tensor parallelism: each expert's matrices are split over this group
    # where gradients partial over a model axis (SP-split norms and router, b2 over ETP) are summed: in each
    # layer's backward ("layer", every micro-batch), or once per step by data-parallel code ("step", as
    # Megatron does before its data-parallel reduction)
    partial_sums: str = "layer"
    # MoE routing by a stated policy (nn.routing.Routing) instead of the router's scores: symbolic ranks,
    # which have no scores, need one; virtual ranks given the same policy route the same way
    routing: Any = None
    # zero-bubble pipelines split a backward in two: inside `deferring()` weight-gradient work is queued
    # here (as closures) instead of run, and a later W pass runs it
    deferred: list | None = None
    _positions: tuple | None = field(default=None, repr=False, compare=False)  # cp_positions, worked out once

    @classmethod
    def from_layout(cls, ctx: Any, layout: Any = None, **overrides: Any) -> "ParallelContext":
        """The context of `ctx`'s rank in `layout` (default: the layout the run was given): its TP, CP and
        EP groups, SP and the CP split from the layout, the sequence length from its model."""
        layout = layout if layout is not None else ctx.layout
        if ctx.layout is not layout:
            ctx.use_layout(layout)
        g = ctx.groups
        seq = layout.model.seq if layout.model is not None and layout.model.seq else 0
        made = dict(group=g["tp"], sp=layout.sp, cp=g["cp"], seq=seq,
                    split="zigzag" if layout.zigzag else "contiguous", ep=g["ep"], etp=g["expert-tp"])
        return cls(ctx, **{**made, **overrides})

    @contextmanager
    def deferring(self) -> Iterator[list]:
        """Within this block weight-gradient work is queued (zero-bubble's W pass runs it later) and the
        list it is queued on is yielded; outside it, the work runs at once."""
        self.deferred = work = []
        try:
            yield work
        finally:
            self.deferred = None

    def weight_grad(self, work: Any) -> None:
        """Run `work` (a weight-gradient computation) now, or queue it for the W pass."""
        if self.deferred is None:
            work()
        else:
            self.deferred.append(work)

    @property
    def cp_size(self) -> int:
        return 1 if self.cp is None else self.cp.size

    def cp_positions(self) -> list[int]:
        """The sequence positions this rank's CP slice holds (all of them without CP); worked out once per
        sequence length and split (every layer asks, and a long sequence has hundreds of thousands)."""
        key = (self.seq, self.split, self.cp_size)
        if self._positions is None or self._positions[0] != key:
            cp_rank = 0 if self.cp is None else self.cp.group_rank(self.ctx.rank)
            self._positions = (key, cp_slice(self.seq, self.split, self.cp_size, cp_rank))
        return list(self._positions[1])

    def token_positions(self) -> list[int]:
        """The positions this rank holds between matmuls: its CP slice, then its SP share of that."""
        return sp_share(self.cp_positions(), self.sp, self.t, self.r)

    @property
    def xp(self) -> Any:
        return self.ctx.xp

    @property
    def comm(self) -> Any:
        return self.ctx.comm

    @property
    def t(self) -> int:
        return 1 if self.group is None else self.group.size

    @property
    def r(self) -> int:
        return 0 if self.group is None else self.group.group_rank(self.ctx.rank)

    def shard(self, full: Any, dim: int) -> Any:
        """This rank's slice of a whole tensor along `dim` over TP (a copy, so it owns its memory)."""
        return local(full, Shard(dim), self.t, self.r, self.xp)

    # The conjugate operators of Megatron-LM. f: identity forward, all-reduce backward (the input was
    # copied to every rank, and the backward of a copy is a sum). g: the reverse.
    def f_forward(self, x: Any) -> Any:
        return x

    def f_backward(self, dx: Any) -> Any:
        return dx if self.t == 1 else self.comm.all_reduce(dx, group=self.group, label="f backward")

    def g_forward(self, y: Any) -> Any:
        return y if self.t == 1 else self.comm.all_reduce(y, group=self.group, label="g forward")

    def g_backward(self, dy: Any) -> Any:
        return dy

    # Sequence parallelism splits the all-reduce into its halves: all-gather the sequence before a
    # column-parallel block, reduce-scatter it after a row-parallel one (and the reverse in backward).
    def gather_seq(self, x: Any, label: str) -> Any:
        return x if self.t == 1 else self.comm.all_gather(x, dim=0, group=self.group, label=label)

    def scatter_seq(self, y: Any, label: str) -> Any:
        return y if self.t == 1 else self.comm.reduce_scatter(y, dim=0, group=self.group, label=label)


def cp_slice(seq: int, split: str, cp: int, cp_rank: int) -> list[int]:
    """The sequence positions CP rank `cp_rank` of `cp` holds (all of them without CP)."""
    if cp == 1:
        return list(range(seq))
    from .ring_attention import positions
    return positions(split, seq, cp, cp_rank)


def sp_share(positions: list[int], sp: bool, t: int, r: int) -> list[int]:
    """TP rank r's share of `positions` under SP (all of them without SP): the positions it holds between
    matmuls."""
    if not sp:
        return positions
    n, left = divmod(len(positions), t)
    if left:  # an uneven share would drop tokens (or leave a rank none) and fail far from here
        k = len(positions)
        raise LayoutError(f"sequence parallelism over tp {t} cannot split the {k} token{'' if k == 1 else 's'} of "
                          "this rank's sequence slice evenly: the sequence length must divide by cp x tp")
    return positions[r * n:(r + 1) * n]


@runtime_checkable
class Layer(Protocol):
    """What every layer, the MoE block and a pipeline stage offer: forward and backward side by side, and
    their weights under one set of names: `params` (this rank's pieces), `grads`, `load` (after an optimizer
    step) and `placements` (how each lies over the mesh axes; see placement.py)."""

    placements: Any

    def forward(self, x: Any, saved: Any) -> tuple[Any, Any]: ...

    def backward(self, cache: Any, dy: Any) -> Any: ...

    def params(self) -> dict[str, Any]: ...

    @property
    def grads(self) -> dict[str, Any]: ...

    def load(self, new: dict[str, Any]) -> None: ...


class Weights:
    """`params` and `load` for a layer whose weights are the names of its `placements`: 'a.b' is weight b
    of sub-layer a (a layer overrides `_locate` where its names say otherwise)."""

    placements: Any

    def _locate(self, name: str) -> tuple[Any, str]:
        *path, key = name.split(".")
        holder: Any = self
        for part in path:
            holder = getattr(holder, part)
        return holder, key

    def params(self) -> dict[str, Any]:
        out = {}
        for name in self.placements:
            holder, key = self._locate(name)
            out[name] = holder[key] if isinstance(holder, dict) else getattr(holder, key)
        return out

    def load(self, new: dict[str, Any]) -> None:
        for name, value in new.items():
            if name in self.placements:
                holder, key = self._locate(name)
                if isinstance(holder, dict):
                    holder[key] = value
                else:
                    setattr(holder, key, value)


@dataclass
class Saved:
    """What forward keeps for backward, counted in the units of Korthikanti et al. (2022): 2 bytes per
    activation element (16-bit training) and 1 byte per dropout-mask element, whatever dtype runs here."""

    items: list[tuple[str, str, int, int]] = field(default_factory=list)  # (layer, name, elements, bytes each)
    # the data this forward runs on (a sequence's name, a micro-batch): when given, layers mark what they
    # hand on (`ctx.mark`, for `parasim check`) under names that say which data and which layer
    tag: str | None = None

    def keep(self, layer: str, name: str, x: Any, unit: int = 2) -> Any:
        self.items.append((layer, name, int(_numel(x)), unit))
        return x

    def bytes(self, layer: str | None = None) -> int:
        return sum(n * u for lay, _, n, u in self.items if layer is None or lay == layer)

    def by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lay, name, n, u in self.items:
            out[f"{lay}.{name}"] = out.get(f"{lay}.{name}", 0) + n * u
        return out


def _numel(x: Any) -> int:
    n = 1
    for d in x.shape:
        n *= int(d)
    return n


class Wrapper:
    """A layer around another (`self.layer`) that changes how it runs but not what it holds: the weights'
    names, placements and gradients pass through (a wrapper overrides what it does differently)."""

    layer: Any

    @property
    def placements(self) -> Any:
        return self.layer.placements

    @property
    def grads(self) -> dict[str, Any]:
        return self.layer.grads

    def params(self) -> dict[str, Any]:
        return self.layer.params()

    def load(self, new: dict[str, Any]) -> None:
        self.layer.load(new)

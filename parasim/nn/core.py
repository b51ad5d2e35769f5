"""The parallel context of a rank (its groups and its place in each), the layer protocol, the conjugate
operators f and g (and their sequence-parallel forms), and the record of what forward keeps for backward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from ..comm.interface import Array, Group
from ..layout import LayoutError
from ..layout.placement import Partial, Replicate, Shard, local
from .ring_attention import SequenceSplit
from ..engine.context import Context

__all__ = [
    "Partial",
    "Replicate",
    "Shard",
    "ParallelContext",
    "LayerOptions",
    "Saved",
    "Layer",
    "Weights",
]  # placements: placement.py


class WeightGradSink(Protocol):
    """Where a layer's weight-gradient work goes when a schedule defers it (pipeline's WeightGradQueue)."""

    def run_or_queue(self, work: Callable[[], None]) -> None: ...


@dataclass(frozen=True)
class LayerOptions:
    """What a run chooses about how its layers run, the same for every rank and layer (not a degree or a
    group: those are the context's own fields)."""

    # where gradients partial over a model axis (SP-split norms and router, b2 over ETP) are summed: in each
    # layer's backward ("layer", every micro-batch), or once per step by data-parallel code ("step", as
    # Megatron does before its data-parallel reduction)
    partial_sums: str = "layer"
    # MoE routing by a stated policy (nn.routing.Routing) instead of the router's scores: arrays without
    # values, which have no scores, need one; arrays with values given the same policy route the same way
    routing: Any = None


@dataclass
class ParallelContext:
    """What a layer needs to know about its rank: the comm, the array namespace, and its groups (TP, CP,
    EP, ETP; torchtitan's and picotron's `tp_group`, `tp_world_size`, `tp_rank`) with its place in each.
    What a run chooses (routing, where partial sums are summed) is in `options`; a schedule's state (the
    W queue) stays with the schedule. Built by hand for a lesson's few ranks, or from a Layout. A layer keeps
    it as `par` (the whole parallel context, of which TP is one group)."""

    ctx: Context
    tp_group: Group | None = None  # None: no tensor parallelism (one rank holds everything)
    sp: bool = False  # sequence parallelism on top of TP (the name Layout and the command line give it)
    cp_group: Group | None = None  # context parallelism: the sequence is split over it for the whole layer
    seq: int = 0  # the whole sequence length (needed with CP)
    cp_split: str = "zigzag"  # how CP splits the sequence: "contiguous" or "zigzag"
    cp_comm: str = "p2p"  # how CP ranks share K and V: "p2p" (a ring) or "all_gather" (layout/mesh.py CP_COMMS)
    ep_group: Group | None = None  # expert parallelism: the MoE block's experts are split over this group
    etp_group: Group | None = None  # expert tensor parallelism: each expert's matrices are split over it
    options: LayerOptions = LayerOptions()  # how this run's layers run (frozen: one default serves all)
    # where `weight_grad` hands weight-gradient work: None, run it at once; a schedule that splits backward
    # in two (zero-bubble's W queue, pipeline/executor.py) installs its queue for the length of a backward
    weight_grads: WeightGradSink | None = field(default=None, repr=False, compare=False)
    _positions: dict = field(default_factory=dict, repr=False, compare=False)  # cp_positions by seq, split, cp

    @classmethod
    def from_layout(cls, ctx: Context, layout: Any = None, options: LayerOptions = LayerOptions()) -> "ParallelContext":
        """The context of `ctx`'s rank in `layout` (default: the layout the run was given): its TP, CP and
        EP groups, SP and the CP split from the layout, the sequence length from its model; `options` as given."""
        layout = layout if layout is not None else ctx.layout
        if ctx.layout is not layout:
            ctx.use_layout(layout)
        g = ctx.groups
        seq = layout.model.seq if layout.model is not None and layout.model.seq else 0
        made = dict(
            tp_group=g["tp"],
            sp=layout.sp,
            cp_group=g["cp"],
            seq=seq,
            cp_split="zigzag" if layout.zigzag else "contiguous",
            cp_comm=layout.cp_comm,
            ep_group=g["ep"],
            etp_group=g["expert-tp"],
        )
        return cls(ctx, **made, options=options)

    def weight_grad(self, work: Callable[[], None]) -> None:
        """Run `work` (a weight-gradient computation) now, or hand it to the queue a schedule installed."""
        if self.weight_grads is None:
            work()
        else:
            self.weight_grads.run_or_queue(work)

    # Each group's size and this rank's place in it (picotron's tp_world_size, tp_rank): 1 and 0 without it.
    @property
    def tp_world_size(self) -> int:
        return 1 if self.tp_group is None else self.tp_group.size

    @property
    def tp_rank(self) -> int:
        return 0 if self.tp_group is None else self.tp_group.group_rank(self.ctx.rank)

    @property
    def cp_world_size(self) -> int:
        return 1 if self.cp_group is None else self.cp_group.size

    @property
    def cp_rank(self) -> int:
        return 0 if self.cp_group is None else self.cp_group.group_rank(self.ctx.rank)

    @property
    def etp_world_size(self) -> int:
        return 1 if self.etp_group is None else self.etp_group.size

    @property
    def etp_rank(self) -> int:
        return 0 if self.etp_group is None else self.etp_group.group_rank(self.ctx.rank)

    def cp_positions(self) -> list[int]:
        """The sequence positions this rank's CP slice holds (all of them without CP); worked out once per
        sequence length and split (every layer asks, and a long sequence has hundreds of thousands)."""
        key = (self.seq, self.cp_split, self.cp_world_size)
        if key not in self._positions:
            self._positions[key] = list(self._cp_slice())
        return list(self._positions[key])

    def token_positions(self) -> list[int]:
        """The positions this rank holds between matmuls: its CP slice, then its SP share of that (under SP
        only the share is listed, not the whole slice first)."""
        if not self.sp:
            return self.cp_positions()
        return sp_share(self._cp_slice(), self.tp_world_size, self.tp_rank)

    def _cp_slice(self) -> Sequence[int]:
        """This rank's CP slice (every position without CP) as ranges, listed only as far as a caller reads."""
        if self.cp_world_size == 1:
            return range(self.seq)
        return SequenceSplit(self.cp_split, self.seq, self.cp_world_size).positions(self.cp_rank)

    @property
    def xp(self) -> Any:
        return self.ctx.xp

    @property
    def comm(self) -> Any:
        return self.ctx.comm

    def shard(self, full: Array, dim: int) -> Array:
        """This rank's slice of a whole tensor along `dim` over TP (a copy, so it owns its memory)."""
        return local(full, Shard(dim), self.tp_world_size, self.tp_rank, self.xp)

    # The conjugate operators of Megatron-LM. f: identity forward, all-reduce backward (every rank used
    # the same input, so its gradient is what all of them send back, added). g: the reverse.
    def f_forward(self, x: Array) -> Any:
        return x

    def f_backward(self, dx: Array) -> Any:
        return dx if self.tp_world_size == 1 else self.comm.all_reduce(dx, group=self.tp_group, label="f backward")

    def g_forward(self, y: Array) -> Any:
        return y if self.tp_world_size == 1 else self.comm.all_reduce(y, group=self.tp_group, label="g forward")

    def g_backward(self, dy: Array) -> Any:
        return dy

    # Sequence parallelism splits the all-reduce into its halves: all-gather the sequence before a
    # column-parallel block, reduce-scatter it after a row-parallel one (and the reverse in backward).
    def gather_seq(self, x: Array, label: str) -> Any:
        return x if self.tp_world_size == 1 else self.comm.all_gather(x, dim=0, group=self.tp_group, label=label)

    def scatter_seq(self, y: Array, label: str) -> Any:
        return y if self.tp_world_size == 1 else self.comm.reduce_scatter(y, dim=0, group=self.tp_group, label=label)


def sp_share(positions: Sequence[int], t: int, r: int) -> list[int]:
    """TP rank r's share of `positions` under SP: the positions it holds between matmuls."""
    n, left = divmod(len(positions), t)
    if left:  # an uneven share would drop tokens (or leave a rank none) and fail far from here
        k = len(positions)
        raise LayoutError(
            f"sequence parallelism over tp {t} cannot split the {k} token{'' if k == 1 else 's'} of "
            "this rank's sequence slice evenly: the sequence length must divide by cp x tp"
        )
    return list(positions[r * n : (r + 1) * n])


@runtime_checkable
class Layer(Protocol):
    """What every layer, the MoE block and a pipeline stage offer: forward and backward side by side, and
    their weights under one set of names: `params` (this rank's pieces), `grads`, `load` (after an optimizer
    step) and `placements` (how each lies over the mesh axes; see placement.py)."""

    placements: Any

    def forward(self, x: Array, saved: Any) -> tuple[Any, Any]: ...

    def backward(self, cache: Any, dy: Array) -> Array: ...

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
    """What forward keeps for backward, counted in the units of Korthikanti et al. (2022): an activation
    element at its own size where the run computes in its training dtypes (2 bytes in BF16: a run at real
    size), 2 bytes (16-bit training) where it computes in float64 for exactness, and 1 byte per dropout-mask
    element."""

    items: list[tuple[str, str, int, int]] = field(default_factory=list)  # (layer, name, elements, bytes each)
    # the data this forward runs on (a sequence's name, a micro-batch): when given, layers mark what they
    # hand on (`ctx.mark`, for `parasim check`) under names that say which data and which layer
    tag: str | None = None

    def keep(self, layer: str, name: str, x: Array, unit: int | None = None) -> Any:
        if unit is None:
            size = int(getattr(x.dtype, "itemsize", 8))
            unit = 2 if size == 8 else size  # an exact run's float64 stands for 16-bit training
        self.items.append((layer, name, int(_numel(x)), unit))
        return x

    def bytes(self, layer: str | None = None) -> int:
        return sum(n * u for lay, _, n, u in self.items if layer is None or lay == layer)

    def by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lay, name, n, u in self.items:
            out[f"{lay}.{name}"] = out.get(f"{lay}.{name}", 0) + n * u
        return out


def _numel(x: Array) -> int:
    n = 1
    for d in x.shape:
        n *= int(d)
    return n


class Wrapper:
    """A layer around another (`self.layer`) that changes how it runs but not what it holds: the weights'
    names, placements and gradients pass through (a wrapper overrides what it does differently)."""

    layer: Any

    @property
    def par(self) -> Any:
        """The layer's ParallelContext: a zero-bubble stage installs its weight-gradient queue there
        (pipeline/stage.py), whatever wraps the layer."""
        return self.layer.par

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

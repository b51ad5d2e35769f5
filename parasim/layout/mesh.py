"""Layouts: how a world of GPUs is split into TP, CP, DP, PP and EP groups, exactly as Megatron-Core does it.

Megatron-Core sees the world as a grid whose axes are listed in `order` from the fastest-varying to the
slowest (default tp-cp-ep-dp-pp). Attention layers label a pipeline stage's GPUs TP x CP x DP; MoE layers
label the same GPUs ETP x EP x EDP (MoE "parallel folding"): two rank generators over one world. A group
"over axes A" holds the ranks that differ only in A; groups are listed by the other axes' coordinates,
the earliest axis of `order` fastest, and members ascend. Group kinds and their creation order follow
`parallel_state.initialize_model_parallel` (read from Megatron-Core's source; this is our own code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import ClassVar

import numpy as np

from ..limits import LAYOUT_WORLD
from .axes import AXES
from .model import LayoutError, ModelSpec, check_kv
from .stages import check_stages

ORDER_WORDS = ("tp", "cp", "ep", "dp", "pp")  # the words of a rank order (Megatron-Core's, the dense generator's)
ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")  # the second is Megatron's --use-tp-pp-dp-mapping
# (name, generator, axes) in the order Megatron-Core creates them. Expert generator: tp = expert TP, dp = expert DP.
GROUP_KINDS = (
    ("dp-cp", "dense", ("dp", "cp")),
    ("dp", "dense", ("dp",)),
    ("cp", "dense", ("cp",)),
    ("tp-pp", "dense", ("tp", "pp")),
    ("tp", "dense", ("tp",)),
    ("pp", "dense", ("pp",)),
    ("embedding", None, ()),  # from each pp group: its first and last stage
    ("position-embedding", None, ()),  # from each pp group: its first stage
    ("tp-dp-cp", "dense", ("tp", "dp", "cp")),
    ("tp-dp", "dense", ("tp", "dp")),
    ("tp-cp", "dense", ("tp", "cp")),
    ("ep", "expert", ("ep",)),
    ("expert-tp", "expert", ("tp",)),
    ("expert-tp-ep", "expert", ("tp", "ep")),
    ("expert-tp-ep-pp", "expert", ("tp", "ep", "pp")),
    ("expert-dp", "expert", ("dp",)),
)
GROUP_NAMES = tuple(k[0] for k in GROUP_KINDS)
ZERO_STAGES = (0, 1, 2, 3)
# how CP ranks share K and V (Megatron's --cp-comm-type words): "p2p", a ring of point-to-point transfers beside
# attention (nn/ring_attention.py); "all_gather", the whole sequence's K and V gathered before attention and
# their gradients reduce-scattered after it, as Llama 3 trained (nn/gathered_attention.py)
CP_COMMS = ("p2p", "all_gather")
COORDS = tuple(AXES)  # a rank's coordinates: its index along each mesh axis (layout/axes.py)
COORD_GROUP = {name: axis.group for name, axis in AXES.items()}  # which group a coordinate is the index in


@dataclass(frozen=True)
class Layout:
    """tp, cp, pp, dp, ep, etp over `world` GPUs; dp or world may be left out and derived."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    # dp, etp and world may be left out (None) when a Layout is made: __post_init__ derives each, so a Layout
    # always holds ints there, which is what every reader gets
    dp: int = None  # type: ignore[assignment]
    ep: int = 1
    etp: int = None  # type: ignore[assignment]
    world: int = None  # type: ignore[assignment]
    order: str = ORDERS[0]
    sp: bool = False  # sequence parallelism (rides on TP; Megatron's --sequence-parallel)
    zigzag: bool = True  # CP splits the sequence in 2*cp chunks (load balance) rather than cp
    cp_comm: str = CP_COMMS[0]  # how CP ranks share K and V: a ring ("p2p") or an all-gather (CP_COMMS)
    model: ModelSpec | None = None
    gpus_per_node: int = 8
    zero: int = 1  # ZeRO stage over the dp x cp group (1: Megatron's distributed optimizer)
    edp: int = field(init=False)
    # Megatron-Core refuses an MoE model under TP without SP, and so does every command; a plan held to the rules
    # of thumb (clock/critic.ScoredPlan) turns the refusal off, to score that layout as a broken rule instead
    moe_needs_sp: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "ep", "gpus_per_node") + tuple(
            n for n in ("dp", "etp", "world") if getattr(self, n) is not None
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        if self.cp_comm not in CP_COMMS:
            raise LayoutError(f"unknown CP exchange {self.cp_comm!r}; use {' or '.join(CP_COMMS)}")
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        words = self.order.split("-")
        unknown = [w for w in words if w not in ORDER_WORDS]
        if unknown:
            raise LayoutError(f"unknown word {unknown[0]!r} in order {self.order!r}; use {' or '.join(ORDERS)}")
        if self.order not in ORDERS:
            raise LayoutError(f"order {self.order!r} is not one Megatron-Core builds; use {' or '.join(ORDERS)}")
        base = self.tp * self.cp * self.pp
        world, dp = self.world, self.dp
        if world is None:
            world = base * (dp or 1)
        if world > LAYOUT_WORLD:  # its groups are built and listed rank by rank
            raise LayoutError(f"a world of {world:,} GPUs is more than the limit of {LAYOUT_WORLD:,}")
        if world % base:
            raise LayoutError(f"world {world} is not divisible by tp*cp*pp = {base}")
        if dp is not None and dp != world // base:
            raise LayoutError(f"dp {dp} does not fit: world {world} / (tp*cp*pp = {base}) is {world // base}")
        etp = self.tp if self.etp is None else self.etp
        if world % (etp * self.ep * self.pp):
            why = (
                (
                    f" (etp was not given, so it follows tp = {self.tp}, as Megatron's --expert-tensor-parallel-size "
                    "does; give etp=1 for experts not split by TP)"
                )
                if self.etp is None and self.tp > 1
                else ""
            )
            raise LayoutError(f"world {world} is not divisible by etp*ep*pp = {etp * self.ep * self.pp}{why}")
        object.__setattr__(self, "world", world)
        object.__setattr__(self, "dp", world // base)
        object.__setattr__(self, "etp", etp)
        object.__setattr__(self, "edp", world // (etp * self.ep * self.pp))
        if not self.order.endswith("pp") and self.pp > 1 and self.edp != self.dp:
            raise LayoutError(
                f"order {self.order} with pp > 1 needs edp == dp (Megatron-Core's rule when pp is not "
                f"the last word), got edp={self.edp}, dp={self.dp}"
            )
        if self.sp and self.tp == 1:  # SP splits what TP leaves whole: with one TP rank there is nothing to split
            raise LayoutError("sequence parallelism needs tp > 1")
        if self.model is not None:
            self._check_model(self.model)

    def _check_model(self, m: ModelSpec) -> None:
        if m.heads is not None:
            check_heads(m.heads, m.kv_heads or m.heads, self.tp)
        if m.experts and m.experts % self.ep:
            raise LayoutError(f"experts {m.experts} do not divide by ep {self.ep}")
        if self.ep > 1 and not m.experts:
            raise LayoutError(f"ep {self.ep} needs a model with experts")
        if m.layers is not None:
            check_stages(m, self.pp)  # the layers on stages by the model's rule (layout/stages.py)
        if m.seq is not None and self.cp > 1:
            chunks = 2 * self.cp if self.zigzag else self.cp
            if m.seq % chunks:
                raise LayoutError(
                    f"sequence {m.seq} does not divide by {'2*cp' if self.zigzag else 'cp'} = {chunks} "
                    f"({'the zigzag split' if self.zigzag else 'the contiguous split'})"
                )
        if m.seq is not None and self.sp and m.seq % (self.cp * self.tp):
            raise LayoutError(
                f"sequence {m.seq} does not divide by cp x tp = {self.cp * self.tp} (sequence "
                "parallelism splits each CP rank's tokens evenly over its TP ranks)"
            )
        if self.moe_needs_sp and m.experts and m.experts > 1 and self.tp > 1 and not self.sp:
            raise LayoutError(
                f"an MoE model with tp {self.tp} > 1 needs sequence parallelism (Megatron's rule): "
                "add --sp (--sequence-parallel)"
            )

    # -- groups ------------------------------------------------------------------------------------
    def sizes(self, generator: str) -> dict[str, int]:
        if generator == "dense":
            return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        return {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}

    def rank_groups(self, generator: str, axes: tuple[str, ...]) -> list[list[int]]:
        """Megatron-Core's groups over `axes` from one generator: the world as an array with the slowest
        axis first, the group's axes moved last (keeping their order), one group per row."""
        sizes, order = self.sizes(generator), self.order.split("-")
        grid = np.arange(self.world).reshape([sizes[a] for a in reversed(order)])
        names = list(reversed(order))
        inside = [i for i, a in enumerate(names) if a in axes]
        outside = [i for i, a in enumerate(names) if a not in axes]
        size = prod(sizes[a] for a in axes)
        return np.transpose(grid, outside + inside).reshape(-1, size).tolist()

    def groups(self) -> dict[str, list[list[int]]]:
        """Every group kind, in Megatron-Core's creation order; each a list of ascending rank lists. Made once
        per Layout and shared (every rank of a run asks: 16,384 of them at Llama 3's size): read it, never change
        it."""
        return self._groups

    @cached_property
    def _groups(self) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {}
        for name, generator, axes in GROUP_KINDS:
            if name == "embedding":
                out[name] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in out["pp"]]
            elif name == "position-embedding":
                out[name] = [[g[0]] for g in out["pp"]]
            elif generator is not None:
                out[name] = self.rank_groups(generator, axes)
        return out

    def coords(self) -> list[dict[str, int]]:
        """Each rank's coordinates: its index in its tp, cp, dp, pp, ep, expert-tp and expert-dp group (made once
        per Layout and shared, as groups())."""
        return self._coords

    @cached_property
    def _coords(self) -> list[dict[str, int]]:
        groups = self.groups()
        out = [{"rank": r} for r in range(self.world)]
        for coord, kind in COORD_GROUP.items():
            for g in groups[kind]:
                for i, r in enumerate(g):
                    out[r][coord] = i
        return out

    @property
    def experts_each(self) -> int:
        """Experts (per MoE layer) each EP rank holds; 0 for a dense model."""
        return self.model.experts // self.ep if self.model and self.model.experts else 0

    def experts_of(self, ep_rank: int) -> list[int]:
        """0-based experts held by EP rank `ep_rank` (contiguous blocks, as Megatron assigns them)."""
        per = self.experts_each
        return list(range(ep_rank * per, (ep_rank + 1) * per))

    def to_dict(self) -> dict:
        return {
            "tp": self.tp,
            "cp": self.cp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "etp": self.etp,
            "edp": self.edp,
            "world": self.world,
            "order": self.order,
        }

    def to_json(self) -> dict:
        """The `parasim layout --json` object."""
        return {"layout": self.to_dict(), "groups": self.groups(), "coords": self.coords()}

    def __str__(self) -> str:
        parts = [f"{a.upper()}{getattr(self, a)}" for a in ("tp", "cp", "pp", "dp") if getattr(self, a) > 1]
        if self.ep > 1 or self.etp != self.tp:
            parts += [f"ETP{self.etp}", f"EP{self.ep}", f"EDP{self.edp}"]
        if not parts and self.world == 1:
            return "one GPU" + (" +SP" if self.sp else "")
        return (" x ".join(parts) or "one GPU") + (" +SP" if self.sp else "") + f" on {self.world} GPUs"


def check_heads(heads: int, kv_heads: int, tp: int) -> None:
    """TP splits attention by whole heads: q heads divide by tp; kv heads divide by tp, or (fewer kv heads
    than tp ranks) each kv head is replicated on tp/kv-heads ranks, which must be whole. The one place
    this rule lives: layouts, the estimator's search and the attention layer all call it."""
    if heads % tp:
        raise LayoutError(f"heads {heads} do not divide by tp {tp}: each rank must hold whole heads")
    check_kv(heads, kv_heads)
    if kv_heads % tp and tp % kv_heads:
        raise LayoutError(
            f"kv-heads {kv_heads} do not divide by tp {tp}"
            if kv_heads > tp
            else f"tp {tp} does not divide by kv-heads {kv_heads}: each kv head is "
            "replicated on tp/kv-heads ranks, which must be whole"
        )

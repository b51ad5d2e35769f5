"""The longest sequence that fits, and a search over every layout for 1 to many nodes.

Memory on a stage is a + b*s + c*s^2 (see memory.py); the longest s is the root of that against the usable
memory, the smallest over the stages that can bind (memory.stages_of: the first of each run of stages with
alike layers, which holds the most micro-batches in flight, and the last, which holds the logits; the model's
rule for its layers on stages, layout/stages.py, says which those are). The search builds every valid layout
as columns of numpy arrays and solves them all at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isqrt
from typing import Any

import numpy as np

from ..errors import UsageError
from ..limits import LAYOUT_WORLD, SEARCH_LAYOUTS, at_most, digits
from ..layout import Layout, LayoutError, check_heads
from .memory import RECOMPUTE, Breakdown, Plan, breakdown, stages_of, totals
from ..layout import ModelSpec


# The post's nine layouts for the 27B model's longest sequence, one node or two: (nodes, label, Plan fields)
LONGEST_ROWS = (
    (1, "TP8", dict(tp=8)),
    (1, "TP8 + SP", dict(tp=8, sp=True)),
    (1, "TP4 + SP + CP2", dict(tp=4, sp=True, cp=2)),
    (1, "TP2 + SP + PP4", dict(tp=2, sp=True, pp=4)),
    (1, "TP8 + SP + full recompute", dict(tp=8, sp=True, recompute="full")),
    (2, "TP8 + SP, DP2", dict(tp=8, sp=True, dp=2)),
    (2, "TP8 + SP + PP2", dict(tp=8, sp=True, pp=2)),
    (2, "TP8 + SP + CP2", dict(tp=8, sp=True, cp=2)),
    (2, "TP8 + SP + CP2 + full recompute", dict(tp=8, sp=True, cp=2, recompute="full")),
)


def solve(a: Any, b: Any, c: Any, avail: Any) -> Any:
    """The largest s >= 0 with a + b*s + c*s^2 <= avail (0 when even s = 0 does not fit)."""
    room = np.maximum(avail - a, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        quad = (-b + np.sqrt(b * b + 4 * c * room)) / (2 * np.where(c > 0, c, 1))
        lin = np.where(b > 0, room / np.where(b > 0, b, 1), np.inf)
    return np.where(c > 0, quad, lin)


def longest(model: ModelSpec, p: Any, usable: float) -> Any:
    """Longest sequence (tokens, unrounded) for a Plan or for columns of plans."""
    best = None
    for stage in stages_of(model, p):
        s = solve(*totals(model, p, stage), usable)
        best = s if best is None else np.minimum(best, s)
    return best


@dataclass
class Fit:
    plan: Plan
    usable: float
    seq: int  # whole tokens
    at_max: Breakdown  # memory at that length, on the binding stage

    def to_dict(self, unit: float = 1e9) -> dict[str, Any]:
        return {
            "model": self.at_max.model.name,
            "layout": self.plan.to_dict(),
            "usable": self.usable / unit,
            "unit_bytes": unit,
            "max_seq_tokens": self.seq,
            "binding_stage": self.at_max.stage + 1,
            "model_state": self.at_max.model_state / unit,
            "memory_at_max": self.at_max.to_dict(unit),
        }


def fit(model: ModelSpec, plan: Plan, usable: float) -> Fit:
    plan.check(model)
    s = float(longest(model, plan, usable))
    if not np.isfinite(s):
        raise UsageError("no limit: nothing in this plan grows with the sequence")
    seq = int(np.floor(s))
    return Fit(plan, usable, seq, breakdown(model, plan, seq))


# -- the search ---------------------------------------------------------------------------------------
@dataclass
class Plans:
    """Many plans as columns (one row per layout); the same attribute names as Plan."""

    tp: np.ndarray
    sp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    nodes: np.ndarray
    flash: bool = True
    dropout: bool = True
    micro_batch: int = 1
    chunked_loss: bool = False
    working_layers: int = 2
    gathered_layers: int = 2
    precision: str = "post"
    attention_kernel: str | None = None
    fusion: str = "megatron"
    dispatcher: str = "alltoall"

    @property
    def m(self) -> np.ndarray:
        return self.pp

    def __len__(self) -> int:
        return len(self.tp)

    def plan(self, i: int) -> Plan:
        return Plan(
            tp=int(self.tp[i]),
            sp=bool(self.sp[i]),
            cp=int(self.cp[i]),
            pp=int(self.pp[i]),
            dp=int(self.dp[i]),
            ep=int(self.ep[i]),
            etp=int(self.etp[i]),
            zero=int(self.zero[i]),
            recompute=RECOMPUTE[int(self.rc[i])],
            flash=self.flash,
            dropout=self.dropout,
            micro_batch=self.micro_batch,
            chunked_loss=self.chunked_loss,
            working_layers=self.working_layers,
            gathered_layers=self.gathered_layers,
            precision=self.precision,
            attention_kernel=self.attention_kernel,
            fusion=self.fusion,
            dispatcher=self.dispatcher,
        )


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending (up to its square root, then their partners)."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _valid(model: ModelSpec, tp: int, pp: int, cp: int, dp: int, ep: int, sp: bool, etp: int = 1) -> bool:
    """The layout's own rules decide (SP needs TP, an MoE model with TP needs SP, layers over stages, the
    experts' grid over the same GPUs, ...): no second copy of them here."""
    try:
        Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp, sp=sp, model=model)
    except LayoutError:
        return False
    return True


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    try:
        check_heads(model.heads, model.kv, tp)
    except LayoutError:
        return False
    return True


def enumerate_plans(
    model: ModelSpec,
    nodes: range,
    gpus_per_node: int = 8,
    zero: int | None = None,
    recompute: str | None = None,
    **choices: Any,
) -> Plans:
    """Every valid layout on each node count: TP inside a node (dividing the heads), PP splitting the
    layers by the model's rule (layout/stages.py: dividing them, unless the rule allows otherwise), CP and
    DP taking the rest, SP on or off, each ZeRO stage and recomputation choice; for MoE models every EP size
    dividing the experts, each with the experts whole on their GPU (ETP 1, DeepSeek's choice) or split as
    attention is (ETP = TP, Megatron's default), SP whenever TP > 1, as Megatron requires."""
    at_most(
        f"GPUs in the search's largest world ({max(nodes):,} node(s) of {gpus_per_node:,})",
        max(nodes) * gpus_per_node,
        LAYOUT_WORLD,
        "each layout's groups are built rank by rank",
    )
    tps = [t for t in _divisors(gpus_per_node) if _tp_ok(model, t)]
    keys = {key for _, key in _candidates(model, nodes, gpus_per_node, tps)}  # sizes recur on many node counts
    at_most(
        "layouts in one search",
        len(keys),
        SEARCH_LAYOUTS,
        "each is built and checked by the layout rules: search fewer node counts",
    )
    valid = {key: _valid(model, *key) for key in keys}
    base = [(n, *key) for n, key in _candidates(model, nodes, gpus_per_node, tps) if valid[key]]
    if not base:
        raise UsageError("no valid layout for this model on these nodes")
    b = np.array(base, dtype=np.int64).T
    rcs = np.arange(len(RECOMPUTE)) if recompute is None else np.array([RECOMPUTE.index(recompute)])
    zs = np.arange(4) if zero is None else np.array([zero])
    grid = np.array(np.meshgrid(np.arange(b.shape[1]), rcs, zs, indexing="ij")).reshape(3, -1)
    idx, rc, zz = grid
    n, tp, pp, cp, dp, ep = (b[k][idx] for k in range(6))
    sp, etp = b[6][idx].astype(bool), b[7][idx]
    keep = np.ones(len(idx), dtype=bool)
    # with nothing to shard over, ZeRO stages are all the same layout: keep one
    keep &= (dp * cp > 1) | (ep > 1) | (zz == 1)
    sel = np.flatnonzero(keep)
    return Plans(
        tp=tp[sel],
        sp=sp[sel],
        cp=cp[sel],
        pp=pp[sel],
        dp=dp[sel],
        ep=ep[sel],
        etp=etp[sel],
        zero=zz[sel],
        rc=rc[sel],
        nodes=n[sel],
        **choices,
    )


def _candidates(model: ModelSpec, nodes: range, gpus_per_node: int, tps: list[int]) -> Any:
    """(node count, (tp, pp, cp, dp, ep, sp, etp)) for every split of each node count's GPUs, before the layout
    rules: TP inside a node, PP and CP dividing what is left, DP the rest, EP dividing the experts, the experts'
    TP 1 or TP's."""
    for n in nodes:
        world = n * gpus_per_node
        for tp in tps:
            for pp in _divisors(world // tp):
                for cp in _divisors(world // (tp * pp)):
                    dp = world // (tp * pp * cp)
                    eps = [e for e in _divisors(world // pp) if model.experts % e == 0] if model.experts else [1]
                    etps = (1, tp) if model.experts and tp > 1 else (1,)
                    for ep in eps:
                        for sp in (False, True):
                            for etp in etps:
                                yield n, (tp, pp, cp, dp, ep, sp, etp)


def family_name(tp: bool, sp: bool, cp: bool, pp: bool, ep: bool, rc: int) -> str:
    """A layout's family for the plot: which techniques it uses, sizes left out."""
    parts = ["TP+SP" if sp else "TP" if tp else "no TP"]
    parts += [a for a, on in (("CP", cp), ("PP", pp), ("EP", ep)) if on]
    parts += [("", "selective", "recompute")[rc]] if rc else []
    return " + ".join(parts)


def family(plan: Plan) -> str:
    return family_name(plan.tp > 1, plan.sp, plan.cp > 1, plan.pp > 1, plan.ep > 1, plan.rc)


def search(
    model: ModelSpec, nodes: range, usable: float, gpus_per_node: int = 8, top: int = 5, **choices: Any
) -> dict[str, Any]:
    """Rank every layout on each node count by the longest sequence; ties go to less sharding
    (a lower ZeRO stage, less recomputation, fewer pipeline stages)."""
    plans = enumerate_plans(model, nodes, gpus_per_node, **choices)
    seq = np.floor(longest(model, plans, usable))
    order = np.lexsort((plans.tp, plans.cp, plans.pp, plans.rc, plans.zero, -seq, plans.nodes))
    out = []
    by_nodes = plans.nodes[order]  # sorted: node count is the sort's first key
    starts = np.searchsorted(by_nodes, np.array(nodes), side="left")
    ends = np.searchsorted(by_nodes, np.array(nodes), side="right")
    for n, a, b in zip(nodes, starts, ends):
        rows = order[a:b]
        ranked = [{**plans.plan(int(i)).to_dict(), "max_seq_tokens": int(seq[i])} for i in rows[:top]]
        out.append(
            {
                "nodes": n,
                "gpus": n * gpus_per_node,
                "layouts": int(len(rows)),
                "best": ranked[0] if ranked else None,
                "top": ranked,
            }
        )
    # the best length per family and node count, vectorised (a Python loop over every row is too slow)
    code = (plans.tp > 1) + 2 * plans.sp + 4 * (plans.cp > 1) + 8 * (plans.pp > 1) + 16 * (plans.ep > 1) + 32 * plans.rc
    codes, inverse = np.unique(code, return_inverse=True)
    best = np.full((len(codes), len(nodes)), -1.0)
    np.maximum.at(best, (inverse, plans.nodes - nodes.start), seq)
    families = {}
    for k, c in enumerate(codes):
        c = int(c)
        name = family_name(bool(c & 1), bool(c & 2), bool(c & 4), bool(c & 8), bool(c & 16), c // 32)
        families[name] = {n: int(best[k, j]) for j, n in enumerate(nodes) if best[k, j] >= 0}
    return {"model": model.name, "usable": usable, "layouts_tried": int(len(plans)), "nodes": out, "families": families}


def parse_nodes(text: str) -> range:
    """'1-64' or '4' -> a range of node counts."""
    lo, _, hi = text.partition("-")
    try:
        a, b = digits(lo), digits(hi or lo)  # digits only: int() also reads '1_0', '+1' and ' 4'
    except ValueError:
        raise UsageError(f"--nodes expects N or A-B (e.g. 1-64), got {text!r}") from None
    if a < 1 or b < a:
        raise UsageError(f"--nodes expects 1 <= A <= B, got {text!r}")
    if b > 4096:
        raise UsageError(f"--nodes {text!r}: at most 4096 nodes")
    if b - a + 1 > 512:  # every layout of every count is costed at once: ~1 s and ~300 MB per 128 counts up high
        raise UsageError(f"--nodes {text!r}: at most 512 node counts in one search (e.g. 1-512 or 3585-4096)")
    return range(a, b + 1)


__all__ = [
    "Fit",
    "Plans",
    "fit",
    "search",
    "enumerate_plans",
    "longest",
    "solve",
    "parse_nodes",
    "family",
    "LayoutError",
]

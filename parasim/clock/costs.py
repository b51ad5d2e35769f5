"""How long each kind of event takes on a machine: one entry per collective, read by the clock.

A collective's time is its algorithm's steps, each as long as its slowest hop, plus NCCL's latencies
(estimate/hardware.py: one per call, one per step by the link the step crosses):
- ring (all-reduce, reduce-scatter, all-gather): every member sends to the next at once, each step a
  1/t chunk (comm/ring.py): steps x (chunk over the slowest link any hop of the ring uses + its latency).
  A ring over two nodes pays the network's rate on every step, though only its crossing hops cross.
- chain (broadcast, reduce): the buffer flows down the chain in pieces, so the bytes cross once at the
  slowest hop's rate and each of the t-1 hops adds its latency.
- pairs (all-to-all): every member sends to every other at once; a GPU's NVLink and its network card
  work side by side, so a member takes the longer of (its bytes inside a node over NVLink, its bytes
  across over the network); the call takes its slowest member.
- root (scatter): the root sends every chunk from its own link, one after another.
- p2p: one transfer over its one link.
Bytes per member are the trace's (comm/hops.py puts every byte on the hop that carries it). A run at real size
records its values in its precision's dtypes (layout/precision.py), so those bytes are the wire's; an exact
run computes in float64 and its values are timed at the size of the activations of the precision it stands
for, 2 bytes in BF16 (`wire_scale`).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Callable

from ..comm.hops import ACROSS, INSIDE, event_transfers, link
from ..estimate.hardware import EFFICIENCY, GPUS, LATENCY


@dataclass(frozen=True)
class Machine:
    """What the clock needs of a cluster: a GPU type's rates, its nodes, the latencies and efficiencies."""

    name: str
    peak_flops: float
    hbm: float
    nvlink: float
    network: float
    gpus_per_node: int
    latency: dict[str, float]  # "call", "inside", "across": seconds
    efficiency: dict[str, float]  # share of peak per kind of work (engine/work.py)

    def rate(self, where: str) -> float:
        """Bytes per second over link `where`."""
        return self.nvlink if where == INSIDE else self.network

    def compute(self, work: dict[str, int] | None) -> float:
        """Seconds for `work` (FLOPs by kind)."""
        if not work:
            return 0.0
        return sum([flops / (self.peak_flops * self.efficiency[kind]) for kind, flops in work.items()])


def machine(gpu: str = "h200", gpus_per_node: int | None = None) -> Machine:
    """The Machine of GPU type `gpu` (the hardware table's key), nodes of its own size unless given."""
    g = GPUS[gpu]
    return Machine(g.name, g.peak_flops.value, g.hbm.value, g.nvlink.value, g.network.value,
                   gpus_per_node or g.gpus_per_node, {k: f.value for k, f in LATENCY.items()},
                   {k: f.value for k, f in EFFICIENCY.items()})


# (trace event, machine, bytes on the wire per recorded byte, a memo the caller keeps for one run) -> seconds
Timer = Callable[[Any, Machine, float, dict], float]

EXACT = "float64"  # what an exact run computes in, whatever precision it stands for


def value_bytes(trace: Any) -> int:
    """Bytes of a value on the wire for a run's float64 arrays: the activations' size in the precision the
    trace says the run stands for (the post's BF16, 2, when it says none)."""
    from ..layout.precision import precision
    return precision((trace.meta.get("precision") or {}).get("name")).bytes("activations")


def wire_scale(e: Any, memo: dict) -> float:
    """Bytes on the wire per byte the trace recorded for event `e`: 1 for values in a training dtype, and for an
    exact run's float64 values the precision's size over 8 (`memo["value_bytes"]`, set once per run by the
    caller from `value_bytes`; 2 without it)."""
    m = e.members[0]
    t = (m.ins or m.outs or (None,))[0]
    if t is None or t.dtype != EXACT:
        return 1.0
    return memo.get("value_bytes", 2) / 8


def _slowest(hops: list[tuple[int, int, int]], m: Machine) -> str:
    return ACROSS if any(link(a, b, m.gpus_per_node) == ACROSS for a, b, _ in hops) else INSIDE


def ring_seconds(phases: int, t: int, sent: float, where: str, m: Machine) -> float:
    """A ring collective of `phases` halves (2 for an all-reduce) over t members, each sending `sent` bytes
    in all: phases x (t-1) steps of sent / steps bytes at the pace of link `where`, each with its latency."""
    if t < 2 or not sent:
        return m.latency["call"]
    steps = phases * (t - 1)
    return m.latency["call"] + steps * (m.latency[where] + sent / steps / m.rate(where))


def pairs_seconds(inside: float, across: float, m: Machine) -> float:
    """An all-to-all member sending `inside` bytes over NVLink and `across` over the network at once."""
    return m.latency["call"] + max([m.latency[w] + n / m.rate(w) for w, n in ((INSIDE, inside), (ACROSS, across))
                                    if n] or [0.0])


def _ring(phases: int) -> Timer:
    def timer(e: Any, m: Machine, scale: float, memo: dict) -> float:
        hops = event_transfers(e)
        if not hops:
            return m.latency["call"]
        return ring_seconds(phases, len(e.group.ranks), max(n for _, _, n in hops) * scale, _slowest(hops, m), m)
    return timer


def _chain(e: Any, m: Machine, scale: float, memo: dict) -> float:
    hops = event_transfers(e)
    if not hops:
        return m.latency["call"]
    where = _slowest(hops, m)
    return m.latency["call"] + len(hops) * m.latency[where] + max(n for _, _, n in hops) * scale / m.rate(where)


def _pairs(e: Any, m: Machine, scale: float, memo: dict) -> float:
    """Each member's bytes to peers of its own node and to the others (comm/hops.py's all-to-all rule: member i
    sends chunk j to member j, its sent bytes split over its chunks by their sizes), worked out as one matrix:
    an EP group of 64 has 4,032 pairs, and a step has thousands of such calls."""
    import numpy as np
    ranks = list(e.group.ranks)
    t = len(ranks)
    if t < 2:
        return m.latency["call"]
    by_rank = {mm.rank: mm for mm in e.members}
    members = [by_rank[r] for r in ranks]
    # each member's chunk sizes, one array per record: members that brought the very same chunks share one
    # record (comm/virtual.py), and a folded run repeats the same calls
    rows = []
    for mm in members:
        row = memo.get(("chunks", id(mm.ins)))
        if row is None:
            row = memo[("chunks", id(mm.ins))] = np.array([prod(x.shape) for x in mm.ins], dtype=float)
        rows.append(row)
    counts = np.stack(rows)  # [t, t] elements each member sends each other
    np.fill_diagonal(counts, 0.0)  # a member's chunk to itself stays on the GPU
    nodes = np.array(ranks) // m.gpus_per_node
    same = nodes[:, None] == nodes[None, :]
    total = counts.sum(axis=1)
    sent = np.array([mm.sent for mm in members], dtype=float) * scale
    per = np.divide(sent, total, out=np.zeros(t), where=total > 0)  # bytes per element, each member
    inside = (counts * same).sum(axis=1) * per
    across = (total * per) - inside
    # each member's two links side by side (pairs_seconds), the call as long as its slowest member
    lat = m.latency
    t_in = np.where(inside > 0, lat[INSIDE] + inside / m.nvlink, 0.0)
    t_across = np.where(across > 0, lat[ACROSS] + across / m.network, 0.0)
    return lat["call"] + float(np.maximum(t_in, t_across).max())



def _root(e: Any, m: Machine, scale: float, memo: dict) -> float:
    return m.latency["call"] + sum(m.latency[w] + n * scale / m.rate(w)
                                   for a, b, n in event_transfers(e) for w in (link(a, b, m.gpus_per_node),))


def _p2p(e: Any, m: Machine, scale: float, memo: dict) -> float:
    hops = event_transfers(e)
    return sum(m.latency[w] + n * scale / m.rate(w) for a, b, n in hops for w in (link(a, b, m.gpus_per_node),))


def _call_only(e: Any, m: Machine, scale: float, memo: dict) -> float:
    return m.latency["call"]


@dataclass(frozen=True)
class Cost:
    algorithm: str  # as the module's docstring describes it
    timer: Timer


# One entry per op the trace records (comm/ops.py's names; "p2p" for point-to-point transfers).
COSTS: dict[str, Cost] = {
    "all_reduce": Cost("ring, 2(t-1) steps", _ring(2)),
    "reduce_scatter": Cost("ring, t-1 steps", _ring(1)),
    "all_gather": Cost("ring, t-1 steps", _ring(1)),
    "broadcast": Cost("chain, pipelined", _chain),
    "reduce": Cost("chain, pipelined", _chain),
    "scatter": Cost("root sends each chunk", _root),
    "all_to_all": Cost("pairs, NVLink and network side by side", _pairs),
    "p2p": Cost("one transfer", _p2p),
    "barrier": Cost("latency only", _call_only),
}


def event_seconds(e: Any, m: Machine, memo: dict | None = None) -> float:
    """How long trace event `e` takes on `m`, its values at their wire size (`wire_scale`; `memo`: what the
    caller keeps for one run, the size of an exact run's values and all-to-all chunk sizes): a transfer by its algorithm, a
    compute event by its work. The memo holds the trace's own records by identity: keep it no longer than
    the trace."""
    if e.kind == "compute":
        return 0.0  # its work is on its member, timed as the compute before it
    memo = {} if memo is None else memo
    return COSTS["p2p" if e.kind == "p2p" else e.op].timer(e, m, wire_scale(e, memo), memo)

"""How long each kind of event takes on a machine: one entry per pattern of comm/hops.py (each op names its
own in the op table, comm/ops.Op.sends), read by the clock.

A collective moves its bytes at the bus bandwidth measured for its op, its group and its size
(estimate/kernels.collective_bandwidth: nccl-tests' busbw inside a node, which holds the small messages'
latency too; across nodes only a large-message figure was measured, so a ring's steps there also pay NCCL's
latencies, estimate/hardware.py: one per call, one per step):
- ring (all-reduce, reduce-scatter, all-gather): the ring's whole buffer at its op's measured busbw (an op
  measured nowhere at the all-reduce's), at the network's when any hop of the ring crosses nodes (a ring
  moves in lockstep, at its slowest hop's pace).
- chain, chain-back (broadcast, reduce): the buffer flows down the chain in pieces, so the bytes cross once at the
  slowest hop's point-to-point rate and each of the t-1 hops adds its latency.
- pairs (all-to-all): every member sends to every other at once; a GPU's NVLink and its network card
  work side by side, so a member takes the longer of (its bytes inside a node, its bytes across), each at
  the all-to-all bandwidth measured there; the call takes its slowest member.
- from-root (scatter): the root sends every chunk from its own link, one after another.
- one-pair (a point-to-point transfer): over its one link, at a two-member exchange's measured rate.
A rank's compute runs each product at the share of peak a product of its shape measures, attention at
FlashAttention's (clock/kernels_time.py): `Machine.compute`.
Bytes per member are the trace's (comm/hops.py puts every byte on the hop that carries it). A run at real size
records its values in its precision's dtypes (layout/precision.py), so those bytes are the wire's; an exact
run computes in float64 and its values are timed at the size of the activations of the precision it stands
for, 2 bytes in BF16 (`wire_scale`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

from ..comm.hops import ACROSS, INSIDE, event_transfers, link, pattern_of
from ..comm.ops import bus_factor
from ..estimate.hardware import GPUS, LATENCY
from ..estimate.kernels import collective_bandwidth
from .kernels_time import attention_share, gemm_seconds, gemm_share
from ..comm.trace import Trace

# A trace file written before products' shapes were kept has FLOPs only: they are timed as one large square
# product (and attention as a 4,096-token sequence of 128-wide heads), the measured tables' own best region.
FALLBACK_SHAPE, FALLBACK_SEQ, FALLBACK_HEAD = 4096, 4096, 128


@dataclass(frozen=True)
class Machine:
    """What the clock needs of a cluster: a GPU type's rates, its nodes and the latencies; its key, by which the
    measured kernel costs are looked up (estimate/kernels.py)."""

    name: str
    peak_flops: float
    hbm: float
    nvlink: float
    network: float
    gpus_per_node: int
    latency: dict[str, float]  # "call", "inside", "across": seconds
    key: str  # the hardware table's key (h200, ...)
    # The kernel lookups this Machine has made (clock/kernels_time.py): a fit search times the same shapes many
    # times over; kept with the Machine, so nothing outlives it.
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def busbw(self, op: str, nbytes: float, where: str, members: int) -> float:
        """The bus bandwidth measured for collective `op` of `nbytes` among `members` over link `where`, across
        nodes at this cluster's own network rate."""
        return collective_bandwidth(self.key, op, max(1, int(nbytes)), where, members, self.network).value

    def rate(self, where: str) -> float:
        """Bytes per second over link `where` (the datasheet's: what a transfer's bytes are drawn against)."""
        return self.nvlink if where == INSIDE else self.network

    def compute(self, work: Any) -> float:
        """Seconds for `work` (comm/trace.Work: FLOPs by kind, and the products behind them): each product at
        the share of peak its shape measures, attention at FlashAttention's for its sequence and head size;
        FLOPs without a shape (a trace file that kept none) as a large square product or sequence."""
        if not work:
            return 0.0
        shaped: dict[str, float] = {}
        total = 0.0
        for (kind, m, n, k), count in (getattr(work, "gemms", None) or {}).items():
            total += count * self.product_seconds(kind, m, n, k)
            shaped[kind] = shaped.get(kind, 0.0) + 2.0 * m * n * k * count
        for kind, flops in work.items():
            rest = flops - shaped.get(kind, 0.0)
            if rest > 0:
                total += rest / (self.peak_flops * self._fallback(kind))
        return total

    def product_seconds(self, kind: str, m: int, n: int, k: int) -> float:
        """One (m x k) @ (k x n) product: a weight's at gemm_efficiency(m, n, k); two activations' (attention:
        QK^T is s x d @ d x s, PV s x s @ s x d) at FlashAttention's share for the sequence (the longer of n, k)
        and head size (the shorter), causal, both passes."""
        if kind == "attention":
            share = attention_share(self.memo, self.key, max(n, k), min(n, k), True, None)
            return 2.0 * m * n * k / (self.peak_flops * share)
        return gemm_seconds(self.memo, self.key, self.peak_flops, m, n, k)

    def _fallback(self, kind: str) -> float:
        if kind == "attention":
            return attention_share(self.memo, self.key, FALLBACK_SEQ, FALLBACK_HEAD, True, None)
        return gemm_share(self.memo, self.key, FALLBACK_SHAPE, FALLBACK_SHAPE, FALLBACK_SHAPE)


def machine(gpu: str = "h200", gpus_per_node: int | None = None) -> Machine:
    """The Machine of GPU type `gpu` (the hardware table's key), nodes of its own size unless given."""
    g = GPUS[gpu]
    return Machine(
        g.name,
        g.peak_flops.value,
        g.hbm.value,
        g.nvlink.value,
        g.network.value,
        gpus_per_node or g.gpus_per_node,
        {k: f.value for k, f in LATENCY.items()},
        gpu,
    )


# (trace event, machine, bytes on the wire per recorded byte, a memo the caller keeps for one run) -> seconds
Timer = Callable[[Any, Machine, float, dict], float]

EXACT = "float64"  # what an exact run computes in, whatever precision it stands for


def value_bytes(trace: Trace) -> int:
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


def collective_seconds(m: Machine, op: str, t: int, buffer: float, where: str) -> float:
    """A collective `op` (all_reduce, all_gather, reduce_scatter) over t GPUs on a whole buffer of `buffer`
    bytes, at the bus bandwidth measured for its size (nccl-tests' busbw, in which each member moves
    bus_factor(op, t) x buffer). Inside a node the measured sweep holds the small messages' latency too;
    across nodes only a large-message figure was measured, so each of the ring's steps also pays NCCL's step
    latency and the call its own: a step moves 1/t of the buffer from each member, so a ring makes
    bus_factor x t of them (2(t-1) for an all-reduce)."""
    if t < 2 or buffer <= 0:
        return m.latency["call"] if t >= 2 else 0.0
    factor = bus_factor(op, t)
    moved = buffer * factor
    busbw = m.busbw(op, buffer, where, t)
    if where == INSIDE:
        return moved / busbw
    steps = round(factor * t)
    return m.latency["call"] + steps * m.latency[where] + moved / busbw


def ring_seconds(op: str, t: int, sent: float, where: str, m: Machine) -> float:
    """A ring collective `op` (all_reduce, all_gather, reduce_scatter) over t members, each sending `sent` bytes
    in all: `collective_seconds` of the buffer that makes each member send that, at the op's own measured
    bandwidth."""
    if t < 2 or not sent:
        return m.latency["call"]
    return collective_seconds(m, op, t, sent / bus_factor(op, t), where)


def p2p_rate(m: Machine, nbytes: float, where: str) -> float:
    """Bytes per second of one send of `nbytes` between two GPUs: a two-member all-gather of twice the buffer
    (each member moves one half to the other) at its measured bandwidth."""
    return m.busbw("all_gather", max(2.0, 2 * nbytes), where, 2)


def p2p_seconds(m: Machine, nbytes: float, where: str) -> float:
    """One send of `nbytes` over link `where`: its latency (across nodes; inside, the measured rate holds it)
    and its bytes at the measured point-to-point rate."""
    if nbytes <= 0:
        return 0.0
    return (m.latency[where] if where == ACROSS else 0.0) + nbytes / p2p_rate(m, nbytes, where)


def a2a_rate(m: Machine, group: int, nbytes: float, where: str) -> float:
    """Bytes per second a member of an all-to-all of `group` GPUs moves over link `where` (OpenXLA's measured
    table inside a node, for the members the node holds; DeepEP's across nodes, for the group)."""
    members = max(2, min(group, m.gpus_per_node)) if where == INSIDE else group
    buffer = nbytes * members / max(1, members - 1)  # the whole buffer whose (t-1)/t leaves each member
    return m.busbw("all_to_all", buffer, where, members)


def pairs_seconds(inside: float, across: float, m: Machine, group: int = 8) -> float:
    """An all-to-all member of a group of `group` sending `inside` bytes over NVLink and `across` over the
    network at once: the longer of the two, each at its measured all-to-all rate."""
    times = [0.0]
    if inside:
        times.append(inside / a2a_rate(m, group, inside, INSIDE))
    if across:
        times.append(m.latency[ACROSS] + across / a2a_rate(m, group, across, ACROSS))
    return m.latency["call"] + max(times)


def _ring(e: Any, m: Machine, scale: float, memo: dict) -> float:
    """A ring call of its own op (the op's measured busbw and bus factor), at its busiest member's bytes."""
    hops = event_transfers(e)
    if not hops:
        return m.latency["call"]
    return ring_seconds(e.op, len(e.group.ranks), max(n for _, _, n in hops) * scale, _slowest(hops, m), m)


def _chain(e: Any, m: Machine, scale: float, memo: dict) -> float:
    hops = event_transfers(e)
    if not hops:
        return m.latency["call"]
    where = _slowest(hops, m)
    nbytes = max(n for _, _, n in hops) * scale
    return m.latency["call"] + len(hops) * m.latency[where] + nbytes / p2p_rate(m, nbytes, where)


def _pairs(e: Any, m: Machine, scale: float, memo: dict) -> float:
    """Each member's bytes to peers of its own node and to the others (comm/hops.py's all-to-all rule: member i
    sends chunk j to member j, its sent bytes split over its chunks by their sizes), worked out as one matrix:
    an EP group of 64 has 4,032 pairs, and a step has thousands of such calls."""

    ranks = list(e.group.ranks)
    t = len(ranks)
    if t < 2:
        return m.latency["call"]
    by_rank = {mm.rank: mm for mm in e.members}
    members = [by_rank[r] for r in ranks]
    gpn = m.gpus_per_node
    # a call alike in every input is timed once a run: the same chunk records (which say every member's bytes)
    # and placement on nodes (a folded step repeats each all-to-all on every micro-batch and layer: thousands of
    # calls, a few kinds; comm/virtual.py keeps one tuple of records for each kind of chunks)
    first = ranks[0] // gpn
    key = ("pairs", scale, tuple([r // gpn - first for r in ranks]), tuple([id(mm.ins) for mm in members]))
    got = memo.get(key)
    if got is None:
        got = memo[key] = _pairs_seconds(ranks, members, m, scale, memo)
    return got


def _pairs_seconds(ranks: list[int], members: list[Any], m: Machine, scale: float, memo: dict) -> float:
    import numpy as np

    t = len(ranks)
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
    # each member's two links side by side (pairs_seconds), the call as long as its slowest member; the rates
    # measured for the busiest member's bytes on each link
    lat = m.latency
    most_in, most_across = float(inside.max()), float(across.max())
    rate_in = a2a_rate(m, t, most_in, INSIDE) if most_in > 0 else 1.0
    rate_across = a2a_rate(m, t, most_across, ACROSS) if most_across > 0 else 1.0
    t_in = np.where(inside > 0, inside / rate_in, 0.0)
    t_across = np.where(across > 0, lat[ACROSS] + across / rate_across, 0.0)
    return lat["call"] + float(np.maximum(t_in, t_across).max())


def _root(e: Any, m: Machine, scale: float, memo: dict) -> float:
    return m.latency["call"] + sum(
        p2p_seconds(m, n * scale, link(a, b, m.gpus_per_node)) for a, b, n in event_transfers(e)
    )


def _p2p(e: Any, m: Machine, scale: float, memo: dict) -> float:
    return sum(p2p_seconds(m, n * scale, link(a, b, m.gpus_per_node)) for a, b, n in event_transfers(e))


def _call_only(e: Any, m: Machine, scale: float, memo: dict) -> float:
    return m.latency["call"]


@dataclass(frozen=True)
class Cost:
    algorithm: str  # as the module's docstring describes it
    timer: Timer


# One entry per pattern of comm/hops.PATTERNS (an op names its pattern in the op table, comm/ops.Op.sends): a new
# collective that travels as an old one does is timed as it is, with nothing added here.
COSTS: dict[str, Cost] = {
    "ring": Cost("ring, bus factor x t steps (2(t-1) for an all-reduce)", _ring),
    "chain": Cost("chain, pipelined", _chain),
    "chain-back": Cost("chain, pipelined", _chain),
    "from-root": Cost("root sends each chunk", _root),
    "pairs": Cost("pairs, NVLink and network side by side", _pairs),
    "one-pair": Cost("one transfer", _p2p),
    "none": Cost("latency only", _call_only),
}


def event_seconds(e: Any, m: Machine, memo: dict | None = None) -> float:
    """How long trace event `e` takes on `m`, its values at their wire size (`wire_scale`; `memo`: what the
    caller keeps for one run, the size of an exact run's values and all-to-all chunk sizes): a transfer by its algorithm, a
    compute event by its work. The memo holds the trace's own records by identity: keep it no longer than
    the trace."""
    if e.kind == "compute":
        return 0.0  # its work is on its member, timed as the compute before it
    memo = {} if memo is None else memo
    return COSTS[pattern_of(e)].timer(e, m, wire_scale(e, memo), memo)

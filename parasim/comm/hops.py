"""Which link each byte takes: inside a node (NVLink) or across nodes (the network).

A byte is counted on the link of the hop that carries it, one (sender, receiver) pair at a time, never by
the group as a whole: a ring over two nodes crosses the boundary on only some of its hops, and only the
bytes those hops carry cross. Nodes hold `gpus_per_node` consecutive ranks (node = rank // gpus_per_node).

Who sends to whom, per collective (the rules the byte counts in comm/ops.py and comm/interface.py follow):
- all-reduce, reduce-scatter, all-gather: the ring (comm/ring.py). Member i only ever sends to member i+1
  of the group, in the group's member order (indices mod t), so every byte member i sends is on that hop.
- broadcast: a chain from src around the same ring, member i forwarding to member i+1.
- reduce: that chain run backwards, into dst: member i sends to member i-1.
- scatter: src sends each other member its chunk.
- all-to-all: member i sends chunk j to member j; its chunk to itself stays on the GPU and is not counted
  as sent, so it is on no link.
- point-to-point: the one pair.

No backend here: the estimator (estimate/traffic.py) asks the same question of its layouts' groups. Each op
names its pattern in its entry (comm/ops.Op.sends); PATTERNS holds each pattern's rule and its sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Callable, Iterable, Sequence

from .ops import OPS

INSIDE, ACROSS = "inside", "across"  # the two links, as trace.bytes_by_link names them

Transfer = tuple[int, int, int]  # (sender's rank, receiver's rank, bytes)


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def link(src: int, dst: int, gpus_per_node: int) -> str:
    """The link a hop from rank `src` to rank `dst` takes."""
    return INSIDE if node_of(src, gpus_per_node) == node_of(dst, gpus_per_node) else ACROSS


def ring_hops(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The ring's hops over `ranks` in member order: member i sends to member i+1, the last to the first.
    One member makes no hop (it has no one to send to)."""
    t = len(ranks)
    return [] if t < 2 else [(ranks[i], ranks[(i + 1) % t]) for i in range(t)]


def ring_crossings(ranks: Sequence[int], gpus_per_node: int) -> list[bool]:
    """For each hop of the ring over `ranks` (ring_hops' order): does it cross a node boundary?"""
    return [link(a, b, gpus_per_node) == ACROSS for a, b in ring_hops(ranks)]


def pair_hops(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """An all-to-all's hops: every member to every other member."""
    return [(a, b) for a in ranks for b in ranks if a != b]


def chain_hops(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """A pipeline's hops: each stage to the next (activations) and back (their gradients); no wrap-around."""
    return [hop for a, b in zip(ranks, ranks[1:]) for hop in ((a, b), (b, a))]


def _crossing(hops: list[tuple[int, int]], gpus_per_node: int) -> tuple[int, int]:
    # `link`'s rule (other nodes: across) written out: a layout search counts millions of hops
    return sum([a // gpus_per_node != b // gpus_per_node for a, b in hops]), len(hops)


def _pairs_crossing(ranks: Sequence[int], gpus_per_node: int) -> tuple[int, int]:
    """pair_hops' crossings without listing t(t-1) pairs (an EP group of 64 has 4,032): every pair but
    those inside one node, n(n-1) for a node holding n of the members."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[node_of(r, gpus_per_node)] = per_node.get(node_of(r, gpus_per_node), 0) + 1
    t = len(ranks)
    return t * (t - 1) - sum(n * (n - 1) for n in per_node.values()), t * (t - 1)


# The hops a group's traffic takes, by its pattern, counted: (crossing hops, all hops) of one group. What the
# estimator's axes send (estimate/traffic.py).
CROSSINGS: dict[str, Callable[[Sequence[int], int], tuple[int, int]]] = {
    "ring": lambda ranks, node: _crossing(ring_hops(ranks), node),
    "chain": lambda ranks, node: _crossing(chain_hops(ranks), node),
    "pairs": _pairs_crossing,
}


def crossing_share(groups: Iterable[Sequence[int]], pattern: str, gpus_per_node: int) -> float:
    """The share of `groups`' hops (pattern "ring", "pairs" or "chain") that cross a node boundary: the
    share of their bytes sent across nodes when every hop carries as many bytes (a ring's even chunks, an
    all-to-all under uniform routing, a pipeline's activation and its gradient). 0 when there is no hop."""
    groups = list(groups)
    if groups and len({len(g) for g in groups}) == 1:
        return _even_share(groups, pattern, gpus_per_node)
    crossing = hops = 0
    for g in groups:
        c, n = CROSSINGS[pattern](g, gpus_per_node)
        crossing, hops = crossing + c, hops + n
    return crossing / hops if hops else 0.0


def _even_share(groups: list[Sequence[int]], pattern: str, gpus_per_node: int) -> float:
    """crossing_share of groups of one size, as one array: a published run's plan has thousands of groups, and a
    held-out range times dozens of plans (the same counts as CROSSINGS' rules)."""
    import numpy as np

    nodes = np.asarray(groups, dtype=np.int64) // gpus_per_node  # [groups, members]
    g, t = nodes.shape
    if t < 2:
        return 0.0  # one member makes no hop
    if pattern == "ring":  # member i to member i+1, the last to the first
        crossing, hops = int(np.count_nonzero(nodes != np.roll(nodes, -1, axis=1))), nodes.size
    elif pattern == "chain":  # each stage to the next and back: every pair of neighbours twice
        crossing, hops = 2 * int(np.count_nonzero(nodes[:, 1:] != nodes[:, :-1])), 2 * (t - 1) * g
    else:  # pairs: every ordered pair but those inside one node, n(n-1) for a node holding n of a group's members
        _, n = np.unique(np.arange(g)[:, None] * (int(nodes.max()) + 1) + nodes, return_counts=True)
        hops = g * t * (t - 1)
        crossing = hops - int(np.sum(n * (n - 1)))
    return crossing / hops


# -- every transfer of one recorded event ---------------------------------------------------------------
# Each rule: (ranks in group order, each member's (sent, received) in that order, the chunks' element counts
# per member (all-to-all only), params) -> the transfers. A rule puts each member's `sent` bytes on its
# hops in full, so the transfers of an event add up to what its members sent.

Rule = Callable[[Sequence[int], Sequence[tuple[int, int]], Sequence[Sequence[int]], dict], list[Transfer]]


def _to_next(ranks, moved, chunks, params) -> list[Transfer]:
    t = len(ranks)
    return [(ranks[i], ranks[(i + 1) % t], sent) for i, (sent, _) in enumerate(moved) if sent]


def _to_previous(ranks, moved, chunks, params) -> list[Transfer]:
    t = len(ranks)
    return [(ranks[i], ranks[(i - 1) % t], sent) for i, (sent, _) in enumerate(moved) if sent]


def _from_root(ranks, moved, chunks, params) -> list[Transfer]:
    return [(params["src"], r, recv) for r, (_, recv) in zip(ranks, moved) if recv]


def _pairwise(ranks, moved, chunks, params) -> list[Transfer]:
    """Member i's sent bytes split over its chunks to the others by their element counts (one dtype per
    call, so bytes per element = sent / elements sent)."""
    out = []
    for i, ((sent, _), counts) in enumerate(zip(moved, chunks)):
        elements = sum(counts) - counts[i]
        if sent and elements:
            per = sent // elements
            out += [(ranks[i], ranks[j], n * per) for j, n in enumerate(counts) if j != i and n]
    return out


def _point_to_point(ranks, moved, chunks, params) -> list[Transfer]:
    sent = sum(s for s, _ in moved)
    return [(params["src"], params["dst"], sent)] if sent else []


def _nothing(ranks, moved, chunks, params) -> list[Transfer]:
    return []


@dataclass(frozen=True)
class Pattern:
    """How a kind of call's bytes travel: the rule that puts each member's bytes on its hops, and the same in
    one sentence for a learner (the app's "what moves" panel). The clock times a call by its pattern
    (clock/costs.COSTS)."""

    rule: Rule
    how: str


RING = "counted as a ring moves them (NCCL's bytes): each member sends to the next in the group"
# One entry per way bytes travel; an op names its own in its entry (comm/ops.Op.sends), point-to-point
# transfers are "one-pair".
PATTERNS: dict[str, Pattern] = {
    "ring": Pattern(_to_next, RING),
    "chain": Pattern(_to_next, "a chain from the source: each member forwards to the next"),
    "chain-back": Pattern(_to_previous, "a chain into the destination: each member sends to the one before it"),
    "from-root": Pattern(_from_root, "the source sends each member its chunk"),
    "pairs": Pattern(
        _pairwise, "every member sends each other member the chunk meant for it; its own chunk stays on the GPU"
    ),
    "one-pair": Pattern(_point_to_point, "one sender, one receiver"),
    "none": Pattern(_nothing, "moves no data"),
}


def pattern_of(event: Any) -> str:
    """The pattern of a trace event's transfers: its op's (comm/ops.OPS), "one-pair" for point-to-point."""
    return "one-pair" if event.kind == "p2p" else OPS[event.op].sends


def event_transfers(event: Any) -> list[Transfer]:
    """Every (sender, receiver, bytes) of a trace event (trace.Event), by its pattern's rule; nothing for a
    compute event."""
    if event.kind == "compute":
        return []
    ranks = [m.rank for m in event.members] if event.kind == "p2p" else list(event.group.ranks)
    by_rank = {m.rank: m for m in event.members}
    members = [by_rank[r] for r in ranks]
    moved = [(m.sent, m.recv) for m in members]
    pattern = pattern_of(event)
    chunks = [[prod(t.shape) for t in m.ins] for m in members] if pattern == "pairs" else []
    return PATTERNS[pattern].rule(ranks, moved, chunks, event.params)


def split_by_link(transfers: Iterable[Transfer], gpus_per_node: int) -> dict[str, int]:
    """Bytes of `transfers` inside a node and across nodes."""
    out = {INSIDE: 0, ACROSS: 0}
    for src, dst, n in transfers:
        out[link(src, dst, gpus_per_node)] += n
    return out

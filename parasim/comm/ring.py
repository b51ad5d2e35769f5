"""The ring algorithm: its schedule written once, as data (`ring_steps`), and the numpy kernel that plays it.

How the ring works. The t members of a group stand in a circle: member i only ever sends to member i+1 and
only ever receives from member i-1 (indices mod t). Every member cuts its buffer into t chunks, numbered
alike on every member. At each step every member sends one chunk and receives one, so all t links carry
data at the same time and no member waits for a busy one.

Reduce-scatter: at step k member i sends chunk i-1-k, and the receiver adds what arrives to its own part
of that chunk. Follow chunk c: member c+1 sends its part to member c+2, which adds its own and passes the
sum on at the next step, and so on round the circle. t parts take t-1 additions, so after t-1 steps the
chunk has collected every member's part, and the last member to add was member c: member i now holds the
finished chunk i.

All-gather: at step k member i sends chunk i-k, and the receiver keeps it as it is. At step 0 that is the
chunk member i finished (or, in a plain all-gather, its own input); at every later step it is the chunk it
received one step earlier. t-1 steps take each chunk to the t-1 other members.

All-reduce is the two in a row: 2(t-1) steps. Each step a member sends 1/t of the buffer, so a
reduce-scatter or an all-gather sends (t-1)/t of it and an all-reduce 2(t-1)/t: almost twice the buffer
whatever t is. That is why the ring is the algorithm of choice for bandwidth, and why its cost per member
does not grow with the group. (When the buffer does not split evenly, the first chunks are one element
larger, and member i never sends the chunk it ends up owning.)

The table below is the one description of that schedule. The numpy kernel here (virtual ranks), the torch
ring (comm/torchdist.py: each rank plays its own row) and the byte counts (interface.ring_bytes) all read
it. Every transfer the kernels make is recorded as a hop, so the bytes a member moves are measured, not
assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence, cast

import numpy as np

Reduce = Callable[[np.ndarray, np.ndarray], np.ndarray]

REDUCE_SCATTER_PHASE, ALL_GATHER_PHASE = "reduce-scatter", "all-gather"  # as recorded hops name them


@dataclass(frozen=True)
class Phase:
    """One half of the ring: who sends which chunk at each of its t-1 steps, and what the receiver does."""

    name: str
    reduce: bool  # the receiver adds what arrives to its own part of the chunk (True) or keeps it as is
    first: int  # at step 0 member i sends chunk i - first; at each later step, the chunk one lower


PHASES = {
    REDUCE_SCATTER_PHASE: Phase(REDUCE_SCATTER_PHASE, True, 1),  # pass a running sum on, the receiver adds
    ALL_GATHER_PHASE: Phase(ALL_GATHER_PHASE, False, 0),  # pass finished chunks on, the receiver keeps them
}

# The collectives the ring runs (interface's op names) and their phases, in order.
RINGS = {
    "reduce_scatter": (REDUCE_SCATTER_PHASE,),
    "all_gather": (ALL_GATHER_PHASE,),
    "all_reduce": (REDUCE_SCATTER_PHASE, ALL_GATHER_PHASE),
}


class RingStep(NamedTuple):  # a named tuple, not a dataclass: a ring call makes 2(t-1) of them, 3x faster
    """One step of a ring collective over t members: every member sends one chunk and receives one.

    Each tuple has one entry per member, in group order: member i sends chunk `send[i]` to member `to[i]`,
    and receives chunk `recv[i]` from member `source[i]`, adding it to its own part if `reduce`."""

    phase: str  # "reduce-scatter" or "all-gather"
    hop: int  # the step's index inside its phase, 0 .. t-2
    reduce: bool
    send: tuple[int, ...]
    to: tuple[int, ...]
    recv: tuple[int, ...]
    source: tuple[int, ...]


def ring_steps(t: int, kind: str) -> tuple[RingStep, ...]:
    """The steps of ring collective `kind` ("all_reduce", "reduce_scatter", "all_gather") over t members."""
    members = tuple(range(t))

    def less(n: int) -> tuple[int, ...]:  # entry i: i - n (mod t), the members' numbers turned round the ring
        n %= t
        return members[t - n :] + members[: t - n]

    to, source = less(-1), less(1)
    steps = []
    for name in RINGS[kind]:
        phase = PHASES[name]
        for k in range(t - 1):
            # member i sends chunk i - first - k; what it receives is what member i-1 sends, one lower
            steps.append(RingStep(name, k, phase.reduce, less(phase.first + k), to, less(phase.first + k + 1), source))
    return tuple(steps)


def split_phases(steps: Sequence[RingStep]) -> tuple[list[RingStep], list[RingStep]]:
    """The reduce-scatter steps and the all-gather steps: an average divides each finished chunk between
    the two."""
    return ([s for s in steps if s.phase == REDUCE_SCATTER_PHASE], [s for s in steps if s.phase == ALL_GATHER_PHASE])


# -- the numpy kernel: every member at once, on lists of chunks ------------------------------------------


def _values(a: np.ndarray, keep: int):
    return a.tolist() if keep and a.size <= keep else None


def _play(
    steps: Sequence[RingStep],
    bufs: list[list[np.ndarray]],
    ranks: tuple[int, ...],
    reduce: Reduce | None,
    keep: int,
    hops: list[dict],
) -> None:
    """Run `steps` on every member's chunks (`bufs[i][c]`: member i's chunk c), recording each as a hop.
    `reduce` adds what arrives to the receiver's part (None: no step adds)."""
    for s in steps:
        payloads = [bufs[i][c].copy() for i, c in enumerate(s.send)]
        for j, (c, src) in enumerate(zip(s.recv, s.source)):
            bufs[j][c] = cast(Callable, reduce)(payloads[src], bufs[j][c]) if s.reduce else payloads[src]  # given
        hops.append(
            {
                "phase": s.phase,
                "hop": s.hop,
                "transfers": [
                    {"src": ranks[i], "dst": ranks[j], "chunk": c, "bytes": int(p.nbytes), "value": _values(p, keep)}
                    for i, (c, j, p) in enumerate(zip(s.send, s.to, payloads))
                ],
            }
        )


# Each kernel plays `steps`, ring_steps(t, its kind) unless given (a run passes its group's, worked out once).


def ring_all_reduce(
    inputs: list[np.ndarray],
    ranks: tuple[int, ...],
    reduce: Reduce,
    scale: float | None,
    keep: int,
    steps: Sequence[RingStep] | None = None,
) -> tuple[list[np.ndarray], list[dict]]:
    """All-reduce as reduce-scatter then all-gather on flat chunks; `scale` divides each finished chunk (avg)."""
    t = len(inputs)
    shape = inputs[0].shape
    bufs = [[c.copy() for c in np.array_split(x.reshape(-1), t)] for x in inputs]
    hops: list[dict] = []
    reducing, gathering = split_phases(ring_steps(t, "all_reduce") if steps is None else steps)
    _play(reducing, bufs, ranks, reduce, keep, hops)
    if scale is not None:
        for i in range(t):
            bufs[i][i] = (bufs[i][i] / scale).astype(inputs[0].dtype)
    _play(gathering, bufs, ranks, None, keep, hops)  # the all-gather half adds nothing
    return [np.concatenate(b).reshape(shape) for b in bufs], hops


def ring_reduce_scatter(
    inputs: list[np.ndarray],
    ranks: tuple[int, ...],
    dim: int,
    reduce: Reduce,
    scale: float | None,
    keep: int,
    steps: Sequence[RingStep] | None = None,
) -> tuple[list[np.ndarray], list[dict]]:
    t = len(inputs)
    bufs = [[c.copy() for c in np.split(x, t, axis=dim)] for x in inputs]
    hops: list[dict] = []
    _play(ring_steps(t, "reduce_scatter") if steps is None else steps, bufs, ranks, reduce, keep, hops)
    outs = [bufs[i][i] for i in range(t)]
    if scale is not None:
        outs = [(o / scale).astype(inputs[0].dtype) for o in outs]
    return outs, hops


def ring_all_gather(
    inputs: list[np.ndarray], ranks: tuple[int, ...], dim: int, keep: int, steps: Sequence[RingStep] | None = None
) -> tuple[list[np.ndarray], list[dict]]:
    t = len(inputs)
    bufs: list[list] = [[None] * t for _ in range(t)]  # member i starts with only its own chunk
    for i in range(t):
        bufs[i][i] = inputs[i].copy()
    hops: list[dict] = []
    _play(ring_steps(t, "all_gather") if steps is None else steps, bufs, ranks, None, keep, hops)
    return [np.concatenate(b, axis=dim) for b in bufs], hops

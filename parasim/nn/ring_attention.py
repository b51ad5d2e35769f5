"""Context parallelism: attention over a sequence no rank holds whole, kept exact by the online softmax.

Each CP rank keeps its queries. Key/value chunks travel around a ring of point-to-point transfers
(batched, so no pair waits on the other); at each step a rank folds the chunk it holds into its running
softmax (max m, sum l, output o), rescaling the old terms by e^(m_old - m_new) when the max grows. The
traffic is keys and values alone: the running max, sum and output stay where the queries are. Backward
rotates K and V again and carries their gradients along, one step further, back to the ranks that own them.

Sequence splits: `contiguous` gives rank i tokens [i*c, (i+1)*c); `zigzag` cuts the sequence in 2*cp
chunks and gives rank i chunks i and 2*cp-1-i, so with a causal mask every rank does the same work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ..comm.interface import Array, Group, Recv, Send
from ..layout import LayoutError
from ..engine.context import Context

SPLITS = ("contiguous", "zigzag")


def positions(split: str, seq: int, cp: int, rank: int) -> list[int]:
    """The sequence positions a CP rank holds, in the order it holds them."""
    return list(SequenceSplit(split, seq, cp).positions(rank))


class Positions(Sequence[int]):
    """The positions a rank holds, as the ascending runs (ranges) they come in, listed only as far as a
    caller reads them: a slice lists just its own positions (an SP share of a long sequence's CP slice).
    Nothing is kept: a split is a few ranges, and a long sequence has hundreds of thousands of positions."""

    __slots__ = ("runs",)

    def __init__(self, runs: tuple[range, ...]):
        self.runs = runs

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.runs)

    def __getitem__(self, at: Any) -> Any:
        if not isinstance(at, slice):
            return list(self)[at]
        lo, hi, step = at.indices(len(self))
        if step != 1:
            return list(self)[at]
        out: list[int] = []
        for run in self.runs:  # each run's part of [lo, hi), counted from the run's own start
            out.extend(run[lo:hi])  # empty where lo >= hi
            lo, hi = max(lo - len(run), 0), max(hi - len(run), 0)
        return out


class SequenceSplit:
    """How one split of a sequence over a CP group falls: the positions each rank holds, and what masking and
    counting ask of them (each rank's first and last position, the fine 2*cp split's chunk length, the
    chunks each rank's positions fall in), all worked out from each rank's runs of positions."""

    def __init__(self, split: str, seq: int, cp: int):
        if split not in SPLITS:
            raise LayoutError(f"unknown split {split!r}; use {' or '.join(SPLITS)}")
        if seq % (2 * cp if split == "zigzag" else cp):
            raise LayoutError(f"sequence {seq} does not divide by {'2*cp' if split == 'zigzag' else 'cp'}")
        self.split, self.seq, self.cp = split, seq, cp
        # each rank's positions as ascending runs: one for contiguous, two for zigzag (chunks i, 2*cp-1-i)
        self.runs: list[tuple[range, ...]]
        if split == "contiguous":
            c = seq // cp
            self.runs = [(range(r * c, (r + 1) * c),) for r in range(cp)]
        else:
            c = seq // (2 * cp)
            self.runs = [(range(r * c, (r + 1) * c), range((2 * cp - 1 - r) * c, (2 * cp - r) * c)) for r in range(cp)]
        self.fine = seq // (2 * cp) if seq % (2 * cp) == 0 else seq // cp

    @property
    def ends(self) -> list[tuple[int, int]]:
        """Each rank's first and last position (its runs ascend)."""
        return [(runs[0].start, runs[-1].stop - 1) for runs in self.runs]

    @property
    def chunks(self) -> list[list[int]]:
        """The fine chunks each rank's positions fall in: a run is contiguous, so its ends say which."""
        fine = self.fine
        return [
            sorted({k for run in runs for k in range(run.start // fine, (run.stop - 1) // fine + 1)})
            for runs in self.runs
        ]

    def positions(self, rank: int) -> Positions:
        """The positions CP rank `rank` holds, in the order it holds them."""
        return Positions(self.runs[rank])

    def index(self, rank: int, xp: Any) -> Any:
        """Rank `rank`'s positions as an integer array of `xp`, made from its runs (a namespace whose arrays
        hold only shapes makes an array of a range without listing it)."""
        return xp.concat([xp.asarray(run) for run in self.runs[rank]])


def online_softmax_step(xp: Any, m: Array, l: Array, o: Array, scores: Array, v: Array) -> tuple[Any, Any, Any, Any]:
    """Fold one chunk of scores (and its values) into the running max m, sum l and output o.

    Returns (m, l, o, rescale) where rescale = e^(m_old - m_new) multiplied the old l and o. Masked scores
    are -inf; a row that has seen only -inf keeps m = -inf and contributes nothing."""
    m_new = xp.maximum(m, xp.max(scores, axis=-1))
    safe = xp.where(m_new == -math.inf, xp.zeros_like(m_new), m_new)  # avoid inf - inf
    rescale = xp.exp(m - safe)
    p = xp.exp(scores - safe[..., None])
    l = l * rescale + xp.sum(p, axis=-1)
    o = o * rescale[..., None] + xp.matmul(p, v)
    return m_new, l, o, rescale


@dataclass
class RingWork:
    """Attention work a rank did, counted in blocks of (q chunk, k chunk) of the 2*cp-way split:
    a block entirely before the diagonal is 1, a diagonal block 0.5 (half of it is masked), a skipped one 0."""

    blocks: float = 0.0
    skipped: int = 0
    flops: float = 0.0
    steps: list[float] = field(default_factory=list)  # blocks done at each ring step
    held: list[int] = field(default_factory=list)  # whose K/V chunk the rank held at each step


class RingAttention:
    """Causal (or not) attention of q [b, heads, s_local, d] against the whole sequence's k, v over a CP group.

    K and V travel at their own heads (a grouped-query model's few, as TransformerEngine's ring sends them):
    `kv_of` names the K/V head each q head reads, and each step makes the q heads' copies of the chunk it holds;
    `fold(per_q, shape)` sums the q heads' gradients onto their K/V head before dK and dV move on. Without them
    K and V come at q's heads."""

    def __init__(
        self,
        ctx: Context,
        group: Group | None,
        seq: int,
        split: str = "contiguous",
        causal: bool = True,
        name: str = "ring",
        kv_of: Sequence[int] | None = None,
        fold: Callable[[Any, tuple], Any] | None = None,
    ):
        self.ctx, self.group, self.seq, self.split, self.causal, self.name = ctx, group, seq, split, causal, name
        self.kv_of, self.fold = kv_of, fold
        self.cp = 1 if group is None else group.size
        self.r = 0 if group is None else group.group_rank(ctx.rank)
        self.sequence = SequenceSplit(split, seq, self.cp)
        self.ends, self.fine, self.chunks = self.sequence.ends, self.sequence.fine, self.sequence.chunks
        self.work = RingWork()
        self._index: dict[int, Any] = {}  # each rank's positions as an array, made once for forward and backward

    def _positions_of(self, rank: int) -> Any:
        """CP rank `rank`'s positions as an array of ctx.xp (what masking compares)."""
        if rank not in self._index:
            self._index[rank] = self.sequence.index(rank, self.ctx.xp)
        return self._index[rank]

    @property
    def pos(self) -> list[list[int]]:
        """Every CP rank's positions, in the order it holds them (made when asked: a long sequence's lists
        are big, and most layers need only `ends` and `chunks`)."""
        return [list(self.sequence.positions(i)) for i in range(self.cp)]

    def _peers(self) -> tuple[int, int]:
        g, cp, r = self.group, self.cp, self.r
        assert g is not None  # only a ring of two or more CP ranks passes K/V on
        return g.ranks[(r + 1) % cp], g.ranks[(r - 1) % cp]

    def _rotate(
        self,
        tensors: list[Any],
        names: list[str],
        src: int,
        what: str = "pass {} of CP rank {} on",
        backward: bool = False,
    ) -> list[Any]:
        """Pass every tensor (of CP rank `src`'s chunk, `names`: "K", "V", ...) to the next rank of the ring and
        take the previous rank's, in one batch; each transfer labelled with its tensor and chunk."""
        nxt, prv = self._peers()
        head = f"{self.name}{' backward' if backward else ''}: "
        came = (src - 1) % self.cp  # the chunk the previous rank holds, coming in
        ops = [Send(t, nxt, head + what.format(n, src)) for t, n in zip(tensors, names)] + [
            Recv(prv, tuple(t.shape), t.dtype, head + what.format(n, came)) for t, n in zip(tensors, names)
        ]
        return self.ctx.comm.exchange(ops, group=self.group, label=head + what.format("/".join(names), src))

    def _heads(self, a: Array) -> Any:
        """Each q head's copy of its K/V head (the chunk held travels at K/V heads)."""
        return a if self.kv_of is None else self.ctx.xp.take(a, self.ctx.xp.asarray(self.kv_of), axis=1)

    def _folded(self, per_q: Array, like: Array) -> Any:
        """A gradient of the q heads' copies summed onto their K/V heads (shaped as `like`)."""
        return per_q if self.fold is None else self.fold(per_q, tuple(like.shape))

    def _mask(self, src: int) -> Any:
        """True where a key of chunk-owner `src` comes after the query (masked), or None without masking."""
        if not self.causal:
            return None
        q, k = self._positions_of(self.r), self._positions_of(src)
        return k[None, :] > q[:, None]

    def _count(self, src: int, d: int, b: int, heads: int) -> float:
        """Blocks of the fine 2*cp split this step covers (1 full, 0.5 diagonal), and their flops."""
        fine, qc, kc = self.fine, self.chunks[self.r], self.chunks[src]
        blocks = sum(1.0 if not self.causal or k < q else 0.5 if k == q else 0.0 for q in qc for k in kc)
        self.work.blocks += blocks
        self.work.steps.append(blocks)
        flops = blocks * 4 * b * heads * fine * fine * d  # QK^T and PV, 2 flops per multiply-add
        self.work.flops += flops
        return flops

    def forward(self, q: Array, k: Array, v: Array) -> tuple[Array, tuple]:
        xp = self.ctx.xp
        b, heads, s, d = q.shape
        scale = 1.0 / math.sqrt(d)
        m = xp.full((b, heads, s), -math.inf, dtype=q.dtype)
        l = xp.zeros((b, heads, s), dtype=q.dtype)
        o = xp.zeros_like(q)
        held_k, held_v = k, v
        for step in range(self.cp):
            src = (self.r - step) % self.cp
            self.work.held.append(src)
            mask = self._mask(src)
            flops = self._count(src, d, b, heads)
            # every key of this chunk after every query (the positions are known: no array is asked)
            if self.causal and self.ends[src][0] > self.ends[self.r][1]:
                self.work.skipped += 1  # every key of this chunk comes after every query: nothing to do
                self.ctx.compute(f"{self.name}: skip K/V of CP rank {src}", 0)
            else:
                scores = xp.matmul(q, xp.permute_dims(self._heads(held_k), (0, 1, 3, 2))) * scale
                if mask is not None:
                    scores = xp.where(mask, xp.full_like(scores, -math.inf), scores)
                m, l, o, _ = online_softmax_step(xp, m, l, o, scores, self._heads(held_v))
                self.ctx.compute(f"{self.name}: attend to K/V of CP rank {src}", flops)
            if step < self.cp - 1:
                held_k, held_v = self._rotate([held_k, held_v], ["K", "V"], src)
        out = o / l[..., None]
        lse = m + xp.log(l)
        return out, (q, k, v, out, lse)

    def backward(self, cache: tuple, dout: Array) -> tuple[Any, Any, Any]:
        """dq, dk, dv of this rank's chunk (dk, dv come home around the ring)."""
        xp = self.ctx.xp
        q, k, v, out, lse = cache
        d = q.shape[-1]
        scale = 1.0 / math.sqrt(d)
        delta = xp.sum(dout * out, axis=-1)  # rowsum(dO * O): the softmax backward's correction term
        dq = xp.zeros_like(q)
        held_k, held_v = k, v
        held_dk, held_dv = xp.zeros_like(k), xp.zeros_like(v)
        for step in range(self.cp):
            src = (self.r - step) % self.cp
            mask = self._mask(src)
            if not (self.causal and self.ends[src][0] > self.ends[self.r][1]):  # as forward skipped it
                kk, vv = self._heads(held_k), self._heads(held_v)
                scores = xp.matmul(q, xp.permute_dims(kk, (0, 1, 3, 2))) * scale
                if mask is not None:
                    scores = xp.where(mask, xp.full_like(scores, -math.inf), scores)
                p = xp.exp(scores - lse[..., None])  # the final softmax weights of this block
                held_dv = held_dv + self._folded(xp.matmul(xp.permute_dims(p, (0, 1, 3, 2)), dout), held_dv)
                dp = xp.matmul(dout, xp.permute_dims(vv, (0, 1, 3, 2)))
                ds = p * (dp - delta[..., None]) * scale
                dq = dq + xp.matmul(ds, kk)
                held_dk = held_dk + self._folded(xp.matmul(xp.permute_dims(ds, (0, 1, 3, 2)), q), held_dk)
            if step < self.cp - 1:
                held_k, held_v, held_dk, held_dv = self._rotate(
                    [held_k, held_v, held_dk, held_dv], ["K", "V", "dK", "dV"], src, backward=True
                )
        if self.cp > 1:  # one more hop brings each chunk's gradient home
            held_dk, held_dv = self._rotate(
                [held_dk, held_dv], ["dK", "dV"], (self.r + 1) % self.cp, "{} of CP rank {} home", backward=True
            )
        return dq, held_dk, held_dv

"""Routing by a stated policy: which k experts each token picks, without looking at values.

A router picks experts from its scores, so a run whose arrays have no values (shapes only) cannot use
it. A policy decides instead, from the token's identity alone, so that every rank can work out any other
rank's choices without asking (a receiver needs to know which of the rows it got chose which of its
experts). The same policy on virtual ranks gives the same choices, so both runs send the same bytes.

    uniform      each token picks k distinct experts uniformly at random (seeded)
    balanced     a rank's token t picks experts t, t + E/k, t + 2E/k, ... mod E (E/k rounded down): every
                 expert gets the same number of a rank's tokens (give or take k), a token's picks lie E/k
                 apart, so on k different GPUs whenever a GPU holds at most E/k experts (as a router's
                 spread-out picks mostly are: the dispatch sends what a real one would), and every rank
                 routes alike, so ranks that differ only in their place can be run once (folded)
    skewed:F     with probability F a token's first pick is expert 1, a hot expert, and its other picks are
                 uniform among the rest; the other tokens pick as under uniform
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError

KINDS = ("uniform", "balanced", "skewed")


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"
    hot: float = 0.0  # skewed: the share of tokens whose first pick is the hot expert
    seed: int = 0
    # draws already made (a receiver asks for each sender's): a cache of a pure function, not state
    _made: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Routing":
        """'uniform', 'balanced' or 'skewed:F' (0 <= F <= 1), as the command line writes it."""
        kind, _, arg = text.partition(":")
        if kind not in KINDS or bool(arg) != (kind == "skewed"):
            raise UsageError(f"routing must be uniform, balanced or skewed:F (F from 0 to 1), got {text!r}")
        hot = 0.0
        if kind == "skewed":
            try:
                hot = float(arg)
            except ValueError:
                hot = -1.0
            if not 0.0 <= hot <= 1.0:
                raise UsageError(f"skewed:F needs F from 0 to 1, got {arg!r}")
        return cls(kind, hot, seed)

    def __str__(self) -> str:
        return f"skewed:{self.hot:g}" if self.kind == "skewed" else self.kind

    def choose(self, key: str, source: int, first: int, n: int, experts: int, k: int) -> np.ndarray:
        """[n, k] expert indices, best first, for tokens first .. first+n-1 of `source` (a global rank) in the
        call named `key` (layer and call number): the same answer on every rank that asks (read-only)."""
        if not 1 <= k <= experts:
            raise UsageError(f"top_k must be between 1 and the number of experts ({experts}), got {k}")
        at = (key, source, first, n, experts, k) if self.kind != "balanced" else (n, experts, k)  # alike everywhere
        if at not in self._made:
            if len(self._made) > 1024:  # a long run: forget the oldest draws
                self._made.pop(next(iter(self._made)))
            self._made[at] = out = self._draw(key, source, first, n, experts, k)
            out.flags.writeable = False
        return self._made[at]

    def _draw(self, key: str, source: int, first: int, n: int, experts: int, k: int) -> np.ndarray:
        if self.kind == "balanced":  # by the token's place on its rank alone: every rank sends alike
            g = np.arange(n)[:, None] + np.arange(k)[None, :] * (experts // k)
            return g % experts
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            self.seed, spawn_key=(source, first, *key.encode()))))
        # k distinct experts per token: the k smallest of E uniform keys, smallest first; a hot token's key
        # for expert 0 is below every other, so expert 0 comes first
        keys = gen.random((n, experts))
        if self.kind == "skewed":
            keys[gen.random(n) < self.hot, 0] = -1.0
        part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < experts else np.tile(np.arange(k), (n, 1))
        order = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
        return np.take_along_axis(part, order, axis=1)

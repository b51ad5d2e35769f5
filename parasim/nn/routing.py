"""Routing by a stated policy: which k experts each token picks, without looking at values.

A router picks experts from its scores, so a run whose arrays have no values (shapes only) cannot use
it. A policy decides instead, from the token's identity alone, so that every rank can work out any other
rank's choices without asking (a receiver needs to know which of the rows it got chose which of its
experts). The same policy on virtual ranks gives the same choices, so both runs send the same bytes.
Each policy is one entry of `POLICIES` (its spelling, what it does, whether every rank draws alike, its
draws); the command line's spellings, its help and its errors are read from there.

Node-limited routing (DeepSeek-V3's, `GroupLimit`): the experts are split into G contiguous groups, one per
node where the groups lie on nodes, and a token may pick only inside the M groups it ranks best, so its
dispatch reaches at most M nodes. A router ranks the groups by its scores (`GroupLimit.top`); a policy on a
layer with a limit draws each token's M groups (seeded like its experts: uniformly, and under skewed:F a hot
token keeps expert 1's group) and its k experts uniformly inside them. Balanced routing spreads a token's
picks over k groups by design, so it refuses a limit that keeps fewer than all of them.

Bias-balanced routing (biased:F, DeepSeek-V3's auxiliary-loss-free balancing): skewed:F's tokens, each expert's
key shifted by a per-expert bias before the k best are chosen. The bias is trained once (`learned_bias`) by
DeepSeek-V3's rule, lowered for an expert over the mean load and raised for one under it, so the hot expert
ends up with about the mean load while each token still ranks the others as skewed:F does. Under a group limit
a token keeps the groups its biased keys rank best (`GroupLimit.top`), and the bias is trained under that limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import LayoutError, UsageError


@dataclass(frozen=True)
class GroupLimit:
    """DeepSeek-V3's node-limited routing (arXiv 2412.19437, section 2.1.2; the gate of Hugging Face
    transformers' DeepseekV3TopkRouter.get_topk_indices, models/deepseek_v3/modeling_deepseek_v3.py, and of
    DeepSeek's inference/model.py Gate): E experts in `groups` contiguous groups of E / groups (config.json's
    n_group), of which each token keeps its `kept` best (topk_group) and picks its k experts there only.
    A group's score is the sum of its two best experts' scores (its one expert's, in groups of one).
    Only which experts may be chosen is DeepSeek-V3's: the scores here are the router's logits and the gates
    stay a softmax over the k chosen, where DeepSeek-V3 ranks sigmoid affinities plus its balancing bias."""

    groups: int
    kept: int

    def __post_init__(self) -> None:
        for name, v in (("groups", self.groups), ("groups kept", self.kept)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LayoutError(f"a group limit's {name} must be a positive integer, got {v!r}")
        if self.kept > self.groups:
            raise LayoutError(f"a group limit keeps 1 to {self.groups} of its {self.groups} groups, not {self.kept}")

    def __str__(self) -> str:
        return f"{self.kept} of {self.groups} groups"

    def check(self, experts: int, k: int) -> None:
        """One line unless `experts` split into the groups evenly and the groups kept hold k experts."""
        if experts % self.groups:
            raise LayoutError(
                f"{experts} experts do not split evenly into {self.groups} groups (group-limited "
                f"routing needs the number of groups to divide the number of experts)"
            )
        if k > self.kept * (experts // self.groups):
            raise LayoutError(
                f"top_k {k} is more than the {self.kept * (experts // self.groups)} experts of the "
                f"{self} a token may pick from"
            )

    def restricts(self) -> bool:
        """Whether the limit rules any expert out (keeping every group changes nothing)."""
        return self.kept < self.groups

    def top(self, scores: np.ndarray, k: int) -> np.ndarray:
        """[n, k]: each token's k best experts by `scores` [n, E] among its `kept` best groups, best first.
        Ties go to the lower index, groups and experts alike (stable sorts), so every rank picks the same."""
        n, experts = scores.shape
        per = experts // self.groups
        best = -np.sort(-scores.reshape(n, self.groups, per), axis=2)  # each group's scores, best first
        group_score = best[:, :, :2].sum(axis=2)  # [n, groups]: its two best experts' scores
        keep = np.argsort(-group_score, axis=1, kind="stable")[:, : self.kept]
        inside = np.zeros((n, self.groups), dtype=bool)
        inside[np.arange(n)[:, None], keep] = True
        # the experts of the groups kept first, then by score, best first; lexsort is stable: lower index on ties
        order = np.lexsort((-scores, ~np.repeat(inside, per, axis=1)), axis=1)
        return order[:, :k]


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"
    hot: float = 0.0  # skewed: the share of tokens whose first pick is the hot expert
    seed: int = 0
    # draws already made (a receiver asks for each sender's): a cache of a pure function, not state
    _made: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Routing":
        """A policy as the command line writes it: its name, and ':F' (a share from 0 to 1) where it takes one
        (POLICIES: 'uniform', 'balanced', 'skewed:F')."""
        kind, _, arg = text.partition(":")
        policy = POLICIES.get(kind)
        if policy is None or bool(arg) != bool(policy.share):
            raise UsageError(f"routing must be {spellings()} (F from 0 to 1), got {text!r}")
        hot = 0.0
        if policy.share:
            try:
                hot = float(arg)
            except ValueError:
                hot = -1.0
            if not 0.0 <= hot <= 1.0:
                raise UsageError(f"{kind}:F needs F from 0 to 1, got {arg!r}")
        return cls(kind, hot, seed)

    def __str__(self) -> str:
        return f"{self.kind}:{self.hot:g}" if POLICIES[self.kind].share else self.kind

    def choose(
        self, key: str, source: int, first: int, n: int, experts: int, k: int, limit: GroupLimit | None = None
    ) -> np.ndarray:
        """[n, k] expert indices, best first, for tokens first .. first+n-1 of `source` (a global rank) in the
        call named `key` (layer and call number), each token's picks inside the groups `limit` lets it keep
        (None: any expert): the same answer on every rank that asks (read-only)."""
        if not 1 <= k <= experts:
            raise UsageError(f"top_k must be between 1 and the number of experts ({experts}), got {k}")
        if limit is not None:
            limit.check(experts, k)
            if not limit.restricts():  # every group kept: the very same draws as without a limit
                limit = None
            elif POLICIES[self.kind].alike:
                limited = ", ".join(p.spelling for p in POLICIES.values() if not p.alike)
                raise UsageError(
                    f"{self.kind} routing spreads a token's picks over {k} groups of experts, so it "
                    f"cannot keep them within {limit}: route {limited} under a group limit"
                )
        # a policy that draws alike on every rank does so on every call too (and takes no limit that restricts)
        at = (n, experts, k) if POLICIES[self.kind].alike else (key, source, first, n, experts, k, limit)
        if at not in self._made:
            if len(self._made) > 1024:  # a long run: forget the oldest draws
                self._made.pop(next(iter(self._made)))
            self._made[at] = out = POLICIES[self.kind].draw(self, key, source, first, n, experts, k, limit)
            out.flags.writeable = False
        return self._made[at]


# -- the policies ------------------------------------------------------------------------------------------
# A policy's draws: (the Routing, the call's key, the sending rank, its first token, tokens, experts, k, the group
# limit or None) -> [n, k] expert indices, best first. Module functions (a mutation tester switches them).
Draw = Callable[[Routing, str, int, int, int, int, int, "GroupLimit | None"], np.ndarray]


def _draw_balanced(
    r: Routing, key: str, source: int, first: int, n: int, experts: int, k: int, limit: GroupLimit | None
) -> np.ndarray:
    """By the token's place on its rank alone, so every rank sends alike: token t picks t, t + E/k, ... mod E."""
    g = np.arange(n)[:, None] + np.arange(k)[None, :] * (experts // k)
    return g % experts


def _draw_seeded(
    r: Routing, key: str, source: int, first: int, n: int, experts: int, k: int, limit: GroupLimit | None
) -> np.ndarray:
    """k distinct experts a token, uniformly at random, seeded by the run's seed, the sender, the first token and
    the call; with a share of hot tokens (`r.hot`, skewed:F), theirs first picks expert 1 (index 0)."""
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(r.seed, spawn_key=(source, first, *key.encode()))))
    # k distinct experts per token: the k smallest of E uniform keys, smallest first; a hot token's key
    # for expert 0 is below every other, so expert 0 comes first
    keys = gen.random((n, experts))
    # each token's groups: the `kept` smallest of G uniform keys, drawn after the experts' keys (so a limit
    # only strikes out the experts of the groups not kept) and before the hot tokens (so skewed:0 draws
    # what uniform does, with a limit or without)
    group_keys = gen.random((n, limit.groups)) if limit is not None else None
    hot = gen.random(n) < r.hot if POLICIES[r.kind].share else np.zeros(n, dtype=bool)
    keys[hot, 0] = -1.0
    if limit is not None and group_keys is not None:
        group_keys[hot, 0] = -1.0  # a hot token keeps expert 0's group
        kept = np.argpartition(group_keys, limit.kept - 1, axis=1)[:, : limit.kept]
        inside = np.zeros((n, limit.groups), dtype=np.bool_)
        inside[np.arange(n)[:, None], kept] = True
        keys[~np.repeat(inside, experts // limit.groups, axis=1)] = 2.0  # above every drawn key: never picked
    part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < experts else np.tile(np.arange(k), (n, 1))
    order = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _seeded_keys(gen: np.random.Generator, n: int, experts: int, hot: float) -> np.ndarray:
    """[n, experts] keys drawn as skewed:F's without a limit (`_draw_seeded`): the smaller, the better liked; a
    share `hot` of the tokens' key for expert 1 (index 0) below every other."""
    keys = gen.random((n, experts))
    keys[gen.random(n) < hot, 0] = -1.0
    return keys


def _biased_picks(keys: np.ndarray, bias: np.ndarray, k: int, limit: GroupLimit | None) -> np.ndarray:
    """[n, k]: each token's k best experts by key minus bias, best first; under a limit, within the groups it
    keeps, ranked by the same biased keys (`GroupLimit.top`, as DeepSeek-V3's gate ranks biased scores)."""
    if limit is None:
        return _smallest(keys - bias, k)
    return limit.top(bias - keys, k)  # scores: the larger, the better


def _smallest(keys: np.ndarray, k: int) -> np.ndarray:
    """[n, k]: each row's k smallest keys' columns, smallest first."""
    n, experts = keys.shape
    part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < experts else np.tile(np.arange(k), (n, 1))
    order = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


BIAS_STEPS, BIAS_TOKENS = 128, 2048  # the balancing bias's training: steps, and the tokens of each step's batch


def learned_bias(seed: int, hot: float, experts: int, k: int, limit: GroupLimit | None = None) -> np.ndarray:
    """[experts] the per-expert bias of DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437, section
    2.1.2) for tokens drawn as skewed:`hot`'s (under `limit`, if one): each of BIAS_STEPS steps routes a fresh
    batch of BIAS_TOKENS tokens by key minus bias, then lowers the bias of every expert that got more than the
    mean (raises it where fewer) by a step size: 1/32 for the first half, then halved every 8 steps
    (DeepSeek-V3 keeps one step size and sets it to 0 near the end of training). The same bias on every rank,
    as a trained one is."""
    bias = np.zeros(experts)
    for step in range(BIAS_STEPS):
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1 << 20, step))))
        keys = _seeded_keys(gen, BIAS_TOKENS, experts, hot)
        # which experts were picked, in no order (argpartition alone where there is no limit: the quicker)
        picked = (
            np.argpartition(keys - bias, k - 1, axis=1)[:, :k]
            if limit is None and k < experts
            else _biased_picks(keys, bias, k, limit)
        )
        load = np.bincount(picked.ravel(), minlength=experts)  # each expert's picks this step
        half = BIAS_STEPS // 2
        gamma = 1 / 32 if step < half else 1 / 32 / 2 ** ((step - half) // 8 + 1)
        bias += gamma * np.sign(load.mean() - load)
    bias.flags.writeable = False
    return bias


def _draw_biased(
    r: Routing, key: str, source: int, first: int, n: int, experts: int, k: int, limit: GroupLimit | None
) -> np.ndarray:
    """skewed:F's tokens (the same keys, a share F liking expert 1 best), each picking its k best after a
    per-expert bias (`learned_bias`, trained under the same limit) is taken off every expert's key: the bias
    only chooses, as DeepSeek-V3's does (its gates stay the router's). With the bias zeroed and no limit it
    picks what skewed:F picks; under a limit it ranks the groups by the biased keys, where skewed:F draws them."""
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(r.seed, spawn_key=(source, first, *key.encode()))))
    # the bias is trained once per policy object and shape, kept with the policy's other draws (not in the module)
    at = ("bias", experts, k, limit)
    bias = r._made.get(at)
    if bias is None:
        bias = r._made[at] = learned_bias(r.seed, r.hot, experts, k, limit)
    return _biased_picks(_seeded_keys(gen, n, experts, r.hot), bias, k, limit)


@dataclass(frozen=True)
class Policy:
    """One routing policy: how the command line spells it, what it does (one line for a help text), whether it
    takes a share F ('name:F'), whether every rank draws alike (what a folded run needs; such a policy takes no
    group limit that restricts), and its draws."""

    spelling: str
    what: str
    share: bool
    alike: bool
    draw: Draw


POLICIES: dict[str, Policy] = {
    "uniform": Policy(
        "uniform", "each token picks k distinct experts uniformly at random (seeded)", False, False, _draw_seeded
    ),
    # a token's picks lie E/k apart, so on k different GPUs whenever a GPU holds at most E/k experts (as a
    # router's spread-out picks mostly are: the dispatch sends what a real one would); every expert gets the
    # same number of a rank's tokens (give or take k)
    "balanced": Policy(
        "balanced",
        "a rank's token t picks experts t, t + E/k, ... mod E: every expert as busy, "
        "every rank alike (a folded run needs it)",
        False,
        True,
        _draw_balanced,
    ),
    "skewed": Policy(
        "skewed:F",
        "a share F of the tokens pick expert 1 first (a hot expert), the rest as uniform",
        True,
        False,
        _draw_seeded,
    ),
    "biased": Policy(
        "biased:F",
        "skewed:F's tokens, each expert's score shifted by a bias learned as DeepSeek-V3's loss-free balancing "
        "does (lowered while the expert is over the mean load, raised while under): the hot expert's load evened",
        True,
        False,
        _draw_biased,
    ),
}


def spellings() -> str:
    """The policies as the command line writes them: 'uniform, balanced or skewed:F'."""
    names = [p.spelling for p in POLICIES.values()]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def policy_help() -> str:
    """Each policy and what it does, for a help text."""
    return "; ".join(f"{p.spelling}: {p.what}" for p in POLICIES.values())

"""The post's rules of thumb held against a plan (`parasim memory --critic`): each rule the layout breaks, and
what breaking it costs here, computed, never asserted: the same GPUs, model, batch and training choices with the
rule followed, timed by the clock's plan (clock/plan.py) and sized by the estimator (estimate/memory.py).

One entry per rule (RULES): what it says, when a plan breaks it, and the nearest plan that follows it. Following
a rule can cost time where it saves memory (SP's backward gathers again), or the reverse: the finding gives both
figures and lets the numbers say which way this layout goes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..errors import UsageError
from ..estimate.memory import Plan


@dataclass(frozen=True)
class Rule:
    """One rule of thumb: its name, the rule in words, why it holds, when `plan` of `model` breaks it, and the
    nearest plan on the same GPUs that follows it."""

    name: str
    says: str
    why: str
    broken: Callable[[Any, Plan], bool]
    follow: Callable[[Any, Plan], Plan]


def _tp_inside(model: Any, plan: Plan) -> Plan:
    """TP cut to a node's GPUs, the rest of the GPUs given to DP (the global batch kept)."""
    tp = plan.gpus_per_node
    dp = plan.dp * plan.tp // tp
    return replace(plan, tp=tp, dp=dp, microbatches=max(1, plan.m * plan.dp // dp))


RULES: tuple[Rule, ...] = (
    Rule(
        "tp-inside-a-node",
        "keep TP inside a node",
        "TP's collectives run inside every layer, forward and backward: over the network they wait on a "
        "link several times slower than NVLink",
        lambda m, p: p.tp > p.gpus_per_node,
        _tp_inside,
    ),
    Rule(
        "sp-with-tp",
        "turn SP on wherever TP is",
        "forward, the same bytes on the wire (an all-reduce is a reduce-scatter and an all-gather; backward "
        "gathers the saved inputs again, a quarter more: lesson rules-of-thumb), and the activations between the "
        "matrix products divided by TP",
        lambda m, p: p.tp > 1 and not p.sp,
        lambda m, p: replace(p, sp=True),
    ),
    Rule(
        "zero-1",
        "shard the optimizer state over the data-parallel GPUs (ZeRO-1)",
        "the gradients' all-reduce becomes a reduce-scatter and the updated weights' all-gather, the same bytes, "
        "and Adam's state is divided by DP x CP",
        lambda m, p: p.dp * p.cp > 1 and p.zero == 0,
        lambda m, p: replace(p, zero=1),
    ),
    Rule(
        "ep-inside-a-node",
        "keep EP inside a node",
        "every MoE layer sends its tokens to their experts and back, forward and backward: across nodes at the "
        "network's bandwidth",
        lambda m, p: bool(m.experts) and p.ep > p.gpus_per_node,
        lambda m, p: replace(p, ep=p.gpus_per_node),
    ),
    # the post's "ETP 1" is left out: the clock's plan does not time ETP's own collectives, so it could only
    # ever show that rule's memory, never its cost
)


@dataclass(frozen=True)
class Finding:
    """A rule `plan` breaks: the plan that follows it, and both plans' step and memory on the busiest GPU."""

    rule: Rule
    followed: Plan | None  # None: no plan on these GPUs follows it (`why_not` says why)
    step_s: float | None
    followed_step_s: float | None
    memory: float
    followed_memory: float | None
    why_not: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "says": self.rule.says,
            "why": self.rule.why,
            "followed": None if self.followed is None else self.followed.label(),
            "step_s": self.step_s,
            "followed_step_s": self.followed_step_s,
            "memory_bytes": self.memory,
            "followed_memory_bytes": self.followed_memory,
            "why_not": self.why_not or None,
        }


def critique(model: Any, plan: Plan, seq: int, gpu: str, overlap: tuple[str, ...] = ()) -> list[Finding]:
    """Every rule of RULES that `plan` breaks, each with what following it would change here."""
    from .plan import plan_time
    from ..estimate.kernels import NoMeasurement
    from ..estimate.memory import breakdown

    def timed(p: Plan) -> float | None:
        try:
            return plan_time(model, p, seq, gpu, overlap)["step_s"]
        except NoMeasurement:  # a GPU type without the kernels measured: memory only
            return None

    out = []
    mine_step, mine_memory = timed(plan), breakdown(model, plan, seq).total
    for rule in RULES:
        if not rule.broken(model, plan):
            continue
        try:
            followed = rule.follow(model, plan).check(model, seq)  # a layout the model allows, or refused
            out.append(
                Finding(rule, followed, mine_step, timed(followed), mine_memory, breakdown(model, followed, seq).total)
            )
        except UsageError as exc:
            out.append(Finding(rule, None, mine_step, None, mine_memory, None, why_not=str(exc)))
    return out

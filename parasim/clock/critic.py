"""The post's rules of thumb held against a plan (`parasim check-layout`, `parasim memory --critic`): each rule the
layout breaks, and what breaking it costs here, computed, never asserted: the same GPUs, model, batch and training
choices with the rule followed, timed by the clock's plan (clock/plan.py) and sized by the estimator
(estimate/memory.py).

One entry per rule (RULES): what it says, when a plan breaks it, and the nearest plan that follows it. Following
a rule can cost time where it saves memory (SP's backward gathers again, PP's bubble), or the reverse: the finding
gives both figures and lets the numbers say which way this layout goes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..errors import UsageError
from ..estimate.memory import Plan
from ..layout.axes import SIZED


@dataclass(frozen=True)
class Case:
    """What a rule is held against: the model, the plan, the sequence and the bytes a GPU has for training."""

    model: Any
    plan: Plan
    seq: int
    usable: float

    def memory(self) -> float:
        from ..estimate.memory import breakdown

        return breakdown(self.model, self.plan, self.seq).total


@dataclass(frozen=True)
class Rule:
    """One rule of thumb: its name, the rule in words, why it holds, when a case breaks it, and the nearest plan
    on the same GPUs that follows it (raising UsageError, in words, where none does)."""

    name: str
    says: str
    why: str
    broken: Callable[[Case], bool]
    follow: Callable[[Case], Plan]


def _tp_inside(c: Case) -> Plan:
    """TP cut to a node's GPUs, the rest of the GPUs given to DP (the global batch kept)."""
    p = c.plan
    tp = p.gpus_per_node
    dp = p.dp * p.tp // tp
    return replace(p, tp=tp, dp=dp, microbatches=max(1, p.m * p.dp // dp))


def _model_parallel_spans_nodes(c: Case) -> bool:
    p = c.plan
    return p.tp * p.cp > p.gpus_per_node


def _pp_across(c: Case) -> Plan:
    """TP (then CP) cut until the two fit in a node, the factor taken given to PP: each node then a stage (or
    several), only the hand-offs between stages crossing. DP and each replica's micro-batches kept."""
    p = c.plan
    tp, cp, pp = p.tp, p.cp, p.pp
    while tp * cp > p.gpus_per_node:
        if tp > 1 and tp % 2 == 0:
            tp //= 2
        elif cp % 2 == 0:
            cp //= 2
        else:
            raise UsageError(f"TP {p.tp} x CP {p.cp} halves to no size that fits a node of {p.gpus_per_node}")
        pp *= 2
    return replace(p, tp=tp, cp=cp, pp=pp, microbatches=p.m)


def _cp_long(c: Case) -> bool:
    """A sequence too long for a GPU: the plan does not fit, and what overflows is the sequence's (activations
    and logits outweigh the model's state)."""
    from ..estimate.memory import breakdown

    if c.plan.cp > 1:
        return False
    bd = breakdown(c.model, c.plan, c.seq)
    return bd.total > c.usable and bd.total - bd.model_state > bd.model_state


def _cp_two(c: Case) -> Plan:
    """CP 2 taken from DP (the global batch kept: each replica's micro-batches double): each GPU then holds half
    of a sequence's tokens. Taken from TP it would not help: TP x CP, each GPU's share of the tokens, stays."""
    p = c.plan
    if p.dp % 2 == 0:
        return replace(p, cp=2, dp=p.dp // 2, microbatches=p.m * 2)
    raise UsageError(
        f"CP needs GPUs of its own, and DP {p.dp} does not halve; CP 2 taken from TP would leave each GPU the "
        "same share of the sequence and twice the weights: more GPUs, or a shorter sequence"
    )


def _few_microbatches(c: Case) -> bool:
    """Fewer micro-batches than stages: 1F1B's bubble, (p - 1)/(m + p - 1), is then half the step or more."""
    return c.plan.pp > 1 and c.plan.m < c.plan.pp


def _enough_microbatches(c: Case) -> Plan:
    """A replica's sequences a step (m x micro-batch) cut into the fewest micro-batches that are at least p."""
    p = c.plan
    sequences = p.m * p.micro_batch
    if sequences < p.pp:
        raise UsageError(
            f"a replica's {sequences} sequence{'s' * (sequences != 1)} a step make fewer micro-batches than "
            f"its {p.pp} stages: a larger global batch, or fewer stages"
        )
    # the counts tried are bounded (a size may be 10^12): from p to twice p and a little more
    for m in range(p.pp, min(sequences, 2 * p.pp + 1024) + 1):
        if sequences % m == 0:
            return replace(p, microbatches=m, micro_batch=sequences // m)
    raise UsageError(
        f"a replica's {sequences:,} sequences a step split evenly into no count of micro-batches from its "
        f"{p.pp} stages to {2 * p.pp + 1024:,}: give --microbatches and --micro-batch that do"
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "tp-inside-a-node",
        "keep TP inside a node",
        "TP's collectives run inside every layer, forward and backward: over the network they wait on a "
        "link several times slower than NVLink",
        lambda c: c.plan.tp > c.plan.gpus_per_node,
        _tp_inside,
    ),
    Rule(
        "sp-with-tp",
        "turn SP on wherever TP is",
        "forward, the same bytes on the wire (an all-reduce is a reduce-scatter and an all-gather; backward "
        "gathers the saved inputs again, a quarter more: lesson rules-of-thumb), and the activations between the "
        "matrix products divided by TP",
        lambda c: c.plan.tp > 1 and not c.plan.sp,
        lambda c: replace(c.plan, sp=True),
    ),
    Rule(
        "cp-for-long-sequences",
        "split a sequence too long for a GPU with CP",
        "CP divides every activation of the layer by its size, K and V passing round a ring that overlaps "
        "with attention; here the activations, not the model's state, are what does not fit",
        _cp_long,
        _cp_two,
    ),
    Rule(
        "pp-across-nodes",
        "span nodes with PP, not TP or CP",
        "between stages only one activation a micro-batch crosses (and its gradient back), where TP's and "
        "CP's collectives cross in every layer",
        _model_parallel_spans_nodes,
        _pp_across,
    ),
    Rule(
        "pp-enough-microbatches",
        "give PP at least as many micro-batches as stages",
        "1F1B's bubble is (p - 1)/(m + p - 1) of the step: with fewer micro-batches than stages, every GPU "
        "idles half the step or more",
        _few_microbatches,
        _enough_microbatches,
    ),
    Rule(
        "zero-1",
        "shard the optimizer state over the data-parallel GPUs (ZeRO-1)",
        "the gradients' all-reduce becomes a reduce-scatter and the updated weights' all-gather, the same bytes, "
        "and Adam's state is divided by DP x CP",
        lambda c: c.plan.dp * c.plan.cp > 1 and c.plan.zero == 0,
        lambda c: replace(c.plan, zero=1),
    ),
    Rule(
        "ep-inside-a-node",
        "keep EP inside a node",
        "every MoE layer sends its tokens to their experts and back, forward and backward: across nodes at the "
        "network's bandwidth",
        lambda c: bool(c.model.experts) and c.plan.ep > c.plan.gpus_per_node,
        lambda c: replace(c.plan, ep=c.plan.gpus_per_node),
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
    # what following the rule changes of the plan, as the flags name it: ("microbatches", 2, 4), ...
    changes: tuple[tuple[str, Any, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "changes": {name: [was, now] for name, was, now in self.changes},
            "says": self.rule.says,
            "why": self.rule.why,
            "followed": None if self.followed is None else self.followed.label(),
            "step_s": self.step_s,
            "followed_step_s": self.followed_step_s,
            "memory_bytes": self.memory,
            "followed_memory_bytes": self.followed_memory,
            "why_not": self.why_not or None,
        }


# the plan's fields a rule may move: every sized axis (layout/axes.py's table), and SP, ZeRO and the batch's cut
CHANGED = (*SIZED, "sp", "zero", "micro_batch", "m")


def _changes(plan: Plan, followed: Plan) -> tuple[tuple[str, Any, Any], ...]:
    return tuple(
        (name, getattr(plan, name), getattr(followed, name))
        for name in CHANGED
        if getattr(plan, name) != getattr(followed, name)
    )


def _timer(model: Any, seq: int, gpu: str, overlap: tuple[str, ...]) -> Callable[[Plan], float | None]:
    """A plan's step in seconds on the clock's plan, or None on a GPU type without its kernels measured."""
    from .plan import plan_time
    from ..estimate.kernels import NoMeasurement

    def timed(p: Plan) -> float | None:
        try:
            return plan_time(model, p, seq, gpu, overlap)["step_s"]
        except NoMeasurement:  # memory only
            return None

    return timed


def critique(
    model: Any, plan: Plan, seq: int, gpu: str, overlap: tuple[str, ...] = (), usable: float | None = None
) -> list[Finding]:
    """Every rule of RULES that `plan` breaks, each with what following it would change here. `usable`: the
    bytes a GPU has for training (default: the GPU type's, estimate/hardware.py)."""
    from ..estimate.memory import breakdown
    from ..estimate.traffic import gpu_spec

    timed = _timer(model, seq, gpu, overlap)
    case = Case(model, plan, seq, gpu_spec(gpu).usable if usable is None else usable)
    out = []
    mine_step, mine_memory = timed(plan), case.memory()
    for rule in RULES:
        if not rule.broken(case):
            continue
        try:
            followed = rule.follow(case).check(model, seq)  # a layout the model allows, or refused
            out.append(
                Finding(
                    rule,
                    followed,
                    mine_step,
                    timed(followed),
                    mine_memory,
                    breakdown(model, followed, seq).total,
                    changes=_changes(plan, followed),
                )
            )
        except UsageError as exc:
            out.append(Finding(rule, None, mine_step, None, mine_memory, None, why_not=str(exc)))
    return out


@dataclass(frozen=True)
class LayoutCheck:
    """`parasim check-layout`: a plan held to every rule of RULES, each kept or broken (with its finding), and
    the plan's own step and memory on its busiest GPU."""

    model: str
    plan: Plan
    seq: int
    gpu: str
    usable: float
    step_s: float | None
    memory: float
    findings: list[Finding]

    @property
    def kept(self) -> list[Rule]:
        broken = {f.rule.name for f in self.findings}
        return [r for r in RULES if r.name not in broken]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layout": self.plan.label(),
            "seq": self.seq,
            "gpu": self.gpu,
            "usable_bytes": self.usable,
            "step_s": self.step_s,
            "memory_bytes": self.memory,
            "broken": [f.to_dict() for f in self.findings],
            "kept": [{"rule": r.name, "says": r.says, "why": r.why} for r in self.kept],
        }


def check_layout(
    model: Any, plan: Plan, seq: int, gpu: str, overlap: tuple[str, ...] = (), usable: float | None = None
) -> LayoutCheck:
    """`plan` of `model` at `seq` on `gpu` held to every rule of thumb: what `parasim check-layout` prints."""
    from ..estimate.memory import breakdown
    from ..estimate.traffic import gpu_spec

    room = gpu_spec(gpu).usable if usable is None else usable
    return LayoutCheck(
        model.name,
        plan,
        seq,
        gpu,
        room,
        _timer(model, seq, gpu, overlap)(plan),
        breakdown(model, plan, seq).total,
        critique(model, plan, seq, gpu, overlap, room),
    )

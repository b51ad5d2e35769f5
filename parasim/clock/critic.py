"""The post's rules of thumb held against a plan (`parasim check-layout`, `parasim memory --critic`): each rule the
layout breaks, and what breaking it costs here, computed, never asserted: the same GPUs, model, batch and training
choices with the rule followed, timed by the clock's plan (clock/plan.py) and sized by the estimator
(estimate/memory.py).

One entry per rule (RULES): what it says, when a plan breaks it, and the nearest plan that follows it. Following
a rule can cost time where it saves memory (SP's backward gathers again, PP's bubble), or the reverse: the finding
gives both figures and lets the numbers say which way this layout goes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, Callable, Sequence

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
    """One rule of thumb: its name, the rule in words, why it holds, when a case breaks it, and the plans on the
    same GPUs that follow it, nearest first (raising UsageError, in words, where none does; `critique` takes the
    nearest that fits, trying ZeRO-1 and more stages where none of them does). `note`: what the step and memory
    shown leave out for this rule, in words, and figures (what, bytes) that count it."""

    name: str
    says: str
    why: str
    broken: Callable[[Case], bool]
    follow: Callable[[Case], Sequence[Plan]]
    note: Callable[[Case], tuple[str, tuple[tuple[str, float], ...]]] | None = None


class ScoredPlan(Plan):
    """A plan `check-layout` and `memory --critic` hold to the rules of thumb although Megatron-Core refuses it: an
    MoE model under TP without SP. Refusing it would hide what it costs; here it is the broken rule "SP with TP",
    its cost computed. Every other layout rule still holds, and a plan made from it (dataclasses.replace, as
    each rule's follow makes one) stays a ScoredPlan: following another rule does not turn SP on."""

    moe_needs_sp = False


def scored(plan: Plan) -> Plan:
    """`plan` as a ScoredPlan (before its model is attached: `Plan.check` is what would refuse it)."""
    return ScoredPlan(**{f.name: getattr(plan, f.name) for f in fields(Plan) if f.init})


def _made(*makers: Callable[[], Plan]) -> tuple[Plan, ...]:
    """The plans `makers` make that the layout rules allow (a maker raises UsageError where they do not), in
    order; where none is allowed, the first one's refusal."""
    out, refused = [], []
    for make in makers:
        try:
            out.append(make())
        except UsageError as exc:
            refused.append(exc)
    if not out:
        raise refused[0]
    return tuple(out)


def _tp_inside(c: Case) -> tuple[Plan, ...]:
    """TP cut to a node's GPUs, the rest of the GPUs given to DP (the global batch kept)."""
    p = c.plan
    tp = p.gpus_per_node
    dp = p.dp * p.tp // tp
    return (replace(p, tp=tp, dp=dp, microbatches=max(1, p.m * p.dp // dp)),)


def _model_parallel_spans_nodes(c: Case) -> bool:
    p = c.plan
    return p.tp * p.cp > p.gpus_per_node


def _pp_across(c: Case) -> tuple[Plan, ...]:
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
    return (replace(p, tp=tp, cp=cp, pp=pp, microbatches=p.m),)


def _cp_long(c: Case) -> bool:
    """A sequence too long for a GPU: the plan does not fit, and what overflows is the sequence's (activations
    and logits outweigh the model's state)."""
    from ..estimate.memory import breakdown

    if c.plan.cp > 1:
        return False
    bd = breakdown(c.model, c.plan, c.seq)
    return bd.total > c.usable and bd.total - bd.model_state > bd.model_state


def _cp_two(c: Case) -> tuple[Plan, ...]:
    """CP 2 taken from DP (the global batch kept: each replica's micro-batches double): each GPU then holds half
    of a sequence's tokens. Taken from TP it would not help: TP x CP, each GPU's share of the tokens, stays."""
    p = c.plan
    if p.dp % 2 == 0:
        return (replace(p, cp=2, dp=p.dp // 2, microbatches=p.m * 2),)
    raise UsageError(
        f"CP needs GPUs of its own, and DP {p.dp} does not halve; CP 2 taken from TP would leave each GPU the "
        "same share of the sequence and twice the weights: more GPUs, or a shorter sequence"
    )


def _few_microbatches(c: Case) -> bool:
    """Fewer micro-batches than stages: 1F1B's bubble, (p - 1)/(m + p - 1), is then half the step or more."""
    return c.plan.pp > 1 and c.plan.m < c.plan.pp


def _enough_microbatches(c: Case) -> tuple[Plan, ...]:
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
            return (replace(p, microbatches=m, micro_batch=sequences // m),)
    raise UsageError(
        f"a replica's {sequences:,} sequences a step split evenly into no count of micro-batches from its "
        f"{p.pp} stages to {2 * p.pp + 1024:,}: give --microbatches and --micro-batch that do"
    )


def _etp_one(c: Case) -> tuple[Plan, ...]:
    """ETP 1, the GPUs it frees taken by EP (EP x ETP ranks, each GPU then holding E/(EP x ETP) whole experts: as
    many expert weights as before) or by EDP (EP kept: each GPU holds E/EP whole experts, ETP times the expert
    weights, each expert's gradients reduced over ETP times the GPUs). EP first, as the nearer in memory, unless
    the wider EP would span nodes."""
    p = c.plan
    wider = p.ep * p.etp
    by_ep = lambda: replace(p, etp=1, ep=wider)  # noqa: E731
    by_edp = lambda: replace(p, etp=1)  # noqa: E731
    # a wider EP past a node would break "EP inside a node" (or break it further): EDP takes the GPUs there,
    # so following this rule never sends a learner round to the EP rule and back
    past_node = wider > p.gpus_per_node
    return _made(by_edp, by_ep) if past_node else _made(by_ep, by_edp)


def _routed(c: Case) -> float:
    """Tokens one GPU routes to the experts in a micro-batch (clock/plan.py's count): its CP share of the
    micro-batch's sequences, and under SP its TP rank's share of those."""
    p = c.plan
    return p.micro_batch * c.seq / p.cp / (p.tp if p.sp else 1)


def _etp_note(c: Case) -> tuple[str, tuple[tuple[str, float], ...]]:
    """What ETP > 1 sends that the step shown does not time: its all-gathers and reduce-scatters of the routed
    tokens (estimate/traffic.etp_traffic, Megatron-Core's dispatcher), one MoE layer's and the busiest stage's in
    a step (its MoE layers x the replica's micro-batches)."""
    from ..estimate.traffic import etp_traffic
    from ..layout.stages import most_layers, stage_layers

    p, m = c.plan, c.model
    sent = etp_traffic(m.hidden, _routed(c), m.top_k, p.etp, p.dtypes.bytes("activations"), p.recompute == "full")
    layer = sum(sent.values())
    _, moe = stage_layers(m, p.pp, most_layers(m, p.pp))
    return (
        f"The step shown for ETP {p.etp} leaves out its own collectives and its narrower products (the clock runs "
        "every expert whole on its GPU); what its all-gather and reduce-scatter of the routed tokens over the ETP "
        "group send, forward and again backward",
        (("a GPU each MoE layer and micro-batch", layer), ("a step on the busiest stage", layer * int(moe) * p.m)),
    )


def _moe_without_sp(c: Case) -> bool:
    """Megatron-Core's refusal (layout/mesh.py): an MoE model under TP without SP."""
    return bool(c.model.experts) and c.model.experts > 1 and c.plan.tp > 1 and not c.plan.sp


def _sp_note(c: Case) -> tuple[str, tuple[tuple[str, float], ...]]:
    """Where Megatron-Core would refuse the plan, that its own figures are the estimator's for a layout no run
    makes."""
    if not _moe_without_sp(c):
        return "", ()
    return (
        "Megatron-Core refuses an MoE model under TP without SP, so no run trains this layout as given: its own "
        "step and memory are the estimator's for it as written, each TP rank routing all of its tokens",
        (),
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
        lambda c: (replace(c.plan, sp=True),),
        _sp_note,
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
        lambda c: (replace(c.plan, zero=1),),
    ),
    Rule(
        "ep-inside-a-node",
        "keep EP inside a node",
        "every MoE layer sends its tokens to their experts and back, forward and backward: across nodes at the "
        "network's bandwidth",
        lambda c: bool(c.model.experts) and c.plan.ep > c.plan.gpus_per_node,
        lambda c: (replace(c.plan, ep=c.plan.gpus_per_node),),
    ),
    Rule(
        "etp-1",
        "keep each expert whole on its GPU (ETP 1)",
        "cutting an expert's matrices over ETP GPUs gathers its tokens and scatters its outputs inside every MoE "
        "layer, forward and backward, and leaves each GPU narrower, slower products: the GPUs do more as EP, or "
        "as expert data parallelism. The clock times experts whole, so ETP's cost is given in bytes, not seconds",
        lambda c: bool(c.model.experts) and c.plan.etp > 1,
        _etp_one,
        _etp_note,
    ),
)

# what critique tries, where no plan a rule's follow gives fits: each of them with ZeRO-1, with twice the stages,
# then with both, in words
ROOMIER = "ZeRO-1, twice the pipeline stages from half the DP, or both"


def _same(p: Plan) -> Plan:
    return p


def _roomier(p: Plan) -> tuple[Callable[[], Plan], ...]:
    """Two moves that cut what a GPU holds, then both: ZeRO-1 (Adam's state sharded over the data-parallel GPUs,
    the same bytes on the wire) where the plan runs ZeRO-0 with DP; and twice the stages from half the DP (each
    GPU holds half the layers; the global batch kept: each replica's micro-batches double). Neither moves TP,
    CP, EP or ETP, nor leaves fewer micro-batches than stages where there were enough, so a plan that followed a
    rule still does."""
    zero = p.zero == 0 and (p.dp * p.cp > 1 or p.edp > 1)
    deeper = p.dp % 2 == 0
    out: list[Callable[[], Plan]] = []
    if zero:
        out.append(lambda: replace(p, zero=1))
    if deeper:
        out.append(lambda: replace(p, pp=2 * p.pp, dp=p.dp // 2, microbatches=2 * p.m))
    if zero and deeper:
        out.append(lambda: replace(p, zero=1, pp=2 * p.pp, dp=p.dp // 2, microbatches=2 * p.m))
    return tuple(out)


@dataclass(frozen=True)
class Finding:
    """A rule `plan` breaks: the plan that follows it, and both plans' step and memory on the busiest GPU.

    `followed` is the nearest plan that follows the rule and fits the GPU's usable bytes; where the nearest does
    not fit, `nearest` is it (with its memory and changes) and `followed` the one that fits; where none fits,
    `followed` is the nearest and `fits` False, `tried` the layouts tried beside it."""

    rule: Rule
    followed: Plan | None  # None: no plan on these GPUs follows it (`why_not` says why)
    step_s: float | None
    followed_step_s: float | None
    memory: float
    followed_memory: float | None
    why_not: str = ""
    # what following the rule changes of the plan, as the flags name it: ("microbatches", 2, 4), ...
    changes: tuple[tuple[str, Any, Any], ...] = ()
    usable: float | None = None  # the bytes a GPU has for training, that `fits` holds the followed plan to
    fits: bool | None = None  # None where no plan follows it
    nearest: Plan | None = None
    nearest_memory: float | None = None
    nearest_changes: tuple[tuple[str, Any, Any], ...] = ()
    tried: tuple[str, ...] = ()  # where none fits: the labels of the other plans tried that follow it
    note: str = ""  # what the figures leave out, in words (the rule's note), followed by `figures`
    # the other rules the plan shown still breaks (what a learner following one rule at a time meets next)
    still_broken: tuple[str, ...] = ()
    figures: tuple[tuple[str, float], ...] = ()  # (what, bytes)

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
            "usable_bytes": self.usable,
            "followed_fits": self.fits,
            "nearest": None if self.nearest is None else self.nearest.label(),
            "nearest_changes": {name: [was, now] for name, was, now in self.nearest_changes},
            "nearest_memory_bytes": self.nearest_memory,
            "tried": list(self.tried),
            "why_not": self.why_not or None,
            "note": self.note or None,
            "figures": [{"what": what, "bytes": v} for what, v in self.figures],
            "still_broken": list(self.still_broken),
        }


# the plan's fields a rule may move: every sized axis (layout/axes.py's table), and SP, ZeRO and the batch's cut;
# EDP too where the model has experts (what EP and ETP leave of the GPUs: following EP's or ETP's rule moves it)
CHANGED = (*SIZED, "sp", "zero", "micro_batch", "m")


def _changes(plan: Plan, followed: Plan) -> tuple[tuple[str, Any, Any], ...]:
    names = (*CHANGED, "edp") if plan.model is not None and plan.model.experts else CHANGED
    return tuple(
        (name, getattr(plan, name), getattr(followed, name))
        for name in names
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
    bytes a GPU has for training (default: the GPU type's, estimate/hardware.py).

    The fit test is here, for every rule: of the plans a rule's follow gives (nearest first), each followed by
    itself made roomier (`_roomier`), the first that the layout rules allow and that fits `usable` is shown; where none
    fits, the nearest, said not to fit (the post's "if possible": here the rule cannot be followed without
    running out of memory)."""
    from ..estimate.memory import breakdown
    from ..estimate.traffic import gpu_spec

    timed = _timer(model, seq, gpu, overlap)
    case = Case(model, plan, seq, gpu_spec(gpu).usable if usable is None else usable)
    out = []
    mine_step, mine_memory = timed(plan), case.memory()
    for rule in RULES:
        if not rule.broken(case):
            continue
        note, figures = ("", ()) if rule.note is None else rule.note(case)
        # this plan's own figures, and what they leave out, whatever follows
        mine = partial(
            Finding, rule, step_s=mine_step, memory=mine_memory, usable=case.usable, note=note, figures=figures
        )
        try:
            own = rule.follow(case)
        except UsageError as exc:
            out.append(mine(None, followed_step_s=None, followed_memory=None, why_not=str(exc)))
            continue
        # each plan the rule gives, then that plan made roomier, before the next: the rule's own order of
        # preference holds (ETP's GPUs to EDP rather than to an EP across nodes, even where EDP needs ZeRO-1)
        makers: list[Callable[[], Plan]] = []
        for p in own:
            makers += [partial(_same, p), *_roomier(p)]
        sized: list[tuple[Plan, float]] = []  # plans that follow it, with their memory, in the order tried
        refused: list[str] = []
        for make in makers:
            try:
                p = make().check(model, seq)  # a layout the model allows, or refused
            except UsageError as exc:
                refused.append(str(exc))
                continue
            sized.append((p, breakdown(model, p, seq).total))
            if sized[-1][1] <= case.usable:
                break
        if not sized:
            out.append(mine(None, followed_step_s=None, followed_memory=None, why_not=refused[0]))
            continue
        fits = sized[-1][1] <= case.usable
        (followed, memory), (first, first_memory) = (sized[-1] if fits else sized[0]), sized[0]
        moved = followed is not first
        out.append(
            mine(
                followed,
                followed_step_s=timed(followed),
                followed_memory=memory,
                changes=_changes(plan, followed),
                fits=fits,
                nearest=first if moved else None,
                nearest_memory=first_memory if moved else None,
                nearest_changes=_changes(plan, first) if moved else (),
                tried=() if fits else tuple(p.label() for p, _ in sized[1:]),
                still_broken=tuple(
                    r.name for r in RULES if r is not rule and r.broken(Case(model, followed, seq, case.usable))
                ),
            )
        )
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

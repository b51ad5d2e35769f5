"""The overlap switches frameworks offer, one registry for the whole clock: each entry says what it runs beside
what, how Megatron-LM or FSDP names it, and where parasim models it: on a run's trace (clock/timeline.py:
the events it moves and how), in a plan's step (clock/plan.py: the time it hides), or both. A switch asked
for where it is not modelled is refused with the reason (`parse`), never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError

TRACE, PLAN = "trace", "plan"  # where a switch applies: a run's events, or a plan's step
DP_GROUPS = ("dp", "dp-cp", "expert-dp")  # the data-parallel groups (Megatron-Core's names)


def _is_grad_reduce(e: Any, paired: set[str]) -> bool:
    return e.kind == "collective" and e.group.name in DP_GROUPS and e.op in ("reduce_scatter", "all_reduce")


def _is_param_gather(e: Any, paired: set[str]) -> bool:
    return e.kind == "collective" and e.group.name in DP_GROUPS and e.op == "all_gather"


def _in_a_pair(e: Any, paired: set[str]) -> bool:
    return e.kind != "compute" and e.phase in paired


@dataclass(frozen=True)
class Overlap:
    """A switch: what it runs beside what, its frameworks' name, where parasim models it and, where not, why."""

    name: str
    flag: str  # as Megatron or FSDP names it
    what: str
    applies: frozenset[str]  # TRACE, PLAN or both
    # on a trace: which events it moves (event, the phases a program marked as paired chunks), and how:
    # "async": the rank goes on computing and never waits for it; "early": issued before the compute that comes
    # before it (the next layer's weights gathered while this one computes); "paired": async inside a paired
    # phase, and the rank waits for it when the phase ends
    picks: Callable[[Any, set[str]], bool] | None = None
    how: str | None = None
    not_on_trace: str = ""  # why a trace has nothing for it to move
    not_in_plan: str = ""  # why a plan's step has nothing for it to hide

    def moves(self, e: Any, paired: set[str]) -> bool:
        """Whether this switch moves the trace's event `e` (a switch modelled only in a plan moves none)."""
        return self.picks is not None and self.picks(e, paired)


OVERLAPS: dict[str, Overlap] = {
    o.name: o
    for o in (
        Overlap(
            "grad-reduce",
            "--overlap-grad-reduce (Megatron), FSDP's reduce-scatter",
            "data-parallel gradient reductions run while the backward pass goes on",
            frozenset((TRACE, PLAN)),
            _is_grad_reduce,
            "async",
        ),
        Overlap(
            "prefetch",
            "--overlap-param-gather (Megatron), FSDP's forward/backward prefetch",
            "a sharded optimizer's (ZeRO-3's) weight all-gathers start while the layer before computes",
            frozenset((TRACE, PLAN)),
            _is_param_gather,
            "early",
        ),
        Overlap(
            "dualpipe",
            "DualPipe / DualPipeV (DeepSeek-V3): a forward and a backward chunk paired",
            "one chunk's communication runs beside the other's compute: on a run's trace, in a phase the "
            "program marks as a pair (ctx.phase(..., pair=k)), both streams meeting at the pair's end; in a "
            "plan's step, the EP all-to-alls and the pipeline's sends behind the paired chunk's compute",
            frozenset((TRACE, PLAN)),
            _in_a_pair,
            "paired",
        ),
        Overlap(
            "tp",
            "--tp-comm-overlap (Megatron), async TP (torchtitan)",
            "TP collectives run beside the layer's products",
            frozenset((PLAN,)),
            not_on_trace="a run's layer waits for each TP collective before the product that needs its result: "
            "the trace has no split of a product for the collective to hide behind",
        ),
        Overlap(
            "p2p",
            "--overlap-p2p-communication (Megatron; its default under interleaved 1F1B)",
            "pipeline sends run beside compute",
            frozenset((PLAN,)),
            not_on_trace="a run's schedule sends each stage's activations when the stage needs them sent: the "
            "trace clock keeps the schedule's order",
        ),
        Overlap(
            "cp",
            "ring attention's K/V exchange (TransformerEngine)",
            "CP's K/V ring runs beside the attention it feeds",
            frozenset((PLAN,)),
            not_on_trace="a run's ring attention waits for each K/V block before the attention on it",
        ),
    )
}


def names(where: str) -> tuple[str, ...]:
    """The switches modelled `where` (TRACE or PLAN), in the registry's order."""
    return tuple(n for n, o in OVERLAPS.items() if where in o.applies)


def parse(text: str, where: str) -> tuple[str, ...]:
    """`--overlap`'s value for a trace's clock or a plan's step: a comma-separated list of switches, `all` (every
    switch modelled there) or `none`; one line (UsageError) for a name that is no switch, or a switch parasim
    does not model there, with the reason."""
    if text == "none":
        return ()
    if text == "all":
        return names(where)
    got = tuple(w.strip() for w in text.split(",") if w.strip())
    for w in got:
        o = OVERLAPS.get(w)
        if o is None:
            raise UsageError(f"--overlap: {w!r} is not one of {', '.join(OVERLAPS)} (or none, all)")
        if where not in o.applies:
            why = o.not_on_trace if where == TRACE else o.not_in_plan
            other = "parasim memory and fit (a plan's step)" if where == TRACE else "a run's trace (lessons, trace)"
            raise UsageError(f"--overlap {w}: not modelled here: {why}; it applies to {other}")
    return got


def check(overlap: tuple[str, ...] | list[str], where: str) -> None:
    """ValueError for a switch not modelled `where` (a library caller's mistake; the commands use `parse`)."""
    bad = [o for o in overlap if o not in OVERLAPS or where not in OVERLAPS[o].applies]
    if bad:
        raise ValueError(f"unknown overlap {bad[0]!r} here: one of {', '.join(names(where))}")

"""Run a pipeline schedule for real: each rank holds its stages (blocks of layers), activations go forward
and gradients backward by point-to-point transfers, weight gradients add up over the micro-batches.

When to move data comes from the schedule's own slot timing, which every rank computes alike: a transfer
happens at the slot where its producer finishes, sender and receiver both do it there, and a rank does the
transfers of one slot as one batched exchange (as Megatron pairs send-forward with receive-backward).
Every rank then meets its transfers in one global order, so none can wait on a peer that waits on it,
whatever the schedule. Two stages on the same rank (the turn of a V) hand over without communication.

What each kind hands on, and to which stage, is its entry's `passes` in the kind table (action.KINDS).
An I action runs the backward for the input and queues the weight-gradient work; its W runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from ..comm.interface import Group, Recv, Send
from .action import KINDS, Action, Schedule
from .schedules import stage_ranks
from .timing import Timing, time_schedule
from ..engine.context import Context


class Stage(Protocol):
    """What a stage must do: forward(x) -> (y, cache); backward(cache, dy) -> dx (weights included);
    backward_input(cache, dy) -> (dx, work), where work() later computes the weight gradients."""

    def forward(self, x: Any) -> tuple[Any, Any]: ...
    def backward(self, cache: Any, dy: Any) -> Any: ...
    def backward_input(self, cache: Any, dy: Any) -> tuple[Any, Callable[[], None]]: ...


class WeightGradQueue:
    """Zero-bubble's W queue, the state a stage keeps to split its backward in two: within `deferring` the
    layers' weight-gradient work (what they hand `ParallelContext.weight_grad`) is queued instead of run,
    and the W action runs it later; outside it, work runs at once. The layers see only `run_or_queue`
    (nn.core.WeightGradSink), so nn/ knows nothing of schedules."""

    def __init__(self) -> None:
        self._queued: list[Callable[[], None]] | None = None  # None: not deferring

    @contextmanager
    def deferring(self, contexts: Iterable[Any]) -> Iterator[list[Callable[[], None]]]:
        """Within this block the layers built on `contexts` (ParallelContexts) queue their weight-gradient
        work here, and the list it is queued on is yielded; after it, each context has the sink it had."""
        contexts = list(contexts)
        before = [c.weight_grads for c in contexts]  # read before any is set: a context may come twice
        work: list[Callable[[], None]] = []
        self._queued = work
        for c in contexts:
            c.weight_grads = self
        try:
            yield work
        finally:
            for c, sink in zip(contexts, before):
                c.weight_grads = sink
            self._queued = None

    def run_or_queue(self, work: Callable[[], None]) -> None:
        """Run `work` now, or queue it for the W action while deferring."""
        if self._queued is None:
            work()
        else:
            self._queued.append(work)


def transfers(schedule: Schedule, timing: Timing) -> list[tuple[int, int, int, str, int, int]]:
    """Every transfer between ranks: (slot, src rank, dst rank, "act" or "grad", from stage, micro-batch),
    in the one order every rank follows. Any costs give a deadlock-free order; the lessons use the costs
    their slot tables are drawn with, so that a transfer's slot is the one the table shows."""
    where = stage_ranks(schedule)
    last = max(where)
    cost = timing.costs
    out = []
    for r, acts in enumerate(schedule):
        for a, begin in zip(acts, timing.begin[r]):
            passes = KINDS[a.kind].passes  # what this kind hands on, and to which stage
            if passes is None:
                continue
            what, to = passes[0], a.stage + passes[1]
            if 0 <= to <= last and where[to] != r:  # no such stage, or the same rank: nothing to send
                out.append((begin + cost[a.kind], r, where[to], what, a.stage, a.mb))
    return sorted(out)


def run_schedule(
    ctx: Context,
    group: Group,
    schedule: Schedule,
    stages: dict[int, Stage],
    shape: tuple[int, ...],
    dtype: Any,
    inputs: Callable[[int], Any],
    loss: Callable[[int, Any], tuple[Any, Any]],
    costs: dict[str, int] | None = None,
) -> Any:
    """Run this rank's part of `schedule` (`stages`: the stage objects it holds, by global stage index).
    Returns the sum of the micro-batch losses on the rank holding the last stage, else 0.

    inputs(mb): the first stage's input of micro-batch mb. loss(mb, y): the last stage's (loss, dL/dy)."""
    me = group.group_rank(ctx.rank)
    where = stage_ranks(schedule)
    last = max(where)
    timing = time_schedule(schedule, costs)
    begin = timing.begin[me]
    # this rank's program: batches of transfers (at their slot) and actions (at theirs), in time order
    mine = [t for t in transfers(schedule, timing) if me in (t[1], t[2])]
    program: list[tuple[int, int, Any]] = [(b, 1, a) for a, b in zip(schedule[me], begin)]
    for slot in sorted({t[0] for t in mine}):
        program.append((slot, 0, [t for t in mine if t[0] == slot]))
    program.sort(key=lambda e: (e[0], e[1]))

    acts: dict[tuple[int, int], Any] = {}  # (stage, mb) -> input of that stage
    grads: dict[tuple[int, int], Any] = {}  # (stage, mb) -> dL/d(output) of that stage
    caches: dict[tuple[int, int], Any] = {}
    weight_work: dict[tuple[int, int], Callable[[], None]] = {}
    total = 0.0
    for slot, is_action, item in program:
        if not is_action:
            _exchange(ctx, group, me, slot, item, acts, grads, shape, dtype)
            continue
        a: Action = item
        key = (a.stage, a.mb)
        if a.kind == "F":
            x = inputs(a.mb) if a.stage == 0 else acts.pop(key)
            y, caches[key] = stages[a.stage].forward(x)
            if a.stage == last:
                value, grads[key] = loss(a.mb, y)
                total = total + value
            else:
                acts[(a.stage + 1, a.mb)] = y  # sent at the end of this slot, or kept when the next stage is here
        elif a.kind in ("B", "I"):
            dy = grads.pop(key)
            if a.kind == "B":
                dx = stages[a.stage].backward(caches.pop(key), dy)
            else:
                dx, weight_work[key] = stages[a.stage].backward_input(caches.pop(key), dy)
            if a.stage > 0:
                grads[(a.stage - 1, a.mb)] = dx
        else:  # W
            weight_work.pop(key)()
    return total


def _exchange(
    ctx: Context,
    group: Group,
    me: int,
    slot: int,
    batch: list,
    acts: dict,
    grads: dict,
    shape: tuple[int, ...],
    dtype: Any,
) -> None:
    ops: list[Send | Recv] = []
    into: list[tuple[dict, tuple[int, int]]] = []
    step = {k.passes[0]: k.passes[1] for k in KINDS.values() if k.passes}  # "act": +1, "grad": -1
    for _, src, dst, what, stage, mb in batch:
        to = stage + step[what]
        store = acts if what == "act" else grads
        noun = f"{'activation' if what == 'act' else 'gradient'} {mb + 1} (stage {stage + 1} -> {to + 1})"
        if src == me:  # each transfer named by its sender (Send's own label), not by the rest of the batch
            ops.append(Send(store.pop((to, mb)), group.ranks[dst], label=f"slot {slot}: send {noun}"))
        else:
            ops.append(Recv(group.ranks[src], shape, dtype))
            into.append((store, (to, mb)))
    got = ctx.comm.exchange(ops, group=group, label=f"slot {slot}", tags={"slot": slot})
    for (store, key), x in zip(into, got):
        store[key] = x

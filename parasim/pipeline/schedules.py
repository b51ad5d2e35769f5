"""Pipeline schedules as data: for each stage rank, the ordered list of actions it runs.

Actions use torch.distributed.pipelining's letters: F (forward), B (full backward), I (backward for the
input only), W (backward for the weights, deferred). A rank may hold several model chunks (stages):
interleaved schedules give rank r the stages r, r+p, r+2p, ...; the V-shaped ones (ZB-V, DualPipeV) give it
stage r on the way down and stage 2p-1-r on the way back up. Micro-batches are 0-based inside; tables
print them 1-based, as the post does, and a rank's second chunk in lower case.

Every schedule is registered once (SCHEDULES, at the end): its name, its generator, what --chunks it takes
and its torch class; the CLI's choices, generate() and the tests read that registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import UsageError
from ..limits import SCHEDULE_CELLS, at_most
from .action import Action, Schedule
from .vshape import dualpipev, zbv


def gpipe(pp: int, m: int) -> Schedule:
    """All forwards, then all backwards in reverse micro-batch order (the post's table)."""
    return [[Action("F", k, r) for k in range(m)] + [Action("B", k, r) for k in reversed(range(m))] for r in range(pp)]


def one_f_one_b(pp: int, m: int) -> Schedule:
    """Rank r: p-r-1 warm-up forwards, then one forward and one backward at a time, then the remaining
    backwards. At most p-r micro-batches' activations are held at once."""
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action("F", k, r) for k in range(warm)]
        f, b = warm, 0
        while f < m:
            acts += [Action("F", f, r), Action("B", b, r)]
            f, b = f + 1, b + 1
        acts += [Action("B", k, r) for k in range(b, m)]
        out.append(acts)
    return out


def rounds(pp: int, m: int) -> tuple[int, int]:
    """Interleaved schedules walk the micro-batches in rounds of about p (torch relaxes Megatron's m % p == 0
    to m % rounds == 0): (number of rounds, micro-batches per round)."""
    n = max(1, m // pp)
    if m % n:
        raise UsageError(
            f"interleaved schedules run micro-batches in rounds: m = {m} must be a multiple of "
            f"max(1, m // pp) = {n} (try m = {n * (m // n)} or {n * (m // n + 1)})"
        )
    return n, m // n


def rounds_note(pp: int, m: int, v: int) -> str | None:
    """What to say when an interleaved run (v > 1) has m not a multiple of p: Megatron-LM refuses it, torch
    runs it in rounds (None when there is nothing to say)."""
    if v < 2 or m % pp == 0:
        return None
    n, per = rounds(pp, m)
    return (
        f"m = {m} is not a multiple of p = {pp}: Megatron-LM refuses that for an interleaved schedule; torch's "
        f"ScheduleInterleaved1F1B runs it, as here, in {n} round{'s' * (n != 1)} of {per} micro-batches"
    )


def interleaved(pp: int, m: int, v: int, zero_bubble: bool = False) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021), rank r holding chunks r, r+p, ..., r+(v-1)p, in the order
    torch's ScheduleInterleaved1F1B runs it; with zero_bubble, its ScheduleInterleavedZeroBubble (ZB-H1 when
    v = 1): backwards for the input only, each weight pass deferred until r more backwards have run.

    Ops are counted per (chunk, micro-batch). Forwards walk the chunks a round at a time (a round's
    micro-batches through chunk 0, then through chunk 1, ...); backwards walk them in reverse. The warm-up is
    long enough for the first backward to have arrived: (v-1) rounds, plus 2 (1 with zero bubble) per hop
    to the last rank."""
    per_round = rounds(pp, m)[1] if v > 1 else m  # one chunk: no rounds to walk, any m works
    out = []
    for r in range(pp):
        warm = min((v - 1) * per_round + (1 if zero_bubble else 2) * (pp - 1 - r), m * v)
        total = m * v
        f_next = [0] * v  # next micro-batch per chunk
        b_next = [0] * v
        w_next = [0] * v
        b_chunks: list[int] = []  # chunk of each backward, in order: the weight passes follow it
        acts: list[Action] = []

        def fwd(op: int) -> None:
            c = (op // per_round) % v
            acts.append(Action("F", f_next[c], c * pp + r, c))
            f_next[c] += 1

        def bwd(op: int) -> None:
            c = v - 1 - ((op - warm) // per_round) % v
            acts.append(Action("I" if zero_bubble else "B", b_next[c], c * pp + r, c))
            b_next[c] += 1
            b_chunks.append(c)

        def weight() -> None:
            c = b_chunks[sum(w_next)]
            acts.append(Action("W", w_next[c], c * pp + r, c))
            w_next[c] += 1

        for op in range(warm):
            fwd(op)
        for op in range(warm, total + warm):
            if op < total:
                fwd(op)
            bwd(op)
            if zero_bubble and op - warm >= r:
                weight()
        while zero_bubble and sum(w_next) < total:
            weight()
        out.append(acts)
    return out


def zb_h1(pp: int, m: int) -> Schedule:
    """Zero bubble with 1F1B's memory (Qi et al. 2024): rank r does p-r warm-up forwards, then for each
    micro-batch k its input backward I_k, the weight pass W_(k-r) lagging r micro-batches, and the next
    forward; the remaining weight passes fill the cool-down."""
    return interleaved(pp, m, 1, zero_bubble=True)


# -- the registry: one entry per schedule ----------------------------------------------------------------------
# What a schedule's --chunks may be: one per rank, several (interleaving), or exactly two (a V: down and back up).
ONE, SEVERAL, V_SHAPE = "one", "several", "v-shape"
# Each: (the default, the values allowed, the error for another, the words --help gives).
_CHUNK_RULES = {
    ONE: (1, lambda v: v == 1, "{name} runs one chunk per rank; use interleaved for --chunks {v}", "1"),
    SEVERAL: (2, lambda v: v >= 2, "{name} needs at least 2 chunks per rank, got --chunks {v}", "2 or more, default 2"),
    V_SHAPE: (
        2,
        lambda v: v == 2,
        ("{name} runs exactly 2 chunks per rank (a V: down and back up), got --chunks {v}"),
        "exactly 2",
    ),
}


@dataclass(frozen=True)
class ScheduleEntry:
    """A schedule `parasim schedule --schedule NAME`, generate() and the lessons know by name."""

    name: str
    # (pp, micro-batches, chunks per rank) -> each rank's actions; UsageError names a rule of its own broken
    generator: Callable[[int, int, int], Schedule]
    chunks: str  # ONE, SEVERAL or V_SHAPE: what --chunks may be (checked before the generator runs)
    torch_name: str | None  # its class in torch.distributed.pipelining (None: torch has none)

    @property
    def default_chunks(self) -> int:
        return _CHUNK_RULES[self.chunks][0]

    @property
    def chunks_words(self) -> str:
        """What --chunks may be, in --help's words."""
        return _CHUNK_RULES[self.chunks][3]

    def check_chunks(self, v: int) -> None:
        _, allowed, rule, _ = _CHUNK_RULES[self.chunks]
        if not allowed(v):
            raise UsageError(rule.format(name=self.name, v=v))


# In the order `parasim schedule --help` lists them. Adding a schedule: its generator and one entry here.
SCHEDULES: tuple[ScheduleEntry, ...] = (
    ScheduleEntry("gpipe", lambda pp, m, v: gpipe(pp, m), ONE, None),
    ScheduleEntry("1f1b", lambda pp, m, v: one_f_one_b(pp, m), ONE, "Schedule1F1B"),
    ScheduleEntry("interleaved", lambda pp, m, v: interleaved(pp, m, v), SEVERAL, "ScheduleInterleaved1F1B"),
    ScheduleEntry("zb-h1", lambda pp, m, v: zb_h1(pp, m), ONE, "ScheduleInterleavedZeroBubble"),
    ScheduleEntry(
        "interleaved-zb",
        lambda pp, m, v: interleaved(pp, m, v, zero_bubble=True),
        SEVERAL,
        "ScheduleInterleavedZeroBubble",
    ),
    ScheduleEntry("zbv", lambda pp, m, v: zbv(pp, m), V_SHAPE, "ScheduleZBVZeroBubble"),
    ScheduleEntry("dualpipev", lambda pp, m, v: dualpipev(pp, m), V_SHAPE, "ScheduleDualPipeV"),
)


def schedule_names() -> tuple[str, ...]:
    return tuple(e.name for e in SCHEDULES)


def schedule_entry(name: str) -> ScheduleEntry:
    """The registered schedule `name`; UsageError lists the registered ones."""
    for e in SCHEDULES:
        if e.name == name:
            return e
    raise UsageError(f"unknown schedule {name!r}; schedules: {', '.join(schedule_names())}")


def default_chunks(name: str) -> int:
    return schedule_entry(name).default_chunks


def generate(name: str, pp: int, m: int, chunks: int | None = None) -> Schedule:
    """The schedule `name` for pp ranks, m micro-batches and `chunks` model chunks per rank; UsageError
    names a broken rule."""
    entry = schedule_entry(name)
    v = entry.default_chunks if chunks is None else chunks
    for what, n in (("pp", pp), ("microbatches", m), ("chunks", v)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UsageError(f"{what} must be a positive integer, got {n!r}")
    at_most("pp x microbatches x chunks", pp * m * v, SCHEDULE_CELLS, "the slot table holds every action")
    entry.check_chunks(v)
    return entry.generator(pp, m, v)


def stage_ranks(schedule: Schedule) -> dict[int, int]:
    """Which rank holds each stage."""
    return {a.stage: r for r, acts in enumerate(schedule) for a in acts}


def check_layers(layers: int, schedule: Schedule) -> int:
    """Layers per stage; UsageError when the layers do not split evenly over the stages."""
    stages = len(stage_ranks(schedule))
    if layers % stages:
        raise UsageError(
            f"{layers} layers do not split evenly over {stages} stages "
            f"({len(schedule)} ranks x {stages // len(schedule)} chunk{'s' if stages > len(schedule) else ''})"
        )
    return layers // stages

"""Every event of a trace on a clock: one compute and one communication stream per GPU, as frameworks run.

The trace keeps its logical order (its identity); this module lays it out in seconds for a Machine:
- A rank's compute before an event (trace.Member.work, by engine/work.py) runs on its compute stream,
  for as long as costs.Machine.compute says.
- A collective or transfer runs on its members' communication streams, one call at a time per GPU: it
  starts when every member has issued it and every member's stream is free, and lasts costs.COSTS' time.
- Normally a rank waits for its collective before computing again (the layer needs its result). Overlap
  switches (clock/overlaps.py, those modelled on a trace) let some calls run beside the compute, as the
  frameworks arrange it.
- The step ends when every stream of every GPU is done. The critical path is the chain of spans that
  made it end then: each span remembers the one it waited for, and the chain is read back from the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .costs import Machine, event_seconds, value_bytes
from ..estimate.kernels import overlap_slowdown
from .overlaps import OVERLAPS, TRACE, check
from ..comm.trace import Trace


@dataclass(slots=True)
class Span:
    kind: str  # "compute" or "comm"
    ranks: tuple[int, ...]
    seq: int | None  # the event it is (comm) or comes before (compute); None: the step's tail
    start: float
    end: float
    pred: "Span | None" = None
    name: str = ""
    phase: str = ""  # the phase the work or transfer belongs to

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    machine: Machine
    overlap: tuple[str, ...]
    step: float  # seconds, the step's end
    spans: list[Span]
    critical: list[Span]  # from the step's start to its end
    events: dict[int, tuple[float, float]]  # seq -> (start, end) of its transfer
    before: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)  # seq -> (rank, start, end)
    busy: list[float] = field(default_factory=list)  # per rank: seconds its compute stream ran
    comm: list[float] = field(default_factory=list)  # per rank: seconds its communication stream ran
    rep: list[int] | None = None  # a folded run's rank -> the rank that ran for it (spans are the latter's)
    # what any timeline of the same trace on the same machine may reuse, whatever its overlap: each event's
    # seconds, each work's, each event's members that ran (simulate's `costs`)
    costs: dict = field(default_factory=dict, repr=False, compare=False)

    def ran_for(self, rank: int) -> int:
        """The rank whose spans are `rank`'s: itself, or the representative a folded run ran for it."""
        return rank if self.rep is None else self.rep[rank]

    def before_of(self, e: Any) -> list[tuple[int, float, float]]:
        """(rank, start, end) of the compute each member of event `e` ran just before it: a folded rank's is
        its representative's, a copied event's its source's, member by member."""
        src = e.source if getattr(e, "source", None) is not None else e
        spans = {r: (a, b) for r, a, b in self.before.get(src.seq, [])}
        out = []
        for mine, theirs in zip(e.members, src.members):
            got = spans.get(self.ran_for(theirs.rank))
            if got is not None:
                out.append((mine.rank, *got))
        return out

    def times(self, e: Any) -> tuple[float, float]:
        """(start, end) of event `e`'s transfer, or of a compute event's own span: a folded run's copy takes its
        source's (the events timed are those that ran)."""
        got = self.events.get(e.seq)
        if got is None and getattr(e, "source", None) is not None:
            got = self.events[e.source.seq]
        if got is None:
            raise KeyError(e.seq)
        return got

    def idle(self, rank: int) -> float:
        """Seconds of the step `rank` ran nothing: neither compute nor a transfer of its own (as HTA counts idle
        time: a transfer hidden behind compute is not counted twice, an exposed one is not a wait)."""
        r = self.ran_for(rank)
        spans = sorted((s.start, s.end) for s in self.spans if r in s.ranks and s.end > s.start)
        covered, reach = 0.0, 0.0
        for a, b in spans:
            if b > reach:
                covered += b - max(a, reach)
                reach = b
        return max(0.0, self.step - covered)

    def critical_split(self) -> dict[str, float]:
        """Seconds of the critical path in compute and in communication."""
        out = {"compute": 0.0, "comm": 0.0}
        for s in self.critical:
            out[s.kind] += s.seconds
        return out


def paired_phases(trace: Trace) -> set[str]:
    """The phases a program marked as paired chunks (`ctx.phase(name, pair=k)`: DualPipe's)."""
    return {mk.text for mk in trace.ran_marks if mk.kind == "phase" and (mk.data or {}).get("pair") is not None}


def simulate(
    trace: Trace, m: Machine, overlap: tuple[str, ...] | list[str] = (), costs: dict | None = None
) -> Timeline:
    """Lay `trace`'s events out in seconds on `m`, with the OVERLAPS named in `overlap` on. `costs`: another
    timeline's of this trace on `m` (`Timeline.costs`), whose event and compute seconds do not depend on the
    overlap: a report's timeline per switch lays the same events out again, without timing them again.

    A folded run's trace (engine/symbolic/fold.py: meta "fold") is laid out for the ranks that ran: a folded rank did
    its representative's work at its representative's times, so the events it shares with it take their
    ready times from the representative, and the copies of events on its own groups take their source's
    times. Only the ranks that ran have spans; `Timeline.ran_for` names whose a rank's are."""
    check(overlap, TRACE)
    chosen = [OVERLAPS[o] for o in overlap]
    world = trace.world
    paired = paired_phases(trace)
    last_phase: list[str | None] = [None] * world
    cfree, kfree = [0.0] * world, [0.0] * world
    clast: list[Span | None] = [None] * world  # what each stream last ran
    klast: list[Span | None] = [None] * world
    busy, comm = [0.0] * world, [0.0] * world
    spans: list[Span] = []
    events: dict[int, tuple[float, float]] = {}
    before: dict[int, list[tuple[int, float, float]]] = {}
    # what costs.event_seconds looks up once per run (an exact run's value size, all-to-all chunks)
    costs = {} if costs is None else costs
    memo: dict = costs.setdefault("memo", {"value_bytes": value_bytes(trace)})
    rep: list[int] | None = trace.meta.get("fold")
    ran = range(world) if rep is None else [r for r in range(world) if rep[r] == r]

    # the work each rank did at the end of a phase, after its last event in it (trace marks of kind "work"):
    # it runs before the rank's next event, and belongs to the phase it ended
    ends: list[list] = [[] for _ in range(world)]
    for mk in trace.ran_marks:
        if mk.kind == "work":
            ends[mk.rank].append(mk)
    done = [0] * world

    # work dicts by identity: a folded rank's copies share its representative's, a repeated call's its first's
    seconds: dict[int, float] = costs.setdefault("work", {})
    took: dict[int, float] = costs.setdefault("event", {})  # each event's seconds, by its number
    # each event's members that ran (a folded all-to-all has 64 members, one of which ran)
    running: dict[int, list] = costs.setdefault("running", {})
    # an overlapped collective is not free: compute that runs beside it slows by this share of their overlap
    # (its kernels hold SMs and memory bandwidth: estimate/kernels.overlap_slowdown, measured)
    slow = overlap_slowdown(m.key).value if chosen else 0.0
    beside: list[list[tuple[float, float]]] = [[] for _ in range(world)]  # each rank's overlapped transfers

    def slowed(r: int, start: float, secs: float) -> float:
        """`secs` of compute from `start` on rank r, with what the overlapped transfers beside it cost."""
        end = start + secs
        shared = sum(max(0.0, min(end, b) - max(start, a)) for a, b in beside[r])
        return secs + slow * shared

    def compute(r: int, work: Any, seq: int | None, name: str, phase: str = "") -> Span | None:
        if not work:
            return None
        secs = seconds.get(id(work))
        if secs is None:
            secs = seconds[id(work)] = m.compute(work)
        if secs <= 0:
            return None
        secs = slowed(r, cfree[r], secs) if beside[r] else secs
        s = Span("compute", (r,), seq, cfree[r], cfree[r] + secs, clast[r], name, phase)
        spans.append(s)
        clast[r], cfree[r] = s, s.end
        busy[r] += secs
        return s

    def join(r: int) -> None:
        """The rank waits for what its communication stream still runs (the end of a paired phase)."""
        if kfree[r] > cfree[r]:
            cfree[r], clast[r] = kfree[r], klast[r]

    for e in trace.ran_events:
        if rep is not None and e.source is not None:
            continue  # a copy of an event that ran: timed as its source (`Timeline.times`)
        how = next((o.how for o in chosen if o.moves(e, paired)), None)
        issue: dict[int, tuple[float, Span | None]] = {}
        mine = running.get(e.seq)
        if mine is None:  # a member folded onto a member of this very event (fold.py) is ready when it is
            mine = running[e.seq] = (
                e.members if rep is None else [mem for mem in e.members if rep[mem.rank] == mem.rank]
            )
        for mem in mine:
            r = mem.rank
            if last_phase[r] in paired and last_phase[r] != e.phase:
                join(r)
            last_phase[r] = e.phase
            while done[r] < len(ends[r]) and ends[r][done[r]].step < e.step:
                mk = ends[r][done[r]]
                compute(r, mk.data, None, f"the end of {mk.text}", mk.text)
                done[r] += 1
            prev = clast[r]
            s = compute(r, mem.work, e.seq, e.label or e.op, e.phase or "")
            if s is not None:
                before.setdefault(e.seq, []).append((r, s.start, s.end))
            issue[r] = (s.start, prev) if how == "early" and s is not None else (cfree[r], clast[r])
        if e.kind == "compute":  # its work is its own: the span just laid out, or a moment
            r = e.members[0].rank
            own = before.get(e.seq)
            events[e.seq] = (own[0][1], own[0][2]) if own else (cfree[r], cfree[r])
            continue
        if not issue:  # no member ran (a trace folded by hand, not by fold.py): nothing to lay out
            events[e.seq] = (0.0, 0.0)
            continue
        # it starts when the last member issues it or frees its stream; it waited for that span
        ready = [c for r, (t, by) in issue.items() for c in ((t, by), (kfree[r], klast[r]))]
        start = max(t for t, _ in ready)
        pred = next((by for t, by in ready if t == start and by is not None), None)
        secs = took.get(e.seq)
        if secs is None:
            secs = took[e.seq] = event_seconds(e, m, memo)
        span = Span("comm", tuple(issue), e.seq, start, start + secs, pred, e.label or e.op, e.phase or "")
        spans.append(span)
        events[e.seq] = (span.start, span.end)
        for r in issue:
            kfree[r], klast[r] = span.end, span
            comm[r] += secs
            c = clast[r]
            if how == "early" and c is not None and c.kind == "compute" and c.end > span.start:
                # issued before the compute it hides behind (the rank's last): that compute goes on and pays for
                # the time they share; what comes next needs both the compute's end and the gathered result
                extra = slow * (min(c.end, span.end) - span.start)
                c.end += extra
                busy[r] += extra
                cfree[r], clast[r] = (span.end, span) if span.end > c.end else (c.end, c)
            elif how in ("async", "paired"):  # it runs beside the compute that follows: that compute pays for it
                beside[r].append((span.start, span.end))
            else:  # the rank needs the result before it computes on
                cfree[r], clast[r] = span.end, span
    for r in ran:
        for mk in ends[r][done[r] :]:
            compute(r, mk.data, None, f"the end of {mk.text}", mk.text)
    tails = trace.meta.get("tail_work") or []
    for r in ran if tails else ():
        compute(r, tails[r], None, "after the last transfer", _last_phase(trace, r))
    if rep is not None:  # a folded rank's totals are its representative's
        busy = [busy[rep[r]] for r in range(world)]
        comm = [comm[rep[r]] for r in range(world)]
    finish = [(max(cfree[r], kfree[r]), r) for r in ran]
    step, last_rank = max(finish, default=(0.0, 0))
    tail = clast[last_rank] if cfree[last_rank] >= kfree[last_rank] else klast[last_rank]
    critical: list[Span] = []
    while tail is not None:
        critical.append(tail)
        tail = tail.pred
    critical.reverse()
    return Timeline(m, tuple(overlap), step, spans, critical, events, before, busy, comm, rep, costs)


def event_time(tl: Timeline, e: Any) -> dict[str, Any]:
    """Event `e`'s times on the timeline, in microseconds, as the trace format writes them (an event's `time`):
    a transfer's start and end, a compute event's own span, and the compute each member ran just before it.
    The timeline is the clock's answer, beside the trace: the trace itself is never written on."""
    before = [[r, s * 1e6, t * 1e6] for r, s, t in tl.before_of(e)] if e.kind != "compute" else []
    start, end = tl.times(e)
    return {"start_us": start * 1e6, "end_us": end * 1e6, **({"before": before} if before else {})}


def export_times(
    trace: Trace, tl: Timeline
) -> tuple[dict[tuple[int, int], tuple[float, float]], list[tuple[int, float, float]]]:
    """The timeline's times as the Chrome and HTA exports take them: (seq, rank) -> (start_us, dur_us) of every
    event's member, and (rank, start_us, dur_us) of every compute span before an event."""
    times, work = {}, []
    for e in trace.events:
        t = event_time(tl, e)
        for m in e.members:
            times[(e.seq, m.rank)] = (t["start_us"], t["end_us"] - t["start_us"])
        work += [(r, s, end - s) for r, s, end in t.get("before", [])]
    return times, work


def summary(tl: Timeline, trace: Trace) -> dict[str, Any]:
    """What a reader of --json wants of a timeline: the step, the critical path and each GPU's busy time."""
    split = tl.critical_split()
    return {
        "gpu": tl.machine.name,
        "gpus_per_node": tl.machine.gpus_per_node,
        "overlap": list(tl.overlap),
        "step_us": tl.step * 1e6,
        "critical_compute_us": split["compute"] * 1e6,
        "critical_comm_us": split["comm"] * 1e6,
        "critical_path": [
            {
                "kind": s.kind,
                "ranks": list(s.ranks),
                "seq": s.seq,
                "name": s.name,
                "start_us": s.start * 1e6,
                "end_us": s.end * 1e6,
            }
            for s in tl.critical
        ],
        "compute_us": [b * 1e6 for b in tl.busy],
        "comm_us": [c * 1e6 for c in tl.comm],
    }


def by_phase(trace: Trace, tl: Timeline, rank: int) -> dict[str, dict[str, float]]:
    """Per phase, in order, what `rank` did in it on the clock: its compute and communication seconds, and
    when the phase began and ended for it (its first compute or transfer, its last)."""
    out: dict[str, dict[str, float]] = {}
    rank = tl.ran_for(rank)
    for s in sorted(tl.spans, key=lambda s: s.start):
        if rank not in s.ranks:
            continue
        row = out.setdefault(s.phase, {"compute": 0.0, "comm": 0.0, "start": float("inf"), "end": 0.0})
        row[s.kind] += s.seconds
        row["start"], row["end"] = min(row["start"], s.start), max(row["end"], s.end)
    return out


def _last_phase(trace: Trace, rank: int) -> str:
    return next((mk.text for mk in reversed(trace.marks_of(rank)) if mk.kind == "phase"), "")

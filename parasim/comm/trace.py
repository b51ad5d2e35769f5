"""The trace: every collective, point-to-point transfer and marked step of a run, on a logical clock.

Clock: each rank keeps a step counter. A collective (or a transfer) happens at one past the latest step
of the ranks taking part, and every member's counter moves to it. So the step of an event says how
many communication rounds deep it is, the same on every backend and every run.

The JSON form is documented in docs/trace-format.md; `FORMAT` and `VERSION` name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from .hops import event_transfers, split_by_link
from .interface import Group
from ..errors import UsageError
from ..limits import brief
from .trace_schema import HELD_KINDS, check_trace, kept_values


def gemms_list(work: Any) -> list[list]:
    """A Work's products as the trace format writes them: [kind, m, n, k, how many], in a fixed order."""
    return [[kind, m, n, k, c] for (kind, m, n, k), c in sorted((getattr(work, "gemms", None) or {}).items())]


class Work(dict):
    """FLOPs by kind a rank computed between two of its events (the dict's items, as the trace writes them), with
    the products they come from: `gemms`, (kind, m, n, k) -> how many such products. engine/work.py's meter
    counts them as a program runs; the trace keeps them with the event that follows."""

    __slots__ = ("gemms",)

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.gemms: dict[tuple[str, int, int, int], int] = {}


def work_of(flops: dict | None, gemms: list | None) -> Work | None:
    """A member's work read back: its FLOPs by kind and, where the file has them, the products behind them."""
    if flops is None:
        return None
    w = Work(flops)
    for kind, m, n, k, c in gemms or ():
        w.gemms[(kind, m, n, k)] = c
    return w


FORMAT = "parasim-trace"
VERSION = 1


class Tensor(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


class Member(NamedTuple):
    """One rank's part in an event. `before`/`after` hold small arrays' values (lists) or None."""

    rank: int
    ins: tuple[Tensor, ...]
    outs: tuple[Tensor, ...]
    sent: int
    recv: int
    site: str
    before: tuple | None = None
    after: tuple | None = None
    work: dict[str, int] | None = None  # FLOPs by kind this rank computed since its previous event (engine/work.py)


class Mark(NamedTuple):
    rank: int
    step: int
    kind: str  # "phase", "note" or "held" (data: {"kind": one of HELD_KINDS, "bytes": n}, or {"bytes": 0}: freed)
    text: str
    data: dict[str, Any] | None = None  # fields for screens and checks to read (token, slot, ...): never the text


def _mark_dict(m: Mark) -> dict:
    d = {"rank": m.rank, "step": m.step, "kind": m.kind, "text": m.text}
    if m.data is not None:
        d["data"] = m.data
    return d


@dataclass
class Event:
    seq: int
    step: int
    kind: str  # "collective", "p2p" or "compute"
    op: str
    group: Group
    members: list[Member]
    label: str | None = None
    phase: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    algo: str | None = None
    hops: list[dict] | None = None
    tags: dict[str, Any] | None = None  # fields the program gave the call for screens (a pipeline's slot)
    time: dict[str, Any] | None = None  # times a trace file carries (start_us, end_us, before); the clock
    # keeps its own beside the trace (clock/timeline.Timeline) and writes them into what it prints
    # a folded run's copy (engine/symbolic/fold.unfold): the event that ran, which this one repeats on other ranks,
    # member by member in the same order (kept in memory only: the clock times the copy as its source)
    source: "Event | None" = field(default=None, repr=False, compare=False)

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.members]

    def member(self, rank: int) -> Member:
        for m in self.members:
            if m.rank == rank:
                return m
        raise KeyError(rank)

    def to_dict(self) -> dict:
        return {
            "seq": self.seq,
            "step": self.step,
            "kind": self.kind,
            "op": self.op,
            "group": _group_dict(self.group),
            "ranks": self.ranks,
            "label": self.label,
            "phase": self.phase,
            "params": self.params,
            "algo": self.algo,
            "members": [
                {
                    "rank": m.rank,
                    "in": [{"shape": list(t.shape), "dtype": t.dtype} for t in m.ins],
                    "out": [{"shape": list(t.shape), "dtype": t.dtype} for t in m.outs],
                    "sent": m.sent,
                    "recv": m.recv,
                    "site": m.site,
                    "before": None if m.before is None else list(m.before),
                    "after": None if m.after is None else list(m.after),
                    **({"work": dict(m.work)} if m.work else {}),
                    **({"gemms": gemms_list(m.work)} if getattr(m.work, "gemms", None) else {}),
                }
                for m in self.members
            ],
            "hops": self.hops,
            **({"tags": self.tags} if self.tags is not None else {}),
            **({"time": self.time} if self.time is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        members = [
            Member(
                m["rank"],
                tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in m["in"]),
                tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in m["out"]),
                m["sent"],
                m["recv"],
                m["site"],
                None if m.get("before") is None else tuple(kept_values(m["before"])),
                None if m.get("after") is None else tuple(kept_values(m["after"])),
                work_of(m.get("work"), m.get("gemms")),
            )
            for m in d["members"]
        ]
        g = d["group"]
        return cls(
            d["seq"],
            d["step"],
            d["kind"],
            d["op"],
            Group(tuple(g["ranks"]), g["name"], g["index"]),
            members,
            d.get("label"),
            d.get("phase"),
            d.get("params") or {},
            d.get("algo"),
            d.get("hops"),
            d.get("tags"),
            d.get("time"),
        )


def apply_held(live: dict[str, tuple[str, int]], mk: Mark) -> None:
    data = mk.data or {}
    if data.get("bytes"):
        live[mk.text] = (data["kind"], data["bytes"])
    else:
        live.pop(mk.text, None)


def held_by_kind(live: dict[str, tuple[str, int]]) -> dict[str, int]:
    out = {k: 0 for k in HELD_KINDS}
    for kind, n in live.values():
        out[kind] += n
    return out


def _group_dict(g: Group) -> dict:
    return {"index": g.index, "name": g.name, "ranks": list(g.ranks)}


@dataclass
class Trace:
    world: int
    backend: str = "virtual"
    groups: list[Group] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ran_events(self) -> list[Event]:
        """The events that ran: every one, but in a folded run's trace (engine/symbolic/fold.FoldedTrace) the
        representatives' own, which the clock times (the rest are copies of them)."""
        return self.events

    @property
    def ran_marks(self) -> list[Mark]:
        """The marks the ranks that ran made (see `ran_events`)."""
        return self.marks

    def noted(self, key: str | None = None) -> bool:
        """Whether any rank left a note (one whose data holds field `key`, if given): asked of the marks that ran,
        since a folded trace's other marks are copies of theirs."""
        return any(
            mk.kind == "note" and (key is None or (mk.data is not None and key in mk.data)) for mk in self.ran_marks
        )

    def on_demand(self) -> Sequence[Event]:
        """The events, for a reader that visits few of them (the app): the list itself here; a folded run's trace
        writes each copy out when it is first asked for (engine/symbolic/fold.FoldedTrace)."""
        return self.events

    def grid_places(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each member's rank, the position of its event in `events`) over every member of every event, and each
        event's step: what the app's grid indexes (tui/view.py), which a folded trace works out from its rule."""
        events = self.events
        steps = np.array([e.step for e in events], dtype=np.int64)
        ranks = np.array([m.rank for e in events for m in e.members], dtype=np.int64)
        at = np.repeat(np.arange(len(events), dtype=np.int64), [len(e.members) for e in events])
        return ranks, at, steps

    def compute_events(self) -> list[tuple[Event, tuple[int, ...]]]:
        """Every compute event, in order, with the ranks that did its work: its own rank (a folded run's trace gives
        each one that ran with the ranks folded onto its rank, whose copies it would write out)."""
        return [(e, (e.members[0].rank,)) for e in self.events if e.kind == "compute"]

    def events_of(self, rank: int) -> list[Event]:
        """The events `rank` is a member of, in order."""
        return [e for e in self.events if any(m.rank == rank for m in e.members)]

    def marks_of(self, rank: int) -> list[Mark]:
        """The marks `rank` made, in order."""
        return [m for m in self.marks if m.rank == rank]

    @property
    def steps(self) -> int:
        """The last logical step reached by any rank."""
        return max([e.step for e in self.events] + [m.step for m in self.marks] + [0])

    def notes(self, key: str | None = None) -> list[tuple[str, int, str, dict]]:
        """(phase, rank, text, data) of every note, or of those whose data holds field `key`, in order; the
        phase is the one its rank was in when it left the note. Readers select by fields, never by words."""
        phase_of: dict[int, str] = {}
        out = []
        for mk in self.marks:
            if mk.kind == "phase":
                phase_of[mk.rank] = mk.text
            elif mk.kind == "note" and (key is None or (mk.data is not None and key in mk.data)):
                out.append((phase_of.get(mk.rank, ""), mk.rank, mk.text, mk.data or {}))
        return out

    # -- memory held: what `ctx.hold` / `ctx.free` recorded, in the training dtypes -----------------------
    def held(self, rank: int, step: int | None = None, before: int | None = None) -> dict[str, int]:
        """Bytes `rank` held by kind while its event at `step` ran (every hold it made before that step: a
        buffer is held before the collective that fills it, less what it freed), or just before mark number
        `before` of `marks`."""
        live: dict[str, tuple[str, int]] = {}
        if before is None:
            for mk in self.marks_of(rank):
                if mk.kind == "held" and (step is None or mk.step < step):
                    apply_held(live, mk)
            return held_by_kind(live)
        for i, mk in enumerate(self.marks):
            if i >= before:
                break
            if mk.kind == "held" and mk.rank == rank and (step is None or mk.step < step):
                apply_held(live, mk)
        return held_by_kind(live)

    def joins(self, rank: int) -> list[dict[str, Any]]:
        """Every kind of call `rank` joins (op and group, in the order first made), with its calls and the
        bytes it sent and received."""
        does: dict[tuple[str, str], dict[str, int]] = {}
        for e in self.events_of(rank):
            if e.kind != "compute":
                row = does.setdefault((e.op, e.group.name), {"calls": 0, "sent": 0, "received": 0})
                mine = e.member(rank)
                row["calls"] += 1
                row["sent"] += mine.sent
                row["received"] += mine.recv
        return [{"op": op, "group": grp, **row} for (op, grp), row in does.items()]

    def peak(self, rank: int, phase: str | None = None) -> dict[str, Any]:
        """The most bytes `rank` held at once (within `phase`, if given): {"bytes", "step", "phase", "name"
        (the hold that reached it), "by_kind"}. Holds and frees are replayed in order, so a buffer held for
        a moment between two events counts; only a hold can raise the total. A phase that holds nothing new
        reports what the rank held coming into it (name None)."""
        live: dict[str, tuple[str, int]] = {}
        now = ""
        best: dict[str, Any] | None = None
        entering: dict[str, Any] | None = None
        for mk in self.marks_of(rank):
            if mk.kind == "phase":
                now = mk.text
                if now == phase and entering is None:
                    entering = {
                        "bytes": sum(b for _, b in live.values()),
                        "step": mk.step,
                        "phase": now,
                        "name": None,
                        "by_kind": held_by_kind(live),
                    }
            elif mk.kind == "held":
                apply_held(live, mk)
                total = sum(b for _, b in live.values())
                if (
                    (mk.data or {}).get("bytes")
                    and (phase is None or now == phase)
                    and (best is None or total > best["bytes"])
                ):
                    best = {
                        "bytes": total,
                        "step": mk.step,
                        "phase": now,
                        "name": mk.text,
                        "by_kind": held_by_kind(live),
                    }
        return (
            best or entering or {"bytes": 0, "step": 0, "phase": phase or "", "name": None, "by_kind": held_by_kind({})}
        )

    def bytes_by_rank(self) -> list[tuple[int, int]]:
        """(sent, received) bytes of every rank over the whole run."""
        out = [[0, 0] for _ in range(self.world)]
        for e in self.events:
            for m in e.members:
                out[m.rank][0] += m.sent
                out[m.rank][1] += m.recv
        return [(s, r) for s, r in out]

    def bytes_by_link(self, gpus_per_node: int) -> dict[str, dict[str, int]]:
        """Bytes sent per group name (the axis: tp, cp, ep, pp, dp-cp, ...), split by link: "inside" a node
        (NVLink) or "across" nodes (the network), with nodes of `gpus_per_node` consecutive ranks. Each byte
        counts on the hop that carries it (comm/hops.py): a ring over two nodes sends across only on its
        hops between them, an all-to-all only on its pairs in different nodes."""
        out: dict[str, dict[str, int]] = {}
        for e in self.events:
            if e.kind == "compute":
                continue
            row = out.setdefault(e.group.name, {"inside": 0, "across": 0})
            for link, n in split_by_link(event_transfers(e), gpus_per_node).items():
                row[link] += n
        return out

    def to_dict(self) -> dict:
        meta = dict(self.meta)
        tails = meta.get("tail_work")
        if tails and any(getattr(w, "gemms", None) for w in tails):  # the products behind the tails' FLOPs
            meta["tail_work"] = [dict(w) for w in tails]
            meta["tail_gemms"] = [gemms_list(w) for w in tails]
        return {
            "format": FORMAT,
            "version": VERSION,
            "world": self.world,
            "backend": self.backend,
            "meta": meta,
            "groups": [_group_dict(g) for g in self.groups],
            "marks": [_mark_dict(m) for m in self.marks],
            "events": [e.to_dict() for e in self.events],
        }

    def to_json(self, indent: int | None = None) -> str:
        """Strict JSON (jsonout.py): a value JSON cannot carry (nan, inf) is written as its name, "nan"."""
        from ..jsonout import dumps

        return dumps(self.to_dict(), indent=indent, where="the trace")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UsageError('not a parasim trace (no "format": "parasim-trace" field)')
        if d.get("version") != VERSION:
            raise UsageError(f"trace version {brief(d.get('version'))} is not supported (this parasim reads {VERSION})")
        check_trace(d)
        try:
            meta = dict(d.get("meta") or {})
            if "tail_gemms" in meta:
                meta["tail_work"] = [work_of(w, g) for w, g in zip(meta["tail_work"], meta.pop("tail_gemms"))]
            return cls(
                d["world"],
                d.get("backend", "virtual"),
                [Group(tuple(g["ranks"]), g["name"], g["index"]) for g in d["groups"]],
                [Event.from_dict(e) for e in d["events"]],
                [Mark(**m) for m in d["marks"]],
                meta,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"malformed parasim trace: {exc!r}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        from ..limits import read_bounded

        return cls.from_json(read_bounded(str(path), "trace"), str(path))

    @classmethod
    def from_json(cls, data: bytes, name: str = "the trace") -> "Trace":
        """A trace from a file's bytes (UTF-8 JSON), checked as `load` checks it; `name` names it in errors."""
        from ..limits import read_json

        return cls.from_dict(read_json(data, name, "a parasim trace", constants=True))

"""The trace: every collective, point-to-point transfer and marked step of a run, on a logical clock.

Clock: each rank keeps a step counter. A collective (or a transfer) happens at one past the latest step
of the ranks taking part, and every member's counter moves to it. So the step of an event says how
many communication rounds deep it is, the same on every backend and every run.

The JSON form is documented in docs/trace-format.md; `FORMAT` and `VERSION` name it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .comm.interface import P2P, Group
from .comm.ops import OPS
from .errors import UsageError
from .limits import LAYOUT_WORLD

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
            "seq": self.seq, "step": self.step, "kind": self.kind, "op": self.op,
            "group": _group_dict(self.group), "ranks": self.ranks, "label": self.label,
            "phase": self.phase, "params": self.params, "algo": self.algo,
            "members": [{
                "rank": m.rank,
                "in": [{"shape": list(t.shape), "dtype": t.dtype} for t in m.ins],
                "out": [{"shape": list(t.shape), "dtype": t.dtype} for t in m.outs],
                "sent": m.sent, "recv": m.recv, "site": m.site,
                "before": None if m.before is None else list(m.before),
                "after": None if m.after is None else list(m.after),
            } for m in self.members],
            "hops": self.hops,
            **({"tags": self.tags} if self.tags is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        members = [Member(
            m["rank"], tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in m["in"]),
            tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in m["out"]), m["sent"], m["recv"], m["site"],
            None if m.get("before") is None else tuple(m["before"]),
            None if m.get("after") is None else tuple(m["after"])) for m in d["members"]]
        g = d["group"]
        return cls(d["seq"], d["step"], d["kind"], d["op"], Group(tuple(g["ranks"]), g["name"], g["index"]),
                   members, d.get("label"), d.get("phase"), d.get("params") or {}, d.get("algo"), d.get("hops"),
                   d.get("tags"))


HELD_KINDS = ("weights", "gradients", "optimizer", "activations", "gathered")


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
        for i, mk in enumerate(self.marks):
            if before is not None and i >= before:
                break
            if mk.kind == "held" and mk.rank == rank and (step is None or mk.step < step):
                apply_held(live, mk)
        return held_by_kind(live)

    def peak(self, rank: int, phase: str | None = None) -> dict[str, Any]:
        """The most bytes `rank` held at once (within `phase`, if given): {"bytes", "step", "phase", "name"
        (the hold that reached it), "by_kind"}. Holds and frees are replayed in order, so a buffer held for
        a moment between two events counts; only a hold can raise the total. A phase that holds nothing new
        reports what the rank held coming into it (name None)."""
        live: dict[str, tuple[str, int]] = {}
        now, best, entering = "", None, None
        for mk in self.marks:
            if mk.rank != rank:
                continue
            if mk.kind == "phase":
                now = mk.text
                if now == phase and entering is None:
                    entering = {"bytes": sum(b for _, b in live.values()), "step": mk.step, "phase": now,
                                "name": None, "by_kind": held_by_kind(live)}
            elif mk.kind == "held":
                apply_held(live, mk)
                total = sum(b for _, b in live.values())
                if (mk.data or {}).get("bytes") and (phase is None or now == phase) and (
                        best is None or total > best["bytes"]):
                    best = {"bytes": total, "step": mk.step, "phase": now, "name": mk.text, "by_kind": held_by_kind(live)}
        return best or entering or {"bytes": 0, "step": 0, "phase": phase or "", "name": None,
                                    "by_kind": held_by_kind({})}

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
        (NVLink) or "across" nodes (the network), with nodes of `gpus_per_node` consecutive ranks. An event
        whose members sit on more than one node counts as crossing (a point-to-point transfer: its two ends)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.events:
            if e.kind == "compute":
                continue
            ends = [e.params["src"], e.params["dst"]] if e.kind == "p2p" else list(e.group.ranks)
            link = "inside" if len({r // gpus_per_node for r in ends}) == 1 else "across"
            row = out.setdefault(e.group.name, {"inside": 0, "across": 0})
            row[link] += sum(m.sent for m in e.members)
        return out

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "world": self.world, "backend": self.backend,
            "meta": self.meta, "groups": [_group_dict(g) for g in self.groups],
            "marks": [_mark_dict(m) for m in self.marks],
            "events": [e.to_dict() for e in self.events],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UsageError("not a parasim trace (no \"format\": \"parasim-trace\" field)")
        if d.get("version") != VERSION:
            raise UsageError(f"trace version {d.get('version')} is not supported (this parasim reads {VERSION})")
        check_trace(d)
        try:
            return cls(d["world"], d.get("backend", "virtual"),
                       [Group(tuple(g["ranks"]), g["name"], g["index"]) for g in d["groups"]],
                       [Event.from_dict(e) for e in d["events"]],
                       [Mark(**m) for m in d["marks"]], d.get("meta") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"malformed parasim trace: {exc!r}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        from .limits import read_bounded
        try:
            data = json.loads(read_bounded(str(path), "trace"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path} is not JSON: {exc}") from None
        return cls.from_dict(data)


# -- the schema, checked before anything is built from a file ---------------------------------------
# A file can come from anywhere: the first bad field is named with its path (events[3].members[0].rank)
# and why, and no number read from it sizes anything before it has been bounded here.

KINDS = {"collective": set(OPS), "p2p": {P2P},
         "compute": None}  # a compute event's op is the name the program gave it
MARK_KINDS = ("phase", "note", "held", "tensor")
MARK_FIELDS = {"rank", "step", "kind", "text", "data"}


class _Bad(Exception):
    pass


def _int(v: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        bound = f"from {lo} to {hi:,}" if hi is not None else f"at least {lo}"
        raise _Bad(f"{where}: expected an integer {bound}, got {v!r:.60}")
    return v


def _of(v: Any, kind: type | tuple, where: str, what: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, kind):
        raise _Bad(f"{where}: expected {what}, got {v!r:.60}")
    return v


def _opt_str(d: dict, key: str, where: str) -> None:
    if d.get(key) is not None:
        _of(d[key], str, f"{where}.{key}", "a string or null")


def _group(g: Any, where: str, world: int) -> None:
    _of(g, dict, where, "an object")
    _int(g.get("index"), f"{where}.index")
    _of(g.get("name"), str, f"{where}.name", "a string")
    ranks = _of(g.get("ranks"), list, f"{where}.ranks", "a list of ranks")
    for i, r in enumerate(ranks):
        _int(r, f"{where}.ranks[{i}]", 0, world - 1)
    if not ranks or len(set(ranks)) != len(ranks):
        raise _Bad(f"{where}.ranks: expected distinct ranks, at least one")


def _tensors(ts: Any, where: str) -> None:
    for i, t in enumerate(_of(ts, list, where, "a list of tensors")):
        _of(t, dict, f"{where}[{i}]", "an object")
        for j, n in enumerate(_of(t.get("shape"), list, f"{where}[{i}].shape", "a list of sizes")):
            _int(n, f"{where}[{i}].shape[{j}]")
        _of(t.get("dtype"), str, f"{where}[{i}].dtype", "a dtype name")


def _event(e: Any, where: str, world: int, last: int) -> None:
    _of(e, dict, where, "an object")
    _int(e.get("seq"), f"{where}.seq", 0, last)
    _int(e.get("step"), f"{where}.step", 0, last)  # each event moves a clock on by one at most
    kind = e.get("kind")
    if kind not in KINDS:
        raise _Bad(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r:.60}")
    op = _of(e.get("op"), str, f"{where}.op", "a string")
    if KINDS[kind] is not None and op not in KINDS[kind]:
        raise _Bad(f"{where}.op: {op!r:.60} is not a {kind} operation ({', '.join(sorted(KINDS[kind]))})")
    _group(e.get("group"), f"{where}.group", world)
    members = _of(e.get("members"), list, f"{where}.members", "a list")
    for i, m in enumerate(members):
        at = f"{where}.members[{i}]"
        _of(m, dict, at, "an object")
        _int(m.get("rank"), f"{at}.rank", 0, world - 1)
        _tensors(m.get("in"), f"{at}.in")
        _tensors(m.get("out"), f"{at}.out")
        _int(m.get("sent"), f"{at}.sent")
        _int(m.get("recv"), f"{at}.recv")
        _of(m.get("site"), str, f"{at}.site", "a string")
        for key in ("before", "after"):
            if m.get(key) is not None:
                _of(m[key], list, f"{at}.{key}", "a list or null")
    for key in ("label", "phase", "algo"):
        _opt_str(e, key, where)
    if e.get("params") is not None:
        _of(e["params"], dict, f"{where}.params", "an object or null")
    if e.get("hops") is not None:
        _of(e["hops"], list, f"{where}.hops", "a list or null")
    if e.get("tags") is not None:
        _of(e["tags"], dict, f"{where}.tags", "an object or null")


def check_trace(d: dict) -> None:
    """UsageError naming the first field of trace dict `d` that is missing or out of range."""
    try:
        world = _int(d.get("world"), "world", 1, LAYOUT_WORLD)
        events = _of(d.get("events"), list, "events", "a list")
        _of(d.get("backend", "virtual"), str, "backend", "a string")
        if d.get("meta") is not None:
            _of(d["meta"], dict, "meta", "an object")
        for i, g in enumerate(_of(d.get("groups"), list, "groups", "a list")):
            _group(g, f"groups[{i}]", world)
        for i, m in enumerate(_of(d.get("marks"), list, "marks", "a list")):
            at = f"marks[{i}]"
            _of(m, dict, at, "an object")
            _int(m.get("rank"), f"{at}.rank", 0, world - 1)
            _int(m.get("step"), f"{at}.step", 0, len(events))
            if m.get("kind") not in MARK_KINDS:
                raise _Bad(f"{at}.kind: expected phase, note, held or tensor, got {m.get('kind')!r:.60}")
            _of(m.get("text"), str, f"{at}.text", "a string")
            if m.get("data") is not None:
                _of(m["data"], dict, f"{at}.data", "an object or null")
            if m["kind"] == "held":
                data = _of(m.get("data"), dict, f"{at}.data", "an object")
                if _int(data.get("bytes"), f"{at}.data.bytes") and data.get("kind") not in HELD_KINDS:  # a free has none
                    raise _Bad(f"{at}.data.kind: expected one of {', '.join(HELD_KINDS)}, got {data.get('kind')!r:.60}")
            if set(m) - MARK_FIELDS:
                raise _Bad(f"{at}: unknown field {sorted(set(m) - MARK_FIELDS)[0]!r}")
        for i, e in enumerate(events):
            _event(e, f"events[{i}]", world, len(events))
    except _Bad as exc:
        raise UsageError(f"malformed parasim trace: {exc}") from None

"""The trace file's schema, checked before anything is built from it (docs/trace-format.md). A file can
come from anywhere: the first bad field is named with its path (events[3].members[0].rank) and why, and
no number read from it is trusted to size anything before it has been bounded here."""
from __future__ import annotations

from typing import Any

from .comm.interface import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, P2P, REDUCE_SCATTER
from .errors import UsageError
from .limits import LAYOUT_WORLD

KINDS = {"collective": {ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST, BARRIER}, "p2p": {P2P},
         "compute": None}  # a compute event's op is the name the program gave it
MARK_KINDS = ("phase", "note")
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
                raise _Bad(f"{at}.kind: expected phase or note, got {m.get('kind')!r:.60}")
            _of(m.get("text"), str, f"{at}.text", "a string")
            if m.get("data") is not None:
                _of(m["data"], dict, f"{at}.data", "an object or null")
            if set(m) - MARK_FIELDS:
                raise _Bad(f"{at}: unknown field {sorted(set(m) - MARK_FIELDS)[0]!r}")
        for i, e in enumerate(events):
            _event(e, f"events[{i}]", world, len(events))
    except _Bad as exc:
        raise UsageError(f"malformed parasim trace: {exc}") from None

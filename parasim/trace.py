"""The trace: every collective, point-to-point transfer and marked step of a run, on a logical clock.

Clock: each rank keeps a step counter. A collective (or a transfer) happens at one past the latest step
of the ranks taking part, and every member's counter moves to it. So the step of an event says how
many communication rounds deep it is, the same on every backend and every run.

The JSON form is documented in docs/trace-format.md; `FORMAT` and `VERSION` name it.
"""
from __future__ import annotations

import codecs
import json
import math
import re
import reprlib
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .comm.interface import P2P, REDUCE_OPS, Group
from .comm.ops import OPS
from .errors import UsageError
from .limits import JSON_DEPTH, LAYOUT_WORLD, MAX_SIZE

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
            None if m.get("before") is None else tuple(_floats(m["before"])),
            None if m.get("after") is None else tuple(_floats(m["after"]))) for m in d["members"]]
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
        """Strict JSON (render/jsonout): a value JSON cannot carry (nan, inf) is written as its name, "nan"."""
        from .render.jsonout import dumps
        return dumps(self.to_dict(), indent=indent, where="the trace")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UsageError("not a parasim trace (no \"format\": \"parasim-trace\" field)")
        if d.get("version") != VERSION:
            raise UsageError(f"trace version {_brief(d.get('version'))} is not supported (this parasim reads "
                             f"{VERSION})")
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
        return cls.from_json(read_bounded(str(path), "trace"), str(path))

    @classmethod
    def from_json(cls, data: bytes, name: str = "the trace") -> "Trace":
        """A trace from a file's bytes (UTF-8 JSON), checked as `load` checks it; `name` names it in errors."""
        return cls.from_dict(_parse(_decode(data, name), name))


# -- reading the file ---------------------------------------------------------------------------------
# json.loads alone lets a hostile file through in several ways: UTF-16 text it decodes silently, nesting
# deep enough to raise RecursionError, an integer past Python's digit limit (ValueError), and neither of
# the last two says where. Each is one line here, naming the place.

_WIDE = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),  # before UTF-16: FF FE starts both
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def _decode(raw: bytes, path: str) -> str:
    """The file's text, UTF-8 as parasim writes it (a leading byte-order mark is allowed)."""
    wide = next((name for bom, name in _WIDE if raw.startswith(bom)), None)
    if wide is None and b"\x00" in raw[:4]:  # JSON starts in ASCII: a NUL beside it is UTF-16/32 without a mark
        wide = "UTF-16" if raw[:4].count(b"\x00") <= 2 else "UTF-32"
    if wide is not None:
        raise UsageError(f"{path} is {wide} text; a parasim trace is UTF-8 JSON (iconv -f {wide} -t UTF-8 "
                         "converts it)")
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            raise UsageError(f"{path} ends in the middle of a character: the file was cut short") from None
        raise UsageError(f"{path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start:,}); a "
                         "parasim trace is UTF-8 JSON") from None


def _parse(text: str, path: str) -> Any:
    if not text.strip():
        raise UsageError(f"{path} is empty, not a parasim trace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")  # ran into the end
        raise UsageError(f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                         + (" (the file ends there: was it cut short?)" if cut else "")) from None
    except (RecursionError, ValueError):  # nested past the reader's depth; an integer past the digit limit
        raise UsageError(f"malformed parasim trace: {_too_much(text)}") from None


# strings (escapes inside), numbers, and the punctuation that opens, closes and separates
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|[\[\]{},]')


def _too_much(text: str) -> str:
    """Where JSON `text` nests more than JSON_DEPTH levels deep or holds an integer longer than Python
    reads, and which of the two: what json.loads raised without saying where."""
    digits = sys.get_int_max_str_digits()
    # per open container: [its key (an object) or index (an array), whether an object's next string is a key]
    open_: list[list] = []
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            if len(open_) == JSON_DEPTH:
                return f"{_where(open_)}: nested more than {JSON_DEPTH} levels deep (a parasim trace nests about 12)"
            open_.append([0, False] if tok == "[" else [None, True])
        elif tok in ("]", "}"):
            if open_:
                open_.pop()
        elif tok == ",":
            if open_:
                top = open_[-1]
                if isinstance(top[0], int):
                    top[0] += 1
                else:
                    top[1] = True
        elif tok[0] == '"':
            if open_ and open_[-1][1]:
                open_[-1][:] = [tok[1:-1], False]
        elif digits and tok.lstrip("-").isdigit() and len(tok.lstrip("-")) > digits:
            return (f"{_where(open_)}: an integer of {len(tok.lstrip('-')):,} digits; Python reads at most "
                    f"{digits:,} (and no count in a trace needs more than 20)")
    return f"nested more than {JSON_DEPTH} levels deep, or an integer of more than {digits:,} digits"


def _where(open_: list[list]) -> str:
    """The path of the innermost open container's current place: groups[2].ranks[0], meta['a b']."""
    where = ""
    for key, _ in open_:
        where = _at(where, key) if key is not None else where
    return _cut(where) or "the top level"


def _cut(where: str) -> str:
    """A path a hundred levels long, cut to its start (at a step's boundary): no line holds it whole."""
    if len(where) <= 80:
        return where
    at = max(where.rfind("[", 0, 60), where.rfind(".", 0, 60))
    return where[:at if at > 0 else 60] + "..."


def _at(where: str, key: Any) -> str:
    """`where` and one step down: [3] for an index, .name for a key that reads as a name, else ['a key']."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{_brief(key)}]"


def _brief(v: Any) -> str:
    """A short repr of a value from a file, whatever its size: control characters escaped, long lists cut."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = 60
    r.maxlist = r.maxdict = 6
    r.maxlevel = 3
    return r.repr(v)


# -- the schema, checked before anything is built from a file ---------------------------------------
# A file can come from anywhere: the first bad field is named with its path (events[3].members[0].rank)
# and why. Every field a renderer or the app reads is checked here (its type, its range, how it fits the
# fields beside it), so that a renderer never raises on a loaded trace, and no number read from it sizes
# anything before it has been bounded.

KINDS = {"collective": set(OPS), "p2p": {P2P},
         "compute": None}  # a compute event's op is the name the program gave it
MARK_KINDS = ("phase", "note", "held", "tensor")
MARK_FIELDS = {"rank", "step", "kind", "text", "data"}
TENSOR_DIMS = 64  # numpy's own limit on an array's dimensions
MAX_BYTES = 16 * MAX_SIZE  # a tensor's bytes: MAX_SIZE elements of the widest dtype (complex128)
TOO_MANY_BYTES = "bytes, more than any one tensor holds"
# the params each op's placement words name (`Op.words` formats them): a reduce-scatter's dim, a broadcast's src
NAMED = {name: {f for text in op.placement for _, f, _, _ in string.Formatter().parse(text) if f}
         for name, op in OPS.items()}
# ml_dtypes' types (0.7), named as numpy names them once it is imported, and as torch names its own;
# listed, not looked up: importing ml_dtypes takes seconds, and a trace is checked in well under one
NARROW_DTYPES = frozenset(("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                           "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e5m3fnu", "float8_e8m0fnu",
                           "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int1", "int2", "int4", "uint1",
                           "uint2", "uint4", "complex32", "bcomplex32"))
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Bad(Exception):
    pass


def _int(v: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        bound = f"from {lo:,} to {hi:,}" if hi is not None else f"at least {lo}"
        raise _Bad(f"{where}: expected an integer {bound}, got {_brief(v)}")
    return v


def _of(v: Any, kind: type | tuple, where: str, what: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, kind):
        raise _Bad(f"{where}: expected {what}, got {_brief(v)}")
    return v


def _str(v: Any, where: str, what: str = "a string") -> str:
    """A string that is text: a lone surrogate (JSON's "\\ud800") is no character, and cannot be printed."""
    _of(v, str, where, what)
    bad = _SURROGATE.search(v)
    if bad:
        raise _Bad(f"{where}: {_brief(v)} holds a lone surrogate (\\u{ord(bad.group()):04x}), which is not a "
                   "character; the text is not valid Unicode")
    return v


def _opt_str(d: dict, key: str, where: str) -> None:
    if d.get(key) is not None:
        _str(d[key], f"{where}.{key}", "a string or null")


def _free(v: Any, where: str, depth: int, numbers: bool = False) -> None:
    """A free-form JSON value at nesting level `depth` (the file's top object is level 1): meta, params, tags,
    a mark's data, or with `numbers` nested lists of numbers. Only JSON's values, string keys, text without
    lone surrogates, at most JSON_DEPTH levels in all: the renderers print such values, and printing
    recurses once a level."""
    if isinstance(v, (int, float)):  # bool too
        return
    if isinstance(v, (list, dict)) and depth > JSON_DEPTH:
        raise _Bad(f"{_cut(where)}: nested more than {JSON_DEPTH} levels deep (a parasim trace nests about 12)")
    if isinstance(v, list):
        for k, x in enumerate(v):
            _free(x, f"{where}[{k}]", depth + 1, numbers)
    elif numbers:
        raise _Bad(f"{where}: expected a number or a list of numbers, got {_brief(v)}")
    elif isinstance(v, str):
        _str(v, where)
    elif isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise _Bad(f"{where}: a key of type {type(k).__name__} ({_brief(k)}); JSON's keys are strings")
            _str(k, f"{where}: a key")
            _free(x, _at(where, k), depth + 1)
    elif v is not None:
        raise _Bad(f"{where}: a {type(v).__name__} ({_brief(v)}), which is not a JSON value")


def _cap(n: int, where: str, limit: int, what: str) -> None:
    if n > limit:
        raise _Bad(f"{where}: {n:,} is more than {limit:,} {what}")


def _dtype(v: Any, where: str, known: set[str]) -> None:
    """A numeric dtype by the name numpy gives it, or one of the narrow types ml_dtypes and torch add
    (bfloat16, the float8 types); not 'object', 'str' or a misspelling, which no collective moves. `known`:
    the names already accepted."""
    name = _str(v, where, "a dtype name")
    if name in known or name in NARROW_DTYPES:
        return
    import numpy as np
    try:
        dt = np.dtype(name)
        ok = dt.name == name and dt.kind in "biufc"
    except (TypeError, ValueError, SyntaxError):
        ok = False
    if not ok:
        raise _Bad(f"{where}: {_brief(name)} is not a numeric dtype (float32, bfloat16, int64, bool, ...)")
    known.add(name)


def _group(g: Any, where: str, world: int) -> None:
    _of(g, dict, where, "an object")
    _int(g.get("index"), f"{where}.index")
    _str(g.get("name"), f"{where}.name")
    ranks = _of(g.get("ranks"), list, f"{where}.ranks", "a list of ranks")
    for i, r in enumerate(ranks):
        _int(r, f"{where}.ranks[{i}]", 0, world - 1)
    if not ranks or len(set(ranks)) != len(ranks):
        raise _Bad(f"{where}.ranks: expected distinct ranks, at least one")


def _tensors(ts: Any, where: str, known: set[str]) -> list[list[int]]:
    """The shapes of a member's tensors: at most TENSOR_DIMS sizes and MAX_SIZE elements each."""
    shapes = []
    for i, t in enumerate(_of(ts, list, where, "a list of tensors")):
        _of(t, dict, f"{where}[{i}]", "an object")
        shape = _of(t.get("shape"), list, f"{where}[{i}].shape", "a list of sizes")
        if len(shape) > TENSOR_DIMS:
            raise _Bad(f"{where}[{i}].shape: {len(shape):,} dimensions; an array has at most {TENSOR_DIMS}")
        elements = 1
        for j, n in enumerate(shape):
            elements *= _int(n, f"{where}[{i}].shape[{j}]", 0, MAX_SIZE)
            if elements > MAX_SIZE:  # checked as the product grows: it never gets past MAX_SIZE squared
                raise _Bad(f"{where}[{i}].shape: {_brief(shape)} is more than {MAX_SIZE:,} elements, more than "
                           "any one tensor holds")
        _dtype(t.get("dtype"), f"{where}[{i}].dtype", known)
        shapes.append(shape)
    return shapes


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how strict JSON carries them (jsonout)


def _floats(values: Any) -> Any:
    """Kept values as read, with the names of non-finite floats ("nan", "inf", "-inf") turned back into them."""
    if isinstance(values, list):
        return [_floats(v) for v in values]
    return NON_FINITE[values] if isinstance(values, str) else values


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) or (isinstance(x, str) and x in NON_FINITE)  # bool too: a bool tensor's


def _fits(x: Any, shape: list[int], where: str, whole: list[int]) -> None:
    """Values `x` (nested lists) fit a tensor of shape `whole`; `shape` is what is left of it below `where`."""
    if not shape:
        if not _number(x):
            raise _Bad(f"{where}: expected a number, got {_brief(x)}")
        return
    if not isinstance(x, list) or len(x) != shape[0]:
        size = f"a list of {shape[0]:,} values" if shape[0] else "an empty list"
        raise _Bad(f"{where}: expected {size} (a tensor of shape {whole}), got {_brief(x)}")
    if len(shape) == 1:
        bad = next((k for k, y in enumerate(x) if not _number(y)), None)
        if bad is not None:
            raise _Bad(f"{where}[{bad}]: expected a number, got {_brief(x[bad])}")
        return
    for k, y in enumerate(x):
        _fits(y, shape[1:], f"{where}[{k}]", whole)


def _values(v: Any, where: str, shapes: list[list[int]]) -> None:
    """`before` / `after`: one entry per tensor, each holding that tensor's values in its shape."""
    _of(v, list, where, "a list of values (one entry per tensor) or null")
    if len(v) != len(shapes):
        raise _Bad(f"{where}: {len(v)} entries for {len(shapes)} tensor(s); expected one per tensor")
    for j, (x, shape) in enumerate(zip(v, shapes)):
        _fits(x, shape, f"{where}[{j}]", shape)


def _member(m: Any, at: str, world: int, known: set[str]) -> int:
    _of(m, dict, at, "an object")
    rank = _int(m.get("rank"), f"{at}.rank", 0, world - 1)
    shapes = {"in": _tensors(m.get("in"), f"{at}.in", known), "out": _tensors(m.get("out"), f"{at}.out", known)}
    for key in ("sent", "recv"):
        _cap(_int(m.get(key), f"{at}.{key}"), f"{at}.{key}", MAX_BYTES, TOO_MANY_BYTES)
    _str(m.get("site"), f"{at}.site")
    for key, side in (("before", "in"), ("after", "out")):
        if m.get(key) is not None:
            _values(m[key], f"{at}.{key}", shapes[side])
    return rank


def _params(e: dict, where: str, ranks: list[int]) -> None:
    """The call's arguments that screens read: the fields an op's placement words name, the reduction, the
    roots (ranks taking part), a transfer's ends (its members), a compute step's flops."""
    at = f"{where}.params"
    params = e.get("params")
    if params is None:
        params = {}
    else:
        _free(_of(params, dict, at, "an object or null"), at, 4)
    for key in sorted(NAMED[e["op"]] if e["kind"] == "collective" else ()):
        if key not in params:
            raise _Bad(f"{at}: no {key!r}, which a {e['op']} names ({' / '.join(OPS[e['op']].placement)})")
    if "dim" in params:
        _int(params["dim"], f"{at}.dim", -TENSOR_DIMS, TENSOR_DIMS - 1)
    if "op" in params and params["op"] not in REDUCE_OPS:
        raise _Bad(f"{at}.op: expected one of {', '.join(REDUCE_OPS)}, got {_brief(params['op'])}")
    if e["kind"] == "p2p" and [params.get("src"), params.get("dst")] != ranks:
        raise _Bad(f"{at}: src {_brief(params.get('src'))} and dst {_brief(params.get('dst'))} are not the "
                   f"members' ranks {ranks} (the sender, then the receiver)")
    for key in ("src", "dst"):
        if key in params and e["kind"] == "collective" and params[key] not in ranks:
            raise _Bad(f"{at}.{key}: expected a rank of the group {_brief(ranks)}, got {_brief(params[key])}")
    flops = params.get("flops", 0)
    if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not 0 <= flops < float("inf"):
        raise _Bad(f"{at}.flops: expected a finite number of operations, at least 0, got {_brief(flops)}")


def _hops(hops: Any, where: str, world: int) -> None:
    """A ring's hops, each transfer with its ends, chunk, bytes and (when kept) values."""
    for i, hop in enumerate(_of(hops, list, where, "a list or null")):
        at = f"{where}[{i}]"
        _of(hop, dict, at, "an object")
        _str(hop.get("phase"), f"{at}.phase")
        _int(hop.get("hop"), f"{at}.hop", 0, MAX_SIZE)
        for j, t in enumerate(_of(hop.get("transfers"), list, f"{at}.transfers", "a list")):
            tat = f"{at}.transfers[{j}]"
            _of(t, dict, tat, "an object")
            _int(t.get("src"), f"{tat}.src", 0, world - 1)
            _int(t.get("dst"), f"{tat}.dst", 0, world - 1)
            _int(t.get("chunk"), f"{tat}.chunk", 0, MAX_SIZE)
            _cap(_int(t.get("bytes"), f"{tat}.bytes"), f"{tat}.bytes", MAX_BYTES, TOO_MANY_BYTES)
            if "value" not in t:
                raise _Bad(f"{tat}: no 'value' (null where the values were not kept)")
            if t["value"] is not None:
                _free(t["value"], f"{tat}.value", 8, numbers=True)


def _event(e: Any, where: str, i: int, world: int, last: int, groups: list, clock: dict[int, int],
           known: set[str]) -> None:
    _of(e, dict, where, "an object")
    seq = _int(e.get("seq"), f"{where}.seq", 0, last)
    if seq != i:
        raise _Bad(f"{where}.seq: expected {i}, got {seq} (events are listed in the order they completed, "
                   "numbered 0, 1, 2, ...)")
    step = _int(e.get("step"), f"{where}.step", 0, last)  # each event moves a clock on by one at most
    kind = e.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise _Bad(f"{where}.kind: expected one of {', '.join(KINDS)}, got {_brief(kind)}")
    op = _str(e.get("op"), f"{where}.op")
    if KINDS[kind] is not None and op not in KINDS[kind]:
        raise _Bad(f"{where}.op: {_brief(op)} is not a {kind} operation ({', '.join(sorted(KINDS[kind]))})")
    g = e.get("group")
    _group(g, f"{where}.group", world)
    listed = groups[g["index"]] if g["index"] < len(groups) else None
    if listed is None or (listed["name"], listed["ranks"]) != (g["name"], g["ranks"]):
        raise _Bad(f"{where}.group: {_brief(g['name'])} {_brief(g['ranks'])} is not groups[{g['index']}] (an "
                   "event's group is one of the trace's groups)")
    members = _of(e.get("members"), list, f"{where}.members", "a list")
    ranks = [_member(m, f"{where}.members[{j}]", world, known) for j, m in enumerate(members)]
    if kind == "collective" and ranks != g["ranks"]:
        raise _Bad(f"{where}.members: ranks {_brief(ranks)} are not the group's {_brief(g['ranks'])} (a "
                   "collective's members are its group's ranks, in group order)")
    if kind == "p2p" and (len(ranks) != 2 or ranks[0] == ranks[1]):
        raise _Bad(f"{where}.members: ranks {_brief(ranks)}; a transfer has two members, the sender then the "
                   "receiver")
    if kind == "p2p" and [(len(m["in"]), len(m["out"])) for m in members] != [(1, 0), (0, 1)]:
        raise _Bad(f"{where}.members: a transfer's sender has one array in and none out, its receiver none in "
                   "and one out")
    if kind == "compute" and len(ranks) != 1:
        raise _Bad(f"{where}.members: ranks {_brief(ranks)}; a compute step has one member, the rank that ran it")
    for r in ranks:
        if step < clock.get(r, 0):
            raise _Bad(f"{where}.step: {step} is before step {clock[r]}, where rank {r}'s previous event was (a "
                       "rank's events are listed in the order its clock reached them)")
        clock[r] = step
    for key in ("label", "phase", "algo"):
        _opt_str(e, key, where)
    _params(e, where, ranks)
    if e.get("hops") is not None:
        _hops(e["hops"], f"{where}.hops", world)
    tags = e.get("tags")
    if tags is not None:
        _free(_of(tags, dict, f"{where}.tags", "an object or null"), f"{where}.tags", 4)
        if "slot" in tags:
            _int(tags["slot"], f"{where}.tags.slot", 0, MAX_SIZE)


def _mark(m: Any, at: str, world: int, last: int, clock: dict[int, int]) -> None:
    _of(m, dict, at, "an object")
    extra = next((k for k in m if k not in MARK_FIELDS), None)
    if extra is not None:
        raise _Bad(f"{at}: unknown field {_brief(extra)}")
    rank = _int(m.get("rank"), f"{at}.rank", 0, world - 1)
    step = _int(m.get("step"), f"{at}.step", 0, last)
    if step < clock.get(rank, 0):
        raise _Bad(f"{at}.step: {step} is before step {clock[rank]}, where rank {rank}'s previous mark was (a "
                   "rank's marks are listed in the order it made them)")
    clock[rank] = step
    kind = m.get("kind")
    if not isinstance(kind, str) or kind not in MARK_KINDS:
        raise _Bad(f"{at}.kind: expected phase, note, held or tensor, got {_brief(kind)}")
    _str(m.get("text"), f"{at}.text")
    data = m.get("data")
    if data is not None:
        _free(_of(data, dict, f"{at}.data", "an object or null"), f"{at}.data", 4)
    if kind == "held":  # the fields Trace.held and Trace.peak add up
        data = _of(data, dict, f"{at}.data", "an object")
        n = _int(data.get("bytes"), f"{at}.data.bytes")
        _cap(n, f"{at}.data.bytes", MAX_BYTES, TOO_MANY_BYTES)
        if n and data.get("kind") not in HELD_KINDS:  # a free has none
            raise _Bad(f"{at}.data.kind: expected one of {', '.join(HELD_KINDS)}, got {_brief(data.get('kind'))}")
    elif kind == "note" and data is not None:  # the fields the app reads: a followed token, a slot table's row
        if data.get("watch") == "holds":
            _str(data.get("token"), f"{at}.data.token", "the followed token's name")
        if "table_row" in data:
            _int(data["table_row"], f"{at}.data.table_row", 1, MAX_SIZE)
            for j, c in enumerate(_of(data.get("cells"), list, f"{at}.data.cells", "a list of slot labels")):
                if not _str(c, f"{at}.data.cells[{j}]", "a slot label ('.' when idle)"):
                    raise _Bad(f"{at}.data.cells[{j}]: expected a slot label ('.' when idle), got ''")
    elif kind == "phase" and data is not None:  # where a followed token is: a micro-batch's layer
        for key in ("micro_batch", "layer"):
            if key in data:
                _int(data[key], f"{at}.data.{key}", 0, MAX_SIZE)


def check_trace(d: dict) -> None:
    """UsageError naming the first field of trace dict `d` that is missing, out of range, or does not fit
    the fields beside it (a member that is not of its group, values that do not fit their shape)."""
    try:
        world = _int(d.get("world"), "world", 1, LAYOUT_WORLD)
        events = _of(d.get("events"), list, "events", "a list")
        _str(d.get("backend", "virtual"), "backend")
        meta = d.get("meta")
        if meta is not None:
            _free(_of(meta, dict, "meta", "an object"), "meta", 2)
            if "lesson" in meta:
                _str(meta["lesson"], "meta.lesson", "a lesson's name")
        groups = _of(d.get("groups"), list, "groups", "a list")
        for i, g in enumerate(groups):
            _group(g, f"groups[{i}]", world)
            if g["index"] != i:
                raise _Bad(f"groups[{i}].index: expected {i}, got {g['index']} (groups are listed in the order "
                           "they were made, numbered 0, 1, 2, ...)")
        clock: dict[int, int] = {}
        for i, m in enumerate(_of(d.get("marks"), list, "marks", "a list")):
            _mark(m, f"marks[{i}]", world, len(events), clock)
        clock, known = {}, set()
        for i, e in enumerate(events):
            _event(e, f"events[{i}]", i, world, len(events), groups, clock, known)
    except _Bad as exc:
        raise UsageError(f"malformed parasim trace: {exc}") from None

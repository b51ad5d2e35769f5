"""A trace file checked field by field before anything is built from it (comm/trace.py builds the Trace).

A file can come from anywhere: the first bad field is named with its path (events[3].members[0].rank)
and why. Every field a renderer or the app reads is checked here (its type, its range, how it fits the
fields beside it), so that a renderer never raises on a loaded trace, and no number read from it sizes
anything before it has been bounded. Reading the bytes as JSON (encodings, nesting, digits) is
limits.read_json's.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

from .interface import P2P, REDUCE_OPS
from .ops import OPS
from ..errors import UsageError
from ..limits import JSON_DEPTH, LAYOUT_WORLD, MAX_SIZE, brief as _brief, cut_path as _cut, json_step as _at

HELD_KINDS = ("weights", "gradients", "optimizer", "activations", "gathered")  # what ctx.hold may say a rank keeps
# an event's kinds and the ops each allows: the op table's entries as the check reads them (a collective added
# to it is accepted with nothing added here); a compute event's op is the name the program gave it
EVENT_KINDS = {"collective": OPS, "p2p": {P2P}, "compute": None}
MARK_KINDS = ("phase", "note", "held", "tensor", "work")
MARK_FIELDS = {"rank", "step", "kind", "text", "data"}
TENSOR_DIMS = 64  # numpy's own limit on an array's dimensions
MAX_BYTES = 16 * MAX_SIZE  # a tensor's bytes: MAX_SIZE elements of the widest dtype (complex128)
TOO_MANY_BYTES = "bytes, more than any one tensor holds"


def named(op: str) -> set[str]:
    """The params op `op`'s placement words name (`Op.words` formats them): a reduce-scatter's dim, a
    broadcast's src."""
    return {f for text in OPS[op].placement for _, f, _, _ in string.Formatter().parse(text) if f}


# ml_dtypes' types (0.7), named as numpy names them once it is imported, and as torch names its own;
# listed, not looked up: a trace written with one ml_dtypes release reads the same with another, older
# releases lacking some of these names
NARROW_DTYPES = frozenset(
    (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e4m3",
        "float8_e3m4",
        "float8_e5m3fnu",
        "float8_e8m0fnu",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float4_e2m1fn",
        "int1",
        "int2",
        "int4",
        "uint1",
        "uint2",
        "uint4",
        "complex32",
        "bcomplex32",
    )
)
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
        raise _Bad(
            f"{where}: {_brief(v)} holds a lone surrogate (\\u{ord(bad.group()):04x}), which is not a "
            "character; the text is not valid Unicode"
        )
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
                raise _Bad(
                    f"{where}[{i}].shape: {_brief(shape)} is more than {MAX_SIZE:,} elements, more than "
                    "any one tensor holds"
                )
        _dtype(t.get("dtype"), f"{where}[{i}].dtype", known)
        shapes.append(shape)
    return shapes


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how strict JSON carries them (jsonout)


def kept_values(values: Any) -> Any:
    """Kept values as read, with the names of non-finite floats ("nan", "inf", "-inf") turned back into them."""
    if isinstance(values, list):
        return [kept_values(v) for v in values]
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
    if m.get("work") is not None:
        for kind, flops in _of(m["work"], dict, f"{at}.work", "an object").items():
            _amount(flops, f"{at}.work.{kind}")
    if m.get("gemms") is not None:
        _gemms(m["gemms"], f"{at}.gemms")
    return rank


def _gemms(x: Any, at: str) -> None:
    """The products behind a member's work: [kind, m, n, k, how many] each, kind a work kind, sizes whole."""
    for i, g in enumerate(_of(x, list, at, "a list")):
        if not isinstance(g, list) or len(g) != 5 or g[0] not in ("matmul", "attention"):
            raise _Bad(f"{at}[{i}]: expected [kind, m, n, k, count] with kind matmul or attention, got {_brief(g)}")
        for j, v in enumerate(g[1:]):
            _int(v, f"{at}[{i}][{j + 1}]", 1)


def _amount(x: Any, at: str) -> float:
    """A finite number >= 0 (FLOPs, microseconds)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf"):
        raise _Bad(f"{at}: expected a number >= 0, got {_brief(x)}")
    return float(x)


def _time(t: Any, at: str, ranks: list[int]) -> None:
    """The clock's times on an event: its transfer's start and end, and the compute before it per member."""
    _of(t, dict, at, "an object")
    start, end = _amount(t.get("start_us"), f"{at}.start_us"), _amount(t.get("end_us"), f"{at}.end_us")
    if end < start:
        raise _Bad(f"{at}: ends at {end} us, before it starts at {start} us")
    for j, row in enumerate(_of(t.get("before", []), list, f"{at}.before", "a list")):
        if not isinstance(row, list) or len(row) != 3 or row[0] not in ranks:
            raise _Bad(f"{at}.before[{j}]: expected [rank, start_us, end_us] of one of the members {_brief(ranks)}")
        if _amount(row[2], f"{at}.before[{j}]") < _amount(row[1], f"{at}.before[{j}]"):
            raise _Bad(f"{at}.before[{j}]: the compute ends before it starts")


def _params(e: dict, where: str, ranks: list[int]) -> None:
    """The call's arguments that screens read: the fields an op's placement words name, the reduction, the
    roots (ranks taking part), a transfer's ends (its members), a compute step's flops."""
    at = f"{where}.params"
    params = e.get("params")
    if params is None:
        params = {}
    else:
        _free(_of(params, dict, at, "an object or null"), at, 4)
    for key in sorted(named(e["op"]) if e["kind"] == "collective" else ()):
        if key not in params:
            raise _Bad(f"{at}: no {key!r}, which a {e['op']} names ({' / '.join(OPS[e['op']].placement)})")
    if "dim" in params:
        _int(params["dim"], f"{at}.dim", -TENSOR_DIMS, TENSOR_DIMS - 1)
    if "op" in params and params["op"] not in REDUCE_OPS:
        raise _Bad(f"{at}.op: expected one of {', '.join(REDUCE_OPS)}, got {_brief(params['op'])}")
    if e["kind"] == "p2p" and [params.get("src"), params.get("dst")] != ranks:
        raise _Bad(
            f"{at}: src {_brief(params.get('src'))} and dst {_brief(params.get('dst'))} are not the "
            f"members' ranks {ranks} (the sender, then the receiver)"
        )
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


def _event(
    e: Any, where: str, i: int, world: int, last: int, groups: list, clock: dict[int, int], known: set[str]
) -> None:
    _of(e, dict, where, "an object")
    seq = _int(e.get("seq"), f"{where}.seq", 0, last)
    if seq != i:
        raise _Bad(
            f"{where}.seq: expected {i}, got {seq} (events are listed in the order they completed, "
            "numbered 0, 1, 2, ...)"
        )
    step = _int(e.get("step"), f"{where}.step", 0, last)  # each event moves a clock on by one at most
    kind = e.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_KINDS:
        raise _Bad(f"{where}.kind: expected one of {', '.join(EVENT_KINDS)}, got {_brief(kind)}")
    op = _str(e.get("op"), f"{where}.op")
    ops = EVENT_KINDS[kind]
    if ops is not None and op not in ops:
        raise _Bad(f"{where}.op: {_brief(op)} is not a {kind} operation ({', '.join(sorted(ops))})")
    g = e.get("group")
    _group(g, f"{where}.group", world)
    listed = groups[g["index"]] if g["index"] < len(groups) else None
    if listed is None or (listed["name"], listed["ranks"]) != (g["name"], g["ranks"]):
        raise _Bad(
            f"{where}.group: {_brief(g['name'])} {_brief(g['ranks'])} is not groups[{g['index']}] (an "
            "event's group is one of the trace's groups)"
        )
    members = _of(e.get("members"), list, f"{where}.members", "a list")
    ranks = [_member(m, f"{where}.members[{j}]", world, known) for j, m in enumerate(members)]
    if kind == "collective" and ranks != g["ranks"]:
        raise _Bad(
            f"{where}.members: ranks {_brief(ranks)} are not the group's {_brief(g['ranks'])} (a "
            "collective's members are its group's ranks, in group order)"
        )
    if kind == "p2p" and (len(ranks) != 2 or ranks[0] == ranks[1]):
        raise _Bad(f"{where}.members: ranks {_brief(ranks)}; a transfer has two members, the sender then the receiver")
    if kind == "p2p" and [(len(m["in"]), len(m["out"])) for m in members] != [(1, 0), (0, 1)]:
        raise _Bad(
            f"{where}.members: a transfer's sender has one array in and none out, its receiver none in and one out"
        )
    if kind == "compute" and len(ranks) != 1:
        raise _Bad(f"{where}.members: ranks {_brief(ranks)}; a compute step has one member, the rank that ran it")
    for r in ranks:
        if step < clock.get(r, 0):
            raise _Bad(
                f"{where}.step: {step} is before step {clock[r]}, where rank {r}'s previous event was (a "
                "rank's events are listed in the order its clock reached them)"
            )
        clock[r] = step
    for key in ("label", "phase", "algo"):
        _opt_str(e, key, where)
    _params(e, where, ranks)
    if e.get("hops") is not None:
        _hops(e["hops"], f"{where}.hops", world)
    if e.get("time") is not None:
        _time(e["time"], f"{where}.time", ranks)
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
        raise _Bad(
            f"{at}.step: {step} is before step {clock[rank]}, where rank {rank}'s previous mark was (a "
            "rank's marks are listed in the order it made them)"
        )
    clock[rank] = step
    kind = m.get("kind")
    if not isinstance(kind, str) or kind not in MARK_KINDS:
        raise _Bad(f"{at}.kind: expected phase, note, held, tensor or work, got {_brief(kind)}")
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
    elif kind == "work":  # FLOPs by kind a rank did at the end of a phase, after its last event in it
        for k, v in _of(data, dict, f"{at}.data", "an object").items():
            _amount(v, f"{at}.data.{k}")
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
            if "tail_gemms" in meta:  # one list of products per rank, beside tail_work's FLOPs
                tails = _of(meta["tail_gemms"], list, "meta.tail_gemms", "a list")
                if len(tails) != len(_of(meta.get("tail_work"), list, "meta.tail_work", "a list")):
                    raise _Bad("meta.tail_gemms: one list per rank of meta.tail_work")
                for r, g in enumerate(tails):
                    _gemms(g, f"meta.tail_gemms[{r}]")
        groups = _of(d.get("groups"), list, "groups", "a list")
        for i, g in enumerate(groups):
            _group(g, f"groups[{i}]", world)
            if g["index"] != i:
                raise _Bad(
                    f"groups[{i}].index: expected {i}, got {g['index']} (groups are listed in the order "
                    "they were made, numbered 0, 1, 2, ...)"
                )
        clock: dict[int, int] = {}
        for i, m in enumerate(_of(d.get("marks"), list, "marks", "a list")):
            _mark(m, f"marks[{i}]", world, len(events), clock)
        clock, known = {}, set[str]()
        for i, e in enumerate(events):
            _event(e, f"events[{i}]", i, world, len(events), groups, clock, known)
    except _Bad as exc:
        raise UsageError(f"malformed parasim trace: {exc}") from None

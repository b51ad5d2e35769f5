"""A real run compared with the virtual run of the same program, rank by rank and call by call: op, group,
shapes, dtypes, bytes, call site and values (exact, except floats computed in another order, which may be
off by the rounding engine/tolerance.py bounds and no more)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, cast

import numpy as np

from ..comm.interface import BFLOAT16
from ..comm.trace import Trace
from .tolerance import Closeness, additions, counted, measure, worst
from .virtual import RunResult

# How close values must be is engine/tolerance.py's bound of a sum's rounding, never a fixed share: a sum a
# call made (all_reduce, reduce_scatter, reduce with op sum or avg) may be off by its own additions' roundings
# of the sum of its terms' magnitudes, element by element, plus whatever its inputs were already off; a value
# the program computed itself (torch on real ranks, numpy on virtual ones) by the roundings ctx.xp counted on
# its rank (engine/work.py) and its calls' sums, relative to its array's largest value. On gloo, 16-bit float
# sums are bit for bit (the virtual kernel adds in gloo's order: comm/kernels.py); NCCL's orders differ.
MAX_DIFFS = 20


# -- per-rank views ------------------------------------------------------------------------------


def _item(
    kind: str,
    op: str,
    group: tuple,
    params: dict,
    label: Any,
    ins,
    outs,
    sent: int,
    recv: int,
    site: str,
    before: Any,
    after: Any,
    hops: Any,
    **extra: Any,
) -> dict:
    if extra.get("role") == "recv":
        label = None  # a transfer carries its sender's label; the receiver's own label names its whole batch
    return {
        "kind": kind,
        "op": op,
        "group": group,
        "params": params,
        "label": label,
        "ins": [(tuple(s), d) for s, d in ins],
        "outs": [(tuple(s), d) for s, d in outs],
        "sent": sent,
        "recv": recv,
        "site": site,
        "before": before,
        "after": after,
        "hops": hops,
        **extra,
    }


def _canonical(items: list[dict]) -> list[dict]:
    """Transfers of one batched exchange may complete in any order; sort each run of them by (role, peer),
    stably, so both backends list them alike (per-pair order is FIFO on both)."""
    out, run_ = [], []
    for it in items + [None]:
        if it is not None and it["kind"] == "p2p":
            run_.append(it)
            continue
        out += sorted(run_, key=lambda x: (x["role"], x["peer"]))
        run_ = []
        if it is not None:
            out.append(it)
    return out


def views_from_trace(trace: Trace) -> list[list[dict]]:
    views: list[list[dict]] = [[] for _ in range(trace.world)]
    for e in trace.events:
        group = (e.group.name, tuple(e.group.ranks))
        for i, m in enumerate(e.members):
            hops = None
            if e.hops is not None:
                hops = [
                    (h["phase"], h["hop"], t["chunk"], t["bytes"], t["value"])
                    for h in e.hops
                    for t in h["transfers"]
                    if t["src"] == m.rank
                ]
            extra = {}
            if e.kind == "p2p":
                extra = {"role": "send" if i == 0 else "recv", "peer": e.members[1 - i].rank}
            views[m.rank].append(
                _item(
                    e.kind,
                    e.op,
                    group,
                    e.params,
                    e.label,
                    m.ins,
                    m.outs,
                    m.sent,
                    m.recv,
                    m.site,
                    _lists(m.before),
                    _lists(m.after),
                    hops,
                    seq=e.seq,
                    **extra,
                )
            )
    return [_canonical(v) for v in views]


def views_from_records(results: list[dict]) -> list[list[dict]]:
    views = []
    for res in results:
        items = []
        for rec in res["records"]:
            if rec["kind"] == "mark":
                continue
            if rec["kind"] == "compute":
                items.append(
                    _item(
                        "compute",
                        rec["op"],
                        ("world", tuple(range(res["world"]))),
                        rec["params"],
                        None,
                        [],
                        [],
                        0,
                        0,
                        rec["site"],
                        None,
                        None,
                        None,
                    )
                )
                continue
            _, name, ranks = rec["group"]
            hops = None
            if rec["hops"] is not None:
                hops = [
                    (h["phase"], h["hop"], t["chunk"], t["bytes"], t["value"])
                    for h in rec["hops"]
                    for t in h["transfers"]
                ]
            extra = {"role": rec["role"], "peer": rec["peer"]} if rec["kind"] == "p2p" else {}
            items.append(
                _item(
                    rec["kind"],
                    rec["op"],
                    (name, tuple(ranks)),
                    rec["params"],
                    rec["label"],
                    rec["ins"],
                    rec["outs"],
                    rec["sent"],
                    rec["recv"],
                    rec["site"],
                    rec["before"],
                    rec["after"],
                    hops,
                    **extra,
                )
            )
        views.append(_canonical(items))
    return views


def _lists(v: Any) -> Any:
    return None if v is None else [list(x) if isinstance(x, tuple) else x for x in v]


# -- comparison ----------------------------------------------------------------------------------


def _numbers(v: Any) -> np.ndarray:
    """A value as a numpy array; bfloat16 as float64 (exact), since numpy's float rules do not know it."""
    a = np.asarray(v)
    return a.astype(np.float64) if a.dtype == BFLOAT16 else a


def _floats(a: np.ndarray, b: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating) and np.issubdtype(b.dtype, np.floating)


@dataclass(frozen=True)
class Allowance:
    """What a comparison allows: `roundings` on each side, of `magnitude` (the sum of the terms' magnitudes,
    per element; None: the virtual array's largest magnitude), plus `slack` carried in from a sum's inputs."""

    roundings: int
    of: str
    magnitude: Any = None
    slack: Any = 0.0


def values_close(real: Any, virtual: Any, dtype: str | None, allow: Allowance) -> tuple[bool, Closeness | None]:
    """(equal within `allow`, how close: None when no allowance was needed). Exact, except floats that are
    not integer-valued float64. NaN equals NaN at the same place; a NaN on one side only is a difference."""
    if real is None or virtual is None:
        return real is None and virtual is None, None
    try:
        a, b = _numbers(real), _numbers(virtual)
    except (TypeError, ValueError):  # ragged: compare part by part
        if not isinstance(real, (list, tuple)) or not isinstance(virtual, (list, tuple)) or len(real) != len(virtual):
            return False, None
        return _parts([values_close(x, y, dtype, allow) for x, y in zip(real, virtual)])
    if a.shape != b.shape:
        return False, None
    if a.dtype == object or b.dtype == object:
        return _parts([values_close(x, y, dtype, allow) for x, y in zip(a.reshape(-1), b.reshape(-1))])
    floats = _floats(a, b)
    if np.array_equal(a, b, equal_nan=floats):
        return True, None
    if not floats or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False, None
    known = b[~np.isnan(b)]
    if np.all(np.isfinite(known)) and np.all(known == np.round(known)) and (dtype in (None, "float64")):
        return False, None  # integer-valued float64 data must match exactly
    magnitude = allow.magnitude
    if magnitude is None:  # an entry that nearly cancels to zero may be off by roundings of the array's largest
        finite = np.abs(b[np.isfinite(b)]).astype(np.float64)
        magnitude = float(np.max(finite)) if finite.size else 0.0
    c = measure(
        a.astype(np.float64),
        b.astype(np.float64),
        dtype or b.dtype.name,
        allow.roundings,
        magnitude,
        allow.of,
        allow.slack,
    )
    return c.ok, c


def _parts(parts: list[tuple[bool, Closeness | None]]) -> tuple[bool, Closeness | None]:
    return all(p[0] for p in parts), worst([p[1] for p in parts])


def _sums(virtual: RunResult, vviews: list[list[dict]], rviews: list[list[dict]]) -> dict[tuple[int, int], Allowance]:
    """(rank, call) -> what the result of each sum a call made (op sum or avg) may be off by: the additions of
    the sum (one more for the average's division), of the sum of its terms' magnitudes, element by element,
    plus the sum of how far the real inputs were off already (when every member's values were kept)."""
    where = {(v["seq"], r): i for r, view in enumerate(vviews) for i, v in enumerate(view) if "seq" in v}
    out: dict[tuple[int, int], Allowance] = {}
    for e in virtual.trace.events:
        roundings = additions(e.op, e.params, e.group.size) if e.kind == "collective" else 0
        if not roundings:
            continue
        if any(m.before is None or m.before[0] is None for m in e.members):
            continue
        n, avg = e.group.size, e.params["op"] == "avg"
        terms = [np.asarray(_numbers(cast(tuple, m.before)[0]), dtype=np.float64) for m in e.members]  # kept: above
        if len({t.shape for t in terms}) != 1:
            continue
        magnitude = sum(np.abs(t) for t in terms) / (n if avg else 1)
        slack = _input_gaps(e, terms, where, rviews) / (n if avg else 1)
        for i, m in enumerate(e.members):
            mine, extra = magnitude, slack
            if e.op == "reduce_scatter":  # member i keeps chunk i along dim
                mine, extra = (
                    np.split(np.broadcast_to(x, terms[0].shape), n, axis=e.params["dim"])[i] for x in (magnitude, slack)
                )
            key = (m.rank, where.get((e.seq, m.rank), -1))
            out[key] = Allowance(
                roundings, "each sum" + (", plus its inputs' own gaps" if np.any(extra) else ""), mine, extra
            )
    return out


def _input_gaps(e: Any, terms: list[np.ndarray], where: dict, rviews: list[list[dict]]) -> Any:
    """Sum over the members of how far each one's real input was from its virtual input (0 when unknown)."""
    gaps = np.zeros_like(terms[0])
    for m, t in zip(e.members, terms):
        i = where.get((e.seq, m.rank))
        real = rviews[m.rank][i]["before"] if i is not None and i < len(rviews[m.rank]) else None
        if real is None:
            continue
        try:
            got = np.asarray(_numbers(real[0]), dtype=np.float64)
        except (TypeError, ValueError, IndexError):
            continue
        if got.shape == t.shape:
            with np.errstate(invalid="ignore"):
                gaps += np.where(np.isnan(got) & np.isnan(t), 0.0, np.abs(got - t))
    return np.where(np.isnan(gaps), np.inf, gaps)


def _own(virtual: RunResult, results: list[dict]) -> list[Allowance]:
    """Per rank, what a value its program computed itself may be off by: the roundings seen on the rank (its
    products and sums, counted on virtual ranks through ctx.xp and on real ranks through torch, and its calls'
    sums: tolerance.counted), at least one (two libraries may round a function such as exp apart), of its
    array's largest value."""
    seen = [int(r.get("roundings", 0)) for r in results]
    return [Allowance(max(1, k), "their array's largest value") for k in counted(virtual, seen)]


def compare(virtual: RunResult, results: list[dict]) -> tuple[list[str], Closeness | None]:
    """Differences between a real run (per-rank results) and the virtual run of the same program, and the
    comparison that came closest to its allowance (None: every value bit for bit)."""
    diffs: list[str] = []
    if virtual.world != len(results):
        return [f"world sizes differ: real {len(results)}, virtual {virtual.world}"], None
    vviews, rviews = views_from_trace(virtual.trace), views_from_records(results)
    sums = _sums(virtual, vviews, rviews)
    own = _own(virtual, results)
    close: list[Closeness | None] = []
    inherited: list[list[tuple[Any, Allowance]]] = [[] for _ in range(virtual.world)]
    for r, (vv, rv) in enumerate(zip(vviews, rviews)):
        if len(vv) != len(rv):
            diffs.append(f"rank {r}: {len(rv)} calls on real ranks, {len(vv)} on virtual ranks")
        for i, (v, x) in enumerate(zip(vv, rv)):
            where = f"rank {r}, call {i} ({v['op']} at {v['site']})"
            for key in (
                "kind",
                "op",
                "group",
                "params",
                "label",
                "ins",
                "outs",
                "sent",
                "recv",
                "site",
                "role",
                "peer",
            ):
                if v.get(key) != x.get(key):
                    diffs.append(f"{where}: {key} differs: real {x.get(key)!r}, virtual {v.get(key)!r}")
            dtype = (v["outs"] or v["ins"] or [((), None)])[0][1]
            for key in ("before", "after"):
                real, virt, allow = x[key], v[key], own[r]
                if key == "after" and (r, i) in sums and _one(real) and _one(virt):
                    (real,), (virt,), allow = real, virt, sums[(r, i)]
                    inherited[r].append((virt, allow))
                ok, c = values_close(real, virt, dtype, allow)
                close.append(c)
                if not ok:
                    how = f" ({c.words()})" if c is not None else ""
                    diffs.append(f"{where}: values {key} differ{how}: real {x[key]!r}, virtual {v[key]!r}")
            if (v["hops"] is None) != (x["hops"] is None) or (
                v["hops"] and [h[:4] for h in v["hops"]] != [h[:4] for h in x["hops"]]
            ):
                diffs.append(f"{where}: ring hops differ")
    for r, res in enumerate(results):
        ok, c = _same_value(res["value"], virtual.values[r], own[r], inherited[r])
        close.append(c)
        if not ok:
            how = f" ({c.words()})" if c is not None and not c.ok else ""
            diffs.append(
                f"rank {r}: return value differs{how}{first_diff(res['value'], virtual.values[r], '', own[r])}"
            )
    if len(diffs) > MAX_DIFFS:
        diffs = diffs[:MAX_DIFFS] + [f"... and {len(diffs) - MAX_DIFFS} more"]
    return diffs, worst(close)


def _one(values: Any) -> bool:
    """A call's values that are one array (not None, not chunks)."""
    return isinstance(values, (list, tuple)) and len(values) == 1 and values[0] is not None


def _same_value(
    real: Any, virtual: Any, allow: Allowance, sums: Sequence[tuple[Any, Allowance]] = ()
) -> tuple[bool, Closeness | None]:
    """Return values: the same structure, arrays equal under `values_close`: an array that is the result of one
    of the rank's sums (the same values on virtual ranks) within that sum's allowance, any other within `allow`."""
    if isinstance(virtual, dict):
        if not isinstance(real, dict) or set(real) != set(virtual):
            return False, None
        return _parts([_same_value(real[k], virtual[k], allow, sums) for k in virtual])
    if isinstance(virtual, (list, tuple)):
        if not isinstance(real, (list, tuple)) or len(real) != len(virtual):
            return False, None
        return _parts([_same_value(a, b, allow, sums) for a, b in zip(real, virtual)])
    if isinstance(virtual, np.ndarray) or isinstance(real, np.ndarray):
        for made, theirs in sums:
            if isinstance(virtual, np.ndarray) and _same_array(made, virtual):
                allow = theirs
                break
        return values_close(real, virtual, getattr(virtual, "dtype", np.asarray(virtual).dtype).name, allow)
    if isinstance(virtual, float):
        return values_close(real, virtual, None, allow)
    return real == virtual, None


def _same_array(kept: Any, b: np.ndarray) -> bool:
    """A call's kept values (lists of numbers, as the trace keeps them) hold the same numbers as array b."""
    try:
        a, b = np.asarray(kept, dtype=np.float64), _numbers(b).astype(np.float64)
    except (TypeError, ValueError):
        return False
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def first_diff(real: Any, virtual: Any, path: str = "", allow: Allowance = Allowance(1, "")) -> str:
    """Where two return values first differ (beyond `allow`) and how: ' at [key][i]: real x, virtual y' (not
    the whole values)."""
    if isinstance(virtual, dict) and isinstance(real, dict) and set(real) == set(virtual):
        for k in virtual:
            if not _same_value(real[k], virtual[k], allow)[0]:
                return first_diff(real[k], virtual[k], f"{path}[{k!r}]", allow)
    if isinstance(virtual, (list, tuple)) and isinstance(real, (list, tuple)) and len(real) == len(virtual):
        for i, (a, b) in enumerate(zip(real, virtual)):
            if not _same_value(a, b, allow)[0]:
                return first_diff(a, b, f"{path}[{i}]", allow)
    try:
        a, b = _numbers(real), _numbers(virtual)
        if a.shape == b.shape and a.size > 1 and a.dtype != object and b.dtype != object:
            x, y = a.ravel(), b.ravel()
            if _floats(a, b):  # the largest difference; a NaN on one side only is the largest of all
                with np.errstate(invalid="ignore", over="ignore"):
                    gap = np.where(
                        np.isnan(x) & np.isnan(y), 0.0, np.where(np.isnan(x) | np.isnan(y), np.inf, np.abs(x - y))
                    )
                i = int(np.argmax(np.where(np.isnan(gap) | (x == y), -1.0, gap)))  # inf - inf is NaN: equal
            else:
                i = int(np.argmax(x != y))
            return f" at {path}[{i}] of {b.size}: real {x[i]!r}, virtual {y[i]!r}"
    except (TypeError, ValueError):
        pass
    return f" at {path or 'the top'}: real {_short(real)}, virtual {_short(virtual)}"


def _short(v: Any) -> str:
    text = repr(_plain(v))
    return text if len(text) <= 200 else text[:200] + "..."


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return [[k, _plain(x)] for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "tolist"):
        return v.tolist()
    return v

"""A real run compared with the virtual run of the same program, rank by rank and call by call: op, group,
shapes, dtypes, bytes, call site and values (exact, except floats computed in another order)."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..comm.interface import BFLOAT16, HALF_FLOATS
from ..trace import Trace
from .virtual import RunResult

# Relative tolerance per dtype, for floats a real backend may have summed in another order. float16 and bfloat16
# keep 11 and 8 significant bits, so one rounding is up to 2^-11 (5e-4) or 2^-8 (4e-3) of a value and a sum over
# a few ranks in another order is off by a few of them. On gloo their sums are bit for bit (the virtual kernel
# adds in gloo's order: comm/kernels.py); the tolerance is for NCCL, whose ring and tree orders differ.
RTOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
SUM_ULPS = 64  # how many units in the last place of an array's largest value a reordered sum may be off
HALF_ULPS = 8  # the same for 16-bit floats, whose units are 2^13 or 2^16 times float32's
MAX_DIFFS = 20


# -- per-rank views ------------------------------------------------------------------------------

def _item(kind: str, op: str, group: tuple, params: dict, label: Any, ins, outs, sent: int, recv: int,
          site: str, before: Any, after: Any, hops: Any, **extra: Any) -> dict:
    if extra.get("role") == "recv":
        label = None  # a transfer carries its sender's label; the receiver's own label names its whole batch
    return {"kind": kind, "op": op, "group": group, "params": params, "label": label,
            "ins": [(tuple(s), d) for s, d in ins], "outs": [(tuple(s), d) for s, d in outs],
            "sent": sent, "recv": recv, "site": site, "before": before, "after": after, "hops": hops, **extra}


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
                hops = [(h["phase"], h["hop"], t["chunk"], t["bytes"], t["value"])
                        for h in e.hops for t in h["transfers"] if t["src"] == m.rank]
            extra = {}
            if e.kind == "p2p":
                extra = {"role": "send" if i == 0 else "recv", "peer": e.members[1 - i].rank}
            views[m.rank].append(_item(e.kind, e.op, group, e.params, e.label, m.ins, m.outs, m.sent, m.recv,
                                       m.site, _lists(m.before), _lists(m.after), hops, **extra))
    return [_canonical(v) for v in views]


def views_from_records(results: list[dict]) -> list[list[dict]]:
    views = []
    for res in results:
        items = []
        for rec in res["records"]:
            if rec["kind"] == "mark":
                continue
            if rec["kind"] == "compute":
                items.append(_item("compute", rec["op"], ("world", tuple(range(res["world"]))), rec["params"], None,
                                   [], [], 0, 0, rec["site"], None, None, None))
                continue
            _, name, ranks = rec["group"]
            hops = None
            if rec["hops"] is not None:
                hops = [(h["phase"], h["hop"], t["chunk"], t["bytes"], t["value"])
                        for h in rec["hops"] for t in h["transfers"]]
            extra = {"role": rec["role"], "peer": rec["peer"]} if rec["kind"] == "p2p" else {}
            items.append(_item(rec["kind"], rec["op"], (name, tuple(ranks)), rec["params"], rec["label"],
                               rec["ins"], rec["outs"], rec["sent"], rec["recv"], rec["site"], rec["before"],
                               rec["after"], hops, **extra))
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


def values_close(real: Any, virtual: Any, dtype: str | None) -> tuple[bool, bool]:
    """(equal within the rules, tolerance was needed). Exact, except floats that are not integer-valued. NaN
    equals NaN at the same place; a NaN on one side only is a difference."""
    if real is None or virtual is None:
        return real is None and virtual is None, False
    try:
        a, b = _numbers(real), _numbers(virtual)
    except (TypeError, ValueError):  # ragged: compare part by part
        if not isinstance(real, (list, tuple)) or not isinstance(virtual, (list, tuple)) or len(real) != len(virtual):
            return False, False
        parts = [values_close(x, y, dtype) for x, y in zip(real, virtual)]
        return all(p[0] for p in parts), any(p[1] for p in parts)
    if a.shape != b.shape:
        return False, False
    if a.dtype == object or b.dtype == object:
        parts = [values_close(x, y, dtype) for x, y in zip(a.reshape(-1), b.reshape(-1))]
        return all(p[0] for p in parts), any(p[1] for p in parts)
    floats = _floats(a, b)
    if np.array_equal(a, b, equal_nan=floats):
        return True, False
    if not floats or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False, False
    known = b[~np.isnan(b)]
    if np.all(np.isfinite(known)) and np.all(known == np.round(known)) and (dtype in (None, "float64")):
        return False, False  # integer-valued float64 data must match exactly
    # a sum taken in another order is off by a few roundings of the values summed, not of each result: an
    # entry that nearly cancels to zero may differ by some units in the last place of the array's largest
    name = dtype or b.dtype.name
    rtol = RTOL.get(name, 1e-12)
    # ml_dtypes.finfo knows bfloat16 on every ml_dtypes release (numpy's own finfo only learnt it later)
    eps, ulps = (float(ml_dtypes.finfo(np.dtype(name)).eps), HALF_ULPS) if name in HALF_FLOATS \
        else (float(np.finfo(b.dtype).eps), SUM_ULPS)
    finite = np.abs(b[np.isfinite(b)])
    scale = float(np.max(finite)) if finite.size else 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: numpy checks infinities apart
        return bool(np.allclose(a, b, rtol=rtol, atol=ulps * eps * scale, equal_nan=True)), True


def compare(virtual: RunResult, results: list[dict]) -> tuple[list[str], bool]:
    """Differences between a real run (per-rank results) and the virtual run of the same program."""
    diffs: list[str] = []
    tol = False
    if virtual.world != len(results):
        return [f"world sizes differ: real {len(results)}, virtual {virtual.world}"], False
    vviews, rviews = views_from_trace(virtual.trace), views_from_records(results)
    for r, (vv, rv) in enumerate(zip(vviews, rviews)):
        if len(vv) != len(rv):
            diffs.append(f"rank {r}: {len(rv)} calls on real ranks, {len(vv)} on virtual ranks")
        for i, (v, x) in enumerate(zip(vv, rv)):
            where = f"rank {r}, call {i} ({v['op']} at {v['site']})"
            for key in ("kind", "op", "group", "params", "label", "ins", "outs", "sent", "recv", "site",
                        "role", "peer"):
                if v.get(key) != x.get(key):
                    diffs.append(f"{where}: {key} differs: real {x.get(key)!r}, virtual {v.get(key)!r}")
            dtype = (v["outs"] or v["ins"] or [((), None)])[0][1]
            for key in ("before", "after"):
                ok, used = values_close(x[key], v[key], dtype)
                tol |= used
                if not ok:
                    diffs.append(f"{where}: values {key} differ: real {x[key]!r}, virtual {v[key]!r}")
            if (v["hops"] is None) != (x["hops"] is None) or (v["hops"] and [h[:4] for h in v["hops"]] !=
                                                                 [h[:4] for h in x["hops"]]):
                diffs.append(f"{where}: ring hops differ")
    for r, res in enumerate(results):
        ok, used = _same_value(res["value"], virtual.values[r])
        tol |= used
        if not ok:
            diffs.append(f"rank {r}: return value differs{first_diff(res['value'], virtual.values[r])}")
    if len(diffs) > MAX_DIFFS:
        diffs = diffs[:MAX_DIFFS] + [f"... and {len(diffs) - MAX_DIFFS} more"]
    return diffs, tol


def _same_value(real: Any, virtual: Any) -> tuple[bool, bool]:
    """Return values: the same structure, arrays equal under the rules of `values_close` for their dtype."""
    if isinstance(virtual, dict):
        if not isinstance(real, dict) or set(real) != set(virtual):
            return False, False
        parts = [_same_value(real[k], virtual[k]) for k in virtual]
    elif isinstance(virtual, (list, tuple)):
        if not isinstance(real, (list, tuple)) or len(real) != len(virtual):
            return False, False
        parts = [_same_value(a, b) for a, b in zip(real, virtual)]
    elif isinstance(virtual, np.ndarray) or isinstance(real, np.ndarray):
        return values_close(real, virtual, getattr(virtual, "dtype", np.asarray(virtual).dtype).name)
    else:
        return values_close(real, virtual, None) if isinstance(virtual, float) else (real == virtual, False)
    return all(p[0] for p in parts), any(p[1] for p in parts)


def first_diff(real: Any, virtual: Any, path: str = "") -> str:
    """Where two return values first differ and how: ' at [key][i]: real x, virtual y' (not the whole values)."""
    if isinstance(virtual, dict) and isinstance(real, dict) and set(real) == set(virtual):
        for k in virtual:
            if not _same_value(real[k], virtual[k])[0]:
                return first_diff(real[k], virtual[k], f"{path}[{k!r}]")
    if isinstance(virtual, (list, tuple)) and isinstance(real, (list, tuple)) and len(real) == len(virtual):
        for i, (a, b) in enumerate(zip(real, virtual)):
            if not _same_value(a, b)[0]:
                return first_diff(a, b, f"{path}[{i}]")
    try:
        a, b = _numbers(real), _numbers(virtual)
        if a.shape == b.shape and a.size > 1 and a.dtype != object and b.dtype != object:
            x, y = a.ravel(), b.ravel()
            if _floats(a, b):  # the largest difference; a NaN on one side only is the largest of all
                with np.errstate(invalid="ignore", over="ignore"):
                    gap = np.where(np.isnan(x) & np.isnan(y), 0.0,
                                   np.where(np.isnan(x) | np.isnan(y), np.inf, np.abs(x - y)))
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

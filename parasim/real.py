"""A real run, checked against the virtual run of the same program.

Every real rank hands back its own record of each call (comm/torchdist.py). Here those records are
(1) compared, rank by rank and call by call, with what the same rank did on virtual ranks: op, group,
shapes, dtypes, bytes, call site and values; and (2) merged into one trace, with the same logical clock
as the virtual engine, plus the measured wall-clock time of every call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .comm.interface import Group
from .comm.launch import RealOptions, Target, join_torchrun, launch
from .engine import RunResult, run
from .trace import Event, Member, Tensor, Trace

RTOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
MAX_DIFFS = 20


@dataclass
class RealReport:
    backend: str
    world: int
    values: list[Any]  # each rank's return value (numpy)
    trace: Trace  # the real run, merged, with measured times in `times`
    times: dict[tuple[int, int], tuple[float, float]]  # (seq, rank) -> (start_us, dur_us)
    differences: list[str] = field(default_factory=list)
    startup_s: float = 0.0
    tolerance_used: bool = False

    @property
    def match(self) -> bool:
        return not self.differences

    def timings(self) -> dict[str, dict[str, float]]:
        """Measured time per kind of call, over every rank."""
        out: dict[str, list[float]] = {}
        for e in self.trace.events:
            for m in e.members:
                out.setdefault(e.op, []).append(self.times[(e.seq, m.rank)][1])
        return {op: {"calls": len(v), "total_ms": round(sum(v) / 1e3, 3), "mean_us": round(sum(v) / len(v), 1)}
                for op, v in sorted(out.items())}

    def to_dict(self) -> dict:
        return {"backend": self.backend, "world": self.world, "match": self.match,
                "differences": self.differences, "timings": self.timings(),
                "startup_s": round(self.startup_s, 3), "events": len(self.trace.events),
                "tolerance": "exact" if not self.tolerance_used else {k: v for k, v in RTOL.items()}}


def run_real(target: Target, world: int, opts: RealOptions, virtual_program: Any = None) -> RealReport | None:
    """Run on real ranks (launching them, or joining torchrun) and compare with a virtual run.

    Returns None on the ranks of a torchrun job other than rank 0."""
    t = time.perf_counter()
    results = join_torchrun(target, opts) if _torchrun() else launch(target, world, opts)
    if results is None:
        return None
    startup = time.perf_counter() - t
    world = len(results)
    program = virtual_program if virtual_program is not None else target
    if not callable(program):
        from .comm.launch import _load
        program = _load(program)
    virtual = run(program, world, seed=opts.seed, keep_values=opts.keep_values, algo=opts.algo)
    trace, times = merge(results, opts.backend)
    report = RealReport(opts.backend, world, [r["value"] for r in results], trace, times, startup_s=startup)
    report.differences, report.tolerance_used = compare(virtual, results)
    # the wall time of the whole launch includes the calls themselves; report start-up alone
    report.startup_s = max(0.0, startup - max((t1 for r in results for t1 in _ends(r)), default=0.0))
    return report


def _torchrun() -> bool:
    from .comm.launch import under_torchrun
    return under_torchrun()


def _ends(result: dict) -> list[float]:
    return [rec["t1"] for rec in result["records"] if "t1" in rec]


# -- per-rank views ------------------------------------------------------------------------------

def _item(kind: str, op: str, group: tuple, params: dict, label: Any, ins, outs, sent: int, recv: int,
          site: str, before: Any, after: Any, hops: Any, **extra: Any) -> dict:
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

def _close(real: Any, virtual: Any, dtype: str | None) -> tuple[bool, bool]:
    """(equal within the rules, tolerance was needed). Exact, except floats that are not integer-valued."""
    if real is None or virtual is None:
        return real is None and virtual is None, False
    try:
        a, b = np.asarray(real), np.asarray(virtual)
    except (TypeError, ValueError):  # ragged: compare part by part
        if not isinstance(real, (list, tuple)) or not isinstance(virtual, (list, tuple)) or len(real) != len(virtual):
            return False, False
        parts = [_close(x, y, dtype) for x, y in zip(real, virtual)]
        return all(p[0] for p in parts), any(p[1] for p in parts)
    if a.shape != b.shape:
        return False, False
    if a.dtype == object or b.dtype == object:
        parts = [_close(x, y, dtype) for x, y in zip(a.reshape(-1), b.reshape(-1))]
        return all(p[0] for p in parts), any(p[1] for p in parts)
    if np.array_equal(a, b):
        return True, False
    if not (np.issubdtype(b.dtype, np.floating) and np.issubdtype(a.dtype, np.floating)):
        return False, False
    if np.all(np.isfinite(b)) and np.all(b == np.round(b)) and (dtype in (None, "float64")):
        return False, False  # integer-valued float64 data must match exactly
    return bool(np.allclose(a, b, rtol=RTOL.get(dtype or b.dtype.name, 1e-12), atol=0.0)), True


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
                ok, used = _close(x[key], v[key], dtype)
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
            diffs.append(f"rank {r}: return value differs: real {_plain(res['value'])!r}, "
                         f"virtual {_plain(virtual.values[r])!r}")
    if len(diffs) > MAX_DIFFS:
        diffs = diffs[:MAX_DIFFS] + [f"... and {len(diffs) - MAX_DIFFS} more"]
    return diffs, tol


def _same_value(real: Any, virtual: Any) -> tuple[bool, bool]:
    """Return values: the same structure, arrays equal under the rules of `_close` for their dtype."""
    if isinstance(virtual, dict):
        if not isinstance(real, dict) or set(real) != set(virtual):
            return False, False
        parts = [_same_value(real[k], virtual[k]) for k in virtual]
    elif isinstance(virtual, (list, tuple)):
        if not isinstance(real, (list, tuple)) or len(real) != len(virtual):
            return False, False
        parts = [_same_value(a, b) for a, b in zip(real, virtual)]
    elif isinstance(virtual, np.ndarray) or isinstance(real, np.ndarray):
        return _close(real, virtual, getattr(virtual, "dtype", np.asarray(virtual).dtype).name)
    else:
        return _close(real, virtual, None) if isinstance(virtual, float) else (real == virtual, False)
    return all(p[0] for p in parts), any(p[1] for p in parts)


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


# -- merging the ranks' records into one trace -----------------------------------------------------

def merge(results: list[dict], backend: str) -> tuple[Trace, dict[tuple[int, int], tuple[float, float]]]:
    """One trace from every rank's records: events keyed like the virtual engine matches them, steps from
    the same clock rule, seq in the order this replay completes them; plus measured (start_us, dur_us)."""
    world = len(results)
    groups = [Group(tuple(ranks), name, idx) for idx, name, ranks in results[0]["groups"]]
    queues = [[rec for rec in res["records"] if rec["kind"] != "mark"] for res in results]
    ptr, clock = [0] * world, [0] * world
    events: list[Event] = []
    times: dict[tuple[int, int], tuple[float, float]] = {}

    def head(r: int) -> dict | None:
        return queues[r][ptr[r]] if ptr[r] < len(queues[r]) else None

    def add(kind: str, op: str, g: Group, recs: list[tuple[int, dict]], step: int, params: dict,
            hops: list | None = None) -> None:
        seq = len(events)
        members = []
        for r, rec in recs:
            members.append(Member(r, tuple(Tensor(tuple(s), d) for s, d in rec.get("ins", [])),
                                  tuple(Tensor(tuple(s), d) for s, d in rec.get("outs", [])), rec.get("sent", 0),
                                  rec.get("recv", 0), rec["site"], _tuple(rec.get("before")),
                                  _tuple(rec.get("after"))))
            times[(seq, r)] = (rec["t0"] * 1e6, max(rec["t1"] - rec["t0"], 0.0) * 1e6)
        first = recs[0][1]
        events.append(Event(seq, step, kind, op, g, members, first.get("label"), first.get("phase"), params,
                            params.get("algo"), hops))

    placed: dict[tuple[int, int, int], int] = {}  # transfer (src, dst, chan) -> its step

    while any(head(r) is not None for r in range(world)):
        progress = False
        for r in range(world):
            rec = head(r)
            if rec is None:
                continue
            if rec["kind"] == "compute":
                clock[r] += 1
                add("compute", rec["op"], groups[0], [(r, rec)], clock[r], rec["params"])
                ptr[r] += 1
                progress = True
            elif rec["kind"] == "collective":
                g = groups[rec["group"][0]]
                key = (g.index, rec["call"])
                heads = [head(m) for m in g.ranks]
                if all(h is not None and h["kind"] == "collective" and (h["group"][0], h["call"]) == key
                       for h in heads):
                    step = 1 + max(clock[m] for m in g.ranks)
                    add("collective", rec["op"], g, list(zip(g.ranks, heads)), step, rec["params"],
                        _merge_hops([h["hops"] for h in heads]))
                    for m in g.ranks:
                        clock[m] = step
                        ptr[m] += 1
                    progress = True
            else:  # an exchange: place each transfer once both sides are in their exchange, as virtual ranks do
                batch = _batch(queues[r], ptr[r])
                for rec in batch:
                    key = _key(rec)
                    if rec["role"] != "send" or key in placed:
                        continue
                    dst = rec["params"]["dst"]
                    other = next((o for o in (_batch(queues[dst], ptr[dst]) if _in_p2p(queues, ptr, dst) else [])
                                  if o["role"] == "recv" and _key(o) == key), None)
                    if other is not None:
                        placed[key] = 1 + max(clock[r], clock[dst])
                        add("p2p", "p2p", groups[rec["group"][0]], [(r, rec), (dst, other)], placed[key],
                            rec["params"])
                        progress = True
                if all(_key(rec) in placed for rec in batch):
                    clock[r] = max([clock[r]] + [placed[_key(rec)] for rec in batch])
                    ptr[r] += len(batch)
                    progress = True
        if not progress:
            stuck = {r: head(r)["op"] for r in range(world) if head(r) is not None}
            raise RuntimeError(f"cannot order the real ranks' records (stuck at {stuck})")
    return Trace(world, backend, groups, events, [], {"backend": backend}), times


def _key(rec: dict) -> tuple[int, int, int]:
    return rec["params"]["src"], rec["params"]["dst"], rec["chan"]


def _in_p2p(queues, ptr, r: int) -> bool:
    return ptr[r] < len(queues[r]) and queues[r][ptr[r]]["kind"] == "p2p"


def _batch(queue: list[dict], start: int) -> list[dict]:
    """The records of one exchange: consecutive p2p records numbered post 0, 1, 2, ..."""
    out = [queue[start]]
    while start + len(out) < len(queue):
        nxt = queue[start + len(out)]
        if nxt["kind"] != "p2p" or nxt["post"] != out[-1]["post"] + 1:
            break
        out.append(nxt)
    return out


def _merge_hops(per_rank: list[list[dict] | None]) -> list[dict] | None:
    if any(h is None for h in per_rank):
        return None
    merged = []
    for k, hop in enumerate(per_rank[0]):
        merged.append({"phase": hop["phase"], "hop": hop["hop"],
                       "transfers": [t for hops in per_rank for t in hops[k]["transfers"]]})
    return merged


def _tuple(v: Any) -> tuple | None:
    return None if v is None else tuple(v)

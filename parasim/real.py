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

from .comm.interface import Recv, Send
from .comm.launch import Job, RealOptions, Target, join_torchrun, launch_many
from .engine import RunResult, run
from .trace import Event, Member, Trace

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
    if _torchrun():
        results = join_torchrun(target, opts)
        if results is None:
            return None
    else:
        (results,) = launch_many([(target, opts)], world)
    startup = time.perf_counter() - t - _in_calls(results)
    return _compared(target, opts, results, startup, virtual_program)


def run_real_many(jobs: list[Job], world: int) -> list[RealReport]:
    """Several programs on one launch of `world` local ranks (one start-up for all), each compared with
    its own virtual run. The start-up is shared: every report carries the whole of it."""
    t = time.perf_counter()
    runs = launch_many(jobs, world)
    startup = time.perf_counter() - t - sum(_in_calls(results) for results in runs)
    return [_compared(target, opts, results, startup) for (target, opts), results in zip(jobs, runs)]


def _compared(target: Target, opts: RealOptions, results: list[dict], startup: float,
              virtual_program: Any = None) -> RealReport:
    """The report of one real run: its merged trace, and its differences from the virtual run."""
    world = len(results)
    program = virtual_program if virtual_program is not None else target
    if not callable(program):
        from .comm.launch import _load
        program = _load(program)
    virtual = run(program, world, seed=opts.seed, keep_values=opts.keep_values, algo=opts.algo)
    trace, times = merge(results, opts.backend)
    report = RealReport(opts.backend, world, [r["value"] for r in results], trace, times,
                        startup_s=max(0.0, startup))
    report.differences, report.tolerance_used = compare(virtual, results)
    return report


def _torchrun() -> bool:
    from .comm.launch import under_torchrun
    return under_torchrun()


def _ends(result: dict) -> list[float]:
    return [rec["t1"] for rec in result["records"] if "t1" in rec]


def _in_calls(results: list[dict]) -> float:
    """Seconds from a program's start to its last call's end (on the slowest rank): the part of a launch's
    wall time that is not start-up."""
    return max((t1 for r in results for t1 in _ends(r)), default=0.0)


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
    """One trace from every rank's records, laid out exactly as virtual ranks lay out the same calls.

    The virtual engine replays each rank's recorded calls (same groups, ops, shapes, marks, in the same
    order), so seq and step come from the very scheduler the virtual run used; then every member is
    filled in with what the real rank recorded (bytes, call site, values, ring hops) and its measured time."""
    world = len(results)
    replay = run(_replayer(results), world)
    own: dict[tuple, dict] = {}  # (kind key) -> the real record
    for res in results:
        r, computes = res["rank"], 0
        for rec in res["records"]:
            if rec["kind"] == "collective":
                own[("c", r, rec["group"][0], rec["call"])] = rec
            elif rec["kind"] == "p2p":
                own[("p", rec["role"], *_key(rec))] = rec
            elif rec["kind"] == "compute":
                own[("k", r, computes)] = rec
                computes += 1
    calls: dict[tuple, int] = {}
    events, times = [], {}
    for e in replay.trace.events:
        recs = []
        for i, m in enumerate(e.members):
            if e.kind == "collective":
                key = ("c", m.rank, e.group.index)
            elif e.kind == "p2p":
                key = ("p", "send" if i == 0 else "recv", e.params["src"], e.params["dst"])
            else:
                key = ("k", m.rank)
            n = calls.get(key, 0)
            calls[key] = n + 1
            recs.append(own[(*key, n)])
        members = [Member(m.rank, m.ins, m.outs, rec["sent"], rec["recv"], rec["site"], _tuple(rec["before"]),
                          _tuple(rec["after"])) if e.kind != "compute" else m._replace(site=rec["site"])
                   for m, rec in zip(e.members, recs)]
        for m, rec in zip(e.members, recs):
            times[(e.seq, m.rank)] = (rec["t0"] * 1e6, max(rec["t1"] - rec["t0"], 0.0) * 1e6)
        hops = _merge_hops([rec.get("hops") for rec in recs]) if e.hops is not None else None
        events.append(Event(e.seq, e.step, e.kind, e.op, e.group, members, e.label, e.phase, e.params, e.algo, hops,
                            e.tags))
    trace = Trace(world, backend, replay.trace.groups, events, replay.trace.marks, {"backend": backend})
    return trace, times


def _replayer(results: list[dict]):
    """A program that makes, on each rank, the calls the real rank recorded (arrays of zeros, same shapes)."""
    def program(ctx):
        res = results[ctx.rank]
        groups = [None] + [ctx.new_group(ranks, name) for _, name, ranks in res["groups"][1:]]
        recs, i = res["records"], 0
        while i < len(recs):
            rec = recs[i]
            if rec["kind"] == "mark":
                (ctx.phase if rec["mark"] == "phase" else ctx.note)(rec["text"], **(rec.get("data") or {}))
            elif rec["kind"] == "compute":
                ctx.compute(rec["op"], rec["params"].get("flops", 0))
            elif rec["kind"] == "p2p":
                batch = [rec]
                while i + 1 < len(recs) and recs[i + 1]["kind"] == "p2p" and recs[i + 1]["post"] == batch[-1]["post"] + 1:
                    i += 1
                    batch.append(recs[i])
                ops = [Send(_zeros(b["ins"][0]), b["peer"]) if b["role"] == "send"
                       else Recv(b["peer"], tuple(b["outs"][0][0]), b["outs"][0][1]) for b in batch]
                ctx.comm.exchange(ops, group=groups[rec["group"][0]], label=rec["label"], tags=rec.get("tags"))
            else:
                _replay_collective(ctx, rec, groups[rec["group"][0]])
            i += 1
    return program


def _replay_collective(ctx, rec: dict, group) -> None:
    op, p, comm, label = rec["op"], rec["params"], ctx.comm, rec["label"]
    xs = [_zeros(t) for t in rec["ins"]]
    if op == "all_reduce":
        comm.all_reduce(xs[0], p["op"], group=group, label=label, algo=p["algo"])
    elif op == "reduce_scatter":
        comm.reduce_scatter(xs[0], p["dim"], op=p["op"], group=group, label=label, algo=p["algo"])
    elif op == "all_gather":
        comm.all_gather(xs[0], p["dim"], group=group, label=label, algo=p["algo"])
    elif op == "all_to_all":
        comm.all_to_all(xs, p["dim"], group=group, label=label)
    elif op == "broadcast":
        comm.broadcast(xs[0], p["src"], group=group, label=label)
    else:
        comm.barrier(group=group, label=label)


def _zeros(t) -> np.ndarray:
    shape, dtype = t
    return np.zeros(tuple(shape), dtype=np.dtype(dtype))


def _key(rec: dict) -> tuple[int, int, int]:
    return rec["params"]["src"], rec["params"]["dst"], rec["chan"]


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

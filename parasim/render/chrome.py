"""Export a trace to the Chrome Trace Event Format (Perfetto UI, chrome://tracing) and, one file per rank,
to Kineto-like JSON that Holistic Trace Analysis reads. `validate` is our own strict structural check.

Times: measured ones where a real run gave them; else the clock's (parasim/clock: every event and the
compute between events at its predicted start and length on a GPU type); else the logical clock, step s
as the interval [(s-1)*step_us, s*step_us). The step itself is kept in each slice's args.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from typing import Any, Iterator

from ..comm.trace import FORMAT, VERSION, Event, Member, Trace, apply_held, held_by_kind

COLL, SEND, RECV, COMPUTE = 0, 1, 2, 3
TRACKS = ("collectives", "send", "recv", "compute")
GAP = 0.02  # fraction of a slot left empty, so neighbouring slices never touch in a viewer
HTA_STREAMS = {COMPUTE: 7, COLL: 13, SEND: 14, RECV: 15}  # CUDA-like stream ids; HTA wants them > 0
_META = ("process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index")
_PHASES = set("XBEiIMCbnestfPOND")


def _place(
    trace: Trace, step_us: float, times: dict[tuple[int, int], tuple[float, float]] | None = None
) -> Iterator[tuple[Event, Member, int, float, float]]:
    """(event, member, track, ts, dur) of every slice. Without `times` step s is [(s-1)*step_us, s*step_us);
    with `times` ((seq, rank) -> measured (start_us, dur_us)) slices sit where they really ran. Slices that
    share a rank, track and slot (the transfers of one batched exchange) split it side by side, so a track
    never overlaps itself."""
    if not (isinstance(step_us, (int, float)) and math.isfinite(step_us) and step_us > 0):
        raise ValueError(f"step_us must be a positive number, got {step_us!r}")
    placed = []
    for e in trace.events:
        if e.kind == "p2p":  # members are [sender, receiver], as the backend records them
            placed += [(e, e.members[0], SEND), (e, e.members[1], RECV)]
        else:
            placed += [(e, m, COMPUTE if e.kind == "compute" else COLL) for m in e.members]

    def slot(e: Event, m: Member) -> tuple[float, float]:
        if times is None:
            return (e.step - 1) * step_us, step_us
        return times[(e.seq, m.rank)]

    count = Counter((m.rank, t, slot(e, m)) for e, m, t in placed)
    seen: Counter = Counter()
    for e, m, t in placed:
        start, length = slot(e, m)
        key = (m.rank, t, (start, length))
        width = length / count[key]
        yield e, m, t, start + seen[key] * width, width * (1 - GAP)
        seen[key] += 1


def _tensors(ts) -> list[dict]:
    return [{"shape": list(t.shape), "dtype": t.dtype} for t in ts]


def _args(e: Event, m: Member, track: int) -> dict[str, Any]:
    """What the details pane shows for one slice."""
    a: dict[str, Any] = {"seq": e.seq, "step": e.step, "phase": e.phase, "site": m.site}
    if e.kind == "compute":
        a["flops"] = e.params.get("flops", 0)
    elif e.kind == "p2p":
        t = (m.ins or m.outs)[0]
        a.update(
            src=e.params["src"],
            dst=e.params["dst"],
            bytes=m.sent if track == SEND else m.recv,
            shape=list(t.shape),
            dtype=t.dtype,
            label=e.label,
            group=e.group.name,
        )
    else:
        a.update(
            group=e.group.name,
            ranks=list(e.group.ranks),
            label=e.label,
            algo=e.algo,
            params=e.params,
            ins=_tensors(m.ins),
            outs=_tensors(m.outs),
            sent_bytes=m.sent,
            recv_bytes=m.recv,
        )
        if e.hops:
            a["hops"] = len(e.hops)
    return a


def _meta(pid: int, tid: int, what: str, **args: Any) -> dict:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def to_chrome(
    trace: Trace,
    step_us: float = 1000.0,
    times: dict[tuple[int, int], tuple[float, float]] | None = None,
    work: list[tuple[int, float, float]] | None = None,
) -> dict:
    """The trace as a Chrome Trace Event JSON object: pid = rank, one tid per track, flows for p2p.

    `times` ((seq, rank) -> (start_us, dur_us), measured on real ranks or predicted by the clock) places
    slices in time; `work` ((rank, start_us, dur_us), the clock's) adds each compute span between events."""
    out: list[dict] = []
    for r in range(trace.world):
        out += [_meta(r, 0, "process_name", name=f"rank {r}"), _meta(r, 0, "process_sort_index", sort_index=r)]
        for tid, name in enumerate(TRACKS):
            out += [_meta(r, tid, "thread_name", name=name), _meta(r, tid, "thread_sort_index", sort_index=tid)]
    for e, m, track, ts, dur in _place(trace, step_us, times):
        name = e.op if e.kind != "p2p" else ("send" if track == SEND else "recv")
        out.append(
            {
                "name": name,
                "cat": e.kind,
                "ph": "X",
                "pid": m.rank,
                "tid": track,
                "ts": ts,
                "dur": dur,
                "args": _args(e, m, track),
            }
        )
        if e.kind == "p2p":  # an arrow from the middle of the send slice to the middle of the recv slice
            flow = {
                "name": "p2p",
                "cat": "p2p",
                "ph": "s" if track == SEND else "f",
                "id": e.seq,
                "pid": m.rank,
                "tid": track,
                "ts": ts + dur / 2,
            }
            out.append(flow if track == SEND else {**flow, "bp": "e"})
    for r, ts, dur in work or []:
        out.append(
            {
                "name": "compute",
                "cat": "compute",
                "ph": "X",
                "pid": r,
                "tid": COMPUTE,
                "ts": ts,
                "dur": dur,
                "args": {"predicted": True},
            }
        )
    live: dict[int, dict[str, tuple[str, int]]] = {}
    for mk in trace.marks if times is None else []:  # taken after the rank's step `mk.step`: at its end
        if mk.kind == "held":  # a counter track per rank: bytes held by kind, as the run declared them
            apply_held(live.setdefault(mk.rank, {}), mk)
            out.append(
                {
                    "name": "held bytes",
                    "ph": "C",
                    "pid": mk.rank,
                    "ts": mk.step * step_us,
                    "args": held_by_kind(live[mk.rank]),
                }
            )
            continue
        out.append(
            {
                "name": mk.text,
                "cat": mk.kind,
                "ph": "i",
                "s": "t",
                "pid": mk.rank,
                "tid": COLL,
                "ts": mk.step * step_us,
                "args": {"step": mk.step},
            }
        )
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "format": FORMAT,
            "version": VERSION,
            "world": trace.world,
            "backend": trace.backend,
            "step_us": step_us,
            "steps": trace.steps,
            "meta": trace.meta,
        },
    }


def to_hta(
    trace: Trace,
    step_us: float = 1000.0,
    times: dict[tuple[int, int], tuple[float, float]] | None = None,
    work: list[tuple[int, float, float]] | None = None,
) -> dict[int, dict]:
    """One Kineto-like trace per rank for Holistic Trace Analysis (cli/common.py's `write_hta` writes each to
    its own file in one folder, all or none).

    Every slice becomes a GPU kernel on a stream; communication kernels are named `ncclKernel_<op>`
    because HTA counts a kernel as communication only when its name matches `^nccl.*Kernel`. The
    whole run is one `ProfilerStep#0` annotation, which is how HTA finds iterations. With `times` (real
    ranks: (seq, rank) -> measured (start_us, dur_us)) every kernel sits where it really ran."""
    # whole microseconds, each inside its slice: HTA rounds float times down, which would let a slice
    # overlap its neighbour and change the totals it reports
    placed = [
        (e, m, t, math.ceil(ts), max(math.floor(ts + dur) - math.ceil(ts), 1))
        for e, m, t, ts, dur in _place(trace, step_us, times)
    ]
    spans = [(r, math.ceil(ts), max(math.floor(ts + dur) - math.ceil(ts), 1)) for r, ts, dur in work or []]
    end = max(
        [ts + dur for *_, ts, dur in placed]
        + [ts + dur for _, ts, dur in spans]
        + [max(trace.steps, 1) * step_us if times is None else 0.0]
    )
    start = min([ts for *_, ts, _ in placed] + [0.0])
    files = {
        r: [
            {
                "name": "ProfilerStep#0",
                "cat": "user_annotation",
                "ph": "X",
                "pid": r,
                "tid": 0,
                "ts": start,
                "dur": max(end - start, step_us),
                "args": {},
            }
        ]
        for r in range(trace.world)
    }
    for e, m, track, ts, dur in placed:
        ev = files[m.rank]
        if e.kind == "compute":
            name = e.op
        else:
            name = f"ncclKernel_{e.op if e.kind != 'p2p' else ('send' if track == SEND else 'recv')}"
        args = {"device": m.rank, "stream": HTA_STREAMS[track], "correlation": len(ev), **_args(e, m, track)}
        ev.append(
            {
                "name": name,
                "cat": "kernel",
                "ph": "X",
                "pid": m.rank,
                "tid": HTA_STREAMS[track],
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )
    for r, ts, dur in spans:  # the clock's compute between events: a kernel on the compute stream
        ev = files[r]
        ev.append(
            {
                "name": "compute",
                "cat": "kernel",
                "ph": "X",
                "pid": r,
                "tid": HTA_STREAMS[COMPUTE],
                "ts": ts,
                "dur": dur,
                "args": {"device": r, "stream": HTA_STREAMS[COMPUTE], "correlation": len(ev), "predicted": True},
            }
        )
    return {
        r: {
            "schemaVersion": 1,
            "traceName": f"parasim rank {r}",
            "displayTimeUnit": "ms",
            "distributedInfo": {"rank": r, "world_size": trace.world, "backend": trace.backend},
            "deviceProperties": [{"id": r, "name": f"parasim {trace.backend} rank {r}"}],
            "traceEvents": ev,
        }
        for r, ev in files.items()
    }


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _inside(track: list[tuple[float, float, int]], starts: list[float], t: float) -> bool:
    """Whether some slice of a (sorted) track encloses t."""
    for j in range(bisect_right(starts, t) - 1, -1, -1):  # latest start first: usually the innermost
        if track[j][1] >= t:
            return True
    return False


def validate(chrome: dict) -> list[str]:
    """Problems that would make a viewer drop or misdraw something (empty list: valid). Stricter than
    Perfetto on purpose: plain numbers only, slices must nest, and flows must bind to enclosing slices."""
    if not isinstance(chrome, dict) or not isinstance(chrome.get("traceEvents"), list):
        return ["not the object form: expected an object with a traceEvents list"]
    problems: list[str] = []
    slices: dict[tuple, list[tuple[float, float, int]]] = defaultdict(list)
    flows: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
    for i, ev in enumerate(chrome["traceEvents"]):
        if not isinstance(ev, dict):
            problems.append(f"event {i}: not an object")
            continue
        where = f"event {i} ({ev.get('ph')!r} {ev.get('name')!r})"
        missing = [k for k in ("name", "ph", "pid", "tid", "ts") if k not in ev]
        if missing:
            problems.append(f"{where}: missing {', '.join(missing)}")
            continue
        ph, ts = ev["ph"], ev["ts"]
        if not isinstance(ev["name"], str) or not isinstance(ph, str):
            problems.append(f"{where}: name and ph must be strings")
            continue
        if not _num(ts):
            problems.append(f"{where}: ts is not a finite number: {ts!r}")
            continue
        if not all(isinstance(ev[k], int) and not isinstance(ev[k], bool) for k in ("pid", "tid")):
            problems.append(f"{where}: pid and tid must be integers")
            continue
        if ph not in _PHASES:
            problems.append(f"{where}: unknown phase")
        elif ph == "X":
            if not _num(ev.get("dur")) or ev["dur"] < 0:
                problems.append(f"{where}: X needs a numeric dur >= 0, got {ev.get('dur')!r}")
            else:
                slices[(ev["pid"], ev["tid"])].append((ts, ts + ev["dur"], i))
        elif ph in "stf":
            if "id" not in ev or "cat" not in ev:
                problems.append(f"{where}: a flow event needs id and cat")
            elif ph == "f" and ev.get("bp") != "e":
                problems.append(f'{where}: flow end without "bp": "e" binds to the next slice, not its own')
            else:
                flows[(ev["cat"], ev["name"], ev["id"])].append((i, ev))
        elif ph == "M":
            args, name = ev.get("args"), ev["name"]
            key = "sort_index" if name.endswith("sort_index") else "labels" if name == "process_labels" else "name"
            if name not in _META:
                problems.append(f"{where}: unknown metadata name")
            elif not isinstance(args, dict) or key not in args:
                problems.append(f"{where}: metadata needs args.{key}")
            elif not (
                isinstance(args[key], int) and not isinstance(args[key], bool)
                if key == "sort_index"
                else isinstance(args[key], str)
            ):
                problems.append(f"{where}: args.{key} has the wrong type: {args[key]!r}")
        elif ph in "iI" and ev.get("s", "t") not in ("t", "p", "g"):
            problems.append(f"{where}: instant scope must be t, p or g")
    # Slices on one track must nest: sort by start (longest first) and keep a stack of open slices.
    for (pid, tid), track in slices.items():
        track.sort(key=lambda x: (x[0], -x[1], x[2]))
        stack: list[tuple[float, float, int]] = []
        for sl in track:
            while stack and stack[-1][1] <= sl[0]:
                stack.pop()
            if stack and sl[1] > stack[-1][1]:
                problems.append(f"event {sl[2]} partially overlaps event {stack[-1][2]} on pid {pid} tid {tid}")
            else:
                stack.append(sl)
    starts = {k: [s for s, _, _ in v] for k, v in slices.items()}
    for (cat, name, fid), evs in sorted(flows.items(), key=repr):
        phs = Counter(ev["ph"] for _, ev in evs)
        if phs["s"] != 1 or phs["f"] != 1:
            problems.append(f"flow {cat}/{name}/{fid}: needs one s and one f, got {dict(sorted(phs.items()))}")
        for i, ev in evs:
            key = (ev["pid"], ev["tid"])
            if not _inside(slices.get(key, []), starts.get(key, []), ev["ts"]):
                problems.append(
                    f"event {i} (flow {ev['ph']} id {fid}): ts {ev['ts']} is inside no slice "
                    f"on pid {key[0]} tid {key[1]}"
                )
    return problems

"""The plain-text walk-through of a lesson run: each phase's narrative, then every event in it with each
rank's values before and after, the bytes it moved and the line that called it; then the checks.

Names, labels, phases, notes, sites and narratives come from a trace file or a user's program: every line
goes out through `printable`, so what a terminal would act on (an escape sequence, a bell) is shown."""
from __future__ import annotations

import textwrap
from typing import Any, Iterator

from ..lesson import LessonRun
from ..trace import Event
from .text import printable

WIDTH = 96


def fmt_value(v: Any) -> str:
    """Compact numbers: integer-valued floats print without '.0'."""
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return str(v)


def fmt_bytes(n: int) -> str:
    return f"{n:,} B"


def _params(e: Event) -> str:
    parts = [f"{k}={v}" for k, v in e.params.items() if k != "algo" and v is not None]
    if e.algo == "ring":
        parts.append("ring algorithm")
    return ", ".join(parts)


def _tensors(ts) -> str:
    return " ".join(f"{t.dtype}{list(t.shape)}" for t in ts) or "-"


def event_lines(e: Event) -> Iterator[str]:
    head = f"step {e.step:>3}  {e.op}"
    if e.kind == "p2p":
        head += f"  rank {e.params['src']} -> rank {e.params['dst']}"
    else:
        head += f"  on {e.group}"
    if _params(e):
        head += f"  ({_params(e)})"
    if e.label:
        head += f"  '{e.label}'"
    yield head
    for m in e.members:
        if m.before is not None and m.after is not None and (m.before or m.after):
            what = f"{' '.join(fmt_value(v) for v in m.before) or '-'} -> {' '.join(fmt_value(v) for v in m.after) or '-'}"
        else:
            what = f"{_tensors(m.ins)} -> {_tensors(m.outs)}"
        yield f"    rank {m.rank:<3} {what:<44} sent {fmt_bytes(m.sent):>9}  recv {fmt_bytes(m.recv):>9}  {m.site}"
    hops = e.hops or []
    if hops and any(t["value"] is None for h in hops for t in h["transfers"]):
        phases = [p for p in ("reduce-scatter", "all-gather") if any(h["phase"] == p for h in hops)]
        counts = " + ".join(f"{sum(h['phase'] == p for h in hops)} {p} hops" for p in phases)
        sizes = sorted({t["bytes"] for h in hops for t in h["transfers"]})
        yield f"      ring: {counts}, each rank passing one chunk ({' or '.join(map(fmt_bytes, sizes))}) to the next"
        hops = []
    for hop in hops:
        moves = "; ".join(
            f"{t['src']}->{t['dst']} chunk {t['chunk']}" + (f" {fmt_value(t['value'])}" if t["value"] is not None
                                                          else f" ({t['bytes']} B)")
            for t in hop["transfers"])
        yield f"      hop {hop['hop'] + 1} of {hop['phase']}: {moves}"


def _phase_blocks(trace) -> list[tuple[str | None, list[tuple[int, int, int, str | Event]]]]:
    """Phases in the order the run entered them, each with its events and notes, ordered by step."""
    order: list[str | None] = [None]
    current: dict[int, str | None] = {}
    items: dict[str | None, list] = {None: []}
    for i, mk in enumerate(trace.marks):
        if mk.kind == "phase":
            current[mk.rank] = mk.text
            if mk.text not in items:
                order.append(mk.text)
                items[mk.text] = []
        elif mk.kind == "note":  # held bytes are read by `Trace.held`, not narrated
            items[current.get(mk.rank)].append((mk.step, 1, mk.rank, i, f"rank {mk.rank}: {mk.text}"))
    for e in trace.events:
        items.setdefault(e.phase, [])
        if e.phase not in order:
            order.append(e.phase)
        items[e.phase].append((e.step, 0, e.seq, 0, e))
    return [(p, sorted(items[p], key=lambda it: it[:4])) for p in order]


def walkthrough(lr: LessonRun) -> str:
    lesson, trace = lr.lesson, lr.result.trace
    out = [f"{lesson.title}  ({lesson.name}, {trace.world} virtual ranks)"]
    for phase, items in _phase_blocks(trace):
        if phase is None and not items:
            continue
        if phase is not None:
            out += ["", f"== {phase} =="]
            for para in lesson.narrative.get(phase, "").strip().split("\n\n"):
                if para.strip():
                    out += textwrap.wrap(printable(" ".join(para.split())), WIDTH) + [""]  # wrapped as shown
        for *_, item in items:
            out += list(event_lines(item)) if isinstance(item, Event) else [f"  {item}"]
    total = sum(m.sent for e in trace.events for m in e.members)
    out += ["", f"{len(trace.events)} events over {trace.steps} steps; {fmt_bytes(total)} sent in all.", "",
            "== checks (computed by the run, compared with a single-device reference) =="]
    for c in lr.checks:
        if c.ok and c.got == c.expected:
            out.append(f"  ok   {c.name}: {fmt_value(c.got)}")
        else:
            mark = "ok  " if c.ok else "FAIL"
            out.append(f"  {mark} {c.name}: got {fmt_value(c.got)}, expected {fmt_value(c.expected)}")
    out.append(f"{sum(c.ok for c in lr.checks)} of {len(lr.checks)} checks ok.")
    return "\n".join(map(printable, out)) + "\n"  # a line each: a newline inside a name shows as \n

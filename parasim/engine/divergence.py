"""Which collective broke it: a parallel run against a reference, compared at every tensor both marked.

A program marks tensors with `ctx.mark(name, x, placement, group)`: how the members of `group` hold the
whole tensor (each a slice along a dim, each a whole copy, or each a partial sum). The reference (one rank,
whole tensors) marks the same names. Here each marked tensor of the split run is put back together from its
members' pieces and compared with the reference's; the first that differs is the divergence. It is pinned on
the last collective its ranks made before marking it, and, when the inputs of that collective were kept,
the other groups of the run are tried in its place (and other placements in the mark's) to say what would
have matched. Wrong sums are silent in training: this names them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UsageError
from ..nn.placement import Replicate, parse
from ..nn.placement import assemble as placement_assemble
from ..trace import Event, Trace

# Relative to the reference's largest value: a sum taken over pieces in another order stays far below these,
# a wrong group or a missing sum is far above (an error of the size of a whole piece).
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
SHOWN = 32  # tensors up to this many values are given whole in the report (both values, for the app)


@dataclass
class Marked:
    """One tensor the run marked, on one group: its pieces in group order, and where each rank marked it."""

    name: str
    placement: str
    group: tuple[int, ...]
    group_name: str
    pieces: dict[int, Any]  # rank -> its piece
    steps: dict[int, int]  # rank -> its logical step when it marked it
    order: int  # position of the first of its marks in the trace


def collect(trace: Trace, marked: list[list[tuple[str, Any]]]) -> dict[str, list[Marked]]:
    """Every marked name, with one entry per group instance that marked it, in the order they were marked."""
    seen: dict[int, int] = {}  # rank -> how many of its marks were read
    out: dict[str, dict[tuple, Marked]] = {}
    for i, mk in enumerate(trace.marks):
        if mk.kind != "tensor":
            continue
        k = seen.get(mk.rank, 0)
        seen[mk.rank] = k + 1
        name, value = marked[mk.rank][k]
        if name != mk.text:
            raise UsageError(f"rank {mk.rank}'s marks are out of step with its tensors ({name!r}, {mk.text!r})")
        data = mk.data or {}
        group = tuple(data.get("group", [mk.rank]))
        entry = out.setdefault(name, {}).setdefault(group, Marked(
            name, data.get("placement", "Replicate()"), group, data.get("group_name", ""), {}, {}, i))
        entry.pieces[mk.rank] = np.asarray(value)
        entry.steps[mk.rank] = mk.step
    return {name: sorted(groups.values(), key=lambda m: m.order) for name, groups in out.items()}


def assemble(placement: str, group: tuple[int, ...], pieces: dict[int, Any]) -> np.ndarray:
    """The whole tensor from the members' pieces, in group order (`nn.placement.assemble`). Copies that
    differ are returned as is (the first member's): comparing with the reference finds them."""
    return placement_assemble([np.asarray(pieces[r]) for r in group if r in pieces], parse(placement), np)


def _error(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    if got.shape != want.shape:
        return float("inf"), float("inf")
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return diff, diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def _copies_agree(m: Marked, tol: float) -> bool:
    if not isinstance(parse(m.placement), Replicate):
        return True
    first = np.asarray(m.pieces[m.group[0]])
    return all(_error(np.asarray(p), first)[1] <= tol for p in m.pieces.values())


def first_divergence(run: Any, reference: Any) -> dict | None:
    """The first marked tensor of `run` (a RunResult with `marked`) that differs from the `reference` run's
    tensor of the same name, with the collective it is pinned on; None when every one agrees."""
    if run.marked is None or reference.marked is None:
        raise UsageError("divergence needs the tensors the runs marked: run both on virtual ranks")
    ours, theirs = collect(run.trace, run.marked), collect(reference.trace, reference.marked)
    missing = sorted(set(ours) - set(theirs))
    if missing:
        raise UsageError(f"the reference marks no tensor named {missing[0]!r}; mark the same names in both")
    entries = sorted((m for ms in ours.values() for m in ms), key=lambda m: m.order)
    for m in entries:
        ref = theirs[m.name][0]
        want = assemble(ref.placement, ref.group, ref.pieces)
        got = assemble(m.placement, m.group, m.pieces)
        tol = TOLERANCE.get(str(want.dtype), 1e-9)
        abs_err, rel_err = _error(got, want)
        if rel_err <= tol and _copies_agree(m, tol):
            continue
        if rel_err <= tol:  # the copies disagree although the first one is right: measure the worst copy
            abs_err, rel_err = max(_error(np.asarray(p), want) for p in m.pieces.values())
        out = _report(run.trace, m, want, abs_err, rel_err, tol)
        small = got.shape == want.shape and want.size <= SHOWN
        out["got"], out["want"] = (got.tolist(), want.tolist()) if small else (None, None)
        return out
    return None


def _pinned(trace: Trace, m: Marked) -> Event | None:
    """The last collective any of the mark's ranks made at or before the step where it marked the tensor."""
    best = None
    for e in trace.events:
        if e.kind != "collective":
            continue
        if any(r in m.steps and e.step <= m.steps[r] for r in e.ranks) and (best is None or e.seq > best.seq):
            best = e
    return best


def _report(trace: Trace, m: Marked, want: np.ndarray, abs_err: float, rel_err: float, tol: float) -> dict:
    e = _pinned(trace, m)
    out = {"name": m.name, "placement": m.placement, "marked_on": f"{m.group_name}{list(m.group)}",
           "event": None, "op": None, "group": None, "label": None, "ranks": sorted(m.pieces), "site": None,
           "max_abs": abs_err, "max_rel": rel_err, "tolerance": tol, "copies_differ": not _copies_agree(m, tol),
           "would_match": None}
    if e is not None:
        member = next((x for x in e.members if x.rank in m.pieces), e.members[0])
        out.update(event=e.seq, op=e.op, group=f"{e.group.name}{list(e.group.ranks)}", label=e.label,
                   ranks=e.ranks, site=member.site)
    out["would_match"] = _would_match(trace, m, e, want, tol)
    return out


def _would_match(trace: Trace, m: Marked, e: Event | None, want: np.ndarray, tol: float) -> str | None:
    """Another placement for the mark, or another group for its sum, under which the pieces match; or, when
    the whole tensor is the reference times one number, that number (a scale: clipping, averaging)."""
    for other in ("Partial()", "Replicate()"):
        if other != m.placement and _error(assemble(other, m.group, m.pieces), want)[1] <= tol and (
                other != "Replicate()" or _copies_agree(Marked(**{**m.__dict__, "placement": other}), tol)):
            word = {"Partial()": f"summing these pieces over {m.group_name} (they are partial sums)",
                    "Replicate()": f"taking them as whole copies on {m.group_name}"}[other]
            return f"{word} would match"
    regroup = _regrouped(trace, m, e, want, tol)
    if regroup is not None:
        return regroup
    scaled = _scale(assemble(m.placement, m.group, m.pieces), want, tol)
    if scaled is not None and _copies_agree(m, tol):
        return (f"the reference times {scaled:.6g}: only a scale differs (a clipping factor, an average over "
                "another count, a loss scale)")
    return None


def _regrouped(trace: Trace, m: Marked, e: Event | None, want: np.ndarray, tol: float) -> str | None:
    """The other groups of the run tried in place of the all-reduce's (its kept inputs summed over each)."""
    if e is None or e.op not in ("all_reduce",) or not _outputs_are_marked(e, m):
        return None
    inputs = _inputs(trace, e, m)
    if inputs is None:
        return None
    names = list(dict.fromkeys(g.name for g in trace.groups if g.name != e.group.name))
    matching = []
    for name in names:
        fixed = {}
        for r in m.pieces:
            mine = next((h for h in trace.groups if h.name == name and r in h.ranks), None)
            if mine is None or any(x not in inputs for x in mine.ranks):
                break
            total = np.sum([inputs[x] for x in mine.ranks], axis=0)
            fixed[r] = total / len(mine.ranks) if e.params.get("op") == "avg" else total
        else:
            if _error(assemble(m.placement, m.group, fixed), want)[1] <= tol:
                matching.append(name)  # a layout can fold two axes onto the same ranks: name them all
    if matching:
        return f"{e.op} over {' or '.join(matching)} instead of {e.group.name} would match"
    return None


def _outputs_are_marked(e: Event, m: Marked) -> bool:
    """The marked tensors are the collective's results (so another group's sum can stand in for them)."""
    for x in e.members:
        if x.rank in m.pieces:
            if x.after is None or not np.array_equal(np.asarray(x.after[0]), m.pieces[x.rank]):
                return False
    return True


def _inputs(trace: Trace, e: Event, m: Marked) -> dict[int, np.ndarray] | None:
    """Every rank's input to the same call (the events with this label and op, one per group instance)."""
    out: dict[int, np.ndarray] = {}
    for x in trace.events:
        if x.op == e.op and x.label == e.label and x.step <= max(m.steps.values()):
            for member in x.members:
                if member.before is None:
                    return None
                out[member.rank] = np.asarray(member.before[0])
    return out


def _scale(got: np.ndarray, want: np.ndarray, tol: float) -> float | None:
    """c when got equals c * want (c not 1), to the tolerance; else None."""
    if got.shape != want.shape or not want.size or not np.any(want):
        return None
    c = float(np.vdot(got, want) / np.vdot(want, want))
    ok = _error(got, c * want)[1] <= tol and abs(c - 1.0) > tol
    return c if ok else None

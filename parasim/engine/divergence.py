"""Which collective broke it: a parallel run against a reference, compared at every tensor both marked.

A program marks tensors with `ctx.mark(name, x, placement, group)`: how the members of `group` hold the
whole tensor (each a slice along a dim, each a whole copy, or each a partial sum). The reference (one rank,
whole tensors) marks the same names. Here each marked tensor of the split run is put back together from its
members' pieces and compared with the reference's; the first that differs is the divergence. It is pinned on
the last collective its ranks made (or the last transfer they received) before marking it, and, when the
inputs of that collective were kept, other reductions, dims and groups of the run are tried in its place (and
other placements in the mark's) to say what would have matched; a transfer is described by what it carried
(a tensor its sender marked) or, on a ring, by whose data never arrived. A NaN equals a NaN at the same
place; one on a side only is named. Wrong sums are silent in training: this names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Any, cast

import numpy as np

from ..errors import UsageError
from ..layout.placement import Partial, Replicate, parse
from ..layout.placement import assemble as placement_assemble
from ..comm.trace import Event, Trace
from .tolerance import ROUNDOFFS, Closeness, allowed, counted, rounds, roundoff

# How far a split run's tensor may be from its reference's (engine/tolerance.py): each side's value went
# through the roundings its rank's ctx.xp products and sums made (counted on virtual ranks, engine/work.py;
# at least one), and the split side's through one more per piece its Partial placement sums; relative to
# the largest magnitude of the terms (the reference's value, or the pieces' summed magnitudes). A sum taken
# over pieces in another order stays inside; a wrong group or a missing sum is far outside (a whole piece).
RULE = (
    "each side within gamma(k) = k u / (1 - k u) of the exact values, k the roundings counted on its ranks, "
    "of the largest magnitude of the terms"
)
TOLERANCE = {"rule": RULE, "unit_roundoff": {name: p.u for name, p in ROUNDOFFS.items()}}
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
    rows: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> the whole's rows (dim 0) its piece holds
    size: int = 0  # the whole tensor's length along dim 0, when pieces hold rows of it


def collect(trace: Trace, marked: list[list[tuple[str, Any]]], who: str = "the run") -> dict[str, list[Marked]]:
    """Every marked name, with one entry per group instance that marked it, in the order they were marked.
    A rank that marks one name twice is refused (UsageError naming `who`): only one value could be compared."""
    seen: dict[int, int] = {}  # rank -> how many of its marks were read
    out: dict[str, dict[tuple | str, Marked]] = {}  # keyed by the group, or "rows" for pieces of rows
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
        # pieces holding rows of one whole come from several groups (a TP group per CP slice): one entry
        key = "rows" if data.get("rows") is not None else group
        entry = out.setdefault(name, {}).setdefault(
            key, Marked(name, data.get("placement", "Replicate()"), group, data.get("group_name", ""), {}, {}, i)
        )
        if mk.rank in entry.pieces:  # the second value would silently replace the first
            raise UsageError(
                f"{who} marks {name!r} twice on rank {mk.rank}; only one of them could be compared: "
                "give each mark a name of its own (such as a step or micro-batch number)"
            )
        if key == "rows" and mk.rank not in entry.group:  # each group's members in their own order
            entry.group += tuple(r for r in group if r not in entry.group) or (mk.rank,)
        entry.pieces[mk.rank] = np.asarray(value)
        entry.steps[mk.rank] = mk.step
        if data.get("rows") is not None:
            entry.rows[mk.rank], entry.size = tuple(data["rows"]), int(data["size"])
    return {name: sorted(groups.values(), key=lambda m: m.order) for name, groups in out.items()}


def assemble(
    placement: str,
    group: tuple[int, ...],
    pieces: dict[int, Any],
    rows: dict[int, tuple[int, ...]] | None = None,
    size: int = 0,
) -> np.ndarray:
    """The whole tensor from the members' pieces, in group order (`nn.placement.assemble`); with `rows`, the
    members holding the same rows are put together first and each block is written at its rows of a whole
    of length `size` (rows nobody holds stay NaN: they compare as wrong). Copies that differ are returned as
    they are (the last written): comparing with the reference, and `_copies_agree`, find them."""
    blocks = _blocks(placement, group, pieces, rows)
    if not rows:
        return blocks[0][1]
    whole = np.full((size, *blocks[0][1].shape[1:]), np.nan)  # float64 holds every piece's values, and NaN
    for idx, block in blocks:
        whole[list(idx)] = block
    return whole


def _blocks(
    placement: str, group: tuple[int, ...], pieces: dict[int, Any], rows: dict[int, tuple[int, ...]] | None
) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """(rows, the block the members holding them make up by `placement`), one per distinct set of rows."""
    p = parse(placement)
    by_rows: dict[tuple[int, ...], list] = {}
    for r in group:
        if r in pieces:
            by_rows.setdefault(rows[r] if rows else (), []).append(np.asarray(pieces[r]))
    return [(idx, placement_assemble(part, p, np)) for idx, part in by_rows.items()]


def _whole(m: Marked, placement: str | None = None) -> np.ndarray:
    return assemble(placement or m.placement, m.group, m.pieces, m.rows, m.size)


def max_error(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(max abs, max relative) difference. A NaN matches a NaN at the same place and an infinity the same
    infinity; a NaN or an infinity on one side only (a value gone bad, a row no rank held) is an infinite error."""
    if got.shape != want.shape:
        return float("inf"), float("inf")
    off = (got != want) & ~(np.isnan(got) & np.isnan(want))
    if not off.any():
        return 0.0, 0.0
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64  # no unsigned wrap-around
    diff = float(np.max(np.abs(got[off].astype(wide) - want[off].astype(wide))))  # where they differ: no inf - inf
    if not np.isfinite(diff):  # a NaN or an infinity on one side (or infinities of both signs)
        return float("inf"), float("inf")
    # a finite difference has a finite reference value: the reference's NaNs and infinities set no scale
    scale = float(np.max(np.abs(want[np.isfinite(want)])))
    return diff, diff / scale if scale else float("inf")


def _copies_agree(m: Marked, tol: float, placement: str | None = None) -> bool:
    """Whole copies (Replicate) on the members are equal, and so are rows that two blocks both hold."""
    placement = placement or m.placement
    copies = isinstance(parse(placement), Replicate)
    if not m.rows:
        first = np.asarray(m.pieces[next(r for r in m.group if r in m.pieces)])
        return not copies or all(max_error(np.asarray(p), first)[1] <= tol for p in m.pieces.values())
    whole = _whole(m, placement)
    if copies and any(max_error(np.asarray(p), whole[list(m.rows[r])])[1] > tol for r, p in m.pieces.items()):
        return False
    return all(
        max_error(block, whole[list(idx)])[1] <= tol for idx, block in _blocks(placement, m.group, m.pieces, m.rows)
    )


def first_divergence(run: Any, reference: Any, agreed: list[Closeness] | None = None) -> dict | None:
    """The first marked tensor of `run` (a RunResult with `marked`) that differs from the `reference` run's
    tensor of the same name, with the collective (or transfer) it is pinned on; None when every one agrees.
    `agreed`, when given, gets how close each tensor that agreed without being equal came."""
    if run.marked is None or reference.marked is None:
        raise UsageError("divergence needs the tensors the runs marked: run both on virtual ranks")
    ours = collect(run.trace, run.marked)
    theirs = collect(reference.trace, reference.marked, "the reference")
    missing = sorted(set(ours) - set(theirs))
    if missing:
        raise UsageError(f"the reference marks no tensor named {missing[0]!r}; mark the same names in both")
    entries = sorted((m for ms in ours.values() for m in ms), key=lambda m: m.order)
    # infinities and huge values make NaN and inf in the trial sums and scales: those are read as results
    with np.errstate(invalid="ignore", over="ignore"):
        return _first(run, (counted(run), counted(reference)), theirs, entries, agreed if agreed is not None else [])


def allowance(
    run: list[int], reference: list[int], m: Marked, ref: Marked, want: np.ndarray
) -> tuple[float, Closeness]:
    """(the relative tolerance for `m` against its reference `ref`, the allowance behind it with no gap yet):
    the coarser dtype of the two sides' pieces, the most roundings either side's ranks counted (the split
    side's plus its Partial sum's additions), of the largest magnitude of the terms."""
    dtypes = [np.asarray(p).dtype.name for x in (m, ref) for p in x.pieces.values()]
    # integers: their sums are exact, and float64's rounding of their size allows nothing
    dtype = max([d for d in dtypes if rounds(d)], key=lambda d: roundoff(d).u, default="float64")

    def most(got: list[int], ranks: Any) -> int:
        return max((got[r] for r in ranks), default=0)

    scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
    k = most(run, m.pieces)
    pieces = [np.abs(np.asarray(p, dtype=np.float64)) for p in m.pieces.values()]
    if isinstance(parse(m.placement), Partial) and len({p.shape for p in pieces}) == 1:
        k += len(pieces) - 1  # assembling sums the pieces: one addition per piece but one
        terms = reduce(np.add, pieces)  # one shape: the pieces added in turn, element by element
        scale = max(scale, float(np.max(terms[np.isfinite(terms)], initial=0.0)))
    k = max(1, k, most(reference, ref.pieces))
    bound = float(allowed(dtype, k, scale))
    rel = bound / float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0) or 1.0) if bound else 0.0
    return rel, Closeness(dtype, k, "the terms' largest magnitude", 0.0, bound)


def _first(
    run: Any,
    roundings: tuple[list[int], list[int]],
    theirs: dict[str, list[Marked]],
    entries: list[Marked],
    agreed: list[Closeness],
) -> dict | None:
    for m in entries:
        ref = theirs[m.name][0]
        want, got = _whole(ref), _whole(m)
        tol, allow = allowance(*roundings, m, ref, want)
        abs_err, rel_err = max_error(got, want)
        gaps = _unheld(m)
        if rel_err <= tol and _copies_agree(m, tol) and not gaps:
            if abs_err:
                agreed.append(Closeness(allow.dtype, allow.roundings, allow.of, abs_err, allow.bound))
            continue
        if rel_err <= tol:  # the copies disagree although the first one is right: measure the worst copy
            abs_err, rel_err = max(
                max_error(np.asarray(p), want[list(m.rows[r])] if m.rows else want) for r, p in m.pieces.items()
            )
        out = _report(run, m, want, abs_err, rel_err, tol)
        out["allowance"] = Closeness(allow.dtype, allow.roundings, allow.of, abs_err, allow.bound).words()
        out["rows_missing"], out["nan"] = gaps or None, _bad_values(got, want, gaps)
        small = got.shape == want.shape and want.size <= SHOWN
        out["got"], out["want"] = (got.tolist(), want.tolist()) if small else (None, None)
        return out
    return None


def _unheld(m: Marked) -> list[int]:
    """The rows of the whole that no rank marked (for pieces that hold rows): they are NaN in the whole."""
    held = {i for rows in m.rows.values() for i in rows}
    return [i for i in range(m.size) if i not in held]  # size is 0 for whole pieces


def _bad_values(got: np.ndarray, want: np.ndarray, gaps: list[int]) -> str | None:
    """Words for the first place where one side holds a NaN or an infinity and the other does not hold the
    same (rows no rank held, `gaps`, are left out: they are missing, not bad)."""
    if got.shape != want.shape:
        return None
    odd = (~np.isfinite(got) | ~np.isfinite(want)) & (got != want) & ~(np.isnan(got) & np.isnan(want))
    odd[gaps] = False
    where = np.argwhere(odd)
    if not len(where):
        return None
    at = tuple(int(k) for k in where[0])
    mine, theirs = got[at].item(), want[at].item()
    more = f" ({len(where)} places in all)" if len(where) > 1 else ""
    if np.isfinite(mine) or np.isnan(theirs):  # the reference's NaN is named first: nothing can match it
        return f"the reference has {theirs} at {list(at)} where this run has {mine:.6g}{more}"
    word = "a NaN" if np.isnan(mine) else "an infinity"
    return f"{word} appears here: this run has {mine} at {list(at)} where the reference has {theirs:.6g}{more}"


def _pinned(trace: Trace, m: Marked) -> Event | None:
    """The last collective any of the mark's ranks made, or the last transfer one of them received, at or before
    the step where it marked the tensor: the last time data reached the ranks holding it."""
    best = None
    for e in trace.events:
        if e.kind == "collective":
            ranks = e.ranks
        elif e.kind == "p2p":
            ranks = [e.params["dst"]]  # a send changes nothing its sender holds
        else:
            continue
        if any(r in m.steps and e.step <= m.steps[r] for r in ranks) and (best is None or e.seq > best.seq):
            best = e
    return best


def _report(run: Any, m: Marked, want: np.ndarray, abs_err: float, rel_err: float, tol: float) -> dict:
    trace = run.trace
    e = _pinned(trace, m)
    where = f"ranks{sorted(m.pieces)} by rows" if m.rows else f"{m.group_name}{list(m.group)}"
    out = {
        "name": m.name,
        "placement": m.placement,
        "marked_on": where,
        "event": None,
        "op": None,
        "group": None,
        "label": None,
        "ranks": sorted(m.pieces),
        "site": None,
        "received_at": None,
        "max_abs": abs_err,
        "max_rel": rel_err,
        "tolerance": tol,
        "copies_differ": not _copies_agree(m, tol),
        "would_match": None,
        "transfer": None,
    }
    if e is not None and e.kind == "p2p":  # the sender's line chose what moved; the receiver's took it
        sender, receiver = e.members
        out.update(
            event=e.seq,
            op=e.op,
            group=f"{e.group.name}{list(e.group.ranks)}",
            label=e.label,
            ranks=e.ranks,
            site=sender.site,
            received_at=receiver.site,
            transfer=_carried(trace, run.marked, e) or _ring_gap(trace, e, m),
        )
    elif e is not None:
        member = next(x for x in e.members if x.rank in m.pieces)  # the event was picked for such a rank
        out.update(
            event=e.seq,
            op=e.op,
            group=f"{e.group.name}{list(e.group.ranks)}",
            label=e.label,
            ranks=e.ranks,
            site=member.site,
        )
    out["would_match"] = _would_match(trace, m, e, want, tol)
    return out


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _carried(trace: Trace, marked: list[list[tuple[str, Any]]], e: Event) -> str | None:
    """What a transfer carried, when it is a tensor its sender marked before sending (the transfer is where
    the receiver's tensor went wrong: the sender's was right), and the tensor of that shape it marked last."""
    sender = e.members[0]
    if sender.before is None:  # values not kept
        return None
    payload, src = np.asarray(sender.before[0]), e.params["src"]
    before = [
        (name, x)
        for mk, (name, x) in zip([mk for mk in trace.marks if mk.rank == src and mk.kind == "tensor"], marked[src])
        if mk.step < e.step
    ]
    same = [name for name, x in before if _same(x, payload)]
    if not same:
        return None
    last = [name for name, x in before if np.shape(x) == payload.shape][-1]
    tail = f", not {last!r}, the last tensor of that shape it marked before sending" if last != same[-1] else ""
    return f"the transfer carried what rank {src} marked as {same[-1]!r}{tail}"


def _ring_gap(trace: Trace, e: Event, m: Marked) -> str | None:
    """On a ring (under the transfer's label every member of its group sends to the next member, or every one
    to the previous), the members whose first payload never reached the receiver by the time it marked the
    tensor, when the ring made fewer than its n - 1 steps there: a step skipped or cut short."""
    moves = [x for x in trace.events if x.kind == "p2p" and x.label == e.label and x.group == e.group]
    ranks, n = e.group.ranks, e.group.size
    pairs = {(x.params["src"], x.params["dst"]) for x in moves}
    if pairs not in [{(ranks[i], ranks[(i + s) % n]) for i in range(n)} for s in (1, -1)] or any(
        x.members[0].before is None for x in moves
    ):
        return None  # not a ring over the whole group, or values not kept
    dst = e.params["dst"]
    got = [x for x in moves if x.params["dst"] == dst and x.step <= m.steps[dst]]
    sent = {q: [x for x in moves if x.params["src"] == q] for q in ranks}
    first = {id(x): cast(tuple, x.members[0].before)[0] for x in moves}  # every move kept its values: above
    origin = {q: [first[id(x)] for x in xs if x.step == min(y.step for y in xs)] for q, xs in sent.items()}
    arrived = [q for q in ranks if q != dst and any(_same(first[id(x)], o) for x in got for o in origin[q])]
    never = [q for q in ranks if q != dst and q not in arrived]
    steps = len({x.step for x in got})
    if not never or steps >= n - 1:
        return None  # every step made: what went on was changed on the way (a sum), not left out
    return (
        f"on the ring '{e.label}' over {e.group.name}, rank {dst} received what {_ranks(arrived)} first sent "
        f"but never what {_ranks(never)} sent, in {steps} step(s): a ring of {n} ranks takes "
        f"{n - 1} steps to bring every rank what each other rank holds (a step was skipped or cut short)"
    )


def _ranks(xs: list[int]) -> str:
    return ("rank " if len(xs) == 1 else "ranks ") + ", ".join(str(x) for x in xs)


def _would_match(trace: Trace, m: Marked, e: Event | None, want: np.ndarray, tol: float) -> str | None:
    """Another placement for the mark, or another group for its sum, under which the pieces match; or, when
    the whole tensor is the reference times one number, that number (a scale: clipping, averaging)."""
    for other in ("Partial()", "Replicate()"):
        if (
            other != m.placement
            and max_error(_whole(m, other), want)[1] <= tol
            and (other != "Replicate()" or _copies_agree(m, tol, other))
        ):
            word = {
                "Partial()": f"summing these pieces over {m.group_name} (they are partial sums)",
                "Replicate()": f"taking them as whole copies on {m.group_name}",
            }[other]
            return f"{word} would match"
    regroup = _regrouped(trace, m, e, want, tol)
    if regroup is not None:
        return regroup
    scaled = _scale(_whole(m), want, tol)
    if scaled is not None and _copies_agree(m, tol):
        return (
            f"the reference times {scaled:.6g}: only a scale differs (a clipping factor, an average over "
            "another count, a loss scale)"
        )
    if e is not None and not _copies_agree(m, tol) and _equal_after(e, m):
        return (
            f"the copies on {m.group_name} were equal after '{e.label}' and differ here: what each rank did "
            f"alone since then (a draw from its own random stream?) must be the same on all of {m.group_name} "
            "(one stream shared by the group) to match"
        )
    return None


def _equal_after(e: Event, m: Marked) -> bool:
    """Every member of the collective that also marked the tensor came out of it with the same values."""
    outs = [np.asarray(x.after[0]) for x in e.members if x.rank in m.pieces and x.after is not None]
    return len(outs) == len(m.pieces) and all(np.array_equal(o, outs[0], equal_nan=True) for o in outs[1:])


REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "avg": lambda xs: np.mean(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
}


def _regrouped(trace: Trace, m: Marked, e: Event | None, want: np.ndarray, tol: float) -> str | None:
    """Other reductions, other dims (a reduce-scatter's), then the other groups of the run, tried in place of
    the call's (on its kept inputs): what would have made every marked piece right."""
    if e is None or e.op not in ("all_reduce", "reduce_scatter") or not _outputs_are_marked(e, m):
        return None
    inputs = _inputs(trace, e, m)
    if inputs is None:
        return None
    op, dim = e.params["op"], e.params.get("dim")  # dim: a reduce-scatter's; None: all-reduce

    def right(name: str, o: str, d: int | None) -> bool:
        return _reduced_matches(trace, m, inputs, name, o, want, tol, d)

    ops = [o for o in REDUCE if o != op and right(e.group.name, o, dim)]
    if ops:
        return f"{e.op} with op={ops[0]} instead of op={op} over {e.group.name} would match"
    dims = (
        []
        if dim is None
        else [d for d in range(np.ndim(next(iter(inputs.values())))) if d != dim and right(e.group.name, op, d)]
    )
    if dims:
        return f"{e.op} with dim={dims[0]} instead of dim={dim} over {e.group.name} would match"
    names = list(dict.fromkeys(g.name for g in trace.groups if g.name != e.group.name))
    # a layout can fold two axes onto the same ranks: name every group that matches
    matching = [n for n in names if op in REDUCE and right(n, op, dim)]
    if matching:
        return f"{e.op} over {' or '.join(matching)} instead of {e.group.name} would match"
    return None


def _reduced_matches(
    trace: Trace, m: Marked, inputs: dict, name: str, op: str, want: np.ndarray, tol: float, dim: int | None = None
) -> bool:
    """Each marking rank's result, were the inputs reduced by `op` over its group called `name` (and, with
    `dim`, scattered along it: the rank keeps its chunk), is right."""
    fixed = {}
    for r in m.pieces:
        mine = next((h for h in trace.groups if h.name == name and r in h.ranks), None)
        if mine is None or any(x not in inputs for x in mine.ranks):
            return False
        whole = REDUCE[op]([inputs[x] for x in mine.ranks])
        if dim is not None and whole.shape[dim] % mine.size:
            return False  # that group cannot split this dim evenly
        fixed[r] = whole if dim is None else np.split(whole, mine.size, axis=dim)[mine.ranks.index(r)]
    trial = Marked(**{**m.__dict__, "pieces": fixed})
    return max_error(_whole(trial), want)[1] <= tol and _copies_agree(trial, tol)


def _outputs_are_marked(e: Event, m: Marked) -> bool:
    """The marked tensors are the collective's results (so another group's sum can stand in for them)."""
    for x in e.members:
        if x.rank in m.pieces:
            if x.after is None or not _same(x.after[0], m.pieces[x.rank]):
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
    ok = max_error(got, c * want)[1] <= tol and abs(c - 1.0) > tol
    return c if ok else None

"""Tensor parallelism on the smallest MLP there is: one token, hidden size 2, width 4, two ranks.

Z = ReLU(X·A)·B. Splitting A by rows leaves partial sums that a ReLU cannot take; splitting A by columns
and B by rows needs one all-reduce, after B. The backward pass runs through the same layers in reverse
and needs one all-reduce too, for dL/dX. The numbers are the post's; every result is computed here.
--tp 1 or 4 runs the same MLP unsplit or on four ranks (one column of A each), checked against the same
unsplit model.
"""
from __future__ import annotations

import numpy as np

from parasim.lesson import Check, Knob, Lesson, check
from parasim.nn import ColumnParallelLinear, RowParallelLinear, Saved, ParallelContext
from parasim.nn.activations import relu, relu_backward

X = [[[1, 2]]]  # [sequence 1, batch 1, hidden 2]
A = [[1, 0, -1, 2],
     [0, 1, 1, -1]]
B = [[1, 0],
     [0, 1],
     [1, 1],
     [2, -1]]


def program(ctx):
    xp, comm, out = ctx.xp, ctx.comm, {}
    tp = ParallelContext(ctx, ctx.new_group(range(ctx.world), "tp"))
    x, a, b = ctx.asarray(X), ctx.asarray(A), ctx.asarray(B)

    ctx.phase("splitting A by rows")
    # rank i holds row i of A and entry i of X: its product is only a partial sum of X·A
    lo, hi = _rows_of(ctx.rank, ctx.world, a.shape[0])
    if lo == hi:  # --tp 4: A has two rows, so two of the four ranks hold none and add zeros
        ctx.note(f"holds no row of A (A has {a.shape[0]} rows for {ctx.world} ranks): its partial sum is zero")
    partial = xp.matmul(x[..., lo:hi], a[lo:hi])
    out["row partial"] = partial
    if lo < hi:
        rows = f"row {hi}" if hi - lo == 1 else f"rows {lo + 1}-{hi}"
        ctx.note(f"holds {rows} of A and the matching part of X: {_show(x[..., lo:hi])}·{_show(a[lo:hi], True)} "
                 f"= {_show(partial)}, a partial sum; its ReLU is {_show(relu(xp, partial))}")
    # the wrong way first, as it fails: each rank's ReLU, then the sum; then the sum first, as it must be done
    split = ctx.world > 1  # on one rank nothing is split, and the two orders agree
    out["ReLU then sum"] = comm.all_reduce(relu(xp, partial), group=tp.tp_group,
                                           label=("wrong: " if split else "") + "each rank's ReLU, then the sum")
    out["sum then ReLU"] = relu(xp, comm.all_reduce(partial, group=tp.tp_group,
                                                    label=("right: " if split else "") + "the sum, then one ReLU"))
    if ctx.rank == 0:
        said = (f"wrong: the ReLUs summed give {_show(out['ReLU then sum'])}; right: the ReLU of the sum gives "
                f"{_show(out['sum then ReLU'])}, which is ReLU(X·A)") if split else (
                f"one rank holds every row: both orders give {_show(out['sum then ReLU'])}, ReLU(X·A)")
        ctx.note(said, run=True)

    ctx.phase("splitting A by columns")
    fc1 = ColumnParallelLinear(tp, a, name="A")  # rank i: columns 2i, 2i+1 of A
    fc2 = RowParallelLinear(tp, b, name="B")  # rank i: rows 2i, 2i+1 of B
    saved = Saved(tag="X")  # the layers mark their outputs for `parasim check`
    h, c1 = fc1.forward(x, saved)  # f is the identity going forward: no communication
    # an event of its own, so that the app can stop on the split's key result (each rank's Y_i)
    ctx.compute("X·A_i and ReLU on my columns of A: nothing to send", 2 * x.shape[-1] * h.shape[-1])
    y = relu(xp, h)
    out["A_i"], out["X·A_i"], out["Y_i"] = fc1.weight, h, y
    ctx.note(f"holds A_i = {_show(fc1.weight, True)}; X·A_i = {_show(h)}, ReLU -> Y_i = {_show(y)}")

    ctx.phase("splitting B by rows, one all-reduce")
    ctx.note(f"holds B_i = {_show(fc2.weight, True)}; Y_i·B_i = {_show(xp.matmul(y, fc2.weight))}")
    n, t = b.shape[-1], ctx.world
    if ctx.rank == 0 and n < t:  # --tp 4: the ring has more ranks than Z has values
        sizes = [len(c) for c in np.array_split(np.arange(n), t)]
        ctx.note(f"Z has {n} values for a ring of {t}: its chunks hold {', '.join(map(str, sizes))} values, so "
                 "each rank sends whichever chunks pass through it and the bytes differ from rank to rank; "
                 f"2(t-1)/t of the buffer, {2 * (t - 1) * n * 8 // t} B here, is the ranks' average")
    z, c2 = fc2.forward(y, saved)  # partial Y_i·B_i, then g: all-reduce
    out["B_i"], out["Z"] = fc2.weight, z

    ctx.phase("backward")
    dz = xp.ones_like(z)  # L = sum(Z)
    dy = fc2.backward(c2, dz)  # g is the identity going backward
    dh = relu_backward(xp, h, dy)
    mine = xp.matmul(dh, xp.swapaxes(fc1.weight, -1, -2))  # this rank's share of dL/dX: its half of A alone
    ctx.note(f"through B: dL/dY_i = {_show(dy)}; through ReLU: {_show(dh)}; through A: {_show(dh)}·A_iᵀ = "
             f"{_show(mine)}, this rank's part of dL/dX")
    dx = fc1.backward(c1, dh)  # f: all-reduce of the partial dL/dX
    out["dL/dY_i"], out["dL/d(X·A_i)"], out["dL/dX_i"], out["dL/dX"] = dy, dh, mine, dx
    out["dL/dA_i"], out["dL/dB_i"] = fc1.grads["weight"], fc2.grads["weight"]
    ctx.note(f"weight gradients, local: dL/dA_i = {_show(out['dL/dA_i'], True)}, "
             f"dL/dB_i = {_show(out['dL/dB_i'], True)}")
    return out


def _rows_of(rank: int, world: int, rows: int) -> tuple[int, int]:
    """The rows of A that `rank` holds in the row split, [lo, hi): an even share, one row each when there are
    more ranks than rows (the ranks past the last row hold none)."""
    per = max(rows // world, 1)
    lo = min(rank * per, rows)
    return lo, min(lo + per, rows)


def _show(a, matrix: bool = False) -> str:
    """A small array as the post writes it, integers without '.0': a vector (one row) with commas, [1, 0, 0, 2]
    (the run holds it as [[[1, 0, 0, 2]]]); a matrix (or a weight, `matrix`) row by row, [1 0; 0 1]."""
    rows = np.asarray(a.tolist(), dtype=float).reshape(-1, a.shape[-1])
    if len(rows) == 1 and not matrix:
        return "[" + ", ".join(f"{v:g}" for v in rows[0]) + "]"
    text = "; ".join(" ".join(f"{v:g}" for v in row) for row in rows)
    return f"[{text}]"


def checks(result) -> list[Check]:
    v = result.values
    x, a, b = (np.asarray(m, dtype=float) for m in (X, A, B))
    t = result.world
    cols = np.split(np.arange(a.shape[1]), t)
    # the unsplit model, on one device
    h = x @ a
    y = np.maximum(h, 0)
    z = y @ b
    dy = np.ones_like(z) @ b.T
    dh = dy * (h > 0)
    dx = dh @ a.T
    da = np.tensordot(x, dh, axes=([0, 1], [0, 1]))
    db = np.tensordot(y, np.ones_like(z), axes=([0, 1], [0, 1]))
    # the ReLU of each rank's partial sum, summed: the row split done wrong (one rank: no split, so right)
    wrong = sum(np.maximum(x[..., lo:hi] @ a[lo:hi], 0) for lo, hi in (_rows_of(r, t, a.shape[0]) for r in range(t)))
    ar = [e for e in result.trace.events if e.op == "all_reduce"]
    return [
        check("rows of A, wrong: the ReLU of each partial, summed" if t > 1 else
              "rows of A, one rank: the ReLU of its partial, which is all of X·A",
              [v[r]["ReLU then sum"] for r in range(t)], [wrong] * t),
        check("... is not ReLU(X·A)" if t > 1 else "... which on one rank is ReLU(X·A): nothing was split",
              bool(np.any(np.asarray(v[0]["ReLU then sum"]) != y)), t > 1),
        check("rows of A, right: all-reduce before the ReLU gives ReLU(X·A)",
              [v[r]["sum then ReLU"] for r in range(t)], [y] * t),
        check("columns of A: rank i holds finished values Y_i = ReLU(X·A_i)", [v[r]["Y_i"] for r in range(t)],
              [y[..., c] for c in cols]),
        check("rows of B and one all-reduce give Z = ReLU(X·A)·B on every rank", [v[r]["Z"] for r in range(t)], [z] * t),
        check("backward through B: dL/dY_i = dL/dZ·B_iᵀ", [v[r]["dL/dY_i"] for r in range(t)],
              [dy[..., c] for c in cols]),
        check("backward through ReLU (ReLU'(0) = 0)", [v[r]["dL/d(X·A_i)"] for r in range(t)],
              [dh[..., c] for c in cols]),
        check("backward through A, each rank alone: dL/d(X·A_i)·A_iᵀ, its part of dL/dX",
              [v[r]["dL/dX_i"] for r in range(t)], [dh[..., c] @ a[:, c].T for c in cols]),
        check("backward through A, then all-reduce: dL/dX equals the unsplit backward", [v[r]["dL/dX"] for r in
                                                                                          range(t)], [dx] * t),
        check("weight gradients need no communication: dL/dA_i, dL/dB_i are slices of the unsplit ones",
              [[v[r]["dL/dA_i"], v[r]["dL/dB_i"]] for r in range(t)], [[da[:, c], db[c, :]] for c in cols]),
        check("all-reduces for the column-row MLP: one forward (g), one backward (f)" if t > 1 else
              "all-reduces for the column-row MLP: none on one rank (g and f have nothing to sum)",
              [sum(e.label == lbl for e in ar) for lbl in ("g forward", "f backward")], [int(t > 1)] * 2),
    ]


NARRATIVE = {
    "splitting A by rows": """
        The MLP is Z = ReLU(X·A)·B for one token with two features. Suppose rank i takes row i of A,
        together with X's feature i (on the post's two ranks; A has only two rows, so at --tp 4 two
        ranks hold none, and at --tp 1 nothing is split). Each product is then only a partial sum of
        X·A: adding them gives the right pre-activation, but a ReLU applied to each part before adding
        does not. The ranks would need an all-reduce before every nonlinearity.""",
    "splitting A by columns": """
        Split A by columns instead. Every rank sees the whole X (the f operator: nothing to do going
        forward) and each computes complete values for its own columns (two of the four on the post's two
        ranks, one at --tp 4), so the ReLU runs locally.""",
    "splitting B by rows, one all-reduce": """
        B is split by rows, so each rank holds exactly the rows its part of Y multiplies. Each product
        Y_i·B_i is a partial sum of Z; one all-reduce (the g operator) finishes it on every rank. Each
        rank keeps 4/t of A's four columns and of B's four rows: two of each on the post's two ranks.""",
    "backward": """
        Take L = sum(Z), so dL/dZ is all ones. Each rank runs its share backward: through B (g needs
        nothing going backward), through the ReLU (its derivative at 0 is taken as 0, as PyTorch does),
        and through A. X was copied to every rank going forward, so its gradient is a sum: f's backward
        is the all-reduce that gives dL/dX. The weight gradients use only local factors.""",
}

LESSON = Lesson(
    no_picture='two ranks and a few small matrices: the walk-through prints every value, which a picture would only repeat',
    name="tp-mlp",
    section="Tensor parallelism: the MLP, with real numbers; the backward pass",
    order=50,
    title="Tensor parallelism: the MLP split by columns, then rows",
    world=2,
    worlds=(1, 2, 4),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="the post's 2-GPU MLP: the wrong row split, the column-row split, one all-reduce each way",
    keep_values=16,
    reference=program,  # on one rank: the same layers, unsplit
    knobs={"tp": Knob(2, choices=(1, 2, 4), world=True,
                    limits="A has 4 columns and B 4 rows: each rank takes the same number of whole ones")},  # A has 4 columns: 1, 2 or 4 ranks split them evenly
)

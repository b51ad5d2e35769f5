"""Your own SPMD program, run by parasim like a lesson: a two-layer MLP split over TP ranks by hand.

    parasim lesson examples/my_tp.py:program --world 2 --plain     # walk through it on virtual ranks
    parasim view examples/my_tp.py:program --world 2               # step through it in the app
    parasim run examples/my_tp.py:program --backend gloo --nproc 2 # the same on real ranks, compared
    parasim check examples/my_tp.py:program --world 2              # against itself on one rank, tensor by tensor

`program(ctx)` is called once per rank. `ctx.rank` and `ctx.world` say who it is, `ctx.comm` makes the
collectives, `ctx.xp` is the array namespace (numpy here, torch on real ranks), `ctx.shared_rng(name)` draws
the same numbers on every rank. The optional names below give the walk-through its words and its checks.
"""
import numpy as np

from parasim.lesson import check

TITLE = "My TP MLP: a column split, then a row split, one all-reduce"
NARRATIVE = {
    "forward": """
        Each rank holds a block of W1's columns and the matching block of W2's rows. x @ W1 needs no
        communication (each rank makes its own columns of the hidden layer); the row-parallel product gives
        each rank a partial sum of y, and one all-reduce adds them up.""",
}
TOKENS, HIDDEN, FFN = 4, 6, 8


def program(ctx):
    tp = ctx.new_group(range(ctx.world), "tp")
    x = ctx.shared_rng("x").normal((TOKENS, HIDDEN))
    w1 = ctx.shared_rng("w1").normal((HIDDEN, FFN))  # whole on every rank; each keeps its block
    w2 = ctx.shared_rng("w2").normal((FFN, HIDDEN))
    cols = slice(ctx.rank * FFN // ctx.world, (ctx.rank + 1) * FFN // ctx.world)
    ctx.phase("forward")
    h = ctx.xp.maximum(x @ w1[:, cols], 0.0)  # ReLU acts on each column alone: no communication yet
    ctx.mark("h", h, "Shard(1)", tp)  # for `parasim check`: each rank holds a block of h's columns
    partial = h @ w2[cols, :]
    y = ctx.comm.all_reduce(partial, group=tp, label="sum the row-parallel partial outputs")
    return ctx.mark("y", y, "Replicate()", tp)  # ... and all of y


def checks(result):
    """The same MLP on one device, written with numpy."""
    from parasim import run
    x, w1, w2 = run(lambda ctx: [ctx.shared_rng(n).normal(s) for n, s in
                                 (("x", (TOKENS, HIDDEN)), ("w1", (HIDDEN, FFN)), ("w2", (FFN, HIDDEN)))], 1).values[0]
    want = np.maximum(x @ w1, 0.0) @ w2
    return [check(f"rank {r}'s output against the unsplit MLP's: largest difference", float(np.max(np.abs(
        np.asarray(y) - want))), 0.0, atol=1e-12) for r, y in enumerate(result.values)]

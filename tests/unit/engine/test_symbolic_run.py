"""What one symbolic run owns: its shape-rule memo, its slices, each rank's matmul FLOPs (counted for the rank
whose turn it is); what arrays without values refuse (an order, the nonzeros); and the layers and the plain
virtual world, which know nothing of either."""
from pathlib import Path

import numpy as np
import pytest

import parasim
from parasim.errors import UsageError
from parasim.engine.symbolic import SymArray, SymbolicValueError
from parasim.engine.symbolic.array import SymbolicRun
from parasim.engine.symbolic.namespace import SymbolicNamespace

ROOT = Path(parasim.__file__).parent


def test_each_rank_counts_its_own_matmuls_even_on_arrays_another_rank_made():
    """Rank r multiplies (r + 1) times [2, 3] @ [3, 4] (48 FLOPs each, of arrays made from numpy's); rank 1
    then multiplies what rank 0 sent it, [5, 3] @ [3, 2] (60 FLOPs): the count goes to the rank
    that ran it, not to the maker."""
    def program(ctx):
        a, b = ctx.xp.asarray(np.ones((2, 3))), ctx.xp.asarray(np.ones((3, 4)))
        for _ in range(ctx.rank + 1):
            a @ b
        if ctx.rank == 0:
            ctx.comm.send(ctx.xp.zeros((5, 3)), 1)
        else:
            x = ctx.comm.recv(0, (5, 3), "bfloat16")  # zeros are made in the run's float: the post's BF16
            ctx.xp.matmul(x, ctx.xp.zeros((3, 2)))
    flops = parasim.run(program, 2, backend="symbolic").trace.meta["flops"]
    assert flops == [48, 2 * 48 + 60]


def test_a_run_owns_its_memo_and_the_next_run_starts_empty():
    runs = []

    def program(ctx):
        x = ctx.xp.zeros((2, 3))
        runs.append(x.run)
        return (x + 1.0).shape
    for _ in range(2):
        assert parasim.run(program, 1, backend="symbolic").values == [(2, 3)]
    first, second = runs
    assert first is not second and first.memo and len(second.memo) == len(first.memo)
    outside = SymArray((2, 3))
    assert outside.run is None and (outside + 1.0).run is None  # made outside any run: no memo, no count


def test_the_memo_answers_what_the_rule_gives():
    """A memo hit gives what working the rule out gave: the same shape and dtype, and the run's own array."""
    run = SymbolicRun(1, lambda: 0)
    xp = SymbolicNamespace(run)
    a, b = xp.zeros((4, 1), dtype="float32"), xp.zeros((3,), dtype="float64")
    first, again = a * b, a * b
    assert (first.shape, first.dtype, again.shape, again.dtype) == ((4, 3), np.float64, (4, 3), np.float64)
    assert first.run is run and again.run is run and len(run.memo) == 1
    assert (a @ xp.zeros((1, 5))).shape == (4, 5) and run.flops == [2 * 4 * 5 * 1]


def test_slices_of_one_shape_are_one_array_of_the_run():
    run = SymbolicRun(1, lambda: 0)
    x = SymbolicNamespace(run).zeros((10, 3))
    blocks = [x[0:4], x[4:8], x[8:10], x[8:12]]
    assert blocks[0] is blocks[1] and blocks[2] is blocks[3] and blocks[0] is not blocks[2]
    assert [b.shape for b in blocks] == [(4, 3), (4, 3), (2, 3), (2, 3)] and x[2:2].shape == (0, 3)
    assert x[::2].shape == (5, 3) and SymArray((10, 3))[0:4] is not SymArray((10, 3))[0:4]


def test_index_lists_with_values_are_checked_and_arrays_without_count_by_shape():
    s = SymArray((3, 4))
    assert s[(0, 2), :].shape == (2, 4) and s[:, np.array([[0], [3]])].shape == (3, 2, 1)
    assert s[SymArray((5,), "int64")].shape == (5, 4)  # no values to check: its shape is the answer
    with pytest.raises(IndexError, match="out of bounds"):
        s[(0, 3), :]


def test_an_order_or_the_nonzeros_are_refused_by_name():
    xp = SymbolicNamespace()
    s = SymArray((4, 8), "float32")
    for ask, what in ((lambda: xp.argsort(s, axis=1, stable=True), "argsort"), (lambda: xp.nonzero(s), "nonzero"),
                      (lambda: np.argmax(s), "argmax"), (lambda: np.flatnonzero(s), "flatnonzero")):
        with pytest.raises(SymbolicValueError, match=rf"^{what}\(\) of a symbolic float32 array of shape \(4, 8\)"):
            ask()
    assert xp.argsort(np.array([3, 1, 2])).tolist() == [1, 2, 0]  # index lists have values: ordered
    assert [r.shape for r in SymArray((3, 2))] == [(2,)] * 3  # rows, as numpy iterates
    with pytest.raises(TypeError, match="0-d"):
        iter(SymArray(()))


def test_moe_without_values_says_what_to_do():
    """Routing by the router's scores needs their order, and reading which rows chose an expert needs the
    gates' values: arrays without them refuse, and the MoE block says what to give instead."""
    from parasim.nn import LayerOptions, ParallelContext, Saved
    from parasim.nn.moe import MoE
    from parasim.nn.routing import Routing

    def block(routing, etp):
        def program(ctx):
            g = ctx.new_group([0, 1], "etp" if etp else "ep")  # experts split over it, or placed on it
            experts = [{"w1": ctx.xp.zeros((4, 6)), "w2": ctx.xp.zeros((6, 4))} for _ in range(4)]
            tp = ParallelContext(ctx, options=LayerOptions(routing=routing))
            moe = MoE(tp, None if etp else g, ctx.xp.zeros((4, 4)), experts, 2, etp=g if etp else None)
            moe.forward(ctx.xp.zeros((3, 1, 4)), Saved())
        return program
    with pytest.raises(UsageError, match=r"moe: no router scores to route by \(argsort\(\) of a symbolic .*give a "
                                         r"routing policy \(uniform, balanced, skewed:F or biased:F\)"):
        parasim.run(block(None, False), 2, backend="symbolic")
    # experts split over expert TP: each peer's rows from its senders' draws, no gate read
    parasim.run(block(Routing.parse("uniform"), True), 2, backend="symbolic")
    parasim.run(block(Routing.parse("uniform"), False), 2, backend="symbolic")
    parasim.run(block(None, True), 2)  # arrays with values: the router's order, the gates' nonzeros


def test_the_layers_and_the_plain_virtual_world_know_neither_backend_nor_folding():
    for path in (ROOT / "nn").glob("*.py"):
        assert "symbolic" not in path.read_text().lower(), path.name
    for name in ("virtual.py", "virtual_p2p.py"):
        plain = (ROOT / "comm" / name).read_text().lower()
        assert "fold" not in plain and ".rep" not in plain and "flops =" not in plain, name


def test_run_symbolic_defaults_and_what_it_hands_back():
    """A symbolic run without options: seed 0 on every context and in the trace, the direct algorithm, no
    kept values; each rank's marks come back, and a folded run gives a folded rank its representative's
    FLOPs."""
    from parasim.engine.symbolic.backend import run_symbolic

    def program(ctx):
        x = ctx.xp.asarray(np.ones((2, 3)))
        ctx.comm.all_reduce(x @ ctx.xp.asarray(np.ones((3, 2))))
        ctx.mark("x", x, "Replicate()")
        return ctx.seed
    res = run_symbolic(program, 2)
    assert res.values == [0, 0] and res.trace.meta["seed"] == 0
    assert res.trace.meta["keep_values"] == 0 and res.trace.meta["algo"] == "direct"
    assert [[m[0] for m in marks] for marks in res.marked] == [["x"], ["x"]]
    assert run_symbolic(program, 2, algo="ring").trace.meta["algo"] == "ring"
    folded = run_symbolic(program, 4, fold=[0, 0, 2, 2])
    assert folded.trace.meta["flops"] == [24, 24, 24, 24]  # [2, 3] @ [3, 2]: 2 * 2 * 3 * 2


def test_slices_and_picked_rows_stay_in_the_run():
    """A plain slice is looked up by its bounds, so a stepped slice with the same bounds must not be taken for
    it; rows picked by a list are the run's too, so a matmul on them is counted."""
    def program(ctx):
        a = ctx.xp.zeros((6, 3))
        shapes = [a[0:6:2].shape, a[0:6].shape, a[0:6:2].shape, a[0:6:3].shape, a[1:5].shape]
        a[[0, 2]] @ ctx.xp.zeros((5, 4))[[0, 1, 2]]  # [2, 3] @ [3, 4], both picked rows: 48 FLOPs
        return shapes
    res = parasim.run(program, 1, backend="symbolic")
    assert res.values[0] == [(3, 3), (6, 3), (3, 3), (2, 3), (4, 3)]
    assert res.trace.meta["flops"] == [48]


def test_where_and_tensordot_take_the_wider_dtype_of_their_operands():
    """As numpy: float32 with float64 gives float64, whichever operand is the wider one."""
    xp = SymbolicNamespace(SymbolicRun(1, lambda: 0))
    f32, f64 = xp.zeros((2, 3), dtype="float32"), xp.zeros((2, 3))
    assert xp.where(f32 > 0, f32, f64).dtype == np.float64 == xp.where(f64 > 0, f64, f32).dtype
    assert np.tensordot(f32, xp.zeros((3, 2)), axes=1).dtype == np.float64
    assert np.tensordot(f64, xp.zeros((3, 2), dtype="float32"), axes=1).dtype == np.float64

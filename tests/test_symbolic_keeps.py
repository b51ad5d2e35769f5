"""What a symbolic array is made from passes on its run and its dtype: an array that lost its run counts no
matmul FLOPs (a rank's compute goes missing), one that lost its dtype counts float64's bytes. Each expected
dtype below is numpy's own answer on a real array of the same shape."""
import numpy as np
import pytest

from parasim.symbolic.array import SymArray, SymbolicRun
from parasim.symbolic.namespace import SymbolicNamespace, SymbolicRng


@pytest.fixture
def run():
    return SymbolicRun(2, lambda: 1)


def real(shape, dtype):
    return np.zeros(shape, dtype)


MADE_FROM_X = {  # name: (what it does to a symbolic x, the same on a numpy array)
    "stack": lambda x: np.stack([x, x], axis=1),
    "stack of one, an axis from the end": lambda x: np.stack([x], axis=-2),
    "expand_dims, an axis from the end": lambda x: np.expand_dims(x, -2),
    "expand_dims": lambda x: np.expand_dims(x, 1),
    "squeeze": lambda x: np.squeeze(np.expand_dims(x, 0)),
    "squeeze an axis": lambda x: np.squeeze(np.expand_dims(x, 2), axis=2),
    "broadcast_to": lambda x: np.broadcast_to(x, (4, 2, 3)),
    "astype": lambda x: x.astype(np.float16),
    "a row (iteration)": lambda x: next(iter(x)),
    "copy": lambda x: np.copy(x),
    "zeros_like": lambda x: np.zeros_like(x),
    "full_like": lambda x: np.full_like(x, 2, dtype=np.int8),
    "where": lambda x: np.where(x > 0, x, x),
    "take": lambda x: np.take(x, [0, 1], axis=1),
    "take flat": lambda x: np.take(x, [0, 1]),
    "concatenate flat": lambda x: np.concatenate([x, x], axis=None),
    "split": lambda x: np.split(x, 3, axis=1)[2],
    "reshape": lambda x: x.reshape(3, 2),
    "transpose": lambda x: x.T,
    "mT": lambda x: x.mT,
    "moveaxis": lambda x: np.moveaxis(x, 0, 1),
    "max": lambda x: x.max(axis=0),
    "mean": lambda x: x.mean(axis=1, keepdims=True),
    "tensordot": lambda x: np.tensordot(x, x, axes=([0], [0])),
}


@pytest.mark.parametrize("name", MADE_FROM_X)
def test_an_array_made_from_another_keeps_its_run_and_dtype(run, name):
    f = MADE_FROM_X[name]
    x = SymArray((2, 3), np.float32, run)
    got, want = f(x), f(real((2, 3), np.float32))
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert got.run is run


def test_a_matmul_on_what_was_made_counts_for_the_rank_whose_turn_it_is(run):
    x = SymArray((2, 3), np.float32, run)
    np.stack([x, x]) @ SymArray((3, 5), np.float32, run)  # (2, 2, 3) @ (3, 5): 2 * 20 outputs * 3 each
    assert run.flops == [0, 2 * 2 * 2 * 5 * 3]


def test_the_namespace_and_draws_make_arrays_of_their_run(run):
    xp, rng = SymbolicNamespace(run), SymbolicRng(run)
    made = {
        "full": (xp.full((2,), 1.5), ((2,), np.float64)),
        "full of ints": (xp.full(3, 1), ((3,), np.result_type(1))),
        "full with a dtype": (xp.full((2,), 1.5, dtype=np.float32), ((2,), np.float32)),
        "zeros": (xp.zeros(4, dtype=np.int8), ((4,), np.int8)),
        "arange": (xp.arange(2, 7), ((5,), np.int64)),
        "asarray of ints": (xp.asarray([[1, 2, 3]]), ((1, 3), np.asarray(1).dtype)),
        "asarray with a dtype": (xp.asarray([1, 2], dtype=np.int32), ((2,), np.int32)),
        "asarray of a numpy array": (xp.asarray(np.zeros(3, np.float16)), ((3,), np.float16)),
        "asarray of a numpy array, cast": (xp.asarray(np.zeros(3, np.float16), dtype=np.int8), ((3,), np.int8)),
        "asarray of arrays": (xp.asarray([SymArray((2,), np.float32, run)] * 3), ((3, 2), np.float32)),
        "asarray of arrays, cast": (xp.asarray([SymArray((2,), np.float32, run)] * 3, dtype=np.int8),
                                    ((3, 2), np.int8)),
        "asarray of an array, cast": (xp.asarray(SymArray((2,), np.float32, run), dtype=np.int8), ((2,), np.int8)),
        "astype": (xp.astype(SymArray((2,), np.float32, run), np.int16), ((2,), np.int16)),
        "zeros_like": (xp.zeros_like(SymArray((2,), np.float32, None)), ((2,), np.float32)),
        "normal": (rng.normal((2, 2)), ((2, 2), np.float64)),
        "normal of a dtype": (rng.normal((2, 2), np.float32), ((2, 2), np.float32)),
        "uniform": (rng.uniform((3,)), ((3,), np.float64)),
        "uniform of a dtype": (rng.uniform((3,), dtype=np.float32), ((3,), np.float32)),
        "integers": (rng.integers(0, 5, (4,)), ((4,), np.int64)),
        "integers of a dtype": (rng.integers(0, 5, (4,), dtype=np.int32), ((4,), np.int32)),
        "permutation": (rng.permutation(6), ((6,), np.int64)),
    }
    for name, (got, (shape, dtype)) in made.items():
        assert (got.shape, got.dtype, got.run) == (shape, np.dtype(dtype), run), name


def test_argsort_of_positions_is_numpys_order():
    xp = SymbolicNamespace(None)
    assert list(xp.argsort(np.asarray([3, 1, 2]))) == [1, 2, 0]
    assert list(xp.argsort(np.asarray([3, 1, 2]), descending=True)) == [0, 2, 1]
    assert xp.argsort(np.asarray([[3, 1, 2], [0, 4, 5]]), axis=0).tolist() == [[1, 0, 0], [0, 1, 1]]
    ties = np.asarray([1, 0] * 200)  # long enough for numpy's unstable sort to reorder ties
    assert xp.argsort(ties).tolist() == list(range(1, 400, 2)) + list(range(0, 400, 2))  # stable by default
    assert list(xp.argsort(np.asarray([1, 0, 1, 0]), stable=True)) == [1, 3, 0, 2]  # ties keep their order


def test_a_symbolic_ranks_literals_and_draws_are_of_its_run():
    import parasim

    def program(ctx):
        made = [ctx.asarray([[1, 2, 3]]), ctx.asarray([1, 2], dtype="float32"), ctx.rng.normal((2,), "float16"),
                ctx.shared_rng("w").uniform((3,), dtype="float32")]
        return [(x.shape, str(x.dtype), x.run is ctx.xp.run and x.run is not None) for x in made]
    got = parasim.run(program, 2, backend="symbolic").values
    assert got == [[((1, 3), "float64", True), ((2,), "float32", True), ((2,), "float16", True),
                    ((3,), "float32", True)]] * 2


def test_an_order_of_a_symbolic_array_is_refused_naming_what_was_asked():
    from parasim.symbolic.array import SymbolicValueError
    x = SymArray((3,), np.float32, None)
    for ask, name in ((lambda: np.argsort(x), "argsort()"), (lambda: np.nonzero(x), "nonzero()"),
                      (lambda: SymbolicNamespace(None).argsort(x), "argsort()")):
        with pytest.raises(SymbolicValueError, match=rf"^{name[:-2]}\(\) of a symbolic float32 array of shape \(3,\)"):
            ask()

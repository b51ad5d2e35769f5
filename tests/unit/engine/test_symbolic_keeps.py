"""What a symbolic array is made from passes on its run and its dtype: an array that lost its run counts no
matmul FLOPs (a rank's compute goes missing), one that lost its dtype counts float64's bytes. Each expected
dtype below is numpy's own answer on a real array of the same shape."""
import numpy as np
import pytest

from parasim.engine.symbolic.array import SymArray, SymbolicRun
from parasim.engine.symbolic.namespace import SymbolicNamespace, SymbolicRng


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
    # a literal that names no dtype is in the run's float: the post's BF16 at real size, float64 at FP64
    assert got == [[((1, 3), "bfloat16", True), ((2,), "float32", True), ((2,), "float16", True),
                    ((3,), "float32", True)]] * 2
    assert parasim.run(program, 1, backend="symbolic", precision="fp64").values[0][0][1] == "float64"


def test_an_order_of_a_symbolic_array_is_refused_naming_what_was_asked():
    from parasim.engine.symbolic.array import SymbolicValueError
    x = SymArray((3,), np.float32, None)
    for ask, name in ((lambda: np.argsort(x), "argsort()"), (lambda: np.nonzero(x), "nonzero()"),
                      (lambda: SymbolicNamespace(None).argsort(x), "argsort()")):
        with pytest.raises(SymbolicValueError, match=rf"^{name[:-2]}\(\) of a symbolic float32 array of shape \(3,\)"):
            ask()


NAMESPACE = {  # ctx.xp's makers on symbolic ranks: (on a symbolic x, numpy's answer on a real x)
    "zeros_like": (lambda xp, x: xp.zeros_like(x), lambda x: np.zeros_like(x)),
    "zeros_like, a dtype": (lambda xp, x: xp.zeros_like(x, dtype=xp.int8), lambda x: np.zeros_like(x, np.int8)),
    "ones_like": (lambda xp, x: xp.ones_like(x), lambda x: np.ones_like(x)),
    "full_like": (lambda xp, x: xp.full_like(x, 3), lambda x: np.full_like(x, 3)),
    "full_like, a dtype": (lambda xp, x: xp.full_like(x, 3, dtype=xp.float16),
                           lambda x: np.full_like(x, 3, dtype=np.float16)),
    "asarray": (lambda xp, x: xp.asarray(x), lambda x: np.asarray(x)),
    "asarray, a dtype": (lambda xp, x: xp.asarray(x, dtype=xp.float16), lambda x: np.asarray(x, np.float16)),
    "asarray of a list of arrays": (lambda xp, x: xp.asarray([x, x]), lambda x: np.asarray([x, x])),
    "asarray of a list of arrays, a dtype": (lambda xp, x: xp.asarray([x, x], dtype=xp.int32),
                                             lambda x: np.asarray([x, x], np.int32)),
}


@pytest.mark.parametrize("name", NAMESPACE)
def test_what_the_symbolic_namespace_makes_from_an_array_keeps_its_shape_dtype_and_run(run, name):
    on_symbolic, on_real = NAMESPACE[name]
    xp = SymbolicNamespace(run)
    got = on_symbolic(xp, SymArray((2, 3), np.float32, None))  # an array of no run: the namespace's run is given
    want = on_real(real((2, 3), np.float32))
    assert isinstance(got, SymArray)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)


@pytest.mark.parametrize("name", ["zeros_like", "full_like"])
def test_the_symbolic_namespace_gives_its_run_to_what_it_makes_like_an_array(run, name):
    xp = SymbolicNamespace(run)
    got = xp.zeros_like(SymArray((2, 3), np.float32, None)) if name == "zeros_like" else \
        xp.full_like(SymArray((2, 3), np.float32, None), 7)
    assert got.run is run


@pytest.mark.parametrize("name", ["zeros_like", "full_like"])
def test_the_symbolic_namespace_on_a_real_array_answers_as_numpy(name):
    xp, x = SymbolicNamespace(None), np.arange(6, dtype=np.float32).reshape(2, 3)
    got = xp.zeros_like(x, dtype=np.int8) if name == "zeros_like" else xp.full_like(x, 7, dtype=np.int8)
    want = np.zeros_like(x, dtype=np.int8) if name == "zeros_like" else np.full_like(x, 7, dtype=np.int8)
    assert type(got) is np.ndarray and (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("value", [[[], []], [[1, 2], [3, 4], [5, 6]], [(0.5,)], range(4), [[True]]])
def test_the_symbolic_namespace_reads_nested_python_values_as_numpy_does(run, value):
    got, want = SymbolicNamespace(run).asarray(value), np.asarray(value)
    assert isinstance(got, SymArray) and got.run is run
    assert (got.shape, got.dtype) == (want.shape, want.dtype)


@pytest.mark.parametrize("shape", [(4, -1), (-1, 0), (0, -1)])
def test_a_reshape_numpy_refuses_is_refused(run, shape):
    with pytest.raises(ValueError):
        np.zeros((2, 3)).reshape(shape)
    with pytest.raises(ValueError):
        SymArray((2, 3), np.float32, run).reshape(shape)


def test_a_symbolic_rank_may_send_index_lists_and_is_refused_anything_else_by_name(run):
    from parasim.errors import CollectiveError
    from parasim.engine.symbolic.backend import SymbolicComm, check_symbolic_array
    check_symbolic_array(np.arange(3), "all_gather")  # a real index list takes part as it is
    check_symbolic_array(SymArray((2,), np.float32, run), "all_gather")
    for x, words in (([1, 2], "list"), (np.array(["a"]), "dtype"), (SymArray((2,), np.str_, run), "dtype")):
        with pytest.raises(CollectiveError, match=f"all_gather.*{words}"):
            check_symbolic_array(x, "all_gather")
    with pytest.raises(CollectiveError, match="reduce_scatter.*list"):  # the comm names its own op
        SymbolicComm._check_array(None, [1], "reduce_scatter")


MIXED = {  # name: (operands as (shape, dtype), or a real value taken as it is; the function)
    # the narrower dtype second: a rule that reads one operand's dtype only gives float32 or float16, not both
    "where, the condition widest": ([((4, 2, 3), np.bool_), ((2, 3), np.float32), ((2, 3), np.float16)], lambda c, a, b: np.where(c, a, b)),
    "tensordot, an int pair of axes": ([((2, 3), np.float32), ((2, 3), np.float16)],
                                       lambda a, b: np.tensordot(a, b, axes=(0, 0))),
    "tensordot, lists of axes": ([((2, 3), np.float32), ((2, 3), np.float16)],
                                 lambda a, b: np.tensordot(a, b.T, axes=([1], [0]))),
    "tensordot, a count of axes": ([((2, 3), np.float32), ((2, 3), np.float16)],
                                   lambda a, b: np.tensordot(a, b.T, axes=1)),
    "concatenate rows": ([((2, 3), np.float32), ((2, 3), np.float16)], lambda a, b: np.concatenate([a, b], axis=0)),
    "reshape to an int": ([((2, 3), np.float32)], lambda a: a.reshape(6)),
    "reshape with a -1": ([((2, 3), np.float16)], lambda a: a.reshape(-1, 2)),
    "zeros_like with a shape": ([((2, 3), np.float32)], lambda a: np.zeros_like(a, shape=(5,))),
    "where, three shapes broadcast": ([((4, 1, 1), np.bool_), ((2, 1), np.float32), ((3,), np.float16)],
                                      lambda c, a, b: np.where(c, a, b)),
    "where, a real condition": ([np.ones((2, 3), bool), ((2, 3), np.float32), ((2, 3), np.float16)],
                                lambda c, a, b: np.where(c, a, b)),
    "tensordot, an unequal pair of axes": ([((2, 3), np.float32), ((3, 4), np.float16)],
                                           lambda a, b: np.tensordot(a, b, axes=(1, 0))),
    "tensordot, numpy's default of two axes": ([((2, 3, 4), np.float32), ((3, 4, 5), np.float32)], np.tensordot),
    "a ufunc with a dtype": ([((2, 3), np.float16), ((2, 3), np.float16)],
                             lambda a, b: np.add(a, b, dtype=np.float32)),  # not float64: np.dtype(None) is that
    "a ufunc with a Python bool": ([((2, 3), np.int8)], lambda a: np.add(a, True)),
    "a ufunc with a list": ([((2,), np.int8)], lambda a: np.add(a, [1, 2])),
    "a ufunc with a real array": ([((2, 3), np.float32), np.zeros((4, 1, 3), np.float16)], np.add),
    "sum of bools": ([((2, 3), np.bool_)], lambda a: np.sum(a, axis=0)),
    "sum of uint8": ([((2, 3), np.uint8)], lambda a: np.sum(a, axis=1)),
    "sum of int8": ([((2, 3), np.int8)], lambda a: np.sum(a)),
    "reshape to an int (numpy's function)": ([((2, 3), np.float32)], lambda a: np.reshape(a, 6)),
    "a slice": ([((4, 3), np.float32)], lambda a: a[1:3]),
    "a slice of the last dim": ([((4, 3), np.float32)], lambda a: a[:, 1:]),
}


@pytest.mark.parametrize("name", MIXED)
def test_operands_of_mixed_shapes_and_dtypes_give_numpys_shape_and_dtype(run, name):
    operands, f = MIXED[name]
    got = f(*(SymArray(*o, run) if isinstance(o, tuple) else o for o in operands))
    want = f(*(real(*o) if isinstance(o, tuple) else o for o in operands))
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert got.run is run


def test_a_ufunc_asked_for_a_dtype_after_the_same_call_without_one_gives_that_dtype(run):
    a = SymArray((2, 3), np.float16, run)  # the memo of a run must tell the two calls apart
    assert np.add(a, a).dtype == np.float16
    assert np.add(a, a, dtype=np.float64).dtype == np.float64


def test_a_reshape_with_two_unknown_dims_is_refused_even_where_they_would_fit(run):
    with pytest.raises(ValueError):
        np.zeros(1).reshape(-1, -1)
    with pytest.raises(ValueError):
        SymArray((1,), np.float32, run).reshape(-1, -1)

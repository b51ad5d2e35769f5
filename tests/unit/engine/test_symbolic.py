"""Symbolic ranks: arrays with shapes and dtypes only. Every shape rule is held against numpy on real arrays
(the oracle), and the same programs run virtually and symbolically give the same events, bytes, shapes
and held memory."""
import re

import numpy as np
import pytest
from conftest import trace_key
from hypothesis import given, strategies as st

import parasim
from parasim.lesson import get_lesson
from parasim.engine.symbolic import SymArray, SymbolicValueError
from parasim.engine.symbolic.namespace import SymbolicNamespace

XP = SymbolicNamespace()


def _sym(a: np.ndarray) -> SymArray:
    return SymArray(a.shape, a.dtype)


def _same(got, want) -> None:
    assert isinstance(got, SymArray), type(got)
    want = np.asarray(want)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)


A = np.arange(24.0).reshape(2, 3, 4)
I32 = np.arange(6, dtype=np.int32).reshape(2, 3)
F32 = np.ones((3, 4), dtype=np.float32)


@pytest.mark.parametrize("index", [
    0, -1, slice(None), slice(1, None), slice(None, None, 2), (0, 1), (..., 1), (..., slice(0, 2)), (None, 0),
    (slice(None), None, 1), ([0, 1],), (slice(None), [2, 0, 1]), (0, [1, 2]), ([0, 1], slice(None), [1, 3]),
    (slice(None), [0, 1], [1, 3]), (np.array([True, False]),), (..., None), (slice(None), np.array([[0], [2]])),
    (0, ..., 1), (0, np.array([True, False, True])), ([-2],), ([-2, 1], ..., [0, -4]),
    (slice(0, 1), slice(1, 3)), (slice(None), slice(None, None, 2), slice(1, 4)),
], ids=[f"i{k}" for k in range(24)])  # short ids: mutation testing maps tests by id
def test_indexing_gives_numpys_shapes(index):
    _same(_sym(A)[index], A[index])


def test_out_of_range_indices_fail_as_numpys_do():
    slices = (slice(None),) * 4  # slices alone, one more than the dims (the quick rule's case)
    for bad in (2, (0, 3), (0, 0, 4), ([0, 2],), (0, 0, 0, 0), (..., ...), slices):
        with pytest.raises(IndexError):
            A[bad]
        with pytest.raises(IndexError):
            _sym(A)[bad]


@pytest.mark.parametrize("name, args", [
    ("add", (A, 1.0)), ("multiply", (F32, 2.0)), ("multiply", (F32, A[0].astype(np.float64))),
    ("greater_equal", (A, 0.5)), ("add", (I32, 1)), ("true_divide", (I32, 2)), ("exp", (F32,)),
    ("maximum", (A, A[0])), ("matmul", (A, A[0].T)), ("matmul", (F32, np.ones(4, np.float32))),
    ("matmul", (np.ones(3), F32)), ("tanh", (A,)), ("subtract", (3.0, F32)),
], ids=[f"u{k}" for k in range(13)])
def test_ufuncs_broadcast_and_promote_as_numpy(name, args):
    ufunc = getattr(np, name)
    sym = [_sym(a) if isinstance(a, np.ndarray) else a for a in args]
    _same(ufunc(*sym), ufunc(*args))


def test_operators_and_reductions():
    s = _sym(A)
    for got, want in ((s + 1, A + 1), (2 * s, 2 * A), (s - s, A - A), (s / 2, A / 2), (-s, -A), (s ** 2, A ** 2),
                      (s @ _sym(A[0].T), A @ A[0].T), (s > 0, A > 0), (s.T, A.T), (s.sum(), A.sum()),
                      (s.sum(axis=1), A.sum(axis=1)), (s.mean(axis=(0, 2), keepdims=True), A.mean(axis=(0, 2),
                                                                                                   keepdims=True)),
                      (s.max(axis=-1), A.max(axis=-1)), (np.sum(s, axis=0), np.sum(A, axis=0)),
                      (np.sum(_sym(I32)), np.sum(I32)), (np.mean(_sym(I32), axis=1), np.mean(I32, axis=1)),
                      (np.all(s > 0), np.all(A > 0)), (np.add.reduce(s, axis=2), np.add.reduce(A, axis=2))):
        _same(got, want)


def test_array_functions_give_numpys_shapes():
    s = _sym(A)
    cases = [
        (np.concatenate([s, s], axis=1), np.concatenate([A, A], axis=1)),
        (np.concatenate([s, _sym(A.astype(np.float32))], axis=-1), np.concatenate([A, A.astype(np.float32)], axis=-1)),
        (np.stack([s, s], axis=1), np.stack([A, A], axis=1)),
        (np.reshape(s, (6, -1)), np.reshape(A, (6, -1))), (s.reshape(4, 6), A.reshape(4, 6)),
        (np.transpose(s, (2, 0, 1)), np.transpose(A, (2, 0, 1))), (np.moveaxis(s, 0, -1), np.moveaxis(A, 0, -1)),
        (np.take(s, np.array([0, 2, 2]), axis=1), np.take(A, np.array([0, 2, 2]), axis=1)),
        (np.tensordot(s, _sym(A), axes=([0, 1], [0, 1])), np.tensordot(A, A, axes=([0, 1], [0, 1]))),
        (np.tensordot(s, _sym(A[0].T), axes=1), np.tensordot(A, A[0].T, axes=1)),
        (np.zeros_like(s), np.zeros_like(A)), (np.empty_like(s, dtype=np.float32), np.empty_like(A, dtype=np.float32)),
        (np.full_like(s, 2), np.full_like(A, 2)), (np.expand_dims(s, 1), np.expand_dims(A, 1)),
        (np.squeeze(_sym(A[:, :1])), np.squeeze(A[:, :1])), (np.broadcast_to(_sym(A[0]), (5, 3, 4)),
                                                            np.broadcast_to(A[0], (5, 3, 4))),
    ]
    for got, want in cases:
        _same(got, want)
    for got, want in zip(np.split(s, 2, axis=2), np.split(A, 2, axis=2)):
        _same(got, want)
    for got, want in zip(np.split(s, [1, 3], axis=1), np.split(A, [1, 3], axis=1)):
        _same(got, want)
    with pytest.raises(ValueError):
        np.split(s, 3, axis=2)
    with pytest.raises(ValueError):
        np.reshape(s, (5, -1))
    with pytest.raises(ValueError):
        np.concatenate([s, _sym(A[:, :2])], axis=2)
    with pytest.raises(ValueError):
        s @ s


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_random_slices_match_numpy(shape, data):
    a = np.zeros(shape)
    index = tuple(data.draw(st.one_of(st.slices(n), st.integers(-n, n - 1))) for n in shape)
    _same(_sym(a)[index], a[index])


def test_a_symbolic_array_has_no_values():
    s = SymArray((2, 3), "float32")
    assert (s.nbytes, s.size, s.ndim, s.itemsize) == (24, 6, 2, 4)
    assert np.isnan(float(SymArray((), "float64")))  # a loss: NaN, and the program goes on
    assert np.isnan(np.asarray(s.tolist())).all() and np.asarray(s.tolist()).shape == (2, 3)
    for ask in (lambda: bool(s), lambda: int(SymArray((), "int64")), lambda: float(s), lambda: np.asarray(s),
                lambda: [0, 1, 2][SymArray((), "int64")], lambda: SymArray((10 ** 6,)).tolist()):
        with pytest.raises(SymbolicValueError, match="a symbolic run has shapes and bytes, no values"):
            ask()


def test_the_namespace_makes_symbolic_arrays_of_everything():
    assert isinstance(XP.zeros((3, 4)), SymArray) and XP.full((2,), 1.0, dtype="float32").dtype == np.float32
    idx = XP.asarray([0, 2])
    assert isinstance(idx, SymArray) and (idx.shape, idx.dtype) == ((2,), np.int64)
    assert (XP.arange(2, 10, 3).shape, XP.asarray([[1.0], [0.0]], dtype="float32").dtype) == ((3,), np.float32)
    mask = XP.arange(100_000)[None, :] > XP.arange(100_000)[:, None]  # a causal mask at real size: shapes only
    assert (mask.shape, mask.dtype) == ((100_000, 100_000), np.bool_)
    s = SymArray((4, 3))
    _same(XP.take(s, idx, axis=0), np.take(np.zeros((4, 3)), [0, 2], axis=0))
    _same(XP.concat([s, s], axis=1), np.zeros((4, 6)))
    _same(XP.permute_dims(s, (1, 0)), np.zeros((3, 4)))
    _same(XP.where(s > 0, s, 0.0), np.zeros((4, 3)))
    _same(XP.astype(s, XP.float32), np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("name", ["collectives", "cp-causal", "ring-attention", "sp", "zero", "pp-1f1b",
                                  "pp-zero-bubble", "pp-vs-zero3", "longest-sequence", "silent-bugs"])
def test_the_same_program_virtually_and_symbolically(name):
    lesson = get_lesson(name)
    # at FP64 a symbolic run computes in the virtual run's float64: the same trace, byte for byte
    real = parasim.run(lesson.program, lesson.world, precision="fp64")
    sym = parasim.run(lesson.program, lesson.world, backend="symbolic", precision="fp64")
    assert sym.trace.backend == "symbolic" and real.trace.events
    assert trace_key(sym.trace) == trace_key(real.trace)
    held = [any(m.kind == "held" for m in real.trace.marks)]
    if held[0]:
        assert [sym.trace.peak(r) for r in range(lesson.world)] == [real.trace.peak(r) for r in range(lesson.world)]


def test_symbolic_ranks_check_calls_as_virtual_ones_do():
    def mismatched(ctx):
        ctx.comm.all_reduce(ctx.xp.zeros((2 + ctx.rank,)), label="sizes differ")
    with pytest.raises(parasim.CollectiveMismatch, match="sizes differ|shape"):
        parasim.run(mismatched, 2, backend="symbolic")

    def strings(ctx):
        ctx.comm.all_reduce(SymArray((2,), "U3"))
    with pytest.raises(parasim.CollectiveError, match="expects numbers"):
        parasim.run(strings, 2, backend="symbolic")


def test_a_symbolic_world_can_be_large():
    def program(ctx):
        big = ctx.shared_rng("w").normal((7168, 18432), dtype="float16")
        return ctx.comm.all_reduce(big, label="a gradient the size of a real one").nbytes
    result = parasim.run(program, 64, backend="symbolic")
    assert set(result.values) == {7168 * 18432 * 2}
    (e,) = result.trace.events
    # a ring all-reduce's count from the shape alone: each member sends 2 (t - 1) / t of the buffer
    assert e.members[0].sent == 2 * 63 * (7168 * 18432 * 2) // 64


def test_methods_and_reductions_keep_numpys_dims_and_dtypes():
    a, i = np.zeros((2, 3, 4)), np.zeros((2, 3), dtype=np.int32)
    s, si = _sym(a), _sym(i)
    pairs = [(s.sum(axis=1, keepdims=True), a.sum(axis=1, keepdims=True)),
             (s.sum(axis=0, dtype=np.float32), a.sum(axis=0, dtype=np.float32)),
             (si.sum(axis=1), i.sum(axis=1)), (si.mean(), i.mean()), (si.mean(axis=0, keepdims=True),
                                                                      i.mean(axis=0, keepdims=True)),
             (_sym(a.astype(np.float32)).mean(axis=2), a.astype(np.float32).mean(axis=2)),
             (s.mean(dtype=np.float32), a.mean(dtype=np.float32)),
             (s.max(axis=2, keepdims=True), a.max(axis=2, keepdims=True)), (si.min(axis=0), i.min(axis=0)),
             (np.all(s > 0, axis=1), np.all(a > 0, axis=1)), (np.any(s > 0, axis=0, keepdims=True),
                                                             np.any(a > 0, axis=0, keepdims=True)),
             (s.reshape(24), a.reshape(24)), (s.reshape((4, 6)), a.reshape((4, 6))), (s.transpose(1, 0, 2),
                                                                                      a.transpose(1, 0, 2)),
             (s.transpose(), a.transpose()), (s.mT, np.swapaxes(a, -1, -2)), (s.astype(np.int8), a.astype(np.int8)),
             (np.stack([s, s]), np.stack([a, a])), (np.stack([s, s], axis=-1), np.stack([a, a], axis=-1)),
             (np.squeeze(_sym(np.zeros((1, 3, 1))), axis=0), np.squeeze(np.zeros((1, 3, 1)), axis=0)),
             (np.squeeze(_sym(np.zeros((1, 3, 1))), axis=(0, 2)), np.squeeze(np.zeros((1, 3, 1)), axis=(0, 2))),
             (np.expand_dims(s, -1), np.expand_dims(a, -1)), (np.expand_dims(s, 0), np.expand_dims(a, 0)),
             (np.full_like(s, 1, dtype=np.int16), np.full_like(a, 1, dtype=np.int16)),
             (np.broadcast_to(_sym(np.zeros(4)), (3, 4)), np.broadcast_to(np.zeros(4), (3, 4)))]
    for got, want in pairs:
        _same(got, want)
    assert len(s) == 2 and np.shape(s) == (2, 3, 4) and np.ndim(s) == 3 and np.size(s) == 24 and np.size(s, 1) == 3
    with pytest.raises(ValueError):
        np.stack([s, _sym(a[:1])])
    with pytest.raises(ValueError):
        np.broadcast_to(s, (3, 4))
    with pytest.raises(TypeError):
        len(SymArray((), "float64"))


def test_each_question_about_values_says_what_was_asked():
    s, one = SymArray((2,), "int64"), SymArray((), "int64")
    for ask, what in ((lambda: int(one), "int()"), (lambda: bool(one), "the truth value"),
                      (lambda: [1, 2][one], "an index taken from the value"), (lambda: np.asarray(s),
                                                                               "conversion to a numpy array"),
                      (lambda: float(s), "float()"), (lambda: one.item(), "item()")):
        with pytest.raises(SymbolicValueError, match=f"^{re.escape(what)} of a symbolic int64 array of shape"):
            ask()
    from parasim.engine.symbolic.array import SHOWN
    assert len(SymArray((SHOWN,)).tolist()) == SHOWN  # as large as a note may show
    with pytest.raises(SymbolicValueError, match=r"^tolist\(\)"):
        SymArray((SHOWN + 1,)).tolist()


def test_the_namespace_answers_as_the_virtual_ranks_namespace_does():
    """Each function of the symbolic ctx.xp against array_api_compat's numpy (what virtual ranks use), called
    the same way on an array of the same shape: the shapes and dtypes must be the same."""
    import array_api_compat.numpy as vx
    calls = [lambda xp, a: xp.zeros(5), lambda xp, a: xp.zeros((2, 3), dtype=xp.float32),
             lambda xp, a: xp.full((2,), 1.5), lambda xp, a: xp.full(4, 7, dtype=xp.int32), lambda xp, a: xp.arange(7),
             lambda xp, a: xp.arange(2, 9, 3, dtype=xp.float32), lambda xp, a: xp.zeros_like(a, dtype=xp.int8),
             lambda xp, a: xp.zeros_like(a), lambda xp, a: xp.full_like(a, 2.0, dtype=xp.float32),
             lambda xp, a: xp.astype(a, xp.float16), lambda xp, a: xp.stack([a, a]),
             lambda xp, a: xp.stack([a, a], axis=2), lambda xp, a: xp.concat([a, a]),
             lambda xp, a: xp.concat([a, a], axis=1), lambda xp, a: xp.permute_dims(a, (1, 0)),
             lambda xp, a: xp.reshape(a, (2, 6)), lambda xp, a: xp.sum(a, axis=0), lambda xp, a: xp.mean(a, axis=1),
             lambda xp, a: xp.max(a), lambda xp, a: xp.take(a, xp.asarray([0, 2]), axis=0),
             lambda xp, a: xp.where(a > 0, a, 0.0), lambda xp, a: xp.tensordot(a, xp.permute_dims(a, (1, 0)), axes=1),
             lambda xp, a: xp.exp(a) * xp.sqrt(a) + xp.tanh(a), lambda xp, a: xp.asarray([[1.0], [0.0]])]
    for k, call in enumerate(calls):
        want, got = np.asarray(call(vx, np.zeros((3, 4)))), call(XP, SymArray((3, 4)))
        assert (got.shape, got.dtype) == (want.shape, want.dtype), k

    def draws(ctx):
        return [ctx.rng.uniform((2, 3)), ctx.rng.integers(0, 5, (4,)), ctx.rng.normal((1,), "float32"),
                ctx.rng.permutation(6), ctx.shared_rng("w").uniform((2,), dtype="float32")]
    # at FP64 a symbolic run's float is the virtual run's float64; at the post's precision, BF16
    real, sym = parasim.run(draws, 1).values[0], parasim.run(draws, 1, backend="symbolic", precision="fp64").values[0]
    assert [(a.shape, a.dtype) for a in sym] == [(a.shape, a.dtype) for a in real]
    post = parasim.run(draws, 1, backend="symbolic").values[0]
    assert [str(a.dtype) for a in post] == ["bfloat16", "int64", "float32", "int64", "float32"]

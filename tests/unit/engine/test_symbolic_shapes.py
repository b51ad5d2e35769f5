"""symbolic.shapes' rules called directly, against numpy: matmul_shape (a 1-D operand on either side, batch
dims on one side only or on both, broadcast), axis_of and the quick rule of slices. Index shapes are held
against numpy through SymArray in tests/unit/engine/test_symbolic.py."""
import numpy as np
import pytest
from numpy.lib.array_utils import normalize_axis_index

from parasim.engine.symbolic.shapes import axis_of, matmul_shape, sliced_shape

PAIRS = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((5, 3), (3, 4)), ((3,), (6, 3, 4)),
         ((6, 2, 3), (3,)), ((2, 3), (6, 3, 4)), ((6, 2, 3), (3, 4)), ((7, 1, 2, 3), (6, 3, 4)),
         ((1, 6, 2, 3), (7, 1, 3, 4)), ((2, 5, 2, 3), (3,))]


@pytest.mark.parametrize("a, b", PAIRS)
def test_matmul_shape_is_numpys(a, b):
    assert matmul_shape(a, b) == np.matmul(np.zeros(a), np.zeros(b)).shape


@pytest.mark.parametrize("a, b", [((), (3,)), ((3,), ()), ((2, 3), (4, 5)), ((3,), (4,)), ((2, 2, 3), (3, 3, 4))])
def test_matmul_shape_refuses_what_numpy_refuses(a, b):
    with pytest.raises(ValueError):
        np.matmul(np.zeros(a), np.zeros(b))
    with pytest.raises(ValueError):
        matmul_shape(a, b)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_axis_of_is_numpys_normalized_axis(ndim):
    for axis in range(-ndim - 1, ndim + 1):
        if -ndim <= axis < ndim:
            assert axis_of(axis, ndim) == normalize_axis_index(axis, ndim)
        else:
            with pytest.raises(np.exceptions.AxisError):
                axis_of(axis, ndim)


def test_axis_of_a_0d_array_is_0_only():
    # our own rule, wider than numpy's: a 0-d operand (a scalar stacked or concatenated) takes axis 0
    assert axis_of(0, 0) == 0
    with pytest.raises(np.exceptions.AxisError):
        axis_of(1, 0)


@pytest.mark.parametrize("index", [(slice(1, 3), slice(None)), (slice(None, None, 2),), slice(1, None),
                                   (slice(0, 1), slice(2, 5), slice(None))])
def test_sliced_shape_works_out_slices_alone_itself(index):
    # sliced_shape is the quick rule: it must answer for slices alone, not leave them (None) to the general
    # rule, which gives the same shape slower, so indexing through SymArray cannot tell the two apart
    x = np.zeros((4, 5, 6))
    assert sliced_shape(x.shape, index) == x[index].shape


# -- dtypes: numpy's own rule on numpy's types, the kernels' rule where a 16- or 8-bit float takes part --------
def _sym(dtype):
    from parasim.engine.symbolic.array import SymArray
    return SymArray((3,), dtype)


@pytest.mark.parametrize("ufunc", [np.add, np.multiply, np.less, np.maximum])
@pytest.mark.parametrize("a, b", [("int32", "float32"), ("int64", "float64"), ("uint8", "int8"), ("bool", "int16"),
                                  ("float32", "float64")])
def test_a_ufunc_on_numpys_types_has_numpys_dtype(ufunc, a, b):
    want = ufunc(np.zeros(3, a), np.zeros(3, b)).dtype
    assert ufunc(_sym(a), _sym(b)).dtype == want


def test_a_narrow_float_keeps_the_widest_floating_array_operands_dtype():
    import ml_dtypes
    bf16, fp8, f16 = np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.float16)
    assert (_sym(bf16) * 0.5).dtype == bf16  # scaling a BF16 tensor keeps BF16 (numpy would too, weakly)
    assert np.add(_sym(bf16), _sym("float32")).dtype == np.float32  # the wider float operand
    assert np.add(_sym(fp8), _sym(bf16)).dtype == bf16  # numpy finds no common type: the wider one
    assert np.add(_sym("int32"), _sym(bf16)).dtype == bf16  # an integer operand is no float to widen to
    assert np.add(_sym(f16), _sym(bf16)).dtype == f16 and np.add(_sym(bf16), _sym(f16)).dtype == bf16  # first
    assert np.less(_sym(bf16), _sym(bf16)).dtype == np.bool_  # a comparison is still a truth value
    assert np.add(_sym(bf16), _sym(bf16)).dtype == bf16 and np.add(_sym(fp8), _sym(fp8)).dtype == fp8


@pytest.mark.parametrize("dtype", ["bool", "uint8", "uint32", "int8", "int32", "float16", "float32"])
def test_a_sum_has_numpys_accumulating_dtype(dtype):
    from parasim.engine.symbolic.array import reduction
    assert reduction(_sym(dtype)).dtype == np.sum(np.zeros(3, dtype)).dtype

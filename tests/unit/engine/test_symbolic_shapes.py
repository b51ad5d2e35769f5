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

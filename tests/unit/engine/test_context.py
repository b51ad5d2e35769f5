"""The rank context: seeded draws that agree across backends, literal data, the array namespace."""
import numpy as np
import pytest

import parasim
from parasim.engine.context import Rng


def test_per_rank_streams_differ_and_are_reproducible():
    res = parasim.run(lambda ctx: ctx.rng.normal((5,)), world=3, seed=1)
    again = parasim.run(lambda ctx: ctx.rng.normal((5,)), world=3, seed=1)
    assert not np.array_equal(res.values[0], res.values[1])
    assert all(np.array_equal(a, b) for a, b in zip(res.values, again.values))


def test_a_streams_draws_follow_on_from_each_other():
    """A rank's stream is one generator (made at its first draw): two draws of 3 are one draw of 6, cut in two,
    as numpy's PCG64 seeded by (seed, key) draws them."""
    rng = Rng(7, (0, 3), lambda a: a)
    got = np.concatenate([rng.normal((3,)), rng.normal((3,))])
    want = np.random.Generator(np.random.PCG64(np.random.SeedSequence(7, spawn_key=(0, 3)))).normal(0.0, 1.0, 6)
    assert got.tolist() == want.tolist()


def test_integer_draws_in_any_dtype():
    res = parasim.run(lambda ctx: ctx.rng.integers(0, 10, (4,), dtype="float32"), world=1)
    (x,) = res.values
    assert x.dtype == np.float32 and np.all(x == np.round(x)) and x.min() >= 0 and x.max() < 10


def test_xp_is_an_array_api_namespace():
    def prog(ctx):
        xp = ctx.xp
        a = xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3))
        return xp.matmul(a, xp.permute_dims(a, (1, 0)))

    (y,) = parasim.run(prog, world=1).values
    assert y.tolist() == [[5.0, 14.0], [14.0, 50.0]]


def test_draws_are_identical_when_moved_to_torch():
    torch = pytest.importorskip("torch")
    np_draw = Rng(3, (0, 1), lambda a: a).normal((4, 2), dtype="float32")
    torch_draw = Rng(3, (0, 1), torch.from_numpy).normal((4, 2), dtype=torch.float32)
    assert torch_draw.dtype == torch.float32
    assert np.array_equal(np_draw, torch_draw.numpy())

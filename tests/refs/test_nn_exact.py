"""ParallelMLP on virtual ranks against torch autograd on the unsplit MLP, in float64.

For random tensor-parallel sizes (with and without sequence parallelism), shapes, activations and biases:
the gathered output, input gradient and weight gradients match torch to 1e-10; the trace holds exactly the
collectives Megatron-LM's MLP block needs; and Saved counts what forward keeps for backward.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import parasim  # noqa: E402
from parasim.nn import ParallelMLP, Saved, ParallelContext  # noqa: E402
from torch_ref import mlp as torch_mlp, vjp  # noqa: E402

ATOL = 1e-10
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    sp = draw(st.booleans())
    if sp:  # the sequence splits evenly over the tp ranks
        seq = tp * draw(st.integers(1, 4))
    else:
        seq = draw(st.integers(1, 9))
    return dict(tp=tp, sp=sp, seq=seq, batch=draw(st.integers(1, 3)), hidden=draw(st.integers(1, 12)),
                ffn=tp * draw(st.integers(1, 4)), act=draw(st.sampled_from(["relu", "gelu"])),
                bias=draw(st.booleans()))


def full_tensors(ctx, c):
    """The unsplit weights, input and upstream gradient, drawn the same on every rank (and in the test)."""
    s, b, h, f = c["seq"], c["batch"], c["hidden"], c["ffn"]
    rng = ctx.shared_rng
    return dict(
        w1=rng("w1").normal((h, f), std=h ** -0.5),  # scaled so every value is of order 1
        b1=rng("b1").normal((f,)) if c["bias"] else None,
        w2=rng("w2").normal((f, h), std=f ** -0.5),
        b2=rng("b2").normal((h,)) if c["bias"] else None,
        x=rng("x").normal((s, b, h)),
        dy=rng("dy").normal((s, b, h)))


def program(c):
    def prog(ctx):
        tp = ParallelContext(ctx, ctx.new_group(range(ctx.world), "tp"), sp=c["sp"])
        full = full_tensors(ctx, c)
        mlp = ParallelMLP(tp, full["w1"], full["w2"], b1=full["b1"], b2=full["b2"], act=c["act"])
        x, dy = full["x"], full["dy"]
        if tp.sp:  # each rank holds its slice of the sequence
            x, dy = tp.shard(x, 0), tp.shard(dy, 0)
        saved = Saved()
        ctx.phase("forward")
        y, cache = mlp.forward(x, saved)
        ctx.phase("backward")
        dx = mlp.backward(cache, dy)
        return dict(y=y, dx=dx, grads=dict(mlp.grads), saved=saved.bytes(), full=full)
    return prog


def run(c):
    return parasim.run(program(c), world=c["tp"])


def gather_seq_or_replicated(values, key, sp):
    """The whole tensor from every rank's part: sequence shards under SP, identical copies otherwise."""
    parts = [v[key] for v in values]
    if sp:
        return np.concatenate(parts, axis=0)
    for p in parts[1:]:
        assert np.array_equal(p, parts[0]), f"{key} differs between ranks"
    return parts[0]


def full_grads(values, bias):
    g = [v["grads"] for v in values]
    keys = {"fc1.weight", "fc2.weight"} | ({"fc1.bias", "fc2.bias"} if bias else set())
    for gi in g:
        assert set(gi) == keys
    out = dict(w1=np.concatenate([gi["fc1.weight"] for gi in g], axis=1),
               w2=np.concatenate([gi["fc2.weight"] for gi in g], axis=0))
    if bias:
        out["b1"] = np.concatenate([gi["fc1.bias"] for gi in g], axis=0)
        for gi in g[1:]:
            assert np.array_equal(gi["fc2.bias"], g[0]["fc2.bias"]), "fc2.bias grad differs between ranks"
        out["b2"] = g[0]["fc2.bias"]
    return out


def events(res, phase):
    return [e for e in res.trace.events if e.phase == phase]


def bytes_by_rank(evs, world):
    out = [(0, 0)] * world
    for e in evs:
        for m in e.members:
            s, r = out[m.rank]
            out[m.rank] = (s + m.sent, r + m.recv)
    return out


# -- the numbers ------------------------------------------------------------------------------------------
@settings(max_examples=800, **SETTINGS)
@given(cases())
def test_mlp_matches_torch(c):
    res = run(c)
    values = res.values
    assert len(values) == c["tp"]
    full = values[0]["full"]
    s, b, h, f = c["seq"], c["batch"], c["hidden"], c["ffn"]

    y = gather_seq_or_replicated(values, "y", c["sp"])
    dx = gather_seq_or_replicated(values, "dx", c["sp"])
    grads = full_grads(values, c["bias"])
    assert y.shape == dx.shape == (s, b, h)
    assert grads["w1"].shape == (h, f) and grads["w2"].shape == (f, h)

    y_ref, (gx, gw1, gb1, gw2, gb2, _) = vjp(
        torch_mlp, [full["x"], full["w1"], full["b1"], full["w2"], full["b2"], c["act"]], full["dy"])
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(dx, gx, rtol=0, atol=ATOL)
    np.testing.assert_allclose(grads["w1"], gw1, rtol=0, atol=ATOL)
    np.testing.assert_allclose(grads["w2"], gw2, rtol=0, atol=ATOL)
    if c["bias"]:
        np.testing.assert_allclose(grads["b1"], gb1, rtol=0, atol=ATOL)
        np.testing.assert_allclose(grads["b2"], gb2, rtol=0, atol=ATOL)


# -- the trace --------------------------------------------------------------------------------------------
def ops(evs):
    return [e.op for e in evs]


@settings(max_examples=300, **SETTINGS)
@given(cases())
def test_mlp_collectives(c):
    t = c["tp"]
    res = run(c)
    evs = res.trace.events
    assert all(e.phase in ("forward", "backward") for e in evs)
    for e in evs:
        assert e.kind == "collective" and e.group.name == "tp" and sorted(e.ranks) == list(range(t))
    fwd, bwd = events(res, "forward"), events(res, "backward")
    if t == 1:
        assert evs == []
        return
    if not c["sp"]:
        # Megatron's g after the row-parallel layer and f before the column-parallel one: one all-reduce each
        assert [(e.op, e.label) for e in fwd] == [("all_reduce", "g forward")]
        assert [(e.op, e.label) for e in bwd] == [("all_reduce", "f backward")]
        return
    # SP: the all-reduce splits into an all-gather before fc1 and a reduce-scatter after fc2 ...
    assert ops(fwd) == ["all_gather", "reduce_scatter"]
    # ... and backward mirrors it: all-gather dy before fc2's backward, reduce-scatter dx after fc1's. fc1
    # also gathers its input again for the weight grad (SP keeps only the shard), and fc2's replicated bias
    # saw only this rank's tokens, so its grad is summed over the group.
    mirror = [e for e in bwd if "again" not in e.label and "bias" not in e.label]
    assert ops(mirror) == ["all_gather", "reduce_scatter"]
    assert [e.label for e in mirror] == ["mlp.fc2 backward: all-gather the sequence",
                                         "mlp.fc1 backward: reduce-scatter"]
    regather = [e for e in bwd if "again" in e.label]
    assert ops(regather) == ["all_gather"]
    bias_ar = [e for e in bwd if "bias" in e.label]
    assert ops(bias_ar) == (["all_reduce"] if c["bias"] else [])
    for e in fwd + mirror:
        assert e.params["dim"] == 0  # the sequence dim

    # Same wire cost as the all-reduce it replaces, per rank (sent and received), in each direction.
    plain = run({**c, "sp": False})
    assert bytes_by_rank(fwd, t) == bytes_by_rank(events(plain, "forward"), t)
    assert bytes_by_rank(mirror, t) == bytes_by_rank(events(plain, "backward"), t)
    # the re-gather costs what the forward all-gather did
    assert bytes_by_rank(regather, t) == bytes_by_rank(fwd[:1], t)


# -- what forward keeps -----------------------------------------------------------------------------------
@settings(max_examples=200, **SETTINGS)
@given(cases())
def test_mlp_saved_bytes(c):
    t, s, b, h, f = c["tp"], c["seq"], c["batch"], c["hidden"], c["ffn"]
    fc1_input = s * b * h // t if c["sp"] else s * b * h
    expected = 2 * (fc1_input + s * b * f // t + s * b * f // t)
    assert [v["saved"] for v in run(c).values] == [expected] * t


# -- sizes that do not split ------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["ffn", "seq"])
def test_uneven_split_is_refused(what):
    def prog(ctx):
        tp = ParallelContext(ctx, ctx.new_group(range(ctx.world), "tp"), sp=what == "seq")
        f = 6 if what == "ffn" else 4  # 6 columns over 4 ranks
        s = 6 if what == "seq" else 4  # a sequence of 6 over 4 ranks
        mlp = ParallelMLP(tp, ctx.shared_rng("w1").normal((4, f)), ctx.shared_rng("w2").normal((f, 4)), act="relu")
        x = ctx.shared_rng("x").normal((s, 1, 4))
        if tp.sp:
            x = tp.shard(x, 0)
        return mlp.forward(x, Saved())[0]
    with pytest.raises(parasim.ParasimError):
        parasim.run(prog, world=4)

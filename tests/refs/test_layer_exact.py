"""A transformer layer split by TP (with and without SP, GQA, dropout) equals torch autograd on the unsplit
layer in float64, loss and every gradient; and what it keeps for backward matches Korthikanti et al."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from layer_check import gather, reference, run_parallel  # noqa: E402
from parasim.layout import ModelSpec

TOL = 1e-10


@st.composite
def cases(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    heads = tp * draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([k for k in (1, 2, heads) if heads % k == 0 and (k % tp == 0 or tp % k == 0)]))
    d = draw(st.sampled_from([1, 2, 4]))  # 1: hidden == heads
    sp = draw(st.booleans())
    s = tp * draw(st.integers(1, 3)) if sp else draw(st.integers(1, 6))
    shape = ModelSpec(hidden=heads * d, heads=heads, kv_heads=kv, ffn=tp * draw(st.sampled_from([2, 5])),
                       dropout=draw(st.sampled_from([0.0, 0.25])), act=draw(st.sampled_from(["gelu", "relu"])),
                       norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), bias=draw(st.booleans()),
                       flash=draw(st.booleans()))
    return shape, tp, sp, s, draw(st.integers(1, 2))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_layer_equals_torch_autograd(case):
    shape, tp, sp, s, b = case
    y, dx, grads = gather(run_parallel(shape, tp, sp, s, b), shape, tp, sp)
    ry, rdx, rgrads = reference(shape, s, b)
    assert np.max(np.abs(y - ry)) < TOL
    assert np.max(np.abs(dx - rdx)) < TOL
    assert set(grads) == set(rgrads)
    for k in rgrads:
        assert np.max(np.abs(grads[k] - rgrads[k])) < TOL, k


@pytest.mark.parametrize("tp, sp, flash", [(1, False, False), (2, False, False), (4, False, False),
                                           (2, True, False), (4, True, False), (4, True, True), (8, True, True)])
def test_saved_activations_match_korthikanti(tp, sp, flash):
    s, b, h, a = 16, 2, 32, 8
    res = run_parallel(ModelSpec(hidden=h, heads=a, dropout=0.1, flash=flash), tp, sp, s, b)
    sbh, scores = s * b * h, 5 * a * s * s * b
    if flash:
        expected = 34 * sbh / tp
    elif sp:
        expected = (34 * sbh + scores) / tp
    else:
        expected = sbh * (10 + 24 / tp) + scores / tp
    assert {v["saved"] for v in res.values} == {expected}


def test_all_reduce_count_per_layer():
    """TP: two all-reduces forward (g after attention and MLP), two backward (f); SP: AG+RS instead."""
    shape = ModelSpec(hidden=8, heads=2, dropout=0.0, bias=False)
    tp_run = run_parallel(shape, 2, False, 4, 1).trace.events
    assert [e.label for e in tp_run] == ["g forward", "g forward", "f backward", "f backward"]
    sp_run = run_parallel(shape, 2, True, 4, 1).trace.events
    # the re-gathers of the saved input shard (label "again") are SP's price for keeping 1/t of it
    ops = [e.op for e in sp_run if "grad (SP)" not in (e.label or "") and "again" not in (e.label or "")]
    assert ops.count("all_gather") == 4 and ops.count("reduce_scatter") == 4 and "all_reduce" not in ops
    ar = sum(m.sent for e in tp_run for m in e.members if m.rank == 0)
    agrs = sum(m.sent for e in sp_run for m in e.members if m.rank == 0 and e.op in ("all_gather", "reduce_scatter")
               and "again" not in (e.label or ""))
    assert agrs == ar

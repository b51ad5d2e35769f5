"""Ring attention (context parallelism) equals torch autograd on full attention in float64: output and
the gradients of q, k and v, causal or not, contiguous or zigzag, for cp = 1 to 4."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import parasim  # noqa: E402
from helpers_ring import gather, run_ring, torch_attention  # noqa: E402
from parasim.nn.ring_attention import RingAttention, positions  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(cp=st.integers(1, 4), chunk=st.integers(1, 3), b=st.integers(1, 2), heads=st.integers(1, 2),
       d=st.sampled_from([1, 3, 4]), causal=st.booleans(), split=st.sampled_from(["contiguous", "zigzag"]))
@example(cp=4, chunk=1, b=1, heads=1, d=1, causal=True, split="contiguous")  # one token per rank, always tried
def test_ring_attention_equals_torch(cp, chunk, b, heads, d, causal, split):
    seq = (cp if split == "contiguous" else 2 * cp) * chunk  # chunk 1: one token per rank (contiguous)
    vals = run_ring(cp, seq, b, heads, d, causal, split)
    ref = torch_attention(seq, b, heads, d, causal)
    for key, want in zip(("out", "dq", "dk", "dv"), ref):
        assert np.max(np.abs(gather(vals, key, seq) - want)) < 1e-10, key


def test_zigzag_balances_causal_work():
    seq, cp = 16, 4
    contiguous = [v["work"].blocks for v in run_ring(cp, seq, 1, 1, 2, True, "contiguous")]
    zigzag = [v["work"].blocks for v in run_ring(cp, seq, 1, 1, 2, True, "zigzag")]
    # in blocks of the 8-way split: rank i's two chunks see 2i and 2i+1 full blocks plus two half diagonals
    assert contiguous == [2.0, 6.0, 10.0, 14.0]
    assert zigzag == [8.0] * 4
    assert positions("zigzag", 8, 2, 0) == [0, 1, 6, 7] and positions("zigzag", 8, 2, 1) == [2, 3, 4, 5]


@pytest.mark.slow
def test_eight_ranks_of_large_matmuls_do_not_overflow_the_stack():
    """Regression: ranks first started from inside other ranks nested their greenlet stacks, and OpenBLAS
    then crashed (segfault) at cp = 8 with a 1024-token sequence. Run in a child so a crash fails the test."""
    import subprocess
    import sys
    code = ("import parasim\nfrom parasim.nn.ring_attention import RingAttention\n"
            "def p(ctx):\n    g = ctx.new_group(range(8), 'cp')\n    r = RingAttention(ctx, g, 1024, causal=False)\n"
            "    q = ctx.rng.normal((1, 4, 128, 64))\n    o, c = r.forward(q, q, q)\n    r.backward(c, o)\n"
            "parasim.run(p, 8)\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-500:]


@pytest.mark.parametrize("split, causal, want", [("contiguous", True, [3, 2, 1, 0]), ("zigzag", True, [0] * 4),
                                                 ("contiguous", False, [0] * 4)])
def test_fully_masked_chunks_are_skipped(split, causal, want):
    """Contiguous causal CP: rank r's queries all come before every key of ranks r+1.., so it skips
    cp-1-r chunks and spends no flops on them; zigzag and non-causal attention skip nothing."""
    cp, seq = 4, 16

    def program(ctx):
        ring = RingAttention(ctx, ctx.new_group(range(4), "cp"), seq, split=split, causal=causal)
        x = ctx.xp.take(ctx.shared_rng("x").normal((1, 1, seq, 2)), ctx.xp.asarray(ring.pos[ring.r]), axis=2)
        ring.forward(x, x, x)
        return ring.work
    res = parasim.run(program, cp)
    assert [w.skipped for w in res.values] == want
    skips = [e for e in res.trace.events if e.kind == "compute" and ": skip " in e.op]
    assert len(skips) == sum(want) and all(e.params["flops"] == 0 for e in skips)
    done = [e for e in res.trace.events if e.kind == "compute" and ": attend " in e.op]
    assert len(done) == cp * cp - sum(want)


def test_online_softmax_after_a_fully_masked_first_chunk():
    """A row whose first chunk is all -inf keeps m = -inf and l = 0, then the next chunk alone decides:
    the result equals a direct softmax over the unmasked scores."""
    from parasim.nn.ring_attention import online_softmax_step
    rng = np.random.default_rng(3)
    s2, v1, v2 = rng.normal(size=(2, 3)), rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    m, l, o = np.full(2, -np.inf), np.zeros(2), np.zeros((2, 5))
    m, l, o, rescale = online_softmax_step(np, m, l, o, np.full((2, 4), -np.inf), v1)
    assert np.all(m == -np.inf) and np.all(l == 0) and np.all(o == 0) and not np.any(np.isnan(rescale))
    m, l, o, rescale = online_softmax_step(np, m, l, o, s2, v2)
    w = np.exp(s2) / np.exp(s2).sum(axis=1, keepdims=True)
    assert np.allclose(o / l[:, None], w @ v2, rtol=0, atol=1e-12) and np.allclose(m, s2.max(axis=1))
    assert not np.any(np.isnan(o))

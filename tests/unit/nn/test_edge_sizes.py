"""Sizes the property tests never draw: one token per CP rank, a size equal to a parallel degree (heads ==
tp, experts == ep, layers == pp, micro-batches == 1 or == pp, one sequence per DP replica), hidden ==
heads (a head dimension of one), a ZeRO shard of one element and a group whose last shares are only
padding. Each case is held against torch autograd on the unsplit computation in float64, or against a
closed form written here.

Found by these cases (each fixed): SP over a CP slice that does not divide by tp failed deep in numpy
with a traceback (`nn.core.sp_share` now refuses it in one line), and `parasim trace --experts 1`
was refused for "an EP group of 2" nobody asked for (examples/moe16.whole_over_tp built one)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from layer_check import SharedCtx, gather as gather_layer, layer_grads, reference, run_parallel  # noqa: E402
from helpers_ring import full, gather as gather_ring, run_cp_layer, run_ring, torch_attention  # noqa: E402
from parasim.errors import LayoutError  # noqa: E402
from parasim.layout import Layout, ModelSpec  # noqa: E402
from parasim.nn import ParallelContext, Saved  # noqa: E402

TOL = 1e-10


def worst(pairs) -> float:
    """The largest absolute difference over (got, want) pairs."""
    return max(float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) for got, want in pairs)


# ---------------------------------------------------------------------------------------------
# Ring attention with one token per CP rank (contiguous: seq == cp) or one token per zigzag chunk
# (seq == 2 cp, the least zigzag allows). The causal skip of a chunk whose first key comes after this
# rank's last query must not skip the rank's own one-token diagonal block.

RING = [(cp, split, causal) for cp in (2, 4, 8) for split in ("contiguous", "zigzag") for causal in (True, False)]


@pytest.mark.parametrize("cp, split, causal", RING,
                         ids=[f"cp{c}-{s[:3]}-{'causal' if k else 'full'}" for c, s, k in RING])
def test_ring_attention_at_one_token_per_rank_equals_torch(cp, split, causal):
    seq = cp if split == "contiguous" else 2 * cp
    b, heads, d = 1, 2, 3
    vals = run_ring(cp, seq, b, heads, d, causal, split)
    assert [len(v["pos"]) for v in vals] == [1 if split == "contiguous" else 2] * cp  # 2: one per zigzag chunk
    want = torch_attention(seq, b, heads, d, causal)
    for key, ref in zip(("out", "dq", "dk", "dv"), want):
        got = gather_ring(vals, key, seq)
        assert not np.isnan(got).any(), key
        assert worst([(got, ref)]) < TOL, key


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_one_token_per_rank_skips_only_the_later_ranks(cp):
    """Contiguous and causal, one token each: rank r's query sees the keys of ranks 0..r (its own
    included) and skips the cp - 1 - r later ones."""
    vals = run_ring(cp, cp, 1, 1, 2, True, "contiguous")
    assert [v["work"].skipped for v in vals] == [cp - 1 - r for r in range(cp)]


# ---------------------------------------------------------------------------------------------
# A whole transformer layer under CP with one token per CP rank (with TP, and with SP: one token per
# TP rank), against torch autograd on the unsplit layer.


# (tp, cp, sp, split, seq, tokens each rank holds)
CP_LAYER = [(1, 2, False, "contiguous", 2, 1), (1, 4, False, "contiguous", 4, 1), (1, 8, False, "contiguous", 8, 1),
            (2, 2, False, "contiguous", 2, 1), (2, 4, False, "contiguous", 4, 1), (2, 2, True, "contiguous", 4, 1),
            (2, 4, True, "contiguous", 8, 1), (1, 8, False, "zigzag", 16, 2), (2, 2, True, "zigzag", 4, 1)]


@pytest.mark.parametrize("tp, cp, sp, split, s, held", CP_LAYER,
                         ids=[f"tp{t}-cp{c}{'-sp' if p else ''}-{x[:3]}-s{s}" for t, c, p, x, s, _ in CP_LAYER])
def test_cp_layer_at_one_token_per_rank_equals_torch(tp, cp, sp, split, s, held):
    shape = ModelSpec(hidden=4, heads=2, kv_heads=1, dropout=0.0)
    vals = run_cp_layer(shape, tp, cp, sp, split, s).values
    assert [len(v["pos"]) for v in vals] == [held] * (tp * cp)
    ry, rdx, rg = reference(shape, s, 1)
    y, dx = np.zeros_like(ry), np.zeros_like(rdx)
    for v in vals:
        y[v["pos"]], dx[v["pos"]] = v["y"], v["dx"]
    grads: dict = {}
    for c in range(cp):  # each CP rank's TP group gives its tokens' gradients; the CP ranks add up (dp-cp)
        ranks = sorted((v for v in vals if v["cp"] == c), key=lambda v: v["tp"])
        for k, g in layer_grads([v["grads"] for v in ranks], shape, tp).items():
            grads[k] = grads.get(k, 0) + g
    assert worst([(y, ry), (dx, rdx)] + [(grads[k], rg[k]) for k in rg]) < TOL


# SP needs each rank's CP slice to split evenly over tp: one line instead of a numpy traceback.
SP_UNEVEN = [(2, 8, "contiguous", 8), (4, 4, "contiguous", 8), (2, 2, "contiguous", 6), (2, 1, "contiguous", 3),
             (4, 2, "zigzag", 12)]


@pytest.mark.parametrize("tp, cp, split, s", SP_UNEVEN, ids=[f"tp{t}-cp{c}-{x[:3]}-s{s}" for t, c, x, s in SP_UNEVEN])
def test_sp_over_a_cp_slice_that_does_not_divide_by_tp_is_refused(tp, cp, split, s):
    def program(ctx):
        cp_group = ctx.groups["cp"] if cp > 1 else None
        context = ParallelContext(ctx, ctx.groups["tp"], sp=True, cp_group=cp_group, seq=s, cp_split=split)
        return context.token_positions()
    k = s // cp  # the tokens of one rank's CP slice, contiguous or zigzag
    words = rf"cannot split the {k} token{'' if k == 1 else 's'} of this rank's .* must divide by cp x tp"
    with pytest.raises(LayoutError, match=words):
        parasim.run(program, layout=Layout(tp=tp, cp=cp, sp=True))


def test_trace_refuses_sp_below_one_token_per_rank_in_one_line():
    from conftest import cli
    out = cli("trace", "--tp", "2", "--cp", "8", "--sp", "--experts", "2", "--ep", "2", "--layers", "1", "-m", "1")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "sequence 8 does not divide by cp x tp = 16" in out.stderr  # refused by the layout, before any work


# ---------------------------------------------------------------------------------------------
# A TP layer whose sizes equal the degree: heads == tp == hidden (head dimension one), ffn == tp,
# kv heads 1 or tp, and under SP seq == tp (one token per rank).

TP_EDGE = [(tp, sp, kv, flash) for tp in (2, 4) for sp in (False, True) for kv in (1, tp) for flash in (False, True)]


@pytest.mark.parametrize("tp, sp, kv, flash", TP_EDGE,
                         ids=[f"tp{t}{'-sp' if s else ''}-kv{k}{'-flash' if f else ''}" for t, s, k, f in TP_EDGE])
def test_layer_with_sizes_equal_to_tp_equals_torch(tp, sp, kv, flash):
    shape = ModelSpec(hidden=tp, heads=tp, kv_heads=kv, ffn=tp, dropout=0.25, flash=flash)
    y, dx, grads = gather_layer(run_parallel(shape, tp, sp, tp, 1), shape, tp, sp)
    ry, rdx, rg = reference(shape, tp, 1)
    assert set(grads) == set(rg)
    assert worst([(y, ry), (dx, rdx)] + [(grads[k], rg[k]) for k in rg]) < TOL


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_one_head_of_dimension_one_equals_torch(norm):
    shape = ModelSpec(hidden=1, heads=1, ffn=1, dropout=0.0, norm=norm)
    y, dx, grads = gather_layer(run_parallel(shape, 1, False, 3, 2), shape, 1, False)
    ry, rdx, rg = reference(shape, 3, 2)
    assert worst([(y, ry), (dx, rdx)] + [(grads[k], rg[k]) for k in rg]) < TOL


# ---------------------------------------------------------------------------------------------
# MoE with one expert per EP rank (experts == ep), one token per rank, top-k up to every expert.

MOE = [(2, 1, 2, 1), (2, 1, 2, 2), (4, 1, 4, 1), (4, 1, 4, 4), (8, 1, 8, 2)]


@pytest.mark.parametrize("p, n, n_exp, k", MOE, ids=[f"ep{p}-tok{n}-e{e}-k{k}" for p, n, e, k in MOE])
def test_moe_with_one_expert_per_rank_equals_torch(p, n, n_exp, k):
    from test_moe_exact import check
    res = check(p, n, 6, 8, n_exp, k)
    assert all(sum(key.endswith(".w1") for key in v["grads"]) <= 1 for v in res.values)  # one expert each


@pytest.mark.parametrize("tp, k", [(2, 1), (2, 2), (4, 2)], ids=["tp2-k1", "tp2-k2", "tp4-k2"])
def test_moe_layer_with_experts_equal_to_tp_and_one_token_per_rank(tp, k):
    """EP over the TP ranks with as many experts as ranks, SP, a sequence of one token per rank."""
    shape = ModelSpec(hidden=8, heads=tp, ffn=12, experts=tp, top_k=k)
    y, dx, grads = gather_layer(run_parallel(shape, tp, True, tp, 1), shape, tp, True)
    ry, rdx, rg = reference(shape, tp, 1)
    assert worst([(y, ry), (dx, rdx)] + [(grads[key], rg[key]) for key in rg]) < TOL


# ---------------------------------------------------------------------------------------------
# Pipelines with one layer per stage (layers == pp x chunks) and one micro-batch, or as many as stages.

PIPE = [("gpipe", 4, 1, 1, None), ("1f1b", 2, 1, 1, None), ("1f1b", 2, 2, 1, None), ("1f1b", 4, 1, 1, None),
        ("zb-h1", 2, 1, 1, None), ("zb-h1", 4, 1, 4, None), ("interleaved", 2, 1, 1, 2), ("interleaved", 4, 1, 4, 2),
        ("interleaved-zb", 2, 1, 1, 2), ("zbv", 2, 1, 1, 2), ("zbv", 2, 2, 2, 2), ("dualpipev", 2, 1, 4, 2)]


@pytest.mark.parametrize("schedule, pp, tp, m, chunks", PIPE,
                         ids=[f"{s}-pp{p}-tp{t}-m{m}" for s, p, t, m, _ in PIPE])
def test_pipeline_with_one_layer_per_stage_equals_torch(schedule, pp, tp, m, chunks):
    from helpers_pipeline import SHAPE, pipeline_reference as pipe_reference, run_pipeline as run_pipe
    layers = pp * (chunks or 1)  # one layer per stage
    sp = tp > 1 and schedule != "1f1b"
    res = run_pipe(schedule, pp, tp, m, layers, chunks, sp=sp)
    loss, ref = pipe_reference(m, layers)
    holders = [x for x in res.values if x["loss"] != 0]
    assert abs(sum(x["loss"] for x in holders) / (1 if sp else tp) - loss) < TOL
    for i in range(layers):
        ranks = sorted((x for x in res.values if i in x["grads"]), key=lambda x: x["tp"])
        assert len(ranks) == tp  # the layer lives on one stage, on each of its TP ranks
        got = layer_grads([x["grads"][i] for x in ranks], SHAPE, tp)
        assert worst([(got[key], ref[i][key]) for key in ref[i]]) < TOL, (schedule, i)


# ---------------------------------------------------------------------------------------------
# ZeRO: a shard of one element, and groups whose last ranks hold nothing but padding.

LR = 0.01


def adam_first_step(w, g, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
    """Adam's first step written out (Kingma and Ba), so the reference uses none of the optimizers tested."""
    m, v = (1 - b1) * g, (1 - b2) * g * g
    return w - lr * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)


# (group size, elements of "w"): with the one-element "b" beside it, total = size + 1
ZERO = [(2, 1), (4, 1), (4, 2), (4, 3), (3, 4), (4, 6)]


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("bucket", [None, 1], ids=["whole", "bucket1"])
@pytest.mark.parametrize("n, size", ZERO, ids=[f"n{n}-w{s}" for n, s in ZERO])
def test_sharded_adam_with_tiny_shares_steps_like_one_device(n, size, bucket, stage):
    from parasim.dp.sharded import ShardedAdam

    def program(ctx):
        opt = ShardedAdam(ctx, ctx.new_group(range(n), "dp"), {"w": ctx.shared_rng("w").normal((size,)),
                          "b": ctx.shared_rng("b").normal((1,))}, stage, lr=LR, bucket=bucket)
        new = opt.step({"w": ctx.shared_rng(f"g{ctx.rank}").normal((size,)), "b": ctx.asarray([ctx.rank + 1.0])})
        return new, opt.ranges()
    res = parasim.run(program, n)
    c = SharedCtx()
    want_w = adam_first_step(c.shared_rng("w").normal((size,)), sum(c.shared_rng(f"g{r}").normal((size,))
                                                                     for r in range(n)) / n)
    want_b = adam_first_step(c.shared_rng("b").normal((1,)), np.array([(n + 1) / 2]))  # mean of 1..n
    padded = -(-(size + 1) // n) * n if stage else size + 1
    for new, ranges in res.values:
        assert new["w"].shape == (size,) and new["b"].shape == (1,)
        assert worst([(new["w"], want_w), (new["b"], want_b)]) < 1e-12
        assert sum(hi - lo for lo, hi in ranges) == padded // (n if stage else 1)


@pytest.mark.parametrize("n, size", ZERO, ids=[f"n{n}-w{s}" for n, s in ZERO])
def test_zero1_adam_with_tiny_shares_steps_like_one_device(n, size):
    from parasim.dp.zero import Zero1Adam

    def program(ctx):
        opt = Zero1Adam(ctx, ctx.new_group(range(n), "dp"), {"w": ctx.shared_rng("w").normal((size,))}, lr=LR)
        new, sq = opt.step({"w": ctx.shared_rng(f"g{ctx.rank}").normal((size,))})
        return new["w"], sq["w"], opt.state_elements
    res = parasim.run(program, n)
    c = SharedCtx()
    g = sum(c.shared_rng(f"g{r}").normal((size,)) for r in range(n))  # Zero1Adam sums, it does not average
    want = adam_first_step(c.shared_rng("w").normal((size,)), g)
    assert worst([(w, want) for w, _, _ in res.values]) < 1e-12
    assert abs(sum(sq for _, sq, _ in res.values) - float(g @ g)) < 1e-12  # the shares' squares add up
    assert {state for _, _, state in res.values} == {3 * -(-size // n)}  # master, m, v of a padded share


@pytest.mark.parametrize("n, hidden, rms", [(2, 1, True), (4, 1, True), (4, 3, False)],
                         ids=["n2-rms1", "n4-rms1", "n4-ln3"])
def test_zero3_of_a_layer_smaller_than_its_group_steps_like_one_device(n, hidden, rms):
    """A norm of 1 weight over 2 or 4 ranks (shards of one element, the others all padding), or of 6
    weights over 4: forward, backward, reduce-scatter and Adam equal one device's (torch autograd)."""
    from parasim.dp.zero3 import Zero3
    from parasim.nn.norm import LayerNorm

    class Norm(LayerNorm):  # ZeRO-3 asks its layer to forget reduced gradients, as TransformerLayer does
        def zero_grad(self):
            self.grads.clear()

    def program(ctx):
        w, b = ctx.shared_rng("w").normal((hidden,)), ctx.shared_rng("b").normal((hidden,))
        z = Zero3(ctx, Norm(ParallelContext(ctx), w, b, rms=rms), ctx.new_group(range(n), "dp"), lr=LR)
        _, cache = z.forward(ctx.shared_rng(f"x{ctx.rank}").normal((3, 1, hidden)), Saved())
        z.backward(cache, ctx.shared_rng(f"dy{ctx.rank}").normal((3, 1, hidden)))
        z.step()
        return z.params()
    res = parasim.run(program, n)
    c = SharedCtx()
    W = torch.tensor(c.shared_rng("w").normal((hidden,)), requires_grad=True)
    B = torch.tensor(c.shared_rng("b").normal((hidden,)), requires_grad=True)
    loss = 0
    for r in range(n):
        x = torch.tensor(c.shared_rng(f"x{r}").normal((3, 1, hidden)))
        if rms:
            y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * W
        else:
            y = torch.nn.functional.layer_norm(x, (hidden,), W, B, eps=1e-5)
        loss = loss + (y * torch.tensor(c.shared_rng(f"dy{r}").normal((3, 1, hidden)))).sum() / n
    loss.backward()
    want = {"weight": adam_first_step(W.detach().numpy(), W.grad.numpy())}
    if not rms:
        want["bias"] = adam_first_step(B.detach().numpy(), B.grad.numpy())
    for got in res.values:
        assert set(got) == set(want)
        assert worst([(got[k], want[k]) for k in want]) < 1e-12


# ---------------------------------------------------------------------------------------------
# The 16-GPU example's step on layouts whose sizes meet their degrees, through `parasim trace`: each
# must end with the run equal to the unsplit model (loss, every gradient, every weight after Adam).

TRACE = ["--dp 8 --ep 8 --experts 8 --layers 1 -m 1",            # experts == ep, one micro-batch
         "--tp 2 --sp --dp 2 --ep 4 --experts 4 --layers 1 -m 1",  # experts == ep over a TP x DP mesh
         "--pp 4 --experts 1 --layers 4 -m 4",                     # layers == pp == micro-batches, one expert
         "--tp 2 --sp --dp 2 --experts 1 --layers 1 -m 1",         # one expert (was refused: "EP group of 2")
         "--tp 4 --sp --ep 4 --experts 4 --layers 1 -m 1",         # heads == tp == ep == experts
         "--tp 2 --sp --cp 4 --split contiguous --ep 2 --experts 2 --layers 1 -m 1",  # one token per rank
         "--cp 8 --split contiguous --experts 0 --layers 1 -m 1",  # seq == cp
         "--tp 2 --pp 2 --dp 2 --ep 2 --etp 2 --sp --experts 2 --layers 2 -m 1"]   # layers == pp, etp == tp


@pytest.mark.parametrize("flags", TRACE, ids=[f"t{i}" for i in range(len(TRACE))])
def test_trace_on_edge_layouts_is_exact(flags):
    import json

    from conftest import cli
    out = cli("trace", *flags.split(), "--json")
    assert out.returncode == 0, out.stderr
    exact = json.loads(out.stdout)["exactness"]
    assert exact["exact"] is True and exact["loss"] == pytest.approx(exact["unsplit_loss"], rel=0, abs=1e-9)
    n = exact["gradients"].split(" of ")
    assert n[0] == n[1].split()[0] and int(n[0]) > 0  # "k of k weights"


def test_trace_with_one_expert_names_no_ep_group():
    from conftest import cli
    out = cli("trace", "--dp", "2", "--experts", "1", "--layers", "1", "-m", "1")
    assert out.returncode == 0 and "EP group" not in out.stderr, out.stderr


def test_one_token_per_rank_by_hand():
    """seq == cp == 2, one head of dimension one (the scale 1/sqrt(d) is 1), causal: token 0 sees only
    itself, so its output is v0; token 1 attends by softmax(q1 k0, q1 k1). Worked here without torch."""
    vals = run_ring(2, 2, 1, 1, 1, True, "contiguous")
    q, k, v = (full(n, (1, 1, 2, 1))[0, 0, :, 0] for n in "qkv")
    out = gather_ring(vals, "out", 2)[0, 0, :, 0]
    w = np.exp(q[1] * k) / np.exp(q[1] * k).sum()
    assert math.isclose(out[0], v[0], abs_tol=1e-15) and math.isclose(out[1], float(w @ v), abs_tol=1e-15)

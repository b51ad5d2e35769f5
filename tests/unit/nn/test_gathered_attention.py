"""CP by all-gather (nn/gathered_attention.py, `Layout(cp_comm="all_gather")`): the same attention as the unsplit
model's, held against torch autograd in float64 (alone, with grouped K/V heads, and in a whole layer with TP and
SP), the collectives it makes, and a folded run of it counted as a full run."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from helpers_ring import full, gather, run_cp_layer, torch_attention  # noqa: E402
from layer_check import layer_grads, reference  # noqa: E402
from parasim.errors import LayoutError  # noqa: E402
from parasim.layout import Layout, ModelSpec, preset  # noqa: E402
from parasim.nn.gathered_attention import GatheredAttention  # noqa: E402
from parasim.nn.ring_attention import RingAttention  # noqa: E402

TOL = 1e-10


def worst(pairs) -> float:
    return max(float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) for got, want in pairs)


def run_gathered(cp, seq, b, heads, d, causal, split, kv_heads=None, kind=GatheredAttention):
    """Each CP rank's positions, output and q/k/v gradients; with `kv_heads`, K and V at their own heads, each q
    head reading K/V head h // (heads // kv_heads). `kind`: the CP attention (the ring takes the same calls)."""
    kv = heads if kv_heads is None else kv_heads
    group_size = heads // kv

    def program(ctx):
        group = ctx.new_group(range(ctx.world), "cp") if ctx.world > 1 else None
        fold = None
        if kv_heads is not None:

            def fold(per_q, shape):  # each K/V head's gradient: the sum of its q heads'
                return ctx.xp.sum(ctx.xp.reshape(per_q, (shape[0], kv, group_size, *shape[2:])), axis=2)

        att = kind(
            ctx,
            group,
            seq,
            split=split,
            causal=causal,
            kv_of=None if kv_heads is None else [h // group_size for h in range(heads)],
            fold=fold,
        )
        pos = ctx.xp.asarray(list(att.sequence.positions(att.r)))

        def take(name, h):  # this rank's positions of the whole tensor
            return ctx.xp.take(ctx.shared_rng(name).normal((b, h, seq, d)), pos, axis=2)

        q, k, v, do = take("q", heads), take("k", kv), take("v", kv), take("do", heads)
        out, cache = att.forward(q, k, v)
        dq, dk, dv = att.backward(cache, do)
        return {"pos": list(att.sequence.positions(att.r)), "out": out, "dq": dq, "dk": dk, "dv": dv}

    return parasim.run(program, cp)


CASES = [(cp, split, causal) for cp in (1, 2, 4) for split in ("contiguous", "zigzag") for causal in (True, False)]


@pytest.mark.parametrize(
    "cp, split, causal", CASES, ids=[f"cp{c}-{s[:3]}-{'causal' if k else 'full'}" for c, s, k in CASES]
)
def test_gathered_attention_equals_torch(cp, split, causal):
    seq, b, heads, d = 4 * cp, 2, 2, 3
    vals = run_gathered(cp, seq, b, heads, d, causal, split).values
    want = torch_attention(seq, b, heads, d, causal)
    for key, ref in zip(("out", "dq", "dk", "dv"), want):
        got = gather(vals, key, seq)
        assert worst([(got, ref)]) < TOL, key


def test_scores_far_apart_in_size_stay_exact():
    """Each query's scores are shifted by its own largest before exp (a shift by the largest of all would send a
    row whose scores are all far below it to zeros, and its softmax to 0/0)."""
    cp, seq, b, heads, d = 2, 8, 1, 2, 3

    def program(ctx):
        group = ctx.new_group(range(ctx.world), "cp")
        att = GatheredAttention(ctx, group, seq, split="zigzag", causal=True)
        pos = ctx.xp.asarray(list(att.sequence.positions(att.r)))
        scale = ctx.xp.asarray([1.0, 4000.0] * 4)[:, None]  # rows far apart

        def take(name, times=None):
            whole = ctx.shared_rng(name).normal((b, heads, seq, d))
            return ctx.xp.take(whole if times is None else whole * times, pos, axis=2)

        out, cache = att.forward(take("q", scale), take("k"), take("v"))
        return {"pos": list(att.sequence.positions(att.r)), "out": out}

    vals = parasim.run(program, cp).values
    scale = np.array([1.0, 4000.0] * 4)[:, None]
    qt = torch.tensor(full("q", (b, heads, seq, d)) * scale)
    kt, vt = (torch.tensor(full(n, (b, heads, seq, d))) for n in "kv")
    s = (qt @ kt.transpose(-1, -2) / math.sqrt(d)).masked_fill(
        torch.ones(seq, seq, dtype=torch.bool).triu(1), -math.inf
    )
    want = (torch.softmax(s, -1) @ vt).numpy()
    got = gather(vals, "out", seq)
    assert np.isfinite(got).all() and worst([(got, want)]) < TOL


@pytest.mark.parametrize("kind", [GatheredAttention, RingAttention], ids=["gather", "ring"])
def test_grouped_kv_heads_travel_at_their_own_heads_and_equal_torch(kind):
    cp, seq, b, heads, kv, d = 2, 8, 1, 4, 2, 3
    result = run_gathered(cp, seq, b, heads, d, True, "zigzag", kv_heads=kv, kind=kind)
    qt = torch.tensor(full("q", (b, heads, seq, d)), requires_grad=True)
    kt, vt = (torch.tensor(full(n, (b, kv, seq, d)), requires_grad=True) for n in "kv")
    s = qt @ kt.repeat_interleave(heads // kv, dim=1).transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), -math.inf)
    out = torch.softmax(s, -1) @ vt.repeat_interleave(heads // kv, dim=1)
    (out * torch.tensor(full("do", (b, heads, seq, d)))).sum().backward()
    for key, ref in (("out", out.detach()), ("dq", qt.grad), ("dk", kt.grad), ("dv", vt.grad)):
        assert worst([(gather(result.values, key, seq), ref.numpy())]) < TOL, key
    # K and V move at their 2 heads, not the 4 q heads': each rank's 4 tokens x 2 heads x 3 values, 8 bytes
    share = b * kv * (seq // cp) * d * 8
    if kind is GatheredAttention:
        gathers = [e for e in result.trace.events if e.op == "all_gather"]
        assert {m.ins[0].shape for e in gathers for m in e.members} == {(b, kv, seq // cp, d)}
        assert {m.recv for e in gathers for m in e.members} == {(cp - 1) * share}
    else:  # the ring over 2: K and V forward, K, V, dK and dV backward, dK and dV home, one share each
        moved = [e for e in result.trace.events if e.kind == "p2p"]
        assert sum(m.sent for e in moved for m in e.members if m.rank == 0) == (2 + 4 + 2) * share


def test_the_collectives_are_gathers_before_and_reduce_scatters_after():
    events = run_gathered(4, 16, 2, 2, 2, True, "zigzag").trace.events
    assert {e.kind for e in events} == {"collective", "compute"}  # no transfer: every rank may fold onto another
    # the causal work, alike on every rank under zigzag: 16 tokens in 8 chunks of 2, rank r holding chunks r and
    # 7 - r, each seeing the chunks before it whole and its own half: r + 1/2 + 7 - r + 1/2 = 8 blocks of 2 x 2
    # query-key pairs, 2 products (QK^T, PV) of 2 flops a multiply-add over d = 2, for 2 heads and 2 sequences
    assert sorted((e.members[0].rank, e.op, e.params["flops"]) for e in events if e.kind == "compute") == [
        (r, "gather: attend to the gathered K/V", 8 * 4 * 4 * 2 * 2 * 2) for r in range(4)
    ]
    first = [(e.op, e.label, e.params.get("dim")) for e in events if e.kind == "collective" and 0 in e.ranks]
    assert first == [
        ("all_gather", "gather: gather K", 2),
        ("all_gather", "gather: gather V", 2),
        ("all_gather", "gather: gather K again", 2),
        ("all_gather", "gather: gather V again", 2),
        ("reduce_scatter", "gather backward: reduce-scatter dK", 2),
        ("reduce_scatter", "gather backward: reduce-scatter dV", 2),
    ]


# (tp, cp, sp, split, seq); heads 4 over kv heads 2 (grouped, and replicated on TP 4)
LAYER = [
    (1, 2, False, "zigzag", 8),
    (2, 2, True, "zigzag", 8),
    (2, 2, False, "contiguous", 4),
    (4, 2, True, "zigzag", 16),
    (1, 4, False, "contiguous", 8),
]


@pytest.mark.parametrize("comm", ["all_gather", "p2p"])
@pytest.mark.parametrize(
    "tp, cp, sp, split, s", LAYER, ids=[f"tp{t}-cp{c}{'-sp' if p else ''}-{x[:3]}-s{s}" for t, c, p, x, s in LAYER]
)
def test_a_layer_with_cp_by_either_exchange_equals_torch(tp, cp, sp, split, s, comm):
    shape = ModelSpec(hidden=8, heads=4, kv_heads=2, dropout=0.0)
    result = run_cp_layer(shape, tp, cp, sp, split, s, comm)
    vals = result.values
    ry, rdx, rg = reference(shape, s, 1)
    y, dx = np.zeros_like(ry), np.zeros_like(rdx)
    for v in vals:
        y[v["pos"]], dx[v["pos"]] = v["y"], v["dx"]
    grads: dict = {}
    for c in range(cp):  # each CP rank's TP group gives its tokens' gradients; the CP ranks add up
        ranks = sorted((v for v in vals if v["cp"] == c), key=lambda v: v["tp"])
        for k, g in layer_grads([v["grads"] for v in ranks], shape, tp).items():
            grads[k] = grads.get(k, 0) + g
    assert worst([(y, ry), (dx, rdx)] + [(grads[k], rg[k]) for k in rg]) < TOL
    # what each rank sent over CP is the estimator's count for one layer (K/V heads replicated on TP 4: one each)
    from parasim.estimate.traffic import layer_traffic

    sent: dict = {}
    for e in result.trace.events:
        if e.group.name == "cp":
            for m in e.members:
                sent.setdefault(m.rank, {}).setdefault(e.op, 0)
                sent[m.rank][e.op] += m.sent
    want = layer_traffic(shape.hidden, shape.heads, s // cp, tp, sp, cp, itemsize=8, kv_heads=2, cp_comm=comm)
    assert set(sent) == set(range(tp * cp))
    assert all(got == {op: v for (axis, op), v in want.items() if axis == "cp"} for got in sent.values())


def test_the_estimators_cp_bytes_by_hand():
    from parasim.estimate.traffic import layer_traffic

    # 8 tokens a CP rank, 4 heads of 2 over TP 4, 2 K/V heads: each TP rank holds one (replicated), 2-byte values:
    # a rank's K is 8 x 1 x 2 x 2 = 32 bytes, sent once to its one CP peer per all-gather: K and V, forward and
    # backward; dK and dV reduce-scattered, the peer's half of 64 bytes each
    got = layer_traffic(8, 4, 8, 4, True, 2, kv_heads=2, cp_comm="all_gather")
    assert (got[("cp", "all_gather")], got[("cp", "reduce_scatter")]) == (4 * 32, 2 * 32)
    assert ("cp", "p2p") not in got
    # under full recomputation the forward's gathers run twice
    again = layer_traffic(8, 4, 8, 4, True, 2, kv_heads=2, cp_comm="all_gather", recompute=True)
    assert again[("cp", "all_gather")] == 6 * 32


def test_a_layout_names_its_cp_exchange():
    assert Layout(cp=2).cp_comm == "p2p"  # Megatron's default: the ring
    assert preset("llama3-405b-long").cp_comm == "all_gather"  # the Llama 3 paper's, section 3.3.2
    with pytest.raises(LayoutError, match="unknown CP exchange 'a2a'; use p2p or all_gather"):
        Layout(cp=2, cp_comm="a2a")


def test_trace_follows_a_token_through_cp_by_all_gather_and_checks_it():
    from conftest import cli

    got = cli("trace", "--tp", "2", "--cp", "2", "--sp", "--cp-comm", "all_gather")
    assert got.returncode == 0, got.stderr
    assert "all-gather over cp {g0, g2}: layer 1.attn.gather: gather K" in got.stdout
    assert "p2p over cp" not in got.stdout
    assert "against the unsplit model: loss" in got.stdout and ": exact" in got.stdout
    bad = cli("trace", "--tp", "2", "--cp", "2", "--cp-comm", "ring")
    assert bad.returncode == 2 and "invalid choice: 'ring'" in bad.stderr and bad.stderr.count("\n") == 1


def test_the_long_context_preset_runs_folded_where_its_ring_would_be_refused():
    from dataclasses import replace

    from parasim.errors import UsageError
    from parasim.estimate.memory import Plan
    from parasim.engine.symbolic.fold import fold_of
    from parasim.train.against import check_runs, step_layout

    layout = preset("llama3-405b-long")
    plan = Plan.of(layout, microbatches=16)
    check_runs(layout.model, plan, seq=131072)  # 16 stages x 16 micro-batches, one CP rank of each stage runs
    stepped = step_layout(layout.model, plan, 131072)
    assert stepped.cp_comm == "all_gather" and len(set(fold_of(stepped))) == 16  # one rank a stage
    ring = replace(plan, cp_comm="p2p")
    with pytest.raises(UsageError, match=r"micro-batches x pipeline stages x CP ranks .* \(16 x 16 x 16\)"):
        check_runs(layout.model, ring, seq=131072)
    assert len(set(fold_of(replace(layout, cp_comm="p2p")))) == 16 * 16  # a ring's CP ranks each run


def test_the_long_context_stage_traced_at_real_size_on_one_data_parallel_group():
    from dataclasses import replace

    from parasim.examples.tracing import TraceQuery, gpu_view

    layout = replace(preset("llama3-405b-long"), dp=1, world=None)  # 2,048 GPUs: TP 8 x CP 16 x PP 16
    view = gpu_view(TraceQuery(layout, "llama3-405b-long", symbolic=True, seq=4096), 0)
    trace = view.step.result.trace
    assert layout.world == 2048 and view.step.microbatches == 16
    assert len(set(trace.meta["fold"])) == 16  # one rank a stage runs: its CP peers folded onto it
    joins = {(e.op, e.group.name) for e in trace.ran_events if e.kind == "collective"}
    assert ("all_gather", "cp") in joins and ("reduce_scatter", "cp") in joins
    assert not any(e.kind == "p2p" and e.group.name == "cp" for e in trace.ran_events)
    assert view.view["peak"]["bytes"] > 0 and view.view["time"]["step_s"] > 0
    # the estimator's bytes (K and V at their 8 heads, one a TP rank) against what a GPU of a middle stage sent
    from parasim.estimate.traffic import step_traffic
    from parasim.train.against import first_gpu

    gpu = first_gpu(layout, 1)  # stage 1 holds 8 layers, the most (the first and last hold 7)
    sent: dict = {}
    for e in trace.events_of(gpu):
        if e.group.name == "cp":
            sent[e.op] = sent.get(e.op, 0) + e.member(gpu).sent
    want = step_traffic(layout.model, view.step.plan, 4096)
    assert sent == {op: want[("cp", op)] for op in ("all_gather", "reduce_scatter")}
    # by hand: 4,096 tokens over CP 16 is 256 a rank; one K/V head of 128 values a TP rank, 2 bytes (BF16); an
    # all-gather sends the rank's share to 15 others; K and V forward and backward, 8 layers, 16 micro-batches
    share = 256 * 1 * 128 * 2
    assert sent["all_gather"] == 4 * 15 * share * 8 * 16 and sent["reduce_scatter"] == 2 * 15 * share * 8 * 16


def test_memory_counts_cp_by_all_gather_when_asked():
    import json

    from conftest import cli

    args = ("memory", "--model", "27b", "--tp", "8", "--sp", "--cp", "2", "--seq", "4096", "--json")
    gathered = json.loads(cli(*args, "--cp-comm", "all_gather").stdout)["traffic"]
    ring = json.loads(cli(*args).stdout)["traffic"]
    # by hand: 2,048 tokens a CP rank, 6 of the 48 K/V heads of 128 a TP rank, 2 bytes: 3,145,728 bytes of K (or V);
    # over CP 2 each all-gather sends it once and each reduce-scatter half of two: K and V gathered forward and
    # backward (4), dK and dV scattered (2), for 60 layers and one micro-batch
    share = 2048 * 6 * 128 * 2
    assert gathered["cp all_gather"] == pytest.approx(4 * share * 60 / 1e9)
    assert gathered["cp reduce_scatter"] == pytest.approx(2 * share * 60 / 1e9)
    # the ring: K and V forward (1 hop), K, V, dK, dV backward (1 hop) and dK, dV home: 8 shares a layer
    assert ring["cp p2p"] == pytest.approx(8 * share * 60 / 1e9) and "cp all_gather" not in ring

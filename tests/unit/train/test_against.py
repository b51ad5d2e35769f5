"""The estimator against whole training steps on symbolic ranks (train/against.py): for the post's nine
longest-sequence rows of the 27B model and for the deepseek-v3 layout, every memory item and every axis's
traffic is equal, or differs by parts (train/differences.py) that add up to the difference exactly;
`parasim fit`'s longest sequence fits the run and one step longer does not."""
import json

import pytest

from parasim.cli import main
from parasim.estimate import Plan, breakdown, get_model, gpu_presets
from parasim.estimate.fit import LONGEST_ROWS
from parasim.layout import ModelSpec
from parasim.train.against import as_run, compare, fit_against_run
from parasim.train.differences import ACTIVATION_ITEMS, received

ROWS = [(label, kw) for _, label, kw in LONGEST_ROWS]
IDS = [f"row{k}" for k in range(len(ROWS))]
DS_PLAN = dict(pp=16, ep=64, world=2048, microbatches=16)


def _explained(c):
    """Each memory item and each (axis, collective): estimate - run, and the sum of its parts."""
    out = {r["item"]: (r["estimate"] - r["run"], sum(r["parts"].values())) for r in c["rows"]}
    out.update({(t["axis"], t["op"]): (t["estimate"] - t["run"], sum(t["parts"].values())) for t in c["traffic"]})
    return out


@pytest.mark.parametrize("label, kw", ROWS, ids=IDS)
def test_every_difference_on_the_nine_rows_is_explained_by_its_parts(label, kw):
    model = get_model("27b")
    c = compare(model, Plan(**kw), 4096)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-3), (label, item)
    weights = c["rows"][0]["parts"]
    # by hand: the input and output embeddings (untied), v x h each, over tp x pp, 2 bytes a value, scaled as
    # the estimator scales every count to the stated 27e9
    shapes = sum(model.counted().values())
    emb = 2 * model.vocab * model.hidden / (Plan(**kw).tp * Plan(**kw).pp)
    assert weights["embeddings and output layer"] == pytest.approx(2 * emb)
    assert weights["stated count against the shapes"] < 0 and 27e9 < shapes
    assert {k for t in c["traffic"] for k in t["parts"]} <= {"even spread over stages", "embeddings and output layer",
                                                             "stated count against the shapes",
                                                             "norms: whole on every TP rank, with biases",
                                                             "biases (the estimator counts none)",
                                                             "ZeRO-1 pads each share to equal size"}


@pytest.mark.parametrize("kw", [dict(tp=2, sp=True, dp=2, ep=4), dict(tp=2, sp=True, dp=2, ep=4, pp=2, microbatches=4)],
                         ids=["tp-sp-ep", "tp-sp-ep-pp"])
def test_an_moe_model_under_sp_is_explained_too(kw):
    """The 16-GPU example's model (8 experts top-2) under TP 2 + SP, EP 4, 64 tokens a sequence: each TP rank
    routes its own 32 tokens, so the MoE layers have TP collectives around attention only and the router's
    gradient is summed over TP; every difference is named."""
    model = get_model("moe16")
    c = compare(model, Plan(**kw), 64)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-9), item
    tp = {t["op"]: t for t in c["traffic"] if t["axis"] == "tp"}
    assert set(tp) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert all(t["estimate"] == t["run"] > 0 for t in tp.values())
    rows, pairs = received(model, Plan(**kw), "balanced", 32, 0)
    assert (rows, pairs) == (4 * 16, 4 * 16)  # 32 tokens a sender, half of them (picks t, t+4) on EP rank 0


def test_odd_shapes_pad_both_zero1_buffers():
    """A model whose dense and expert values do not divide by their groups (DP 16; expert-DP 4): ZeRO-1 pads
    each flat buffer, and the padding is a part of the optimizer's and the data-parallel sums' difference."""
    model = ModelSpec(name="odd", layers=2, hidden=8, heads=2, vocab=16, ffn=9, experts=4, top_k=2, expert_ffn=3,
                      dense_layers=1)
    c = compare(model, Plan(dp=16, ep=4), 8)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-9), item
    traffic = {(t["axis"], t["op"]): t["parts"] for t in c["traffic"]}
    pad = "ZeRO-1 pads each share to equal size"
    # by hand: the expert buffer is one MoE layer's one expert, 2 x 8 x 3 + 3 + 8 = 59 values, padded to 60
    # over 4; the ring sends 3/4 of the padding value at 2 bytes
    assert traffic[("edp", "reduce_scatter")][pad] == -3 / 4 * 1 * 2
    assert c["rows"][2]["parts"][pad] < 0 and traffic[("dp", "all_gather")][pad] < 0


@pytest.mark.parametrize("label, kw", ROWS, ids=IDS)
def test_fits_longest_sequence_fits_the_run_and_one_step_longer_does_not(label, kw):
    model, usable = get_model("27b"), gpu_presets()["h200"].usable
    got = fit_against_run(model, Plan(**kw), usable)
    short, long_ = got["lengths"]
    assert (short["fits"], long_["fits"]) == (True, False), label
    assert long_["seq"] - short["seq"] == got["granule"] == 2 * Plan(**kw).cp * Plan(**kw).tp
    plan = as_run(Plan(**kw))
    for row in (short, long_):  # what the run held is the estimate's own activations, at both lengths
        est = breakdown(model, plan, row["seq"])
        assert row["run_total"] - (est.items["weights"] + est.items["gradients"] + est.items["optimizer"]
                                   - row["missing"] + est.items["logits"]) == pytest.approx(
            sum(est.items[k] for k in ACTIVATION_ITEMS), rel=1e-12)


@pytest.fixture(scope="module")
def deepseek_step():
    """DeepSeek-V3's step run once for both stages' comparisons: folding around the first GPU of stage 0 or
    of stage 15 picks the same representatives (they differ only in their stage, a kept axis)."""
    from parasim.train.against import first_gpu, run_plan, step_layout
    from parasim.engine.symbolic.fold import fold_of
    model, plan = get_model("deepseek-v3"), Plan(**DS_PLAN)
    layout = step_layout(model, plan, 4096)
    gpus = [first_gpu(layout, s) for s in (0, 15)]
    assert fold_of(layout, around=gpus[0]) == fold_of(layout, around=gpus[1])
    return run_plan(model, plan, 4096, gpus[0])


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 15], ids=["first", "last"])
def test_deepseek_v3_item_by_item(stage, deepseek_step):
    """DeepSeek-V3 on 2,048 GPUs at 4,096 tokens, 16 micro-batches: the step has two-matrix MLPs and no
    shared experts or embeddings, and the estimator spreads the model evenly over the stages: each part by
    hand, and together they are the whole difference."""
    model = get_model("deepseek-v3")
    h, f, fe, e, k = model.hidden, model.ffn_size, model.expert_size, model.experts, model.top_k
    c = compare(model, Plan(**DS_PLAN), 4096, stage=stage, trace=deepseek_step)
    for item, (diff, parts) in _explained(c).items():
        assert diff == pytest.approx(parts, rel=1e-12, abs=1e-3), item
    dense, moe = (3, 1) if stage == 0 else (0, 3)  # 61 layers: thirteen stages of 4 (three dense first), three of 3
    weights, acts = c["rows"][0]["parts"], c["rows"][3]["parts"]
    third = "gated MLPs' third matrix (the step's MLPs have two)"
    assert weights[third] == 2 * (dense * h * f + moe * (e // 64) * h * fe)
    assert weights["shared experts (the step has none)"] == 2 * moe * 3 * h * fe
    held = 16 - stage  # 1F1B: micro-batches in flight on this stage
    assert acts[third] == pytest.approx(held * 2 * 4096 * (dense * f + moe * k * fe))
    assert acts["shared experts (the step has none)"] == pytest.approx(held * 2 * 3 * fe * 4096 * moe)
    ep = {(t["axis"], t["op"]): t for t in c["traffic"]}[("ep", "all_to_all")]
    away = 4096 * k - 4096 * 4 // 32  # balanced: picks 32 experts apart, so a token meets GPU 0 iff t mod 32 < 4
    # the busiest GPU (a stage of four MoE layers) meets 4 of a token's 32 residues: the rows away are the
    # estimate's K x T x 63/64 copies, and dispatch and its backward carry 4 gate values a row, 2 bytes each
    assert ep["parts"] == {
        "a token goes once per GPU holding its picks (the estimate sends each of its K copies)": 0.0,
        "the gates ride with the dispatched rows and their gradients (E/ep values a row)": -4 * 16 * 2 * 2 * 4 * away}
    assert away == 4096 * k * 63 / 64


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_memory_and_fit_print_the_run_beside_the_estimate(capsys):
    code, out, err = _cli(capsys, "memory", "--model", "27b", "--tp", "8", "--sp", "--cp", "2", "--recompute", "full",
                          "--seq", "4096", "--symbolic", "--json")
    assert code == 0 and "symbolic ranks" in err
    run = json.loads(out)["run"]
    acts = run["rows"][3]
    assert acts["estimate"] - acts["run"] == pytest.approx(sum(acts["parts"].values()))
    assert set(acts["parts"]) == {"dropout masks under CP (the engine models none)",
                                  "room to re-run 2 layers at once (the step re-runs one)"}
    code, out, _ = _cli(capsys, "memory", "--model", "27b", "--tp", "8", "--sp", "--seq", "4096", "--symbolic")
    assert code == 0 and "against one step on symbolic ranks: GPU 0" in out and "embeddings" in out
    code, out, _ = _cli(capsys, "fit", "--model", "27b", "--tp", "8", "--sp", "--symbolic", "--json")
    got = json.loads(out)
    assert code == 0 and [row["fits"] for row in got["lengths"]] == [True, False]
    code, out, _ = _cli(capsys, "fit", "--model", "27b", "--tp", "8", "--sp", "--symbolic")
    assert code == 0 and "fits" in out and "does NOT fit" in out


@pytest.mark.parametrize("argv, why", [
    (["memory", "--model", "27b", "--tp", "8", "--zero", "3", "--symbolic"], "cannot run ZeRO-3"),
    (["memory", "--model", "27b", "--tp", "8", "--recompute", "selective", "--symbolic"], "selective recomputation"),
    (["memory", "--model", "27b", "--tp", "8", "--micro-batch", "2", "--symbolic"], "several sequences"),
    (["memory", "--model", "27b", "--tp", "8", "--cp", "2", "--seq", "4100", "--symbolic"], "a multiple of 32"),
    (["fit", "--model", "27b", "--search", "--symbolic"], "--symbolic runs one layout"),
    (["memory", "--model", "27b", "--tp", "8", "--symbolic", "--routing", "sideways"], "routing must be"),
    (["memory", "--model", "moe16", "--tp", "2", "--sp", "--ep", "2", "--symbolic", "--routing", "uniform"],
     "needs balanced routing"),
], ids=["zero3", "selective", "micro-batch", "seq", "search", "routing", "unfoldable"])
def test_what_the_step_cannot_run_gets_one_line(capsys, argv, why):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_symbolic_run_counts_its_matmul_flops():
    """A TP-2 MLP on 16 tokens (h 8, width 32), forward and backward: each rank does its half of the two
    matmuls forward (2 x 16 x 8 x 16 multiply-adds each) and twice that backward (dx and dW)."""
    import parasim
    from parasim.nn import ParallelContext, Saved
    from parasim.nn.mlp import ParallelMLP

    def program(ctx):
        tp = ParallelContext(ctx, ctx.new_group([0, 1], "tp"))
        draw = ctx.shared_rng
        mlp = ParallelMLP(tp, draw("w1").normal((8, 32)), draw("w2").normal((32, 8)), None, None)
        y, cache = mlp.forward(draw("x").normal((16, 8)), Saved())
        mlp.backward(cache, y)
    forward = 2 * (2 * 16 * 8 * 16)
    assert parasim.run(program, 2, backend="symbolic").trace.meta["flops"] == [3 * forward] * 2
    assert "flops" not in parasim.run(program, 2).trace.meta  # virtual ranks count nothing


def test_each_gpus_step_time_from_what_the_run_counted():
    """The 27B model (60 layers) on PP 4 at 4,096 tokens, on the clock: GPU 0 computes what the run counted,
    each product at the share of peak its shape measures, and its TP all-gathers stay on NVLink, at the measured bus bandwidth, with
    the step's BF16 bytes as sent (a run at real size computes in its precision's dtypes)."""
    from parasim.clock.costs import machine
    from parasim.clock.timeline import simulate
    from parasim.train.against import run_plan
    model, plan = get_model("27b"), Plan(tp=2, sp=True, pp=4)
    trace = run_plan(model, plan, 4096, 0)
    tl = simulate(trace, machine("h200"))
    work = [m.work for e in trace.events for m in e.members if m.rank == 0 and m.work]
    work += [trace.meta.get("tail_work", [{}] * trace.world)[0]]
    from parasim.estimate.kernels import attention_efficiency, gemm_efficiency

    def share(kind, m, n, k):  # a weight's product by its shape; QK^T and PV by sequence (the longer) and head
        if kind == "attention":
            return attention_efficiency("h200", max(n, k), min(n, k), True, None).value
        return gemm_efficiency("h200", m, n, k).value
    by_hand = sum(c * 2 * m * n * k / (989e12 * share(kind, m, n, k))
                  for w in work for (kind, m, n, k), c in getattr(w, "gemms", {}).items())
    assert all(sum(c * 2 * m * n * k for (kd, m, n, k), c in getattr(w, "gemms", {}).items() if kd == kind) == f
               for w in work for kind, f in w.items())  # every FLOP the run counted has its product's shape
    assert tl.busy[0] == pytest.approx(by_hand)
    assert sum(sum(w.values()) for w in work) == trace.meta["flops"][0]
    gathers = [e for e in trace.events if e.group.name == "tp" and e.op == "all_gather" and 0 in e.ranks]
    e = gathers[0]
    sent = e.member(0).sent
    assert sent == 4096 // 2 * model.hidden * 2  # the other TP rank's half of the tokens, 2 bytes a value
    start, end = tl.events[e.seq]
    # TP 2: each member moves its half of a 2 x sent buffer, at the bus bandwidth nccl-tests measured for an
    # all-gather of that size between two GPUs of a node (which holds its latency too)
    from parasim.estimate.kernels import collective_bandwidth
    assert end - start == pytest.approx(sent / collective_bandwidth("h200", "all_gather", 2 * sent, "inside", 2).value)


def test_the_gpu_view_tells_its_time_and_the_slowest_gpu(capsys):
    code = main(["trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3", "--json"])
    got = json.loads(capsys.readouterr().out)
    t = got["time"]
    assert code == 0 and t["this"]["rank"] == 3 and t["gpu"] == "H200"
    assert t["step_s"] > t["this"]["compute_s"] > 0
    assert t["busiest"]["compute_s"] >= t["this"]["compute_s"]
    assert t["critical"]["compute"] + t["critical"]["comm"] == pytest.approx(t["step_s"])
    # megatron-8.3b: 512 GPUs, TP 8, DP 64, one micro-batch (its pp) of 4,096 tokens per replica
    assert t["tokens_per_s_per_gpu"] == pytest.approx(4096 * 1 * 64 / t["step_s"] / 512)
    assert 0 < t["mfu"] < 1
    assert main(["trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3", "--gpu-model", "tpu"]) == 2
    assert "unknown --gpu-model 'tpu'" in capsys.readouterr().err

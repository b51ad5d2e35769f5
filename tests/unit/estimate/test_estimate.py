"""The estimator against the post's figures (the nine-row longest-sequence table within 6% per row, the
ZeRO table, the side figures), and its command line: JSON answers, every bad input exit 2 in one line."""
import json
import subprocess
import sys

import pytest

from parasim.cli import main
from parasim.errors import UsageError
from parasim.estimate import Plan, breakdown, fit, get_model
from parasim.estimate.fit import enumerate_plans, longest, parse_nodes, search, solve
from parasim.estimate.models import from_hf_config
from parasim.layout import ModelSpec
from parasim.estimate.traffic import attention_flops, dp_traffic, gpu_presets, step_traffic

M27 = get_model("27b")
USABLE = 120e9

# The post's table: (flags, model state GB, longest sequence in K tokens)
POST_TABLE = [
    ("--tp 8", 54, 13), ("--tp 8 --sp", 54, 40), ("--tp 4 --sp --cp 2", 68, 32), ("--tp 2 --sp --pp 4", 54, 10),
    ("--tp 8 --sp --recompute", 54, 310), ("--tp 8 --sp --dp 2", 34, 53), ("--tp 8 --sp --pp 2", 27, 59),
    ("--tp 8 --sp --cp 2", 34, 105), ("--tp 8 --sp --cp 2 --recompute", 34, 820),
]


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("flags, state_gb, post_k", POST_TABLE)
def test_nine_row_table_within_6_percent(capsys, flags, state_gb, post_k):
    code, out, err = run_cli(capsys, "fit", "--model", "27b", *flags.split(), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert abs(got["max_seq_tokens"] / (post_k * 1000) - 1) <= 0.06
    assert round(got["model_state"]) == state_gb
    assert got["unit"] == "GB" and got["usable"] == 120


def test_the_table_with_gpus_flag(capsys):
    code, out, _ = run_cli(capsys, "fit", "--model", "27b", "--gpus", "8", "--tp", "8", "--sp", "--json")
    assert code == 0 and abs(json.loads(out)["max_seq_tokens"] / 40000 - 1) <= 0.06


@pytest.mark.parametrize("zero, post_gb", [(0, 432), (1, 148.5), (2, 101), (3, 54)])
def test_zero_table(capsys, zero, post_gb):
    code, out, _ = run_cli(capsys, "memory", "--model", "27b", "--zero", str(zero), "--dp", "8", "--json")
    got = json.loads(out)
    assert code == 0
    assert abs(got["model_state"] - post_gb) < 0.5  # the post truncates 101.25 to 101
    assert got["items"]["weights"] + got["items"]["gradients"] + got["items"]["optimizer"] == got["model_state"]


def test_bytes_per_param_and_zero3_traffic_ratio():
    assert breakdown(M27, Plan(zero=0), 1).model_state / M27.total_params() == 16
    assert breakdown(M27, Plan(dp=8, zero=1), 1).model_state / M27.total_params() == 5.5
    assert breakdown(M27, Plan(dp=8, zero=2), 1).model_state / M27.total_params() == 3.75
    dp0 = sum(dp_traffic(1e9, 8, 0).values())
    assert sum(dp_traffic(1e9, 8, 1).values()) == dp0  # ZeRO-1/2: RS + AG = the all-reduce
    assert sum(dp_traffic(1e9, 8, 3).values()) / dp0 == 1.5


def test_activation_worked_example():
    """s = 4096, b = 1: 34 sbh per layer = 0.86 GB; 5as/h = 160; 60 layers 293 GB naive, 51 GB flash."""
    sbh = 4096 * 6144
    kw = dict(tp=1, sp=False, cp=1, pp=1, dp=1, zero=0)
    flash = breakdown(M27, Plan(**kw), 4096).items["activations"]
    naive = breakdown(M27, Plan(**kw, flash=False), 4096).items["activations"]
    assert flash / 60 == 34 * sbh and round(flash / 60 / 1e9, 2) == 0.86
    assert (naive - flash) / 60 / sbh == 5 * 48 * 4096 / 6144
    assert round(naive / 1e9) == 293 and round(flash / 1e9) == 51


def test_side_figures():
    rec = fit(M27, Plan(tp=8, sp=True, recompute="full"), USABLE)
    assert abs(rec.at_max.items["logits"] / 1e9 / 20 - 1) <= 0.06  # logits at the recompute length: ~20 GB
    chunked = fit(M27, Plan(tp=8, sp=True, recompute="full", chunked_loss=True), USABLE)
    assert abs(chunked.seq / 450e3 - 1) <= 0.06  # chunked loss: ~450K
    flops = attention_flops(M27, rec.seq, "full")
    assert abs(flops / 2.9e17 - 1) <= 0.06
    h200 = gpu_presets()["h200"]
    minutes = flops / (8 * h200.peak_flops * 0.4) / 60
    assert abs(minutes / 1.5 - 1) <= 0.06
    assert h200.peak_flops == 989e12 and h200.usable == 120e9


def test_what_the_table_says():
    seq = {f: fit(M27, Plan(**kw), USABLE).seq for f, kw in
           {"tp8": dict(tp=8), "sp": dict(tp=8, sp=True), "dp2": dict(tp=8, sp=True, dp=2),
            "cp2": dict(tp=8, sp=True, cp=2), "pp4": dict(tp=2, sp=True, pp=4)}.items()}
    assert round(seq["sp"] / seq["tp8"]) == 3  # SP: about 3x for free
    assert abs(seq["cp2"] / seq["dp2"] - 2) < 1e-3  # CP2 doubles what DP2 reaches
    assert seq["pp4"] == min(seq.values())  # PP buys no length


def test_gib_flag(capsys):
    _, gb, _ = run_cli(capsys, "fit", "--model", "27b", "--tp", "8", "--sp", "--json")
    _, gib, _ = run_cli(capsys, "fit", "--model", "27b", "--tp", "8", "--sp", "--gib", "--usable", "120", "--json")
    assert json.loads(gib)["unit"] == "GiB" and json.loads(gib)["max_seq_tokens"] > json.loads(gb)["max_seq_tokens"]


def test_search_names_the_best_layout_per_node_count(capsys):
    code, out, err = run_cli(capsys, "fit", "--model", "27b", "--search", "--nodes", "1-64", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert [r["nodes"] for r in got["nodes"]] == list(range(1, 65))
    for r in got["nodes"]:
        assert r["best"]["max_seq_tokens"] == max(x["max_seq_tokens"] for x in r["top"])
        assert r["best"]["world"] == 8 * r["nodes"]
    # one node: the best of the post's one-node rows is TP8 + SP + full recomputation
    one = got["nodes"][0]["best"]
    assert (one["tp"], one["sp"], one["recompute"]) == (8, True, "full")
    assert one["max_seq_tokens"] == fit(M27, Plan(tp=8, sp=True, recompute="full"), USABLE).seq


def test_search_agrees_with_single_fits():
    plans = enumerate_plans(M27, range(1, 3))
    seqs = longest(M27, plans, USABLE)
    for i in range(0, len(plans), max(1, len(plans) // 40)):
        p = plans.plan(i)
        assert abs(fit(M27, p, USABLE).seq - int(seqs[i])) <= 1, p


def test_search_on_moe_and_plot(tmp_path, capsys):
    res = search(get_model("deepseek-v3"), range(1, 3), USABLE)
    assert res["layouts_tried"] > 0 and all(r["best"] for r in res["nodes"])
    png = tmp_path / "search.png"
    code, _, err = run_cli(capsys, "fit", "--model", "27b", "--search", "--nodes", "1-4", "--plot", str(png))
    assert code == 0, err
    assert png.stat().st_size > 1000


def test_memory_table_and_plot(tmp_path, capsys):
    png = tmp_path / "mem.png"
    code, out, err = run_cli(capsys, "memory", "--model", "27b", "--tp", "8", "--sp", "--seq", "40K", "--plot",
                             str(png))
    assert code == 0, err
    assert "activations" in out and "optimizer" in out and png.stat().st_size > 1000


def test_memory_json_has_traffic_and_time(capsys):
    code, out, _ = run_cli(capsys, "memory", "--model", "27b", "--tp", "8", "--sp", "--cp", "2", "--dp", "2",
                           "--zero", "3", "--seq", "100000", "--json")
    got = json.loads(out)
    assert code == 0 and got["traffic"]["cp p2p"] > 0 and got["traffic"]["dp all_gather"] > 0
    t = got["time"]
    assert t["step_s"] > t["per_microbatch_s"] > 0 and 0 < t["mfu"] < 1 and t["tokens_per_s_per_gpu"] > 0


def test_solve():
    assert solve(10.0, 2.0, 0.0, 30.0) == 10.0
    assert solve(10.0, 0.0, 1.0, 35.0) == 5.0
    assert solve(40.0, 2.0, 0.0, 30.0) == 0.0


def test_hf_config(tmp_path):
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu", "rope_scaling": {"x": 1}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = from_hf_config(str(path))
    assert (m.layers, m.hidden, m.heads, m.kv, m.ffn_size, m.gated) == (32, 4096, 32, 8, 14336, True)
    assert abs(m.total_params() / 8.03e9 - 1) < 0.01  # Llama-3-8B's shapes
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**cfg, "num_local_experts": 8, "num_experts_per_tok": 2}))
    assert from_hf_config(str(moe)).experts == 8


@pytest.mark.parametrize("args, needle", [
    (["fit", "--model", "99b"], "unknown model"),
    (["fit", "--model", "27b", "--tp", "5"], "heads 48 do not divide by tp 5"),
    (["fit", "--model", "27b", "--pp", "7"], "do not divide by pp 7"),
    (["fit", "--model", "27b", "--tp", "8", "--gpus", "12"], "world 12 is not divisible by tp*cp*pp = 8"),
    (["fit", "--model", "27b", "--tp", "8", "--dp", "2", "--gpus", "8"], "dp 2 does not fit: world 8"),
    (["fit", "--model", "27b", "--search", "--nodes", "0-4"], "--nodes"),
    (["fit", "--model", "27b", "--search", "--nodes", "8-2"], "--nodes"),
    (["fit", "--model", "27b", "--search", "--nodes", "x"], "--nodes"),
    (["fit", "--model", "27b", "--plot", "x.png"], "--search"),
    (["memory", "--model", "27b", "--seq", "-3"], "--seq"),
    (["memory", "--model", "27b", "--zero", "4"], "--zero"),
    (["memory", "--model", "27b", "--gpu", "tpu"], "unknown GPU"),
    (["memory", "--model", "27b", "--sp"], "sequence parallelism needs tp"),
    (["memory", "--model", "27b", "--config", "c.json"], "not --model and --config"),
    (["memory"], "which model"),
    (["memory", "--layers", "4", "--hidden", "8"], "--heads, --vocab"),
    (["memory", "--config", "/no/such/config.json"], "cannot read"),
    (["memory", "--model", "27b", "--plot", "/no/such/dir/x.png"], "cannot write"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_hf_config_missing_field_exits_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}))
    code, _, err = run_cli(capsys, "memory", "--config", str(path))
    assert code == 2 and "num_hidden_layers" in err and err.count("\n") == 1
    path.write_text("{not json")
    code, _, err = run_cli(capsys, "memory", "--config", str(path))
    assert code == 2 and "not JSON" in err


def test_models_and_plans_reject_nonsense():
    with pytest.raises(UsageError):
        ModelSpec("x", layers=2, hidden=10, heads=4, vocab=8)
    with pytest.raises(UsageError):
        Plan(zero=5)
    with pytest.raises(UsageError):
        Plan(recompute="half")
    with pytest.raises(UsageError):
        parse_nodes("3-1")


def test_traffic_keys_by_axis():
    t = step_traffic(M27, Plan(tp=8, sp=True, pp=2, dp=2, zero=1), 8192)
    assert {k[0] for k in t} == {"tp", "pp", "dp"}
    assert set(step_traffic(M27, Plan(tp=8), 8192)) == {("tp", "all_reduce")}


def test_help_and_no_torch():
    for cmd in ("memory", "fit"):
        out = subprocess.run([sys.executable, "-m", "parasim", cmd, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "--json" in out.stdout and "--gib" in out.stdout
    code = "import parasim.estimate, sys; assert 'torch' not in sys.modules and 'parasim.comm.virtual' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("name", ["memory", "longest-sequence"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_estimator_lessons_check_out(name, world):
    from parasim.lesson import get_lesson, run_lesson
    lr = run_lesson(get_lesson(name), world)
    assert lr.checks and all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_longest_sequence_lesson_matches_the_post():
    from parasim.lesson import get_lesson, run_lesson
    rows = run_lesson(get_lesson("longest-sequence"), 2).result.values[0]["table"]["rows"]
    assert len(rows) == len(POST_TABLE)
    for r, (_, state_gb, post_k) in zip(rows, POST_TABLE):
        assert abs(r["seq"] / (post_k * 1000) - 1) <= 0.06 and round(r["state_gb"]) == state_gb


@pytest.mark.parametrize("pp, m", [(4, 1), (4, 2), (4, 3), (4, 4), (4, 8), (2, 1), (8, 3)])
def test_in_flight_microbatches_follow_1f1b_peaks(pp, m):
    """Stage i of 1F1B holds min(pp - i, m) micro-batches, fewer than pp when m < pp: the estimator's
    in-flight item is (held - 1) micro-batches' activations, with `held` taken from the simulated schedule."""
    from parasim.estimate.memory import items
    from parasim.pipeline.schedules import generate
    from parasim.pipeline.timing import time_schedule
    model = get_model("27b")
    plan = Plan(tp=2, sp=True, pp=pp, microbatches=m)
    peaks = time_schedule(generate("1f1b", pp, m)).peak
    for stage in range(pp):
        got = items(model, plan, stage)
        act, flight = got["activations"], got["in-flight micro-batches"]
        assert float(flight[1]) == pytest.approx((peaks[stage] - 1) * float(act[1]), rel=1e-12), stage
        assert float(flight[2]) == pytest.approx((peaks[stage] - 1) * float(act[2]), rel=1e-12, abs=0), stage
    assert peaks[0] == min(pp, m)  # the schedule itself: the first stage holds min(pp, m)

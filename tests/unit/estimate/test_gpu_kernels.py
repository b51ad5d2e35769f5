"""scripts/gpu_kernels.py (the kernel sweep a GPU machine runs) on CPU: the shapes it lists come from parasim's
models and layouts (worked out here from the models' published sizes), the budget leaves items out and says
so, a tiny run on the CPU writes the whole file, and without a GPU it refuses in one line."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable


def _load():
    spec = importlib.util.spec_from_file_location("gpu_kernels", ROOT / "scripts" / "gpu_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_kernels"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gk = _load()


def run(*args, env=None, timeout=300):
    return subprocess.run([PY, str(ROOT / "scripts" / "gpu_kernels.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def strict(text):
    def bad(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=bad)


@pytest.fixture(scope="module")
def planned():
    items, left = gk.plan()
    return items, left


def products_of(items):
    return {(i.sizes["m"], i.sizes["k"], i.sizes["n"]): i for i in items if i.kind == "matmul" and i.name == "bf16"}


# ---------------------------------------------------------------------------------------------
# What it times

def test_the_products_are_the_models_shapes_after_their_splits(planned):
    """By hand from the models' sizes: the 27B (hidden 6144, 48 heads of 128) at TP8 on 4096 tokens;
    Megatron's 8.3B (hidden 3072, MLP 4 x 3072) at TP8; DeepSeek-V3's experts (hidden 7168, 256 experts of
    2048, top 8, gated) at EP64: 4096 tokens x 64 ranks x 8 / 256 experts = 8192 tokens per expert; the toy's
    experts (hidden 8, 8 experts, top 2) at CP2 and EP4: 4 tokens x 4 x 2 / 8 = 4."""
    got = products_of(planned[0])
    assert "27b-tp8: QKV" in got[(4096, 6144, (48 + 2 * 48) * 128 // 8)].sources
    assert "27b-tp8: attention output" in got[(4096, 6144 // 8, 6144)].sources
    assert "megatron-8.3b: MLP down" in got[(4096, 4 * 3072 // 8, 3072)].sources
    assert "deepseek-v3: expert up" in got[(8192, 7168, 2 * 2048)].sources  # gate and up as one product
    assert "deepseek-v3: expert down" in got[(8192, 2048, 7168)].sources
    assert {"moe16: expert up", "moe16: expert down"} <= set(got[(4, 8, 8)].sources)
    assert "27b (one GPU): logits" in got[(4096, 6144, 131072)].sources


def test_the_longest_sequence_rows_give_their_tokens_split_over_cp(planned):
    """The nine rows of the post's table, at the longest sequence parasim's estimator finds for each."""
    from parasim.estimate import Plan, fit, get_model
    from parasim.estimate.fit import LONGEST_ROWS
    from parasim.estimate.traffic import gpu_presets
    got = products_of(planned[0])
    model = get_model("27b")
    for _, label, kw in LONGEST_ROWS:
        f = fit(model, Plan(**kw), gpu_presets()["h200"].usable)
        qkv = got[(f.seq // kw.get("cp", 1), 6144, (48 + 96) * 128 // kw["tp"])]
        assert any(s.startswith(f"27b longest sequence, {label} (") and s.endswith(": QKV") for s in qkv.sources), label


def test_each_product_is_timed_once_and_in_fp8_where_its_sizes_allow(planned):
    items, left = planned
    bf16 = [(i.sizes["m"], i.sizes["k"], i.sizes["n"]) for i in items if i.kind == "matmul" and i.name == "bf16"]
    fp8 = [(i.sizes["m"], i.sizes["k"], i.sizes["n"]) for i in items if i.kind == "matmul" and i.name == "fp8"]
    assert len(bf16) == len(set(bf16))
    assert set(fp8) == {p for p in bf16 if p[1] % 16 == 0 and p[2] % 16 == 0}
    assert {(x["m"], x["k"], x["n"]) for x in left if x.get("name") == "fp8"} == set(bf16) - set(fp8)
    assert (4, 8, 8) in set(bf16) - set(fp8)  # the toy's sizes


def test_attention_covers_every_backend_over_the_models_heads(planned):
    items = [i for i in planned[0] if i.kind == "attention"]
    pairs = {(i.sizes["heads"], i.sizes["head_dim"]) for i in items}
    # 27B: 48 heads of 128 over TP 8, 4, 2, 1; Megatron 8.3B: 32 of 96 over TP 8 and 1; DeepSeek-V3: 128 of 56;
    # Llama 3 405B: 128 of 128 over TP 8
    assert {(6, 128), (12, 128), (24, 128), (48, 128), (4, 96), (32, 96), (128, 56), (16, 128)} == pairs
    assert {(i.name, i.sizes["seq"]) for i in items} == {(b, s) for b in ("flash", "cudnn", "efficient")
                                                        for s in (2048, 8192, 32768)}
    assert all(i.sizes["causal"] for i in items)
    first = next(i for i in items if i.sizes == {"seq": 2048, "heads": 6, "head_dim": 128, "causal": True,
                                                 "dtype": "bfloat16"})
    assert first.work == 2.0 * 2048 ** 2 * 6 * 128  # 4 s^2 h d, half of it masked


def test_a_cap_on_products_leaves_the_rest_out_and_says_so():
    items, left = gk.plan(cap=5)
    assert len([i for i in items if i.kind == "matmul" and i.name == "bf16"]) == 5
    capped = [x for x in left if x["why"] == "past the cap of 5 distinct products"]
    assert capped and all(x["kind"] == "matmul" for x in capped)


# ---------------------------------------------------------------------------------------------
# The budget

def test_the_budget_keeps_what_fits_by_the_estimates_and_names_the_rest():
    items = [gk.Item("matmul", "bf16", {"m": i}, 1.0, "flop") for i in range(4)]
    for it, s in zip(items, (5.0, 10.0, 3.0, 2.0)):
        it.estimate_s = s
    kept, skipped = gk.within(items, gk.START_S + 9.0)
    assert [i.sizes["m"] for i in kept] == [0, 2]  # 5 + 3 = 8; the 10 would pass 9, the last 2 too (8 + 2)
    assert [(s["m"], s["why"]) for s in skipped] == [
        (1, f"--budget {gk.START_S + 9:g} s: estimated 10.00 s would take the estimate to {gk.START_S + 15:.1f} s"),
        (3, f"--budget {gk.START_S + 9:g} s: estimated 2.00 s would take the estimate to {gk.START_S + 10:.1f} s")]


def test_the_estimates_follow_parasims_h200_figures():
    """A 4096-cube product: its FLOPs over 989e12 at the share the H200's GEMM table gives that shape (fp8 at
    twice the peak, at fp8's share); attention at FlashAttention's forward share; a copy: its bytes over
    4.8e12 at the streaming kernel's share (estimate/kernels.py, read here directly)."""
    from parasim.estimate.kernels import attention_efficiency, gemm_efficiency, memory_efficiency
    n = 4096
    sizes = {"m": n, "n": n, "k": n}
    mm = gk.Item("matmul", "bf16", sizes, 2 * n ** 3, "flop")
    f8 = gk.Item("matmul", "fp8", sizes, 2 * n ** 3, "flop")
    at = gk.Item("attention", "flash", {"seq": 8192, "head_dim": 128}, 1e15, "flop")
    cp = gk.Item("copy", "c", {}, 4.8e12, "byte")
    gk.estimate([mm, f8, at, cp], warmup=1, repeats=2)
    bf16 = 2 * n ** 3 / (989e12 * gemm_efficiency("h200", n, n, n).value)
    fp8 = 2 * n ** 3 / (2 * 989e12 * gemm_efficiency("h200", n, n, n, "fp8").value)
    attn = 1e15 / (989e12 * attention_efficiency("h200", 8192, 128, True, False).value)
    assert mm.estimate_s == pytest.approx(gk.EACH_S + 3 * max(bf16, gk.KERNEL_FLOOR_S))
    assert f8.estimate_s == pytest.approx(gk.EACH_S + 3 * max(fp8, gk.KERNEL_FLOOR_S))
    assert at.estimate_s == pytest.approx(gk.EACH_S + gk.PLAN_S + 3 * attn)
    assert cp.estimate_s == pytest.approx(gk.EACH_S + 3 * 1.0 / memory_efficiency("h200", "scale").value)


def test_once_the_budget_is_spent_the_rest_are_skipped(tmp_path):
    torch = pytest.importorskip("torch")
    items, _ = gk.plan(tiny=True)
    gk.estimate(items, 1, 1)
    ticks = iter([0.0, 0.0, 0.0, 500.0] + [500.0] * 50).__next__  # start, two items' checks, then past the budget
    done = gk.sweep(torch, torch.device("cpu"), items, [], 100.0, 1, 1, clock=ticks)
    assert [r["kind"] for r in done["items"]] == [items[0].kind, items[1].kind]
    assert [s["kind"] for s in done["skipped"]] == [i.kind for i in items[2:]]
    assert all(s["why"] == "out of time: 500.0 s of --budget 100 s spent" for s in done["skipped"])


def test_the_file_is_written_after_every_item_so_a_stopped_sweep_leaves_its_results():
    torch = pytest.importorskip("torch")
    items, _ = gk.plan(tiny=True)
    items = items[:3]
    gk.estimate(items, 1, 1)
    saved = []
    done = gk.sweep(torch, torch.device("cpu"), items, [{"kind": "x", "why": "before"}], 1000.0, 1, 1,
                    save=lambda part: saved.append(json.loads(json.dumps(part))))
    assert [(s["complete"], len(s["items"]), [k["why"] for k in s["skipped"]]) for s in saved] == [
        (False, 1, ["before", "not reached yet", "not reached yet"]), (False, 2, ["before", "not reached yet"]),
        (False, 3, ["before"]), (True, 3, ["before"])]
    assert done["complete"] is True and saved[-1]["items"] == json.loads(json.dumps(done["items"]))


# ---------------------------------------------------------------------------------------------
# The script as a whole

def test_the_dry_run_needs_no_torch(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch on this machine')\n")
    out = run("--dry-run", env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("on an H200 (parasim's figures; 20 s to start):") and "items, estimated" in lines[0]
    assert any("matmul      bf16" in x and "m=4,096 k=6,144 n=2,304" in x and "[27b-tp8: QKV and" in x for x in lines)
    assert any(x.startswith("  skipped: matmul fp8 m=4 k=8 n=8") for x in lines)


def test_a_small_budget_skips_items_in_the_dry_run():
    out = run("--dry-run", "--budget", "30")
    assert out.returncode == 0
    kept = [x for x in out.stdout.splitlines()[1:] if not x.startswith("  skipped")]
    cut = [x for x in out.stdout.splitlines() if "--budget 30 s: estimated" in x]
    assert kept and cut
    total = sum(float(x.rsplit("~", 1)[1].split(" s")[0]) for x in kept)
    assert gk.START_S + total <= 30.0 + 0.01 * len(kept)  # the printed estimates are rounded to 0.01 s


def test_the_tiny_run_on_the_cpu_writes_the_whole_file(tmp_path):
    pytest.importorskip("torch")
    dest = tmp_path / "k.json"
    out = run("--device", "cpu", "--tiny", "--out", str(dest))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpu_kernels: 11 of 12 items timed, 0 skipped")
    got = strict(dest.read_text())
    assert got["format"] == "parasim-gpu-kernels/1" and got["complete"] is True
    prov = got["provenance"]
    assert {"date", "git_commit", "torch", "cuda", "python", "device", "driver", "device_kind"} <= set(prov)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert prov["git_commit"] == head.stdout.strip()
    assert prov["device_kind"] == "cpu" and prov["date"].endswith("+00:00")
    assert got["settings"]["tiny"] is True and (got["settings"]["warmup"], got["settings"]["repeats"]) == (1, 3)
    kinds = {(i["kind"], i["name"]) for i in got["items"]}
    assert {("copy", "device-to-device copy"), ("elementwise", "add"), ("norm", "layer_norm"), ("matmul", "bf16"),
            ("matmul", "fp8"), ("attention", "math"), ("host", "launch"), ("host", "sync"), ("host", "moe-dropless"),
            ("host", "moe-static")} == kinds
    for item in got["items"]:
        if item["name"] == "fp8":
            assert item["error"] == "fp8 products run on CUDA GPUs only" and "median_s" not in item
            continue
        assert len(item["times_s"]) == 3 and item["median_s"] == sorted(item["times_s"])[1]
        if item["unit"] == "op":  # a launch or a synchronisation: microseconds each
            assert item["us_per_op"] == pytest.approx(item["median_s"] / item["work"] * 1e6) and "tflops" not in item
            continue
        rate = item["tflops"] if item["unit"] == "flop" else item["gb_per_s"]
        assert rate == pytest.approx(item["work"] / item["median_s"] / (1e12 if item["unit"] == "flop" else 1e9))
    assert got["clocks"]["source"] is None and "no SM clock" in got["clocks"]["why_not"]


def test_without_a_gpu_it_refuses_in_one_line():
    pytest.importorskip("torch")
    out = run()
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no CUDA GPU visible" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("args, words", [(["--budget", "0"], "from 1 to 3600"), (["--budget", "nan"], "from 1 to 3600"),
                                         (["--device", "cpu"], "--device cpu times only the --tiny items"),
                                         (["--device", "tpu"], "invalid choice")],
                         ids=["zero", "nan", "cpu-without-tiny", "tpu"])
def test_bad_flags_are_one_line_and_exit_2(args, words):
    out = run(*args)
    assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# The parts only a GPU runs, with torch's CUDA faked

def test_cuda_events_time_each_repeat_after_the_warm_up():
    calls = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = len(calls)

        def synchronize(self):
            calls.append("sync")

        def elapsed_time(self, end):
            return 2.5  # milliseconds

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: calls.append("all")))
    time_it = gk.timer(torch, SimpleNamespace(type="cuda"))
    got = time_it(lambda: calls.append("run"), 2, 3)
    assert got == [0.0025] * 3
    assert calls == ["run", "run", "all"] + ["run", "sync"] * 3


def test_nvidia_smi_samples_are_read_and_a_missing_value_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails
    monkeypatch.setattr(gk.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        return SimpleNamespace(stdout="1980, 1980, 512.25, 700.00, [N/A]\n", returncode=0)
    monkeypatch.setattr(gk.subprocess, "run", fake_run)
    clocks = gk.Clocks(every=60)
    clocks.now = "matmul bf16"
    clocks.sample()
    assert clocks.source == "nvidia-smi"
    assert seen[0][1:] == ["--id=0", f"--query-gpu={gk.QUERY}", "--format=csv,noheader,nounits"]
    sample = clocks.samples[0]
    assert (sample["during"], sample["sm_mhz"], sample["sm_max_mhz"], sample["power_w"], sample["power_limit_w"],
            sample["temp_c"]) == ("matmul bf16", 1980.0, 1980.0, 512.25, 700.0, None)
    summary = clocks.summary()
    assert summary["sm_mhz"] == {"min": 1980.0, "median": 1980.0, "max": 1980.0} and "temp_c" not in summary


def test_with_neither_pynvml_nor_nvidia_smi_it_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gk.shutil, "which", lambda name: None)
    with gk.Clocks(every=60) as clocks:
        pass
    assert clocks.summary()["source"] is None and clocks.samples == []
    assert clocks.summary()["why_not"] == "neither pynvml nor nvidia-smi is there: the clock and power were not read"


def test_fp8_before_hopper_is_refused_with_the_capability():
    cuda = SimpleNamespace(get_device_capability=lambda d: (8, 0))
    with pytest.raises(RuntimeError, match="compute capability 8.9 or above, this GPU has 8.0"):
        gk._fp8_product(SimpleNamespace(cuda=cuda), None, None, SimpleNamespace(type="cuda"))


def test_a_copy_without_git_takes_the_commit_it_is_told(monkeypatch):
    def no_git(*a, **kw):
        raise OSError("no git here")
    monkeypatch.setattr(gk.subprocess, "run", no_git)
    monkeypatch.setenv("PARASIM_COMMIT", "0123abc")
    assert gk._commit() == "0123abc"
    monkeypatch.delenv("PARASIM_COMMIT")
    assert gk._commit() is None


def test_the_host_items_are_the_moe_models_local_experts(planned):
    """deepseek-v3 at EP 8: 256 experts over 8 GPUs, each expert 4,096 tokens x 8 GPUs x top 8 / 256 = 1,024;
    a tiny kernel's launches and synchronisations first; the dropless and static layers alike but for the read."""
    items, _ = planned
    host = [i for i in items if i.kind == "host"]
    assert [i.name for i in host] == ["launch", "sync", "moe-dropless", "moe-static"] and items[:4] == host
    assert (host[0].sizes, host[0].work, host[0].unit) == ({"ops": 200}, 200.0, "op")
    assert (host[1].sizes, host[1].unit) == ({"syncs": 20}, "op")
    moe = host[2].sizes
    assert (moe["experts"], moe["tokens_per_expert"], moe["hidden"], moe["expert_ffn"]) == (32, 1024, 7168, 2048)
    assert host[2].work == 2.0 * 32 * 1024 * 7168 * 2048 * 3  # gate and up together, then down
    assert host[3].sizes == moe and host[3].work == host[2].work


def test_the_dropless_layer_reads_the_counts_and_both_give_the_experts_products():
    """On the CPU at a small size: both layers give every token its own expert's up, SwiGLU and down, back in
    token order; only the dropless one asks the device for the counts (.tolist)."""
    torch = pytest.importorskip("torch")
    gk = _load()
    calls = []
    items = gk.host_items(experts=3, tokens_per_expert=4, hidden=8, expert_ffn=4, ops=2, syncs=2)
    by = {i.name: i for i in items}
    torch.manual_seed(0)
    dropless = gk._host(torch, by["moe-dropless"], torch.device("cpu"))
    torch.manual_seed(0)
    static = gk._host(torch, by["moe-static"], torch.device("cpu"))
    real = torch.Tensor.tolist

    def counting(self):
        calls.append(tuple(self.shape))
        return real(self)
    torch.Tensor.tolist = counting
    try:
        a, b = dropless(), static()
    finally:
        torch.Tensor.tolist = real
    assert calls == [(3,)]  # the three experts' counts, once, from the dropless layer alone
    assert torch.equal(a, b)
    # by hand for token 0, from the same seed: its expert's up, SwiGLU, down
    torch.manual_seed(0)
    tokens = torch.randn(12, 8, dtype=torch.bfloat16)
    up = torch.randn(3, 8, 8, dtype=torch.bfloat16) / 8 ** 0.5
    down = torch.randn(3, 4, 8, dtype=torch.bfloat16) / 4 ** 0.5
    owner = torch.randperm(12) % 3
    e = int(owner[0])
    h = tokens[:1] @ up[e]
    gate, lin = h.chunk(2, dim=-1)
    ref = ((torch.nn.functional.silu(gate) * lin) @ down[e])[0].float()
    # bf16 keeps 8 significant bits: the batched and the one-row products may round their two products and the
    # SwiGLU apart by a few units in the last place of the largest value
    assert torch.allclose(a[0].float(), ref, rtol=0, atol=4 * 2.0 ** -8 * float(ref.abs().max()))

"""One memory model: `parasim trace --symbolic --gpu N` (a real-size step, one GPU's view) and
`parasim memory --symbolic` (the estimator beside the same step) run one step under one set of assumptions
(FlashAttention: no attention scores kept; dropout masks kept), so they give one peak for a GPU, say what
they assume, and say plainly when it is more than the GPU holds. Also the GPU view's words: whole weights
at TP 1 (no TP shards), and each expert list once."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import cli


def _flat(text: str) -> str:
    """The words, with rich's line wrapping and table borders undone."""
    return " ".join(re.sub(r"[│┃]", " ", text).split())


# GPU 128, the first of the second stage: DeepSeek-V3's 61 layers over 16 stages give the first its 3 dense
# layers and 1 MoE layer and the second 4 MoE layers, which keep the most (memory's binding stage)
DEEPSEEK = ("trace", "--symbolic", "--layout", "deepseek-v3", "--gpu", "128", "--routing", "balanced")


@pytest.fixture(scope="module")
def deepseek_json() -> dict:
    """The real-size GPU view, run once for the tests that read it (a 2,048-GPU step takes a while)."""
    out = cli(*DEEPSEEK, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def deepseek_text(deepseek_json) -> str:
    """The same view in words: the command's own renderer of that run (what `parasim trace` without --json
    prints; render/token_path.gpu_text reads the GPU's coordinates and stores from the view)."""
    from parasim.render.token_path import gpu_text
    view = deepseek_json
    return "\n".join(gpu_text(view, {"coords": view["coords"], "stores": view["stores"]}, "deepseek-v3",
                              "balanced"))


@pytest.mark.timeout(600)  # a symbolic DeepSeek-V3 step on 2,048 GPUs: minutes on a loaded two-core machine
def test_trace_and_memory_give_one_peak_for_deepseeks_binding_gpu(deepseek_json, deepseek_text):
    """The issue's two commands: the trace's peak for GPU 0 is the run figure `parasim memory` shows for it,
    in JSON and in words, and both say the attention scores are not kept."""
    memory = cli("memory", "--model", "deepseek-v3", "--pp", "16", "--ep", "64", "--gpus", "2048",
                 "--microbatches", "16", "--symbolic", "--json")
    assert memory.returncode == 0, memory.stderr
    peak, run = deepseek_json["peak"], json.loads(memory.stdout)["run"]
    assert run["gpu"] == 128 and run["stage"] == 1
    assert peak["bytes"] == run["run_total"]
    assert peak["assumes"]["flash"] is True and json.loads(memory.stdout)["layout"]["flash"] is True
    text = deepseek_text
    assert f"peak held: {run['run_total'] / 1e9:,.2f} GB" in text
    assert "attention scores not kept" in text


def _hand_27b_tp8(h: int = 6144, layers: int = 60, t: int = 8, s: int = 4096) -> int:
    """GPU 0 of the 27B model on TP 8 (one micro-batch of s tokens, DP 1), worked out from the sizes.

    Values a TP rank holds per layer: QKV h x 3h/t and its bias 3h/t, the output projection h/t x h and its
    bias h (whole), two LayerNorms (weight and bias, 4h), fc1 h x 4h/t and its bias 4h/t, fc2 4h/t x h and
    its bias h: 12h^2/t + 7h/t + 6h. Each value: 2 bytes of weight, 2 of gradient, 12 of Adam (fp32 master,
    m, v; ZeRO-1 over DP 1 keeps them all). Activations per token per layer, Korthikanti et al. with TP and
    no SP, the scores not kept (FlashAttention): h(10 + 24/t) bytes (2-byte values, 1-byte dropout masks)."""
    values = layers * (12 * h * h // t + 7 * h // t + 6 * h)
    return (2 + 2 + 12) * values + layers * s * h * (10 + 24 // t)


def test_both_commands_give_the_hand_worked_peak():
    trace = cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--json")
    memory = cli("memory", "--model", "27b", "--tp", "8", "--symbolic", "--json")
    assert trace.returncode == 0 and memory.returncode == 0, trace.stderr + memory.stderr
    want = _hand_27b_tp8()
    assert json.loads(trace.stdout)["peak"]["bytes"] == want
    assert json.loads(memory.stdout)["run"]["run_total"] == want


def test_keeping_the_scores_is_a_choice_both_commands_take_and_say():
    """--no-flash keeps the s x s scores in both: 2 bytes for the softmax, 1 for its dropout mask, 2 for the
    dropped output, per head of this TP rank, per query token and key, in every layer."""
    trace = cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--no-flash", "--json")
    memory = cli("memory", "--model", "27b", "--tp", "8", "--symbolic", "--no-flash", "--json")
    scores = 60 * (48 // 8) * (2 + 1 + 2) * 4096 * 4096
    assert json.loads(trace.stdout)["peak"]["bytes"] == _hand_27b_tp8() + scores
    assert json.loads(memory.stdout)["run"]["run_total"] == _hand_27b_tp8() + scores
    text = cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--no-flash").stdout
    assert "attention scores kept" in text


def test_more_than_the_gpu_holds_is_said_plainly():
    """74 GB on an A100 80GB (68 GB left for training): both commands say it does not fit."""
    trace = cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--gpu-model", "a100")
    assert trace.returncode == 0, trace.stderr
    assert "more than the GPU holds" in _flat(trace.stdout)
    memory = cli("memory", "--model", "27b", "--tp", "8", "--gpu", "a100")
    assert "more than the GPU holds" in _flat(memory.stdout)
    fits = cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--json")
    assert json.loads(fits.stdout)["peak"]["fits"] is True
    assert "more than the GPU holds" not in cli("trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0").stdout


def _stores_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("stores:"))


def test_tp1_stores_whole_weights_not_tp_shards(deepseek_text):
    for text in (cli("trace", "--tp", "1", "--pp", "1", "--dp", "4", "--gpu", "0").stdout, deepseek_text):
        line = _stores_line(text)
        assert "TP shards" not in line and "whole weights" in line


def test_tp2_still_names_its_tp_shards():
    assert "TP shards" in _stores_line(cli("trace", "--gpu", "2").stdout)  # moe16: TP 2


@pytest.mark.parametrize("args, experts, layers", [
    (["--tp", "1", "--pp", "1", "--dp", "4", "--gpu", "0"], "E1-E8", 4),  # EP 1: every expert, 4 MoE layers
    (["--gpu", "2"], "E5/E6", 2),  # moe16: EP rank 2 of 4, stage 1 of 2
], ids=["dp4", "moe16"])
def test_each_expert_list_is_printed_once(args, experts, layers):
    line = _stores_line(cli("trace", *args).stdout)
    assert line.count("E" + experts.split("E")[1].rstrip("-/")) == 1 and experts in line
    assert f"each of its {layers} MoE layers" in line


def test_the_expert_count_says_it_is_every_moe_layer_together():
    """Issue 53: moe16's g2 holds E5 and E6 (2 of 8 experts, h = 4 and f = 16 wide, two matrices each: 2 x 2 x 4 x
    16 = 256 values a layer) in each of its stage's 2 MoE layers: 512 in all, said as both layers together."""
    line = " ".join(_stores_line(cli("trace", "--gpu", "2").stdout).split())
    assert f"{2 * 2 * 2 * 4 * 16:,} of experts, its MoE layers together (E5/E6 in each of its 2 MoE layers)" in line


def test_no_flash_is_refused_where_the_example_keeps_its_scores_anyway():
    out = cli("trace", "--no-flash")
    assert out.returncode == 2 and "--no-flash is a choice of a real-size step" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1

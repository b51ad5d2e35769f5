"""`parasim trace --job FILE`: another stack's job followed at real size on symbolic ranks, as --megatron is;
the model beside a file that names none comes from --config; every misuse refused in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

DATA = Path(__file__).parents[2] / "data" / "jobs"
LLAMA = str(DATA / "hf" / "Llama-3.1-8B-Instruct_config.json")
# DeepSpeed's batch arithmetic: 8 sequences a step in micro-batches of 1, accumulated twice, so DP 4
ZERO1 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "train_batch_size": 8,
         "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}


@pytest.fixture
def ds(tmp_path):
    path = tmp_path / "ds_zero1.json"
    path.write_text(json.dumps(ZERO1))
    return str(path)


def test_a_deepspeed_job_traced_is_the_job_memory_plans(ds):
    got = cli("trace", "--job", ds, "--config", LLAMA, "--gpu", "0", "--seq", "1024", "--json")
    assert got.returncode == 0, got.stderr
    view = json.loads(got.stdout)
    assert view["sizes"] == {"tp": 1, "cp": 1, "dp": 4, "pp": 1, "ep": 1, "etp": 1}
    planned = json.loads(cli("memory", "--job", ds, "--config", LLAMA, "--seq", "1024", "--json").stdout)
    # the step's GPU against the estimator's figure for the same job: one plan, read once
    assert view["peak"]["estimate"] == pytest.approx(planned["total"] * planned["unit_bytes"], rel=1e-9)
    # in words, the file's fields come before the GPU's view
    words = cli("trace", "--job", ds, "--config", LLAMA, "--gpu", "0", "--seq", "1024")
    assert words.returncode == 0 and words.stdout.startswith("DeepSpeed config, 5 fields:")


@pytest.mark.parametrize("argv, said", [
    (["--job", "{ds}", "--gpu", "0"], "give --config FILE (a Hugging Face config.json) beside --job"),
    (["--config", LLAMA, "--gpu", "0"], "--config gives the model of a --job file"),
    (["--job", LLAMA, "--gpu", "0"], "gives no layout"),
    (["--job", "{ds}", "--layout", "moe16", "--gpu", "0"], "give either --layout NAME or --job FILE, not both"),
    (["--job", "{ds}", "--megatron", "{ds}", "--gpu", "0"], "not both"),
    # torchtitan's FSDP is ZeRO-3, which the symbolic step does not run: memory plans it instead
    (["--job", str(DATA / "torchtitan" / "llama3_8b.toml"), "--gpu", "0"],
     "cannot run ZeRO-3 (the step shards the optimizer state: ZeRO-1); parasim memory --job "),
])
def test_trace_job_misuse_is_one_line(ds, argv, said):
    got = cli("trace", *[a.replace("{ds}", ds) for a in argv])
    assert got.returncode == 2 and said in got.stderr and got.stderr.count("\n") == 1, got.stderr

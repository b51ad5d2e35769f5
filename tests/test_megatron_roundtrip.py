"""`--megatron-args` hands back the job it read, not only its figures: a job read with `--megatron`, written
back as flags and read again, is the same job field by field (model, layout, step, precision, sequence,
overlap), names the same flags as not modelled, as changing nothing and as unknown, and gives every flag it
does not model exactly as the script gave it. Held for every Megatron-LM script under tests/data/megatron and
for small jobs written here with what the issue found lost (FP16, learned positions, a tokenizer's files)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from parasim.megatron.args import as_dict
from parasim.megatron.job import plan_of, read_job
from tests.conftest import cli

DATA = os.path.join(os.path.dirname(__file__), "data", "megatron")
SCRIPTS = sorted(glob.glob(os.path.join(DATA, "*.sh")))

# GPT-3's example as Megatron-LM wrote it: FP16, learned positions (Megatron's default: no
# --position-embedding-type), GPT-2's tokenizer by its files, each a flag the first writer lost
GPT_FP16 = """#!/bin/bash
VOCAB=/data/gpt2-vocab.json
MERGES=/data/gpt2-merges.txt
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py \\
    --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 2048 \\
    --micro-batch-size 1 --global-batch-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\
    --fp16 --vocab-file $VOCAB --merge-file $MERGES --lr 6.0e-5 --clip-grad 1.0 --weight-decay 0.1 \\
    --data-path /data/my_text_document --split 949,50,1 --log-interval 100 --init-method-std 0.006 \\
    --use-distributed-optimizer --overlap-grad-reduce
"""


def _fields(job) -> dict:
    return {"model": job.model, "layout": job.layout, "step": job.step, "seq": job.seq, "overlap": job.overlap,
            "world": job.world, "unmodelled": sorted(job.unmodelled), "no_effect": sorted(job.no_effect),
            "unknown": sorted(job.unknown), "contradictions": [c for c in job.contradictions
                                                              if "launches" not in c]}


def _round_trip(path: str, tmp_path) -> tuple:
    job = read_job(path)
    model = job.model_spec()
    plan = plan_of(job, model)
    written = as_dict(model, plan, job.seq, tuple(job.overlap), job)
    again_path = tmp_path / "again.sh"
    again_path.write_text(written["torchrun"] + "\n")
    return job, read_job(str(again_path)), written


@pytest.mark.parametrize("path", SCRIPTS, ids=[os.path.basename(p) for p in SCRIPTS])
def test_every_script_reads_back_as_the_same_job(path, tmp_path):
    job, again, written = _round_trip(path, tmp_path)
    assert _fields(again) == _fields(job)
    # every flag parasim does not model, word for word as the script gave it
    for flag in job.left | set(job.no_effect) | set(job.unknown):
        assert again.given[flag] == job.given[flag], flag
    assert not written["notes"]  # a Megatron job's precision is Megatron's own: nothing to say


def test_fp16_learned_positions_and_a_tokenizers_files_come_back(tmp_path):
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    job, again, written = _round_trip(str(path), tmp_path)
    assert _fields(again) == _fields(job)
    args = written["args"]
    assert "--fp16" in args and "--bf16" not in args
    assert job.step["precision"] == again.step["precision"] == "megatron-fp16"
    assert "--position-embedding-type" not in args  # learned absolute positions: Megatron's default, as given
    assert args[args.index("--max-position-embeddings") + 1] == "2048"
    assert args[args.index("--vocab-file") + 1] == "/data/gpt2-vocab.json" and "--vocab-size" not in args
    for flag, value in (("--lr", "6.0e-5"), ("--data-path", "/data/my_text_document"), ("--split", "949,50,1")):
        assert args[args.index(flag) + 1] == value


def test_a_command_that_changes_the_job_changes_only_that(tmp_path):
    """The same job on PP 1 with BF16 (the command's flags win): the layout and precision written are the
    command's, the job's learned positions, tokenizer and optimizer settings stay."""
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    r = cli("memory", "--megatron", str(path), "--pp", "1", "--precision", "megatron-bf16", "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["megatron_args"]["args"]
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "1"
    assert "--bf16" in args and "--fp16" not in args
    assert args[args.index("--weight-decay") + 1] == "0.1" and "--position-embedding-type" not in args


@pytest.mark.parametrize("name, flags, per_param", [
    ("post", ["--bf16", "--grad-reduce-in-bf16"], "20 bytes a parameter of model state where post keeps 16"),
    ("fp64", [], "16 bytes a parameter of model state where fp64 keeps 32"),
])
def test_a_precision_megatron_has_no_flags_for_is_written_as_the_nearest_and_said(name, flags, per_param):
    r = cli("memory", "--model", "27b", "--tp", "8", "--precision", name, "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["megatron_args"]
    written = [w for w in out["args"] if w in ("--bf16", "--fp16", "--grad-reduce-in-bf16",
                                                "--accumulate-allreduce-grads-in-fp32")]
    assert written == flags
    assert len(out["notes"]) == 1 and per_param in out["notes"][0]
    text = cli("memory", "--model", "27b", "--tp", "8", "--precision", name, "--megatron-args")
    assert f"# precision {name} has no Megatron-LM flags" in text.stdout


@pytest.mark.parametrize("flags, name", [
    ("--bf16", "megatron-bf16"), ("--bf16 --grad-reduce-in-bf16", "megatron-bf16-reduce-bf16"),
    ("--bf16 --accumulate-allreduce-grads-in-fp32", "megatron-bf16"), ("--fp16", "megatron-fp16"),
    ("--fp16 --accumulate-allreduce-grads-in-fp32", "megatron-fp16-grads-fp32"), ("", "fp32"),
])
def test_each_precision_written_reads_back_as_itself(tmp_path, flags, name):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                    f"--num-attention-heads 4 --seq-length 64 --vocab-size 128 --micro-batch-size 1 {flags}\n")
    job, again, written = _round_trip(str(path), tmp_path)
    assert job.step["precision"] == again.step["precision"] == name


def test_contradicting_precision_flags_are_one_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                    "--seq-length 64 --vocab-size 128 --bf16 --grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32\n")
    r = cli("memory", "--megatron", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "contradict" in r.stderr

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

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "megatron")
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
    ("--bf16 --fp8-format hybrid", "megatron-bf16-fp8-delayed"),  # Megatron's default recipe: delayed
    ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise", "megatron-bf16-fp8-tensorwise"),
    ("--bf16 --fp8-format e4m3 --fp8-recipe blockwise", "megatron-bf16-fp8-blockwise"),
    ("--bf16 --grad-reduce-in-bf16 --fp8-format hybrid --fp8-recipe tensorwise",
     "megatron-bf16-reduce-bf16-fp8-tensorwise"),
])
def test_each_precision_written_reads_back_as_itself(tmp_path, flags, name):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                    f"--num-attention-heads 4 --seq-length 64 --vocab-size 128 --micro-batch-size 1 {flags}\n")
    job, again, written = _round_trip(str(path), tmp_path)
    assert job.step["precision"] == again.step["precision"] == name


@pytest.mark.parametrize("name, fp8_flags", [
    ("megatron-bf16-fp8-delayed", ["--fp8-format", "hybrid"]),  # Megatron's default recipe is not written
    ("megatron-bf16-fp8-tensorwise", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
    ("megatron-bf16-reduce-bf16-fp8-blockwise", ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]),
])
def test_an_fp8_precision_is_written_as_its_megatron_flags(name, fp8_flags):
    r = cli("memory", "--model", "27b", "--tp", "8", "--precision", name, "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["megatron_args"]["args"]
    i = args.index("--fp8-format")
    assert args[i:i + len(fp8_flags)] == fp8_flags and args.count("--fp8-recipe") == ("--fp8-recipe" in fp8_flags)


@pytest.mark.parametrize("flags, line", [
    ("--bf16 --fp8-format hybrid --fp8-recipe mxfp8",
     "--fp8-format hybrid --fp8-recipe mxfp8: parasim has no cost for the mxfp8 recipe's casts"),
    ("--fp16 --fp8-format hybrid", "--fp8-format hybrid: FP8 linears on top of another precision than --bf16"),
])
def test_fp8_parasim_cannot_time_is_left_in_one_line_and_timed_in_16_bits(tmp_path, flags, line):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                    f"--num-attention-heads 4 --seq-length 64 --vocab-size 128 --micro-batch-size 1 {flags}\n")
    job = read_job(str(path))
    assert not job.step["precision"].endswith(("delayed", "tensorwise", "blockwise"))
    said = [u for u in job.unmodelled if "FP8" in u or "fp8" in u]
    assert len(said) == 1 and said[0].startswith(line) and "timed in" in said[0]


def test_contradicting_precision_flags_are_one_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                    "--seq-length 64 --vocab-size 128 --bf16 --grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32\n")
    r = cli("memory", "--megatron", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "contradict" in r.stderr


# -- what a mutation audit found unguarded in the writer: flags read but not written, Megatron's nearest
# precision, the commands that write a job (layout, fit --search) and the positions a longer sequence needs

# what a job gives that parasim reads but writes nothing of its own for: rotary positions (and more of them than
# the sequence), a tokenizer named with its files, a padding multiple, FlashAttention by two flags, dropout
# rates that are not Megatron's default, the all-to-all dispatcher
READ_JOB = """torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 \\
  --seq-length 1024 --max-position-embeddings 4096 --position-embedding-type rope --micro-batch-size 1 \\
  --global-batch-size 16 --tensor-model-parallel-size 2 --sequence-parallel --bf16 \\
  --tokenizer-type GPT2BPETokenizer --vocab-file /data/vocab.json --merge-file /data/merges.txt \\
  --make-vocab-size-divisible-by 64 --use-flash-attn --attention-backend flash --hidden-dropout 0.1 \\
  --attention-dropout 0.05 --num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall \\
  --expert-model-parallel-size 2
"""
AS_GIVEN = {"--max-position-embeddings": ["4096"], "--position-embedding-type": ["rope"],
            "--tokenizer-type": ["GPT2BPETokenizer"], "--vocab-file": ["/data/vocab.json"],
            "--merge-file": ["/data/merges.txt"], "--make-vocab-size-divisible-by": ["64"], "--use-flash-attn": [],
            "--attention-backend": ["flash"], "--hidden-dropout": ["0.1"], "--attention-dropout": ["0.05"],
            "--moe-token-dispatcher-type": ["alltoall"]}


def _written(text: str, tmp_path) -> tuple[list[str], object]:
    """The flags `text`'s job is written back as, and that job read again."""
    path = tmp_path / "job.sh"
    path.write_text(text)
    job = read_job(str(path))
    model = job.model_spec()
    written = as_dict(model, plan_of(job, model), job.seq, tuple(job.overlap), job)
    again = tmp_path / "again.sh"
    again.write_text(written["torchrun"] + "\n")
    return written["args"], read_job(str(again))


def test_what_parasim_reads_but_does_not_write_comes_back_word_for_word(tmp_path):
    args, again = _written(READ_JOB, tmp_path)
    for flag, values in AS_GIVEN.items():
        assert args.count(flag) == 1, flag
        i = args.index(flag)
        assert args[i + 1:i + 1 + len(values)] == values, flag
        assert again.given[flag] == values, flag
    assert "--vocab-size" not in args  # the tokenizer gives the vocabulary, as in the job


@pytest.mark.parametrize("name, near, per_param, keeps", [
    ("fsdp2", "megatron-bf16 (--bf16)", 18, 16),  # FP32 weights, gradients and Adam (4 + 4 + 8), as --bf16's 2 + 4 + 12
    # BF16 moments: 2 + 4 + (4 + 4); its FP8 products as Megatron's blockwise recipe
    ("deepseek-v3", "megatron-bf16-fp8-blockwise (--bf16 --fp8-format e4m3 --fp8-recipe blockwise)", 18, 14),
])
def test_a_precision_written_as_megatrons_bf16_says_what_that_changes(name, near, per_param, keeps):
    r = cli("memory", "--model", "27b", "--tp", "8", "--precision", name, "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["megatron_args"]
    assert [w for w in out["args"] if w in ("--bf16", "--fp16", "--grad-reduce-in-bf16",
                                            "--accumulate-allreduce-grads-in-fp32")] == ["--bf16"]
    (note,) = out["notes"]
    assert f"written as {near}, {per_param} bytes a parameter of model state where {name} keeps {keeps} " in note


def test_a_jobs_layout_and_its_search_are_written_back_as_the_job(tmp_path):
    """`layout --megatron FILE --megatron-args` and `fit --search --megatron FILE --megatron-args` on GPT-3's
    FP16 example (GPT_FP16): its FP16, its learned positions (no rotary flag), its
    optimizer settings, as the job gives them."""
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    laid = cli("layout", "--megatron", str(path), "--megatron-args", "--json")
    searched = cli("fit", "--megatron", str(path), "--search", "--nodes", "1", "--megatron-args", "--json")
    assert laid.returncode == searched.returncode == 0, laid.stderr + searched.stderr
    for args in (json.loads(laid.stdout)["megatron_args"]["args"],
                 json.loads(searched.stdout)["nodes"][0]["best"]["megatron_args"]["args"]):
        assert "--fp16" in args and "--bf16" not in args and "--grad-reduce-in-bf16" not in args
        assert "--position-embedding-type" not in args
        assert args[args.index("--weight-decay") + 1] == "0.1" and args[args.index("--lr") + 1] == "6.0e-5"
        assert "--vocab-size" not in args  # GPT-2's tokenizer by its files, as the job names it


def test_a_job_written_for_a_longer_sequence_has_the_positions_for_it(tmp_path):
    """GPT-3's FP16 example keeps 2,048 learned positions for its 1,024 tokens: written back as they are at its
    own sequence, and as many as the sequence past them (Megatron-LM refuses --seq-length beyond
    --max-position-embeddings): 4,096 for `--seq 4096`, the longest sequence `fit --search` finds for its."""
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    runs = {"own": cli("memory", "--megatron", str(path), "--megatron-args", "--json"),
            "4096": cli("memory", "--megatron", str(path), "--seq", "4096", "--megatron-args", "--json"),
            "search": cli("fit", "--megatron", str(path), "--search", "--nodes", "1", "--megatron-args", "--json")}
    written = {}
    for k, r in runs.items():
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        args = (out["nodes"][0]["best"] if k == "search" else out)["megatron_args"]["args"]
        assert args.count("--max-position-embeddings") == 1
        written[k] = (int(args[args.index("--seq-length") + 1]), int(args[args.index("--max-position-embeddings") + 1]))
    assert written["own"] == (1024, 2048) and written["4096"] == (4096, 4096)
    seq, most = written["search"]
    assert seq > 2048 and most == seq


def test_a_searched_jobs_vocabulary_is_the_jobs_at_the_layouts_tp(tmp_path):
    """`fit --search` of GPT-3's FP16 example on one node picks TP 8: its job, written back and read again, pads
    GPT-2's 50,257 tokens to a multiple of 128 x 8, 51,200, as the job itself would at TP 8."""
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    r = cli("fit", "--megatron", str(path), "--search", "--nodes", "1", "--megatron-args", "--json")
    best = json.loads(r.stdout)["nodes"][0]["best"]
    assert best["tp"] == 8
    again = tmp_path / "again.sh"
    again.write_text(best["megatron_args"]["torchrun"] + "\n")
    assert read_job(str(again)).model_spec().vocab == read_job(str(path)).model_spec(8).vocab == 51200


def test_every_precision_is_written_as_megatron_flags_it_reads_back_as():
    """Each entry has Megatron-LM flags of its own or a nearest that has; and what is written for an entry reads
    back as the entry it was written as (the reader and the writer share one table)."""
    from parasim.layout.precision import PRECISIONS
    from parasim.megatron.args import megatron_precision
    from parasim.megatron.flags import PRECISION_FLAGS
    for name in PRECISIONS:
        assert megatron_precision(name) in PRECISION_FLAGS, name
    assert {megatron_precision(n) for n in PRECISION_FLAGS} == set(PRECISION_FLAGS)


def test_flags_parasim_writes_itself_are_not_written_twice(tmp_path):
    """A job whose unfused attention, zero dropout and vocabulary parasim writes in its own words: each flag
    once, with the job's value; a vocabulary the command gives (--vocab 1000) in place of the job's."""
    job = ("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
           "--seq-length 64 --vocab-size 128 --micro-batch-size 1 --attention-backend unfused --hidden-dropout 0.0 "
           "--attention-dropout 0.0 --bf16\n")
    args, again = _written(job, tmp_path)
    for flag, value in (("--attention-backend", "unfused"), ("--hidden-dropout", "0.0"),
                        ("--attention-dropout", "0.0"), ("--vocab-size", "128")):
        assert args.count(flag) == 1 and args[args.index(flag) + 1] == value, flag
    r = cli("memory", "--megatron", str(tmp_path / "job.sh"), "--vocab", "1000", "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["megatron_args"]["args"]
    assert args.count("--vocab-size") == 1 and args[args.index("--vocab-size") + 1] == "1000"


@pytest.mark.parametrize("flags, name, no_effect", [
    ("--fp16 --grad-reduce-in-bf16", "megatron-fp16", ["--grad-reduce-in-bf16"]),  # read only with --bf16
    ("--grad-reduce-in-bf16", "fp32", ["--grad-reduce-in-bf16"]),
    ("--accumulate-allreduce-grads-in-fp32", "fp32", ["--accumulate-allreduce-grads-in-fp32"]),  # FP32 already
    ("--bf16 --accumulate-allreduce-grads-in-fp32", "megatron-bf16", []),  # --bf16's default, said again
])
def test_a_precision_flag_megatron_ignores_changes_nothing(tmp_path, flags, name, no_effect):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                    f"--num-attention-heads 4 --seq-length 64 --vocab-size 128 --micro-batch-size 1 {flags}\n")
    job = read_job(str(path))
    assert job.step["precision"] == name
    assert job.no_effect == no_effect and not [u for u in job.unmodelled if "grad" in u]


def test_bf16_and_fp16_together_are_refused_in_one_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                    "--num-attention-heads 4 --seq-length 64 --vocab-size 128 --bf16 --fp16\n")
    r = cli("memory", "--megatron", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "both --bf16 and --fp16" in r.stderr


def test_fit_search_of_a_job_takes_the_commands_precision_over_the_jobs(tmp_path):
    path = tmp_path / "gpt.sh"
    path.write_text(GPT_FP16)
    for given, want in ((["--precision", "megatron-bf16"], "megatron-bf16"), ([], "megatron-fp16")):
        r = cli("fit", "--megatron", str(path), "--search", "--nodes", "1", "--json", *given)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["nodes"][0]["best"]["precision"] == want


def test_a_dispatcher_parasim_does_not_model_is_written_as_the_job_gives_it(tmp_path):
    """Megatron's allgather dispatcher (parasim times all-to-alls, and says so): written back as allgather, once,
    not replaced by the all-to-all a job that names none gets."""
    job = READ_JOB.replace("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type allgather")
    args, again = _written(job, tmp_path)
    assert args.count("--moe-token-dispatcher-type") == 1
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "allgather"
    assert again.given["--moe-token-dispatcher-type"] == ["allgather"]


@pytest.mark.parametrize("given", ["2k", "$UNSET"])
def test_positions_that_are_no_number_are_written_as_the_sequences(tmp_path, given):
    """A rotary job's --max-position-embeddings is not read for weights: a word (2k) or an unset variable is
    replaced by the sequence's count, not a traceback."""
    job = ("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
           "--seq-length 64 --vocab-size 128 --position-embedding-type rope "
           f"--max-position-embeddings {given} --bf16\n")
    args, _ = _written(job, tmp_path)
    assert args.count("--max-position-embeddings") == 1 and args[args.index("--max-position-embeddings") + 1] == "64"

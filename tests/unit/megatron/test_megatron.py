"""Megatron-LM jobs read as they are (`--megatron FILE`) and plans written back as their flags
(`--megatron-args`). The scripts under tests/data/megatron are Megatron-LM's own (see the README there);
every expected value below is typed from the script or the published model, never from the reader."""
from __future__ import annotations

import json
import os

import pytest

from parasim.layout.precision import precision as precision_of

from parasim.errors import UsageError
from parasim.estimate.memory import Plan
from parasim.layout import ModelSpec
from parasim.megatron.args import megatron_args, script_text
from parasim.megatron.job import plan_of, read_job
from parasim.megatron.script import read_script
from tests.conftest import cli

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "megatron")
GPT3 = os.path.join(DATA, "train_gpt3_175b_distributed.sh")
MIXTRAL = os.path.join(DATA, "train_mixtral_8x7b_distributed.sh")
LLAMA = os.path.join(DATA, "train_llama3_8b_h100_fp8.sh")


# -- the script, read as bash reads it -----------------------------------------------------------------
def test_variables_arrays_defaults_and_arithmetic_expand_as_bash_expands_them():
    text = """#!/bin/bash
GPUS=8
NODES=${SLURM_NNODES:-"2"}   # unset: the default
WORLD=$(($GPUS*$NODES))
EMPTY=$1
SET_EMPTY=
EIGHT=${SET_EMPTY:-8}     # set but empty: :- takes the default
NOTHING=${SET_EMPTY-8}    # set: - keeps the empty value
A=(
    --num-layers 4   # a comment inside an array
    --hidden-size "$((GPUS * 16))"
)
A+=("--seq-length 64")
export TP=2
torchrun --nproc_per_node $GPUS --nnodes $NODES train.py ${A[@]} \\
    --tensor-model-parallel-size ${TP} --world-note $WORLD "--quoted stays one" $EMPTY --eight $EIGHT \
    --nothing "$NOTHING" 2>&1 | tee log
"""
    s = read_script(text, "job.sh")
    assert s.launcher == ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"]
    assert s.program == "train.py"
    assert s.flags == ["--num-layers", "4", "--hidden-size", "128", "--seq-length", "64",
                       "--tensor-model-parallel-size", "2", "--world-note", "16", "--quoted stays one",
                       "--eight", "8", "--nothing", ""]
    assert s.line == 15


def test_if_else_takes_the_branch_bash_would_and_notes_what_it_cannot_run():
    text = """MODE=fp8
X=()
if [[ "$MODE" == "bf16" ]]; then
    X+=(--bf16)
elif [ -n "$MODE" ] && [ "$MODE" != "none" ]; then
    X+=(--fp8-format hybrid)
else
    X+=(--fp16)
fi
for i in 1 2; do
    X+=(--never)
done
D=$(date)
python pretrain_gpt.py ${X[@]} --note "$(hostname)"
"""
    s = read_script(text, "job.sh")
    assert s.flags == ["--fp8-format", "hybrid", "--note", ""]
    assert any("for loop" in n for n in s.notes)
    assert any("$(hostname)" in n for n in s.notes)  # in the launch: noted


def test_a_file_of_flags_is_its_flags_and_an_exit_stops_reading():
    s = read_script("--num-layers 2\n--hidden-size 8 \\\n  --num-attention-heads 2\n", "flags.txt")
    assert (s.program, s.flags) == ("", ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2"])
    with pytest.raises(UsageError, match="no launch of a training program"):
        read_script("exit 1\ntorchrun pretrain_gpt.py --num-layers 2\n", "job.sh")


@pytest.mark.parametrize("text, words", [
    ("torchrun x.py --a 'unclosed\n", "never closes"),
    ('torchrun x.py --a "unclosed\n', "never closes"),
    ("A=(--a\n", "never closes"),
    ("fi\n", "without an 'if'"),
    ("echo nothing here\n", "no launch"),
])
def test_what_cannot_be_read_is_one_line_naming_the_file_and_line(text, words):
    with pytest.raises(UsageError, match=words) as err:
        read_script(text, "job.sh")
    assert str(err.value).startswith("job.sh") and "\n" not in str(err.value)


# -- Megatron-LM's own scripts -------------------------------------------------------------------------
def test_gpt3_175b_gives_tp8_pp16_and_says_torchrun_launches_too_few():
    got = cli("memory", "--megatron", GPT3)
    assert got.returncode == 0, got.stderr
    text = got.stdout
    assert "TP8 + PP16 on 128 GPUs" in text
    for flag in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 16", "--num-layers 96",
                 "--hidden-size 12288", "--num-attention-heads 96", "--seq-length 2048", "--global-batch-size 1536"):
        assert flag in text, flag
    assert "launches 8 processes" in text and "multiple of 128" in text
    assert "--step-batch-size-schedule" in text  # the batch ramp: named, not modelled
    data = json.loads(cli("memory", "--megatron", GPT3, "--json").stdout)
    assert {k: data["layout"][k] for k in ("tp", "pp", "cp", "dp", "world", "zero")} == \
        {"tp": 8, "pp": 16, "cp": 1, "dp": 1, "world": 128, "zero": 0}  # no --use-distributed-optimizer
    assert data["layout"]["microbatches"] == 1536  # global 1536 / (micro 1 x DP 1)
    assert data["seq"] == 2048
    assert abs(data["params"] - 175.0e9) / 175.0e9 < 0.01  # Brown et al. 2020's 175.0B
    assert any("multiple of 128" in c for c in data["megatron"]["contradictions"])


def test_gpt3_175b_is_the_published_175b_model():
    # Brown et al. 2020, Table 2.1: GPT-3 175B has 175.0B parameters (96 layers, d_model 12288, 96 heads)
    job = read_job(GPT3)
    model = job.model_spec()
    assert model.vocab == 51200  # GPT-2's 50,257 padded to a multiple of 128 x TP 8, as Megatron pads it
    assert abs(model.total_params() - 175.0e9) / 175.0e9 < 0.01


def test_mixtral_reads_its_experts_and_grouped_query_attention():
    # Mixtral of Experts (Jiang et al. 2024): 46.7B parameters, 8 experts, top-2, GQA with 8 KV heads
    job = read_job(MIXTRAL)
    model = job.model_spec()
    assert (model.experts, model.top_k, model.kv_heads, model.ffn, model.gated, model.norm) == \
        (8, 2, 8, 14336, True, "rmsnorm")
    assert abs(model.total_params() - 46.7e9) / 46.7e9 < 0.01
    plan = plan_of(job, model)
    assert (plan.tp, plan.pp, plan.ep, plan.etp, plan.sp, plan.zero, plan.world, plan.dp) == \
        (1, 4, 8, 1, False, 1, 32, 8)  # SP dropped with TP 1, as Megatron drops it
    assert plan.m == 256 // 8  # global 256 / (micro 1 x DP 8)
    assert not plan.dropout  # both dropouts 0.0
    assert set(job.overlap) == {"grad-reduce", "prefetch"}
    assert any("multiple of 32" in c for c in job.contradictions)  # 8 GPUs launched: EP 8 x PP 4 needs 32
    assert any(line.startswith("--moe-grouped-gemm") for line in job.unmodelled)
    assert not job.unknown


def test_llama3_fp8_names_what_parasim_leaves_out():
    job = read_job(LLAMA)
    model = job.model_spec()
    assert (model.vocab, model.kv_heads, model.layers) == (128256, 8, 32)
    # Llama 3 8B: 8.03B parameters (Meta's model card)
    assert abs(model.total_params() - 8.03e9) / 8.03e9 < 0.01
    left = " ".join(job.unmodelled)
    assert "--cross-entropy-loss-fusion" in left
    # --bf16 with --grad-reduce-in-bf16: BF16 gradients reduced in BF16, an FP32 copy of the optimizer's share;
    # --fp8-format hybrid without a recipe: FP8 linears with Megatron's default, delayed scaling; --fp8-param-gather:
    # the weights kept and all-gathered in FP8 (one byte a weight where BF16 takes two)
    assert "--grad-reduce-in-bf16" not in left and "--fp8-format" not in left and "--fp8-param-gather" not in left
    assert job.step["precision"] == "megatron-bf16-reduce-bf16-fp8-delayed-gather"
    assert {"--fp8-format hybrid", "--fp8-param-gather"} <= {u for u, _ in job.used}
    kept = precision_of(job.step["precision"])
    assert (kept.bytes("params"), kept.bytes("compute"), kept.bytes("grad_reduce")) == (1, 1, 2)
    assert job.seq == 8192 and job.world == 8
    assert not job.contradictions and not job.unknown


def test_every_flag_is_accounted_for():
    for path in (GPT3, MIXTRAL, LLAMA):
        job = read_job(path)
        accounted = {u.split(" ", 1)[0] for u, _ in job.used} | set(job.no_effect) | set(job.unknown) | \
            {line.split(" ", 1)[0].rstrip(":") for line in job.unmodelled}
        assert set(job.given) <= accounted, set(job.given) - accounted
        used = {u.split(" ", 1)[0] for u, _ in job.used}
        assert not used & (set(job.no_effect) | set(job.unknown)), used & (set(job.no_effect) | set(job.unknown))


# -- the answer handed back, and read again --------------------------------------------------------------
MOE = ModelSpec(name="moe", layers=8, hidden=1024, heads=16, kv_heads=4, vocab=32768, ffn=4096, experts=16, top_k=2,
                expert_ffn=1024, shared_experts=1, dense_layers=2, gated=True, norm="rmsnorm", bias=False)
PLANS = [
    Plan(tp=8, sp=True, pp=2, world=64, zero=1, recompute="full", micro_batch=2, microbatches=8),
    Plan(tp=2, sp=True, cp=2, pp=4, world=64, ep=4, etp=1, zero=0, recompute="selective", microbatches=16, chunks=2),
    Plan(tp=1, pp=1, world=16, ep=8, etp=2, zero=3, flash=False, dropout=False),
    Plan(tp=4, sp=True, pp=2, world=32, ep=2, etp=2, zero=2, order="tp-cp-ep-pp-dp", microbatches=4),
]


@pytest.mark.parametrize("plan", PLANS, ids=[p.label() for p in PLANS])
def test_a_plan_written_as_flags_reads_back_as_the_same_plan(plan):
    plan = plan.check(MOE, 4096)
    overlap = ("grad-reduce", "prefetch", "tp")
    text = script_text(megatron_args(MOE, plan, 4096, overlap), plan.world, plan.gpus_per_node)
    job = read_job("written.sh", text)
    assert not job.contradictions and not job.unknown, (job.contradictions, job.unknown)
    back = plan_of(job, job.model_spec())
    for f in ("tp", "sp", "cp", "pp", "dp", "ep", "etp", "world", "zero", "order", "recompute", "flash", "dropout",
              "micro_batch", "m", "chunks", "gpus_per_node"):
        assert getattr(back, f) == getattr(plan, f), f
    model = job.model_spec()
    for f in ("layers", "hidden", "heads", "kv_heads", "vocab", "ffn", "experts", "top_k", "expert_ffn",
              "shared_experts", "dense_layers", "gated", "norm", "bias", "tied_embeddings"):
        assert getattr(model, f) == getattr(MOE, f), f
    # CP's K/V ring runs beside attention in Megatron (TransformerEngine): read as the plan's "cp" overlap
    assert job.seq == 4096 and set(job.overlap) == set(overlap) | ({"cp"} if plan.cp > 1 else set())


def test_fit_search_megatron_args_round_trip_through_megatron(tmp_path):
    got = cli("fit", "--model", "27b", "--search", "--nodes", "1-2", "--megatron-args", "--json")
    assert got.returncode == 0, got.stderr
    for row in json.loads(got.stdout)["nodes"]:
        best = row["best"]
        path = tmp_path / f"job{row['nodes']}.sh"
        path.write_text(best["megatron_args"]["torchrun"] + "\n")
        back = json.loads(cli("memory", "--megatron", str(path), "--json").stdout)
        for f in ("tp", "sp", "cp", "pp", "dp", "ep", "world", "zero", "recompute", "flash", "micro_batch",
                  "microbatches"):
            assert back["layout"][f] == best[f], (row["nodes"], f)
        assert back["seq"] == best["seq_length"] <= best["max_seq_tokens"]
        # a length the layout splits evenly: CP's 2 x cp chunks, each cut over TP by SP
        assert best["seq_length"] % (2 * best["cp"] * (best["tp"] if best["sp"] else 1)) == 0
        assert not back["megatron"]["unmodelled"] and not back["megatron"]["contradictions"]
    text = cli("fit", "--model", "27b", "--search", "--nodes", "2", "--megatron-args").stdout
    assert "torchrun --nnodes 2 --nproc-per-node 8" in text and "--context-parallel-size 2" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_layout_megatron_args_round_trip(tmp_path):
    got = json.loads(cli("layout", "--tp", "2", "--pp", "2", "--ep", "4", "--experts", "8", "--world", "16", "--sp",
                         "--megatron-args", "--json").stdout)
    path = tmp_path / "layout.sh"
    path.write_text(got["megatron_args"]["torchrun"])
    back = json.loads(cli("layout", "--megatron", str(path), "--json").stdout)
    assert back["layout"] == got["layout"] and back["groups"] == got["groups"]


def test_the_command_line_replaces_what_the_job_says():
    data = json.loads(cli("memory", "--megatron", GPT3, "--dp", "2", "--json").stdout)
    assert (data["layout"]["dp"], data["layout"]["world"]) == (2, 256)  # DP given: the world follows, 128 x 2
    data = json.loads(cli("memory", "--megatron", GPT3, "--pp", "8", "--gpus", "64", "--json").stdout)
    assert (data["layout"]["tp"], data["layout"]["pp"], data["layout"]["world"]) == (8, 8, 64)
    assert data["layout"]["microbatches"] == 1536  # the global batch holds: 1536 / (1 x DP 1)


def test_trace_runs_the_job_at_real_size():
    got = cli("trace", "--megatron", MIXTRAL, "--gpu", "0", "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert data["sizes"]["ep"] == 8 and data["sizes"]["pp"] == 4
    assert data["peak"]["assumes"]  # the job's choices: no dropout masks
    assert not any("dropout masks kept" in a for a in data["peak"]["assumes"])


@pytest.mark.parametrize("argv, words", [
    (["memory", "--megatron", "/nonexistent.sh"], "cannot read"),
    # the 175B job keeps the whole optimizer state on every rank: the symbolic step shards it (ZeRO-1)
    (["trace", "--megatron", GPT3, "--gpu", "0"], "ZeRO-0 (the step shards the optimizer state: ZeRO-1); parasim "
                                                  "memory --megatron"),
    (["memory", "--megatron", GPT3, "--model", "27b"], "not both"),
    (["layout", "--megatron", GPT3, "--layout", "moe16"], "not both"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words):
    got = cli(*argv)
    assert got.returncode == 2 and words in got.stderr and got.stderr.count("\n") == 1, got.stderr


def test_a_flag_without_its_value_is_named(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("LAYERS=\ntorchrun pretrain_gpt.py --num-layers $LAYERS --hidden-size 8\n")
    got = cli("memory", "--megatron", str(path))
    assert got.returncode == 2 and "--num-layers expects a whole number" in got.stderr
    path.write_bytes(b"\x00\xff binary")
    got = cli("memory", "--megatron", str(path))
    assert got.returncode == 2 and "not a text file" in got.stderr


def test_deepseek_v3_as_megatron_flags_counts_the_published_total(tmp_path):
    # DeepSeek-V3 technical report: 671B parameters in all, MTP's extra module left out; MLA with q rank 1536,
    # kv rank 512, 128 + 64 query/key and 128 value widths per head. A flags file as Megatron takes them:
    flags = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --ffn-hidden-size 18432 --swiglu "
             "--normalization RMSNorm --untie-embeddings-and-output-weights --vocab-size 129280 "
             "--make-vocab-size-divisible-by 1 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 "
             "--qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 256 --moe-router-topk 8 "
             "--moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 "
             "--moe-layer-freq ([0]*3+[1]*58) --moe-token-dispatcher-type alltoall --mtp-num-layers 1 "
             "--expert-model-parallel-size 64 --pipeline-model-parallel-size 1 --bf16")
    job = read_job("deepseek.txt", flags.replace(" --", "\n--"))
    model = job.model_spec()
    assert (model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim,
            model.v_head_dim, model.dense_layers, model.shared_experts) == (1536, 512, 128, 64, 128, 3, 1)
    assert abs(model.total_params() - 671e9) / 671e9 < 0.02
    assert any(line.startswith("--mtp-num-layers") for line in job.unmodelled)  # named, not counted
    assert any(line.startswith("--multi-latent-attention") for line in job.unmodelled)
    # one layer's latent attention, by hand: q down and up, kv down (+ the shared rotary key) and up, out
    h, n = 7168, 128
    by_hand = h * 1536 + 1536 * n * 192 + h * (512 + 64) + 512 * n * (128 + 128) + n * 128 * h
    assert model.attention_params() == by_hand


def test_a_hugging_face_config_written_as_megatron_flags_reads_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(transformers.DeepseekV3Config().to_json_string())
    got = cli("memory", "--config", str(path), "--tp", "8", "--sp", "--ep", "64", "--gpus", "512", "--megatron-args",
              "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert any("num_nextn_predict_layers" in line for line in data["config"]["unmodelled"])
    job = read_job("written.sh", data["megatron_args"]["torchrun"])
    assert not job.contradictions and not job.unknown
    back = job.model_spec()
    # Megatron pads the vocabulary to a multiple of 128 x TP 8: 129,280 -> 130,048, both embeddings growing
    padding = (130048 - 129280) * 7168 * 2
    assert back.vocab == 130048
    assert "RMSNorm" in data["megatron_args"]["args"]  # the config's rms_norm_eps
    assert back.total_params() - data["config"]["params"] == padding
    text = cli("memory", "--config", str(path), "--tp", "8", "--sp", "--ep", "64", "--gpus", "512").stdout
    text = " ".join(text.split())  # the lines wrap where the folder's name ends
    assert "Hugging Face config" in text and "not modelled (2)" in text and "671.03B parameters" in text


@pytest.mark.parametrize("hidden, attention, kept", [("0.0", "0.0", False), ("0.1", "0.0", True),
                                                       ("0.0", "0.1", True), (None, None, True)])
def test_dropout_masks_are_kept_unless_both_dropouts_are_zero(hidden, attention, kept):
    flags = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64"
    flags += f" --hidden-dropout {hidden}" if hidden else ""
    flags += f" --attention-dropout {attention}" if attention else ""  # absent: Megatron's 0.1
    assert read_job("flags.txt", flags).step["dropout"] is kept


def test_megatron_defaults_fill_what_the_flags_leave_out():
    job = read_job("flags.txt", "--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --vocab-size 1000 "
                                "--swiglu --tensor-model-parallel-size 2 --num-experts 4")
    model = job.model_spec()
    assert model.ffn == 10880  # --swiglu's default width: 8/3 x 4096 = 10,922.7, down to a multiple of 64
    assert model.vocab == 1024  # padded to a multiple of 128 x TP 2
    assert model.top_k == 2 and model.tied_embeddings and model.bias  # Megatron's defaults
    assert job.layout["etp"] == 2  # expert TP follows TP unless given
    assert read_job("flags.txt", "--num-layers 2").layout["zero"] == 0  # no distributed optimizer


@pytest.mark.parametrize("world, words", [(4, "--nnodes 1 --nproc-per-node 4"), (16, "--nnodes 2 --nproc-per-node 8"),
                                          (12, "--nnodes 3 --nproc-per-node 4")])
def test_torchrun_starts_the_same_number_on_every_node(world, words):
    assert words in script_text([], world, 8)
    assert read_job("x.sh", script_text(["--num-layers", "2"], world, 8)).launched == world


def test_cp_by_all_gather_is_read_and_run_and_another_exchange_is_named(tmp_path):
    path = tmp_path / "job.sh"
    flags = ("torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 "
             "--seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 2 --vocab-size 16 "
             "--context-parallel-size 2 --tensor-model-parallel-size 2 --cp-comm-type {}\n")
    path.write_text(flags.format("all_gather"))
    job = read_job(str(path))
    plan = plan_of(job, job.model_spec())
    assert plan.cp_comm == "all_gather" and "--cp-comm-type all_gather" in {u for u, _ in job.used}
    assert "cp" not in job.overlap  # TransformerEngine's ring overlap: not for a gather before attention
    path.write_text(flags.format("p2p"))
    job = read_job(str(path))
    assert plan_of(job, job.model_spec()).cp_comm == "p2p" and "cp" in job.overlap
    path.write_text(flags.format("a2a"))
    job = read_job(str(path))
    assert plan_of(job, job.model_spec()).cp_comm == "p2p"  # run as the ring, and said so
    assert any(u.startswith("--cp-comm-type a2a: CP by another exchange than the two parasim runs (p2p and "
                            "all_gather)") for u in job.unmodelled)


def test_the_command_line_names_the_cp_exchange_over_the_jobs(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 "
                    "--seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 2 "
                    "--vocab-size 16 --context-parallel-size 2 --tensor-model-parallel-size 2 --cp-comm-type p2p\n")
    ring = json.loads(cli("memory", "--megatron", str(path), "--json").stdout)["traffic"]
    got = json.loads(cli("memory", "--megatron", str(path), "--cp-comm", "all_gather", "--json").stdout)["traffic"]
    assert "cp p2p" in ring and "cp all_gather" not in ring
    assert "cp all_gather" in got and "cp reduce_scatter" in got and "cp p2p" not in got

"""Second audit of the readers and the two commands around them: the Megatron-LM job reader
(parasim/megatron/job.py, flags.py), the Hugging Face config reader (parasim/estimate/models.py), `parasim
compare` (parasim/cli/compare.py, parasim/render/compare.py) and `parasim serve`'s checks (parasim/cli/serve.py,
parasim/tui/browser.py's Host check).

Each test catches a realistic bug that the rest of the suite let through when it was planted (a flag read
into the wrong field, a default changed, an off-by-one in a layer pattern, a bound loosened, a field of a
config ignored, columns of the comparison out of order, a serve check dropped); its docstring names the bug.
Every expected value is typed here: a number the script or config.json the test writes states, Megatron-LM's
or Hugging Face's documented default (named where used), or a hand calculation written out beside it. No
expected value comes from the code under test. Every test runs in-process and in well under a few seconds;
nothing here starts a server (serve's socket is bound to port 0 or its `bind` replaced).
"""
from __future__ import annotations

import argparse
import io
import json

import pytest
from conftest import cli

from parasim.errors import UsageError
from parasim.estimate.models import read_hf_config
from parasim.megatron.job import read_job

MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 128"


def _job(tmp_path, text: str):
    path = tmp_path / "job.sh"
    path.write_text(text)
    return read_job(str(path))


def _launch(tmp_path, flags: str, nproc: int = 8, nnodes: str = "1"):
    return _job(tmp_path, f"torchrun --nproc_per_node {nproc} --nnodes {nnodes} pretrain_gpt.py {flags}\n")


# -- the Megatron-LM reader ------------------------------------------------------------------------------------
def test_a_moe_layer_pattern_shorter_than_the_model_is_not_taken_as_dense_first(tmp_path):
    """Bug: the pattern's length checked with `>` instead of `!=` against --num-layers, so a pattern of 3
    layers for a 4-layer model was read as '1 dense layer first'. Megatron asserts the pattern has one entry
    per layer; parasim must leave it out, in one line."""
    job = _launch(tmp_path, f"{MODEL} --num-experts 4 --moe-layer-freq ([0]*1+[1]*2)")
    assert "dense_layers" not in job.model
    assert [line for line in job.unmodelled if line.startswith("--moe-layer-freq")] == [
        "--moe-layer-freq ([0]*1+[1]*2): MoE layers between dense ones; parasim models dense layers first, then "
        "MoE layers"]
    # the same pattern for 3 layers: one dense layer, then two MoE ones
    job = _launch(tmp_path, "--num-layers 3 --hidden-size 64 --num-attention-heads 4 --vocab-size 128 "
                            "--num-experts 4 --moe-layer-freq ([0]*1+[1]*2)")
    assert job.model["dense_layers"] == 1


def test_an_integer_moe_layer_freq_written_with_a_leading_zero_is_every_layer(tmp_path):
    """Bug: --moe-layer-freq compared with the text "1", so 01 (int 1, every layer MoE, as Megatron's int()
    reads it) was taken for a pattern parasim does not model."""
    job = _launch(tmp_path, f"{MODEL} --num-experts 4 --moe-layer-freq 01")
    assert not [line for line in job.unmodelled if line.startswith("--moe-layer-freq")]
    assert job.model["dense_layers"] == 0


@pytest.mark.parametrize("flag", ["--num-layers 0", "--tensor-model-parallel-size 0", "--micro-batch-size 0"])
def test_a_size_of_zero_is_refused_naming_the_flag(tmp_path, flag):
    """Bug: the reader's least value for a count lowered from 1 to 0, so --num-layers 0 (or TP 0, a micro-batch
    of 0, which later divides by it) was read as a job."""
    name = flag.split()[0]
    with pytest.raises(UsageError, match=f"{name} must be at least 1, got 0"):
        _launch(tmp_path, f"{MODEL} {flag}")


def test_expert_tp_defaults_to_the_dense_tp(tmp_path):
    """Bug: an absent --expert-tensor-parallel-size taken as 1; Megatron's default expert TP is the dense TP."""
    job = _launch(tmp_path, f"{MODEL} --num-experts 4 --tensor-model-parallel-size 2 --sequence-parallel")
    assert (job.layout["tp"], job.layout["etp"]) == (2, 2)
    job = _launch(tmp_path, f"{MODEL} --num-experts 4 --tensor-model-parallel-size 2 --sequence-parallel "
                            "--expert-tensor-parallel-size 1")
    assert job.layout["etp"] == 1


def test_sequence_parallel_at_tp_1_is_ignored_as_megatron_ignores_it(tmp_path):
    """Bug: SP kept on at TP 1 (`>= 1` for `> 1`); Megatron turns --sequence-parallel off when TP is 1."""
    job = _launch(tmp_path, f"{MODEL} --sequence-parallel")
    assert job.layout["sp"] is False
    assert ("--sequence-parallel", "ignored: TP is 1, and Megatron turns SP off") in job.used
    assert _launch(tmp_path, f"{MODEL} --sequence-parallel --tensor-model-parallel-size 2").layout["sp"] is True


def test_recompute_activations_alone_is_selective(tmp_path):
    """Bug: --recompute-activations without --recompute-granularity read as full recomputation; Megatron
    sets granularity 'selective' for it."""
    assert _launch(tmp_path, f"{MODEL} --recompute-activations").step["recompute"] == "selective"
    assert _launch(tmp_path, MODEL).step["recompute"] == "none"
    assert _launch(tmp_path, f"{MODEL} --recompute-granularity full").step["recompute"] == "full"


def test_an_moe_job_without_topk_routes_each_token_to_two_experts(tmp_path):
    """Bug: Megatron's default --moe-router-topk (2) written as 1."""
    job = _launch(tmp_path, f"{MODEL} --num-experts 8")
    assert job.model["top_k"] == 2
    assert ("(no --moe-router-topk)", "experts per token: Megatron's default, 2") in job.used


def test_shared_experts_are_counted_in_units_of_the_experts_width(tmp_path):
    """Bug: the shared experts' width divided by the dense --ffn-hidden-size before --moe-ffn-hidden-size.
    128 of shared width over experts 64 wide is 2 shared experts (not one of width 128)."""
    job = _launch(tmp_path, f"{MODEL} --ffn-hidden-size 256 --num-experts 4 --moe-ffn-hidden-size 64 "
                            "--moe-shared-expert-intermediate-size 128")
    assert job.model["expert_ffn"] == 64 and job.model["shared_experts"] == 2
    assert "shared_expert_ffn" not in job.model


@pytest.mark.parametrize("flags, nproc, microbatches", [
    # 8 GPUs, TP 2: DP 4; 64 sequences a step in micro-batches of 2 over DP 4: 64 / (2 x 4) = 8
    ("--tensor-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 64", 8, 8),
    # 8 GPUs, TP 2 x CP 2: DP 2; 16 / (1 x 2) = 8 (CP is no data parallelism)
    ("--tensor-model-parallel-size 2 --context-parallel-size 2 --global-batch-size 16", 8, 8),
    # 16 GPUs, PP 4: DP 4; 32 / (1 x 4) = 8
    ("--pipeline-model-parallel-size 4 --global-batch-size 32", 16, 8),
])
def test_micro_batches_per_step_are_global_over_micro_times_dp(tmp_path, flags, nproc, microbatches):
    """Bugs: the micro-batch size left out of global / (micro x DP), or CP counted as data parallelism."""
    job = _launch(tmp_path, f"{MODEL} {flags}", nproc=nproc)
    assert job.step["microbatches"] == microbatches and not job.contradictions


def test_elastic_nnodes_takes_the_most_nodes(tmp_path):
    """Bug: torchrun's elastic --nnodes MIN:MAX read as its MIN. 8 a node on up to 4 nodes: 32."""
    job = _launch(tmp_path, MODEL, nproc=8, nnodes="2:4")
    assert (job.launched, job.gpus_per_node, job.world) == (32, 8, 32)
    assert "torchrun --nnodes 2:4: elastic; parasim takes the most, 4" in job.unmodelled


def test_nproc_per_node_that_is_no_number_is_one_process_a_node(tmp_path):
    """Bug: --nproc_per_node gpu (what torchrun finds) taken as 8 a node instead of the 1 parasim says it takes."""
    job = _launch(tmp_path, MODEL, nproc="gpu", nnodes="2")
    assert (job.launched, job.gpus_per_node) == (2, 1)
    assert "torchrun's --nproc_per_node is 'gpu': parasim takes 1 process per node" in job.contradictions


def test_srun_tasks_over_nodes_rounds_up(tmp_path):
    """Bug: -n over -N rounded down: 10 tasks on 4 nodes is 3 a node on the busiest (not 2)."""
    job = _job(tmp_path, f"srun -n 10 -N 4 python pretrain_gpt.py {MODEL}\n")
    assert (job.launched, job.gpus_per_node) == (10, 3)


def test_llama2_tokenizer_is_32000_tokens_before_padding(tmp_path):
    """Bug: 32K written as 32768. Llama 2's SentencePiece vocabulary has 32,000 tokens; Megatron pads it to a
    multiple of 128 x TP: 32,000 is 250 x 128 already, and at TP 2 (256) it becomes 125 x 256 = 32,000 too,
    at TP 3 (384): ceil(32000 / 384) = 84, 84 x 384 = 32,256."""
    job = _launch(tmp_path, "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --tokenizer-type "
                            "Llama2Tokenizer")
    assert job.model["vocab"] == 32000
    assert job.model_spec(tp=1).vocab == 32000 and job.model_spec(tp=3).vocab == 32256


@pytest.mark.parametrize("flags, zero", [
    ("--use-torch-fsdp2", 3),
    ("--use-megatron-fsdp", 3),  # Megatron-FSDP's default strategy, optim_grads_params
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", 2),
    ("--use-distributed-optimizer", 1),
    ("", 0),
])
def test_the_zero_stage_each_sharding_flag_gives(tmp_path, flags, zero):
    """Bugs: FSDP2 read as ZeRO-2; Megatron-FSDP without a strategy given another default than
    optim_grads_params (ZeRO-3)."""
    assert _launch(tmp_path, f"{MODEL} {flags}").layout["zero"] == zero


@pytest.mark.parametrize("backend, flash", [("local", False), ("unfused", False), ("flash", True),
                                            ("fused", True), ("auto", True)])
def test_which_attention_backends_keep_the_whole_scores(tmp_path, backend, flash):
    """Bug: the local backend (Megatron's own unfused attention) taken as FlashAttention."""
    assert _launch(tmp_path, f"{MODEL} --attention-backend {backend}").step["flash"] is flash


def test_kv_channels_other_than_hidden_over_heads_is_the_head_size(tmp_path):
    """Bug: --kv-channels read but the head size taken as hidden / heads (64 / 4 = 16) instead of the 32 the
    job gives; attention's weights are 4 heads x 32 = 128 wide."""
    job = _launch(tmp_path, f"{MODEL} --kv-channels 32")
    assert job.model["head_size"] == 32
    assert "head_size" not in _launch(tmp_path, f"{MODEL} --kv-channels 16").model  # 64 / 4: nothing to change


def test_multi_latent_attention_takes_megatrons_defaults(tmp_path):
    """Bug: an MLA default changed (Megatron-LM's arguments.py: --kv-lora-rank 32, --qk-head-dim 128,
    --qk-pos-emb-head-dim 64, --v-head-dim 128, no --q-lora-rank)."""
    job = _launch(tmp_path, f"{MODEL} --multi-latent-attention")
    got = {k: job.model.get(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                         "v_head_dim")}
    assert got == {"q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128}


def test_too_few_processes_for_the_expert_layout_is_a_contradiction(tmp_path):
    """Bug: the fewest GPUs a layout needs taken as TP x CP x PP, leaving EP x ETP out: EP 4 needs 4 GPUs
    (lcm(TP x CP, EP x ETP) = lcm(1, 4) = 4 per stage), so 2 processes do not hold it."""
    job = _launch(tmp_path, f"{MODEL} --num-experts 4 --expert-model-parallel-size 4", nproc=2)
    assert job.world == 4
    assert job.contradictions == [
        "the script's torchrun launches 2 processes (2 per node x 1 node), but TP 1 x CP 1 x PP 1 with EP 4 x ETP 1 "
        "needs a multiple of 4: parasim takes 4 GPUs (--gpus N, or --world N on layout and trace, takes another)"]


def test_grouped_query_attention_sets_kv_heads_not_heads(tmp_path):
    """Bug: --num-query-groups read into the attention heads."""
    job = _launch(tmp_path, "--num-layers 4 --hidden-size 64 --num-attention-heads 8 --vocab-size 128 "
                            "--group-query-attention --num-query-groups 2")
    assert (job.model["heads"], job.model["kv_heads"]) == (8, 2)


def test_the_vocabulary_pads_to_divisible_by_times_tp(tmp_path):
    """Bugs: the padding's default (128) changed, or TP left out of the multiple. 50,257 (GPT-2) at TP 2 pads
    to a multiple of 256: ceil(50257 / 256) = 197, 197 x 256 = 50,432; at TP 1, to 393 x 128 = 50,304."""
    job = _launch(tmp_path, "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 50257 "
                            "--tensor-model-parallel-size 2")
    assert job.model_spec().vocab == 50432 and job.model_spec(tp=1).vocab == 50304
    job = _launch(tmp_path, "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 50257 "
                            "--make-vocab-size-divisible-by 64")
    assert job.model_spec().vocab == 50304  # 786 x 64


# -- the Hugging Face config reader ---------------------------------------------------------------------------
BASE = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}


def _hf(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **fields}))
    return read_hf_config(str(path))


def test_num_key_value_heads_is_read(tmp_path):
    """Bug: num_key_value_heads (Llama's, Mistral's, Qwen's GQA field) ignored: every head its own K, V."""
    assert _hf(tmp_path, num_key_value_heads=2).model.kv_heads == 2


def test_intermediate_size_is_the_mlp_width(tmp_path):
    """Bug: intermediate_size ignored (the MLP taken as 4 x hidden = 256 instead of the 100 the config gives)."""
    assert _hf(tmp_path, intermediate_size=100).model.ffn == 100


@pytest.mark.parametrize("tie, tied", [(False, False), (True, True)])
def test_tie_word_embeddings_is_read(tmp_path, tie, tied):
    """Bug: tie_word_embeddings ignored (every model taken as tied): an untied output layer is vocab x hidden
    more weights."""
    assert _hf(tmp_path, tie_word_embeddings=tie).model.tied_embeddings is tied


def test_the_moe_fields_of_a_deepseek_style_config(tmp_path):
    """Bugs: num_experts_per_tok, n_shared_experts, moe_intermediate_size or first_k_dense_replace ignored, or
    moe_topk preferred to num_experts_per_tok (HF_FIELDS: the first name present wins)."""
    m = _hf(tmp_path, n_routed_experts=8, num_experts_per_tok=3, moe_topk=5, n_shared_experts=2,
            moe_intermediate_size=32, first_k_dense_replace=1).model
    assert (m.experts, m.top_k, m.shared_experts, m.expert_ffn, m.dense_layers) == (8, 3, 2, 32, 1)


def test_zero_key_value_heads_is_refused(tmp_path):
    """Bug: kv_heads allowed down to 0 (a division by zero later) instead of refused in one line."""
    with pytest.raises(UsageError, match="field for kv_heads must be an integer from 1"):
        _hf(tmp_path, num_key_value_heads=0)


def test_a_nested_text_config_wins_over_the_outer_fields(tmp_path):
    """Bug: a multimodal config's text_config merged under the outer fields instead of over them."""
    m = _hf(tmp_path, vocab_size=999, text_config={**BASE, "vocab_size": 256, "num_hidden_layers": 6}).model
    assert (m.vocab, m.layers) == (256, 6)


def test_biases_when_any_bias_field_is_true(tmp_path):
    """Bug: biases only when every bias field is true: Qwen2 has attention_bias-style biases and no MLP bias."""
    assert _hf(tmp_path, attention_bias=True, mlp_bias=False, rms_norm_eps=1e-6).model.bias is True
    assert _hf(tmp_path, attention_bias=False, mlp_bias=False).model.bias is False


@pytest.mark.parametrize("act", ["silu", "swiglu", "geglu"])
def test_gated_activations_make_a_three_matrix_mlp(tmp_path, act):
    """Bug: only silu taken as gated; swiglu and geglu are gated too."""
    assert _hf(tmp_path, hidden_act=act).model.gated is True
    assert _hf(tmp_path, hidden_act="gelu").model.gated is False


def test_a_head_dim_that_hidden_does_not_divide_into_is_kept(tmp_path):
    """Bug: `and` for `or`: hidden 100 over 3 heads does not divide, so head_dim 33 (3 x 33 = 99 wide) is the
    head size even though 100 // 3 is 33."""
    r = _hf(tmp_path, hidden_size=100, num_attention_heads=3, head_dim=33)
    assert r.model.head_size == 33
    assert any(line.startswith("head_dim 33: attention is 3 x 33 = 99 wide") for line in r.unmodelled)


@pytest.mark.parametrize("field, dense_at", [
    # Qwen-MoE: a layer has experts when (index + 1) % decoder_sparse_step == 0: with 2, layers 1 and 3
    ("decoder_sparse_step", "0, 2"),
    # DeepSeek-V2: a layer has experts when index % moe_layer_freq == 0: with 2, layers 0 and 2
    ("moe_layer_freq", "1, 3"),
])
def test_which_layers_are_dense_by_the_configs_step(tmp_path, field, dense_at):
    """Bugs: an off-by-one in either rule (index for index + 1, or the other way round)."""
    r = _hf(tmp_path, num_experts=4, num_experts_per_tok=2, **{field: 2})
    assert r.model.dense_layers == 2
    assert any(line.startswith(f"2 dense-MLP layers at {dense_at} of 4") for line in r.unmodelled), r.unmodelled


def test_mlp_only_layers_past_the_last_layer_are_refused(tmp_path):
    """Bug: the index bound `<=` for `<`: layer 4 of a 4-layer model (indices 0 to 3) accepted."""
    with pytest.raises(UsageError, match="mlp_only_layers must be a list of layer indices from 0 to 3"):
        _hf(tmp_path, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[4])
    assert _hf(tmp_path, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[3]).model.dense_layers == 1


def test_a_size_past_the_limit_is_refused(tmp_path):
    """Bug: the upper bound on a size dropped: 10**13 (past parasim's limit of 10**12) read as a model."""
    with pytest.raises(UsageError, match="field for hidden must be an integer from 1 to 1e"):
        _hf(tmp_path, hidden_size=10**13)


def test_rms_norm_eps_means_rmsnorm_whatever_the_model_type(tmp_path):
    """Bug: RMSNorm decided from model_type 'llama' instead of the rms_norm_eps field: Mistral and Qwen use
    RMSNorm too; GPT-2's layer_norm_epsilon is a LayerNorm."""
    assert _hf(tmp_path, model_type="mistral", rms_norm_eps=1e-5).model.norm == "rmsnorm"
    assert _hf(tmp_path, model_type="gpt2", layer_norm_epsilon=1e-5).model.norm == "layernorm"


def test_routing_over_every_group_is_not_group_limited(tmp_path):
    """Bug: topk_group == n_group (a token may use every group: no limit) read as group-limited routing; groups
    that divide the experts are read into the model, others named as not modelled."""
    r = _hf(tmp_path, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=4)
    assert not any(line.startswith("n_group") for line in r.unmodelled) and r.model.expert_groups is None
    r = _hf(tmp_path, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2)
    assert (r.model.expert_groups, r.model.groups_kept) == (4, 2)
    r = _hf(tmp_path, n_routed_experts=8, num_experts_per_tok=2, n_group=3, topk_group=2)
    assert any(line.startswith("n_group 3, topk_group 2: group-limited routing") for line in r.unmodelled)


# -- parasim compare -------------------------------------------------------------------------------------------
FLAGS = {"tp": "--tp", "sp": "--sp", "m": "-m"}


def _rendered(table) -> str:
    from rich.console import Console
    out = io.StringIO()
    Console(file=out, width=160, highlight=False, color_system=None).print(table)
    return out.getvalue()


def test_a_figure_only_a_later_run_has_counts_as_differing():
    """Bug: the figures to compare taken from the first run only, so one the first run lacks is never marked."""
    from parasim.figures import differing
    rows = [{"settings": {"tp": 2}, "figures": {"a": 1}}, {"settings": {"tp": 4}, "figures": {"a": 1, "b": 5}}]
    assert differing(rows) == ["b"]


def test_a_switch_is_labelled_by_its_name_alone():
    """Bug: a switch that is on labelled '--sp True' instead of '--sp'."""
    from parasim.render.compare import setting_label
    assert setting_label({"tp": 4, "sp": True, "m": 16}, FLAGS) == "--tp 4\n--sp\n-m 16"


def test_each_column_is_its_runs_settings_and_figures():
    """Bugs: the columns (or their cells) in another order than the runs, so a setting heads another run's
    figures."""
    from parasim.render.compare import compare_table
    rows = [{"settings": {"tp": t}, "figures": {"bytes": t * 100, "same": 7}} for t in (2, 4, 8)]
    table = compare_table("x", rows, FLAGS)
    assert [c.header for c in table.columns[1:]] == ["--tp 2", "--tp 4", "--tp 8"]
    bytes_row = [list(c.cells)[0] for c in table.columns[1:]]
    assert bytes_row == ["[bold]200[/bold]", "[bold]400[/bold]", "[bold]800[/bold]"]
    text = _rendered(table)
    line = next(ln for ln in text.splitlines() if "bytes" in ln and "B)" not in ln)
    assert line.index("200") < line.index("400") < line.index("800")
    assert "* bytes" in text and "* same" not in text


def test_the_settings_run_in_the_order_given():
    """Bug: the grid sorted (or reversed) instead of every combination in the order given, the first flag
    slowest."""
    from parasim.cli.compare import settings_grid
    grid = settings_grid(argparse.Namespace(knob_tp=[8, 2], knob_m=[1, 4]))
    assert grid == [{"tp": 8, "m": 1}, {"tp": 8, "m": 4}, {"tp": 2, "m": 1}, {"tp": 2, "m": 4}]


@pytest.mark.parametrize("text, why", [("2,2", "a value given twice"), ("4,2,4", "a value given twice"),
                                       ("2,,4", "separated by commas"), (",", "separated by commas"),
                                       ("0", "positive"), ("2,-4", "positive")])
def test_a_list_of_settings_is_refused_when_wrong(text, why):
    """Bugs: a repeated value accepted (`>` for `!=`), an empty item accepted (`any` for `all`), a zero or
    negative size accepted (int for positive)."""
    from parasim.cli.compare import _values
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        _values(int)(text)
    assert _values(int)("8,2,4") == [8, 2, 4]


def _show(rows, json_out: bool, capsys):
    from parasim.cli.compare import _show
    from parasim.figures import Comparison
    args = argparse.Namespace(plot=None, json=json_out)
    code = _show(args, Comparison("x", rows, FLAGS))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("json_out", [True, False])
def test_one_run_of_several_that_disagrees_fails_the_comparison(capsys, json_out):
    """Bugs: exit 0 when any (not every) run agrees with its reference; the count of those that disagree
    taken as every run."""
    rows = [{"settings": {"tp": t}, "figures": {"a": t}, "ok": ok} for t, ok in ((2, True), (4, False), (8, True))]
    code, out = _show(rows, json_out, capsys)
    assert code == 1
    if not json_out:
        assert out.rstrip().endswith("every run checked itself against its single-device reference: 1 disagree")
    code, out = _show([{**r, "ok": True} for r in rows], json_out, capsys)
    assert code == 0


@pytest.mark.parametrize("flag, value", [("--token", "t6"), ("--world", "8"), ("--sp", None)])
def test_a_layout_size_given_to_a_lesson_is_refused(flag, value):
    """Bug: --token (or another layout-only flag) given to a lesson's comparison silently ignored."""
    r = cli("compare", "sp", "--tp", "2,4", flag, *([value] if value else []))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert f"{flag} is a layout size" in r.stderr


def test_chunks_is_refused_for_a_layout_and_m_is_not():
    """Bug: the refusal of --chunks (a lesson's setting) checked on another setting, -m."""
    r = cli("compare", "layout", "--tp", "2", "--chunks", "2")
    assert r.returncode == 2 and "--chunks is a lesson's setting" in r.stderr
    r = cli("compare", "layout", "--tp", "2", "--sp", "-m", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert [row["settings"] for row in json.loads(r.stdout)["rows"]] == [{"tp": 2, "microbatches": 2, "sp": True}]


def test_one_layout_keeps_its_settings_in_its_column():
    """Bug: the settings every run shares always left out of the columns' labels, so a single run's column has
    no label at all (they are left out only when some setting still tells the columns apart)."""
    r = cli("compare", "layout", "--tp", "2", "--sp")
    assert r.returncode == 0, r.stderr
    header = r.stdout.split("┡")[0]
    assert "TP 2" in header.split("\n", 2)[2] and "SP" in header.split("\n", 2)[2]


def test_bytes_across_nodes_are_kept_when_any_run_has_them():
    """Bug: a link's figure kept only when every run used it (`all` for `any`): 8 GPUs on nodes of 8 cross no
    node (0 B) while 16 do, and the 0 must still be shown beside the other run's bytes. TP pairs never cross
    a node, in either run, so that figure is left out."""
    r = cli("compare", "layout", "--tp", "2", "--sp", "--world", "8,16", "--json")
    assert r.returncode == 0, r.stderr
    small, big = (row["figures"] for row in json.loads(r.stdout)["rows"])
    assert small["dp-cp: bytes across nodes, all GPUs"] == 0 and big["dp-cp: bytes across nodes, all GPUs"] > 0
    assert "tp: bytes across nodes, all GPUs" not in small and "tp: bytes across nodes, all GPUs" not in big


# -- parasim serve ---------------------------------------------------------------------------------------------
class _Bound(Exception):
    pass


@pytest.fixture
def bound(monkeypatch):
    """serve.bind replaced: what it was asked to listen on is recorded, and the command stops there (exit 2),
    so no server starts."""
    from parasim.cli import serve
    asked = []

    def fake_bind(host, port):
        asked.append((host, port))
        raise UsageError("stopped before listening (test)")
    monkeypatch.setattr(serve, "bind", fake_bind)
    return asked


def test_serve_listens_on_loopback_port_8000_by_default(bound):
    """Bugs: the default host loosened to every interface (0.0.0.0), or the default port changed from the
    documented 8000."""
    r = cli("serve", "tp-mlp")
    assert r.returncode == 2 and "stopped before listening" in r.stderr
    assert bound == [("127.0.0.1", 8000)]


@pytest.mark.parametrize("port", ["1", "65535"])
def test_the_highest_and_lowest_ports_are_taken(bound, port):
    assert cli("serve", "tp-mlp", "--port", port).returncode == 2
    assert bound == [("127.0.0.1", int(port))]


@pytest.mark.parametrize("argv, says", [
    (["--world", "0", "x.py:fn"], "argument --world: expected a positive integer"),
    (["--max-apps", "0", "tp-mlp"], "--max-apps"),
    (["--max-apps", "65", "tp-mlp"], "65 is more than the limit of 64"),
    (["--world", "4", "tp-mlp"], "--world is for a program given as file.py:function; a lesson has its own"),
    (["--port", "65536", "tp-mlp"], "65,536 is more than the limit of 65,535"),
])
def test_bad_counts_are_refused_by_the_parser(bound, argv, says):
    """Bugs: --world read as any int (0 ranks accepted), or given to a lesson; --max-apps or --port unbounded."""
    r = cli("serve", *argv)
    assert r.returncode == 2 and says in r.stderr and bound == []


def _ns(**given):
    return argparse.Namespace(**{"name": None, "view": None, "trace": None, "memory": None, "world": None, "quiz": False, **given})


def test_all_three_things_to_serve_at_once_are_refused():
    """Bug: only two of NAME, --view and --trace refused together (`> 2` for `> 1`)."""
    from parasim.cli.serve import app_command
    with pytest.raises(UsageError, match="give one of NAME, --view, --trace and --memory, not NAME and --view and --trace"):
        app_command(_ns(name="tp-mlp", view="t.json", trace="--tp 2"))
    with pytest.raises(UsageError, match="not --view and --trace"):
        app_command(_ns(view="t.json", trace="--tp 2"))


@pytest.mark.parametrize("given", [{"view": "t.json"}, {"trace": "--tp 2 --sp"}])
def test_world_without_a_program_is_refused(given):
    """Bug: --world refused only beside --trace (or only beside a lesson), not beside --view."""
    from parasim.cli.serve import app_command
    with pytest.raises(UsageError, match="--world is for a program given as file.py:function"):
        app_command(_ns(world=2, **given))


def test_a_saved_trace_reaches_the_app_by_its_absolute_path(tmp_path, monkeypatch):
    """Bug: --view's path handed to each tab's app as written; the app's process need not start in this folder."""
    import shlex
    from parasim.cli.serve import app_command
    assert cli("lesson", "tp-mlp", "--trace", str(tmp_path / "t.json"), "--json").returncode == 0
    monkeypatch.chdir(tmp_path)
    command, title = app_command(_ns(view="t.json"))
    words = shlex.split(command)
    assert words[words.index("--view") + 1] == str(tmp_path / "t.json")
    assert title == "parasim view t.json"


@pytest.mark.parametrize("host, shown", [("fe80::1%eth0", "http://[fe80::1]:8000/"), ("::1", "http://[::1]:8000/"),
                                         # a zone no interface here has: not read by the socket library, and
                                         # still left out of the address
                                         ("fe80::1%nosuchif0", "http://[fe80::1]:8000/"),
                                         ("127.0.0.1", "http://127.0.0.1:8000/"),
                                         ("localhost", "http://localhost:8000/")])
def test_the_address_printed_for_a_host(host, shown):
    """Bugs: an IPv6 zone left in the browser's address; a loopback address printed as the machine's name."""
    from parasim.cli.serve import url
    assert url(host, 8000) == shown


@pytest.mark.parametrize("host", ["LOCALHOST", "LocalHost", "localhost"])
def test_localhost_in_any_case_binds_loopback(host):
    """Bug: localhost matched case-sensitively, so LOCALHOST is refused as a name (it names 127.0.0.1)."""
    from parasim.cli.serve import bind
    sock = bind(host, 0)
    with sock:
        assert sock.getsockname()[0] == "127.0.0.1"


def test_the_loopback_guard_follows_the_bound_address_not_the_spelling(monkeypatch):
    """Bug: the DNS-rebinding guard decided from --host as written (127.1, which is_loopback does not read)
    instead of the address the socket is bound to (127.0.0.1)."""
    from parasim.cli import serve
    seen = {}

    def fake_serve(command, title, page, listening, loopback_only, max_apps):
        seen.update(loopback_only=loopback_only, max_apps=max_apps, address=listening.getsockname()[0])
        listening.close()
    monkeypatch.setattr(serve.browser, "serve", fake_serve)
    real_bind = serve.bind
    monkeypatch.setattr(serve, "bind", lambda host, port: real_bind(host, 0))
    r = cli("serve", "tp-mlp", "--host", "127.1", "--max-apps", "3")
    assert r.returncode == 0, r.stderr
    assert seen == {"loopback_only": True, "max_apps": 3, "address": "127.0.0.1"}


@pytest.mark.parametrize("host, loopback", [("localhost:123456", False), ("127.0.0.1:99999", True),
                                            ("[::1]:1234567", False), ("localhost:65535", True)])
def test_a_host_header_port_longer_than_five_digits_is_not_loopback(host, loopback):
    """Bug: the Host header's port taken at any length (localhost:123456 is no port a browser sends)."""
    from parasim.tui.browser import loopback_host
    assert loopback_host(host) is loopback

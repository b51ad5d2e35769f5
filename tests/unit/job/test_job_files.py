"""Job files of other stacks read as they are (`--job FILE`): real files from DeepSpeed, DeepSpeedExamples,
accelerate and picotron (tests/data/jobs/, each with its origin in the folder's README.md), each field
accounted for, the plan they give, and the command line on them.

Every expected value is typed here from the file itself (its fields, read by eye and written down), from the
project's documented behaviour (tests/data/jobs/SURVEY.md names file and line), or worked by hand beside it.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cli

from parasim.errors import UsageError
from parasim.job import deepspeed, picotron
from parasim.job.formats import JOB_FORMATS, detect, read_job_file

DATA = Path(__file__).resolve().parents[2] / "data" / "jobs"
LLAMA = str(DATA / "hf" / "Llama-3.1-8B-Instruct_config.json")


def leaf_names(tree: dict, prefix: str = "") -> list[str]:
    """Every field of a file by dotted name, walked here (not by the reader's own walk)."""
    out = []
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out += leaf_names(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def accounted(job, name: str) -> int:
    """In how many of the reader's lists field `name` appears (used and unmodelled lines start with it)."""
    lists = (
        [f for f, _ in job.used],
        job.unmodelled,
        job.no_effect,
        job.unknown,
        job.assumed,
    )
    named = re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w.])")
    return sum(
        any(named.match(e) if entries is not job.assumed else named.search(e) for e in entries) for entries in lists
    )


@pytest.mark.parametrize(
    "file, stack",
    [
        ("deepspeed/accelerate_ds_config_zero3.json", "deepspeed"),
        ("deepspeed/ds_config_func_bs8_zero2_gas3.json", "deepspeed"),
        ("deepspeed/pipeline_parallelism_ds_config.json", "deepspeed"),
        ("deepspeed/sdma_allgather_ds_config_zero3.json", "deepspeed"),
        ("deepspeed/tensor_parallel_hf_ds_config.json", "deepspeed"),
        ("picotron/base_config.json", "picotron"),
        ("picotron/template_base_configs.json", "picotron"),
        ("hf/Llama-3.1-8B-Instruct_config.json", "hf"),
        ("hf/qwen3-30B-A3B_config.json", "hf"),
        ("hf/Llama-3.2-90B-Vision-Instruct_config.json", "hf"),
    ],
)
def test_each_real_file_is_told_apart_and_every_field_accounted_for(file, stack):
    path = str(DATA / file)
    assert detect(path).name == stack
    if stack == "hf":
        return
    fmt, job = read_job_file(path)
    tree = json.loads(Path(path).read_text())
    names = leaf_names(tree)
    assert names and [n for n in names if accounted(job, n) != 1] == []
    assert job.format == stack and fmt is JOB_FORMATS[stack]


def test_zero2_fp16_with_accumulation():
    """DeepSpeed's tests/model/Megatron_GPT2 file: micro-batch 8, accumulation 3, ZeRO-2, fp16 on, and an
    activation_checkpointing section (which only tunes what the model's code asks for)."""
    job = deepspeed.read(str(DATA / "deepspeed" / "ds_config_func_bs8_zero2_gas3.json"))
    assert job.layout["zero"] == 2 and job.layout["tp"] == 1
    assert job.step["micro_batch"] == 8 and job.step["microbatches"] == 3
    assert job.step["precision"] == "deepspeed-fp16" and job.step["recompute"] == "none"
    assert any(line.startswith("activation_checkpointing.partition_activations true") for line in job.unmodelled)
    assert job.world is None and job.unknown == [] and job.contradictions == []


def test_batch_256_of_micro_8_holds_whatever_dp_is(tmp_path):
    """DeepSpeedExamples' pipeline file: train_batch_size 256, micro-batch 8, no accumulation given, no
    precision section (FP32). On 8 GPUs DeepSpeed takes 256 / (8 x 8) = 4 micro-batches a step."""
    r = cli(
        "memory",
        "--job",
        str(DATA / "deepspeed" / "pipeline_parallelism_ds_config.json"),
        "--config",
        LLAMA,
        "--gpus",
        "8",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["layout"]["microbatches"] == 4 and got["layout"]["micro_batch"] == 8
    assert got["layout"]["precision"] == "fp32" and got["layout"]["dp"] == 8 and got["layout"]["zero"] == 0
    assert got["job"]["format"] == "deepspeed"


def test_all_three_batch_fields_give_dp(tmp_path):
    """train_batch_size 96 = micro 4 x accumulation 3 x DP 8; 100 is no whole DP: a contradiction, said."""
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "train_batch_size": 96,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 3,
                "bf16": {"enabled": True},
            }
        )
    )
    job = deepspeed.read(str(path))
    assert job.layout["dp"] == 8 and job.step["precision"] == "post" and job.contradictions == []
    path.write_text(
        json.dumps(
            {
                "train_batch_size": 100,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 3,
                "fp16": {"enabled": True},
                "bf16": {"enabled": True},
            }
        )
    )
    job = deepspeed.read(str(path))
    assert len(job.contradictions) == 2 and job.layout["dp"] == 8  # 100 // 12 = 8
    assert any("fp16 and bf16 both enabled" in c for c in job.contradictions)


def test_auto_values_are_said_and_offload_left_out():
    """accelerate's ZeRO-3 file: offload_optimizer and offload_param to the CPU, batch and precision "auto"."""
    job = deepspeed.read(str(DATA / "deepspeed" / "accelerate_ds_config_zero3.json"))
    assert job.layout["zero"] == 3 and job.step["micro_batch"] == 1
    left = [line.split(":")[0] for line in job.unmodelled]
    assert 'zero_optimization.offload_optimizer.device "cpu"' in left
    assert 'zero_optimization.offload_param.device "cpu"' in left
    said = " ".join(job.assumed)
    for name in ("train_batch_size is", "train_micro_batch_size_per_gpu is", "fp16.enabled and bf16.enabled are"):
        assert f'{name} "auto"' in said


def test_autotp_and_zero3_overlap():
    """DeepSpeedExamples' AutoTP file gives TP 4 with ZeRO-2; DeepSpeed's SDMA example ZeRO-3 in BF16 with
    overlap_comm (the reductions beside backward)."""
    tp = deepspeed.read(str(DATA / "deepspeed" / "tensor_parallel_hf_ds_config.json"))
    assert tp.layout["tp"] == 4 and tp.layout["zero"] == 2
    z3 = deepspeed.read(str(DATA / "deepspeed" / "sdma_allgather_ds_config_zero3.json"))
    assert z3.layout["zero"] == 3 and z3.step["precision"] == "post" and z3.overlap == ["grad-reduce"]


def test_picotron_grid_and_model_over_its_base():
    """picotron's old template: PP 2 x DP 2 = 4 GPUs, sequence 1,024, micro-batch 32, and 16 layers of 16
    heads (4 KV) set over the named model; two fields parasim has no entry for (master_addr, master_port). With
    DP 2 its gradients gather in FP32 buckets (DataParallelBucket(grad_type=torch.float32))."""
    job = picotron.read(str(DATA / "picotron" / "template_base_configs.json"))
    assert (job.layout["pp"], job.layout["tp"], job.world, job.seq) == (2, 1, 4, 1024)
    assert job.step["micro_batch"] == 32 and job.step["precision"] == "bf16-pure-dp"
    assert job.model == {"layers": 16, "heads": 16, "kv_heads": 4}
    assert job.model_name == "HuggingFaceTB/SmolLM-360M-Instruct"
    assert job.unknown == ["distributed.master_addr", "distributed.master_port"]
    from parasim.estimate.models import read_hf_config

    model = job.model_spec(read_hf_config(LLAMA).model)
    assert (model.layers, model.heads, model.kv_heads, model.hidden) == (16, 16, 4, 4096)


def test_picotron_model_state_is_eight_bytes_a_parameter():
    """picotron casts the model to BF16 and torch's AdamW keeps its moments in the parameters' dtype:
    2 (weights) + 2 (gradients) + 2 + 2 (Adam) = 8 bytes a parameter, nothing sharded (no ZeRO)."""
    r = cli("memory", "--job", str(DATA / "picotron" / "base_config.json"), "--config", LLAMA, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["bytes_per_param"] == pytest.approx(8.0)
    assert got["seq"] == 1024 and got["layout"]["world"] == 1


def test_a_file_without_the_model_asks_for_it():
    r = cli("memory", "--job", str(DATA / "picotron" / "base_config.json"))
    assert r.returncode == 2 and r.stdout == ""
    assert "HuggingFaceTB/SmolLM-360M-Instruct" in r.stderr and "--config" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("memory", "--job", str(DATA / "deepspeed" / "sdma_allgather_ds_config_zero3.json"))
    assert r.returncode == 2 and "does not describe the whole model" in r.stderr


def test_a_config_by_job_is_read_as_by_config():
    by_job = cli("memory", "--job", LLAMA, "--tp", "2", "--json")
    by_config = cli("memory", "--config", LLAMA, "--tp", "2", "--json")
    assert by_job.returncode == 0 and json.loads(by_job.stdout) == json.loads(by_config.stdout)


def test_the_job_in_words_before_the_answer(tmp_path):
    # A long path (CI's checkout is deeper than ours) wraps the headline; the count stays whole.
    deep = tmp_path / ("a-long-folder-name-" * 4) / "ds_config_func_bs8_zero2_gas3.json"
    deep.parent.mkdir()
    deep.write_text((DATA / "deepspeed" / "ds_config_func_bs8_zero2_gas3.json").read_text())
    r = cli(
        "memory",
        "--job",
        str(deep),
        "--config",
        LLAMA,
        "--gpus",
        "8",
    )
    assert r.returncode == 0, r.stderr
    head = r.stdout.split("\n\n")[0]
    assert head.startswith("DeepSpeed config, 15 fields: ")
    assert "zero_optimization.stage 2" in head and "not modelled (4)" in head
    assert "DP8 + ZeRO-2 on 8 GPUs" in r.stdout


@pytest.mark.parametrize(
    "text, said",
    [
        ("[1, 2]", "expected a DeepSpeed config"),
        ('{"zero_optimization": {"stage": 5}}', "stage must be 0 to 3"),
        ('{"train_micro_batch_size_per_gpu": -1}', "train_micro_batch_size_per_gpu must be an integer"),
        ('{"distributed": {"tp_size": 2, "pp_engine": "zb"}}', "pp_engine must be 1f1b or afab"),
        ('{"hello": 1}', "cannot place"),
    ],
)
def test_bad_files_one_line_exit_2(tmp_path, text, said):
    path = tmp_path / "job.json"
    path.write_text(text)
    fmt = ["--job-format", "deepspeed"] if text.startswith("[") else []
    r = cli("memory", "--job", str(path), *fmt, "--model", "27b")
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_readers_refuse_what_is_not_theirs(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": ' * 20 + "1" + "}" * 20)
    with pytest.raises(UsageError, match="nested more than"):
        deepspeed.read(str(path))


def test_a_vision_language_config_plans_its_language_model():
    """Llama 3.2 90B Vision's config.json nests the language model in text_config (100 layers of 8,192 with 64
    heads, 8 KV heads, MLP 28,672, vocabulary 128,256) beside vision_config; the language model's sizes are
    read, and the image encoder and the 20 cross-attention layers are named as not modelled."""
    from parasim.estimate.models import read_hf_config

    path = DATA / "hf" / "Llama-3.2-90B-Vision-Instruct_config.json"
    hf = read_hf_config(str(path))
    m = hf.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab) == (100, 8192, 64, 8, 28672, 128256)
    assert any(n.startswith("vision_config:") for n in hf.unmodelled)
    assert any(n.startswith("cross_attention_layers: 20 of the 100 layers") for n in hf.unmodelled)


def test_outer_fields_do_not_replace_text_config(tmp_path):
    """The same file with the vision tower's width (1,280, its vision_config's hidden_size) written in the outer
    object too, as LLaVA-style configs carry one there: text_config's 8,192 is still the model's."""
    from parasim.estimate.models import read_hf_config

    outer = json.loads((DATA / "hf" / "Llama-3.2-90B-Vision-Instruct_config.json").read_text())
    outer["hidden_size"] = outer["vision_config"]["hidden_size"]  # 1,280: LLaVA-style configs carry one outside
    path = tmp_path / "config.json"
    path.write_text(json.dumps(outer))
    assert read_hf_config(str(path)).model.hidden == 8192


def test_accumulation_alone_gives_the_micro_batches():
    """No train_batch_size in DeepSpeed's ZeRO-2 file: its gradient_accumulation_steps 3 is the step's count of
    micro-batches whatever DP is (DeepSpeed then derives the batch: 8 x 3 x DP)."""
    r = cli("memory", "--job", str(DATA / "deepspeed" / "ds_config_func_bs8_zero2_gas3.json"), "--config", LLAMA,
            "--gpus", "16", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layout"]["microbatches"] == 3


def test_a_script_is_megatrons():
    """What is not JSON goes to the Megatron-LM reader: the repository's own Megatron scripts."""
    for script in sorted((DATA.parent / "megatron").glob("*.sh")):
        assert detect(str(script)).name == "megatron"
    fmt, job = read_job_file(str(DATA.parent / "megatron" / "train_gpt3_175b_distributed.sh"))
    assert fmt.name == "megatron" and job.layout["tp"] == 8 and job.layout["pp"] == 16


# -- torchtitan's TOML train configs (torchtitan@238fa99, the last commit that shipped them) -----------------
TITAN = DATA / "torchtitan"


@pytest.mark.parametrize("file", ["llama3_8b.toml", "llama3_70b.toml", "llama3_405b.toml", "deepseek_v3_671b.toml",
                                  "llama4_17bx128e.toml"])
def test_each_torchtitan_file_is_told_apart_and_every_field_accounted_for(file):
    import tomllib

    path = str(TITAN / file)
    assert detect(path).name == "torchtitan"
    _, job = read_job_file(path)
    names = leaf_names(tomllib.loads(Path(path).read_text()))
    assert names and [n for n in names if accounted(job, n) != 1] == []


@pytest.mark.parametrize(
    "file, layers, hidden, ffn",
    [
        # the Llama 3 paper (arXiv:2407.21783), Table 3: layers, model dimension and FFN dimension
        ("llama3_8b.toml", 32, 4096, 14336),
        ("llama3_70b.toml", 80, 8192, 28672),
        ("llama3_405b.toml", 126, 16384, 53248),
    ],
)
def test_llama3_flavours_are_the_published_shapes(file, layers, hidden, ffn):
    from parasim.job import torchtitan

    job = torchtitan.read(str(TITAN / file))
    m = job.model_spec(None)
    assert (m.layers, m.hidden, m.ffn_size, m.kv_heads, m.vocab) == (layers, hidden, ffn, 8, 128256)


def test_llama3_8b_counts_its_published_parameters():
    """Llama 3.1 8B holds 8,030,261,248 parameters (its safetensors' total on the Hub); parasim leaves out the
    final norm (4,096): within 1e-6."""
    from parasim.job import torchtitan

    m = torchtitan.read(str(TITAN / "llama3_8b.toml")).model_spec(None)
    assert m.total_params() == pytest.approx(8_030_261_248, rel=1e-6)


def test_the_70b_and_405b_presets_plan_as_torchtitan_runs_them():
    """70B: TP 8 (with SP), FSDP over the rest, local batch 8 of 8,192 tokens, full recomputation, eager layers
    (compile off), weights gathered in BF16. 405B: the same grid with torchao's FP8 linears gathered in FP8,
    compiled layers and async TP."""
    from parasim.job import torchtitan

    j70 = torchtitan.read(str(TITAN / "llama3_70b.toml"))
    assert (j70.layout["tp"], j70.layout["sp"], j70.layout["zero"], j70.seq) == (8, True, 3, 8192)
    assert (j70.step["micro_batch"], j70.step["recompute"], j70.step["precision"], j70.step["fusion"]) == (
        8, "full", "fsdp2", "torch-eager")
    assert j70.world is None and set(j70.overlap) == {"grad-reduce", "prefetch"}
    j405 = torchtitan.read(str(TITAN / "llama3_405b.toml"))
    assert (j405.step["precision"], j405.step["fusion"], j405.step["micro_batch"]) == ("fsdp2-fp8-gather", "megatron", 2)
    assert "tp" in j405.overlap


def test_a_torchtitan_job_on_64_gpus():
    r = cli("memory", "--job", str(TITAN / "llama3_8b.toml"), "--gpus", "64", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["layout"]["dp"], got["layout"]["zero"], got["seq"], got["layout"]["recompute"]) == (
        64, 3, 8192, "selective")
    assert got["job"]["format"] == "torchtitan"


def test_pipeline_micro_batches_from_the_local_batch(tmp_path):
    """PP 4 with a local batch of 8 in micro-batches of 2: 8 / 2 = 4 micro-batches of 2 sequences; a global batch
    of 64 on DP 2 is 64 / (8 x 2) = 4 steps accumulated: 16 micro-batches."""
    from parasim.job import torchtitan

    path = tmp_path / "pp.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\n'
                    "seq_len = 4096\n[parallelism]\ndata_parallel_shard_degree = 2\npipeline_parallel_degree = 4\n"
                    "pipeline_parallel_microbatch_size = 2\n")
    job = torchtitan.read(str(path))
    assert (job.step["micro_batch"], job.step["microbatches"], job.world) == (2, 4, 8)
    r = cli("memory", "--job", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layout"]["microbatches"] == 16


def test_a_flavour_parasim_lacks_takes_the_config():
    r = cli("memory", "--job", str(TITAN / "llama4_17bx128e.toml"), "--gpus", "64")
    assert r.returncode == 2 and "llama4 17bx128e" in r.stderr and "--config" in r.stderr


def test_ddp_replicas_and_hsdp(tmp_path):
    """Two replicas of FSDP 4 with TP 2: 2 x 4 x 2 = 16 GPUs, HSDP named as not modelled; shard degree 1 with
    replicas is plain DDP (no sharding: ZeRO-0)."""
    from parasim.job import torchtitan

    path = tmp_path / "hsdp.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = 2\n'
                    "data_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n")
    job = torchtitan.read(str(path))
    assert job.world == 16 and job.layout["zero"] == 3
    assert any(line.startswith("parallelism.data_parallel_replicate_degree 2 with FSDP: HSDP") for line in job.unmodelled)
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = 8\n'
                    "data_parallel_shard_degree = 1\n")
    job = torchtitan.read(str(path))
    assert job.world == 8 and job.layout["zero"] == 0 and job.unmodelled == []


def test_the_plan_takes_the_jobs_kernels():
    """torchtitan's 70B runs its layers eagerly (compile off) and attention through PyTorch's SDPA (FlashAttention
    2): the plan the command times is made with both."""
    r = cli("memory", "--job", str(TITAN / "llama3_70b.toml"), "--gpus", "64", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["layout"]
    assert (got["fusion"], got["attention_kernel"]) == ("torch-eager", "fa2")


# -- written back in each stack's own form, and read back to the same plan ---------------------------------
ROUND_TRIPS = [
    ("deepspeed/accelerate_ds_config_zero3.json", LLAMA, 8),
    ("deepspeed/ds_config_func_bs8_zero2_gas3.json", LLAMA, 16),
    ("deepspeed/pipeline_parallelism_ds_config.json", LLAMA, 8),
    ("deepspeed/sdma_allgather_ds_config_zero3.json", LLAMA, 32),
    ("deepspeed/tensor_parallel_hf_ds_config.json", LLAMA, 16),
    ("picotron/base_config.json", LLAMA, None),
    ("picotron/template_base_configs.json", LLAMA, None),
    ("torchtitan/llama3_8b.toml", None, 64),
    ("torchtitan/llama3_70b.toml", None, 64),
    ("torchtitan/llama3_405b.toml", None, 128),
]


@pytest.mark.parametrize("file, config, gpus", ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_each_real_file_is_written_back_and_read_back_to_the_same_plan(tmp_path, file, config, gpus):
    from parasim.estimate.models import read_hf_config
    from parasim.job.formats import write_job
    from parasim.megatron.job import plan_of

    fmt, job = read_job_file(str(DATA / file))
    base = read_hf_config(config).model if config else None
    model = job.model_spec(base)
    plan = plan_of(job, model, gpus)
    seq = job.seq or 4096
    written = write_job(fmt.name, model, plan, seq, tuple(job.overlap), job)
    again = tmp_path / Path(file).name
    again.write_text(written.text)
    fmt2, job2 = read_job_file(str(again))
    model2 = job2.model_spec(base)
    assert fmt2 is fmt and model2 == model
    same = plan_of(job2, model2)
    # micro-batches left to their default (PP's count) and written as that count are one plan
    assert replace(same, microbatches=same.m) == replace(plan, microbatches=plan.m)
    assert (job2.seq or 4096) == seq and set(job2.overlap) == set(job.overlap)
    # what parasim does not set comes back as the user wrote it
    kept = {n: v for n, v in job.values.items() if n in job.no_effect}
    assert {n: job2.values[n] for n in kept} == kept


def test_a_plan_changed_here_is_written_in_the_stack_s_words():
    """torchtitan's 70B on 64 GPUs with PP 2 given here: FSDP 4 x TP 8 x PP 2, and the local batch of 8 run as 8
    micro-batches of one (DeepSpeed cannot hold the stages: a note says where they are set)."""
    r = cli("memory", "--job", str(TITAN / "llama3_70b.toml"), "--gpus", "64", "--pp", "2", "--microbatches", "8",
            "--micro-batch", "1", "--emit", "torchtitan")
    assert r.returncode == 0, r.stderr
    import tomllib

    got = tomllib.loads(r.stdout)
    assert got["parallelism"]["data_parallel_shard_degree"] == 4 and got["parallelism"]["pipeline_parallel_degree"] == 2
    assert got["parallelism"]["pipeline_parallel_microbatch_size"] == 1 and got["training"]["local_batch_size"] == 8
    assert got["model"] == {"name": "llama3", "flavor": "70B", "hf_assets_path": "./assets/hf/Llama-3.1-70B"}
    r = cli("memory", "--job", str(TITAN / "llama3_70b.toml"), "--gpus", "64", "--pp", "2", "--emit", "deepspeed")
    assert r.returncode == 0 and json.loads(r.stdout)["zero_optimization"]["stage"] == 3
    assert "parasim: note: PP 2: not in a ds_config" in r.stderr


def test_emit_refuses_a_search_and_a_model_config():
    r = cli("fit", "--model", "27b", "--search", "--emit", "deepspeed")
    assert r.returncode == 2 and "--emit writes one layout's plan" in r.stderr
    r = cli("memory", "--model", "27b", "--emit", "hf")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_plain_dp_and_fp8_gathers_in_torchtitan_s_words():
    """ZeRO-0 on 8 GPUs is torchtitan's DDP: 8 replicas of a shard of one; FP8 linears gathered in FP8 are its
    float8 converter with enable_fsdp_float8_all_gather on."""
    import tomllib

    r = cli("memory", "--job", str(TITAN / "llama3_8b.toml"), "--gpus", "8", "--zero", "0", "--emit", "torchtitan")
    assert r.returncode == 0, r.stderr
    grid = tomllib.loads(r.stdout)["parallelism"]
    assert (grid["data_parallel_replicate_degree"], grid["data_parallel_shard_degree"]) == (8, 1)
    r = cli("memory", "--job", str(TITAN / "llama3_8b.toml"), "--gpus", "8", "--precision", "fsdp2-fp8-gather",
            "--emit", "torchtitan")
    got = tomllib.loads(r.stdout)
    assert got["model"]["converters"] == ["float8"]
    assert got["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True


def test_toml_tables_by_hand():
    from parasim.job.torchtitan import toml_text

    assert toml_text({"a": {}, "b": {"c": {"d": 1}}, "e": {"f": "x", "g": [True, 2.5]}}) == (
        '[a]\n\n[b.c]\nd = 1\n\n[e]\nf = "x"\ng = [true, 2.5]\n'
    )


def test_megatron_written_by_emit_reads_back(tmp_path):
    """Megatron-LM's own 175B script on 1,024 GPUs, written by --emit megatron and read back by --megatron: the
    same plan. A torchtitan job written as Megatron flags reads back to its layout too."""
    script = str(DATA.parent / "megatron" / "train_gpt3_175b_distributed.sh")
    r = cli("memory", "--megatron", script, "--gpus", "1024", "--emit", "megatron")
    assert r.returncode == 0, r.stderr
    (tmp_path / "job.sh").write_text(r.stdout)
    first = json.loads(cli("memory", "--megatron", script, "--gpus", "1024", "--json").stdout)
    again = json.loads(cli("memory", "--megatron", str(tmp_path / "job.sh"), "--json").stdout)
    assert again["layout"] == first["layout"] and again["seq"] == first["seq"]
    r = cli("memory", "--job", str(TITAN / "llama3_70b.toml"), "--gpus", "64", "--emit", "megatron")
    assert r.returncode == 0, r.stderr
    (tmp_path / "titan.sh").write_text(r.stdout)
    got = json.loads(cli("memory", "--megatron", str(tmp_path / "titan.sh"), "--json").stdout)["layout"]
    assert (got["tp"], got["dp"], got["world"], got["recompute"]) == (8, 8, 64, "full")


def test_layout_takes_a_job_file():
    """`parasim layout --job`: torchtitan's 70B on 64 GPUs is TP 8 (with SP) x DP 8, no expert split of its own
    (a dense model's experts' TP is TP's); picotron's old template PP 2 x DP 2 on its 4 GPUs; a model's
    config.json gives no layout."""
    r = cli("layout", "--job", str(TITAN / "llama3_70b.toml"), "--world", "64", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {k: got["layout"][k] for k in ("tp", "dp", "pp", "etp", "world")} == {"tp": 8, "dp": 8, "pp": 1, "etp": 8,
                                                                                   "world": 64}
    assert got["job"]["format"] == "torchtitan"
    r = cli("layout", "--job", str(DATA / "picotron" / "template_base_configs.json"), "--json")
    assert {k: json.loads(r.stdout)["layout"][k] for k in ("pp", "dp", "world")} == {"pp": 2, "dp": 2, "world": 4}
    r = cli("layout", "--job", LLAMA)
    assert r.returncode == 2 and "gives no layout" in r.stderr
    r = cli("layout", "--job", str(TITAN / "llama3_70b.toml"), "--layout", "27b-tp8")
    assert r.returncode == 2 and "--layout NAME or --job FILE" in r.stderr


def test_layout_of_a_job_as_megatron_flags():
    """torchtitan's 70B layout written as Megatron-LM flags: TP 8, and its fsdp2 precision as the nearest
    Megatron has (BF16 weights; megatron-bf16's --bf16)."""
    r = cli("layout", "--job", str(TITAN / "llama3_70b.toml"), "--world", "64", "--megatron-args", "--json")
    assert r.returncode == 0, r.stderr
    args = json.loads(r.stdout)["megatron_args"]["args"]
    assert args[args.index("--tensor-model-parallel-size") + 1] == "8" and "--bf16" in args


# -- found by review: each a case the real files do not hold ------------------------------------------------
def _ds(tmp_path, fields: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_deepspeed_fills_the_micro_batch_from_the_batch(tmp_path):
    """DeepSpeed's own rule (config.py, _set_batch_related_parameters): batch 64 and accumulation 2 on DP 8 is a
    micro-batch of 64 / (2 x 8) = 4; batch 64 alone is accumulation 1 and a micro-batch of 8."""
    for fields, micro, m in (({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 4, 2),
                             ({"train_batch_size": 64}, 8, 1)):
        r = cli("memory", "--job", _ds(tmp_path, fields), "--model", "27b", "--gpus", "8", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)["layout"]
        assert (got["micro_batch"], got["microbatches"], got["dp"]) == (micro, m, 8)


def test_deepspeed_dp_stays_when_stages_are_added(tmp_path):
    """Batch 96 = micro 4 x accumulation 3 x DP 8; PP 2 given beside the file keeps DP 8: 16 GPUs."""
    path = _ds(tmp_path, {"train_batch_size": 96, "train_micro_batch_size_per_gpu": 4,
                          "gradient_accumulation_steps": 3})
    got = json.loads(cli("memory", "--job", path, "--model", "27b", "--pp", "2", "--json").stdout)["layout"]
    assert (got["dp"], got["pp"], got["world"], got["microbatches"]) == (8, 2, 16, 3)


def test_deepspeed_switches_said_by_their_value(tmp_path):
    job = deepspeed.read(_ds(tmp_path, {"train_batch_size": 8, "zero_optimization": {"overlap_comm": False},
                                        "fp16": {"enabled": "auto"}, "bf16": {"enabled": False}}))
    assert ("zero_optimization.overlap_comm false", "off") in job.used and job.overlap == []
    assert job.step["precision"] == "deepspeed-fp16"
    r = cli("memory", "--job", _ds(tmp_path, {"zero_optimization": {"overlap_comm": "yes"}}), "--model", "27b")
    assert r.returncode == 2 and "must be true or false" in r.stderr


def test_torchtitan_ddp_and_moe_plans_read_back_the_same(tmp_path):
    """Written and read back: DDP over 2 GPUs (replicas 2, shard 1: no FSDP, so no ZeRO); and an MoE plan with EP 2
    and expert TP 1 beside TP 2 (torchtitan's expert TP default is 1: an absent field must read back as 1)."""
    import tomllib

    r = cli("memory", "--model", "27b", "--dp", "2", "--zero", "0", "--emit", "torchtitan")
    grid = tomllib.loads(r.stdout)["parallelism"]
    assert (grid["data_parallel_replicate_degree"], grid["data_parallel_shard_degree"]) == (2, 1)
    (tmp_path / "ddp.toml").write_text(r.stdout)
    got = json.loads(cli("memory", "--job", str(tmp_path / "ddp.toml"), "--model", "27b", "--json").stdout)
    assert (got["layout"]["dp"], got["layout"]["zero"], got["layout"]["world"]) == (2, 0, 2)
    qwen = str(DATA / "hf" / "qwen3-30B-A3B_config.json")
    # a plan torchtitan can hold as it is: FSDP (ZeRO-3) with its own precision
    flags = ["--config", qwen, "--tp", "2", "--sp", "--ep", "2", "--etp", "1", "--gpus", "4", "--zero", "3",
             "--precision", "fsdp2", "--no-dropout"]  # torchtitan's models keep no dropout masks
    r = cli("memory", *flags, "--emit", "torchtitan")
    (tmp_path / "moe.toml").write_text(r.stdout)
    back = json.loads(cli("memory", "--job", str(tmp_path / "moe.toml"), "--config", qwen, "--json").stdout)
    first = json.loads(cli("memory", *flags, "--json").stdout)
    assert (back["layout"]["etp"], back["layout"]["ep"], back["total"]) == (1, 2, first["total"])


def test_torchtitan_without_fsdp_trains_tp_in_fp32_and_cp_shards(tmp_path):
    """torchtitan's maybe_enable_amp: with TP or PP and no FSDP, HSDP or CP, no mixed precision (FP32). With a
    shard degree of 1 and CP 2, FSDP still shards over CP (ZeRO-3)."""
    from parasim.job import torchtitan

    path = tmp_path / "t.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = 1\n'
                    "tensor_parallel_degree = 8\n")
    job = torchtitan.read(str(path))
    assert (job.layout["zero"], job.step["precision"], job.overlap) == (0, "fp32", ["grad-reduce"])
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = 1\n'
                    "context_parallel_degree = 2\n")
    job = torchtitan.read(str(path))
    assert (job.layout["zero"], job.step["precision"]) == (3, "fsdp2")


def test_picotron_dp_buckets_are_twelve_bytes_a_parameter():
    """With DP 2 picotron keeps an FP32 main_grad beside the BF16 model, AdamW's BF16 moments and the BF16 grad
    it hands AdamW: 2 + 4 + 2 + 2 + 2 = 12 bytes a parameter; its all-reduce is FP32 (4 bytes a parameter
    moved, against 2 for the BF16 of one GPU's job)."""
    r = cli("memory", "--job", str(DATA / "picotron" / "template_base_configs.json"), "--config", LLAMA, "--json")
    got = json.loads(r.stdout)
    assert got["bytes_per_param"] == pytest.approx(12.0) and got["precision"]["grad_reduce"] == "float32"


def test_review_refusals_in_one_line(tmp_path):
    bad = tmp_path / "pico.json"
    bad.write_text(json.dumps({"distributed": {"tp_size": 2, "pp_engine": ["1f1b"]}}))
    for command in (["memory", "--job", str(bad), "--model", "27b"], ["layout", "--job", str(bad)]):
        r = cli(*command)
        assert r.returncode == 2 and "pp_engine must be 1f1b or afab" in r.stderr and "Traceback" not in r.stderr
    script = str(DATA.parent / "megatron" / "train_gpt3_175b_distributed.sh")
    for command in ("memory", "layout"):
        r = cli(command, "--job", str(TITAN / "llama3_8b.toml"), "--megatron", script)
        assert r.returncode == 2 and "--job FILE or --megatron FILE, not both" in r.stderr
    r = cli("memory", "--job", str(TITAN / "llama3_405b.toml"), "--model", "27b", "--gpus", "128")
    assert r.returncode == 2 and "gives its own model (126 layers of 16384)" in r.stderr


def test_a_model_over_its_base_is_named_for_both():
    r = cli("memory", "--job", str(DATA / "picotron" / "base_config.json"), "--config", LLAMA)
    assert r.returncode == 0 and "llama with the picotron config's layers 16, heads 16, kv_heads 4" in r.stdout

"""torchtitan's Python config registry (`--job config_registry.py:NAME`), read from its syntax and never run:
the real registry at two commits against the TOML files of the same presets (another reader, another format),
every field accounted for, the token-based batch by hand, `--job-set` for torchtitan's command-line overrides, and
every file parasim cannot follow refused in one line."""
from __future__ import annotations

import ast
import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cli
from test_job_files import accounted

from parasim.errors import UsageError
from parasim.job.formats import detect, read_job_file
from parasim.job.torchtitan_registry import read

TITAN = Path(__file__).parents[2] / "data" / "jobs" / "torchtitan"
NOW = TITAN / "llama3_config_registry.py"  # torchtitan@b5bcd76
FIRST = TITAN / "llama3_config_registry_at_9810191.py"  # the registry as the refactor first wrote it


def _plan(job_path: str, gpus: int = 128) -> dict:
    got = cli("memory", "--job", job_path, "--gpus", str(gpus), "--json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["layout"]


@pytest.mark.parametrize(
    "registry, toml, differ",
    [
        # the registry wraps the loss in ChunkedLossWrapper where the TOML files had none
        (f"{NOW}:llama3_8b", "llama3_8b.toml", {"chunked_loss": (True, False)}),
        (f"{NOW}:llama3_70b", "llama3_70b.toml", {"chunked_loss": (True, False)}),
        # today's 405B converter leaves torchao's FP8 all-gather at its default (off); the TOML turned it on
        (
            f"{NOW}:llama3_405b",
            "llama3_405b.toml",
            {"chunked_loss": (True, False), "precision": ("fsdp2-fp8", "fsdp2-fp8-gather")},
        ),
        (f"{FIRST}:llama3_8b", "llama3_8b.toml", {}),
        (f"{FIRST}:llama3_70b", "llama3_70b.toml", {}),
        (f"{FIRST}:llama3_405b", "llama3_405b.toml", {}),
    ],
)
def test_a_registry_preset_plans_as_the_toml_file_of_the_same_preset(registry, toml, differ):
    assert detect(registry).name == "torchtitan-py" and detect(str(TITAN / toml)).name == "torchtitan"
    mine, theirs = _plan(registry), _plan(str(TITAN / toml))
    assert {k: (mine[k], theirs[k]) for k in theirs if mine[k] != theirs[k]} == differ


def _functions(path: Path) -> list[str]:
    return [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]


@pytest.mark.parametrize("path, name", [(p, n) for p in (NOW, FIRST) for n in _functions(p)])
def test_every_config_function_of_both_registries_is_read_and_every_field_accounted_for_once(path, name):
    job = read(f"{path}:{name}")
    assert job.unknown == [] and job.contradictions == []
    assert [n for n in job.values if accounted(job, n) != 1] == []


def test_the_70b_function_has_the_fields_its_source_writes():
    """Read off torchtitan's llama3_70b by eye: a class of its own is a field; job_config's classes are tables."""
    want = {
        "loss", "loss.loss_fn", "loss.loss_fn.global_vocab_size", "hf_assets_path",
        "profiler", "profiler.enable_profiling", "profiler.profile_freq", "metrics", "metrics.enable_tensorboard",
        "model_spec", "optimizer", "optimizer.lr",
        "training.num_tokens_per_microbatch_per_dp_rank", "training.max_context_length", "training.steps",
        "dataloader", "dataloader.dataset", "dataloader.dataset.dataset", "parallelism.tensor_parallel_degree",
        "checkpoint", "checkpoint.interval", "activation_checkpoint", "validator", "validator.freq", "validator.steps",
    }  # fmt: skip
    job = read(f"{NOW}:llama3_70b")
    assert set(job.values) == want
    assert job.values["training.num_tokens_per_microbatch_per_dp_rank"] == 8 * 8192  # worked out: 8 * 8192
    assert (job.layout["tp"], job.layout["sp"], job.step["micro_batch"], job.seq) == (8, True, 8, 8192)
    assert (job.step["recompute"], job.step["chunked_loss"], job.step["precision"]) == ("full", True, "fsdp2")


def _registry(tmp_path, body: str, name: str = "cfg") -> str:
    path = tmp_path / "config_registry.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:{name}"


HEAD = """
def base() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("8B"),
        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=4 * 4096, max_context_length=4096),
        parallelism=ParallelismConfig(tensor_parallel_degree=2, pipeline_parallel_degree=2, num_pp_microbatches=6,
                                      data_parallel_shard_degree=2),
        activation_checkpoint=SelectiveAC.Config(),
    )
"""


def test_a_derived_function_token_sizes_and_pp_micro_batches(tmp_path):
    job = read(_registry(tmp_path, HEAD + """
def cfg() -> Trainer.Config:
    config = base()
    config.training.num_tokens_per_train_step = 4 * 4096 * 6 * 2 * 3
    config.compile = CompileConfig(enable=True, enable_async_tensor_parallel=True)
    return config
"""))
    # 4 sequences of 4,096 a forward; 6 micro-batches under PP; FSDP 2; the step 3 times one forward of each
    assert (job.step["micro_batch"], job.step["microbatches"], job.seq) == (4, 6, 4096)
    assert job.step["global_batch"] == 4 * 6 * 2 * 3
    assert (job.layout["tp"], job.layout["pp"], job.layout["zero"], job.world) == (2, 2, 3, 2 * 2 * 2)
    assert job.step["recompute"] == "selective" and job.step["fusion"] == "megatron" and "tp" in job.overlap


def test_sequence_parallel_off_and_async_tp_where_the_first_registry_kept_it(tmp_path):
    job = read(_registry(tmp_path, HEAD + """
def cfg() -> Trainer.Config:
    config = base()
    config.parallelism.enable_sequence_parallel = False
    return config
"""))
    assert (job.layout["tp"], job.layout["sp"]) == (2, False)
    # torchtitan@9810191 kept async TP under parallelism (as the TOML files), today's under compile
    assert "tp" in read(f"{FIRST}:llama3_405b").overlap and "tp" in read(f"{NOW}:llama3_405b").overlap
    assert "tp" not in read(f"{NOW}:llama3_70b").overlap


def test_sizes_that_do_not_divide_are_said(tmp_path):
    job = read(_registry(tmp_path, HEAD + """
def cfg() -> Trainer.Config:
    config = base()
    config.training.num_tokens_per_microbatch_per_dp_rank = 5000
    config.training.num_tokens_per_train_step = 4096 * 7
    return config
"""))
    assert job.step["micro_batch"] == 1
    assert any("5,000 is not a multiple of max_context_length 4,096" in c for c in job.contradictions)
    assert any("num_tokens_per_train_step 28,672 is not a multiple" in c for c in job.contradictions)


def test_an_expression_parasim_cannot_work_out_is_kept_as_its_text(tmp_path):
    job = read(_registry(tmp_path, HEAD + """
def cfg() -> Trainer.Config:
    config = base()
    config.training.steps = int(os.environ["STEPS"])
    return config
"""))
    assert job.values["training.steps"] == "int(os.environ['STEPS'])" and "training.steps" in job.no_effect


@pytest.mark.parametrize("body, said", [
    ("def cfg() -> Trainer.Config:\n    for x in y:\n        pass\n    return base()\n", "plain assignments"),
    ("def cfg() -> Trainer.Config:\n    return dict(a=1)\n", "does not return a Trainer.Config"),
    ("def cfg() -> Trainer.Config:\n    return Trainer.Config(**kw)\n", "does not return a Trainer.Config"),
    ("def cfg() -> Trainer.Config:\n    config = base()\n    other.x = 1\n    return config\n", "cannot follow"),
    ("def cfg(\n", "not a Python file parasim can read"),
    ("def loop() -> Trainer.Config:\n    return cfg()\ndef cfg() -> Trainer.Config:\n    return loop()\n",
     "more than 8 deep"),
    ("def cfg() -> Trainer.Config:\n    return Trainer.Config(activation_checkpoint=MyAC.Config())\n",
     "parasim knows FullAC, SelectiveAC and NoAC"),
])
def test_what_parasim_cannot_follow_is_refused_in_one_line(tmp_path, body, said):
    with pytest.raises(UsageError, match=said):
        read(_registry(tmp_path, HEAD + body))


def test_the_command_line_names_the_function_and_sets_fields(tmp_path):
    path = str(NOW)
    got = cli("memory", "--job", path, "--gpus", "8")
    assert got.returncode == 2 and "name the config function as" in got.stderr and "llama3_70b" in got.stderr
    got = cli("memory", "--job", f"{path}:llama3_7b", "--gpus", "8")
    assert got.returncode == 2 and "no function 'llama3_7b'" in got.stderr
    # torchtitan's --parallelism.tensor_parallel_degree 4 --training.max_context_length 4096, as --job-set
    plan = json.loads(cli("memory", "--job", f"{path}:llama3_70b", "--gpus", "64", "--json",
                          "--job-set", "parallelism.tensor_parallel_degree=4",
                          "--job-set=--training.max_context_length=4096").stdout)  # torchtitan's spelling
    assert (plan["layout"]["tp"], plan["layout"]["dp"], plan["seq"]) == (4, 16, 4096)
    words = cli("memory", "--job", f"{path}:llama3_70b", "--gpus", "64",
                "--job-set", "parallelism.tensor_parallel_degree=4").stdout
    assert "set on the command line, in place of the file's: parallelism.tensor_parallel_degree=4" in words


@pytest.mark.parametrize("argv, said", [
    (["--model", "27b", "--job-set", "a=1"], "--job-set changes a field of a job file: give it with --job FILE"),
    (["--job", "{hf}", "--job-set", "a=1"], "a model's sizes are changed by parasim's own flags"),
    (["--job", "{toml}", "--job-set", "bad name=1"], "expected NAME=VALUE"),
    (["--job", "{toml}", "--job-set", "novalue"], "expected NAME=VALUE"),
])
def test_job_set_misuse_is_one_line(argv, said):
    hf = str(TITAN.parent / "hf" / "Llama-3.1-8B-Instruct_config.json")
    got = cli("memory", *[a.format(hf=hf, toml=TITAN / "llama3_70b.toml") for a in argv])
    assert got.returncode == 2 and said in got.stderr and got.stderr.count("\n") == 1, got.stderr


def test_job_set_on_a_json_stack_and_its_values_typed(tmp_path):
    ds = TITAN.parent / "deepspeed" / "ds_config_func_bs8_zero2_gas3.json"
    _, job = read_job_file(str(ds), sets=("zero_optimization.stage=3", "fp16.enabled=false", "steps_per_print=x"))
    assert job.layout["zero"] == 3 and job.values["fp16.enabled"] is False and job.values["steps_per_print"] == "x"
    assert job.sets == ("zero_optimization.stage=3", "fp16.enabled=false", "steps_per_print=x")


# -- written as a config function (--emit torchtitan-py), read back to the same plan -----------------------------
def _round_trip(tmp_path, job, plan, base_file: Path | None):
    from parasim.job.formats import write_job
    from parasim.megatron.job import plan_of

    model = job.model_spec(None)
    written = write_job("torchtitan-py", model, plan, job.seq, tuple(job.overlap), job)
    again = tmp_path / "config_registry.py"
    again.write_text((base_file.read_text() + "\n\n" if base_file else "") + written.text)
    job2 = read(f"{again}:llama3_parasim_plan")
    assert replace(job2.model_spec(None), name=model.name) == model and job2.unknown == [] == job2.contradictions
    same = plan_of(job2, model, plan.world)
    assert replace(same, microbatches=same.m) == replace(plan, microbatches=plan.m)
    # FSDP prefetches (ZeRO-3) and async TP where the function had it; DDP reduces beside backward alone
    want = {"grad-reduce"} | ({"prefetch"} if plan.zero == 3 else set()) | ({"tp"} & set(job.overlap))
    assert set(job2.overlap) == want
    return written


@pytest.mark.parametrize("name, gpus", [("llama3_8b", 8), ("llama3_70b", 64), ("llama3_405b", 128)])
@pytest.mark.parametrize("path", [NOW, FIRST], ids=["now", "first"])
def test_a_registry_function_written_over_itself_reads_back_to_the_same_plan(tmp_path, path, name, gpus):
    from parasim.megatron.job import plan_of

    job = read(f"{path}:{name}")
    plan = plan_of(job, job.model_spec(None), gpus)
    written = _round_trip(tmp_path, job, plan, path)
    assert f"    config = {name}()\n" in written.text


@pytest.mark.parametrize("change", [
    dict(tp=4, pp=2, dp=8, microbatches=4),  # 64 GPUs either way
    dict(recompute="selective", chunked_loss=False),
    dict(precision="fsdp2-fp8-gather"),
    dict(tp=8, sp=False),
    dict(zero=0, tp=1, sp=False, dp=64),  # DDP: FSDP's shard degree 1 (with TP it would train in FP32: below)
])
def test_a_changed_plan_is_written_in_the_function_and_read_back(tmp_path, change):
    from dataclasses import replace as changed
    from parasim.megatron.job import plan_of

    job = read(f"{NOW}:llama3_70b")
    plan = changed(plan_of(job, job.model_spec(None), 64), **change)
    _round_trip(tmp_path, job, plan, NOW)


def test_ddp_beside_tp_is_written_with_a_note_and_reads_back_in_fp32(tmp_path):
    from dataclasses import replace as changed
    from parasim.job.formats import write_job
    from parasim.megatron.job import plan_of

    job = read(f"{NOW}:llama3_70b")
    plan = changed(plan_of(job, job.model_spec(None), 64), zero=0)
    written = write_job("torchtitan-py", job.model_spec(None), plan, job.seq, tuple(job.overlap), job)
    assert any("torchtitan trains in FP32 there" in n for n in written.notes)
    again = tmp_path / "config_registry.py"
    again.write_text(NOW.read_text() + "\n\n" + written.text)
    assert read(f"{again}:llama3_parasim_plan").step["precision"] == "fp32"


def test_a_plan_from_elsewhere_is_a_whole_trainer_config(tmp_path):
    """From the TOML 8B (no function to build on): a Trainer.Config of its own, with the flavour's model_registry."""
    from parasim.job.torchtitan import read as read_toml
    from parasim.megatron.job import plan_of

    toml = read_toml(str(TITAN / "llama3_8b.toml"))
    plan = plan_of(toml, toml.model_spec(None), 16)
    written = _round_trip(tmp_path, toml, plan, None)
    assert "model_spec=model_registry('8B')" in written.text and "config = Trainer.Config(" in written.text

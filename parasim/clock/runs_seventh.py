"""A seventh held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py, runs_fourth.py, runs_fifth.py and runs_sixth.py uses, blind: while the time model was being changed
by someone else, and without any of these runs being timed or scored by the gatherer. It is to be scored once,
later, as it stands.

Same format as runs_sixth.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure), built with runs.training_plan; `assumed` says what the source leaves out and
the value taken, `variants` the doubtful choices. The notes, docs/notes/step-time-runs-seventh.md, quote every
figure and say where it was read. The sources have their own registry (SOURCES below), each in the set
runs.SEVENTH ("seventh"); a SeventhRun(...) is a PublishedRun that looks its source up there. SEVENTH is the runs, as
SIXTH is in runs_sixth.py.

Both sources are MLCommons MLPerf Training rounds (github.com/mlcommons/training_results_v3.0 and _v3.1): the
closed-division GPT-3 175B submissions on H100 80GB SXM, each submission's MLLOG result log (result_0.txt) and its
config_*.sh. The figure is the median of the log's per-step "train_step_timing" (seconds a global batch; every
training step is logged), so the unit is seconds a step. Gaudi2 and TPU submissions are left out (no GPU sheet).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec
from .runs import SEVENTH as SEVENTH_SET, PublishedRun, Source, training_plan

GATHERED = "2026-12-05"  # the date every figure here was read
_V30 = "63e326c400f5d8bb8c6070a9ab08332d4931152e"
_V31 = "d06288b2bd675a9d88e0e6181f5bb5626b71ec19"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "MLPerf Training v3.0 GPT-3",
            "MLCommons, MLPerf Training v3.0 results, closed division, gpt3 benchmark: "
            "NVIDIA and NVIDIA+CoreWeave H100 submissions, results/<system>/gpt3/result_0.txt (MLLOG "
            "train_step_timing) with benchmarks/gpt3/implementations/pytorch/config_*.sh, conf/megatron_gpt_config"
            ".yaml and run_and_time.sh, commit 63e326c (2023-08-10; round published 2023-06)",
            f"https://github.com/mlcommons/training_results_v3.0/tree/{_V30}",
            "2023-06",
            SEVENTH_SET,
            "new: audited MLPerf submissions, measured on the submitters' own clusters (NVIDIA's DGX H100 pods and "
            "CoreWeave's HGX H100); no earlier set reads an MLPerf log (the NeMo summary only links to mlcommons.org)",
        ),
        Source(
            "MLPerf Training v3.1 GPT-3",
            "MLCommons, MLPerf Training v3.1 results, closed division, gpt3 benchmark: "
            "NVIDIA (Eos) and Azure+NVIDIA (ND H100 v5) submissions, results/<system>/gpt3/result_0.txt (MLLOG "
            "train_step_timing) with benchmarks/gpt3/implementations/pytorch/config_*.sh, conf/ and "
            "run_and_time.sh, commit d06288b (2025-01-14; round published 2023-11)",
            f"https://github.com/mlcommons/training_results_v3.1/tree/{_V31}",
            "2023-11",
            SEVENTH_SET,
            "new: the next round (NGC 23.09 containers), the Eos and Azure clusters, 512 to 10752 GPUs. Same "
            "benchmark, code lineage (NVIDIA's NeMo/Megatron) and publisher as the v3.0 source: a reader wanting "
            "independent sources may count the two as one",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
SeventhRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# MLPerf's GPT-3 175B as NVIDIA's config sets it (v3.0 config_common.sh and megatron_gpt_config.yaml; v3.1's
# megatron_gpt_config_custom.yaml defaults): 96 layers, hidden 12288, ffn 49152, 96 heads, sequence 2048,
# 'layernorm1p' (a LayerNorm), GELU, biases, learned absolute positions, shared input and output embeddings, no
# dropout. The vocabulary (the benchmark's SentencePiece model) is not printed in the files read: its 50257 tokens
# (GPT-3's) padded to make_vocab_size_divisible_by 128 x TP 4 = 50688 is assumed
MLPERF_GPT3 = ModelSpec(
    name="GPT-3 175B (MLPerf)", layers=96, hidden=12288, heads=96, ffn=49152, vocab=50688, tied_embeddings=True
)

_SAID = (
    "NVIDIA's NeMo/Megatron implementation as the submission's config_*.sh and run_and_time.sh set it: TP 4, "
    "PP 8 with the interleaved schedule at 12 virtual stages (INTERLEAVED_PIPELINE=12: one layer a chunk), "
    "micro-batch 1, sequence parallelism (SEQ_PARALLEL True), no activation checkpointing "
    "(ACT_CKPT_GRANULARITY null); TransformerEngine layers (transformer_engine True; attention timed as the "
    "newest kernel); FP8 hybrid with delayed scaling (FP8=True, FP8_HYBRID=True, FP8_AMAX_HISTORY=1024, "
    "FP8_AMAX_ALGO max); BF16 O2 weights (megatron_amp_O2) with apex's distributed_fused_adam as the "
    "distributed optimizer (ZeRO-1), grad_sync_dtype bf16 (gradients reduced in BF16), overlap_grad_sync and "
    "overlap_param_sync True; TP communication overlap (TP_COMM_OVERLAP=True, userbuffers); the 96 layers "
    "evenly on 8 stages; sequence 2048 and the global batch as the log prints them (max_sequence_length, "
    "global_batch_size; its gradient_accumulation_steps is the micro-batches a replica); the figure is the "
    "median of every train_step_timing the log holds (the first steps after the restart from the "
    "checkpoint and the steps beside evaluation included in the set it is taken over); training resumes "
    "from the benchmark's checkpoint, so every step is a full-size step"
)
_VARIANTS: dict[str, dict[str, Any]] = {
    "no TP overlap": {"overlap": ("grad-reduce", "prefetch")},
    "FP32 gradient reduction": {"precision": "megatron-bf16-fp8-delayed"},
}

# (source, org, system, GPUs, global batch, accumulation, median s, mean s, steps logged, min s, max s, config file,
# note)
_ROWS = (
    (
        "MLPerf Training v3.0 GPT-3",
        "NVIDIA",
        "dgxh100_n64_nemo",
        512,
        2048,
        128,
        12.0827,
        12.0873,
        288,
        11.993,
        13.687,
        "config_DGXH100_64x8x128x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.0 GPT-3",
        "NVIDIA",
        "dgxh100_n96_nemo",
        768,
        3072,
        128,
        12.1282,
        12.1231,
        192,
        12.053,
        12.305,
        "config_DGXH100_96x8x128x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.0 GPT-3",
        "NVIDIA_CoreWeave",
        "coreweave_hgxh100_n96_ngc23.04_pytorch",
        768,
        3072,
        128,
        12.3223,
        12.3279,
        200,
        12.196,
        13.743,
        "config_DGXH100_96x8x128x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.0 GPT-3",
        "NVIDIA_CoreWeave",
        "coreweave_hgxh100_n192_ngc23.04_pytorch",
        1536,
        3072,
        64,
        6.3264,
        6.3186,
        200,
        6.24,
        6.473,
        "config_DGXH100_192x8x64x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.0 GPT-3",
        "NVIDIA_CoreWeave",
        "coreweave_hgxh100_n448_ngc23.04_pytorch",
        3584,
        2688,
        24,
        2.5943,
        2.589,
        220,
        2.504,
        2.969,
        "config_DGXH100_448x8x24x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos_n64_ngc23.09_nemo",
        512,
        2048,
        128,
        11.0453,
        11.0454,
        288,
        11.005,
        11.397,
        "config_DGXH100_64x8x192x4x8_mbs1.sh",
        "; the only 64-node config in the repository says MINIBS=192 (global batch 3072), while the log prints "
        "global_batch_size 2048 and gradient_accumulation_steps 128: the log's batch is taken",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos_n96_ngc23.09_nemo",
        768,
        3072,
        128,
        11.0723,
        11.0865,
        200,
        11.033,
        13.988,
        "config_DGXH100_96x8x128x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos-dfw_n512_ngc23.09_nemo",
        4096,
        2048,
        16,
        1.6084,
        1.6096,
        288,
        1.568,
        2.039,
        "config_DGXH100_512x8x16x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos-dfw_n768_ngc23.09_nemo",
        6144,
        3072,
        16,
        1.6159,
        1.6168,
        200,
        1.574,
        2.111,
        "config_DGXH100_768x8x16x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos-dfw_n1024_ngc23.09_nemo",
        8192,
        4096,
        16,
        1.6193,
        1.623,
        156,
        1.574,
        2.329,
        "config_DGXH100_1024x8x16x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos-dfw_n1280_ngc23.09_nemo",
        10240,
        2560,
        8,
        0.9256,
        0.9288,
        230,
        0.881,
        1.639,
        "config_DGXH100_1280x8x8x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "NVIDIA",
        "eos-dfw_n1344_ngc23.09_nemo",
        10752,
        2688,
        8,
        0.9296,
        0.9316,
        220,
        0.881,
        1.557,
        "config_DGXH100_1344x8x8x4x8_mbs1.sh",
        "",
    ),
    (
        "MLPerf Training v3.1 GPT-3",
        "Azure+NVIDIA",
        "ND_H100_v5_n1344_pytorch",
        10752,
        2688,
        8,
        0.9451,
        0.952,
        220,
        0.9,
        1.288,
        "config_DGXH100_1344x8x8x4x8_mbs1.sh",
        "; Azure's config files match NVIDIA's for this size apart from comments",
    ),
)


def _key(source: str, system: str) -> str:
    rnd = "v30" if "v3.0" in source else "v31"
    return f"mlperf-{rnd}-gpt3-175b-h100-{system.split('_ngc')[0].replace('_', '-').lower()}"


def _mlperf() -> list[PublishedRun]:
    out = []
    for src, org, system, gpus, gbs, acc, median, mean, n, lo, hi, config, note in _ROWS:
        dp = gpus // 32
        assert dp * acc == gbs, (system, dp, acc, gbs)
        plan = training_plan(
            gbs,
            "zero-1",
            tp=4,
            pp=8,
            dp=dp,
            sp=True,
            micro_batch=1,
            chunks=12,
            flash=True,
            precision="megatron-bf16-reduce-bf16-fp8-delayed",
        )
        out.append(
            SeventhRun(
                _key(src, system),
                src,
                f"{org}/results/{system}/gpt3/result_0.txt, train_step_timing: median {median:g} s over {n} logged "
                f"steps (mean {mean:g}, min {lo:g}, max {hi:g}); global_batch_size {gbs}",
                "h100",
                gpus,
                MLPERF_GPT3,
                plan,
                2048,
                median,
                "s per step",
                precision="fp8",
                sharding="zero-1",
                schedule="interleaved",
                overlap=("grad-reduce", "prefetch", "tp"),
                assumed=f"{org} {system}: {gpus // 8} nodes x 8 H100-SXM5-80GB (systems/{system}.json); {config}: TP 4, "
                f"PP 8, DP {dp}, {acc} micro-batches a replica; {_SAID}{note}",
                variants=dict(_VARIANTS),
            )
        )
    return out


SEVENTH: tuple[PublishedRun, ...] = tuple(_mlperf())


def seventh_runs() -> list[PublishedRun]:
    """Every run of the seventh held-out set (gathered blind; scored once, later)."""
    return list(SEVENTH)

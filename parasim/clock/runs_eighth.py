"""An eighth held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py, runs_fourth.py, runs_fifth.py, runs_sixth.py and runs_seventh.py uses, blind: without any of these
runs being timed or scored by the gatherer. It was scored once, as it stands, with the model of 2026-12-05 after
the B200's kernel tables (clock/sets.py).

Same format as runs_seventh.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure), built with runs.training_plan; `assumed` says what the source leaves out and
the value taken, `variants` the doubtful choices. The notes, docs/notes/step-time-runs-eighth.md, quote every
figure and say where it was read. The sources have their own registry (SOURCES below), each in the set
runs.EIGHTH ("eighth"); an EighthRun(...) is a PublishedRun that looks its source up there. EIGHTH is the runs.

Both sources are MLCommons MLPerf Training rounds:
- v6.0 (2026), the gpt_oss_20b benchmark: a mixture-of-experts model (24 layers, 32 experts, top-4) trained by
  Megatron-Core through NeMo / Megatron-Bridge, on B200 (Lambda, CoreWeave) and H100 (Cisco). The canonical
  repository (mlcommons/training_results_v6.0) is not stored here; its files were read in a copy,
  github.com/Richardyu114/training_results_v6.0 at eabf23a. The logs record "train_step_time" for one step in 32
  and, at each block's end (before each evaluation), the block's mean step time; the figure is the median of the
  block means read, the first block (warm-up, CUDA-graph capture) left out.
- v4.1 (2024-11), the gpt3 benchmark (GPT-3 175B): NVIDIA (Eos, H100; a B200 preview) and Oracle (H100)
  submissions whose logs record "train_step_timing in s" for every step; the figure is the median.
So the unit is seconds a step throughout.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec
from .runs import EIGHTH as EIGHTH_SET, PublishedRun, Source, training_plan
from .runs_seventh import MLPERF_GPT3

GATHERED = "2026-12-05"  # the date every figure here was read
_V60 = "eabf23a07b2a0c60a289ff871dc3a46fff0d0421"  # Richardyu114/training_results_v6.0 (a copy of mlcommons')
_V41 = "b87b9e396f771345d4ef122ba33456304f15228d"  # mlcommons/training_results_v4.1

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "MLPerf Training v6.0 gpt-oss-20b",
            "MLCommons, MLPerf Training v6.0 results, closed division, "
            "gpt_oss_20b benchmark: Lambda (1 x 8 B200), CoreWeave (8 x 8 B200) and Cisco (8 x 8 and 16 x 8 H100) "
            "submissions, results/<system>/gpt_oss_20b/result_*.txt (MLLOG tracked_stats train_step_time) with "
            "benchmarks/gpt_oss_20b/.../config_*.sh and conf/gpt_oss.yaml; read in the copy "
            "Richardyu114/training_results_v6.0 at commit eabf23a (mlcommons/training_results_v6.0 is not stored "
            "here)",
            f"https://github.com/Richardyu114/training_results_v6.0/tree/{_V60}",
            "2026-06",
            EIGHTH_SET,
            "new: a new round and a new benchmark (the first MoE pre-training benchmark in MLPerf); no earlier set "
            "reads any v6.0 file or any gpt-oss-20b run; three submitters on their own clusters",
        ),
        Source(
            "MLPerf Training v4.1 GPT-3",
            "MLCommons, MLPerf Training v4.1 results, closed division, gpt3 "
            "benchmark: NVIDIA (Eos H100, a B200 preview) and Oracle (BM.GPU.H100.8) submissions, "
            "results/<system>/gpt3/result_0.txt (MLLOG tracked_stats 'train_step_timing in s') with "
            "benchmarks/gpt3/.../config_*.sh and conf/, commit b87b9e3 (2024-12-11; round published 2024-11)",
            f"https://github.com/mlcommons/training_results_v4.1/tree/{_V41}",
            "2024-11",
            EIGHTH_SET,
            "new: the seventh set read v3.0 and v3.1 only; v4.1 has other systems (Oracle's RoCE cluster, a B200), "
            "NGC 24.09 software and a micro-batch of 2. Same benchmark, code lineage and publisher as the seventh "
            "set's sources: a reader wanting independent sources may count it with them",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
EighthRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# gpt-oss-20b as MLPerf v6.0 trains it, from the Lambda log's printed Megatron-Core config (num_layers 24,
# hidden_size 2880, num_attention_heads 64, num_query_groups 8, kv_channels 64, ffn_hidden_size 2880,
# moe_ffn_hidden_size 2880, num_moe_experts 32, moe_router_topk 4, gated_linear_unit True, normalization RMSNorm,
# linear biases) and its module print (linear_qkv 2880 -> 5120, linear_proj 4096 -> 2880, output_layer 2880 ->
# 128256, a separate output layer: the Llama 3.1 tokenizer of the benchmark). Not in the shapes: every other layer's
# 128-token sliding window (window_size (127, 0), window_attn_skip_freq 2) and the learnable softmax sinks
# (softmax_type 'learnable'); every layer is timed with full causal attention
GPT_OSS_20B = ModelSpec(
    name="gpt-oss-20b (MLPerf)",
    layers=24,
    hidden=2880,
    heads=64,
    kv_heads=8,
    head_size=64,
    ffn=2880,
    experts=32,
    top_k=4,
    expert_ffn=2880,
    vocab=128256,
    gated=True,
    norm="rmsnorm",
)

_OSS_SAID = (
    "Megatron-Core MoE through NeMo / Megatron-Bridge: grouped GEMMs, the flex token dispatcher, router "
    "load balancing 'none' and no forced balance (the routing is the model's own, timed as dropless and "
    "balanced), TransformerEngine attention (timed as the newest kernel), the distributed optimizer "
    "(USE_DIST_OPTIMIZER True: ZeRO-1) with gradient reduction and parameter gathers overlapped "
    "(OVERLAP_GRAD_REDUCE, OVERLAP_PARAM_GATHER True), gradients reduced in BF16 (the Lambda log's "
    "grad_reduce_in_fp32=False), sequence 8192 and the global batch as the log prints them; CUDA graphs "
    "(no plan field); the figure is the median of the block mean step times read in the log "
    "(callback_logging's train_step_time without a loss beside it), the first block left out"
)

# (key, system, GPU, GPUs, global batch, tp, cp, ep, dp, micro-batch, precision, dispatcher, recompute, overlap,
# median s, block means read, result file, config file, what the run's files say)
_OSS = (
    (
        "mlperf-v60-gptoss20b-b200-lambda-n1",
        "b200_n1_ngc25.09_nemo",
        "b200",
        8,
        16,
        1,
        1,
        1,
        8,
        2,
        "megatron-bf16-reduce-bf16-fp8-blockwise-gather",
        "hybridep",
        "selective",
        ("grad-reduce", "prefetch"),
        0.45315,
        (0.45329786255283006, 0.45300315847590766),
        "Lambda/results/b200_n1_ngc25.09_nemo/gpt_oss_20b/result_1.txt",
        "Lambda/benchmarks/gpt_oss_20b/implementations/b200_0504/config_DGXB200_1x8x2xtp1pp1cp1ep1_mxfp8.sh",
        "1 node x 8 B200 (the log's SYSJSON: 'NVIDIA B200', 183359 MiB); TP 1, PP 1, CP 1, EP 1 (all 32 experts on "
        "every GPU: no token dispatch between GPUs), DP 8, micro-batch 2 (MINIBS=2, MICRO_BATCH_SIZE=2), global batch "
        "16, one micro-batch a replica; MXFP8 (FP8_RECIPE=mxfp8, FP8_PARAM_GATHER True) timed as FP8 with blockwise "
        "scaling, the weights kept and gathered in FP8 (the -gather entry, since the ninth score); recompute_modules ['core_attn'] (the log) timed as selective recomputation; CUDA graph scope "
        "full_iteration (the log); dispatcher hybridep (the log's moe_flex_dispatcher_backend)",
    ),
    (
        "mlperf-v60-gptoss20b-b200-coreweave-n8",
        "CoreWeave_B200_8x8",
        "b200",
        64,
        64,
        1,
        2,
        4,
        32,
        1,
        "megatron-bf16-reduce-bf16-fp8-blockwise-gather",
        "hybridep",
        "selective",
        ("grad-reduce", "prefetch"),
        0.31881,
        (0.319109306014855, 0.3185132333663932),
        "CoreWeave/results/CoreWeave_B200_8x8/gpt_oss_20b/result_0.txt",
        "CoreWeave/benchmarks/gpt_oss_20b/implementations/CoreWeave_B200_8x8/config_DGXB200_8x8x1xtp1pp1cp2ep4_mxfp8"
        ".sh",
        "8 nodes x 8 B200-SXM-180GB (systems/CoreWeave_B200_8x8.json; 'InfiniBand NDR 400 Gb/s'); TP 1, PP 1, "
        "CP 2, EP 4 (HybridEP ranks a NVLink domain = EP), DP 32, micro-batch 1, global batch 64 (the log), so two "
        "micro-batches a replica (assumed: the log's gradient_accumulation_steps 1.0 counts the CP ranks as data "
        "parallel); MXFP8 timed as FP8 with blockwise scaling; the config sources config_common.sh, "
        "config_common_mxfp8.sh and config_common_cg.sh, which the submission does not hold: taken as Lambda's (the "
        "same NVIDIA recipe), so core-attention recomputation as Lambda's log prints it (assumed); CP's a2a exchange "
        "(cp_comm_type 'a2a' in the yaml) timed as parasim's CP",
    ),
    (
        "mlperf-v60-gptoss20b-h100-cisco-n8",
        "Zeus_8xH100_SXM_80GB",
        "h100",
        64,
        32,
        2,
        1,
        4,
        32,
        1,
        "megatron-bf16-reduce-bf16-fp8-delayed-gather",
        "deepep",
        "none",
        ("grad-reduce", "prefetch", "tp"),
        0.42574,
        (0.4257395922884914, 0.4257322901110546, 0.4258353262728697),
        "Cisco/results/Zeus_8xH100_SXM_80GB/gpt_oss_20b/result_1.txt",
        "Cisco/benchmarks/gpt_oss_20b/nemo/config_DGXH100_8x8x1xtp2pp1cp1ep4.sh",
        "8 nodes x 8 H100-SXM5-80GB (Cisco Zeus; 8 x ConnectX-8 400 Gb/s RoCE a node); TP 2 with sequence "
        "parallelism, PP 1, CP 1, EP 4, ETP 1, DP 32, micro-batch 1, global batch 32 (the log), one micro-batch a "
        "replica; FP8 hybrid with delayed scaling (config_common.sh FP8_RECIPE=delayed, FP8_AMAX_HISTORY=1024), FP8 "
        "parameter gathers; no recomputation (RECOMPUTE_MODULES unset); TP overlap (TP_COMM_OVERLAP True); DeepEP "
        "(MOE_FLEX_DISPATCHER_BACKEND=deepep); MOE_EXPERT_CAPACITY_FACTOR=1.25 without padding (tokens past capacity "
        "dropped; timed as dropless); MOE_EP_A2A_OVERLAP True, but with one micro-batch a replica there is no second "
        "micro-batch to pair with, so no switch is given for it; CUDA graphs on attention and the router",
    ),
    (
        "mlperf-v60-gptoss20b-h100-cisco-n16",
        "Zeus_16xH100_SXM_80GB",
        "h100",
        128,
        64,
        2,
        1,
        4,
        64,
        1,
        "megatron-bf16-reduce-bf16-fp8-delayed-gather",
        "deepep",
        "none",
        ("grad-reduce", "prefetch", "tp"),
        0.41554,
        (0.40115814867236665, 0.4154039234528785, 0.41553694177025174, 0.4155751115663724, 0.41567626911412764),
        "Cisco/results/Zeus_16xH100_SXM_80GB/gpt_oss_20b/result_1.txt",
        "Cisco/benchmarks/gpt_oss_20b/nemo/config_DGXH100_16x8x1xtp2pp1cp1ep4.sh",
        "16 nodes x 8 H100-SXM5-80GB (systems/Zeus_16xH100_SXM_80GB.json: '8x ConnectX-8 400Gb/s RDMA over "
        "Ethernet', 'Rail-optimized, 1 NIC per GPU'); TP 2 with sequence parallelism, PP 1, CP 1, EP 4, ETP 1, DP 64, "
        "micro-batch 1, global batch 64 (the log), one micro-batch a replica; the rest as the 8-node Cisco row (its "
        "config sources this one and changes only the node count and the learning-rate schedule)",
    ),
)


def _oss() -> list[PublishedRun]:
    out = []
    for (
        key,
        system,
        gpu,
        gpus,
        gbs,
        tp,
        cp,
        ep,
        dp,
        mbs,
        precision,
        dispatcher,
        recompute,
        overlap,
        median,
        blocks,
        result,
        config,
        said,
    ) in _OSS:
        assert tp * cp * dp == gpus and gbs % (dp * mbs) == 0, key
        plan = training_plan(
            gbs,
            "zero-1",
            tp=tp,
            cp=cp,
            dp=dp,
            ep=ep,
            etp=1,
            sp=tp > 1,
            micro_batch=mbs,
            recompute=recompute,
            flash=True,
            precision=precision,
            dispatcher=dispatcher,
        )
        variants: dict[str, dict[str, Any]] = {
            "FP32 gradient reduction": {"precision": precision.replace("-reduce-bf16", "")}
        }
        if recompute == "selective":
            variants["no recomputation"] = {"recompute": "none"}
        if gpu == "b200":
            variants["FP8 as tensorwise scaling"] = {"precision": precision.replace("blockwise", "tensorwise")}
        else:
            variants["EP all-to-all overlap as DualPipe"] = {"overlap": overlap + ("dualpipe",)}
        means = ", ".join(f"{b:g}" for b in blocks)
        out.append(
            EighthRun(
                key,
                "MLPerf Training v6.0 gpt-oss-20b",
                f"{result}, block mean train_step_time: median {median:g} s of the {len(blocks)} block means read "
                f"({means}); global_batch_size {gbs}, max_sequence_length 8192",
                gpu,
                gpus,
                GPT_OSS_20B,
                plan,
                8192,
                median,
                "s per step",
                precision="fp8",
                sharding="zero-1",
                schedule=None,
                overlap=overlap,
                assumed=f"{system}: {said}; {config}; {_OSS_SAID}",
                variants=variants,
            )
        )
    return out


# -- MLPerf Training v4.1 GPT-3 175B ---------------------------------------------------------------------------

_GPT3_SAID = (
    "NVIDIA's NeMo/Megatron implementation as the submission's config_*.sh and conf/custom.yaml set it: "
    "TP 4, PP 8 with the interleaved schedule (INTERLEAVED_PIPELINE as the config says), micro-batch 2 "
    "(MICRO_BATCH_SIZE=2), sequence parallelism (SEQ_PARALLEL default True), no activation "
    "checkpointing (ACT_CKPT_GRANULARITY default null); TransformerEngine layers (attention timed as the "
    "newest kernel); FP8 hybrid with delayed scaling (config_fp8.sh: FP8=True, FP8_HYBRID=True, "
    "FP8_AMAX_HISTORY=1024, FP8_AMAX_ALGO max), FP8_PARAMS True (the weights kept and gathered in "
    "FP8: the -gather entry, since the ninth score); megatron_amp_O2 BF16 weights with "
    "apex's distributed_fused_adam (USE_DIST_OPTIMIZER True: ZeRO-1), grad_sync_dtype bf16, "
    "overlap_grad_sync and overlap_param_sync True; TP communication overlap (TP_COMM_OVERLAP=True); "
    "the 96 layers evenly on 8 stages; sequence 2048 and the global batch as the log prints them; the "
    "figure is the median of every 'train_step_timing in s' the log holds (one per step; the run "
    "resumes from the benchmark's checkpoint, so every step is full-size)"
)

# (key, org, system, GPU, GPUs, global batch, accumulation, chunks, median, mean, steps, min, max, config, note)
_GPT3 = (
    (
        "mlperf-v41-gpt3-175b-h100-eos-n32",
        "NVIDIA",
        "eos_n32_ngc24.09_nemo",
        "h100",
        256,
        2048,
        128,
        6,
        18.3716,
        18.3755,
        300,
        18.0976,
        19.6199,
        "config_DGXH100_32x8x256x4x8_mbs2.sh",
        "",
    ),
    (
        "mlperf-v41-gpt3-175b-h100-eos-n64",
        "NVIDIA",
        "eos_n64_ngc24.09_nemo",
        "h100",
        512,
        2048,
        64,
        6,
        9.4931,
        9.4942,
        288,
        9.3609,
        9.8031,
        "config_DGXH100_64x8x128x4x8_mbs2.sh",
        "",
    ),
    (
        "mlperf-v41-gpt3-175b-h100-oracle-n192",
        "Oracle",
        "1536xBM.GPU.H100.8",
        "h100",
        1536,
        3072,
        32,
        4,
        5.1546,
        5.1538,
        208,
        5.098,
        5.1855,
        "config_DGXH100_192x8x64x4x8_mbs2.sh",
        "; Oracle's benchmark folders hold only the config_*.sh files and run scripts (the NeMo conf/ is NVIDIA's, "
        "assumed the same); systems/1536xBM.GPU.H100.8.json: 192 nodes, 'ROCE2', 'NVLINK Gen4 900 GB/s'",
    ),
    (
        "mlperf-v41-gpt3-175b-h100-oracle-n384",
        "Oracle",
        "3072xBM.GPU.H100.8",
        "h100",
        3072,
        3072,
        16,
        4,
        3.0497,
        3.0299,
        200,
        2.7162,
        3.5249,
        "config_DGXH100_384x8x32x4x8_mbs2.sh",
        "; as the 192-node Oracle row (384 nodes; the spread of its step times, 2.72 to 3.52 s, is the widest here)",
    ),
    (
        "mlperf-v41-gpt3-175b-b200-n8-preview",
        "NVIDIA",
        "b200_n8_preview_nemo",
        "b200",
        64,
        2048,
        512,
        6,
        36.0459,
        36.0441,
        288,
        35.9863,
        36.0654,
        "config_DGXB200_8x8x1024x4x8_mbs2_cg.sh",
        "; a preview (not yet available) B200 system, 8 nodes x 8 ('8xNVIDIA HGX B200' in the log); per-layer CUDA "
        "graphs (LAYER_CUDA_GRAPH=1, no plan field), cuDNN fused attention (NVTE_FUSED_ATTN=1); its "
        "config_common_blackwell.sh is not in the repository",
    ),
)
_GPT3_VARIANTS: dict[str, dict[str, Any]] = {
    "no TP overlap": {"overlap": ("grad-reduce", "prefetch")},
    "FP32 gradient reduction": {"precision": "megatron-bf16-fp8-delayed-gather"},
}


def _gpt3() -> list[PublishedRun]:
    out = []
    for key, org, system, gpu, gpus, gbs, acc, chunks, median, mean, n, lo, hi, config, note in _GPT3:
        dp = gpus // 32
        assert dp * 2 * acc == gbs, (key, dp, acc, gbs)
        plan = training_plan(
            gbs,
            "zero-1",
            tp=4,
            pp=8,
            dp=dp,
            sp=True,
            micro_batch=2,
            chunks=chunks,
            flash=True,
            precision="megatron-bf16-reduce-bf16-fp8-delayed-gather",
        )
        out.append(
            EighthRun(
                key,
                "MLPerf Training v4.1 GPT-3",
                f"{org}/results/{system}/gpt3/result_0.txt, 'train_step_timing in s': median {median:g} s over {n} "
                f"logged steps (mean {mean:g}, min {lo:g}, max {hi:g}); global_batch_size {gbs}",
                gpu,
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
                assumed=f"{org} {system}: {gpus // 8} nodes x 8 GPUs; {config}: TP 4, PP 8, DP {dp}, "
                f"{chunks} virtual stages, micro-batch 2, {acc} micro-batches a replica (the log's "
                f"gradient_accumulation_steps); {_GPT3_SAID}; the model as runs_seventh.MLPERF_GPT3 (vocabulary "
                f"assumed there){note}",
                variants=dict(_GPT3_VARIANTS),
            )
        )
    return out


EIGHTH: tuple[PublishedRun, ...] = tuple(_oss() + _gpt3())


def eighth_runs() -> list[PublishedRun]:
    """Every run of the eighth held-out set (gathered blind; scored once, later)."""
    return list(EIGHTH)

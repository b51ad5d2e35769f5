"""A tenth held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py, runs_fourth.py, runs_fifth.py, runs_sixth.py, runs_seventh.py, runs_eighth.py and runs_ninth.py
uses, blind: without any of these runs being timed or scored by the gatherer. It was kept unscored for the next
change to the model (FP8 parameter gathers, which its rows' configs set: their precision names the -gather entry)
and scored once, as it stands, after that change (clock/sets.py).

Same format as runs_eighth.py and runs_ninth.py: one PublishedRun per run (its source, GPU, model shapes, plan,
sequence, overlap switches and the published figure), built with runs.training_plan; `assumed` says what the
source leaves out and the value taken, `variants` the doubtful choices. The notes,
docs/notes/step-time-runs-tenth.md, quote every figure and say where it was read. The sources have their own
registry (SOURCES below), each in the set "tenth" (runs.TENTH); a TenthRun(...) is a PublishedRun that looks
its source up there. TENTH is the runs.

Both sources are MLCommons MLPerf Training rounds whose benchmarks no earlier set reads, both NVIDIA's NeMo /
Megatron-Core implementation run by the submitters on their own clusters:
- v5.0 (2025-06), llama31_405b (Llama 3.1 405B pre-training, sequence 8192, the Mixtral 8x22B tokenizer): NVIDIA's
  Eos-DFW (64 to 1024 nodes of 8 H100) and Nebius (64 and 128 nodes of 8 H200); the GB200 submissions are left out
  (no preset).
- v5.1 (2025-11), llama31_8b (Llama 3.1 8B pre-training, sequence 8192) on University of Florida's DGX B200 (1 to
  32 nodes) and Cisco's H100 (8 and 16 nodes), and llama31_405b on University of Florida's DGX B200 (32 and 56
  nodes). Nebius' v5.1 llama31_405b logs are byte-for-byte the step times of its v5.0 ones and are left out; the
  other B200 llama31_8b submitters are left out because their folders hold both FP8 and NVFP4 configs (parasim has
  no FP4 precision) and the logs do not say which ran.
The logs record "train_step_time" (the wall time between two training batches' ends, custom_callbacks.py's
DeltaTimingCallback) with "reduced_train_loss" beside it, for every logged step; the figure is the median of those
in one result file, so the unit is seconds a step throughout. No MoE run: neither round has an MoE pre-training
benchmark.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec, Stages
from .runs import TENTH as TENTH_SET, PublishedRun, Source, training_plan

GATHERED = "2026-12-05"  # the date every figure here was read
_V50 = "0fdc28f013256aea84fa36fdaf1e0fa46094b18c"  # mlcommons/training_results_v5.0
_V51 = "441d65f4445cd59687466533fd9f55399136e7a4"  # mlcommons/training_results_v5.1

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "MLPerf Training v5.0 Llama 3.1 405B",
            "MLCommons, MLPerf Training v5.0 results, closed division, "
            "llama31_405b benchmark: NVIDIA (eos-dfw_n64, n256, n304, n320 and n1024, ngc25.01, H100) and Nebius "
            "(nebius_soperator_8xH200_n64 and n128, ngc25.01, H200) submissions, results/<system>/llama31_405b/"
            "result_*.txt (MLLOG tracked_stats train_step_time) with benchmarks/llama31_405b/implementations/"
            "<system>/config_*.sh, conf/custom.yaml and pretrain.py, commit 0fdc28f (2025-05-30)",
            f"https://github.com/mlcommons/training_results_v5.0/tree/{_V50}",
            "2025-06",
            TENTH_SET,
            "new: a round and a benchmark no earlier set reads (Llama 3.1 405B pre-training as MLPerf defines it, "
            "NGC 25.01); the Llama 3 paper's rows are Meta's own cluster and software; Nebius is a submitter no "
            "earlier set has. Same publisher and NVIDIA NeMo lineage as the seventh and eighth sets' MLPerf rounds: "
            "a reader wanting independent sources may count it with them",
        ),
        Source(
            "MLPerf Training v5.1 Llama 3.1",
            "MLCommons, MLPerf Training v5.1 results, closed division: "
            "llama31_8b benchmark, University of Florida (hpg.dgxb200x8.n1 to n32, B200) and Cisco (hpf_n8, hpf_n16, "
            "H100) submissions; llama31_405b benchmark, University of Florida (hpg.dgxb200x8.n32, n56, B200); "
            "results/<system>/<benchmark>/result_0.txt (MLLOG tracked_stats train_step_time) with the submitters' "
            "benchmarks/<benchmark>/implementations/.../config_*.sh, conf/custom.yaml and pretrain.py, commit 441d65f "
            "(2026-01-12; round published 2025-11)",
            f"https://github.com/mlcommons/training_results_v5.1/tree/{_V51}",
            "2025-11",
            TENTH_SET,
            "new: a round no earlier set reads, with a benchmark (Llama 3.1 8B pre-training) none reads; University "
            "of Florida and Cisco's H100 cluster run NGC 25.09 on their own machines; B200 rows at 8 to 448 GPUs. "
            "Same publisher and NVIDIA NeMo lineage as the v5.0 source and the earlier MLPerf rounds",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
TenthRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# Llama 3.1 405B as MLPerf trains it: NeMo's Llama31Config405B (126 layers, hidden 16384, 128 heads, 8 query
# groups, FFN 53248, SwiGLU, RMSNorm, no biases, untied embeddings) with the Mixtral 8x22B tokenizer in place of
# the paper's (the implementations' README: "we replace the paper's TikTokenizer with the Mixtral 8x22b
# tokenizer"): a vocabulary of 32768 (a multiple of 128 x TP, so no padding; assumed from the tokenizer's size).
# ASYM_PP_EMBED and ASYM_PP_LOSS True (account_for_embedding/loss_in_pipeline_split): the embedding and the loss
# each take a layer's place, 128 places on PP 8 x VP 8 = 64 chunks of 2
LLAMA31_405B = ModelSpec(
    name="Llama 3.1 405B (MLPerf)",
    layers=126,
    hidden=16384,
    heads=128,
    kv_heads=8,
    ffn=53248,
    vocab=32768,
    gated=True,
    norm="rmsnorm",
    bias=False,
    stages=Stages(embedding=True, loss=True),
)
# Llama 3.1 8B as MLPerf trains it: NeMo's Llama31Config8B (32 layers, OVERWRITTEN_NUM_LAYERS=32 in
# config_common_8b.sh), with the Llama 3.1 8B tokenizer (Cisco's README: "We are using the Llama 3.1 8B
# tokenizer"): vocabulary 128256
LLAMA31_8B = ModelSpec(
    name="Llama 3.1 8B (MLPerf)",
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    ffn=14336,
    vocab=128256,
    gated=True,
    norm="rmsnorm",
    bias=False,
)

_SAID = (
    "NVIDIA's NeMo 2.0 / Megatron-Core implementation as the submission's config_*.sh, conf/custom.yaml and "
    "pretrain.py set it: TransformerEngine layers (attention timed as the newest kernel); the distributed "
    "optimizer (USE_DIST_OPTIMIZER=True: ZeRO-1) with OVERLAP_GRAD_REDUCE=True and OVERLAP_PARAM_GATHER=True "
    "(and OVERLAP_PARAM_GATHER_WITH_OPTIM_STEP); gradients reduced in BF16 (pretrain.py's "
    "MegatronMixedPrecision(..., grad_reduce_in_fp32=False)); no activation recomputation "
    "(ACT_CKPT_GRANULARITY unset: null); sequence parallelism wherever TP > 1 (SEQ_PARALLEL default True); "
    "sequence 8192 and the global batch and gradient_accumulation_steps as the log prints them; the figure "
    "is the median of every train_step_time the result file logs with a reduced_train_loss beside it (one "
    "step each; the block-end entries without a loss left out)"
)


def _run(
    key: str,
    source: str,
    result: str,
    config: str,
    gpu: str,
    gpus: int,
    model: ModelSpec,
    gbs: int,
    acc: int,
    mbs: int,
    tp: int,
    pp: int,
    cp: int,
    vp: int,
    precision: str,
    overlap: tuple[str, ...],
    stats: tuple[float, float, int, float, float],
    said: str,
    variants: dict,
) -> PublishedRun:
    dp = gpus // (tp * pp * cp)
    assert dp * tp * pp * cp == gpus, key
    chunks = vp if pp > 1 else 1
    plan = training_plan(
        gbs,
        "zero-1",
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        sp=tp > 1,
        micro_batch=mbs,
        chunks=chunks,
        flash=True,
        precision=precision,
    )
    assert plan.microbatches == acc, (key, plan.microbatches, acc)
    median, mean, n, lo, hi = stats
    schedule = None if pp == 1 else "interleaved" if chunks > 1 else "1f1b"
    where = (
        f"{result}, train_step_time: median {median:g} s over {n} logged steps (mean {mean:g}, min {lo:g}, "
        f"max {hi:g}); global_batch_size {gbs}, gradient_accumulation_steps {acc}, max_sequence_length 8192"
    )
    return TenthRun(
        key,
        source,
        where,
        gpu,
        gpus,
        model,
        plan,
        8192,
        median,
        "s per step",
        precision="fp8",
        sharding="zero-1",
        schedule=schedule,
        overlap=overlap,
        assumed=f"{said}; {config}: TP {tp}, PP {pp}, CP {cp}, VP {vp}, DP {dp}, micro-batch {mbs}, "
        f"global batch {gbs} ({acc} micro-batches a replica); {_SAID}",
        variants=variants,
    )


# -- MLPerf Training v5.0, llama31_405b (H100, H200) -------------------------------------------------------------

_V50_SAID = (
    "FP8 (config_common.sh FP8=True; FP8_HYBRID unset, so custom.yaml's fp8_hybrid False: E4M3 both ways; "
    "fp8_recipe custom.yaml's default 'delayed', fp8_amax_history_len 1 and most_recent by default) timed as "
    "FP8 with delayed scaling; FP8_PARAMS=True (the weights kept and all-gathered in "
    "FP8: the precision's -gather entry, in parasim since the gatherer's day); TP communication overlap "
    "(TP_COMM_OVERLAP=True, MC_TP_OVERLAP_AG/RS True); pipeline sends overlapped (overlap_p2p_comm default "
    "True under the interleaved schedule); CP 2's ring overlapped (TransformerEngine); the embedding and "
    "the loss each counted as a layer in the pipeline split (ASYM_PP_EMBED, ASYM_PP_LOSS True); no CUDA "
    "graphs (MCORE_CUDA_GRAPH and LAYER_CUDA_GRAPH unset)"
)
# (key, system folder, GPU, nodes, GBS, accumulation, TP, result file, config, (median, mean, n, min, max), said)
_T50 = (
    (
        "mlperf-v50-llama405b-h100-eos-n64",
        "NVIDIA",
        "eos-dfw_n64_ngc25.01_nemo",
        "h100",
        64,
        1152,
        288,
        8,
        "result_0.txt",
        "config_DGXH100_64x8x288xtp8pp8cp2.sh",
        (55.0998, 55.1473, 240, 54.7127, 67.5951),
    ),
    (
        "mlperf-v50-llama405b-h100-eos-n256",
        "NVIDIA",
        "eos-dfw_n256_ngc25.01_nemo",
        "h100",
        256,
        1152,
        72,
        8,
        "result_0.txt",
        "config_DGXH100_256x8x72xtp8pp8cp2.sh",
        (14.2054, 14.2831, 240, 14.1288, 28.0268),
    ),
    (
        "mlperf-v50-llama405b-h100-eos-n304",
        "NVIDIA",
        "eos-dfw_n304_ngc25.01_nemo",
        "h100",
        304,
        1216,
        64,
        8,
        "result_0.txt",
        "config_DGXH100_304x8x64xtp8pp8cp2.sh",
        (12.7001, 12.7685, 266, 12.618, 26.5371),
    ),
    (
        "mlperf-v50-llama405b-h100-eos-n320",
        "NVIDIA",
        "eos-dfw_n320_ngc25.01_nemo",
        "h100",
        320,
        1120,
        56,
        8,
        "result_0.txt",
        "config_DGXH100_320x8x56xtp8pp8cp2.sh",
        (11.1839, 11.4707, 252, 11.1057, 26.5042),
    ),
    (
        "mlperf-v50-llama405b-h100-eos-n1024",
        "NVIDIA",
        "eos-dfw_n1024_ngc25.01_nemo",
        "h100",
        1024,
        1536,
        24,
        8,
        "result_0.txt",
        "config_DGXH100_1024x8x24xtp8pp8cp2.sh",
        (5.18037, 5.20317, 210, 5.07292, 6.93202),
    ),
    (
        "mlperf-v50-llama405b-h200-nebius-n64",
        "Nebius",
        "nebius_soperator_8xH200_n64_ngc25.01_nemo",
        "h200",
        64,
        1152,
        144,
        4,
        "result_1.txt",
        "config_DGXH200_64x8x144xtp4pp8cp2.sh",
        (50.0126, 50.2423, 240, 49.7348, 77.3073),
    ),
    (
        "mlperf-v50-llama405b-h200-nebius-n128",
        "Nebius",
        "nebius_soperator_8xH200_n128_ngc25.01_nemo",
        "h200",
        128,
        1152,
        72,
        4,
        "result_1.txt",
        "config_DGXH200_128x8x72xtp4pp8cp2.sh",
        (25.3528, 25.5704, 240, 25.1784, 40.4278),
    ),
)


def _v50() -> list[PublishedRun]:
    out = []
    for key, org, system, gpu, nodes, gbs, acc, tp, result, config, stats in _T50:
        card = "H100-SXM5-80GB" if gpu == "h100" else "H200-SXM5-141GB"
        said = (
            f"{org} {system}: {nodes} nodes x 8 NVIDIA {card} (systems/{system}.json)"
            + ("; Nebius' config_common.sh is NVIDIA's but for NCCL_NVLS_ENABLE left unset" if org == "Nebius" else "")
            + f"; {_V50_SAID}"
        )
        precision = "megatron-bf16-reduce-bf16-fp8-delayed-gather"
        variants: dict[str, dict[str, Any]] = {
            "FP32 gradient reduction": {"precision": "megatron-bf16-fp8-delayed-gather"},
            "no TP overlap": {"overlap": ("grad-reduce", "prefetch", "p2p", "cp")},
        }
        out.append(
            _run(
                key,
                "MLPerf Training v5.0 Llama 3.1 405B",
                f"{org}/results/{system}/llama31_405b/{result}",
                f"{org}/benchmarks/llama31_405b/implementations/{system}/{config}",
                gpu,
                nodes * 8,
                LLAMA31_405B,
                gbs,
                acc,
                1,
                tp,
                8,
                2,
                8,
                precision,
                ("grad-reduce", "prefetch", "tp", "p2p", "cp"),
                stats,
                said,
                variants,
            )
        )
    return out


# -- MLPerf Training v5.1, llama31_8b (B200, H100) and llama31_405b (B200) ------------------------------------

_UF = "University-of-Florida"
_UF_SAID = (
    "University of Florida HiPerGator DGX B200 (systems/hpg.dgxb200x8.n<N>.json: NVIDIA Blackwell GPU "
    "(B200-SXM-180GB), 8 a node); the hpg.dgxb200x8 config sources config_common.sh, config_common_<8b|405b>"
    ".sh and config_common_cg.sh, which that folder does not hold: taken as the b200_nemo folder's (assumed); "
    "no FP4 (the config sources no config_common_fp4.sh); FP8 current scaling (config_common.sh "
    'FP8_RECIPE="tensorwise", FP8=True) timed as FP8 tensorwise; FP8_PARAM_GATHER=True (the weights '
    "kept and all-gathered in FP8: the precision's -gather entry, in parasim since the gatherer's day); "
    "full-iteration CUDA graphs (config_common_cg.sh FULL_CUDA_GRAPH=1, MCORE_CUDA_GRAPH=1: no plan field)"
)
_UF8_SAID = (
    "llama31_8b: FP8_HYBRID=True (config_common_8b.sh), TE fused ops (USE_TE_OPS=True); TP 1 "
    "(SEQ_PARALLEL=False, TP_COMM_OVERLAP=False); CP's ring overlapped where CP is 2; the vocabulary as the "
    "Llama 3.1 8B tokenizer's (the b200_nemo README is the 405B one; assumed)"
)
_UF405_SAID = (
    "llama31_405b: FP8_HYBRID unset (E4M3 both ways); TP_COMM_OVERLAP unset, so custom.yaml's default "
    "False: no TP overlap (the most literal reading; a variant turns it on); pipeline sends overlapped "
    "(overlap_p2p_comm default True under the interleaved schedule); CP 2's ring overlapped; the "
    "embedding and the loss each counted as a layer (ASYM_PP_EMBED, ASYM_PP_LOSS True)"
)
_CISCO_SAID = (
    "Cisco hpf (systems/hpf_n<N>.json: NVIDIA H100-SXM5-80GB, 8 a node); llama31_8b with NVIDIA's "
    "NeMo code (benchmarks/llama31_8b/implementations/nemo); FP8 (config_common.sh FP8=True; FP8_RECIPE "
    "unset: custom.yaml's default 'delayed'; FP8_HYBRID unset: E4M3 both ways) timed as FP8 with delayed "
    "scaling; FP8_PARAMS=True (the weights kept and all-gathered in FP8: the "
    "precision's -gather entry, in parasim since the gatherer's day); no CUDA graphs (MCORE_CUDA_GRAPH=False); the "
    "vocabulary as the Llama 3.1 8B tokenizer's (the README's '3.3 Tokenizer')"
)
# (key, org, system, GPU, nodes, model, GBS, accumulation, micro-batch, TP, PP, CP, VP, config, (median, mean, n,
# min, max))
_T51 = (
    (
        "mlperf-v51-llama8b-b200-uf-n1",
        _UF,
        "hpg.dgxb200x8.n1",
        "b200",
        1,
        LLAMA31_8B,
        16,
        1,
        2,
        1,
        1,
        1,
        1,
        "config_DGXB200_1x8x2xtp1pp1cp1_8b.sh",
        (0.543537, 0.543751, 312, 0.513641, 0.572587),
    ),
    (
        "mlperf-v51-llama8b-b200-uf-n2",
        _UF,
        "hpg.dgxb200x8.n2",
        "b200",
        2,
        LLAMA31_8B,
        32,
        1,
        2,
        1,
        1,
        1,
        1,
        "config_DGXB200_2x8x2xtp1pp1cp1_8b.sh",
        (0.57111, 0.571731, 192, 0.531843, 0.594738),
    ),
    (
        "mlperf-v51-llama8b-b200-uf-n4",
        _UF,
        "hpg.dgxb200x8.n4",
        "b200",
        4,
        LLAMA31_8B,
        16,
        1,
        1,
        1,
        1,
        2,
        1,
        "config_DGXB200_4x8x1xtp1pp1cp2_8b.sh",
        (0.187457, 0.187514, 336, 0.177862, 0.196517),
    ),
    (
        "mlperf-v51-llama8b-b200-uf-n8",
        _UF,
        "hpg.dgxb200x8.n8",
        "b200",
        8,
        LLAMA31_8B,
        32,
        1,
        1,
        1,
        1,
        2,
        1,
        "config_DGXB200_8x8x1xtp1pp1cp2_8b.sh",
        (0.189232, 0.189342, 168, 0.18462, 0.195911),
    ),
    (
        "mlperf-v51-llama8b-b200-uf-n16",
        _UF,
        "hpg.dgxb200x8.n16",
        "b200",
        16,
        LLAMA31_8B,
        64,
        1,
        1,
        1,
        1,
        2,
        1,
        "config_DGXB200_16x8x1xtp1pp1cp2_8b.sh",
        (0.192683, 0.192583, 120, 0.18677, 0.198573),
    ),
    (
        "mlperf-v51-llama8b-b200-uf-n32",
        _UF,
        "hpg.dgxb200x8.n32",
        "b200",
        32,
        LLAMA31_8B,
        128,
        1,
        1,
        1,
        1,
        2,
        1,
        "config_DGXB200_32x8x1xtp1pp1cp2_8b.sh",
        (0.221226, 0.22124, 84, 0.216169, 0.226595),
    ),
    (
        "mlperf-v51-llama405b-b200-uf-n32",
        _UF,
        "hpg.dgxb200x8.n32",
        "b200",
        32,
        LLAMA31_405B,
        576,
        144,
        1,
        4,
        8,
        2,
        8,
        "config_DGXB200_32x8x144xtp4pp8cp2_cg.sh",
        (27.6412, 27.721, 500, 27.5042, 38.3871),
    ),
    (
        "mlperf-v51-llama405b-b200-uf-n56",
        _UF,
        "hpg.dgxb200x8.n56",
        "b200",
        56,
        LLAMA31_405B,
        1008,
        144,
        1,
        4,
        8,
        2,
        8,
        "config_DGXB200_56x8x144xtp4pp8cp2_cg.sh",
        (27.9164, 27.9678, 304, 27.7586, 32.5715),
    ),
    (
        "mlperf-v51-llama8b-h100-cisco-n8",
        "Cisco",
        "hpf_n8",
        "h100",
        8,
        LLAMA31_8B,
        64,
        1,
        1,
        1,
        1,
        1,
        1,
        "config_DGXH100_8x8x1xtp1pp1cp1.sh",
        (0.719819, 0.742283, 3420, 0.70446, 50.9339),
    ),
    (
        "mlperf-v51-llama8b-h100-cisco-n16",
        "Cisco",
        "hpf_n16",
        "h100",
        16,
        LLAMA31_8B,
        64,
        1,
        1,
        2,
        1,
        1,
        1,
        "config_DGXH100_16x8x1xtp2pp1cp1.sh",
        (0.482993, 0.506291, 3456, 0.456197, 50.8437),
    ),
)


def _v51() -> list[PublishedRun]:
    out = []
    for key, org, system, gpu, nodes, model, gbs, acc, mbs, tp, pp, cp, vp, config, stats in _T51:
        bench = "llama31_8b" if model is LLAMA31_8B else "llama31_405b"
        if org == _UF:
            folder = f"{org}/benchmarks/{bench}/implementations/hpg.dgxb200x8"
            precision = "megatron-bf16-reduce-bf16-fp8-tensorwise-gather"
            said = f"{system}: {nodes} nodes; {_UF_SAID}; " + (_UF8_SAID if bench == "llama31_8b" else _UF405_SAID)
            overlap = ("grad-reduce", "prefetch") + (("p2p",) if pp > 1 else ()) + (("cp",) if cp > 1 else ())
            variants: dict[str, dict[str, Any]] = {
                "FP32 gradient reduction": {"precision": "megatron-bf16-fp8-tensorwise-gather"},
                "FP8 as delayed scaling": {"precision": "megatron-bf16-reduce-bf16-fp8-delayed-gather"},
            }
            if tp > 1:
                variants["TP overlap"] = {"overlap": overlap + ("tp",)}
        else:
            folder = f"{org}/benchmarks/{bench}/implementations/nemo"
            precision = "megatron-bf16-reduce-bf16-fp8-delayed-gather"
            said = f"{system}: {nodes} nodes; {_CISCO_SAID}; " + (
                "TP 2 with sequence parallelism and TP communication overlap (TP_COMM_OVERLAP=True)"
                if tp > 1
                else "TP 1 (TP_COMM_OVERLAP=True has no TP collective to hide)"
            )
            overlap = ("grad-reduce", "prefetch") + (("tp",) if tp > 1 else ())
            variants = {"FP32 gradient reduction": {"precision": "megatron-bf16-fp8-delayed-gather"}}
            if tp > 1:
                variants["no TP overlap"] = {"overlap": ("grad-reduce", "prefetch")}
        out.append(
            _run(
                key,
                "MLPerf Training v5.1 Llama 3.1",
                f"{org}/results/{system}/{bench}/result_0.txt",
                f"{folder}/{config}",
                gpu,
                nodes * 8,
                model,
                gbs,
                acc,
                mbs,
                tp,
                pp,
                cp,
                vp,
                precision,
                overlap,
                stats,
                said,
                variants,
            )
        )
    return out


TENTH: tuple[PublishedRun, ...] = tuple(_v50() + _v51())


def tenth_runs() -> list[PublishedRun]:
    """Every run of the tenth held-out set (gathered blind; kept unscored for the next change to the model)."""
    return list(TENTH)

"""A fresh held-out set of published training runs, gathered 2026-12-05 from sources runs.py does not use,
before any change to the time model after the first held-out scoring, and timed by nobody until the next
model version was done (FP8 products with their casts, FSDP under a pipeline): then scored once
(clock/published.all_runs), and read as the test of the model.

Same format as runs.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure in the source's own unit), built with runs.training_plan; `assumed` says what
the source leaves out and the value taken. docs/notes/step-time-runs-fresh.md quotes every figure and says
where it was read. The sources have their own registry (SOURCES below, every one in the set "fresh"); a
FreshRun(...) is a PublishedRun that looks its source up there, so runs.RUNS and runs.SOURCES stay as they are.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from ..layout import ModelSpec, Stages
from .runs import (
    DEEPSEEK_V3,
    FRESH as FRESH_SET,
    LLAMA3_70B,
    LLAMA3_8B,
    LLAMA3_405B,
    PublishedRun,
    Source,
    training_plan,
)

GATHERED = "2026-12-05"  # the date every figure here was read

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "DGXC Benchmarking",
            "NVIDIA, DGX Cloud Benchmarking recipes (NVIDIA/dgxc-benchmarking): the H100 "
            "'Expected Performance' tables of release v24.11.1 (commit 35a9aec, NeMo 24.09/24.11 containers) and "
            "release v25.05.01 (commit 60d6fd3, NeMo 25.04 containers)",
            "https://github.com/NVIDIA/dgxc-benchmarking",
            "2024-12",
            FRESH_SET,
            "new: a separate NVIDIA document from Megatron-Bridge's performance summary "
            "(its own recipes, containers and tables)",
        ),
        Source(
            "Nemotron-4 15B 2024",
            "NVIDIA, Nemotron-4 15B Technical Report (arXiv 2402.16819), section 2 and Table 2",
            "https://arxiv.org/abs/2402.16819",
            "2024-02",
            FRESH_SET,
            "new",
        ),
        Source(
            "Nemotron-4 340B 2024",
            "NVIDIA, Nemotron-4 340B Technical Report (arXiv 2406.11704), section 2.3 and Table 2",
            "https://arxiv.org/abs/2406.11704",
            "2024-06",
            FRESH_SET,
            "new (read in a secondary copy, see the notes)",
        ),
        Source(
            "IBM FSDP blog 2024",
            "Team PyTorch at IBM and Team PyTorch at Meta, 'Maximizing training throughput "
            "using PyTorch FSDP' (PyTorch blog, 2024-03-13), Table 1",
            "https://pytorch.org/blog/maximizing-training/",
            "2024-03",
            FRESH_SET,
            "new",
        ),
        Source(
            "torchtitan A100 2024",
            "PyTorch team, torchtitan docs/performance.md (FSDP2 on 64 A100 80GB)",
            "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md",
            "2024-06",
            FRESH_SET,
            "new: a separate document from benchmarks/llama3_h100_202412_torchtitan.md (other GPUs, runs, date)",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
FreshRun = partial(PublishedRun, registry=SOURCES)


def _pipe(pp: int, chunks: int) -> str | None:
    return None if pp == 1 else "interleaved" if chunks > 1 else "1f1b"


# -- models ---------------------------------------------------------------------------------------------------

_NEMOTRON: dict[str, Any] = dict(
    vocab=256000, kv_heads=8, bias=False
)  # squared-ReLU MLP (not gated), LayerNorm, untied, RoPE
NEMOTRON4_15B = ModelSpec(name="Nemotron-4 15B", layers=32, hidden=6144, heads=48, ffn=24576, **_NEMOTRON)
NEMOTRON4_340B = ModelSpec(name="Nemotron-4 340B", layers=96, hidden=18432, heads=96, ffn=73728, **_NEMOTRON)
GPT3_175B_NEMO = ModelSpec(name="GPT-3 175B (NeMo)", layers=96, hidden=12288, heads=96, vocab=50257)
# dgxc v24.11.1's llama3.1_405b.yaml: 16 query groups and the GPT-2 BPE tokenizer, not the released model's 8 and
# 128256
LLAMA31_405B_DGXC = replace(LLAMA3_405B, name="Llama 3.1 405B (dgxc v24.11.1 recipe)", kv_heads=16, vocab=50257)
GROK1 = ModelSpec(
    name="Grok-1 (dgxc recipe)",
    layers=64,
    hidden=6144,
    heads=48,
    kv_heads=8,
    ffn=32768,
    experts=8,
    top_k=2,
    expert_ffn=32768,
    vocab=128256,
    gated=True,
    norm="rmsnorm",
    bias=False,
)
_LLAMA2: dict[str, Any] = dict(gated=True, norm="rmsnorm", bias=False, vocab=32000)
LLAMA2 = {
    "7b": ModelSpec(name="Llama 2 7B", layers=32, hidden=4096, heads=32, ffn=11008, **_LLAMA2),
    "13b": ModelSpec(name="Llama 2 13B", layers=40, hidden=5120, heads=40, ffn=13824, **_LLAMA2),
    "34b": ModelSpec(name="Llama 2 34B (fms-fsdp)", layers=48, hidden=8192, heads=64, kv_heads=8, ffn=22016, **_LLAMA2),
    "70b": ModelSpec(name="Llama 2 70B", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, **_LLAMA2),
}


# -- NVIDIA DGX Cloud Benchmarking recipes ----------------------------------------------------------------------

_V24 = "v24.11.1 (35a9aec)"
_V25 = "v25.05.01 (60d6fd3)"
_DGXC = (
    "the distributed optimizer (the recipe's distributed_fused_adam / mcore_distributed_optim) as ZeRO-1, "
    "its gradient reduce-scatter and parameter all-gather overlapped (overlap_grad_sync, overlap_param_sync)"
)
_DGXC_24 = "the recipe YAML at the same commit gives the rest"
_DGXC_25_DEG = (
    "the release's launch.sh gives the degrees; the rest is set by NeMo 25.04's scripts/performance, not read"
)
_FP8_25 = "FP8, its scaling not named: delayed, the default of NeMo's scripts/performance (--fp8_recipe 'ds')"
_DGXC_25 = f"{_DGXC_25_DEG}: taken as no recomputation, SP where TP > 1, no TP overlap"


def _dgxc() -> list[PublishedRun]:
    src = "DGXC Benchmarking"

    def row(
        key: str,
        where: str,
        gpus: int,
        model: ModelSpec,
        batch: int,
        seq: int,
        seconds: float,
        precision: str,
        said: str,
        overlap: tuple[str, ...] = (),
        **choices: Any,
    ) -> PublishedRun:
        fp8 = {"precision": "megatron-bf16-fp8-delayed"} if precision == "fp8" else {}
        plan = training_plan(batch, "zero-1", flash=True, **fp8, **choices)
        o = ("grad-reduce", "prefetch") + (("p2p",) if plan.pp > 1 else ()) + overlap
        return FreshRun(
            f"dgxc-{key}",
            src,
            where,
            "h100",
            gpus,
            model,
            plan,
            seq,
            seconds,
            "s per step",
            precision=precision,
            sharding="zero-1",
            schedule=_pipe(plan.pp, plan.chunks),
            overlap=o,
            assumed=f"{_DGXC}; {said}",
        )

    fp8_24 = "FP8 with delayed scaling (fp8_hybrid: E4M3 forward, E5M2 backward)"
    gpt = (
        "no recomputation, SP, TP overlap (ub_tp_comm_overlap), P2P overlap; GPT-2 BPE vocabulary 50257 "
        f"(its tokenizer), an MLP of 4h; {_DGXC_24}"
    )
    grok24 = (
        "the recipe's 64 layers (the table's full-size rows); no recomputation, SP, no TP overlap; experts "
        "not split by TP (ETP 1; the v24.11.1 table gives no ETP, v25.05.01's gives 1); tokens padded to "
        "expert capacity 1.0 (moe_pad_expert_input_to_capacity), timed as dropless balanced routing; "
        "vocabulary 128256 (the Llama 3 tokenizer the YAML names); DP = GPUs / (TP x PP x CP) = 16 and 32 (the "
        "table's DP column, 2 and 4, counts replicas beyond EP 8: its TP x PP x CP x EP x DP is the GPU count, "
        f"and GBS / DP = 128 = its GA at MBS 1); {_DGXC_24}"
    )
    grok25 = (
        "64 layers, ETP 1 (as the table); no recomputation, SP, no TP overlap (the v24.11.1 YAML's); "
        "routing timed as dropless and balanced; vocabulary 128256 (the v24.11.1 YAML's tokenizer)"
    )
    return [
        row(
            "gpt3-175b-bf16-128",
            f"{_V24}, nemo_megatron/README_175b.md, BF16 table, 128x H100",
            128,
            GPT3_175B_NEMO,
            256,
            2048,
            8.91,
            "bf16",
            gpt,
            ("tp",),
            tp=4,
            pp=8,
            dp=4,
            sp=True,
            chunks=12,
        ),
        row(
            "gpt3-175b-bf16-2048",
            f"{_V24}, nemo_megatron/README_175b.md, BF16 table, 2048x H100",
            2048,
            GPT3_175B_NEMO,
            4096,
            2048,
            9.02,
            "bf16",
            gpt,
            ("tp",),
            tp=4,
            pp=8,
            dp=64,
            sp=True,
            chunks=12,
        ),
        row(
            "gpt3-175b-fp8-128",
            f"{_V24}, nemo_megatron/README_175b.md, FP8 table, 128x H100",
            128,
            GPT3_175B_NEMO,
            256,
            2048,
            5.92,
            "fp8",
            f"{fp8_24}; {gpt}",
            ("tp",),
            tp=4,
            pp=8,
            dp=4,
            sp=True,
            chunks=12,
        ),
        row(
            "llama31-8b-cp2-bf16-8",
            f"{_V24}, llama3.1/README_8b.md, BF16 table (24.09), 8x H100",
            8,
            LLAMA3_8B,
            128,
            8192,
            12.91,
            "bf16",
            f"no recomputation, no SP (TP 1); the Llama 3 tokenizer; {_DGXC_24}",
            cp=2,
            dp=4,
        ),
        row(
            "llama31-70b-tp4-pp4-cp2-bf16-64",
            f"{_V24}, llama3.1/README_70b.md, BF16 table (24.09), 64x H100",
            64,
            LLAMA3_70B,
            128,
            8192,
            14.72,
            "bf16",
            f"no recomputation, SP, TP overlap (ub_tp_comm_overlap), P2P overlap; {_DGXC_24}",
            ("tp",),
            tp=4,
            pp=4,
            cp=2,
            dp=2,
            sp=True,
            chunks=5,
        ),
        row(
            "llama31-405b-tp8-pp9-cp2-bf16-576",
            f"{_V24}, llama3.1/README_405b.md, BF16 table (24.09), 576x H100",
            576,
            LLAMA31_405B_DGXC,
            252,
            8192,
            17.20,
            "bf16",
            "the recipe's shapes: 16 query groups and the GPT-2 BPE vocabulary 50257 (not the released model's 8 "
            f"and 128256); no recomputation, SP, TP overlap, P2P overlap; {_DGXC_24}",
            ("tp",),
            tp=8,
            pp=9,
            cp=2,
            dp=4,
            sp=True,
            chunks=7,
        ),
        row(
            "nemotron4-15b-tp4-bf16-2048",
            f"{_V24}, nemotron/README_15b.md, BF16 table (24.11), 2048x H100",
            2048,
            NEMOTRON4_15B,
            8192,
            4096,
            2.96,
            "bf16",
            f"no recomputation, SP, TP overlap (ub_tp_comm_overlap); vocabulary 256000 (nemotron_2_256k); {_DGXC_24}",
            ("tp",),
            tp=4,
            dp=512,
            sp=True,
            micro_batch=4,
        ),
        row(
            "nemotron4-340b-tp8-pp8-bf16-2048",
            f"{_V24}, nemotron/README_340b.md, BF16 table (24.11), 2048x H100",
            2048,
            NEMOTRON4_340B,
            512,
            4096,
            4.84,
            "bf16",
            f"selective recomputation (the YAML's), SP, no TP or P2P overlap (both off in the YAML); {_DGXC_24}",
            tp=8,
            pp=8,
            dp=32,
            sp=True,
            chunks=12,
            recompute="selective",
        ),
        row(
            "grok1-bf16-1024",
            f"{_V24}, grok1/README_314b.md, 'Grok 1 314b Dev BF16' table, 1024 H100",
            1024,
            GROK1,
            2048,
            8192,
            21.0,
            "bf16",
            grok24,
            tp=4,
            pp=8,
            cp=2,
            dp=16,
            ep=8,
            sp=True,
            chunks=8,
        ),
        row(
            "grok1-bf16-2048",
            f"{_V24}, grok1/README_314b.md, 'Grok 1 314b Dev BF16' table, 2048 H100",
            2048,
            GROK1,
            4096,
            8192,
            21.09,
            "bf16",
            grok24,
            tp=4,
            pp=8,
            cp=2,
            dp=32,
            ep=8,
            sp=True,
            chunks=8,
        ),
        row(
            "grok1-bf16-512",
            f"{_V25}, grok1/README.md, H100 Performance, Grok1 314b BF16, 512x H100",
            512,
            GROK1,
            1024,
            8192,
            16.930,
            "bf16",
            f"{_DGXC_25_DEG}; {grok25}",
            tp=4,
            pp=8,
            cp=2,
            dp=8,
            ep=8,
            sp=True,
            chunks=8,
        ),
        row(
            "grok1-fp8-512",
            f"{_V25}, grok1/README.md, H100 Performance, Grok1 314b FP8, 512x H100",
            512,
            GROK1,
            1024,
            8192,
            13.454,
            "fp8",
            f"{_FP8_25}; {_DGXC_25_DEG}; {grok25}",
            tp=4,
            pp=8,
            cp=2,
            dp=8,
            ep=8,
            sp=True,
            chunks=8,
        ),
        row(
            "deepseek-v3-bf16-1024",
            f"{_V25}, deepseek_v3/pretraining/README.md, H100 Performance, 1024x H100",
            1024,
            DEEPSEEK_V3,
            8192,
            4096,
            52.04,
            "bf16",
            "selective recomputation of the MLA up-projections (launch.sh: --recompute_modules mla_up_proj); SP, no "
            "TP overlap; ETP 1, VP 1 (as the table); the 61 layers spread over 16 stages (the split is not given); "
            "no multi-token prediction; routing timed as dropless and balanced",
            tp=2,
            pp=16,
            dp=32,
            ep=64,
            sp=True,
            recompute="selective",
        ),
        row(
            "llama31-405b-tp8-pp8-cp2-bf16-512",
            f"{_V25}, llama3.1/README.md, H100 Performance, Llama3.1 405b BF16, 512x H100",
            512,
            replace(LLAMA3_405B, stages=Stages(embedding=True, loss=True)),
            256,
            8192,
            19.810,
            "bf16",
            f"{_DGXC_25}; the released shapes (vocabulary 128256; the tokenizer is not given); the "
            "embedding and the loss counted as layers in the split (126 layers do not divide into 8 x 8 chunks); "
            "GBS 256 over DP 4 is 64 micro-batches (the table prints GA 32, which its own GBS and DP contradict)",
            tp=8,
            pp=8,
            cp=2,
            dp=4,
            sp=True,
            chunks=8,
        ),
        row(
            "nemotron4-15b-tp2-bf16-16",
            f"{_V25}, nemotron/README.md, H100 Performance, Nemotron4 15b BF16, 16x H100",
            16,
            NEMOTRON4_15B,
            64,
            4096,
            2.746,
            "bf16",
            f"{_DGXC_25}; vocabulary 256000",
            tp=2,
            dp=8,
            sp=True,
            micro_batch=2,
        ),
        row(
            "nemotron4-340b-tp8-pp8-bf16-256",
            f"{_V25}, nemotron/README.md, H100 Performance, Nemotron4 340b BF16, 256x H100",
            256,
            NEMOTRON4_340B,
            64,
            4096,
            4.606,
            "bf16",
            f"{_DGXC_25_DEG}; selective recomputation and no TP overlap as the v24.11.1 YAML",
            tp=8,
            pp=8,
            dp=4,
            sp=True,
            chunks=12,
            recompute="selective",
        ),
        row(
            "nemotron4-340b-tp8-pp8-fp8-256",
            f"{_V25}, nemotron/README.md, H100 Performance, Nemotron4 340b FP8, 256x H100",
            256,
            NEMOTRON4_340B,
            64,
            4096,
            3.107,
            "fp8",
            f"{_FP8_25}; {_DGXC_25_DEG}; selective recomputation and no TP overlap as the v24.11.1 YAML",
            tp=8,
            pp=8,
            dp=4,
            sp=True,
            chunks=12,
            recompute="selective",
        ),
    ]


# -- Nemotron-4 technical reports -------------------------------------------------------------------------------

# Table 2 of each: (data-parallel size, GPUs, iteration seconds, MFU %, batch)
_NEMOTRON4_15B_T2 = ((96, 768, 0.57, 34.3, 384), (192, 1536, 0.58, 33.3, 768), (288, 2304, 0.64, 30.5, 1152))
_NEMOTRON4_340B_T2 = ((16, 1536, 10.3, 42.4, 768), (32, 3072, 10.3, 42.3, 1536), (64, 6144, 8.0, 41.0, 2304))


def _nemotron4() -> list[PublishedRun]:
    out = [
        FreshRun(
            f"nemotron4-15b-dp{dp}",
            "Nemotron-4 15B 2024",
            "section 2 'Pre-training' and Table 2",
            "h100",
            gpus,
            NEMOTRON4_15B,
            training_plan(batch, "zero-1", tp=8, dp=dp, sp=True, micro_batch=1, flash=True),
            4096,
            seconds,
            "s per step",
            precision="unstated",
            sharding="zero-1",
            overlap=("grad-reduce", "prefetch"),
            assumed="micro-batch 1, sequence parallelism, no recomputation, FlashAttention, BF16 (the report names "
            "only the peak's bfloat16), overlapped gradient reduce-scatter and parameter all-gather (none of "
            "them given); the figure is the stage's iteration time (Table 2 prints MFU "
            f"{mfu}% beside it)",
            variants={"micro-batch 4": {"micro_batch": 4, "microbatches": 1}},
        )
        for dp, gpus, seconds, mfu, batch in _NEMOTRON4_15B_T2
    ]
    out += [
        FreshRun(
            f"nemotron4-340b-dp{dp}",
            "Nemotron-4 340B 2024",
            "section 2.3 and Table 2",
            "h100",
            gpus,
            NEMOTRON4_340B,
            training_plan(
                batch, "zero-1", tp=8, pp=12, dp=dp, sp=True, micro_batch=1, chunks=8, recompute="selective", flash=True
            ),
            4096,
            seconds,
            "s per step",
            precision="unstated",
            sharding="zero-1",
            schedule="interleaved",
            overlap=("grad-reduce", "prefetch", "p2p"),
            assumed="micro-batch 1; 8 model chunks a GPU (one layer a chunk, as NVIDIA's 340B recipe at PP 8 with VP "
            "12; the report says only 'interleaving'); sequence parallelism, selective recomputation (that "
            "recipe's), BF16, overlapped reductions, gathers and P2P, no TP overlap (none given); the figure "
            f"is the stage's iteration time (Table 2 prints MFU {mfu}% beside it); read in secondary copies of "
            "the report (see the notes)",
            variants={"2 chunks": {"chunks": 2}, "no recomputation": {"recompute": "none"}},
        )
        for dp, gpus, seconds, mfu, batch in _NEMOTRON4_340B_T2
    ]
    return out


# -- IBM / PyTorch FSDP blog --------------------------------------------------------------------------------------

# Table 1: (model, activation checkpointing as printed, A100 tokens/s/GPU, H100 tokens/s/GPU)
_IBM_T1 = (
    ("7b", "No", 3700.0, 7500.0),
    ("13b", "Selective", 1800.0, 3800.0),
    ("34b", "Yes", 700.0, 1550.0),
    ("70b", "Yes", 370.0, 800.0),
)
_IBM_GPUS = {"a100": 128, "h100": 96}


def _ibm() -> list[PublishedRun]:
    out = []
    for name, ac, a100, h100 in _IBM_T1:
        recompute = {"No": "none", "Selective": "full", "Yes": "full"}[ac]
        said = (
            "sequence 4096 (the blog's '1 million tokens per batch for 128 GPUs' at batch 2 a GPU, and '4k "
            "sequence length'); the whole cluster (A100: 128 GPUs, H100: 96) for every row; FSDP FULL_SHARD as "
            "ZeRO-3 (the 7B run's hybrid sharding, shards within a node, has no entry in SHARDING); BF16 "
            "parameters and reductions with FP32 optimizer state (fms-fsdp's bfSixteen policy, timed as the "
            "precision 'post'); SDPA FlashAttention; FSDP's gathers and reductions overlapped; no torch.compile"
            + (
                "; 'Selective' is fms-fsdp's checkpointing of every k-th block (k not given): timed as full "
                "recomputation, the variant without it brackets it"
                if ac == "Selective"
                else ""
            )
            + (
                "; shapes from fms-fsdp's config_utils.py (48 layers, hidden 8192, 64 heads, 8 kv heads, MLP "
                "22016, vocabulary 32000)"
                if name == "34b"
                else "; Llama 2 shapes, vocabulary 32000"
            )
        )
        for gpu, tps in (("a100", a100), ("h100", h100)):
            gpus = _IBM_GPUS[gpu]
            out.append(
                FreshRun(
                    f"ibm-fsdp-llama2-{name}-{gpu}-{gpus}",
                    "IBM FSDP blog 2024",
                    f"Table 1, {name.upper()}, {'A100 80GB' if gpu == 'a100' else 'H100 80GB'} throughput column",
                    gpu,
                    gpus,
                    LLAMA2[name],
                    training_plan(
                        2 * gpus,
                        "zero-3",
                        dp=gpus,
                        micro_batch=2,
                        recompute=recompute,
                        flash=True,
                        precision="post",
                        attention_kernel="fa2",
                    ),
                    4096,  # SDPA's flash backend: FA2
                    tps,
                    "tokens/s per GPU",
                    precision="bf16",
                    sharding="zero-3",
                    overlap=("grad-reduce", "prefetch"),
                    assumed=said,
                    variants={"no recomputation": {"recompute": "none"}} if ac == "Selective" else {},
                )
            )
    return out


# -- torchtitan docs/performance.md (A100) ----------------------------------------------------------------------

# (key, table, model, sequence, local batch, activation checkpointing as printed, recompute, WPS)
_TITAN_A100 = (
    ("llama3-8b-selop", "Llama 3 table, 8B, selective op", LLAMA3_8B, 8192, 1, "selective op", "selective", 2973.0),
    ("llama3-70b-full", "Llama 3 table, 70B, full", LLAMA3_70B, 8192, 1, "full", "full", 331.0),
    ("llama2-13b-noac", "Llama 2 table, 13B, no", LLAMA2["13b"], 4096, 2, "no", "none", 2162.0),
    (
        "llama2-13b-selop",
        "Llama 2 table, 13B, selective op",
        LLAMA2["13b"],
        4096,
        2,
        "selective op",
        "selective",
        1904.0,
    ),
    ("llama2-70b-full", "Llama 2 table, 70B, batch 2, full", LLAMA2["70b"], 4096, 2, "full", "full", 353.0),
)


def _titan_a100() -> list[PublishedRun]:
    return [
        FreshRun(
            f"titan-a100-{key}-fsdp64",
            "torchtitan A100 2024",
            where,
            "a100",
            64,
            model,
            training_plan(
                64 * local,
                "zero-3",
                dp=64,
                micro_batch=local,
                recompute=recompute,
                flash=True,
                precision="fsdp2",
                attention_kernel="fa2",
                fusion="torch-eager",
            ),
            seq,  # SDPA: FA2; eager
            wps,
            "tokens/s per GPU",
            precision="bf16",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            assumed=f"sequence {seq} (the page: Llama 2's default 4096 is half Llama 3's); FSDP2 over all 64 GPUs with "
            "BF16 parameters and FP32 reductions (torchtitan's defaults); SDPA FlashAttention; the local batch "
            "in one micro-batch; no torch.compile and no FP8 (neither named)"
            + ("; per-op selective checkpointing timed as selective recomputation" if recompute == "selective" else ""),
        )
        for key, where, model, seq, local, ac, recompute, wps in _TITAN_A100
    ]


FRESH: tuple[PublishedRun, ...] = tuple(_dgxc() + _nemotron4() + _ibm() + _titan_a100())


def fresh_runs() -> list[PublishedRun]:
    """Every run of the fresh held-out set, to be timed once, when the next model version is done."""
    return list(FRESH)

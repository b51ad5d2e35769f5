"""A sixth held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py, runs_fourth.py and runs_fifth.py uses, blind: while the time model was being changed by someone
else, and without any of these runs being timed or scored by the gatherer. It is to be scored once, later, as it
stands.

Same format as runs_fifth.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure), built with runs.training_plan; `assumed` says what the source leaves out and
the value taken, `variants` the doubtful choices. The notes, docs/notes/step-time-runs-sixth.md, quote every
figure and say where it was read. The sources have their own registry (SOURCES below), each in the set
runs.SIXTH ("sixth"); a SixthRun(...) is a PublishedRun that looks its source up there. SIXTH is the runs, as FIFTH
is in runs_fifth.py.

Both sources are BAAI's FlagPerf benchmark (github.com/FlagOpen/FlagPerf), read at commit 1b5a0303 (2025-11-11):
its NVIDIA reference cases, the Paddle LLM cases (A100 80GB, 2023) and the Megatron-LM cases (H100 and H800,
2024). Rows it ran on A800s or A100 40GB are left out (no GPU sheet).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from ..layout import ModelSpec
from .runs import SIXTH as SIXTH_SET, LLAMA3_70B, LLAMA3_8B, PublishedRun, Source, training_plan
from .runs_fifth import LLAMA2_7B

GATHERED = "2026-12-05"  # the date every figure here was read
_COMMIT = "1b5a030398ab719e406f77877eb34c9599b17fd2"
_TREE = f"https://github.com/FlagOpen/FlagPerf/tree/{_COMMIT}/training/nvidia"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "FlagPerf Paddle LLM 2023",
            "BAAI, FlagPerf training/nvidia/{gpt3_6.7B,gpt3_13B,llama1_7B,llama1_13B}"
            "-paddle/README.md ('性能指标' tables, A100 80GB rows), with each case's config/config_*A10080Gx1x8.py "
            "and training/benchmarks/{gpt3_6.7B,llama1_7B}/paddle/config/_base.py, commit 1b5a030 (2025-11-11; "
            "the tables added 2023-10, d85f7cd6)",
            f"{_TREE}#paddle-llm-cases",
            "2023-10",
            SIXTH_SET,
            "new: BAAI's measurements with PaddlePaddle's hybrid-parallel trainer (PaddleNLP, sharding stages, "
            "Paddle TP/PP); no earlier set reads FlagPerf or a PaddlePaddle run; not NVIDIA's tables",
        ),
        Source(
            "FlagPerf Megatron LLM 2024",
            "BAAI, FlagPerf training/nvidia/{llama3_8B,llama3_70B,llama2_70B,"
            "mixtral_8x7B}-megatron/README.md ('性能指标' tables, H100 and H800 rows), with each case's config/"
            "config_*.py and training/benchmarks/*/megatron/*.sh, commit 1b5a030 (2025-11-11; tables of "
            "2024-01 to 2024-06)",
            f"{_TREE}#megatron-llm-cases",
            "2024-05",
            SIXTH_SET,
            "new: BAAI's own runs of public Megatron-Core (core_v0.6.0) on their H100 and H800 clusters; not the "
            "Megatron-LM README, NeMo/Megatron-Bridge summaries or DGXC. Same repository and team as the Paddle "
            "cases: a reader wanting independent sources may count the two as one",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
SixthRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# gpt3_6.7B/paddle/config/_base.py at 1b5a030: hidden 4096 (5120 for 13B), intermediate 16384 (20480), heads 32
# (128 for 13B), layers 32 (40), vocabulary 50304, GELU, dropout 0.1; the model is PaddleNLP's preset gpt3-6.7B-en
# / gpt3-13B-en (model_name_or_path); PaddleNLP's GPT pretraining head reuses the word embedding (tied)
PADDLE_GPT3 = {
    "6.7b": ModelSpec(
        name="GPT-3 6.7B (PaddleNLP)", layers=32, hidden=4096, heads=32, ffn=16384, vocab=50304, tied_embeddings=True
    ),
    "13b": ModelSpec(
        name="GPT-3 13B (PaddleNLP)", layers=40, hidden=5120, heads=128, ffn=20480, vocab=50304, tied_embeddings=True
    ),
}
# llama1_7B/paddle/config/_base.py: facebook/llama-7b (PaddleNLP's LLaMA); LLaMA-1 7B has Llama 2 7B's shapes
LLAMA1 = {
    "7b": replace(LLAMA2_7B, name="LLaMA 7B"),
    "13b": replace(LLAMA2_7B, name="LLaMA 13B", layers=40, hidden=5120, heads=40, ffn=13824),
}
# FlagPerf's Megatron scripts (training/benchmarks/*/megatron at 1b5a030). The Llama 3 scripts pass neither
# --untie-embeddings-and-output-weights, --disable-bias-linear nor a RoPE flag: Megatron-Core's defaults then tie
# the embeddings and keep linear biases (its learned positions are not in ModelSpec). Llama3Tokenizer's 128256
# padded to 128 x TP (Megatron's rule): 128256 at TP 2, 129024 at TP 8
FP_LLAMA3_8B = replace(LLAMA3_8B, name="Llama 3 8B (FlagPerf Megatron)", tied_embeddings=True, bias=True)
FP_LLAMA3_70B = replace(
    LLAMA3_70B, name="Llama 3 70B (FlagPerf Megatron)", tied_embeddings=True, bias=True, vocab=129024
)
# llama2_70B/megatron/megatron_main.sh: 80 layers, 8192, 64 heads, 8 query groups, ffn 28672, RMSNorm, SwiGLU,
# RoPE, untied, no biases; Llama2Tokenizer (32000) padded to 128 x TP: 32768 at TP 8, 32256 at TP 4
_L2_70B: dict[str, Any] = dict(
    layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, gated=True, norm="rmsnorm", bias=False
)
FP_LLAMA2_70B = {
    8: ModelSpec(name="Llama 2 70B (TP 8 vocabulary)", vocab=32768, **_L2_70B),
    4: ModelSpec(name="Llama 2 70B (TP 4 vocabulary)", vocab=32256, **_L2_70B),
}
# mixtral_8x7B/megatron/megatron_main.sh: 32 layers, 4096, 32 heads, 8 query groups, ffn 14336, 8 experts, top-2,
# SwiGLU, RMSNorm, RoPE, untied, no biases; MistralTokenizer (32000) padded to 128 x TP 8 = 32768
MIXTRAL_8X7B = ModelSpec(
    name="Mixtral 8x7B",
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    ffn=14336,
    experts=8,
    top_k=2,
    expert_ffn=14336,
    vocab=32768,
    gated=True,
    norm="rmsnorm",
    bias=False,
)


# -- FlagPerf Paddle LLM cases (A100 80GB) ------------------------------------------------------------------------

_PADDLE_SAID = (
    "one DGX A100 (80G) node, A100-SXM4-80GB (the README's 硬件环境), paddle 2.5.1; FP16 O2 (the "
    "table's 'fp16, level=\"O2\"'), timed as Megatron's FP16 convention (FP16 weights and gradients, "
    "FP32 master copy); FlashAttention on (flash_attention=True; Paddle 2.5's flash-attn 2 kernel, "
    "timed as FA2); sequence 2048 (max_seq_length); the printed throughput is samples/s times 2048 "
    "over 8 GPUs, the row's own arithmetic, and the figure is its tokens/s a GPU; global batch = "
    "per_device_bs x accumulate x the data-parallel (sharding) degree, as the row's 'global bs' says; "
    "no sequence parallelism (the configs set none); no overlap of the sharding collectives (none "
    "named); Paddle's pipeline as 1F1B"
)
# (model, config tag, TP, PP, sharding stage, sharding degree, per-device batch, accumulate, recompute, samples/s,
# tokens/s a GPU as printed)
_PADDLE_ROWS = (
    ("gpt3", "6.7b", "TP1PP1SH2SP8", 1, 1, 2, 8, 4, 32, False, 17.23, 4410),
    ("gpt3", "6.7b", "TP2PP1SH1SP4", 2, 1, 1, 4, 4, 64, False, 15.72, 4024),
    ("gpt3", "6.7b", "TP2PP1SH2SP4", 2, 1, 2, 4, 4, 64, False, 14.89, 3811),
    ("gpt3", "6.7b", "TP2PP4SH1SP1", 2, 4, 1, 1, 4, 256, False, 14.81, 3791),
    ("gpt3", "13b", "TP1PP1SH2SP8", 1, 1, 2, 8, 2, 64, True, 6.97, 1784),
    ("gpt3", "13b", "TP2PP1SH1SP4", 2, 1, 1, 4, 2, 128, True, 6.44, 1648),
    ("gpt3", "13b", "TP2PP1SH2SP4", 2, 1, 2, 4, 2, 128, True, 5.93, 1518),
    ("gpt3", "13b", "TP2PP4SH1SP1", 2, 4, 1, 1, 4, 256, True, 6.42, 1643),
    ("llama", "7b", "TP1PP1SH2SP8", 1, 1, 2, 8, 4, 64, False, 16.67, 4267),
    ("llama", "7b", "TP2PP1SH1SP4", 2, 1, 1, 4, 4, 128, False, 15.19, 3888),
    ("llama", "7b", "TP2PP1SH2SP4", 2, 1, 2, 4, 4, 128, False, 14.26, 3650),
    ("llama", "7b", "TP2PP4SH1SP1", 2, 4, 1, 1, 4, 512, False, 14.54, 3722),
    ("llama", "13b", "TP1PP1SH2SP8", 1, 1, 2, 8, 2, 128, True, 6.67, 1707),
    ("llama", "13b", "TP2PP1SH1SP4", 2, 1, 1, 4, 2, 256, True, 6.27, 1605),
    ("llama", "13b", "TP2PP1SH2SP4", 2, 1, 2, 4, 2, 256, True, 5.82, 1489),
    ("llama", "13b", "TP2PP4SH1SP1", 2, 4, 1, 1, 4, 512, True, 6.24, 1597),
)


def _paddle() -> list[PublishedRun]:
    src, out = "FlagPerf Paddle LLM 2023", []
    for family, size, tag, tp, pp, stage, shard, per, acc, recompute, sps, tps in _PADDLE_ROWS:
        model = PADDLE_GPT3[size] if family == "gpt3" else LLAMA1[size]
        case = {"gpt3": f"gpt3_{'6.7B' if size == '6.7b' else '13B'}", "llama": f"llama1_{size.upper()}"}[family]
        name = {"gpt3": f"GPT3-{'6.7B' if size == '6.7b' else '13B'}", "llama": f"LLaMA-{size.upper()}"}[family]
        # sharding stage 1 over one replica holds nothing apart: plain (no data parallelism at all)
        sharding = "none" if shard == 1 else f"zero-{stage}"
        batch = per * acc * shard
        plan = training_plan(
            batch,
            sharding,
            tp=tp,
            pp=pp,
            dp=shard,
            micro_batch=per,
            recompute="full" if recompute else "none",
            flash=True,
            attention_kernel="fa2",
            precision="megatron-fp16",
            dropout=family == "gpt3",
        )
        said = (
            f"config_{tag}A10080Gx1x8: TP {tp}, PP {pp}, sharding stage {stage} over {shard} GPU(s)"
            + (
                " (stage 1 over one replica shards nothing: plain)"
                if shard == 1
                else (
                    " timed as ZeRO-2 (SHARDING's zero-2: reduce-scatter, all-gather)" if stage == 2 else " as ZeRO-1"
                )
            )
            + f", per-device batch {per} x accumulate {acc} = global batch {batch} sequences"
            + ("; full recomputation (recompute=True, granularity full)" if recompute else "; no recomputation")
            + (
                "; GPT-3 preset with hidden and attention dropout 0.1, learned positions, tied output layer"
                if family == "gpt3"
                else "; LLaMA (RMSNorm, SwiGLU, RoPE, untied), no dropout"
            )
            + (
                "; the 13B preset's 128 heads (FlagPerf's _base.py comment and PaddleNLP's gpt3-13B-en; one "
                "PaddleNLP version gives 40)"
                if (family, size) == ("gpt3", "13b")
                else ""
            )
        )
        out.append(
            SixthRun(
                f"flagperf-paddle-{family}-{size}-a100-{tag.lower()}",
                src,
                f"{case}-paddle README '性能指标', {name} A100 1x8*80G row {tag} ({sps:g} * 2048 / 8 = {tps} tokens/s)",
                "a100",
                8,
                model,
                plan,
                2048,
                float(tps),
                "tokens/s per GPU",
                precision="16-bit",
                sharding=sharding,
                schedule="1f1b" if pp > 1 else None,
                assumed=f"{_PADDLE_SAID}; {said}",
                variants={} if shard == 1 else {"sharding collectives overlapped": {"overlap": ("grad-reduce",)}},
            )
        )
    return out


# -- FlagPerf Megatron LLM cases (H100, H800) ---------------------------------------------------------------------

_MEGATRON_SAID = (
    "Megatron-Core core_v0.6.0 (the README's 训练框架版本); TransformerEngine layers "
    "(--transformer-impl transformer_engine) with flash attention (timed as the newest kernel); "
    "--bf16; the distributed optimizer (ZeRO-1) without --overlap-grad-reduce or "
    "--overlap-param-gather (the scripts pass neither: no DP overlap; the variant overlaps); "
    "sequence parallelism (--sequence-parallel); no virtual pipeline (1F1B where PP > 1); the "
    "printed token/p/s ('平均单卡每秒处理的token数') as the tokens/s a GPU"
)
_DP_OVERLAP = {"DP overlap": {"overlap": ("grad-reduce", "prefetch")}}
_H100 = "H100-SXM 80GB nodes with 400Gb/s InfiniBand (the README's 软硬件环境)"
_H800 = "NVIDIA H800-80GB nodes (the README's 硬件环境; interconnect not stated)"
# llama3_8B-megatron README, H100 rows: (nodes, precision, DP, global batch, token/p/s, note)
_L3_8B_ROWS = (
    (1, "bf16", 4, 512, 8103.0),
    (1, "bf16+fp8", 4, 512, 10486.0),
    (2, "bf16", 8, 512, 7914.0),
    (2, "bf16+fp8", 8, 512, 10280.0),
    (55, "bf16", 220, 1760, 7047.0),
)
_RECOMPUTE_SAID = (
    "no recomputation: the README's 优化策略 lists 'recompute-activations' but the case's script "
    "(pretrain_llama3.sh) passes no recompute flag (the variant recomputes selectively)"
)
_FP8_SAID = (
    "'bf16+fp8' as training_adapter_H100_fp8.sh gives it: --fp8-format hybrid, --fp8-amax-compute-algo "
    "max, --fp8-amax-history-len 1024, i.e. TransformerEngine's delayed scaling"
)


def _megatron() -> list[PublishedRun]:
    src, out = "FlagPerf Megatron LLM 2024", []
    for nodes, prec, dp, gbs, tps in _L3_8B_ROWS:
        gpus, fp8 = 8 * nodes, prec == "bf16+fp8"
        where = f"llama3_8B-megatron README '性能指标', H100 {nodes}x8 {prec} PP1DP{dp}TP2 row ({tps:g} token/p/s" + (
            ", 'gbs=1760', 仅供性能参考)" if nodes == 55 else ")"
        )
        out.append(
            SixthRun(
                f"flagperf-llama3-8b-h100-{gpus}gpu-tp2-dp{dp}" + ("-fp8" if fp8 else ""),
                src,
                where,
                "h100",
                gpus,
                FP_LLAMA3_8B,
                training_plan(
                    gbs,
                    "zero-1",
                    tp=2,
                    dp=dp,
                    sp=True,
                    micro_batch=1,
                    flash=True,
                    precision="megatron-bf16-fp8-delayed" if fp8 else "megatron-bf16",
                ),
                8192,
                tps,
                "tokens/s per GPU",
                precision="fp8" if fp8 else "bf16",
                sharding="zero-1",
                assumed=f"{_H100}; {_MEGATRON_SAID}; config_H100x1x8.py: TP 2, PP 1, micro-batch 1 (localbs); "
                f"sequence 8192 and global batch {gbs} ("
                + ("the row's fix_hp 'gbs=1760'" if nodes == 55 else "pretrain_llama3.sh --global-batch-size 512")
                + f"); {_RECOMPUTE_SAID}; Llama 3 8B with Megatron-Core's defaults for what the "
                "script leaves out (tied embeddings, linear biases, learned positions)"
                + (f"; {_FP8_SAID}" if fp8 else ""),
                variants={"selective recomputation": {"recompute": "selective"}, **_DP_OVERLAP},
            )
        )
    out.append(
        SixthRun(
            "flagperf-llama3-70b-h100-64gpu-tp8-pp4-dp2",
            src,
            "llama3_70B-megatron README '性能指标', H100 8x8 bf16 PP4DP2TP8 row (851 token/p/s)",
            "h100",
            64,
            FP_LLAMA3_70B,
            training_plan(512, "zero-1", tp=8, pp=4, dp=2, sp=True, micro_batch=1, flash=True),
            8192,
            851.0,
            "tokens/s per GPU",
            sharding="zero-1",
            schedule="1f1b",
            assumed=f"{_H100}; {_MEGATRON_SAID}; config_H100x8x8.py: TP 8, PP 4, micro-batch 1; sequence 8192, global "
            f"batch 512 (pretrain_llama3.sh; the README: 4M tokens); the 80 layers evenly on 4 stages; "
            f"{_RECOMPUTE_SAID}; Megatron-Core's defaults as for the 8B (tied, biases, learned positions)",
            variants={"selective recomputation": {"recompute": "selective"}, **_DP_OVERLAP},
        )
    )
    out.append(
        SixthRun(
            "flagperf-mixtral-8x7b-h100-32gpu-tp8-pp2-dp2",
            src,
            "mixtral_8x7B-megatron README '性能指标', H100 4x8 bf16 PP2DP2EP1TP8 row (2844.0 token/p/s)",
            "h100",
            32,
            MIXTRAL_8X7B,
            training_plan(
                1200, "zero-1", tp=8, pp=2, dp=2, ep=1, etp=8, sp=True, micro_batch=3, recompute="selective", flash=True
            ),
            4096,
            2844.0,
            "tokens/s per GPU",
            sharding="zero-1",
            schedule="1f1b",
            assumed=f"DGX H100 nodes with 400Gb/s InfiniBand (the README's 硬件环境); {_MEGATRON_SAID}; "
            "config_H100x4x8.py: TP 8, PP 2, micro-batch 3; sequence 4096, global batch 1200 "
            "(megatron_main.sh; the README: 4.8M tokens); EP 1 as the table's parallel column says (the script "
            "at this commit passes --expert-model-parallel-size 8, which DP 2 cannot hold), so the experts are "
            "split by TP 8 (ETP 8); grouped GEMM (--moe-grouped-gemm), aux-loss routing, top-2 of 8; selective "
            "recomputation (--recompute-activations); the 16 layers a stage evenly; the table marks the row "
            "'仅供性能参考' (for performance reference only)",
            variants=_DP_OVERLAP,
        )
    )
    # llama2_70B-megatron README, amp rows: (TP, PP, accumulate (= global batch, DP 1), token/p/s)
    for tp, pp, acc, tps in ((8, 4, 44, 641.93), (4, 8, 44, 791.37), (4, 8, 1024, 908.29)):
        fix = f"GAS={acc}(GBS={acc}=4M tokens)" if acc == 1024 else "/"
        out.append(
            SixthRun(
                f"flagperf-llama2-70b-h800-32gpu-tp{tp}-pp{pp}-gbs{acc}",
                src,
                f"llama2_70B-megatron README '性能指标', H800 4x8 amp TP{tp}PP{pp}DP1 row, fix_hp {fix} ({tps:g} "
                "token/p/s)",
                "h800",
                32,
                FP_LLAMA2_70B[tp],
                training_plan(
                    acc, "zero-1", tp=tp, pp=pp, dp=1, sp=True, micro_batch=1, flash=True, attention_kernel="fa2"
                ),
                4096,
                tps,
                "tokens/s per GPU",
                sharding="zero-1",
                schedule="1f1b",
                assumed=f"{_H800}; Megatron-LM with megatron_main.sh (its version not stated; TransformerEngine not "
                "named, flash attention on: Megatron-LM's flash-attn package, timed as FlashAttention-2 as every set "
                "times that package); 'amp' as the script's --bf16; the "
                "distributed optimizer with DP 1 (nothing to shard or reduce across replicas); sequence "
                "parallelism; config_H800x4x8.py: sequence 4096, micro-batch 1, flash on, recompute off, "
                + (
                    f"accumulate {acc}"
                    if acc == 1024
                    else "accumulate 44 (the config's accumulate_steps; the row's fix_hp '/' leaves the default)"
                )
                + f" = global batch {acc}; the 80 layers evenly on {pp} stages; 1F1B; the printed "
                "token/p/s as the tokens/s a GPU",
            )
        )
    return out


SIXTH: tuple[PublishedRun, ...] = tuple(_paddle() + _megatron())


def sixth_runs() -> list[PublishedRun]:
    """Every run of the sixth held-out set (gathered blind; scored once, later)."""
    return list(SIXTH)

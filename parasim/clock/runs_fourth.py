"""A fourth held-out set of published training runs, gathered 2026-12-05 from sources that neither runs.py nor
runs_fresh.py uses, after the fresh set was scored and before any further change to the time model, timed by
nobody until it was complete: then scored once (2026-12-05), with the model the fresh set was scored with
unchanged, through clock/published.all_runs.

Same format as runs.py and runs_fresh.py: one PublishedRun per run (its source, GPU, model shapes, plan,
sequence, overlap switches and the published figure in the source's own unit), built with
runs.training_plan; `assumed` says what the source leaves out and the value taken. The notes,
docs/notes/step-time-runs-fourth.md, quote every figure and say where it was read. The sources have their own
registry (SOURCES below, every one in the set "fourth"); a FourthRun(...) is a PublishedRun that looks its source up
there, so runs.RUNS, runs.SOURCES and runs_fresh.SOURCES stay as they are.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec
from .runs import (
    ASYNC_TP,
    FOURTH as FOURTH_SET,
    LLAMA3_70B,
    LLAMA3_8B,
    QWEN3_235B_A22B,
    TITAN_CARD,
    PublishedRun,
    Source,
    training_plan,
)

GATHERED = "2026-12-05"  # the date every figure here was read

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "InternLM 7B performance 2023",
            "Shanghai AI Laboratory, InternLM doc/en/train_performance.md "
            "('Training Performance': the throughput table and the FLOPS tables), commit c18bec9 (2023-07-08)",
            "https://github.com/InternLM/InternLM/blob/c18bec9361684189aadf6ffb724f9dfe48288eb0/doc/en/"
            "train_performance.md",
            "2023-07",
            FOURTH_SET,
            "new",
        ),
        Source(
            "torchtitan async TP 2025",
            "PyTorch team, torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md "
            "(the two Results tables), commit 2887250 (2025-06-16)",
            "https://github.com/pytorch/torchtitan/blob/2887250bbd9103d0bc997ea2efb3a525b5e5dbc0/benchmarks/"
            "asyncTP_llama3_h100_2025-06_torchtitan.md",
            "2025-06",
            FOURTH_SET,
            "new: a separate document from benchmarks/llama3_h100_202412_torchtitan.md (runs.py), the Trainy H200 "
            "page (runs.py) and docs/performance.md (runs_fresh.py): other runs, date and software; same team",
        ),
        Source(
            "Megatron-MoE-ModelZoo Qwen3 2025",
            "Dennis Liu et al. (NVIDIA), yanring/Megatron-MoE-ModelZoo "
            "examples/qwen3/readme.md 'Performance Results' (H100), commit 8017e11 (2025-05-27), with the "
            "run_235b.sh, model and runtime configs of that commit",
            "https://github.com/yanring/Megatron-MoE-ModelZoo/blob/8017e1120f5d35ee57cb68507ec993f7cd9bdd8f/"
            "examples/qwen3/readme.md",
            "2025-05",
            FOURTH_SET,
            "new: Megatron-Core MoE developers' own benchmark table, not the Megatron-Bridge/NeMo performance "
            "summary (other layouts, step times and code)",
        ),
        Source(
            "flash-attention training 2022",
            "Tri Dao, Dao-AILab/flash-attention training/README.md 'Training "
            "speed' (the GPT3 table), commit 4a6eaa9 (2022-11-29), with the training/configs of that commit",
            "https://github.com/Dao-AILab/flash-attention/blob/4a6eaa9f27df6fff7ffb2c24e894938a687dd870/training/"
            "README.md",
            "2022-11",
            FOURTH_SET,
            "new",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
FourthRun = partial(PublishedRun, registry=SOURCES)


def _pipe(pp: int, chunks: int) -> str | None:
    return None if pp == 1 else "interleaved" if chunks > 1 else "1f1b"


# -- models ---------------------------------------------------------------------------------------------------

# configs/7B_sft.py at c18bec9: 32 layers, hidden 4096, 32 heads, MLP ratio 8/3 (SwiGLU, rounded up to a multiple
# of 256 by internlm/model/linear.py's FeedForward: 11008), vocabulary 103168, RMSNorm, untied output head
INTERNLM_7B = ModelSpec(
    name="InternLM 7B",
    layers=32,
    hidden=4096,
    heads=32,
    ffn=11008,
    vocab=103168,
    gated=True,
    norm="rmsnorm",
    bias=False,
)
# flash-attention training/configs at 4a6eaa9: GPT-2 blocks (MHA, MLP 4h, LayerNorm, biases, tied embeddings),
# vocabulary 50257 padded to a multiple of 8 (pad_vocab_size_multiple: 8)
_FA_GPT: dict[str, Any] = dict(vocab=50264, tied_embeddings=True)
FA_GPT3 = {
    "125m": ModelSpec(name="GPT3-125M (flash-attention)", layers=12, hidden=768, heads=12, **_FA_GPT),
    "355m": ModelSpec(name="GPT3-355M (flash-attention)", layers=24, hidden=1024, heads=16, **_FA_GPT),
    "760m": ModelSpec(name="GPT3-760M (flash-attention)", layers=24, hidden=1536, heads=16, **_FA_GPT),
    "1.3b": ModelSpec(name="GPT3-1.3B (flash-attention)", layers=24, hidden=2048, heads=16, **_FA_GPT),
    "2.7b": ModelSpec(name="GPT3-2.7B hdim128 (flash-attention)", layers=32, hidden=2560, heads=20, **_FA_GPT),
}


# -- InternLM doc/en/train_performance.md (A100) -----------------------------------------------------------------

# the page's "Inter-machine bandwidth | 4 * 100Gb RoCE": 400 Gb/s a node of 8, 6.25 GB/s a GPU each way
_INTERNLM_NETWORK = {"network": 4 * 100e9 / 8 / 8}
_INTERNLM = (
    "A100 SXM4 80GB (the page's nvidia_a100-sxm4-80gb), but a network of 4 x 100 Gb RoCE a node (the "
    "a100 sheet's is 200 Gb/s a GPU), timed at 6.25 GB/s a GPU; BF16 parameters and gradients with FP32 master weights and Adam "
    "(InternLM's hybrid ZeRO optimizer, timed as the precision 'post'); FlashAttention (the page: 'deeply "
    "integrates Flash-Attention'; doc/en/install.md at the same commit installs "
    "flash-attention v1.0.5, timed as FlashAttention 1: fa1); "
    "the gradient reductions overlapped with the backward (7B_sft.py: zero_overlap_communication=True), "
    "the parameter gather after the step not overlapped; no pipeline; shapes from configs/7B_sft.py (the "
    "QKV and output projections' biases left out)"
)
_INTERNLM_TP = (
    "TP 2 without sequence parallelism (the July 2023 code has none); micro_bsz 4 per TP pair, so "
    "every GPU sees 8 x 2048 tokens a step, as the page says of every test group"
)
# the throughput table: (tp, GPUs, TGS); micro_num 4, micro_bsz 2 (tp 1) or 4 (tp 2), zero1 -1
_INTERNLM_THROUGHPUT = (
    (1, 8, 4062.0),
    (1, 64, 3690.0),
    (1, 1024, 2271.0),
    (2, 8, 3822.0),
    (2, 64, 3438.0),
    (2, 1024, 2785.0),
)
# the FLOPS tables' 8-GPU rows (zero1 8 over 8 GPUs is every data-parallel rank): (activation ckpt, micro_bsz,
# micro_num, TGS)
_INTERNLM_FLOPS = ((True, 8, 1, 3314.0), (False, 2, 4, 4103.0))


def _internlm() -> list[PublishedRun]:
    src, out = "InternLM 7B performance 2023", []
    for tp, gpus, tgs in _INTERNLM_THROUGHPUT:
        dp, mb = gpus // tp, 2 * tp
        out.append(
            FourthRun(
                f"internlm-7b-tp{tp}-zero1all-{gpus}",
                src,
                f"'Throughput Measurement' table, row (tp={tp}, zero1=-1), {gpus} GPUs",
                "a100",
                gpus,
                INTERNLM_7B,
                training_plan(
                    dp * mb * 4,
                    "zero-1",
                    tp=tp,
                    dp=dp,
                    micro_batch=mb,
                    flash=True,
                    precision="post",
                    attention_kernel="fa1",
                ),
                2048,
                tgs,
                "tokens/s per GPU",
                sharding="zero-1",
                overlap=("grad-reduce",),
                machine=_INTERNLM_NETWORK,
                assumed=f"{_INTERNLM}; zero1=-1: optimizer state over all data-parallel ranks (the page: 'equivalent "
                "to Deepspeed Zero-1'); no recomputation (checkpoint=False); pack_sample_into_one=False: the "
                "2048-token packs hold several samples and attention runs within each (FlashAttention's "
                "variable-length path), timed as whole 2048-token sequences" + (f"; {_INTERNLM_TP}" if tp > 1 else ""),
            )
        )
    for ckpt, mb, micro, tgs in _INTERNLM_FLOPS:
        out.append(
            FourthRun(
                f"internlm-7b-8gpu-{'ckpt' if ckpt else 'nockpt'}-mb{mb}",
                src,
                f"'FLOPS Testing' table, Activation Ckpt {'TRUE' if ckpt else 'FALSE'}, 8 GPUs",
                "a100",
                8,
                INTERNLM_7B,
                training_plan(
                    8 * mb * micro,
                    "zero-1",
                    dp=8,
                    micro_batch=mb,
                    recompute="full" if ckpt else "none",
                    flash=True,
                    precision="post",
                    attention_kernel="fa1",
                ),
                2048,
                tgs,
                "tokens/s per GPU",
                sharding="zero-1",
                overlap=("grad-reduce",),
                machine=_INTERNLM_NETWORK,
                assumed=f"{_INTERNLM}; zero1=8 on 8 GPUs, i.e. ZeRO-1 over every data-parallel rank; "
                "pack_sample_into_one=True (whole 2048-token sequences); "
                + ("activation checkpointing as full recomputation of every layer" if ckpt else "no recomputation"),
            )
        )
    return out


# -- torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (H100) -------------------------------------

_TITAN = (
    "Grand Teton H100s at 500 W with 96GB HBM2e at 2.4 TB/s (the h100 sheet is the 700 W, 80GB HBM3 card): "
    "timed at the page's 2.4 TB/s, the 500 W cap not modelled; "
    "sequence 8192 from llama3_8b.toml and llama3_70b.toml at torchtitan 820504e (the page's commit; the page "
    "gives none); the page's 'tokens/sec' read as torchtitan's per-GPU tps (the 70B rows are ~600-940 on "
    "256 GPUs); FSDP2 over the 'FSDP' degree with BF16 parameters and FP32 reductions (torchtitan's "
    "defaults), its gathers and reductions overlapped; TP with sequence parallelism on the norms "
    "(torchtitan's TP plan); the local batch in one micro-batch (no gradient accumulation named); attention "
    "through SDPA (FlashAttention-2); torch.compile (as the commands)"
)
_FP8_TENSORWISE = "FP8 tensorwise linears (torchao Float8, --model.converters float8), weights gathered in BF16"
# (model key, GPUs, TP, FSDP, local batch, recompute, said, (quantization as printed, fp8, vanilla, async))
_TITAN_ROWS = (
    (
        "70b",
        LLAMA3_70B,
        256,
        8,
        32,
        16,
        "full",
        "full activation checkpointing",
        (("None (bfloat16)", False, 597.3, 652.4), ("float8 tensorwise", True, 809.8, 942.4)),
    ),
    (
        "8b",
        LLAMA3_8B,
        64,
        8,
        8,
        12,
        "selective",
        "per-op selective checkpointing (SAC op)",
        (("None (bfloat16)", False, 4378.0, 4809.4), ("float8 tensorwise", True, 5078.1, 5570.1)),
    ),
)


def _titan_async_tp() -> list[PublishedRun]:
    src, out = "torchtitan async TP 2025", []
    for name, model, gpus, tp, fsdp, local, recompute, ac, quants in _TITAN_ROWS:
        table = f"'Llama3 {name} on {gpus} H100s with FSDP={fsdp}, TP={tp}' table"
        for quant, fp8, vanilla, asynct in quants:
            for how, tps, extra in (("vanilla", vanilla, ()), ("async", asynct, ("tp",))):
                out.append(
                    FourthRun(
                        f"titan-asynctp-{name}-fsdp{fsdp}-tp{tp}-{'fp8' if fp8 else 'bf16'}-{how}",
                        src,
                        f"{table}, {quant} row, {'Vanilla TP' if how == 'vanilla' else 'Async TP'} tokens/sec",
                        "h100",
                        gpus,
                        model,
                        training_plan(
                            local * fsdp,
                            "zero-3",
                            tp=tp,
                            dp=fsdp,
                            sp=True,
                            micro_batch=local,
                            recompute=recompute,
                            flash=True,
                            precision="fsdp2-fp8" if fp8 else "fsdp2",
                            attention_kernel="fa2",
                        ),
                        8192,
                        tps,
                        "tokens/s per GPU",
                        precision="fp8" if fp8 else "bf16",
                        sharding="zero-3",
                        overlap=("grad-reduce", "prefetch") + extra,
                        machine=TITAN_CARD,
                        assumed=f"{_TITAN}; {ac}"
                        + (f"; {_FP8_TENSORWISE}" if fp8 else "")
                        + (
                            "; async TP (--parallelism.enable_async_tensor_parallel): TP collectives beside "
                            f"the products, {ASYNC_TP}"
                            if how == "async"
                            else "; vanilla TP: no TP overlap"
                        ),
                    )
                )
    return out


# -- Megatron-MoE-ModelZoo examples/qwen3/readme.md (H100, MoE) ---------------------------------------------------

_ZOO = (
    "256 H100s (the page's setup: NVLink 4th generation, InfiniBand 8x50 GB/s); BF16 (megatron-bf16); "
    "runtime flags from model_configs/benchmarking/Qwen3-235B-A22B.yaml at the same commit: distributed "
    "optimizer with --overlap-grad-reduce and --overlap-param-gather, sequence parallelism, FlashAttention, "
    "ETP 1, no TP overlap, the embedding and the loss counted as layers in the pipeline split "
    "(--account-for-embedding/loss-in-pipeline-split: 96 over the stages); routing force-balanced "
    "(--moe-router-force-load-balancing in every command of run_235b.sh), timed as dropless balanced routing; "
    "every dispatcher timed as NCCL's all-to-all of each top-k copy, as the set was scored (the DeepEP "
    "rows' variant times DeepEP's once-per-GPU sends); QK-layernorm not in the shapes"
)
_ZOO_WHERE = "'Performance Results' table"


def _zoo() -> list[PublishedRun]:
    src = "Megatron-MoE-ModelZoo Qwen3 2025"

    def row(
        key: str,
        where: str,
        batch: int,
        seconds: float,
        said: str,
        sharding: str = "zero-1",
        extra: tuple[str, ...] = (),
        variants: dict[str, dict[str, Any]] | None = None,
        **choices: Any,
    ) -> PublishedRun:
        plan = training_plan(batch, sharding, sp=True, flash=True, **choices)
        o = ("grad-reduce", "prefetch") + (("p2p",) if plan.pp > 1 and plan.chunks > 1 else ()) + extra
        if said.startswith("DeepEP dispatcher"):  # what DeepEP's sends give, beside the scored figure
            variants = {**(variants or {}), "DeepEP dispatch": {"dispatcher": "deepep"}}
        return FourthRun(
            f"zoo-qwen3-235b-{key}",
            src,
            f"{_ZOO_WHERE}, {where}",
            "h100",
            256,
            QWEN3_235B_A22B,
            plan,
            4096,
            seconds,
            "s per step",
            sharding=sharding,
            schedule=_pipe(plan.pp, plan.chunks),
            overlap=o,
            assumed=f"{_ZOO}; {said}",
            variants=variants or {},
        )

    sel = "selective recomputation of the norms and the MoE activation (the table's 'norm, act')"
    return [
        row(
            "tp2-pp8-ep32-deepep",
            "Cross-node EP strategy, first row (DeepEP, step time 19.7)",
            2048,
            19.7,
            f"DeepEP dispatcher; {sel}; P2P overlap under interleaving (Megatron's default)",
            tp=2,
            pp=8,
            dp=16,
            ep=32,
            chunks=4,
            recompute="selective",
        ),
        row(
            "tp2-pp8-ep32-deepep-1f1b-overlap",
            "Cross-node EP strategy, second row ('+1f1b overlap', step time 17.6)",
            2048,
            17.6,
            f"DeepEP dispatcher; {sel}; P2P overlap; the EP all-to-all hidden behind a paired micro-batch's compute "
            "(run_235b.sh: --combined-1f1b --combined-1f1b-recipe ep_a2a) given as the registry's 'dualpipe' "
            "switch, the nearest there is (a forward and a backward chunk paired) though the schedule stays "
            "interleaved 1F1B: doubtful, the variant without it brackets it",
            extra=("dualpipe",),
            variants={"no EP overlap": {"overlap": ("grad-reduce", "prefetch", "p2p")}},
            tp=2,
            pp=8,
            dp=16,
            ep=32,
            chunks=4,
            recompute="selective",
        ),
        row(
            "tp2-ep8-fsdp",
            "Intra-node EP strategy, first row (FSDP On, step time 17.6)",
            2048,
            17.6,
            "DeepEP dispatcher; Megatron's custom FSDP sharding optimizer state, gradients and parameters "
            "(run_235b.sh: --use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params) as ZeRO-3, its "
            "gathers and reductions overlapped; full recomputation of every layer (--recompute-granularity full "
            "--recompute-method uniform --recompute-num-layers 1); TP 2 and DP 128 as the table (run_235b.sh's "
            "command for this layout says TP=1; the table's DP 128 = 256 / 2 agrees with TP 2)",
            sharding="zero-3",
            tp=2,
            dp=128,
            ep=8,
            micro_batch=4,
            recompute="full",
        ),
        row(
            "tp2-pp32-ep8-a2a",
            "Intra-node EP strategy, second row (A2A, step time 24.2)",
            2048,
            24.2,
            f"the all-to-all dispatcher (the table's 'A2A'); {sel}; P2P overlap; 96 (94 + embedding + loss) over "
            "32 stages x 3 chunks, one layer a chunk",
            tp=2,
            pp=32,
            dp=4,
            ep=8,
            chunks=3,
            recompute="selective",
        ),
        row(
            "tp4-pp8-ep8-deepep",
            "Intra-node EP strategy, third row (DeepEP, step time 29.0)",
            2048,
            29.0,
            "DeepEP dispatcher; no recomputation (the table's recompute cell is empty and run_235b.sh's command for "
            "this layout names none); P2P overlap",
            tp=4,
            pp=8,
            dp=8,
            ep=8,
            chunks=4,
        ),
    ]


# -- flash-attention training/README.md (A100) --------------------------------------------------------------------

_FA = (
    "one node of 8 A100 SXM4 80GB (400 W) with NVLink; the page prints the node's tokens/sec, the row's figure "
    "is it over the 8 GPUs; configs from training/configs/experiment/pile/*-flash.yaml at the same commit: "
    "sequence 2048, BF16 (Lightning precision bf16: autocast over FP32 weights and gradients, timed as "
    "Megatron's BF16 convention), FlashAttention 1 (timed as fa1), fused dense+GELU and "
    "dropout+add+LayerNorm kernels, GPT2Config's dropout 0.1, no activation checkpointing (the page: 'we don't "
    "need any activation checkpointing'; mlp_checkpoint_lvl 0), the micro-batch the configs pick for an 80GB "
    "card (gpu_mem >= 80), DDP with its bucketed gradient all-reduce overlapped with the backward"
)
# (key, printed name, global batch, micro-batch, sharding, tokens/sec for the node as printed, tokens/s a GPU)
_FA_ROWS = (
    ("125m", "GPT3-125M", 256, 32, "none", "1310k", 1310e3 / 8),
    ("355m", "GPT3-355M", 256, 32, "none", "503k", 503e3 / 8),
    ("760m", "GPT3-760M", 256, 16, "zero-1", "245k", 245e3 / 8),
    ("1.3b", "GPT3-1.3B", 512, 8, "zero-1", "169k", 169e3 / 8),
    ("2.7b", "GPT3-2.7B", 512, 4, "zero-1", "85k", 85e3 / 8),
)


def _flash_attention() -> list[PublishedRun]:
    src = "flash-attention training 2022"
    return [
        FourthRun(
            f"fa-gpt3-{key}-8xa100",
            src,
            f"'Training speed' GPT3 table, {name} row ({printed} tokens/sec)",
            "a100",
            8,
            FA_GPT3[key],
            training_plan(batch, sharding, dp=8, micro_batch=mb, flash=True, dropout=True, attention_kernel="fa1"),
            2048,
            tps,
            "tokens/s per GPU",
            sharding=sharding,
            overlap=("grad-reduce",),
            assumed=f"{_FA}; "
            + (
                "plain DDP with apex AdamW (adamw-apex, no strategy)"
                if sharding == "none"
                else "DDP with ZeRO-1 (DDPStrategyZero1, adamw-zero), the parameter broadcast after the "
                "step not overlapped"
            )
            + ("; head dimension 128 (20 heads on 2560), as the page says" if key == "2.7b" else ""),
        )
        for key, name, batch, mb, sharding, printed, tps in _FA_ROWS
    ]


FOURTH: tuple[PublishedRun, ...] = tuple(_internlm() + _titan_async_tp() + _zoo() + _flash_attention())


def fourth_runs() -> list[PublishedRun]:
    """Every run of the fourth held-out set (scored once, with the fresh set's model)."""
    return list(FOURTH)

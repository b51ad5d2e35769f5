"""A fifth held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py and runs_fourth.py uses, blind: while the time model was being changed by someone else, and
without any of these runs being timed or scored by the gatherer. It is to be scored once, later, as it stands.

Same format as runs_fourth.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure), built with runs.training_plan; `assumed` says what the source leaves out and
the value taken, `variants` the doubtful choices. The notes, docs/notes/step-time-runs-fifth.md, quote every
figure and say where it was read. The sources have their own registry (SOURCES below), each in the set
runs.FIFTH ("fifth"); a FifthRun(...) is a PublishedRun that looks its source up there. FIFTH is the runs, as FOURTH
is in runs_fourth.py.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec
from .runs import FIFTH as FIFTH_SET, DEEPSEEK_V3, LLAMA3_70B, QWEN3_30B_A3B, PublishedRun, Source, training_plan

GATHERED = "2026-12-05"  # the date every figure here was read

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "JAX-Toolbox Paxml 2024",
            "NVIDIA, JAX-Toolbox rosetta/rosetta/projects/pax/README.md ('Configs', GPT: "
            "the 'A100 Results' and 'H100 Results' tables), commit 0005642 (2024-06-07), with google/paxml "
            "paxml/contrib/gpu/scripts_gpu/configs.py at commit 7241216 (2024-05-13)",
            "https://github.com/NVIDIA/JAX-Toolbox/blob/00056429/rosetta/rosetta/projects/pax/README.md",
            "2024-06",
            FIFTH_SET,
            "new: Paxml on JAX/XLA (NVIDIA's Rosetta containers), a stack no earlier set reads",
        ),
        Source(
            "JAX-Toolbox MaxText 2024",
            "NVIDIA, JAX-Toolbox rosetta/rosetta/projects/maxtext/README.md ('Configs', "
            "LLaMA table), commit db09688 (2024-05-01)",
            "https://github.com/NVIDIA/JAX-Toolbox/blob/db096881/rosetta/rosetta/projects/maxtext/README.md",
            "2024-05",
            FIFTH_SET,
            "new: MaxText on JAX/XLA; same repository as the Paxml page, another document and code base",
        ),
        Source(
            "NeMo Megatron launcher 2022",
            "NVIDIA, NeMo-Megatron launcher (now NVIDIA/NeMo-Framework-Launcher) "
            "README.md section 7.1.2 'Training Performance Results' (GPT-3 5B and 175B tables), commit 3579cdb "
            "(2022-09-07), with conf/training/gpt3/5b.yaml and 175b.yaml of that commit",
            "https://github.com/NVIDIA/NeMo-Framework-Launcher/blob/3579cdb3f2afdeaf23af3e0da6497555566c3f0c/README.md",
            "2022-09",
            FIFTH_SET,
            "new: the 2022 launcher's own A100 scaling measurements; not the NeMo / Megatron-Bridge performance "
            "summary (H100, 2024 on) nor the DGXC recipes: other years, containers, GPUs and runs. Same vendor",
        ),
        Source(
            "NeMo AutoModel 2026",
            "NVIDIA, NeMo AutoModel docs/performance-summary.md ('Pre-Training "
            "Performance', DGX-H100 BF16 table), commit e458120 (2026-04-17), with examples/llm_benchmark of that "
            "commit",
            "https://github.com/NVIDIA-NeMo/Automodel/blob/e45812012/docs/performance-summary.md",
            "2026-04",
            FIFTH_SET,
            "new: AutoModel's PyTorch-native trainer (FSDP2 with EP, CP and torch pipelining), not Megatron-Core; "
            "its own runs, not the Megatron-Bridge/NeMo summary or DGXC. Same vendor",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
FifthRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# paxml configs.py at 7241216: GPT126MBase 12 layers, 12 heads, 768, MLP 3072, vocabulary 50304; GPT5BBase 24 layers,
# 32 heads, 4096, MLP 16384, head 128 (vocabulary 50304, inherited); GPT175BBase 96 layers, 96 heads, 12288, MLP 4h,
# vocabulary 50257; all GELU, biases, LayerNorm, learned positions, SEPARATE_EMBEDDING False (tied softmax)
_PAX: dict[str, Any] = dict(tied_embeddings=True)
PAX_GPT = {
    "126m": ModelSpec(name="GPT 126M (Paxml)", layers=12, hidden=768, heads=12, ffn=3072, vocab=50304, **_PAX),
    "5b": ModelSpec(name="GPT 5B (Paxml)", layers=24, hidden=4096, heads=32, ffn=16384, vocab=50304, **_PAX),
    "175b": ModelSpec(name="GPT 175B (Paxml)", layers=96, hidden=12288, heads=96, ffn=49152, vocab=50257, **_PAX),
}
# paxml configs.py at 7241216, LLaMA7B: 32 layers, 32 heads of 128, 4096, MLP 11008, vocabulary 32000 (LLaMA-2 7B)
LLAMA2_7B = ModelSpec(
    name="Llama 2 7B", layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, gated=True, norm="rmsnorm", bias=False
)
# NeMo launcher conf/training/gpt3 at 3579cdb: 5B 24 layers, 4096, 32 heads, ffn 4h; 175B 96 layers, 12288, 96 heads;
# GPT2BPETokenizer (50257) padded to make_vocab_size_divisible_by 128 times TP (Megatron's rule): 50304 at TP 1,
# 51200 at TP 8
NEMO_GPT3 = {
    "5b": ModelSpec(name="GPT-3 5B (NeMo)", layers=24, hidden=4096, heads=32, vocab=50304, tied_embeddings=True),
    "175b": ModelSpec(name="GPT-3 175B (NeMo)", layers=96, hidden=12288, heads=96, vocab=51200, tied_embeddings=True),
}


# -- JAX-Toolbox Paxml README (A100, H100) ------------------------------------------------------------------------

_PAX_SAID = (
    "Paxml on JAX/XLA; shapes from paxml configs.py at 7241216 (the README's container, 24.04, is not "
    "pinned to a commit); sequence 2048 (MAX_SEQ_LEN); global batch = 'BS / GPU' x GPUs (the README: "
    "GLOBAL_BATCH_SIZE = PERCORE_BATCH_SIZE * NUM_GPUS), in one micro-batch; no dropout in the layers "
    "(DROPOUT_PROB 0.0; the 5B's 0.1 is on the input embedding only); the printed Sequences/Sec times 2048 "
    "over the GPUs as the figure; XLA's async collectives (the README's XLA flags) as overlap"
)
_PAX_FSDP = (
    "FSDP over every GPU (the table's FSDP column) as ZeRO-3, its gathers and reductions overlapped; "
    "FP32 parameters with BF16 products (FPROP_DTYPE bfloat16), timed as FSDP2's policy (BF16 gathers, "
    "FP32 reductions), though XLA may gather in FP32"
)
# (key, GPU, printed precision, GPUs, DP, FSDP, BS/GPU, sequences/s)
_PAX_ROWS = (
    ("126m", "a100", "BF16", 64, 64, 1, 4, 2098.16),
    ("5b", "a100", "BF16", 256, 1, 256, 8, 594.13),
    ("126m", "a100", "TE BF16", 64, 64, 1, 4, 2526.72),
    ("5b", "a100", "TE BF16", 256, 1, 256, 8, 718.19),
    ("175b", "a100", "TE BF16", 256, 1, 256, 6, 20.44),
    ("126m", "h100", "TE BF16", 64, 64, 1, 4, 4709.12),
    ("5b", "h100", "TE BF16", 256, 1, 256, 8, 1657.24),
    ("175b", "h100", "TE BF16", 256, 1, 256, 6, 51.00),
    ("5b", "h100", "TE FP8", 256, 1, 256, 8, 2374.66),
    ("175b", "h100", "TE FP8", 256, 1, 256, 6, 84.45),
)


def _pax() -> list[PublishedRun]:
    src, out = "JAX-Toolbox Paxml 2024", []
    for key, gpu, prec, gpus, dp, fsdp, per, sps in _PAX_ROWS:
        fp8 = prec == "TE FP8"
        tag = {"BF16": "bf16", "TE BF16": "te-bf16", "TE FP8": "te-fp8"}[prec]
        batch, kernel = per * gpus, "fa2" if gpu == "a100" else None
        where = f"'{gpu.upper()} Results' table, {key.upper()} {prec} row ({sps:g} Sequences/Sec)"
        if key == "126m":
            plan = training_plan(batch, "none", dp=dp, micro_batch=per, flash=False, precision="megatron-bf16")
            said = (
                "plain data parallelism over the 64 GPUs (DP 64), gradients all-reduced in FP32 (FP32 "
                "parameters, BF16 products; timed as Megatron's BF16 convention); no FlashAttention (the "
                "README: 126M figures 'gathered _without_ flash attention'); no recomputation (the 126M "
                "layers are not repeated, so the repeated stack's checkpoint policy does not apply: doubtful, "
                "the variant recomputes)"
            )
            out.append(
                FifthRun(
                    f"pax-gpt126m-{gpu}-{tag}-dp64",
                    src,
                    where,
                    gpu,
                    gpus,
                    PAX_GPT[key],
                    plan,
                    2048,
                    sps * 2048 / gpus,
                    "tokens/s per GPU",
                    sharding="none",
                    overlap=("grad-reduce",),
                    assumed=f"{_PAX_SAID}; {said}"
                    + (
                        "; Transformer Engine layers (ENABLE_TE)"
                        if "TE" in prec
                        else "; XLA's own layers, no Transformer Engine"
                    ),
                    variants={"full recomputation": {"recompute": "full"}},
                )
            )
            continue
        policy = (
            "SAVE_DOT_WITH_NO_BATCH_DIM (GPT5BBase): no activation with a batch dimension kept, timed as "
            "full recomputation"
            if key == "5b"
            else "SAVE_NOTHING (the base class default; GPT175BBase sets none): full recomputation"
        )
        plan = training_plan(
            batch,
            "zero-3",
            dp=fsdp,
            micro_batch=per,
            recompute="full",
            flash=True,
            precision="fsdp2-fp8" if fp8 else "fsdp2",
            attention_kernel=kernel,
        )
        out.append(
            FifthRun(
                f"pax-gpt{key}-{gpu}-{tag}-fsdp{fsdp}",
                src,
                where,
                gpu,
                gpus,
                PAX_GPT[key],
                plan,
                2048,
                sps * 2048 / gpus,
                "tokens/s per GPU",
                precision="fp8" if fp8 else "bf16",
                sharding="zero-3",
                overlap=("grad-reduce", "prefetch"),
                assumed=f"{_PAX_SAID}; {_PAX_FSDP}; checkpoint policy {policy}; FlashAttention (the README: 'The "
                "other model sizes enable flash attention'; cuDNN's fused attention"
                + (", timed as FA2 on the A100)" if kernel else ")")
                + ("; Transformer Engine layers" if "TE" in prec else "; XLA's own layers, no Transformer Engine")
                + (
                    "; TE FP8 linears, timed with per-tensor scaling (the registry's FSDP2 FP8 entry; TE's "
                    "recipe of the time is not stated) and weights gathered in BF16"
                    if fp8
                    else ""
                ),
            )
        )
    return out


# -- JAX-Toolbox MaxText README (H100) ----------------------------------------------------------------------------


def _maxtext() -> list[PublishedRun]:
    return [
        FifthRun(
            "maxtext-llama2-7b-h100-fsdp8",
            "JAX-Toolbox MaxText 2024",
            "LLaMA table, 7B row (Step Time (s) 0.721)",
            "h100",
            8,
            LLAMA2_7B,
            training_plan(16, "zero-3", dp=8, micro_batch=2, recompute="selective", flash=True, precision="fsdp2"),
            4096,
            0.721,
            "s per step",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            assumed="one DGX H100 node; BF16; FSDP 8 (the table's column) as ZeRO-3, its gathers and reductions "
            "overlapped (the README's XLA flags pipeline the all-gathers and reduce-scatters), timed as "
            "FSDP2's BF16 gathers and FP32 reductions; global batch 16 in one micro-batch of 2 a GPU; "
            "attention 'Flash' (cuDNN's fused attention); remat policy 'minimal_flash' timed as selective "
            "recomputation (doubtful: MaxText's policy keeps the projections' outputs, the variant recomputes "
            "nothing); scan off; shapes of Llama 2 7B as paxml's LLaMA7B config gives them",
            variants={"no recomputation": {"recompute": "none"}},
        )
    ]


# -- NeMo Megatron launcher README (A100) -------------------------------------------------------------------------

_NEMO_SAID = (
    "A100 80GB DGX nodes (the page's SuperPOD); the printed Tokens per Second of all the nodes over the "
    "GPUs as the figure; the yaml's global batch 2048 and micro-batch 2 at every node count (the page "
    "does not say the scaling runs changed them); BF16 with O2 master weights (megatron_amp_O2) as "
    "Megatron's BF16; hidden dropout 0.1; no FlashAttention (2022 NeMo); learned positions and tied "
    "embeddings (Megatron's GPT defaults); apex's distributed_fused_adam timed as the distributed "
    "optimizer (ZeRO-1: optimizer state sharded, gradients reduce-scattered, parameters gathered once a "
    "step); no overlap of those collectives (the yaml names none; the variant overlaps them)"
)
_NEMO_5B = (1, 40345.0), (2, 79815.0), (4, 161754.0), (8, 312774.0), (16, 659481.0), (32, 1159288.0)
_NEMO_175B = (8, 7500.0), (16, 14950.0), (32, 29537.0), (64, 58211.0), (128, 109684.0)
_DP_OVERLAP = {"DP overlap": {"overlap": ("grad-reduce", "prefetch")}}


def _nemo_launcher() -> list[PublishedRun]:
    src, out = "NeMo Megatron launcher 2022", []
    for nodes, tps in _NEMO_5B:
        gpus = 8 * nodes
        out.append(
            FifthRun(
                f"nemo-gpt3-5b-a100-{nodes}node",
                src,
                f"section 7.1.2, 5B table, {nodes} nodes ({tps:.0f} Tokens per Second)",
                "a100",
                gpus,
                NEMO_GPT3["5b"],
                training_plan(2048, "zero-1", dp=gpus, micro_batch=2, flash=False, dropout=True),
                2048,
                tps / gpus,
                "tokens/s per GPU",
                sharding="zero-1",
                assumed=f"{_NEMO_SAID}; 5b.yaml: TP 1, PP 1, so data parallelism over every GPU; no recomputation "
                "(activations_checkpoint_granularity full with method block and 0 layers)",
                variants=_DP_OVERLAP,
            )
        )
    for nodes, tps in _NEMO_175B:
        gpus, dp = 8 * nodes, nodes // 8
        out.append(
            FifthRun(
                f"nemo-gpt3-175b-a100-{nodes}node",
                src,
                f"section 7.1.2, 175B table, {nodes} nodes ({tps:.0f} Tokens per Second)",
                "a100",
                gpus,
                NEMO_GPT3["175b"],
                training_plan(
                    2048,
                    "zero-1",
                    tp=8,
                    pp=8,
                    dp=dp,
                    sp=True,
                    micro_batch=2,
                    recompute="selective",
                    flash=False,
                    dropout=True,
                ),
                2048,
                tps / gpus,
                "tokens/s per GPU",
                sharding="zero-1",
                schedule="1f1b",
                assumed=f"{_NEMO_SAID}; 175b.yaml: TP 8, PP 8 (no virtual pipeline named: 1F1B, one chunk a GPU), "
                "sequence parallelism, selective recomputation; the 96 layers evenly on the 8 stages",
                variants=_DP_OVERLAP,
            )
        )
    return out


# -- NeMo AutoModel performance summary (H100) --------------------------------------------------------------------

_AUTO = (
    "DGX-H100, BF16, mock data, 'Fake balanced gate' (routing balanced), no gradient clipping (the page's "
    "notes); FSDP2 with BF16 gathers and FP32 reductions (FSDP2's usual policy; the page names none), its "
    "gathers and reductions overlapped; TE attention, linears and RMSNorm ('TE' in the table), attention "
    "timed as the newest kernel; layout, batch and sequence from the table's columns (the yaml files at this "
    "commit differ from some rows, so the table is taken)"
)
_DEEPEP = "the DeepEP dispatcher (the table's 'TE + DeepEP'; the yaml's dispatcher: deepep)"
_A2A = {"all-to-all dispatch": {"dispatcher": "alltoall"}}
# DeepSeek-V3 without the multi-token prediction module (the HF model the yaml loads has none)
_DSV3_PIPE = (
    "PP 4 with VP 8 (the table) as interleaved 1F1B with 8 chunks a GPU (the yaml's pp_schedule "
    "interleaved1f1b), the 61 layers spread over the stages (the split is not given); EP 64 inside FSDP "
    "64 (so the GPUs are PP x FSDP)"
)


def _automodel() -> list[PublishedRun]:
    src = "NeMo AutoModel 2026"

    def row(
        key: str,
        where: str,
        gpus: int,
        model: ModelSpec,
        plan: Any,
        seq: int,
        seconds: float,
        said: str,
        schedule: str | None = None,
        variants: dict[str, dict[str, Any]] | None = None,
    ) -> PublishedRun:
        return FifthRun(
            f"automodel-{key}",
            src,
            f"'Pre-Training Performance' table, {where}",
            "h100",
            gpus,
            model,
            plan,
            seq,
            seconds,
            "s per step",
            sharding="zero-3",
            schedule=schedule,
            overlap=("grad-reduce", "prefetch"),
            assumed=f"{_AUTO}; {said}",
            variants=variants or {},
        )

    common = dict(flash=True, precision="fsdp2")
    return [
        row(
            "deepseek-v3-256gpu-pp4-ep64",
            "DeepSeek V3 671B, 256 GPUs (Time per Global Step 8.18)",
            256,
            DEEPSEEK_V3,
            training_plan(
                512,
                "zero-3",
                pp=4,
                dp=64,
                ep=64,
                chunks=8,
                micro_batch=1,
                recompute="full",
                dispatcher="deepep",
                **common,
            ),
            4096,
            8.18,
            f"{_DSV3_PIPE}; {_DEEPEP}; full recomputation (deepseek_v3_te_deepep.yaml: activation_checkpointing "
            "true); no multi-token prediction",
            schedule="interleaved",
            variants={**_A2A, "no recomputation": {"recompute": "none"}},
        ),
        row(
            "deepseek-v3-1024gpu-pp4-ep64",
            "DeepSeek V3 671B, 1024 GPUs (Time per Global Step 37.87)",
            1024,
            DEEPSEEK_V3,
            training_plan(8192, "zero-3", pp=4, dp=256, ep=64, chunks=8, micro_batch=1, dispatcher="deepep", **common),
            4096,
            37.87,
            f"{_DSV3_PIPE.replace('FSDP 64', 'FSDP 256')}; {_DEEPEP}; no recomputation "
            "(deepseek_v3_te_deepep_1024.yaml names no activation checkpointing: doubtful, the 256-GPU file turns "
            "it on; the variant recomputes); no multi-token prediction",
            schedule="interleaved",
            variants={**_A2A, "full recomputation": {"recompute": "full"}},
        ),
        row(
            "qwen3-30b-a3b-8gpu-ep8",
            "Qwen3 MoE 30B, 8 GPUs (Time per Global Step 21.773)",
            8,
            QWEN3_30B_A3B,
            training_plan(512, "zero-3", dp=8, ep=8, micro_batch=4, recompute="full", dispatcher="deepep", **common),
            4096,
            21.773,
            f"{_DEEPEP}; EP 8 inside FSDP 8; full recomputation (qwen3_moe_30b_te_deepep.yaml: "
            "activation_checkpointing true); QK-norm not in the shapes",
            variants=_A2A,
        ),
        row(
            "llama3-70b-64gpu-fsdp32-cp2",
            "Llama3 70B, 64 GPUs (Time per Global Step 18.90)",
            64,
            LLAMA3_70B,
            training_plan(
                128, "zero-3", dp=32, cp=2, micro_batch=1, recompute="full", attention_kernel="fa2", **common
            ),
            8192,
            18.90,
            "Llama 3.1 70B (custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml); CP 2 with FSDP 32; full "
            "recomputation (activation_checkpointing True); SDPA attention (attn_implementation sdpa, 'required "
            "for cp>1'), timed as FlashAttention-2 (SDPA's flash backend, as every earlier set times SDPA); "
            "torch.compile on (enable_compile); FSDP2 prefetch on "
            "(enable_fsdp2_prefetch, the table's 'fsdp2_prefetch'); RMSNorm in FP32 torch (rms_norm: torch_fp32)",
        ),
    ]


FIFTH: tuple[PublishedRun, ...] = tuple(_pax() + _maxtext() + _nemo_launcher() + _automodel())


def fifth_runs() -> list[PublishedRun]:
    """Every run of the fifth held-out set (gathered blind; scored once, later)."""
    return list(FIFTH)

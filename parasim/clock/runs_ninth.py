"""A ninth held-out set of published training runs, gathered 2026-12-05 from sources that none of runs.py,
runs_fresh.py, runs_fourth.py, runs_fifth.py, runs_sixth.py, runs_seventh.py and runs_eighth.py uses, blind:
without any of these runs being timed or scored by the gatherer. It was scored once, as it stands, with the model
the eighth set tested (clock/sets.py).

Same format as runs_eighth.py: one PublishedRun per run (its source, GPU, model shapes, plan, sequence, overlap
switches and the published figure), built with runs.training_plan; `assumed` says what the source leaves out and
the value taken, `variants` the doubtful choices. The notes, docs/notes/step-time-runs-ninth.md, quote every
figure and say where it was read. The sources have their own registry (SOURCES below), each in the set "ninth"
(runs.NINTH, wired into clock/sets.py when it was scored); a NinthRun(...) is a PublishedRun that looks its
source up there. NINTH is the runs.

Both sources are NVIDIA NeMo's own performance summaries (not Megatron-Bridge's, which a held-out set already
reads, and not the DGX Cloud Benchmarking recipes):
- NeMo 24.07 (NVIDIA/NeMo docs/source/performance/performance_summary.md at 8e3d65d, its last version on main;
  the file was deleted from the repository in December 2024): the "Pretraining" table, DGX-H100, FP8, dense models
  (GPT3, Llama 2, Nemotron-3, Nemotron-4 340B, Llama 3), with GBS, MBS, sequence, TP, PP, CP, VP and Tokens / sec /
  GPU.
- NeMo 25.02 (the NeMo Framework user guide's Performance Summary page on docs.nvidia.com, the snapshot whose
  container line reads NeMo 25.02, NeMo 2.0): the DGX-B200 pre-training table in full (dense and the two Mixtral
  MoE rows, with EP and GA columns) and the one DGX-H100 row the stored snapshot shows whole.
The unit is the pages' Tokens / sec / GPU throughout, so no FLOP counting rule is needed.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layout import ModelSpec, Stages
from .runs import NINTH as NINTH_SET, PublishedRun, Source, training_plan

GATHERED = "2026-12-05"  # the date every figure here was read
_NEMO = "8e3d65dcfe3504689bfc5b6e67d502780aacad41"  # NVIDIA/NeMo, "24.07 perf numbers (#10253)"
_PAGE = "https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "NeMo performance summary 24.07",
            "NVIDIA, NeMo docs/source/performance/performance_summary.md, "
            "'Performance Benchmarks', 'Pretraining' table (Container NeMo24.07, System DGX-H100, FP8), commit 8e3d65d "
            "(2024-09-09, the file's last change on main; deleted from the repository on 2024-12-11 in d31653f)",
            f"https://github.com/NVIDIA/NeMo/blob/{_NEMO}/docs/source/performance/performance_summary.md",
            "2024-08",
            NINTH_SET,
            "new: NeMo's own summary of its 24.07 container (NeMo 1.0 era), in the NeMo repository's docs, which no "
            "earlier set reads; Megatron-Bridge's performance-summary-archive (25.09 to 26.06 containers, another "
            "repository) and the DGXC Benchmarking recipes are different documents and software; NVIDIA's tuned "
            "recipes, like those",
        ),
        Source(
            "NeMo performance summary 25.02",
            "NVIDIA, NeMo Framework user guide, Performance, 'Performance Summary "
            "for Large Language Models', 'Pretraining' tables (FP8, NeMo 2.0; Container NeMo 25.02): System DGX-B200 "
            "in full and the first row of System DGX-H100; the stored snapshot of the page read 2026-12-05 (a web page "
            "with no commit; 'latest' has since moved to later containers)",
            _PAGE,
            "2025-02",
            NINTH_SET,
            "new: the NeMo 2.0 summary of the 25.02 container, published on docs.nvidia.com only; no earlier set "
            "reads it; it holds B200 rows and the Mixtral 8x7B and 8x22B MoE rows. Same publisher and lineage as the "
            "24.07 source: a reader wanting independent sources may count the two as one",
        ),
    )
}


# a PublishedRun whose source is in this module's SOURCES
NinthRun = partial(PublishedRun, registry=SOURCES)


# -- models ---------------------------------------------------------------------------------------------------

# NeMo's GPT3 configs (nemo/collections/llm/gpt/model/base.py GPTConfig5B, 20B, 175B; the 24.07 launcher's gpt3
# yamls give the same shapes): LayerNorm (layernorm1p), GELU, biases, learned positions, shared input and output
# embeddings; the GPT-2 vocabulary of 50257 padded to make_vocab_size_divisible_by 128 x TP (assumed): 50304 at
# TP 1, 50432 at TP 2, 50688 at TP 4
_GPT3: dict[str, Any] = dict(tied_embeddings=True)
GPT3_5B = ModelSpec(name="GPT3-5B (NeMo)", layers=24, hidden=4096, heads=32, ffn=16384, vocab=50304, **_GPT3)
GPT3_20B = ModelSpec(name="GPT3-20B (NeMo)", layers=44, hidden=6144, heads=48, ffn=24576, vocab=50432, **_GPT3)
GPT3_175B = ModelSpec(name="GPT3-175B (NeMo)", layers=96, hidden=12288, heads=96, ffn=49152, vocab=50688, **_GPT3)
_LLAMA2: dict[str, Any] = dict(gated=True, norm="rmsnorm", bias=False, vocab=32000)
LLAMA2_7B = ModelSpec(name="LLAMA2-7B (NeMo)", layers=32, hidden=4096, heads=32, ffn=11008, **_LLAMA2)
LLAMA2_13B = ModelSpec(name="LLAMA2-13B (NeMo)", layers=40, hidden=5120, heads=40, ffn=13824, **_LLAMA2)
LLAMA2_70B = ModelSpec(name="LLAMA2-70B (NeMo)", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, **_LLAMA2)
# Nemotron (nemo/collections/llm/gpt/model/nemotron.py): LayerNorm, squared-ReLU MLP (not gated), RoPE, no
# biases, untied embeddings, the 256000-token vocabulary; Nemotron-3 8B and 22B with full multi-head attention
# (num_query_groups None), Nemotron-4 15B and 340B with 8 query groups
_NEMOTRON: dict[str, Any] = dict(vocab=256000, bias=False)
NEMOTRON_8B = ModelSpec(name="Nemotron-8B (NeMo)", layers=32, hidden=4096, heads=32, ffn=16384, **_NEMOTRON)
NEMOTRON_22B = ModelSpec(name="Nemotron-22B (NeMo)", layers=40, hidden=6144, heads=48, ffn=24576, **_NEMOTRON)
NEMOTRON_15B = ModelSpec(
    name="Nemotron-15B (NeMo)", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576, **_NEMOTRON
)
NEMOTRON_340B = ModelSpec(
    name="Nemotron-340B (NeMo)", layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728, **_NEMOTRON
)
_LLAMA3: dict[str, Any] = dict(gated=True, norm="rmsnorm", bias=False, vocab=128256, kv_heads=8)
LLAMA3_8B = ModelSpec(name="LLAMA3-8B (NeMo)", layers=32, hidden=4096, heads=32, ffn=14336, **_LLAMA3)
LLAMA3_70B = ModelSpec(name="LLAMA3-70B (NeMo)", layers=80, hidden=8192, heads=64, ffn=28672, **_LLAMA3)
# 126 layers on PP 8 x VP 8 = 64 chunks: even only when the embedding and the loss each count as a layer
# (Megatron's --account-for-embedding-in-pipeline-split / -loss-, as NeMo's 405B recipe is assumed to set)
LLAMA3_405B = ModelSpec(
    name="LLAMA3-405B (NeMo)",
    layers=126,
    hidden=16384,
    heads=128,
    ffn=53248,
    stages=Stages(embedding=True, loss=True),
    **_LLAMA3,
)
# Mixtral (nemo/collections/llm/gpt/model/mixtral.py): 8 experts, top-2, every layer MoE, SwiGLU, RMSNorm, GQA 8,
# untied; 8x7B with a 32000-token vocabulary, 8x22B with 32768
_MIXTRAL: dict[str, Any] = dict(kv_heads=8, experts=8, top_k=2, gated=True, norm="rmsnorm", bias=False)
MIXTRAL_8X7B = ModelSpec(
    name="Mixtral-8x7B (NeMo)", layers=32, hidden=4096, heads=32, ffn=14336, expert_ffn=14336, vocab=32000, **_MIXTRAL
)
MIXTRAL_8X22B = ModelSpec(
    name="Mixtral-8x22B (NeMo)", layers=56, hidden=6144, heads=48, ffn=16384, expert_ffn=16384, vocab=32768, **_MIXTRAL
)

_FP8 = "megatron-bf16-fp8-delayed"
_SAID = (
    "NVIDIA's tuned NeMo recipe: TransformerEngine layers (attention timed as the newest kernel); FP8 hybrid "
    "with delayed scaling (the page says only 'FP8 precision'; delayed is NeMo's default recipe of the time; "
    "assumed), BF16 weights with FP32 main weights and gradients reduced in FP32 (Megatron's default; "
    "assumed); the distributed optimizer as ZeRO-1 with gradient reductions and parameter gathers overlapped "
    "(NeMo's performance defaults; assumed); sequence parallelism wherever TP > 1; TP communication overlap "
    "wherever TP > 1 and pipeline sends overlapped under the interleaved schedule (assumed); no activation "
    "recomputation (the page names none; assumed); the VP column as model chunks a GPU of the interleaved "
    "schedule (1F1B where VP is 1); the figure is the page's Tokens / sec / GPU"
)


def _overlap(tp: int, chunks: int, cp: int) -> tuple[str, ...]:
    return (
        ("grad-reduce", "prefetch")
        + (("tp",) if tp > 1 else ())
        + (("p2p",) if chunks > 1 else ())
        + (("cp",) if cp > 1 else ())
    )


def _run(
    key: str,
    source: str,
    where: str,
    gpu: str,
    model: ModelSpec,
    gpus: int,
    gbs: int,
    mbs: int,
    seq: int,
    tp: int,
    pp: int,
    cp: int,
    vp: int,
    figure: float,
    said: str,
    ep: int = 1,
    etp: int = 1,
    extra: dict | None = None,
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
        ep=ep,
        etp=etp,
        sp=tp > 1,
        micro_batch=mbs,
        chunks=chunks,
        flash=True,
        precision=_FP8,
        **({"dispatcher": "alltoall"} if model.experts else {}),
    )
    overlap = _overlap(tp, chunks, cp)
    variants: dict = {
        "FP8 current (tensorwise) scaling": {"precision": "megatron-bf16-fp8-tensorwise"},
        "BF16 gradient reduction": {"precision": "megatron-bf16-reduce-bf16-fp8-delayed"},
        "selective recomputation": {"recompute": "selective"},
    }
    if "tp" in overlap:
        variants["no TP overlap"] = {"overlap": tuple(o for o in overlap if o != "tp")}
    variants.update(extra or {})
    schedule = None if pp == 1 else "interleaved" if chunks > 1 else "1f1b"
    return NinthRun(
        key,
        source,
        where,
        gpu,
        gpus,
        model,
        plan,
        seq,
        figure,
        "tokens/s per GPU",
        precision="fp8",
        sharding="zero-1",
        schedule=schedule,
        overlap=overlap,
        assumed=f"{said}: TP {tp}, PP {pp}, CP {cp}, VP {vp}, DP {dp}"
        + (f", EP {ep}, ETP {etp}" if ep > 1 else "")
        + f", micro-batch {mbs}, global batch {gbs} ({plan.microbatches} micro-batches a replica); "
        f"{_SAID}",
        variants=variants,
    )


# -- NeMo 24.07, DGX-H100 ---------------------------------------------------------------------------------------

# the 'Pretraining' table: (key, model column, model, GPUs, GBS, MBS, sequence, TP, PP, CP, VP, Tokens / sec / GPU,
# Model TFLOP / sec / GPU as printed)
_T2407 = (
    ("nemo2407-gpt3-5b-h100-64", "GPT3-5B", GPT3_5B, 64, 2048, 4, 2048, 1, 1, 1, 1, 23406.0, "765"),
    ("nemo2407-gpt3-20b-h100-64", "GPT3-20B", GPT3_20B, 64, 256, 2, 2048, 2, 1, 1, 1, 5851.0, "750"),
    ("nemo2407-gpt3-175b-h100-128", "GPT3-175B", GPT3_175B, 128, 256, 1, 2048, 4, 8, 1, 6, 716.0, "771"),
    (
        "nemo2407-gpt3-175b-h100-512",
        "GPT3-175B",
        GPT3_175B,
        512,
        2048,
        2,
        2048,
        4,
        8,
        1,
        6,
        825.0,
        "[888](https://mlcommons.org/benchmarks/training/)",
    ),
    ("nemo2407-llama2-7b-h100-8", "LLAMA2-7B", LLAMA2_7B, 8, 128, 1, 4096, 1, 1, 1, 1, 16934.0, "780"),
    ("nemo2407-llama2-13b-h100-16", "LLAMA2-13B", LLAMA2_13B, 16, 128, 1, 4096, 1, 4, 1, 10, 8715.0, "760"),
    ("nemo2407-llama2-70b-h100-64", "LLAMA2-70B", LLAMA2_70B, 64, 128, 1, 4096, 4, 4, 1, 20, 1728.0, "768"),
    ("nemo2407-nemotron-8b-h100-64", "Nemotron-8B", NEMOTRON_8B, 64, 256, 4, 4096, 2, 1, 1, 1, 12507.0, "643"),
    ("nemo2407-nemotron-22b-h100-64", "Nemotron-22B", NEMOTRON_22B, 64, 256, 2, 4096, 2, 4, 1, 10, 4312.0, "562"),
    ("nemo2407-nemotron-340b-h100-128", "Nemotron-340B", NEMOTRON_340B, 128, 32, 1, 4096, 8, 8, 1, 12, 326.0, "686"),
    ("nemo2407-llama3-8b-h100-8", "LLAMA3-8B", LLAMA3_8B, 8, 128, 1, 8192, 1, 1, 2, 1, 12273.0, "711"),
    ("nemo2407-llama3-70b-h100-64", "LLAMA3-70B", LLAMA3_70B, 64, 128, 1, 8192, 4, 4, 2, 5, 1524.0, "734"),
)
_SAID_2407 = (
    "DGX-H100 (H100 SXM 80GB, 8 a node), Container NeMo24.07, 'pre-training performance for various "
    "tasks at FP8 precision'"
)


def _nemo2407() -> list[PublishedRun]:
    out = []
    for key, name, model, gpus, gbs, mbs, seq, tp, pp, cp, vp, tokens, tflops in _T2407:
        where = (
            f"'Pretraining' table, row {name}, {gpus} GPUs: GBS {gbs}, MBS {mbs}, Sequence Length {seq}, TP {tp}, "
            f"PP {pp}, CP {cp}, VP {vp}, Tokens / sec / GPU {tokens:g} (Model TFLOP / sec / GPU {tflops})"
        )
        out.append(
            _run(
                key,
                "NeMo performance summary 24.07",
                where,
                "h100",
                model,
                gpus,
                gbs,
                mbs,
                seq,
                tp,
                pp,
                cp,
                vp,
                tokens,
                _SAID_2407 + "; the model as NeMo's config of that name (shapes above)",
            )
        )
    return out


# -- NeMo 25.02, DGX-B200 (and one DGX-H100 row) -----------------------------------------------------------------

# (key, model column, model, GPU, GPUs, GBS, MBS, sequence, TP, PP, CP, VP, EP, GA, Tokens / sec / GPU, Model
# TFLOP / sec / GPU as printed, note)
_T2502 = (
    (
        "nemo2502-gpt3-175b-b200-512",
        "GPT3-175B",
        GPT3_175B,
        "b200",
        512,
        2048,
        2,
        2048,
        4,
        4,
        1,
        6,
        1,
        32,
        1600.0,
        "1722",
        "; the Model TFLOP / sec / GPU cell reads 1722 in one stored rendering of the page and is empty in another",
    ),
    (
        "nemo2502-llama3-8b-b200-8",
        "LLAMA3-8B",
        LLAMA3_8B,
        "b200",
        8,
        128,
        2,
        8192,
        1,
        1,
        1,
        1,
        1,
        8,
        26006.0,
        "1506",
        "",
    ),
    (
        "nemo2502-llama3-70b-b200-64",
        "LLAMA3-70B",
        LLAMA3_70B,
        "b200",
        64,
        128,
        1,
        8192,
        2,
        4,
        2,
        5,
        1,
        32,
        3062.0,
        "1474",
        "",
    ),
    (
        "nemo2502-llama3-405b-b200-128",
        "LLAMA3-405B",
        LLAMA3_405B,
        "b200",
        128,
        64,
        1,
        8192,
        4,
        8,
        2,
        8,
        1,
        32,
        625.0,
        "1658",
        "; 126 layers on 8 stages x 8 chunks: the embedding and the loss each counted as a layer's place in the "
        "pipeline split (assumed)",
    ),
    (
        "nemo2502-nemotron-15b-b200-64",
        "Nemotron-15B",
        NEMOTRON_15B,
        "b200",
        64,
        256,
        2,
        4096,
        1,
        1,
        1,
        1,
        1,
        2,
        14760.0,
        "1387",
        "",
    ),
    (
        "nemo2502-nemotron-340b-b200-128",
        "Nemotron-340B",
        NEMOTRON_340B,
        "b200",
        128,
        32,
        1,
        4096,
        8,
        4,
        1,
        12,
        1,
        8,
        602.0,
        "1268",
        "",
    ),
    (
        "nemo2502-mixtral-8x7b-b200-64",
        "Mixtral-8x7B",
        MIXTRAL_8X7B,
        "b200",
        64,
        256,
        2,
        4096,
        1,
        1,
        1,
        1,
        8,
        2,
        15457.0,
        "1282",
        "; the all-to-all token dispatcher (NeMo 2.0's Mixtral recipe; assumed), dropless routing timed as balanced",
    ),
    (
        "nemo2502-mixtral-8x22b-b200-256",
        "Mixtral-8x22B",
        MIXTRAL_8X22B,
        "b200",
        256,
        64,
        1,
        65536,
        2,
        4,
        8,
        14,
        8,
        16,
        2232.0,
        "824",
        "; the row prints '256 | 1 | 64 | 65536' under '#-GPUs | GBS | MBS | Sequence Length': GBS 1 "
        "with MBS 64 cannot be, so GBS 64 and MBS 1 are taken (with DP 4 they give the printed GA 16); ETP as "
        "Megatron-Core's default, the TP size (2; assumed); the all-to-all token dispatcher (assumed), dropless routing "
        "timed as balanced",
    ),
    (
        "nemo2502-gpt3-175b-h100-512",
        "GPT3-175B",
        GPT3_175B,
        "h100",
        512,
        2048,
        2,
        2048,
        4,
        8,
        1,
        6,
        1,
        64,
        866.0,
        "932",
        "; the DGX-H100 table's first row, the only one the stored page shows whole",
    ),
)


def _nemo2502() -> list[PublishedRun]:
    out = []
    for key, name, model, gpu, gpus, gbs, mbs, seq, tp, pp, cp, vp, ep, ga, tokens, tflops, note in _T2502:
        system = "DGX-B200" if gpu == "b200" else "DGX-H100"
        where = (
            f"System {system} table, row {name}, {gpus} GPUs: GBS {gbs}, MBS {mbs}, Sequence Length {seq}, TP "
            f"{tp}, PP {pp}, CP {cp}, VP {vp}, EP {ep}, GA {ga}, Tokens / sec / GPU {tokens:g} (Model TFLOP / "
            f"sec / GPU {tflops})"
        )
        etp = tp if model.experts else 1
        extra = {"ETP 1": {"etp": 1}} if model.experts and etp > 1 else {}
        run = _run(
            key,
            "NeMo performance summary 25.02",
            where,
            gpu,
            model,
            gpus,
            gbs,
            mbs,
            seq,
            tp,
            pp,
            cp,
            vp,
            tokens,
            f"{system} (8 GPUs a node), Container NeMo 25.02, NeMo 2.0, 'pre-training performance of "
            f"various models at FP8 precision'{note}",
            ep=ep,
            etp=etp,
            extra=extra,
        )
        assert run.plan.microbatches == ga, (key, run.plan.microbatches, ga)
        out.append(run)
    return out


NINTH: tuple[PublishedRun, ...] = tuple(_nemo2407() + _nemo2502())


def ninth_runs() -> list[PublishedRun]:
    """Every run of the ninth held-out set (gathered blind; scored once, later)."""
    return list(NINTH)

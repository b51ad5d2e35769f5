"""Published training runs, each with its full configuration and source, against the clock's step time
(clock/plan.py). The published figures are copied from the sources named (docs/notes/step-time-sources.md
quotes every row); parasim's figure is computed here from the configuration alone, with one set of
constants per GPU type (estimate/hardware.py), stated before the comparison. Nothing is fitted per run.

A source's throughput counts FLOPs its own way, so each run names its rule (FLOP_RULES) and parasim's
step time is turned into the same unit by the same rule: the comparison is of times, in the source's unit.
Where a source leaves a setting out, the run says what parasim assumes (`assumed`), and the validation
shows what the other choices would give.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..layout import ModelSpec, Stages
from .costs import machine
from .plan import Run, step_time

# (short name, the document and its table, its address)
NARAYANAN = ("Narayanan 2021, Table 1",
             "Narayanan et al. 2021 (SC'21, arXiv 2104.04473), PTD-P on Selene, Table 1",
             "https://arxiv.org/abs/2104.04473")
KORTHIKANTI = ("Korthikanti 2022, Tables 3, 5",
               "Korthikanti et al. 2022 (MLSys'23, arXiv 2205.05198), sequence parallelism and selective "
               "recomputation, Tables 3 and 5", "https://arxiv.org/abs/2205.05198")
LLAMA3 = ("Llama 3 paper 2024, Table 4", "Llama Team 2024, The Llama 3 Herd of Models, Table 4",
          "https://arxiv.org/abs/2407.21783")
MEGATRON_H100 = ("Megatron-LM README (H100)",
                 "Megatron-LM README, Performance Benchmarking (H100 weak scaling, Megatron-Core r0.8.0)",
                 "https://github.com/NVIDIA/Megatron-LM#performance-benchmarking")


def _narayanan(model: ModelSpec, run: Run) -> float:
    """Eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh), FLOPs of a step with the recomputed forward, no causal halving."""
    h, l, s = model.hidden, model.layers, run.seq
    return 96 * run.global_batch * s * l * h * h * (1 + s / (6 * h) + model.vocab / (16 * l * h))


def _model_flops_72(model: ModelSpec, run: Run) -> float:
    """Korthikanti et al.'s eq. (7), Megatron-Core's count for a GPT: 72 B s L h^2 (1 + s/6h + V/12hL)."""
    h, l, s = model.hidden, model.layers, run.seq
    return 72 * run.global_batch * s * l * h * h * (1 + s / (6 * h) + model.vocab / (12 * l * h))


def _palm(model: ModelSpec, run: Run) -> float:
    """PaLM's model FLOPs (Chowdhery et al. 2022, appendix B), as Llama 3's MFU counts them: per token 6N
    (N without the embeddings) + 12 L h s."""
    n = model.total_params() - model.counted()["embeddings"]
    per_token = 6 * n + 12 * model.layers * model.hidden * run.seq
    return per_token * run.global_batch * run.seq


# unit -> how a step time becomes that unit on `gpus` GPUs
FLOP_RULES: dict[str, Callable[[ModelSpec, Run], float]] = {
    "narayanan": _narayanan, "megatron-72": _model_flops_72, "palm": _palm}


@dataclass(frozen=True)
class Published:
    key: str
    source: tuple[str, str, str]  # (short name, document and table, address)
    gpu: str  # the hardware table's key
    model: ModelSpec
    run: Run
    published: float
    unit: str  # "TFLOP/s per GPU" or "s per step"
    rule: str | None = None  # FLOP_RULES' key for a TFLOP/s figure
    assumed: str = ""  # what the source leaves out and parasim assumes
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # other choices for what is assumed
    scored: bool = True  # counted in the median and maximum

    @property
    def gpus(self) -> int:
        return self.run.world


def predicted(p: Published, run: Run | None = None) -> tuple[float, dict]:
    """parasim's figure for `p` in its unit (with `run` in place of its own, for a variant)."""
    run = run or p.run
    t = step_time(p.model, run, machine(p.gpu, run.gpus_per_node))
    if p.unit == "s per step":
        return t["step_s"], t
    return FLOP_RULES[p.rule](p.model, run) / (t["step_s"] * run.world) / 1e12, t


def error(p: Published, value: float) -> float:
    """The signed error of a throughput: parasim's over the published, less one. A time is turned into a
    throughput (its inverse) so that every row's error reads alike: +10% means parasim's step is faster."""
    return p.published / value - 1 if p.unit == "s per step" else value / p.published - 1


def rows() -> list[dict[str, Any]]:
    """Every published run with parasim's prediction and the error; variants of what was assumed."""
    out = []
    for p in PUBLISHED:
        value, t = predicted(p)
        row = {"name": p.key, "source": p.source[1], "cite": p.source[0], "address": p.source[2], "gpu": p.gpu,
               "gpus": p.gpus,
               "published": p.published, "predicted": value, "unit": p.unit, "error": error(p, value),
               "scored": p.scored, "assumed": p.assumed,
               "step_s": t["step_s"], "bubble_share": t["bubble_s"] / t["step_s"],
               "variants": {}}
        for name, change in p.variants.items():
            v, _ = predicted(p, replace(p.run, **change))
            row["variants"][name] = {"predicted": v, "error": error(p, v)}
        out.append(row)
    return out


def score(table: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["error"]) for r in table if r["scored"]]
    return {"rows": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
            "beyond_25": [r["name"] for r in table if r["scored"] and abs(r["error"]) > 0.25]}


def _gpt(layers: int, hidden: int, heads: int, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=vocab)


def _chunks(layers: int, pp: int) -> int:
    """Narayanan Table 1 gives no chunk count: parasim takes Korthikanti et al.'s three (same code, their
    175B and 530B) where a stage's layers divide by three, else two; one without a pipeline."""
    if pp == 1:
        return 1
    return 3 if (layers // pp) % 3 == 0 else 2


# Narayanan Table 1: (billions, heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU)
_TABLE1 = ((1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
           (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
           (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
           (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
           (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))
_MEGATRON_2021 = dict(seq=2048, recompute="full", flash=False, dropout=True, micro_batch=1)

# Korthikanti Tables 3 and 5: (name, heads, hidden, layers, TP, PP, GPUs, batch, micro-batch, chunks,
# seconds with full recomputation, seconds with SP and selective recomputation)
_TABLE5 = (("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
           ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
           ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
           ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 2, 94.42, 71.49))

# Llama 3 section 3.3.2 ("balanced pipeline schedule"): one Transformer layer fewer on the first and on the last
# stage, for the embedding and for the output and loss: Megatron's embedding and loss counted in the split,
# 7, fourteen stages of 8, and 7 over PP 16 (layout/stages.py)
_LLAMA3_405B = ModelSpec(name="Llama 3 405B", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, gated=True,
                         vocab=128256, norm="rmsnorm", bias=False, stages=Stages(embedding=True, loss=True))
# Llama 3 Table 4: (GPUs, TP, CP, PP, DP, sequence, sequences per DP replica, TFLOP/s per GPU)
_TABLE4 = ((8192, 8, 1, 16, 64, 8192, 32, 430), (16384, 8, 1, 16, 128, 8192, 16, 400),
           (16384, 8, 16, 16, 8, 131072, 16, 380))

# Megatron-LM README, H100: (name, heads, hidden, layers, TP, PP, DP, batch, TFLOP/s per GPU)
_README_H100 = (("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
                ("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
                ("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
                ("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
                ("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9))


def _published() -> list[Published]:
    out = []
    for b, heads, h, l, tp, pp, gpus, batch, tflops in _TABLE1:
        v = _chunks(l, pp)
        out.append(Published(
            f"megatron-2021-{b:g}b", NARAYANAN, "a100", _gpt(l, h, heads),
            Run(tp=tp, pp=pp, dp=gpus // (tp * pp), chunks=v, global_batch=batch, **_MEGATRON_2021),
            tflops, "TFLOP/s per GPU", "narayanan",
            assumed="micro-batch 1 (as Table 2's PTD-P rows)" + (f", {v} model chunks per GPU" if pp > 1 else ""),
            variants={"micro-batch 2": {"micro_batch": 2}} | ({"1 chunk": {"chunks": 1}} if pp > 1 else {})))
    for name, heads, h, l, tp, pp, gpus, batch, mb, v, full, present in _TABLE5:
        base = Run(tp=tp, pp=pp, dp=gpus // (tp * pp), chunks=v, global_batch=batch, micro_batch=mb, seq=2048,
                   flash=False, dropout=True)
        said = "" if name in ("175B", "530B") or pp == 1 else "2 model chunks per GPU (not stated for 1T)"
        out.append(Published(f"korthikanti-{name.lower()}-full", KORTHIKANTI, "a100", _gpt(l, h, heads),
                             replace(base, recompute="full"), full, "s per step", assumed=said))
        out.append(Published(f"korthikanti-{name.lower()}-sp+sel", KORTHIKANTI, "a100", _gpt(l, h, heads),
                             replace(base, recompute="selective", sp=True), present, "s per step", assumed=said))
    out.append(Published("korthikanti-530b-dp8", KORTHIKANTI, "a100", _gpt(105, 20480, 128),
                         Run(tp=8, pp=35, dp=8, chunks=3, global_batch=2240, micro_batch=1, seq=2048, flash=False,
                             dropout=True, recompute="selective", sp=True), 39.15, "s per step"))
    for gpus, tp, cp, pp, dp, s, per, tflops in _TABLE4:
        out.append(Published(
            f"llama3-405b-{gpus // 1024}k" + (f"-cp{cp}" if cp > 1 else ""), LLAMA3, "h100", _LLAMA3_405B,
            Run(tp=tp, cp=cp, pp=pp, dp=dp, sp=True, seq=s, global_batch=per * dp, micro_batch=1, chunks=2,
                flash=True, distributed_optimizer=True, overlap=("grad-reduce", "prefetch", "p2p")),
            tflops, "TFLOP/s per GPU", "palm",
            assumed="micro-batch 1, 2 model chunks per GPU (the paper's V is not given); FSDP without resharding "
                    "as a sharded optimizer, its reductions overlapped" + (
                        "; row 3's DP is 8 (the table prints 4, which its GPU and token counts contradict)"
                        if cp > 1 else ""),
            variants={"1 chunk": {"chunks": 1}, "4 chunks": {"chunks": 4}}))
    for name, heads, h, l, tp, pp, dp, batch, tflops in _README_H100:
        out.append(Published(
            f"megatron-h100-{name.lower()}", MEGATRON_H100, "h100", _gpt(l, h, heads, 131072),
            Run(tp=tp, pp=pp, dp=dp, sp=tp > 1, seq=4096, global_batch=batch, micro_batch=1, flash=True,
                distributed_optimizer=True, overlap=("grad-reduce", "prefetch", "tp", "p2p")),
            tflops, "TFLOP/s per GPU", "megatron-72", scored=False,
            assumed="not scored: the README gives neither micro-batch, model chunks nor recomputation (parasim "
                    "takes 1, 1, none) and credits TP overlap in full",
            variants={"TP overlap off": {"overlap": ("grad-reduce", "prefetch", "p2p")}}))
    return out


PUBLISHED: list[Published] = _published()

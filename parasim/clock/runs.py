"""Published training runs for holding the clock's step time (clock/plan.py) against the world, as data: one
entry per run, with its source, its GPU, the model's shapes, the layout, the step and the published figure in
the source's own unit. docs/notes/step-time-runs.md quotes every figure and says where it was read.

The runs are split by source into a calibration set and a held-out set (SOURCES, each source's `set`),
decided once, before the time model is changed, and never by looking at parasim's error on a run: the
sources the model was shaped on (and the few new ones moved in so that calibration covers every GPU type and
an MoE model) are calibration; every other source is held out, and its error is the one README quotes.

Nothing here is computed from the runs: the figures are as printed, `assumed` says, per run, what its source
leaves out and which value the entry takes, and `variants` what other values a reader may want to see. UNITS and
RULES say how a step time becomes a source's figure; clock/published.py puts the clock's step in each run's unit
and scores each set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Mapping
from typing import Any, Callable

from ..estimate.hardware import GPUS
from ..layout import SPREAD, ModelSpec, Stages
from ..estimate.memory import Plan
from ..layout.precision import precision as precision_of
from .plan import sequences
from .sets import NAMES

# every set's name, in clock/sets.py's order (what each later set is, and when it was scored: sets.RUN_SETS)
SETS = NAMES
CALIBRATION, HELD_OUT, FRESH, FOURTH, FIFTH, SIXTH, SEVENTH, EIGHTH, NINTH, TENTH, ELEVENTH = SETS


@dataclass(frozen=True)
class Source:
    """One published document, and the set every run it reports belongs to."""

    name: str  # short name
    document: str  # authors, title, where in it
    address: str
    date: str  # when it was published (YYYY-MM)
    set: str  # CALIBRATION or HELD_OUT
    why: str  # why that set


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "Narayanan 2021",
            "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
            "Using Megatron-LM (SC'21, arXiv 2104.04473)",
            "https://arxiv.org/abs/2104.04473",
            "2021-04",
            CALIBRATION,
            "the current model was shaped on its Table 1",
        ),
        Source(
            "Korthikanti 2022",
            "Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models "
            "(MLSys'23, arXiv 2205.05198)",
            "https://arxiv.org/abs/2205.05198",
            "2022-05",
            CALIBRATION,
            "the current model was shaped on its Tables 3 and 5",
        ),
        Source(
            "Llama 3 2024",
            "Llama Team, AI @ Meta, The Llama 3 Herd of Models (arXiv 2407.21783)",
            "https://arxiv.org/abs/2407.21783",
            "2024-07",
            CALIBRATION,
            "the current model was shaped on its Table 4",
        ),
        Source(
            "Megatron-LM README (H100)",
            "NVIDIA, Megatron-LM README, Performance Benchmarking: the H100 weak-"
            "scaling table (images/model_table.png, Megatron-Core r0.8.0)",
            "https://github.com/NVIDIA/Megatron-LM#performance-benchmarking",
            "2024-07",
            CALIBRATION,
            "the current model was looked at on it (published.py's unscored rows)",
        ),
        Source(
            "DeepSeek-V3 2024",
            "DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv 2412.19437)",
            "https://arxiv.org/abs/2412.19437",
            "2024-12",
            CALIBRATION,
            "moved: H800's source that states its GPU count, and an MoE model for calibration",
        ),
        Source(
            "torchtitan H200 (Trainy)",
            "Trainy on WhiteFiber, Llama 3.1 8B on H200, torchtitan "
            "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
            "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
            "2025-06",
            CALIBRATION,
            "moved: the only H200 source",
        ),
        Source(
            "MegaScale 2024",
            "Jiang et al., MegaScale: Scaling Large Language Model Training to More Than 10,000 "
            "GPUs (NSDI'24, arXiv 2402.15627)",
            "https://arxiv.org/abs/2402.15627",
            "2024-02",
            HELD_OUT,
            "new",
        ),
        Source(
            "torchtitan H100 2024",
            "PyTorch team, torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
            "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md",
            "2024-12",
            HELD_OUT,
            "new",
        ),
        Source(
            "Megatron-Bridge",
            "NVIDIA NeMo Megatron-Bridge, docs/performance-summary-archive.md (DGX-H100 rows "
            "of the 25.09 to 26.06 containers)",
            "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md",
            "2025-09",
            HELD_OUT,
            "new",
        ),
        Source(
            "llm-foundry MPT",
            "MosaicML llm-foundry, scripts/train/benchmarking/README.md (MPT training benchmarks)",
            "https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md",
            "2024-01",
            HELD_OUT,
            "new",
        ),
        Source(
            "BLOOM 2022",
            "BigScience, train/tr11-176B-ml/README.md (BLOOM-176B training log)",
            "https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml/README.md",
            "2022-07",
            HELD_OUT,
            "new",
        ),
        Source(
            "DeepSeek-V2 2024",
            "DeepSeek-AI, DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts "
            "Language Model (arXiv 2405.04434)",
            "https://arxiv.org/abs/2405.04434",
            "2024-05",
            HELD_OUT,
            "new (states no GPU count, so DeepSeek-V3 was moved for H800 instead)",
        ),
    )
}


# How a source counts the FLOPs of a step (B sequences of s tokens, L layers, hidden h, vocabulary V): its words
# and the count, so that parasim's step time is put in the source's unit by the source's own rule.
@dataclass(frozen=True)
class FlopRule:
    said: str
    flops: Callable[[ModelSpec, Plan, int], float]  # (the model, the plan, the sequence) -> FLOPs of one step


def _narayanan_flops(model: ModelSpec, plan: Plan, s: int) -> float:
    h, layers, vocab = model.size("hidden"), model.size("layers"), model.size("vocab")
    return 96 * sequences(plan) * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def _megatron_72_flops(model: ModelSpec, plan: Plan, s: int) -> float:
    h, layers, vocab = model.size("hidden"), model.size("layers"), model.size("vocab")
    return 72 * sequences(plan) * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * h * layers))


def _palm_flops(model: ModelSpec, plan: Plan, s: int) -> float:
    n = model.total_params() - model.counted()["embeddings"]
    return (6 * n + 12 * model.size("layers") * model.size("hidden") * s) * sequences(plan) * s


RULES: dict[str, FlopRule] = {
    "narayanan": FlopRule(
        "Narayanan et al. eq. (3): 96 B s L h^2 (1 + s/6h + V/16Lh): the recomputed forward "
        "counted, attention's s^2 terms in full",
        _narayanan_flops,
    ),
    "megatron-72": FlopRule(
        "Korthikanti et al. eq. (7), Megatron-Core r0.8's count: 72 B s L h^2 (1 + s/6h + "
        "V/12hL): model FLOPs, no recomputation, attention in full",
        _megatron_72_flops,
    ),
    "palm": FlopRule(
        "PaLM's model FLOPs (Chowdhery et al. 2022, appendix B), as Llama 3's MFU cites them: per "
        "token 6N (N without the embeddings) + 12 L h s",
        _palm_flops,
    ),
}


@dataclass(frozen=True)
class Unit:
    """A unit a source prints its figure in: what it is, and how a step of `step_s` seconds becomes it."""

    said: str
    short: str  # for a narrow column
    decimals: int  # as a table prints it
    rate: bool  # True: a throughput (more is faster); False: a time (less is faster)
    of_step: Callable[[PublishedRun, Plan, float], float]  # (the run, its plan, seconds a step) -> the figure

    def error(self, published: float, value: float) -> float:
        """parasim's `value` against the `published` figure, read alike for every unit: the throughput
        parasim's step gives over the published one, less one (+10%: parasim's step is 10% faster)."""
        return value / published - 1 if self.rate else published / value - 1


def _tflops(r: PublishedRun, plan: Plan, step_s: float) -> float:
    assert r.rule is not None  # every entry in a FLOP unit names its counting rule
    return RULES[r.rule].flops(r.model, plan, r.seq) / (step_s * plan.world) / 1e12


def _mfu(r: PublishedRun, plan: Plan, step_s: float) -> float:
    return 100 * _tflops(r, plan, step_s) * 1e12 / GPUS[r.gpu].peak_flops.value


# The unit a published figure is in. A FLOP rate names the source's counting rule (RULES).
UNITS: dict[str, Unit] = {
    "TFLOP/s per GPU": Unit(
        "the source's FLOPs of a step (by its rule) over the step's time and the GPUs", "TFLOP/s/GPU", 1, True, _tflops
    ),
    "MFU %": Unit(
        "the same FLOPs over the step's time, the GPUs and the GPU's dense 16-bit peak, in percent",
        "MFU %",
        1,
        True,
        _mfu,
    ),
    "tokens/s per GPU": Unit(
        "tokens of the global batch a second, over the GPUs",
        "tok/s/GPU",
        0,
        True,
        lambda r, plan, t: sequences(plan) * r.seq / t / plan.world,
    ),
    "s per step": Unit("seconds one optimizer step (the global batch) takes", "s/step", 2, False, lambda r, plan, t: t),
    "GPU-hours per trillion tokens": Unit(
        "GPU-hours a whole training campaign spent per 1e12 tokens (stalls, restarts and the batch ramp included)",
        "GPU-h/1e12 tok",
        0,
        False,
        lambda r, plan, t: plan.world * t / 3600 / (sequences(plan) * r.seq / 1e12),
    ),
}
FLOP_UNITS = ("TFLOP/s per GPU", "MFU %")

# The source's word for the precision the step's products run in.
PRECISION_SAID: dict[str, str] = {
    "16-bit": "16-bit mixed precision (A100: FP16 or BF16, the source does not say which)",
    "bf16": "BF16 mixed precision",
    "fp8": "FP8 products (the entry's `assumed` names the scaling: current/tensorwise or blockwise)",
    "unstated": "the source gives no precision",
}

# How data parallelism holds the model state -> (ZeRO stage, what it is, the plan's ZeRO stage the clock times
# it by: 0 all-reduces the gradients; 1 and 2 reduce-scatter them and all-gather the parameters once a step; 3
# gathers layer by layer)
SHARDING: dict[str, tuple[int, str, int]] = {
    "none": (0, "plain data parallelism: every replica holds everything, gradients all-reduced", 0),
    "zero-1": (1, "optimizer state sharded (Megatron's distributed optimizer, DeepSpeed ZeRO-1)", 1),
    "zero-2": (
        2,
        "gradients and optimizer state sharded (DeepSpeed ZeRO-2, PyTorch FSDP SHARD_GRAD_OP): "
        "timed as the distributed optimizer (reduce-scatter, all-gather)",
        2,
    ),
    "fsdp-no-reshard": (
        3,
        "FSDP that keeps the parameters gathered from forward to backward (Llama 3): timed as "
        "the distributed optimizer",
        1,
    ),
    "zero-3": (3, "parameters, gradients and optimizer state sharded (ZeRO-3, FSDP FULL_SHARD, FSDP2)", 3),
}


def training_plan(global_batch: int, sharding: str = "none", **choices: Any) -> Plan:
    """The plan a published run trains with: its degrees and training choices (estimate/memory.Plan's fields),
    its micro-batches from the global batch its source gives (over DP and the micro-batch), its ZeRO stage as
    SHARDING times its `sharding`, and, where the entry says nothing, Megatron-LM's BF16 and no dropout."""
    choices = {"precision": "megatron-bf16", "dropout": False, "dp": 1, "micro_batch": 1, **choices}
    per_replica = choices["dp"] * choices["micro_batch"]
    assert global_batch % per_replica == 0, (global_batch, per_replica)
    return Plan(**choices, zero=SHARDING[sharding][2], microbatches=global_batch // per_replica)


MACHINE_SAID = {"hbm", "network"}  # the Machine figures a run's source may give for its own cluster


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: what ran, on what, and the figure its source printed."""

    key: str
    source: str  # SOURCES' key
    where: str  # the table, figure or line in the source
    gpu: str  # estimate/hardware.py's GPUS key
    gpus: int  # GPUs as the source gives them (or `assumed` says)
    model: ModelSpec
    plan: Plan  # tp, pp, dp, cp, ep, etp, sp, chunks, micro-batch and micro-batches, ZeRO, recomputation, flash
    seq: int  # tokens a sequence
    published: float
    unit: str  # UNITS' key
    rule: str | None = None  # RULES' key, for a FLOP rate
    precision: str = "bf16"  # PRECISION_SAID's key
    sharding: str = "none"  # SHARDING's key
    schedule: str | None = None  # pipeline/schedules.py's name; None without a pipeline
    assumed: str = ""  # what the source leaves out, and the value taken
    overlap: tuple[str, ...] = ()  # clock/overlaps.py's switches the run trains with
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # other choices for what is assumed: the
    # plan's fields, or "overlap"
    # the cluster's own figures where its source prints them and they differ from the GPU's sheet: clock/costs.
    # Machine's "hbm" or "network" (bytes/s a GPU, one direction), as a fact of the run, never a fitted constant
    machine: dict[str, float] = field(default_factory=dict)
    # the sources registry the run's `source` is a key of: a later set's module makes its runs with its own
    # (`partial(PublishedRun, registry=SOURCES)`), so no set needs a subclass to say where its sources are
    registry: Mapping[str, Source] = field(default_factory=lambda: SOURCES, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the plan is timed by the sharding the entry names (a programming slip, not a user's input)
        assert self.plan.zero == SHARDING[self.sharding][2], (self.key, self.plan.zero, self.sharding)
        # a run its source says trained in FP8 is timed with FP8 products, and only such a run
        assert (self.precision == "fp8") == precision_of(self.plan.precision).fp8, (self.key, self.plan.precision)
        assert set(self.machine) <= MACHINE_SAID, (self.key, self.machine)

    @property
    def source_entry(self) -> Source:
        """The run's source in its set's registry (`registry`: this module's SOURCES, or a later set's own)."""
        return self.registry[self.source]

    @property
    def set(self) -> str:
        return self.source_entry.set

    @property
    def moe(self) -> bool:
        return bool(self.model.experts)

    @property
    def cite(self) -> tuple[str, str, str]:
        """(short name, document and table, address)."""
        s = self.source_entry
        return f"{s.name}, {self.where}", f"{s.document}, {self.where}", s.address


# -- models ---------------------------------------------------------------------------------------------------


def _gpt(layers: int, hidden: int, heads: int, vocab: int = 51200, **kw) -> ModelSpec:
    """A GPT-2/3-style block: MHA, an MLP of 4h, LayerNorm, biases."""
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=vocab, **kw)


_LLAMA: dict[str, Any] = dict(gated=True, norm="rmsnorm", bias=False, vocab=128256)
LLAMA3_8B = ModelSpec(name="Llama 3.1 8B", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, **_LLAMA)
LLAMA3_70B = ModelSpec(name="Llama 3.1 70B", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, **_LLAMA)
LLAMA3_405B = ModelSpec(name="Llama 3 405B", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, **_LLAMA)
_EMBEDDING_AND_LOSS = Stages(embedding=True, loss=True)
_MLA: dict[str, Any] = dict(
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
)
# group-limited routing as their configs give it: V3's 8 groups of which a token keeps 4 (n_group, topk_group),
# V2's 8 and 3
DEEPSEEK_V3 = ModelSpec(
    name="DeepSeek-V3",
    layers=61,
    hidden=7168,
    heads=128,
    vocab=129280,
    ffn=18432,
    experts=256,
    top_k=8,
    expert_ffn=2048,
    shared_experts=1,
    dense_layers=3,
    gated=True,
    norm="rmsnorm",
    bias=False,
    stages=SPREAD,
    expert_groups=8,
    groups_kept=4,
    **_MLA,
)
DEEPSEEK_V2 = ModelSpec(
    name="DeepSeek-V2",
    layers=60,
    hidden=5120,
    heads=128,
    vocab=102400,
    ffn=12288,
    experts=160,
    top_k=6,
    expert_ffn=1536,
    shared_experts=2,
    dense_layers=1,
    gated=True,
    norm="rmsnorm",
    bias=False,
    stages=SPREAD,
    expert_groups=8,
    groups_kept=3,
    **_MLA,
)
_QWEN3: dict[str, Any] = dict(gated=True, norm="rmsnorm", bias=False, vocab=151936, head_size=128, experts=128, top_k=8)
QWEN3_30B_A3B = ModelSpec(
    name="Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, ffn=6144, expert_ffn=768, **_QWEN3
)
QWEN3_235B_A22B = ModelSpec(
    name="Qwen3-235B-A22B",
    layers=94,
    hidden=4096,
    heads=64,
    kv_heads=4,
    ffn=12288,
    expert_ffn=1536,
    stages=_EMBEDDING_AND_LOSS,
    **_QWEN3,
)
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b",
    layers=36,
    hidden=2880,
    heads=64,
    kv_heads=8,
    head_size=64,
    ffn=2880,
    experts=128,
    top_k=4,
    expert_ffn=2880,
    vocab=201088,
    gated=True,
    norm="rmsnorm",
)
_MPT: dict[str, Any] = dict(vocab=50368, tied_embeddings=True, bias=False)
MPT = {
    "70b": ModelSpec(name="MPT-70B", layers=80, hidden=8192, heads=64, **_MPT),
    "30b": ModelSpec(name="MPT-30B", layers=48, hidden=7168, heads=56, **_MPT),
    "13b": ModelSpec(name="MPT-13B", layers=40, hidden=5120, heads=40, **_MPT),
    "7b": ModelSpec(name="MPT-7B", layers=32, hidden=4096, heads=32, **_MPT),
    "3b": ModelSpec(name="MPT-3B", layers=32, hidden=2560, heads=20, **_MPT),
}
BLOOM_176B = _gpt(70, 14336, 112, 250880, name="BLOOM-176B", tied_embeddings=True, stages=_EMBEDDING_AND_LOSS)


def _chunks(layers: int, pp: int) -> int:
    """Narayanan gives no chunk count: three (Korthikanti et al.'s, same code, their 175B and 530B) where a
    stage's layers divide by three, else two; one without a pipeline."""
    if pp == 1:
        return 1
    return 3 if (layers // pp) % 3 == 0 else 2


def _pipe(pp: int, chunks: int) -> str | None:
    return None if pp == 1 else "interleaved" if chunks > 1 else "1f1b"


# -- calibration: the sources the current model was shaped on --------------------------------------------------

# Narayanan Table 1: (billions, heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU)
_TABLE1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
# Narayanan Table 2: (scheme, billions, GPUs, batch, micro-batch, TFLOP/s per GPU); 174.6B is GPT-3 (96 layers,
# 96 heads, hidden 12288, section 5.3.2), 529.6B Table 1's
_TABLE2 = (
    ("zero3", 174.6, 384, 1536, 4, 144),
    ("zero3", 174.6, 768, 1536, 2, 88),
    ("zero3", 174.6, 1536, 1536, 1, 44),
    ("zero3", 529.6, 640, 2560, 4, 138),
    ("zero3", 529.6, 1120, 2240, 2, 98),
    ("zero3", 529.6, 2240, 2240, 1, 48),
    ("ptdp", 174.6, 384, 1536, 1, 153),
    ("ptdp", 174.6, 768, 1536, 1, 149),
    ("ptdp", 174.6, 1536, 1536, 1, 141),
    ("ptdp", 529.6, 560, 2240, 1, 171),
    ("ptdp", 529.6, 1120, 2240, 1, 167),
    ("ptdp", 529.6, 2240, 2240, 1, 159),
)
_TABLE2_MODELS = {174.6: (_gpt(96, 12288, 96), 8, 12), 529.6: (_gpt(105, 20480, 128), 8, 35)}  # (model, TP, PP)
_MEGATRON_2021: dict[str, Any] = dict(recompute="full", flash=False, dropout=True)  # at a sequence of 2048


def _narayanan() -> list[PublishedRun]:
    out = []
    for b, heads, h, layers, tp, pp, gpus, batch, tflops in _TABLE1:
        v = _chunks(layers, pp)
        out.append(
            PublishedRun(
                f"megatron-2021-{b:g}b",
                "Narayanan 2021",
                "Table 1",
                "a100",
                gpus,
                _gpt(layers, h, heads),
                training_plan(batch, tp=tp, pp=pp, dp=gpus // (tp * pp), chunks=v, micro_batch=1, **_MEGATRON_2021),
                2048,
                tflops,
                "TFLOP/s per GPU",
                "narayanan",
                precision="16-bit",
                schedule=_pipe(pp, v),
                assumed="micro-batch 1 (as Table 2's PTD-P rows)" + (f", {v} model chunks per GPU" if pp > 1 else ""),
                variants={"micro-batch 2": {"micro_batch": 2}} | ({"1 chunk": {"chunks": 1}} if pp > 1 else {}),
            )
        )
    for scheme, b, gpus, batch, mb, tflops in _TABLE2:
        model, tp, pp = _TABLE2_MODELS[b]
        if scheme == "zero3":
            plan = training_plan(batch, "zero-3", dp=gpus, micro_batch=mb, **_MEGATRON_2021)
            said = (
                "full recomputation (eq. 3's count assumes it; the ZeRO-3 rows do not say); no overlap of "
                "ZeRO-3's collectives named (the paper names none)"
            )
            extra: dict[str, Any] = dict(sharding="zero-3")
        else:
            v = _chunks(model.size("layers"), pp)
            plan = training_plan(batch, tp=tp, pp=pp, dp=gpus // (tp * pp), chunks=v, micro_batch=mb, **_MEGATRON_2021)
            said = (
                f"TP {tp} x PP {pp} for the table's model-parallel size {tp * pp} (Table 1's split for the same "
                f"size), {v} model chunks per GPU"
            )
            extra = dict(schedule="interleaved")
        out.append(
            PublishedRun(
                f"megatron-2021-t2-{scheme}-{b:g}b-{gpus}",
                "Narayanan 2021",
                "Table 2",
                "a100",
                gpus,
                model,
                plan,
                2048,
                tflops,
                "TFLOP/s per GPU",
                "narayanan",
                precision="16-bit",
                assumed=said,
                **extra,
            )
        )
    return out


# Korthikanti Tables 3 and 5: (name, heads, hidden, layers, TP, PP, GPUs, batch, micro-batch, chunks,
# seconds with full recomputation, seconds with SP and selective recomputation)
_TABLE5 = (
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 2, 94.42, 71.49),
)


def _korthikanti() -> list[PublishedRun]:
    out = []
    for name, heads, h, layers, tp, pp, gpus, batch, mb, v, full, present in _TABLE5:
        base = training_plan(
            batch, tp=tp, pp=pp, dp=gpus // (tp * pp), chunks=v, micro_batch=mb, flash=False, dropout=True
        )
        said = "" if name in ("175B", "530B") or pp == 1 else "2 model chunks per GPU (not stated for 1T)"
        for how, plan, t in (
            ("full", replace(base, recompute="full"), full),
            ("sp+sel", replace(base, recompute="selective", sp=True), present),
        ):
            out.append(
                PublishedRun(
                    f"korthikanti-{name.lower()}-{how}",
                    "Korthikanti 2022",
                    "Tables 3, 5",
                    "a100",
                    gpus,
                    _gpt(layers, h, heads),
                    plan,
                    2048,
                    t,
                    "s per step",
                    precision="16-bit",
                    schedule=_pipe(pp, v),
                    assumed=said,
                )
            )
    out.append(
        PublishedRun(
            "korthikanti-530b-dp8",
            "Korthikanti 2022",
            "section 6.3",
            "a100",
            2240,
            _gpt(105, 20480, 128),
            training_plan(
                2240,
                tp=8,
                pp=35,
                dp=8,
                chunks=3,
                micro_batch=1,
                flash=False,
                dropout=True,
                recompute="selective",
                sp=True,
            ),
            2048,
            39.15,
            "s per step",
            precision="16-bit",
            schedule="interleaved",
        )
    )
    return out


# Llama 3 Table 4: (GPUs, TP, CP, PP, DP, sequence, sequences per DP replica, TFLOP/s per GPU)
_TABLE4 = (
    (8192, 8, 1, 16, 64, 8192, 32, 430),
    (16384, 8, 1, 16, 128, 8192, 16, 400),
    (16384, 8, 16, 16, 8, 131072, 16, 380),
)


def _llama3() -> list[PublishedRun]:
    # section 3.3.2: one layer fewer on the first and the last stage, for the embedding and the output and loss
    model = replace(LLAMA3_405B, stages=_EMBEDDING_AND_LOSS)
    return [
        PublishedRun(
            f"llama3-405b-{gpus // 1024}k" + (f"-cp{cp}" if cp > 1 else ""),
            "Llama 3 2024",
            "Table 4",
            "h100",
            gpus,
            model,
            training_plan(
                per * dp, "fsdp-no-reshard", tp=tp, cp=cp, pp=pp, dp=dp, sp=True, micro_batch=1, chunks=2, flash=True
            ),
            s,
            tflops,
            "TFLOP/s per GPU",
            "palm",
            sharding="fsdp-no-reshard",
            schedule="interleaved",
            overlap=("grad-reduce", "prefetch", "p2p"),
            assumed="micro-batch 1, 2 model chunks per GPU (the paper's V is not given); FSDP without resharding as a "
            "sharded optimizer, its reductions overlapped"
            + (
                "; DP 8 (arXiv v1 prints 4, which its GPU and token counts contradict; later copies print 8)"
                if cp > 1
                else ""
            ),
            variants={"1 chunk": {"chunks": 1}, "4 chunks": {"chunks": 4}},
        )
        for gpus, tp, cp, pp, dp, s, per, tflops in _TABLE4
    ]


# Megatron-LM README, H100: (name, heads, hidden, layers, TP, PP, DP, batch, TFLOP/s per GPU)
_README_H100 = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9),
)


def _readme_h100() -> list[PublishedRun]:
    return [
        PublishedRun(
            f"megatron-h100-{name.lower()}",
            "Megatron-LM README (H100)",
            "images/model_table.png",
            "h100",
            tp * pp * dp,
            _gpt(layers, h, heads, 131072),
            training_plan(batch, "zero-1", tp=tp, pp=pp, dp=dp, sp=tp > 1, micro_batch=1, flash=True),
            4096,
            tflops,
            "TFLOP/s per GPU",
            "megatron-72",
            precision="unstated",
            sharding="zero-1",
            schedule=_pipe(pp, 1),
            overlap=("grad-reduce", "prefetch", "tp", "p2p"),
            assumed="micro-batch 1, no model chunks, no recomputation, BF16, an MLP of 4h (the README gives none of "
            "them); the distributed optimizer that its --overlap-param-gather needs; TP overlap as stated",
            variants={"TP overlap off": {"overlap": ("grad-reduce", "prefetch", "p2p")}},
        )
        for name, heads, h, layers, tp, pp, dp, batch, tflops in _README_H100
    ]


def _deepseek_v3() -> list[PublishedRun]:
    return [
        PublishedRun(
            "deepseek-v3-pretrain",
            "DeepSeek-V3 2024",
            "sections 3.1, 3.2, 4.2 and Table 1 (pre-training)",
            "h800",
            2048,
            DEEPSEEK_V3,
            training_plan(
                15360,
                "zero-1",
                pp=16,
                dp=128,
                ep=64,
                micro_batch=1,
                chunks=2,
                recompute="selective",
                flash=True,
                precision="deepseek-v3",
            ),
            4096,
            180000.0,
            "GPU-hours per trillion tokens",
            precision="fp8",
            sharding="zero-1",
            schedule="dualpipev",
            overlap=("dualpipe",),
            assumed="DualPipe overlaps the EP all-to-alls and the pipeline's sends with the paired chunk's compute (section 3.2.1: the plan's dualpipe overlap); a campaign average (the 3072-to-15360 batch ramp, stalls and restarts included): the row takes the "
            "final batch of 15360; micro-batch 1 (not given); DualPipe as the registry's DualPipeV, 2 chunks a "
            "GPU; the 61 layers spread over 16 stages (thirteen of 4, three of 3; the split is not given); "
            "the multi-token-prediction module left out; selective recomputation for its RMSNorm and MLA "
            "up-projections; FP8 blockwise GEMMs; the EP all-to-alls timed as NCCL's, each top-k copy sent, "
            "as the row was first scored (its own kernels send a token once to each node and GPU: the "
            "DeepEP variant)",
            variants={"DeepEP dispatch": {"dispatcher": "deepep"}},
        )
    ]


def _trainy_h200() -> list[PublishedRun]:
    return [
        PublishedRun(
            f"titan-h200-8b-fsdp{gpus}",
            "torchtitan H200 (Trainy)",
            "Results table",
            "h200",
            gpus,
            LLAMA3_8B,
            training_plan(
                2 * gpus,
                "zero-3",
                dp=gpus,
                micro_batch=2,
                recompute="selective",
                flash=True,
                precision="fsdp2-fp8-gather",
            ),
            8192,
            tps,
            "tokens/s per GPU",
            precision="fp8",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            assumed="sequence 8192 and per-op selective checkpointing from llama3_8b.toml at torchtitan e7c0cae (the "
            "page runs that file); FP8 tensorwise linears with FP8 all-gathers, torch.compile",
        )
        for gpus, tps in ((32, 10938.0), (64, 10753.0))
    ]


# -- held out ------------------------------------------------------------------------------------------------

# MegaScale Table 2, the Megatron-LM rows: (GPUs, batch, seconds per iteration); Figure 9, Megatron-LM's 530B
# bars (batch = GPUs): (GPUs, MFU %)
_MEGASCALE_T2 = (
    (256, 768, 40.0),
    (512, 768, 21.2),
    (768, 768, 15.2),
    (1024, 768, 11.9),
    (3072, 6144, 29.02),
    (6144, 6144, 14.78),
    (8192, 6144, 12.24),
    (12288, 6144, 8.57),
)
_MEGASCALE_F9 = ((2240, 49.20), (4480, 48.80), (11200, 48.20))
_MEGASCALE_SAID = (
    "A100 80GB (the paper says Ampere); BF16; micro-batch 1; sequence parallelism with selective "
    "recomputation, the distributed optimizer, no FlashAttention, an MLP of 4h (Megatron-LM commit "
    "285068c8's usual settings; the paper states none of them); no communication overlap (MegaScale "
    "counts its TP, PP and DP overlap as its own additions, Table 3)"
)


def _megascale() -> list[PublishedRun]:
    common = dict(micro_batch=1, sp=True, recompute="selective", flash=False)  # at a sequence of 2048
    out = [
        PublishedRun(
            f"megascale-megatron-175b-{gpus}",
            "MegaScale 2024",
            "Table 2 (Megatron-LM rows)",
            "a100",
            gpus,
            _gpt(96, 12288, 128, 64000),
            training_plan(batch, "zero-1", tp=8, pp=8, dp=gpus // 64, chunks=6, **common),
            2048,
            seconds,
            "s per step",
            precision="unstated",
            sharding="zero-1",
            schedule="interleaved",
            assumed=_MEGASCALE_SAID,
        )
        for gpus, batch, seconds in _MEGASCALE_T2
    ]
    out += [
        PublishedRun(
            f"megascale-megatron-530b-{gpus}",
            "MegaScale 2024",
            "Figure 9 (Megatron-LM bars)",
            "a100",
            gpus,
            _gpt(105, 20480, 160, 64000),
            training_plan(gpus, "zero-1", tp=8, pp=35, dp=gpus // 280, chunks=3, **common),
            2048,
            mfu,
            "MFU %",
            "megatron-72",
            precision="unstated",
            sharding="zero-1",
            schedule="interleaved",
            assumed=_MEGASCALE_SAID + "; which bars are Megatron-LM's is read from the text (MegaScale's "
            "are higher by up to 6.1 points); MFU's peak is the A100's 312 TFLOP/s and its count "
            "eq. (7)'s, both checked on Table 2",
        )
        for gpus, mfu in _MEGASCALE_F9
    ]
    return out


_TITAN = (
    "Grand Teton H100s at 500 W with 96GB HBM2e at 2.4 TB/s (the h100 sheet is the 700 W, 80GB HBM3 card): "
    "timed at the page's 2.4 TB/s; the 500 W cap is not modelled (no BF16 product measured at 500 W)"
)
# the page's card: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (its 400 Gb/s a GPU is the sheet's)
TITAN_CARD = {"hbm": 2.4e12}
ASYNC_TP = (
    "async TP timed at TransformerEngine userbuffers' measured share of TP's collectives hidden "
    "(estimate/kernels.tp_overlap_efficiency): torch's async TP has no measurement at training shapes"
)
_TITAN_SEQ = (
    "sequence 8192 from llama3_*.toml at torchtitan 9dec370 (the page gives none); attention through "
    "PyTorch's SDPA, whose flash backend is FlashAttention-2"
)
# FSDP2: ZeRO-3. Attention through PyTorch's scaled_dot_product_attention (torchtitan 9dec370,
# models/llama/model.py), whose flash backend is the FlashAttention-2 it vendors: timed at FA2's H100 share
_TITAN_FSDP: dict[str, Any] = dict(flash=True, precision="fsdp2", attention_kernel="fa2")
# Tables 2 and 4-6: torchao's Float8 linears (dynamic tensorwise scaling); the page does not name FP8 all-gathers,
# off in torchtitan's configs, so the weights are gathered in BF16
_TITAN_FP8 = {**_TITAN_FSDP, "precision": "fsdp2-fp8"}


def _titan_h100() -> list[PublishedRun]:
    src, fp8 = "torchtitan H100 2024", "FP8 tensorwise linears (torchao Float8), torch.compile"
    out = [
        PublishedRun(
            f"titan-8b-fsdp{gpus}",
            src,
            table,
            "h100",
            gpus,
            LLAMA3_8B,
            training_plan(
                2 * gpus, "zero-3", dp=gpus, micro_batch=2, recompute="selective", fusion="torch-eager", **_TITAN_FSDP
            ),  # no torch.compile: eager kernels
            8192,
            tps,
            "tokens/s per GPU",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            assumed=f"{_TITAN}; {_TITAN_SEQ}; per-op selective checkpointing; no torch.compile, so its "
            "norms, rotary embeddings, copies and loss run as eager PyTorch's kernels",
        )
        for gpus, table, tps in ((8, "Table 1, FSDP", 5762.0), (128, "Table 3, FSDP", 5605.0))
    ]
    out += [
        PublishedRun(
            f"titan-8b-fsdp{8 // cp}-cp{cp}",
            src,
            "Table 2",
            "h100",
            8,
            LLAMA3_8B,
            training_plan(8 // cp, "zero-3", dp=8 // cp, cp=cp, micro_batch=1, recompute="full", **_TITAN_FP8),
            32768 * cp,
            tps,
            "tokens/s per GPU",
            precision="fp8",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            assumed=f"{_TITAN}; {fp8}; attention through PyTorch's SDPA (FlashAttention-2)",
        )
        for cp, tps in ((1, 3890.0), (2, 2540.0), (4, 1071.0), (8, 548.0))
    ]
    out += [
        PublishedRun(
            f"titan-70b-fsdp32-tp8{tag}",
            src,
            f"Table 4, {row}",
            "h100",
            256,
            LLAMA3_70B,
            training_plan(512, "zero-3", tp=8, dp=32, sp=True, micro_batch=16, recompute="full", **_TITAN_FP8),
            8192,
            tps,
            "tokens/s per GPU",
            precision="fp8",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch") + extra,
            assumed=f"{_TITAN}; {_TITAN_SEQ}; {fp8}; the local batch of 16 in one micro-batch"
            + (f"; {ASYNC_TP}" if extra else ""),
        )
        for tag, row, extra, tps in (("", "2D", (), 829.0), ("-asynctp", "2D + AsyncTP", ("tp",), 876.0))
    ]
    # torchtitan 9dec370's generated split points: 126 layers on 8 stages (or 16 stages, two a GPU) as even as
    # can be with the first and last stage one fewer; micro-batches default to the pipeline degree
    split = replace(LLAMA3_405B, stages=Stages(counts=(15, 16, 16, 16, 16, 16, 16, 15)))
    pipe = (
        f"{_TITAN}; {_TITAN_SEQ}; {fp8} with async TP ({ASYNC_TP}); layers split by torchtitan 9dec370's "
        "generated split points (15, 16 x 6, 15) and 8 micro-batches (its defaults; the page gives neither)"
    )
    out += [
        PublishedRun(
            f"titan-405b-fsdp8-tp8-pp8-{sched}",
            src,
            f"Table 5, {row}",
            "h100",
            512,
            split,
            training_plan(
                256, "zero-3", tp=8, pp=8, dp=8, sp=True, chunks=v, micro_batch=4, recompute="full", **_TITAN_FP8
            ),
            8192,
            tps,
            "tokens/s per GPU",
            precision="fp8",
            sharding="zero-3",
            schedule=sched,
            overlap=("grad-reduce", "prefetch", "tp"),
            assumed=pipe,
        )
        for sched, row, v, tps in (("1f1b", "1F1B", 1, 100.0), ("interleaved", "Interleaved 1F1B", 2, 128.0))
    ]
    out += [
        PublishedRun(
            f"titan-405b-fsdp{8 // cp}-cp{cp}-tp8-pp8",
            src,
            "Table 6",
            "h100",
            512,
            split,
            training_plan(
                8 * (8 // cp),
                "zero-3",
                tp=8,
                pp=8,
                dp=8 // cp,
                cp=cp,
                sp=True,
                micro_batch=1,
                recompute="full",
                **_TITAN_FP8,
            ),
            32768 * cp,
            tps,
            "tokens/s per GPU",
            precision="fp8",
            sharding="zero-3",
            schedule="1f1b",
            overlap=("grad-reduce", "prefetch", "tp"),
            assumed=pipe,
        )
        for cp, tps in ((1, 76.0), (2, 47.0), (4, 31.0), (8, 16.0))
    ]
    return [replace(r, machine=TITAN_CARD) for r in out]  # every row ran on the page's card


_BRIDGE = (
    "one row per model and parallel layout, from the latest container that lists it; recomputation, "
    "sequence parallelism and overlaps from the DGX-H100 perf recipes at Megatron-Bridge 067f987 (they may "
    "differ from the release's)"
)


def _bridge() -> list[PublishedRun]:
    src, o = "Megatron-Bridge", ("grad-reduce", "prefetch", "p2p")

    def row(
        key: str,
        where: str,
        gpus: int,
        model: ModelSpec,
        batch: int,
        seq: int,
        tps: float,
        precision: str,
        said: str,
        sharding: str = "zero-1",
        overlap: tuple[str, ...] = o,
        **choices: Any,
    ) -> PublishedRun:
        fp8 = {"precision": "megatron-bf16-fp8-tensorwise"} if precision == "fp8" else {}
        plan = training_plan(batch, sharding, micro_batch=1, flash=True, **fp8, **choices)
        return PublishedRun(
            f"bridge-{key}",
            src,
            where,
            "h100",
            gpus,
            model,
            plan,
            seq,
            tps,
            "tokens/s per GPU",
            precision=precision,
            sharding=sharding,
            schedule=_pipe(plan.pp, plan.chunks),
            overlap=overlap,
            assumed=f"{_BRIDGE}; {said}",
        )

    fp8 = "FP8 with current (per-tensor) scaling"
    return [
        row(
            "llama3-8b-fsdp8",
            "25.11 container, DGX-H100, LLAMA3_8B",
            8,
            LLAMA3_8B,
            128,
            8192,
            14451.0,
            "fp8",
            f"{fp8}; no recomputation (the FSDP recipe of that release is not at this commit)",
            sharding="zero-3",
            overlap=("grad-reduce", "prefetch"),
            dp=8,
        ),
        row(
            "llama3-70b-tp4-pp8",
            "26.04.01 container, DGX-H100, LLAMA3_70B",
            64,
            LLAMA3_70B,
            256,
            8192,
            1664.0,
            "fp8",
            f"{fp8}; no recomputation; TP overlap (userbuffers); the layers split evenly (the recipe at this "
            "commit gives 10, 10, 10, 11, 10, 10, 10, 9 over the 8 GPUs instead)",
            overlap=o + ("tp",),
            tp=4,
            pp=8,
            dp=2,
            sp=True,
            chunks=5,
        ),
        row(
            "llama31-405b-tp8-pp8-cp2",
            "26.06 container, DGX-H100, LLAMA3.1_405B",
            1024,
            replace(LLAMA3_405B, stages=_EMBEDDING_AND_LOSS),
            1536,
            8192,
            326.0,
            "fp8",
            f"{fp8}; no recomputation; TP overlap; the embedding and the loss counted in the layer split "
            "(the 405B recipes' account_for_* settings)",
            overlap=o + ("tp",),
            tp=8,
            pp=8,
            cp=2,
            dp=8,
            sp=True,
            chunks=8,
        ),
        row(
            "gpt-oss-120b-pp4-ep8",
            "26.04.01 container, DGX-H100, GPT OSS 120B",
            64,
            GPT_OSS_120B,
            1280,
            4096,
            5824.0,
            "bf16",
            "selective recomputation of the norms and the MoE activation; the model's sliding-window layers (128 "
            "tokens, every other layer) and attention sinks are not in its shapes; routing force-balanced, dropless",
            pp=4,
            dp=16,
            ep=8,
            recompute="selective",
        ),
        row(
            "qwen3-30b-a3b-ep16",
            "26.06 container, DGX-H100, Qwen3_30B_a3B",
            16,
            QWEN3_30B_A3B,
            1024,
            4096,
            8826.0,
            "fp8",
            f"{fp8}; no recomputation; routing force-balanced, dropless",
            overlap=("grad-reduce", "prefetch"),
            dp=16,
            ep=16,
        ),
        row(
            "qwen3-30b-a3b-pp2-ep8",
            "26.02.01 container, DGX-H100, Qwen3_30B_a3B",
            16,
            QWEN3_30B_A3B,
            1024,
            4096,
            9058.0,
            "fp8",
            f"{fp8}; no recomputation; routing force-balanced, dropless",
            pp=2,
            dp=8,
            ep=8,
            chunks=12,
        ),
        row(
            "qwen3-235b-a22b-tp2-pp8-ep32",
            "26.04.01 container, DGX-H100, Qwen3_235B_a22B",
            256,
            QWEN3_235B_A22B,
            8192,
            4096,
            1712.0,
            "fp8",
            f"{fp8}; no recomputation; experts not split by TP (ETP 1); the 94 layers split with the embedding and "
            "the loss counted as layers (96 over 8 stages: 11, 12 x 6, 11; the page gives no split and 94 does not "
            "divide by 8); routing force-balanced, dropless",
            tp=2,
            pp=8,
            dp=16,
            ep=32,
            sp=True,
            chunks=4,
        ),
        row(
            "deepseek-v3-tp2-pp8-ep64",
            "25.09 container, DGX-H100, DeepSeekV3 (dropless)",
            1024,
            DEEPSEEK_V3,
            8192,
            4096,
            1297.0,
            "unstated",
            "BF16 (that table has no precision column); selective recomputation of the MLA up-projections and the "
            "MLP; ETP 1; the 61 layers spread over 8 stages (8 x 5, 7 x 3; not given), no multi-token prediction; "
            "routing force-balanced, dropless",
            tp=2,
            pp=8,
            dp=64,
            ep=64,
            sp=True,
            chunks=4,
            recompute="selective",
        ),
    ]


# llm-foundry's MPT tables: (model, GPUs, GPU, micro-batch, global batch, sharding, checkpointing, tokens/s/GPU)
_MPT_ROWS = (
    ("70b", 512, "h100", 8, 4096, "zero-3", True, 1007.0),
    ("30b", 512, "h100", 8, 4096, "zero-3", True, 2115.0),
    ("13b", 512, "h100", 16, 8192, "zero-3", True, 4952.0),
    ("7b", 512, "h100", 6, 3072, "zero-3", False, 9670.0),
    ("3b", 512, "h100", 8, 4096, "zero-2", False, 21664.0),
    ("70b", 64, "a100", 8, 2048, "zero-3", True, 410.0),
    ("13b", 8, "a100", 2, 48, "zero-3", False, 2262.0),
    ("7b", 8, "a100", 6, 96, "zero-3", False, 4641.0),
)
_MPT_WHERE = {
    "h100": "H100 80GB BF16 (Large Scale, >= 128 GPUs)",
    "a100": "A100 80GB with 1600 Gbps node-node interconnect (RoCE)",
}


def _mpt() -> list[PublishedRun]:
    out = []
    for name, gpus, gpu, mb, batch, sharding, ckpt, tps in _MPT_ROWS:
        pure = name == "70b" and gpu == "a100"  # the table's 'bf16 / PURE' row; the others 'amp_bf16 / DEFAULT'
        out.append(
            PublishedRun(
                f"mpt-{name}-{gpu}-{gpus}",
                "llm-foundry MPT",
                _MPT_WHERE[gpu],
                gpu,
                gpus,
                MPT[name],
                training_plan(
                    batch,
                    sharding,
                    dp=gpus,
                    micro_batch=mb,
                    recompute="full" if ckpt else "none",
                    flash=True,
                    precision="post" if pure else "fsdp2",
                    attention_kernel="fa2",
                ),
                2048,
                tps,
                "tokens/s per GPU",
                sharding=sharding,
                overlap=("grad-reduce", "prefetch"),
                assumed="shapes from scripts/train/yamls/pretrain/mpt-*.yaml (MLP 4h, vocabulary 50368, no biases, tied "
                "embeddings, FlashAttention: attn_impl flash, the flash-attn 2 package, timed as FlashAttention-2) "
                "at llm-foundry 8c8dd48, the benchmark's own are not in the table; "
                + (
                    "pure BF16 (FSDP mixed precision 'PURE'), timed as BF16 weights and gradients with FP32 "
                    "optimizer state"
                    if pure
                    else "FSDP mixed precision 'DEFAULT' timed as FSDP2's BF16 gathers and FP32 reductions"
                ),
            )
        )
    return out


def _bloom() -> list[PublishedRun]:
    return [
        PublishedRun(
            "bloom-176b",
            "BLOOM 2022",
            "'Important checkpoints': iteration 85376, the end of the first epoch",
            "a100",
            384,
            BLOOM_176B,
            training_plan(2048, "zero-1", tp=4, pp=12, dp=8, micro_batch=2, recompute="full", flash=False),
            2048,
            104.70,
            "s per step",
            sharding="zero-1",
            schedule="1f1b",
            assumed="DeepSpeed's pipeline schedule as 1F1B; the tied embedding on the first and last stage counted as a "
            "layer (the README's 'embed | 5 blocks' and '5 blocks | embed'); ALiBi and the embedding LayerNorm "
            "not in the shapes; no sequence parallelism or FlashAttention (neither existed in its Megatron-"
            "DeepSpeed)",
        )
    ]


def _deepseek_v2() -> list[PublishedRun]:
    return [
        PublishedRun(
            "deepseek-v2-pretrain",
            "DeepSeek-V2 2024",
            "sections 3.1.2, 3.1.3 and 3.2.3 (training costs)",
            "h800",
            2048,
            DEEPSEEK_V2,
            training_plan(9216, "zero-1", pp=16, dp=128, ep=8, micro_batch=1, recompute="selective", flash=True),
            4096,
            172800.0,
            "GPU-hours per trillion tokens",
            precision="unstated",
            sharding="zero-1",
            schedule="zb-h1",
            assumed="a campaign average (the 2304-to-9216 batch ramp, stalls and restarts included): the row takes the "
            "final batch of 9216; 2048 GPUs, DeepSeek-V3's cluster (the paper gives no count); micro-batch 1; "
            "BF16 (not stated); the 60 layers spread over 16 stages (twelve of 4, four of 3); the dense first "
            "layer's width 12288 and the vocabulary 102400 from the released config, not the paper; token "
            "dropping during training left out",
        )
    ]


RUNS: tuple[PublishedRun, ...] = tuple(
    _narayanan()
    + _korthikanti()
    + _llama3()
    + _readme_h100()
    + _deepseek_v3()
    + _trainy_h200()
    + _megascale()
    + _titan_h100()
    + _bridge()
    + _mpt()
    + _bloom()
    + _deepseek_v2()
)


def runs(which: str | None = None) -> list[PublishedRun]:
    """Every run of this module, or those of one set (CALIBRATION or HELD_OUT); published.all_runs adds the
    fresh set's."""
    return [r for r in RUNS if which is None or r.set == which]

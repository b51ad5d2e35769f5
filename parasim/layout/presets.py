"""The one registry of named presets: the post's models and layouts, and published runs.

An entry names a model and, for most, a layout of it. `--model NAME` takes any entry's model; `--layout
NAME` takes entries with a layout."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError
from .mesh import Layout
from .model import ModelSpec, Stages
from .stages import SPREAD

# The post states 27B parameters; its shapes alone give 12*L*h^2 plus the embeddings.
DENSE_27B = ModelSpec(name="27B dense", layers=60, hidden=6144, heads=48, vocab=131072, micro_batch=1, params=27e9)
# The post's toy gives no hidden size, MLP width or vocabulary: 8, 8 and 64 are ours (small, for a toy).
MOE16 = ModelSpec(
    name="16-GPU MoE example",
    layers=4,
    hidden=8,
    heads=4,
    vocab=64,
    ffn=8,
    experts=8,
    top_k=2,
    seq=8,
    micro_batch=1,
    bias=False,
    tokens=("the", "court", "ruled", "that", "the", "contract", "was", "void"),
)
# Megatron-LM (Shoeybi et al., 2019), the 8.3B GPT-2: 72 layers, hidden 3072, 32 heads, 8-way TP on 512 GPUs.
MEGATRON_8B = ModelSpec(name="Megatron-LM 8.3B", layers=72, hidden=3072, heads=32, vocab=51200)
# DeepSeek-V3 (report, 2024): 61 layers (the first 3 dense) over 16 pipeline stages (so unevenly: as even as
# can be, layout/stages.py's spread), hidden 7168, 128 heads (modelled as plain multi-head: no MLA), 256 routed
# experts of width 2048 per MoE layer, top 8, one shared expert, SwiGLU; PP16 x EP64 with ZeRO-1 data
# parallelism and no TP.
DEEPSEEK_V3 = ModelSpec(
    name="DeepSeek-V3-like",
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
    stages=SPREAD,
    expert_groups=8,
    groups_kept=4,
)  # its routing: 4 of 8 groups (nodes)

# Llama 3 405B (Dubey et al., "The Llama 3 Herd of Models", 2024): Table 3's shapes (126 layers, model dimension
# 16,384, FFN 53,248, 128 heads, 8 KV heads; the released tokenizer's 128,256 entries), SwiGLU, RMSNorm, no
# biases; section 3.3.2: one layer fewer on the first and on the last of the 16 pipeline stages (7, then 8 on each
# middle stage: 126 layers).
LLAMA3_405B = ModelSpec(
    name="Llama 3 405B",
    layers=126,
    hidden=16384,
    heads=128,
    kv_heads=8,
    ffn=53248,
    vocab=128256,
    gated=True,
    norm="rmsnorm",
    bias=False,
    stages=Stages(first=7, last=7),
)


@dataclass(frozen=True)
class Preset:
    about: str
    model: ModelSpec
    layout: Layout | None = None  # None: a model only


PRESETS: dict[str, Preset] = {
    "27b": Preset("the post's 27B dense model: 60 layers, hidden 6144, 48 heads, vocabulary 131072", DENSE_27B),
    # CP splits the sentence in contiguous halves, as the post's step 1 draws it (real systems use zigzag)
    "moe16": Preset(
        "the post's 16-GPU MoE example: attention TP2 x CP2 x DP2, experts ETP1 x EP4 x EDP2, PP2",
        MOE16,
        Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, zigzag=False, model=MOE16),
    ),
    "27b-tp8": Preset("27B dense, one node: TP8", DENSE_27B, Layout(tp=8, model=DENSE_27B)),
    "27b-tp8-sp": Preset("27B dense, one node: TP8 + SP", DENSE_27B, Layout(tp=8, sp=True, model=DENSE_27B)),
    "27b-tp4-sp-cp2": Preset(
        "27B dense, one node: TP4 + SP + CP2", DENSE_27B, Layout(tp=4, cp=2, sp=True, model=DENSE_27B)
    ),
    "27b-tp2-sp-pp4": Preset(
        "27B dense, one node: TP2 + SP + PP4", DENSE_27B, Layout(tp=2, pp=4, sp=True, model=DENSE_27B)
    ),
    "27b-tp8-sp-dp2": Preset(
        "27B dense, two nodes: TP8 + SP, DP2", DENSE_27B, Layout(tp=8, dp=2, sp=True, model=DENSE_27B)
    ),
    "27b-tp8-sp-pp2": Preset(
        "27B dense, two nodes: TP8 + SP + PP2", DENSE_27B, Layout(tp=8, pp=2, sp=True, model=DENSE_27B)
    ),
    "27b-tp8-sp-cp2": Preset(
        "27B dense, two nodes: TP8 + SP + CP2", DENSE_27B, Layout(tp=8, cp=2, sp=True, model=DENSE_27B)
    ),
    "megatron-8.3b": Preset(
        "Megatron-LM's 8.3B GPT-2 on 512 GPUs: TP8 x DP64", MEGATRON_8B, Layout(tp=8, dp=64, model=MEGATRON_8B)
    ),
    "deepseek-v3": Preset(
        "a DeepSeek-V3-like run on 2048 GPUs: PP16 x EP64, no TP, ZeRO-1 over DP",
        DEEPSEEK_V3,
        Layout(pp=16, ep=64, etp=1, world=2048, model=DEEPSEEK_V3),
    ),
    # the Llama 3 paper's Table 4: pre-training on 16,384 H100s, and its long-context stage (CP 16, DP 8,
    # sequences of 131,072); its data parallelism shards more than ZeRO-1 (section 3.3.2), the step here ZeRO-1;
    # its CP all-gathers K and V (section 3.3.2), over the zigzag split's 2 x CP chunks
    "llama3-405b": Preset(
        "Llama 3 405B's pre-training on 16,384 GPUs: TP8 x PP16 x DP128 (the Llama 3 paper, Table 4)",
        LLAMA3_405B,
        Layout(tp=8, pp=16, dp=128, sp=True, model=LLAMA3_405B),
    ),
    "llama3-405b-long": Preset(
        "Llama 3 405B's long-context stage on 16,384 GPUs: TP8 x CP16 (K/V all-gathered) x PP16 x DP8 (the paper, "
        "Table 4)",
        replace(LLAMA3_405B, seq=131072),  # the stage's sequences: a run at another length names it (--seq)
        Layout(tp=8, cp=16, pp=16, dp=8, sp=True, cp_comm="all_gather", model=replace(LLAMA3_405B, seq=131072)),
    ),
}


def layout_names() -> list[str]:
    return [n for n, p in PRESETS.items() if p.layout is not None]


def model_names() -> list[str]:
    """One name per distinct model (the first entry that names it; a stage of one model at another sequence
    length, llama3-405b-long's, is the same model)."""
    seen: list[str] = []
    out = []
    for n, p in PRESETS.items():
        if p.model.name not in seen:
            seen.append(p.model.name)
            out.append(n)
    return out


def preset(name: str) -> Layout:
    """A preset's layout (its model attached)."""
    p = PRESETS.get(name)
    if p is None or p.layout is None:
        raise UsageError(f"unknown layout {name!r}; presets: {', '.join(layout_names())}")
    return p.layout


def model_preset(name: str) -> ModelSpec:
    """A preset's model, by any entry's name (case does not matter)."""
    p = PRESETS.get(name.lower())
    if p is None:
        raise UsageError(
            f"unknown model {name!r}; presets: {', '.join(model_names())} (or give --config FILE, "
            "or --layers/--hidden/--heads/--vocab)"
        )
    return p.model

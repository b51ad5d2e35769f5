"""Named layouts from the post and from published runs; each carries its model shape with it."""
from __future__ import annotations

from .errors import UsageError
from .layout import Layout, Model

DENSE_27B = Model(name="27B dense", layers=60, hidden=6144, heads=48, vocab=131072, micro_batch=1)
MOE16 = Model(name="16-GPU MoE example", layers=4, heads=4, experts=8, top_k=2, seq=8, micro_batch=1,
              tokens=("the", "court", "ruled", "that", "the", "contract", "was", "void"))
# Megatron-LM (Shoeybi et al., 2019), the 8.3B GPT-2: 72 layers, hidden 3072, 32 heads, 8-way TP on 512 GPUs.
MEGATRON_8B = Model(name="Megatron-LM 8.3B", layers=72, hidden=3072, heads=32, vocab=51200)
# DeepSeek-V3 (report, 2024): 61 layers over 16 pipeline stages (so unevenly), hidden 7168, 128 heads,
# 256 routed experts per MoE layer, top 8; PP16 x EP64 with ZeRO-1 data parallelism and no TP.
DEEPSEEK_V3 = Model(name="DeepSeek-V3-like", layers=61, hidden=7168, heads=128, experts=256, top_k=8,
                    vocab=129280, uneven_stages=True)

PRESETS: dict[str, tuple[str, Layout]] = {
    "moe16": ("the post's 16-GPU MoE example: attention TP2 x CP2 x DP2, experts ETP1 x EP4 x EDP2, PP2",
              Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=MOE16)),
    "27b-tp8": ("27B dense, one node: TP8", Layout(tp=8, model=DENSE_27B)),
    "27b-tp8-sp": ("27B dense, one node: TP8 + SP", Layout(tp=8, sp=True, model=DENSE_27B)),
    "27b-tp4-sp-cp2": ("27B dense, one node: TP4 + SP + CP2", Layout(tp=4, cp=2, sp=True, model=DENSE_27B)),
    "27b-tp2-sp-pp4": ("27B dense, one node: TP2 + SP + PP4", Layout(tp=2, pp=4, sp=True, model=DENSE_27B)),
    "27b-tp8-sp-dp2": ("27B dense, two nodes: TP8 + SP, DP2", Layout(tp=8, dp=2, sp=True, model=DENSE_27B)),
    "27b-tp8-sp-pp2": ("27B dense, two nodes: TP8 + SP + PP2", Layout(tp=8, pp=2, sp=True, model=DENSE_27B)),
    "27b-tp8-sp-cp2": ("27B dense, two nodes: TP8 + SP + CP2", Layout(tp=8, cp=2, sp=True, model=DENSE_27B)),
    "megatron-8.3b": ("Megatron-LM's 8.3B GPT-2 on 512 GPUs: TP8 x DP64",
                      Layout(tp=8, dp=64, model=MEGATRON_8B)),
    "deepseek-v3": ("a DeepSeek-V3-like run on 2048 GPUs: PP16 x EP64, no TP, ZeRO-1 over DP",
                    Layout(pp=16, ep=64, etp=1, world=2048, model=DEEPSEEK_V3)),
}


def preset(name: str) -> Layout:
    if name not in PRESETS:
        raise UsageError(f"unknown layout {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name][1]

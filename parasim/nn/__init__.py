"""Layers with their forward and backward written side by side, split over tensor-parallel ranks.

Every layer uses only `ctx.comm` and `ctx.xp`, so the same code runs on virtual ranks (numpy) and real
ranks (torch). Weights are drawn whole from `ctx.shared_rng` on every rank and each rank keeps its shard,
so the unsplit model (the reference) is known exactly. Activations use Megatron's [s, b, h] layout:
sequence parallelism splits dim 0.
"""

from .attention import ParallelAttention
from .core import Layer, LayerOptions, ParallelContext, Partial, Replicate, Saved, Shard, Weights
from .dropout import Dropout
from .embedding import VocabParallelCrossEntropy, VocabParallelEmbedding
from .layer import Stack, TransformerLayer, layer_weights
from .linear import ColumnParallelLinear, RowParallelLinear
from .mlp import ParallelMLP
from .norm import LayerNorm

__all__ = [
    "Layer",
    "Weights",
    "Replicate",
    "Shard",
    "Partial",
    "Saved",
    "ParallelContext",
    "LayerOptions",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "ParallelMLP",
    "ParallelAttention",
    "LayerNorm",
    "Dropout",
    "VocabParallelEmbedding",
    "VocabParallelCrossEntropy",
    "TransformerLayer",
    "Stack",
    "layer_weights",
]

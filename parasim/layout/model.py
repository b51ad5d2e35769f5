"""The model: one type for the engine's layers, the layout rules and the estimator.

Parameter counts follow from the shapes (attention, MLP or experts, norms, embeddings) unless a stated
count is given: the post quotes its dense model as 27B parameters, and the model-state figures use that.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LayoutError

def check_kv(heads: int, kv_heads: int) -> None:
    """Grouped-query attention: query heads come in equal groups, one per key/value head."""
    if heads % kv_heads:
        raise LayoutError(f"heads {heads} do not divide by kv-heads {kv_heads}")


@dataclass(frozen=True)
class ModelSpec:
    """A transformer's shapes: one type for the engine's layers, the layouts' rules and the estimator.

    Sizes left None are unknown: the layout rules that need them are skipped, and the estimator asks for
    the ones it needs (`require`)."""

    name: str = ""
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    kv_heads: int | None = None  # grouped-query attention: key/value heads (default: heads)
    ffn: int | None = None  # dense MLP width (default 4 * hidden)
    experts: int = 0  # routed experts per MoE layer; 0 = dense model
    top_k: int | None = None  # experts each token is routed to
    expert_ffn: int | None = None  # one expert's MLP width (default: ffn)
    shared_experts: int = 0  # experts every token visits (DeepSeek)
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    gated: bool = False  # SwiGLU-style MLP: three matrices instead of two
    tied_embeddings: bool = False
    uneven_stages: bool = False  # layers need not divide by pp (the first stages take the extra ones)
    params: float | None = None  # a stated parameter count; overrides the count from shapes
    seq: int | None = None  # a worked example's sequence length (CP's split must divide it)
    micro_batch: int | None = None
    tokens: tuple[str, ...] = ()  # a worked example's words, for traces
    # how the engine's layers compute (the estimator counts shapes only)
    dropout: float = 0.0
    act: str = "gelu"
    norm: str = "layernorm"  # or "rmsnorm"
    bias: bool = True
    flash: bool = False  # do not keep the attention scores (FlashAttention)

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn", "expert_ffn", "seq", "micro_batch"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise LayoutError(f"model {f} must be a positive integer, got {v!r}")
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads:
            raise LayoutError(f"hidden {self.hidden} does not divide by heads {self.heads}")
        if self.heads is not None and self.kv_heads is not None:
            check_kv(self.heads, self.kv_heads)
        if self.experts and self.top_k is not None and not 1 <= self.top_k <= self.experts:
            raise LayoutError(f"top-k must be between 1 and experts {self.experts}, got {self.top_k}")
        if self.layers is not None and self.dense_layers > self.layers:
            raise LayoutError(f"dense layers {self.dense_layers} exceed layers {self.layers}")

    def require(self, *fields: str) -> "ModelSpec":
        """This model, if it gives every one of `fields` (an MoE model also its top-k)."""
        missing = [f for f in fields if getattr(self, f) is None]
        if self.experts and self.top_k is None:
            missing.append("top_k")
        if missing:
            raise LayoutError(f"model {self.name or '(unnamed)'} lacks {', '.join(missing)}"
                              + (" (an MoE model needs its top-k: --top-k)" if "top_k" in missing else ""))
        return self

    # -- shapes --------------------------------------------------------------------------------------
    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_size(self) -> int:
        return self.expert_ffn or self.ffn_size

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def mlp_mats(self) -> int:
        return 3 if self.gated else 2

    # -- parameter counts (weights only; biases and norms are a rounding error at this scale) ----------
    def attention_params(self) -> int:
        h, d = self.hidden, self.head_dim
        return h * (self.heads * d) * 2 + h * (2 * self.kv * d)  # Q and O, then K and V

    def mlp_params(self, width: int) -> int:
        return self.mlp_mats * self.hidden * width

    def counted(self) -> dict[str, float]:
        """Parameters by part, from the shapes: attention, dense MLP, routed experts, shared experts,
        embeddings (input and output head), norms."""
        dense_mlp = self.layers - self.moe_layers
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return {"attention": float(self.layers * self.attention_params()),
                "dense mlp": float(dense_mlp * self.mlp_params(self.ffn_size)),
                "routed experts": float(self.moe_layers * self.experts * self.mlp_params(self.expert_size)),
                "shared experts": float(self.moe_layers * self.shared_experts * self.mlp_params(self.expert_size)),
                "router": float(self.moe_layers * self.experts * self.hidden),
                "embeddings": float(emb), "norms": float(self.layers * 2 * self.hidden)}

    def total_params(self) -> float:
        return float(self.params) if self.params else sum(self.counted().values())

    def expert_params(self) -> float:
        """Routed-expert parameters (split over EP rather than TP), scaled to a stated total."""
        c = self.counted()
        return c["routed experts"] * self.total_params() / sum(c.values())

    def active_params(self) -> float:
        """Parameters one token passes through (top-k of the routed experts), without the embeddings:
        what the 6 * params * tokens rule counts."""
        c = self.counted()
        scale = self.total_params() / sum(c.values())
        routed = c["routed experts"] * self.require().top_k / self.experts if self.experts else 0.0
        return (sum(c.values()) - c["routed experts"] - c["embeddings"] + routed) * scale

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "kv_heads": self.kv, "vocab": self.vocab, "ffn": self.ffn_size, "experts": self.experts,
                "top_k": self.top_k or 0, "expert_ffn": self.expert_size if self.experts else None,
                "shared_experts": self.shared_experts, "dense_layers": self.dense_layers, "gated": self.gated,
                "params": self.total_params(), "active_params": self.active_params()}

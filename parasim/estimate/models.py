"""Model descriptions for the estimator: the post's presets, a model from flags, or a Hugging Face config.json.

A `ModelSpec` holds the shapes the estimator needs. Parameter counts follow from the shapes (attention,
MLP or experts, norms, embeddings) unless a stated count is given: the post quotes its dense model as 27B
parameters, and the model-state figures use that stated count.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UsageError
from ..layout import Model
from ..presets import DEEPSEEK_V3, DENSE_27B, MOE16


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    kv_heads: int | None = None  # grouped-query attention: key/value heads (default: heads)
    ffn: int | None = None  # dense MLP width (default 4 * hidden)
    experts: int = 0  # routed experts per MoE layer; 0 = dense model
    top_k: int = 0
    expert_ffn: int | None = None  # one expert's MLP width (default: ffn)
    shared_experts: int = 0  # experts every token visits (DeepSeek)
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    gated: bool = False  # SwiGLU-style MLP: three matrices instead of two
    tied_embeddings: bool = False
    uneven_stages: bool = False  # layers need not divide by pp (the first stages take the extra ones)
    params: float | None = None  # a stated parameter count; overrides the count from shapes

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"model {f} must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise UsageError(f"hidden {self.hidden} does not divide by heads {self.heads}")
        if self.heads % self.kv:
            raise UsageError(f"heads {self.heads} do not divide by kv-heads {self.kv}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise UsageError(f"top-k must be between 1 and experts {self.experts}, got {self.top_k}")
        if self.dense_layers > self.layers:
            raise UsageError(f"dense layers {self.dense_layers} exceed layers {self.layers}")

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
        routed = c["routed experts"] * (self.top_k / self.experts if self.experts else 0.0)
        return (sum(c.values()) - c["routed experts"] - c["embeddings"] + routed) * scale

    def to_layout_model(self) -> Model:
        """The layout's view of this model, so a layout can check its rules (heads divide by tp, ...)."""
        return Model(name=self.name, layers=self.layers, hidden=self.hidden, heads=self.heads,
                     kv_heads=self.kv_heads, experts=self.experts or None, top_k=self.top_k or None,
                     vocab=self.vocab, uneven_stages=self.uneven_stages)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "kv_heads": self.kv, "vocab": self.vocab, "ffn": self.ffn_size, "experts": self.experts,
                "top_k": self.top_k, "expert_ffn": self.expert_size if self.experts else None,
                "shared_experts": self.shared_experts, "dense_layers": self.dense_layers, "gated": self.gated,
                "params": self.total_params(), "active_params": self.active_params()}


def _from(m: Model, **extra: Any) -> ModelSpec:
    return ModelSpec(name=m.name, layers=m.layers, hidden=m.hidden, heads=m.heads, vocab=m.vocab,
                     kv_heads=m.kv_heads, experts=m.experts or 0, top_k=m.top_k or 0, **extra)


def presets() -> dict[str, tuple[str, ModelSpec]]:
    """name -> (about, model). Built on demand, so there is no module-level state to share."""
    return {
        # the post states 27B parameters; its shapes alone give 12*L*h^2 plus the embeddings
        "27b": ("the post's 27B dense model: 60 layers, hidden 6144, 48 heads, vocabulary 131072",
                _from(DENSE_27B, params=27e9)),
        # the post's toy gives no hidden size or vocabulary: ours are small, for a toy
        "moe16": ("the post's 16-GPU MoE toy: 4 layers, 4 heads, 8 experts, top-2 (hidden 16 and vocabulary 64 "
                  "are our choice)", _from(replace(MOE16, hidden=16, vocab=64))),
        # DeepSeek-V3's sizes from its report; attention is modelled as plain multi-head (no MLA)
        "deepseek-v3": ("a DeepSeek-V3-like MoE: 61 layers (3 dense), hidden 7168, 128 heads, 256 experts of "
                        "width 2048, top-8, 1 shared, SwiGLU", _from(DEEPSEEK_V3, ffn=18432, expert_ffn=2048,
                                                                     shared_experts=1, dense_layers=3, gated=True,
                                                                     uneven_stages=True)),
        "megatron-8.3b": ("Megatron-LM's 8.3B GPT-2: 72 layers, hidden 3072, 32 heads",
                          _from(replace(DENSE_27B, name="Megatron-LM 8.3B", layers=72, hidden=3072, heads=32,
                                        vocab=51200))),
    }


def get_model(name: str) -> ModelSpec:
    table = presets()
    if name.lower() not in table:
        raise UsageError(f"unknown model {name!r}; presets: {', '.join(table)} (or give --config FILE, or "
                         "--layers/--hidden/--heads/--vocab)")
    return table[name.lower()][1]


# Hugging Face field names, in the order they are tried; the first present wins.
HF_FIELDS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "top_k": ("num_experts_per_tok", "moe_topk"),
    "expert_ffn": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts",),
    "dense_layers": ("first_k_dense_replace",),
}
REQUIRED = ("layers", "hidden", "heads", "vocab")
GATED_ACTIVATIONS = ("silu", "swiglu", "geglu")  # a gated MLP has three matrices (Llama's model_type implies it)


def from_hf_config(path: str) -> ModelSpec:
    """A model from a Hugging Face config.json: the usual fields are read, unknown ones ignored."""
    from ..limits import MAX_SIZE, read_bounded
    try:
        cfg = json.loads(read_bounded(path, "config"))
    except (ValueError, UnicodeDecodeError) as exc:  # a JSON error, or a number of over 4300 digits
        why = "a number in it has thousands of digits" if "digits" in str(exc) else exc
        raise UsageError(f"{path} is not JSON: {why}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):  # multimodal configs nest the language model
        cfg = {**cfg, **cfg["text_config"]}
    got: dict[str, Any] = {}
    for key, names in HF_FIELDS.items():
        for n in names:
            if cfg.get(n) is not None:
                got[key] = cfg[n]
                break
    for key in REQUIRED:
        if key not in got:
            raise UsageError(f"{path}: missing required field {HF_FIELDS[key][0]!r}")
    for key, v in got.items():
        least = 1 if key in ("layers", "hidden", "heads", "vocab", "kv_heads") else 0
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MAX_SIZE:
            shown = repr(v) if not isinstance(v, int) or v.bit_length() < 64 else f"a {len(str(v))}-digit number"
            raise UsageError(f"{path}: field for {key} must be an integer from {least} to {MAX_SIZE:.0e}, got {shown}")
    act = cfg.get("hidden_act") or cfg.get("activation_function")
    gated = act in GATED_ACTIVATIONS or "llama" in str(cfg.get("model_type"))
    name = str(cfg.get("_name_or_path") or cfg.get("model_type") or path)
    return ModelSpec(name=name, gated=gated, tied_embeddings=bool(cfg.get("tie_word_embeddings")), **got)


def from_flags(layers: int | None, hidden: int | None, heads: int | None, vocab: int | None,
               **extra: Any) -> ModelSpec:
    """A model from sizes given one by one; the four main ones are required."""
    missing = [f"--{n}" for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab))
               if v is None]
    if missing:
        raise UsageError(f"a model from flags needs {', '.join(missing)} (or use --model NAME or --config FILE)")
    return ModelSpec(name="custom", layers=layers, hidden=hidden, heads=heads, vocab=vocab,  # type: ignore[arg-type]
                     **{k: v for k, v in extra.items() if v is not None})


def layer_param_count(h: int, heads: int, kv: int, ffn: int, tp: int, bias: bool = True, norm_params: int = 2,
                      mats: int = 2) -> int:
    """Parameters one TP rank holds of one dense layer, biases and norms included: what its gradients
    hold, and what the data-parallel reduction moves. kv heads fewer than tp are replicated."""
    d = h // heads
    kv_local = (kv // tp if kv >= tp else 1) * d
    qkv = h * (h // tp + 2 * kv_local) + (h // tp + 2 * kv_local if bias else 0)
    out = (h // tp) * h + (h if bias else 0)  # the row-parallel bias is whole on every rank
    mlp = mats * h * ffn // tp + ((mats - 1) * ffn // tp + h if bias else 0)
    return qkv + out + mlp + 2 * norm_params * h

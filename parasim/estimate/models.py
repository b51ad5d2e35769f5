"""Where the estimator's model comes from: a preset (parasim.layout's registry), sizes given as flags, or a
Hugging Face config.json. The model type itself is parasim.layout.ModelSpec, the engine's too."""
from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..layout import ModelSpec, model_preset


def get_model(name: str) -> ModelSpec:
    """The model of a preset (parasim.layout's registry): 27b, moe16, deepseek-v3, megatron-8.3b, ..."""
    return model_preset(name).require(*REQUIRED)


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
    from ..limits import MAX_SIZE, read_bounded, read_json
    cfg = read_json(read_bounded(path, "config"), path, "a model's config.json", constants=True)  # Python writes NaN
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
    return ModelSpec(name=name, gated=gated, tied_embeddings=bool(cfg.get("tie_word_embeddings")), **got).require(*REQUIRED)


def from_flags(layers: int | None, hidden: int | None, heads: int | None, vocab: int | None,
               **extra: Any) -> ModelSpec:
    """A model from sizes given one by one; the four main ones are required."""
    missing = [f"--{n}" for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab))
               if v is None]
    if missing:
        raise UsageError(f"a model from flags needs {', '.join(missing)} (or use --model NAME or --config FILE)")
    return ModelSpec(name="custom", layers=layers, hidden=hidden, heads=heads, vocab=vocab,  # type: ignore[arg-type]
                     **{k: v for k, v in extra.items() if v is not None}).require(*REQUIRED)


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

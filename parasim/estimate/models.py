"""Where the estimator's model comes from: a preset (parasim.layout's registry), sizes given as flags, or a
Hugging Face config.json. The model type itself is parasim.layout.ModelSpec, the engine's too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..layout import SPREAD, ModelSpec, model_preset


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


# Multi-head latent attention's sizes (DeepSeek-V2/V3), named alike in the config and in ModelSpec.
HF_LATENT = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# Fields that place the MoE layers among the layers: DeepSeek's first_k_dense_replace (above, as
# dense_layers) and moe_layer_freq, Qwen-MoE's decoder_sparse_step and mlp_only_layers.
HF_PATTERN = ("moe_layer_freq", "decoder_sparse_step")


@dataclass(frozen=True)
class HFConfig:
    """A Hugging Face config.json as read: the model, the fields that made it (each with its value, in the
    order they were read), and one line for each field present that changes memory, traffic or time in a
    way parasim does not model (fields with no such effect are passed over silently)."""

    model: ModelSpec
    used: dict[str, Any] = field(default_factory=dict)
    unmodelled: list[str] = field(default_factory=list)


def from_hf_config(path: str) -> ModelSpec:
    """A model from a Hugging Face config.json: the usual fields are read, unknown ones ignored."""
    return read_hf_config(path).model


def read_hf_config(path: str) -> HFConfig:
    """A Hugging Face config.json, dense or MoE: its model, the fields read, and what it does that parasim
    does not model. Reads GQA and a stated head_dim, the MoE fields of Mixtral, DeepSeek-V2/V3 and
    Qwen2/Qwen3-MoE (with Qwen2-MoE's one wider shared expert, and the dense layers wherever they lie), and
    DeepSeek's multi-head latent attention (parameters exact)."""
    from ..limits import MAX_SIZE, read_bounded, read_json

    cfg = read_json(read_bounded(path, "config"), path, "a model's config.json", constants=True)  # Python writes NaN
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):  # multimodal configs nest the language model
        cfg = {**cfg, **cfg["text_config"]}
    used: dict[str, Any] = {}

    def size(name: str, v: Any, least: int, label: str | None = None) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MAX_SIZE:
            shown = repr(v) if not isinstance(v, int) or v.bit_length() < 64 else f"a {len(str(v))}-digit number"
            raise UsageError(
                f"{path}: field for {label or name} must be an integer from {least} to {MAX_SIZE:.0e}, got {shown}"
            )
        used[name] = v
        return v

    got: dict[str, Any] = {}
    for key, names in HF_FIELDS.items():
        n = next((n for n in names if cfg.get(n) is not None), None)
        if n is not None:
            least = 1 if key in ("layers", "hidden", "heads", "vocab", "kv_heads") else 0
            got[key] = size(n, cfg[n], least, key)
    for key in REQUIRED:
        if key not in got:
            raise UsageError(f"{path}: missing required field {HF_FIELDS[key][0]!r}")
    layers, hidden, heads = got["layers"], got["hidden"], got["heads"]
    notes: list[str] = []

    latent = {}
    if cfg.get("kv_lora_rank") is not None:
        latent = {n: size(n, cfg[n], 1) for n in HF_LATENT if cfg.get(n) is not None}
    if latent:  # DeepSeek's config also has a head_dim (the rotary part's): attention's sizes are these
        got.update(latent)
        notes.append(
            f"kv_lora_rank {latent['kv_lora_rank']}: multi-head latent attention's parameters are counted "
            f"exactly, but its activations, attention time and CP traffic are modelled as plain "
            f"multi-head attention of {heads} heads of {hidden // heads} (hidden / heads)"
        )
    elif cfg.get("head_dim") is not None:
        d = size("head_dim", cfg["head_dim"], 1)
        if hidden % heads or d != hidden // heads:
            got["head_size"] = d
            notes.append(
                f"head_dim {d}: attention is {heads} x {d} = {heads * d} wide, not hidden {hidden}; its "
                f"parameters and projection time use that, its activations, attention-core time and "
                f"CP traffic take it as {hidden} wide"
            )

    experts = got.get("experts", 0)
    if experts:
        shared_w = cfg.get("shared_expert_intermediate_size")
        if shared_w is not None and size("shared_expert_intermediate_size", shared_w, 0):
            got.setdefault("shared_experts", 1)  # Qwen2-MoE: one shared expert of its own width
            got["shared_expert_ffn"] = shared_w
        limit = _group_limit(cfg, experts)
        if limit and experts % limit[0] == 0:  # (groups that do not divide the experts: named, `_unmodelled`)
            # group-limited routing: what a dispatcher that sends a token once per GPU and node sends
            # (estimate/dispatch.py); NCCL's all-to-all sends each top-k copy whatever the groups. ModelSpec refuses
            # kept groups too small for a token's k experts
            got["expert_groups"], got["groups_kept"] = size("n_group", limit[0], 1), size("topk_group", limit[1], 1)
        dense_at = _dense_layers(path, cfg, layers, got.get("dense_layers", 0), size, used)
        if dense_at is not None:
            got["dense_layers"] = len(dense_at)
            if dense_at != list(range(len(dense_at))):
                shown = ", ".join(map(str, dense_at[:8])) + (", ..." if len(dense_at) > 8 else "")
                notes.append(
                    f"{len(dense_at)} dense-MLP layers at {shown} of {layers}: counted, but the pipeline "
                    f"split takes them to be the first {len(dense_at)}, so each stage's mix of dense and "
                    f"MoE layers (its memory and time) can differ"
                )
    notes.extend(_unmodelled(cfg, layers, experts))

    act = cfg.get("hidden_act") or cfg.get("activation_function")
    for n in ("hidden_act", "activation_function"):
        if cfg.get(n) is not None:
            used[n] = cfg[n]
            break
    gated = act in GATED_ACTIVATIONS or "llama" in str(cfg.get("model_type"))
    for n in ("model_type", "tie_word_embeddings"):
        if n in cfg:
            used[n] = cfg[n]
    name = str(cfg.get("_name_or_path") or cfg.get("model_type") or path)
    # RMSNorm where the config gives its epsilon by that name (Llama, Mistral, Qwen, DeepSeek); biases where a
    # field says so (GPT-2 style configs have them and no such field)
    norm = "rmsnorm" if "rms_norm_eps" in cfg else "layernorm"
    flags = [cfg[k] for k in ("attention_bias", "mlp_bias", "qkv_bias") if isinstance(cfg.get(k), bool)]
    bias = any(flags) if flags else norm == "layernorm"
    # a config says nothing of pipeline stages: layers that do not divide by pp go as evenly as can be (the first
    # L mod pp stages one more, as the deepseek-v3 preset's 61 over 16), unless the command gives a split
    model = ModelSpec(
        name=name,
        gated=gated,
        tied_embeddings=bool(cfg.get("tie_word_embeddings")),
        norm=norm,
        bias=bias,
        stages=SPREAD,
        **got,
    )
    return HFConfig(model.require(*REQUIRED), used, notes)


def _dense_layers(
    path: str, cfg: dict, layers: int, first_dense: int, size: Any, used: dict[str, Any]
) -> list[int] | None:
    """The indices of an MoE model's dense-MLP layers when fields place them (None: first_k_dense_replace's
    leading layers alone). A layer has experts when it is past first_k_dense_replace, its index is a
    multiple of moe_layer_freq (DeepSeek-V2), its index + 1 a multiple of decoder_sparse_step, and it is not
    in mlp_only_layers (Qwen-MoE; the rule of their Hugging Face model code)."""
    freq, step = (size(n, cfg[n], 1) if cfg.get(n) is not None else 1 for n in HF_PATTERN)
    only = cfg.get("mlp_only_layers")
    if only is not None:
        if not isinstance(only, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in only
        ):
            raise UsageError(
                f"{path}: mlp_only_layers must be a list of layer indices from 0 to {layers - 1}, got {str(only)[:60]}"
            )
        used["mlp_only_layers"] = only
    if (only is None and freq == 1 and step == 1) or first_dense > layers:  # (the model refuses the latter)
        return None
    skip = set(only or ())
    return [i for i in range(layers) if i < first_dense or i % freq or (i + 1) % step or i in skip]


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _group_limit(cfg: dict, experts: int) -> tuple[int, int] | None:
    """(n_group, topk_group) where they limit an MoE model's tokens (more than one group, fewer of them kept),
    else None."""
    groups, kept = cfg.get("n_group"), cfg.get("topk_group")
    if experts and _positive(groups) and _positive(kept) and 1 < groups and kept < groups:
        return groups, kept
    return None


def _unmodelled(cfg: dict, layers: int, experts: int) -> list[str]:
    """Lines for the fields present that change memory, traffic or time beyond what parasim models."""
    out = []
    if isinstance(cfg.get("vision_config"), dict):
        out.append(
            "vision_config: the image encoder is not counted (its layers, parameters, activations and time): "
            "parasim plans the language model of text_config alone"
        )
    cross = cfg.get("cross_attention_layers")
    if isinstance(cross, list) and cross:
        out.append(
            f"cross_attention_layers: {len(cross)} of the {layers} layers attend to the image's tokens; parasim "
            f"counts them as self-attention layers of the same width"
        )
    if cfg.get("is_encoder_decoder"):
        out.append(
            "is_encoder_decoder: parasim reads one stack of layers as a decoder-only model; the second "
            "stack and its cross-attention are not counted"
        )
    mtp = cfg.get("num_nextn_predict_layers")
    if _positive(mtp):
        out.append(
            f"num_nextn_predict_layers {mtp}: the multi-token prediction module ({mtp} more "
            f"layer{'s' if mtp > 1 else ''} predicting further tokens, with {'their' if mtp > 1 else 'its'} "
            f"own projection) is not counted: no parameters, memory or time for it"
        )
    limit = _group_limit(cfg, experts)
    if limit and experts % limit[0]:
        out.append(
            f"n_group {limit[0]}, topk_group {limit[1]}: group-limited routing in groups that do not "
            f"divide the {experts} experts is not modelled: a token's picks are taken as spread over all "
            f"of them"
        )
    window, types = cfg.get("sliding_window"), cfg.get("layer_types")
    if _positive(window):
        if isinstance(types, list):
            n = sum(t == "sliding_attention" for t in types)
            where = f"on {n} of {layers} layers"
        else:
            n = 0 if cfg.get("use_sliding_window") is False else None
            where = "on every layer" if "use_sliding_window" not in cfg else "on some or all layers"
        if n != 0:
            out.append(
                f"sliding_window {window}: attention over only the last {window} tokens ({where}) is not "
                f"modelled: attention time, CP's ring and (without FlashAttention) the kept scores are "
                f"counted over the whole sequence"
            )
    return out


def from_flags(layers: int | None, hidden: int | None, heads: int | None, vocab: int | None, **extra: Any) -> ModelSpec:
    """A model from sizes given one by one; the four main ones are required."""
    missing = [
        f"--{n}" for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab)) if v is None
    ]
    if missing:
        raise UsageError(f"a model from flags needs {', '.join(missing)} (or use --model NAME or --config FILE)")
    return ModelSpec(
        name="custom",
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,  # type: ignore[arg-type]
        **{k: v for k, v in extra.items() if v is not None},
    ).require(*REQUIRED)


def layer_param_count(
    h: int, heads: int, kv: int, ffn: int, tp: int, bias: bool = True, norm_params: int = 2, mats: int = 2
) -> int:
    """Parameters one TP rank holds of one dense layer, biases and norms included: what its gradients
    hold, and what the data-parallel reduction moves. kv heads fewer than tp are replicated."""
    d = h // heads
    kv_local = (kv // tp if kv >= tp else 1) * d
    qkv = h * (h // tp + 2 * kv_local) + (h // tp + 2 * kv_local if bias else 0)
    out = (h // tp) * h + (h if bias else 0)  # the row-parallel bias is whole on every rank
    mlp = mats * h * ffn // tp + ((mats - 1) * ffn // tp + h if bias else 0)
    return qkv + out + mlp + 2 * norm_params * h

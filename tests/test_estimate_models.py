"""Model descriptions for the estimator: parameter counts by hand, Hugging Face configs field by field,
models from flags."""
import json

import pytest

from parasim.errors import UsageError
from parasim.estimate.models import ModelSpec, from_flags, from_hf_config

# a small MoE model whose counts are worked out by hand below
SMALL = dict(name="m", layers=2, hidden=8, heads=2, vocab=10, kv_heads=1, ffn=16, experts=4, top_k=2, expert_ffn=6,
             shared_experts=1, dense_layers=1, gated=True)


def test_counts_by_hand():
    m = ModelSpec(**SMALL)
    # head dim 4: Q and O are 8x8 each, K and V 8x4 each (one kv head); three matrices per MLP (gated)
    assert m.counted() == {"attention": 2 * (8 * 8 * 2 + 8 * 4 * 2), "dense mlp": 1 * 3 * 8 * 16,
                           "routed experts": 1 * 4 * 3 * 8 * 6, "shared experts": 1 * 1 * 3 * 8 * 6,
                           "router": 1 * 4 * 8, "embeddings": 10 * 8 * 2, "norms": 2 * 2 * 8}
    assert m.to_dict() == {"name": "m", "layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "vocab": 10,
                           "ffn": 16, "experts": 4, "top_k": 2, "expert_ffn": 6, "shared_experts": 1,
                           "dense_layers": 1, "gated": True, "params": 1712.0,
                           "active_params": 1712.0 - 576 - 160 + 576 * 2 / 4}
    dense = ModelSpec("d", layers=1, hidden=4, heads=1, vocab=3, tied_embeddings=True)
    assert dense.to_dict()["expert_ffn"] is None and dense.to_dict()["ffn"] == 16
    assert dense.counted()["embeddings"] == 12 and dense.active_params() == dense.total_params() - 12
    stated = ModelSpec("s", layers=1, hidden=4, heads=1, vocab=3, params=1e6)
    assert stated.total_params() == 1e6 and stated.active_params() == pytest.approx(1e6 * (1 - 24 / (64 + 128 + 24 + 8)))


HF = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}


def _load(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return from_hf_config(str(path))


@pytest.mark.parametrize("cfg, field, value", [
    ({"n_layer": 3, "n_embd": 8, "n_head": 2, "vocab_size": 10}, "layers", 3),  # GPT-2's names
    ({"num_layers": 5, "d_model": 12, "num_attention_heads": 3, "vocab_size": 10}, "hidden", 12),
    ({**HF, "num_kv_heads": 1}, "kv_heads", 1),
    ({**HF, "n_inner": 20}, "ffn", 20),
    ({**HF, "ffn_dim": 24}, "ffn", 24),
    ({**HF, "n_routed_experts": 6, "moe_topk": 2}, "experts", 6),
    ({**HF, "num_experts": 6, "num_experts_per_tok": 3}, "top_k", 3),
    ({**HF, "num_local_experts": 4, "top_k": 9, "num_experts_per_tok": 2, "moe_intermediate_size": 5,
      "n_shared_experts": 1, "first_k_dense_replace": 1}, "expert_ffn", 5),
    ({**HF, "num_local_experts": 0}, "experts", 0),  # zero is allowed: a dense model
    ({**HF, "num_key_value_heads": None, "num_kv_heads": 1}, "kv_heads", 1),  # a null field is absent
    ({"text_config": HF}, "layers", 2),  # multimodal configs nest the language model
    ({**HF, "hidden_act": "silu"}, "gated", True),
    ({**HF, "activation_function": "swiglu"}, "gated", True),
    ({**HF, "hidden_act": "geglu"}, "gated", True),
    ({**HF, "hidden_act": "gelu", "activation_function": "swiglu"}, "gated", False),  # hidden_act first
    ({**HF, "hidden_act": "gelu"}, "gated", False),
    ({**HF, "model_type": "llama"}, "gated", True),
    (HF, "gated", False),
    ({**HF, "tie_word_embeddings": True}, "tied_embeddings", True),
    (HF, "tied_embeddings", False),
    ({**HF, "_name_or_path": "org/model", "model_type": "gpt2"}, "name", "org/model"),
    ({**HF, "model_type": "gpt2"}, "name", "gpt2"),
])
def test_hf_config_fields(tmp_path, cfg, field, value):
    assert getattr(_load(tmp_path, cfg), field) == value


def test_hf_config_deepseek_like_reads_every_moe_field(tmp_path):
    m = _load(tmp_path, {**HF, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 5,
                         "n_shared_experts": 1, "first_k_dense_replace": 1})
    assert (m.experts, m.top_k, m.expert_ffn, m.shared_experts, m.dense_layers) == (4, 2, 5, 1, 1)
    assert _load(tmp_path, HF, "x.json").name.endswith("x.json")  # no name in the file: its path


@pytest.mark.parametrize("cfg, needle", [
    ([1, 2], "expected a JSON object"),
    ({**HF, "vocab_size": -1}, "non-negative integer, got -1"),
    ({**HF, "num_hidden_layers": True}, "non-negative integer, got True"),
    ({**HF, "hidden_size": 8.0}, "non-negative integer, got 8.0"),
    ({**HF, "num_local_experts": "8"}, "non-negative integer, got '8'"),
    ({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}, "'num_hidden_layers'"),
    ({"text_config": "x", **{k: v for k, v in HF.items() if k != "vocab_size"}}, "'vocab_size'"),
])
def test_hf_config_rejects(tmp_path, cfg, needle):
    with pytest.raises(UsageError, match=needle):
        _load(tmp_path, cfg)


def test_from_flags():
    m = from_flags(2, 8, 2, 10, kv_heads=1, ffn=None)
    assert (m.name, m.layers, m.hidden, m.heads, m.vocab, m.kv_heads, m.ffn) == ("custom", 2, 8, 2, 10, 1, None)
    with pytest.raises(UsageError, match=r"needs --layers, --hidden \(or"):
        from_flags(None, None, 2, 10)
    with pytest.raises(UsageError, match=r"needs --heads, --vocab \(or"):
        from_flags(2, 8, None, None)

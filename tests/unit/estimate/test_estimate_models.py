"""Model descriptions for the estimator: parameter counts by hand, Hugging Face configs field by field,
models from flags."""
import json

import pytest

from parasim.errors import UsageError
from parasim.estimate.models import from_flags, from_hf_config, layer_param_count
from parasim.layout import PRESETS, SPREAD, ModelSpec

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
                           "active_params": 1712.0 - 576 - 160 + 576 * 2 / 4,
                           "active_params_with_embeddings": 1712.0 - 576 + 576 * 2 / 4}
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
    ({**HF, "vocab_size": -1}, "vocab must be an integer from 1 to 1e\\+12, got -1"),
    ({**HF, "num_hidden_layers": True}, "layers must be an integer from 1 to 1e\\+12, got True"),
    ({**HF, "hidden_size": 8.0}, "hidden must be an integer from 1 to 1e\\+12, got 8.0"),
    ({**HF, "num_local_experts": "8"}, "experts must be an integer from 0 to 1e\\+12, got '8'"),
    ({**HF, "num_key_value_heads": 0}, "kv_heads must be an integer from 1 to 1e\\+12, got 0"),
    ({**HF, "num_local_experts": 0}, None),  # no experts: a dense model
    ({**HF, "hidden_size": 2**100}, "hidden_size: an integer of 31 digits \\(no count needs more than 20\\)"),
    ({**HF, "hidden_size": 2**64}, "hidden must be an integer from 1 to 1e\\+12, got a 20-digit number"),
    ({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}, "'num_hidden_layers'"),
    ({"text_config": "x", **{k: v for k, v in HF.items() if k != "vocab_size"}}, "'vocab_size'"),
])
def test_hf_config_rejects(tmp_path, cfg, needle):
    if needle is None:
        _load(tmp_path, cfg)
        return
    with pytest.raises(UsageError, match=needle):
        _load(tmp_path, cfg)


def test_from_flags():
    m = from_flags(2, 8, 2, 10, kv_heads=1, ffn=None)
    assert (m.name, m.layers, m.hidden, m.heads, m.vocab, m.kv_heads, m.ffn) == ("custom", 2, 8, 2, 10, 1, None)
    with pytest.raises(UsageError, match=r"needs --layers, --hidden \(or"):
        from_flags(None, None, 2, 10)
    with pytest.raises(UsageError, match=r"needs --heads, --vocab \(or"):
        from_flags(2, 8, None, None)


def test_presets_field_by_field():
    """Each preset model's shapes, written out from the post (27B, the MoE toy), DeepSeek-V3's report and
    Megatron-LM's paper: one registry for the engine, the layouts and the estimator."""
    assert list(PRESETS)[:2] == ["27b", "moe16"]
    assert PRESETS["27b"].model == ModelSpec("27B dense", layers=60, hidden=6144, heads=48, vocab=131072,
                                             micro_batch=1, params=27e9)
    moe16 = PRESETS["moe16"].model
    assert (moe16.layers, moe16.hidden, moe16.heads, moe16.vocab, moe16.ffn, moe16.experts, moe16.top_k,
            moe16.seq, moe16.bias) == (4, 8, 4, 64, 8, 8, 2, 8, False)
    assert moe16.tokens == ("the", "court", "ruled", "that", "the", "contract", "was", "void")
    assert PRESETS["deepseek-v3"].model == ModelSpec(
        "DeepSeek-V3-like", layers=61, hidden=7168, heads=128, vocab=129280, ffn=18432, experts=256, top_k=8,
        expert_ffn=2048, shared_experts=1, dense_layers=3, gated=True, stages=SPREAD, expert_groups=8,
        groups_kept=4)  # the report's node-limited routing: 8 groups (one a node at EP 64), 4 kept
    assert PRESETS["megatron-8.3b"].model == ModelSpec("Megatron-LM 8.3B", layers=72, hidden=3072, heads=32,
                                                       vocab=51200)
    # every entry sharing a model shares the very object: a model is typed once
    assert PRESETS["27b-tp8"].model is PRESETS["27b"].model is PRESETS["27b-tp8"].layout.model


def test_one_model_type_for_the_engine_the_layouts_and_the_estimator():
    from parasim.estimate import get_model
    from parasim.estimate.memory import Plan
    from parasim.layout import Layout
    m = get_model("moe16")
    assert m is PRESETS["moe16"].layout.model
    Layout(tp=2, sp=True, ep=4, world=8, model=m)  # a layout checks the estimator's model as it is
    Plan(tp=2, sp=True, ep=4, dp=4).check(m)
    with pytest.raises(UsageError, match="heads 4 do not divide by tp 8"):
        Plan(tp=8, sp=True).check(m)
    with pytest.raises(UsageError, match="lacks vocab"):
        ModelSpec("partial", layers=2, hidden=8, heads=2).require("layers", "vocab")


@pytest.mark.parametrize("extra", [dict(experts=4, top_k=1), dict(experts=4, top_k=4),
                                   dict(experts=4, top_k=2, dense_layers=2)])
def test_model_rules_at_their_edges(extra):
    ModelSpec("e", layers=2, hidden=8, heads=2, vocab=5, **extra)  # one expert per token, all of them, all dense


def test_a_fractional_size_is_refused():
    with pytest.raises(UsageError, match="model layers must be a positive integer, got 2.5"):
        ModelSpec("f", layers=2.5, hidden=8, heads=2, vocab=5)


def test_layer_param_count_by_hand():
    """h 8, 4 heads (dim 2), ffn 12, tp 2. With 4 kv heads a rank holds Q 8x4, K and V 8x4 each and their
    biases (96 + 12), O 4x8 and its whole bias (40), the MLP 8x6 twice and biases 6 + 8 (110), two
    LayerNorms (32): 290. One kv head is replicated, so K and V are 8x2 each: 254. Without biases, with
    RMSNorm and a gated MLP (three matrices): 96 + 32 + 144 + 16 = 288. A count is a whole number."""
    for kv, want in ((4, 290), (2, 254), (1, 254)):
        n = layer_param_count(8, 4, kv, 12, 2)
        assert n == want and type(n) is int
    n = layer_param_count(8, 4, 4, 12, 2, bias=False, norm_params=1, mats=3)
    assert n == 288 and type(n) is int


def test_the_registry_names_layouts_and_models_once_each():
    from parasim.layout import layout_names, model_names
    assert model_names() == ["27b", "moe16", "megatron-8.3b", "deepseek-v3", "llama3-405b"]  # one name per distinct model
    assert "27b" not in layout_names() and {"moe16", "27b-tp8", "deepseek-v3"} <= set(layout_names())
    assert len(layout_names()) == len(PRESETS) - 1


def test_an_moe_model_without_top_k_is_refused_by_name():
    moe = ModelSpec("m", layers=2, hidden=8, heads=2, vocab=4, experts=4)
    with pytest.raises(UsageError, match=r"lacks top_k \(an MoE model needs its top-k"):
        moe.require("layers")
    with pytest.raises(UsageError, match="lacks top_k"):
        moe.active_params()
    assert ModelSpec("d", layers=1, hidden=4, heads=2, vocab=5).to_dict()["top_k"] == 0  # dense: none

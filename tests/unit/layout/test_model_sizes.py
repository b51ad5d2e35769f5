"""A model given in part (sizes left None) answers what its given sizes allow and names what it lacks for the
rest (ModelSpec.size and .k), rather than failing on None arithmetic."""
import numpy as np
import pytest

from parasim.layout import LayoutError, ModelSpec


def test_a_layers_count_needs_only_the_sizes_it_reads():
    # Q and O: hidden x (heads x head size) each; K and V: hidden x (kv heads x head size) each, by hand
    m = ModelSpec(hidden=64, heads=4)
    assert m.attention_params() == 64 * 64 * 2 + 64 * 2 * 64
    assert m.mlp_params(256) == 2 * 64 * 256


@pytest.mark.parametrize("given, lacking", [({"heads": 4}, "hidden"), ({"hidden": 64}, "heads")])
def test_a_missing_size_is_named(given, lacking):
    with pytest.raises(LayoutError, match=f"model shapes lacks {lacking}$"):
        ModelSpec(name="shapes", **given).attention_params()


def test_a_count_over_the_whole_model_names_each_size_it_reaches_first():
    m = ModelSpec(hidden=64, heads=4, vocab=100)
    with pytest.raises(LayoutError, match="lacks layers"):
        m.counted()
    with pytest.raises(LayoutError, match="lacks vocab"):
        ModelSpec(hidden=64, heads=4, layers=2).counted()


def test_an_moe_model_without_its_top_k_says_so():
    m = ModelSpec(name="moe", layers=2, hidden=8, heads=2, vocab=10, experts=4)
    with pytest.raises(LayoutError, match=r"model moe lacks top_k \(an MoE model needs its top-k: --top-k\)"):
        m.active_params()
    assert ModelSpec(layers=2, hidden=8, heads=2, vocab=10, experts=4, top_k=2).k == 2


def test_a_size_is_a_python_int():
    got = ModelSpec(layers=np.int64(3)).size("layers")
    assert got == 3 and type(got) is int


_MLA = dict(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
_MOE = dict(hidden=64, heads=4, experts=8, top_k=2)
# ModelSpec's own rules, each at the value that breaks it, with the whole message written out
REFUSED = [
    (dict(hidden=0), "model hidden must be a positive integer, got 0"),
    (dict(layers=True), "model layers must be a positive integer, got True"),
    (dict(hidden=2.0), "model hidden must be a positive integer, got 2.0"),
    (dict(hidden=10, heads=4), "hidden 10 does not divide by heads 4"),
    (dict(q_lora_rank=64, v_head_dim=128), "latent attention's q_lora_rank, v_head_dim need its kv_lora_rank"),
    ({**_MLA, "qk_rope_head_dim": None, "v_head_dim": None},
     "latent attention (kv_lora_rank 512) lacks qk_rope_head_dim, v_head_dim"),
    ({**_MLA, "qk_nope_head_dim": None}, "latent attention (kv_lora_rank 512) lacks qk_nope_head_dim"),
    ({**_MLA, "head_size": 128}, "a stated head size and latent attention's sizes exclude each other"),
    ({**_MOE, "top_k": 0}, "top-k must be between 1 and experts 8, got 0"),
    ({**_MOE, "top_k": 9}, "top-k must be between 1 and experts 8, got 9"),
    ({**_MOE, "expert_groups": 4}, "group-limited routing needs both expert_groups and groups_kept"),
    ({**_MOE, "groups_kept": 2}, "group-limited routing needs both expert_groups and groups_kept"),
    ({**_MOE, "expert_groups": 0, "groups_kept": 1}, "expert_groups and groups_kept must be positive integers, "
     "got 0, 1"),
    ({**_MOE, "expert_groups": 4, "groups_kept": 0}, "expert_groups and groups_kept must be positive integers, "
     "got 4, 0"),
    ({**_MOE, "expert_groups": True, "groups_kept": 1}, "expert_groups and groups_kept must be positive integers, "
     "got True, 1"),
    ({**_MOE, "expert_groups": 4, "groups_kept": 1.0}, "expert_groups and groups_kept must be positive "
     "integers, got 4, 1.0"),
    ({**_MOE, "expert_groups": 3, "groups_kept": 1}, "8 experts do not fall into 3 groups of which 1 are kept"),
    ({**_MOE, "expert_groups": 4, "groups_kept": 5}, "8 experts do not fall into 4 groups of which 5 are kept"),
    ({**_MOE, "top_k": 3, "expert_groups": 4, "groups_kept": 1}, "1 kept groups of 2 experts hold fewer than "
     "top-k 3"),
    (dict(layers=2, dense_layers=3), "dense layers 3 exceed layers 2"),
]


@pytest.mark.parametrize("given, message", REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_a_model_that_breaks_a_rule_is_refused_by_name(given, message):
    with pytest.raises(LayoutError) as info:
        ModelSpec(**given)
    assert str(info.value) == message


@pytest.mark.parametrize("given", [
    dict(hidden=2048, heads=32, head_size=128),  # Qwen3-30B-A3B: a stated head size need not divide hidden
    dict(hidden=np.int64(64), heads=4),  # numpy's integers are whole numbers too
    {**_MLA, "q_lora_rank": None},  # DeepSeek-V2-Lite: no query compression
    {**_MOE, "top_k": 1}, {**_MOE, "top_k": 8},  # top-k from 1 to every expert
    {**_MOE, "expert_groups": 4, "groups_kept": 4},  # every group kept
    {**_MOE, "expert_groups": 1, "groups_kept": 1},  # one group of all the experts
    {**_MOE, "top_k": 4, "expert_groups": 4, "groups_kept": 2},  # kept groups hold exactly top-k experts
    dict(hidden=64, heads=4, expert_groups=4, groups_kept=9),  # a dense copy of an MoE model keeps them, unused
    dict(layers=2, dense_layers=2),
], ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items())[:50])
def test_a_model_at_the_edge_of_each_rule_is_accepted(given):
    m = ModelSpec(**given)
    assert all(getattr(m, k) == v for k, v in given.items())


def test_parameters_counted_by_hand_for_a_small_moe_model():
    m = ModelSpec(layers=3, hidden=16, heads=2, kv_heads=1, vocab=50, ffn=40, experts=4, top_k=2, expert_ffn=24,
                  shared_experts=1, shared_expert_ffn=8, dense_layers=1, gated=True)
    # head size 8: Q and O 16 x 16 each, K and V 16 x 8 each: 768 a layer; a gated MLP is 3 matrices
    assert m.counted() == {
        "attention": 3 * 768,
        "dense mlp": 1 * 3 * 16 * 40,
        "routed experts": 2 * 4 * 3 * 16 * 24,
        "shared experts": 2 * 1 * 3 * 16 * 8,
        "router": 2 * 4 * 16,
        "embeddings": 50 * 16 * 2,
        "norms": 3 * 2 * 16,
    }
    assert m.total_params() == 16032
    # a token passes 2 of the 4 experts and no embedding: 16,032 - 9,216 - 1,600 + 9,216 / 2
    assert m.active_params() == 9824
    # a stated total scales every part alike
    stated = ModelSpec(**{**m.__dict__, "params": 32064.0})
    assert stated.total_params() == 32064.0 and stated.active_params() == 2 * 9824


def test_parameters_counted_by_hand_for_latent_attention():
    m = ModelSpec(layers=2, hidden=16, heads=2, vocab=10, ffn=32, gated=False, tied_embeddings=True,
                  kv_lora_rank=6, q_lora_rank=4, qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=5)
    # queries 16 -> 4 -> 2 x (3 + 2); input 16 -> 6 + 2 (latent and shared rotary key); latent 6 -> 2 x (3 + 5);
    # out 2 x 5 -> 16
    assert m.latent_attention_params() == (16 * 4 + 4 * 2 * 5) + (16 * 8 + 6 * 2 * 8) + 2 * 5 * 16 == 488
    assert m.attention_params() == 488
    assert m.norm_width() == 2 * 16 + 4 + 6
    assert m.counted()["embeddings"] == 10 * 16 and m.counted()["dense mlp"] == 2 * 2 * 16 * 32
    assert m.total_params() == 2 * 488 + 2 * 2 * 16 * 32 + 160 + 2 * 42 == 3268
    assert m.active_params() == 3268 - 160
    # without query compression the queries go straight up: 16 -> 2 x (3 + 2)
    straight = ModelSpec(**{**m.__dict__, "q_lora_rank": None})
    assert straight.latent_attention_params() == 16 * 2 * 5 + (16 * 8 + 6 * 2 * 8) + 2 * 5 * 16
    assert straight.norm_width() == 2 * 16 + 6


def test_what_a_model_lacks_is_named_in_one_line():
    with pytest.raises(LayoutError) as info:
        ModelSpec(name="x", heads=2).require("layers", "hidden", "heads")
    assert str(info.value) == "model x lacks layers, hidden"
    with pytest.raises(LayoutError) as info:
        ModelSpec(hidden=16, heads=2, experts=4).require("hidden")
    assert str(info.value) == "model (unnamed) lacks top_k (an MoE model needs its top-k: --top-k)"
    assert ModelSpec(hidden=16, heads=2, experts=4, top_k=1).require("hidden").k == 1

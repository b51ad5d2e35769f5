"""Hugging Face MoE and MLA configs read by `--config`: real models' configs, built offline from
transformers' config classes, counted against their published parameter totals; what read_hf_config names
as unmodelled; malformed MoE configs refused in one line; the command line on DeepSeek-V3's config."""
import json

import pytest

from parasim.cli import main
from parasim.errors import UsageError
from parasim.estimate.models import from_hf_config, read_hf_config
from parasim.layout import ModelSpec

transformers = pytest.importorskip("transformers")

B = 1e9


def write(tmp_path, cfg, name="config.json"):
    """A config (a transformers config object or a dict) as the config.json a checkpoint ships."""
    path = tmp_path / name
    path.write_text(cfg.to_json_string() if hasattr(cfg, "to_json_string") else json.dumps(cfg))
    return str(path)


def read(tmp_path, cfg):
    return read_hf_config(write(tmp_path, cfg))


def with_embeddings(model):
    """Active parameters as the model cards count them: the embeddings and output head included (without
    them Qwen1.5-MoE-A2.7B's published 2.7B would be 2.1B by its own shapes)."""
    return model.active_params() + model.counted()["embeddings"]


def qwen3_30b_a3b():
    # Qwen3MoeConfig()'s defaults are a 24-layer model without a head_dim (hidden / heads = 64 per head); the
    # Qwen3-30B-A3B model card (huggingface.co/Qwen/Qwen3-30B-A3B) gives 48 layers, and its config.json
    # head_dim 128; the other defaults (hidden 2048, 32 query and 4 kv heads, 128 experts of width 768, top 8,
    # vocabulary 151936, untied) are that checkpoint's.
    return transformers.Qwen3MoeConfig(num_hidden_layers=48, head_dim=128)


# Published totals and active parameters, in billions:
# - DeepSeek-V3: 671B total, 37B activated per token (DeepSeek-V3 Technical Report, arXiv:2412.19437,
#   abstract); the Hub's 685B adds the 14B multi-token prediction module (huggingface.co/deepseek-ai/DeepSeek-V3).
# - Mixtral 8x7B: 46.7B total, 12.9B used per token (Mistral AI, "Mixtral of experts", mistral.ai/news, Dec 2023).
# - Qwen1.5-MoE-A2.7B (Qwen2MoeConfig's defaults): 14.3B total, 2.7B activated (Qwen blog "Qwen1.5-MoE",
#   qwenlm.github.io, Mar 2024; huggingface.co/Qwen/Qwen1.5-MoE-A2.7B).
# - Qwen3-30B-A3B: 30.5B total, 3.3B activated (model card, above).
PUBLISHED = [
    ("deepseek-v3", lambda: transformers.DeepseekV3Config(), 671, 37),
    ("mixtral-8x7b", lambda: transformers.MixtralConfig(), 46.7, 12.9),
    ("qwen1.5-moe-a2.7b", lambda: transformers.Qwen2MoeConfig(), 14.3, 2.7),
    ("qwen3-30b-a3b", qwen3_30b_a3b, 30.5, 3.3),
]


@pytest.mark.parametrize("name, make, total, active", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_totals_within_2_percent(tmp_path, name, make, total, active):
    model = read(tmp_path, make()).model
    assert model.total_params() / (total * B) == pytest.approx(1, abs=0.02)
    assert with_embeddings(model) / (active * B) == pytest.approx(1, abs=0.02)
    assert from_hf_config(write(tmp_path, make())) == model  # the older entry point gives the same model


def test_qwen3_non_embedding_total(tmp_path):
    # the Qwen3-30B-A3B model card also gives 29.9B parameters without the embeddings
    c = read(tmp_path, qwen3_30b_a3b()).model.counted()
    assert (sum(c.values()) - c["embeddings"]) / (29.9 * B) == pytest.approx(1, abs=0.02)


def test_deepseek_v3_latent_attention_one_layer_by_hand(tmp_path):
    model = read(tmp_path, transformers.DeepseekV3Config()).model
    h, heads, q_rank, kv_rank, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128  # the report's Table / config
    q_down, q_up = h * q_rank, q_rank * heads * (nope + rope)
    kv_down = h * (kv_rank + rope)  # the latent and the one rotary key all heads share
    kv_up = kv_rank * heads * (nope + v)
    out = heads * v * h
    assert model.attention_params() == q_down + q_up + kv_down + kv_up + out == 187_105_280
    assert model.head_dim == h // heads  # activations and time: plain multi-head attention of 56 per head
    assert model.counted()["norms"] == 61 * (2 * h + q_rank + kv_rank)


def test_tiny_models_count_what_transformers_builds(tmp_path):
    """Tiny models of each family, built by transformers: their parameters equal the count less what it
    leaves out by design (biases, the final norm, Qwen3's per-head q/k norms, Qwen2-MoE's shared-expert gate)."""
    torch = pytest.importorskip("torch")
    t = transformers
    small = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, num_experts_per_tok=2)
    cases = [
        (t.DeepseekV3ForCausalLM, t.DeepseekV3Config(**small, intermediate_size=48, moe_intermediate_size=16,
                                                     num_hidden_layers=4, num_key_value_heads=4, n_routed_experts=8,
                                                     n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=12,
                                                     kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                                                     v_head_dim=5, n_group=2, topk_group=1)),
        (t.DeepseekV3ForCausalLM, t.DeepseekV3Config(**small, intermediate_size=48, moe_intermediate_size=16,
                                                     num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=4,
                                                     n_shared_experts=2, first_k_dense_replace=0, q_lora_rank=None,
                                                     kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                                                     v_head_dim=5, n_group=1, topk_group=1)),
        (t.MixtralForCausalLM, t.MixtralConfig(**small, intermediate_size=24, num_hidden_layers=3,
                                               num_key_value_heads=2, num_local_experts=4)),
        (t.Qwen2MoeForCausalLM, t.Qwen2MoeConfig(**small, intermediate_size=40, moe_intermediate_size=12,
                                                 shared_expert_intermediate_size=28, num_hidden_layers=4,
                                                 num_key_value_heads=2, num_experts=6, decoder_sparse_step=2,
                                                 mlp_only_layers=[3])),
        (t.Qwen3MoeForCausalLM, t.Qwen3MoeConfig(**small, intermediate_size=40, moe_intermediate_size=12,
                                                 num_hidden_layers=3, num_key_value_heads=2, head_dim=12,
                                                 num_experts=6)),
    ]
    for cls, cfg in cases:
        torch.manual_seed(0)
        built = dict(cls(cfg).named_parameters())
        left_out = sum(p.numel() for n, p in built.items()
                       if n.endswith(".bias") or n == "model.norm.weight" or "q_norm" in n or "k_norm" in n
                       or "shared_expert_gate" in n)
        model = read(tmp_path, cfg).model
        assert model.total_params() == sum(p.numel() for p in built.values()) - left_out, cls.__name__
    # the Qwen2-MoE case: layers 0, 2 (decoder_sparse_step 2) and 3 (mlp_only_layers) are dense
    assert read(tmp_path, cases[3][1]).model.dense_layers == 3


def test_fields_read(tmp_path):
    got = read(tmp_path, transformers.MixtralConfig())
    assert list(got.used) == ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                              "num_key_value_heads", "intermediate_size", "num_local_experts",
                              "num_experts_per_tok", "hidden_act", "model_type", "tie_word_embeddings"]
    assert got.used["num_local_experts"] == 8 and got.used["intermediate_size"] == 14336
    m = got.model  # every layer an MoE layer; intermediate_size is each expert's width
    assert (m.experts, m.top_k, m.expert_size, m.dense_layers, m.counted()["dense mlp"]) == (8, 2, 14336, 0, 0)
    ds = read(tmp_path, transformers.DeepseekV3Config())
    assert {k: ds.used[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                    "v_head_dim", "n_routed_experts", "first_k_dense_replace")} == \
        {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
         "v_head_dim": 128, "n_routed_experts": 256, "first_k_dense_replace": 3}
    assert "head_dim" not in ds.used  # DeepSeek's head_dim is the rotary part's: latent attention's sizes rule
    qwen2 = read(tmp_path, transformers.Qwen2MoeConfig()).model
    assert (qwen2.shared_experts, qwen2.shared_expert_ffn, qwen2.expert_ffn) == (1, 5632, 1408)
    assert qwen2.counted()["shared experts"] == 24 * 3 * 2048 * 5632
    qwen3 = read(tmp_path, qwen3_30b_a3b()).model
    assert qwen3.head_dim == 128 and qwen3.attention_params() == 2048 * 32 * 128 * 2 + 2048 * 2 * 4 * 128
    assert read(tmp_path, transformers.LlamaConfig()).model.head_size is None  # head_dim 128 = 4096 / 32


def test_unmodelled_lines(tmp_path):
    def lines(cfg):
        return read(tmp_path, cfg).unmodelled

    ds = lines(transformers.DeepseekV3Config())
    assert [line.split(" ")[0] for line in ds] == ["kv_lora_rank", "num_nextn_predict_layers"]
    assert "multi-token prediction" in ds[1] and "of 56" in ds[0]
    # group-limited routing is read into the model (8 groups of 32 experts, 4 kept: DeepSeek-V3's config);
    # groups that do not divide the experts are named, not read
    got = read(tmp_path, transformers.DeepseekV3Config())
    assert (got.model.expert_groups, got.model.groups_kept) == (8, 4)
    assert (got.used["n_group"], got.used["topk_group"]) == (8, 4)
    three = read(tmp_path, transformers.DeepseekV3Config(n_group=8, topk_group=3)).model
    assert (three.expert_groups, three.groups_kept) == (8, 3)  # DeepSeek-V2's
    odd = lines(transformers.DeepseekV3Config(n_group=3, topk_group=2))
    assert odd[-1].startswith("n_group 3, topk_group 2") and "256 experts" in odd[-1]
    assert read(tmp_path, transformers.DeepseekV3Config(n_group=3, topk_group=2)).model.expert_groups is None
    assert lines(transformers.DeepseekV3Config(num_nextn_predict_layers=0, topk_group=8))[1:] == []
    assert lines(transformers.LlamaConfig()) == [] and lines(transformers.MixtralConfig()) == []
    assert lines(transformers.Qwen2MoeConfig()) == []  # its wider shared expert is modelled (test below)
    assert [line.split(" ")[0] for line in lines(qwen3_30b_a3b())] == ["head_dim"]
    assert lines(transformers.Qwen3MoeConfig()) == []  # no head_dim: hidden / heads, as the model code does
    # the dense layers not at the start: counted, but not where the pipeline split puts them
    pattern = lines(transformers.Qwen2MoeConfig(num_hidden_layers=4, decoder_sparse_step=2))
    assert len(pattern) == 1 and pattern[0].startswith("2 dense-MLP layers at 0, 2 of 4")
    assert lines(transformers.Qwen2MoeConfig(num_hidden_layers=4, mlp_only_layers=[0, 1])) == []  # leading
    llama = json.loads(transformers.LlamaConfig().to_json_string())
    assert "every layer" in lines({**llama, "sliding_window": 4096})[0]
    assert lines({**llama, "sliding_window": 4096, "use_sliding_window": False}) == []
    assert "on 12 of 24 layers" in lines(transformers.Qwen2MoeConfig(use_sliding_window=True))[-1]
    assert lines({**llama, "routed_scaling_factor": 2.5, "initializer_range": 0.02, "n_group": 8}) == []


MIXTRAL = json.loads(transformers.MixtralConfig().to_json_string())


@pytest.mark.parametrize("change, needle", [
    ({"num_experts_per_tok": 9}, "top-k must be between 1 and experts 8, got 9"),
    ({"num_local_experts": "8"}, "experts must be an integer from 0"),
    ({"head_dim": "128"}, "head_dim must be an integer from 1"),
    ({"kv_lora_rank": 64, "qk_nope_head_dim": 16}, "lacks qk_rope_head_dim, v_head_dim"),
    ({"kv_lora_rank": 64.5}, "kv_lora_rank must be an integer"),
    ({"shared_expert_intermediate_size": -1}, "shared_expert_intermediate_size must be an integer from 0"),
    ({"mlp_only_layers": [40]}, "mlp_only_layers must be a list of layer indices from 0 to 31"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be an integer from 1"),
    ({"hidden_size": 4100}, "hidden 4100 does not divide by heads 32"),
])
def test_malformed_moe_config_is_one_line(tmp_path, capsys, change, needle):
    path = write(tmp_path, {**MIXTRAL, **change})
    with pytest.raises(UsageError, match=needle):
        read_hf_config(path)
    assert main(["memory", "--config", path, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err, err


def test_new_sizes_leave_models_without_them_unchanged():
    plain = ModelSpec("m", layers=2, hidden=8, heads=2, vocab=10, experts=4, top_k=2, expert_ffn=6, shared_experts=1)
    assert "head_size" not in plain.to_dict() and plain.head_dim == 4 and not plain.latent
    wide = ModelSpec("w", layers=2, hidden=8, heads=3, vocab=10, head_size=5, experts=4, top_k=2, expert_ffn=6,
                     shared_experts=1, shared_expert_ffn=7)
    assert wide.attention_params() == 8 * 15 * 2 + 8 * 2 * 3 * 5
    assert wide.counted()["shared experts"] == 2 * 1 * 2 * 8 * 7
    assert wide.to_dict()["head_size"] == 5 and wide.to_dict()["shared_expert_ffn"] == 7
    with pytest.raises(UsageError, match="need its kv_lora_rank"):
        ModelSpec("x", layers=1, hidden=8, heads=2, vocab=4, q_lora_rank=4)
    with pytest.raises(UsageError, match="exclude each other"):
        ModelSpec("x", layers=1, hidden=8, heads=2, vocab=4, head_size=4, kv_lora_rank=2, qk_nope_head_dim=2,
                  qk_rope_head_dim=2, v_head_dim=2)


def test_memory_command_on_deepseek_v3(tmp_path, capsys):
    """The acceptance line: `parasim memory --config` on DeepSeek-V3's config counts 671B within 2%."""
    path = write(tmp_path, transformers.DeepseekV3Config())
    assert main(["memory", "--config", path, "--zero", "0", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    # one GPU, ZeRO 0: it holds 2 bytes of weights per parameter
    total = got["items"]["weights"] * got["unit_bytes"] / 2
    assert total / (671 * B) == pytest.approx(1, abs=0.02)
    # TP 8 with SP and EP 64 on 512 GPUs, PP 1 (uneven stages: tests/unit/clock/test_uneven_stages.py): the routed experts
    # split over EP, the rest over TP
    assert main(["memory", "--config", path, "--tp", "8", "--sp", "--ep", "64", "--gpus", "512", "--zero", "0",
                 "--json"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert (split["layout"]["tp"], split["layout"]["ep"], split["layout"]["dp"]) == (8, 64, 64)
    routed = 58 * 256 * 3 * 7168 * 2048  # 58 MoE layers of 256 SwiGLU experts of width 2048
    expect = 2 * ((total - routed) / 8 + routed / 64)
    assert split["items"]["weights"] * split["unit_bytes"] == pytest.approx(expect, rel=1e-9)


def test_a_wider_shared_expert_reaches_the_activations_and_the_clock():
    # Qwen1.5-MoE: one shared expert 4 x the routed width. Taken at its own width, the shared expert adds
    # 2 x mats x (5632 - 1408) x 2 bytes per token of activations, and the same ratio of product FLOPs
    from dataclasses import replace
    from parasim.clock.plan import layer_forward, machine_of
    from parasim.estimate.memory import Plan, breakdown
    wide = ModelSpec("wide", layers=2, hidden=2048, heads=16, vocab=1000, experts=4, top_k=2, expert_ffn=1408,
                     shared_experts=1, shared_expert_ffn=5632, gated=True)
    narrow = replace(wide, shared_expert_ffn=None)
    plan = Plan(world=1, dropout=False).check(wide, 1024)
    acts = [breakdown(m, plan, 1024).items["activations"] for m in (wide, narrow)]
    per_token = 2 * 3 * (5632 - 1408)  # bytes per token and MoE layer: three matrices' inputs, 2 bytes each
    assert acts[0] - acts[1] == pytest.approx(per_token * 1024 * 2)  # 1,024 tokens, both layers MoE
    m = machine_of("h200", 8)
    fwd = [layer_forward(x, plan, 1024, m, True)["matmul"] for x in (wide, narrow)]
    # the shared expert's two products (gate and up together, 1,024 x 2,048 @ 2,048 x 2w; down, 1,024 x w @
    # w x 2,048), each at the share of peak the measured GEMM table gives its shape
    from parasim.estimate.kernels import gemm_efficiency

    def product(mm, n, k):
        return 2 * mm * n * k / (m.peak_flops * gemm_efficiency("h200", mm, n, k).value)

    def shared(w):
        return product(1024, 2 * w, 2048) + product(1024, 2048, w)
    assert fwd[0] - fwd[1] == pytest.approx(shared(5632) - shared(1408))
    assert fwd[0] - fwd[1] > 2 * 1024 * 3 * 2048 * (5632 - 1408) / m.peak_flops  # the extra FLOPs, below peak

"""The estimator's traffic, FLOPs and time on tiny models, each figure worked out by hand in the test.

Ring collectives over t ranks on an N-byte buffer: an all-reduce sends 2(t-1)/t * N per rank, an all-gather
or reduce-scatter (t-1)/t * N; with t = 2 that is N and N/2.

TINY (4 layers, hidden 8, 2 heads, vocabulary 16, FFN 4h = 32, no stated count) has per layer attention
4h^2 = 256, MLP 2*h*4h = 512 and norms 2h = 16 parameters: 784; 4 layers 3136; embeddings 2*16*8 = 256;
3392 in all. TINY_MOE (2 layers, 4 experts top-2) has attention 2*256 = 512, routed experts 2*4*512 = 4096,
router 2*4*8 = 64, embeddings 256, norms 2*2*8 = 32: 4960 in all, 4096 of them experts, 864 dense.
"""
import pytest

from parasim.estimate import Plan
from parasim.layout import SPREAD, ModelSpec
from parasim.estimate.traffic import (GpuSpec, attention_flops, dp_traffic, ep_bytes_from_routing, ep_expected_bytes,
                                      ep_expected_rows, gpu_presets, inside_node, layer_traffic, moe_traffic, ring,
                                      step_flops, step_traffic)

TINY = ModelSpec("tiny", layers=4, hidden=8, heads=2, vocab=16)
TINY5 = ModelSpec("tiny5", layers=5, hidden=8, heads=2, vocab=16, stages=SPREAD)  # 5*784 + 256 = 4176
TINY_MOE = ModelSpec("tiny-moe", layers=2, hidden=8, heads=2, vocab=16, experts=4, top_k=2)


def test_gpu_presets_are_the_datasheet_figures():
    # one 400 Gb/s NIC per GPU is 50e9 bytes/s (A100: 200 Gb/s, 25e9); NVLink per direction per GPU (half the
    # datasheets' both-ways 900 and 600 GB/s); dense BF16 is half the "with sparsity" 1,979 TFLOPS; HBM 4.8 TB/s,
    # 3.35 TB/s, 2,039 GB/s; the H800 is the H100 with NVLink at 400 GB/s both ways
    assert gpu_presets() == {
        "h200": GpuSpec("H200", 141e9, 120e9, 989e12, 450e9, 50e9, 8, 4.8e12),
        "h100": GpuSpec("H100", 80e9, 68e9, 989e12, 450e9, 50e9, 8, 3.35e12),
        "h800": GpuSpec("H800", 80e9, 68e9, 989e12, 200e9, 50e9, 8, 3.35e12),
        "a100": GpuSpec("A100 80GB", 80e9, 68e9, 312e12, 300e9, 25e9, 8, 2.039e12),
        # the DGX B200 user guide's 1,440 GB and 14.4 TB/s over 8 GPUs; 2,250 dense BF16 and 8 TB/s as printed
        "b200": GpuSpec("B200", 180e9, 153e9, 2250e12, 900e9, 50e9, 8, 8e12),
    }


@pytest.mark.parametrize("op, t, want", [
    ("all_reduce", 4, 150.0),  # 2 * 3/4 * 100
    ("all_gather", 4, 75.0),  # 3/4 * 100
    ("reduce_scatter", 2, 50.0),  # 1/2 * 100
    ("all_reduce", 1, 0.0),  # one rank: nothing to send
])
def test_ring_bytes_per_rank(op, t, want):
    assert ring(op, 100.0, t) == want


def test_layer_traffic_rmsnorm_without_bias_reduces_only_the_norm_grads():
    # TP2 + SP, 4 tokens of h = 8 at 2 bytes: a 64-byte activation, gathered 6 times (32 each), scattered 4.
    # RMSNorm (1 parameter per channel) and no bias: 2 norm weights' 16-byte grads all-reduced, 16 each.
    assert layer_traffic(8, 2, 4, 2, True, 1, bias=False, norm_params=1) == {
        ("tp", "all_gather"): 6 * 32, ("tp", "reduce_scatter"): 4 * 32, ("tp", "all_reduce"): 2 * 16}
    assert layer_traffic(8, 2, 4, 1, False, 1) == {}  # no TP, no CP: a layer sends nothing


def test_layer_traffic_full_recompute_repeats_the_forward_all_reduces():
    # TP2 without SP: 2 forward all-reduces (run twice) + 2 backward = 6, of a 64-byte activation: 64 each
    assert layer_traffic(8, 2, 4, 2, False, 1, recompute=True) == {("tp", "all_reduce"): 6 * 64}


@pytest.mark.parametrize("recompute, hops", [(False, 20), (True, 26)])
def test_layer_traffic_ring_attention_over_cp4(recompute, hops):
    # 4 tokens, h 8, no TP: K and V are 4*8*2 = 64 bytes each. CP4: K and V go 3 hops forward (6 sends, twice
    # with recomputation), backward K, V, dK, dV 3 hops each (12), and dK, dV one more hop home (2).
    assert layer_traffic(8, 2, 4, 1, False, 4, recompute=recompute) == {("cp", "p2p"): hops * 64}


@pytest.mark.parametrize("zero, want", [
    (0, {("dp", "all_reduce"): 150.0}),  # 100 bytes over 4 ranks: 2 * 3/4 * 100
    (1, {("dp", "reduce_scatter"): 75.0, ("dp", "all_gather"): 75.0}),
    (2, {("dp", "reduce_scatter"): 75.0, ("dp", "all_gather"): 75.0}),  # ZeRO-2 moves what ZeRO-1 moves
    (3, {("dp", "reduce_scatter"): 75.0, ("dp", "all_gather"): 150.0}),  # gathered for forward and backward
])
def test_dp_traffic_per_zero_stage(zero, want):
    assert dp_traffic(50, 4, zero) == want  # 50 params at the default 2 bytes = 100 bytes
    assert dp_traffic(50, 1, zero) == {}  # nothing to shard over


# -- one step ------------------------------------------------------------------------------------------
def test_step_tp_and_dp_all_reduce():
    # 4 tokens * h 8 * 2 bytes = 64-byte activation; 4 all-reduces per layer (2 forward, 2 backward) of 64
    # bytes over TP2 send 64 each: 256 a layer, 1024 for 4 layers. DP2: 3392/2 = 1696 params, 3392 bytes,
    # all-reduced over 2: 3392.
    assert step_traffic(TINY, Plan(tp=2, dp=2, zero=0), 4) == {("tp", "all_reduce"): 1024.0,
                                                               ("dp", "all_reduce"): 3392.0}


def test_step_sp_cp_full_recompute_zero3_at_4_bytes():
    # seq 8, micro-batch 2, CP2: 8 tokens per rank; at 4 bytes the activation is 8*8*4 = 256 bytes and one
    # TP2 gather or scatter of it sends 128. Full recomputation runs the forward's collectives twice:
    # gathers 2*2 + 4 = 8 (1024), scatters 2*2 + 2 = 6 (768); norm+bias grads: 6 all-reduces of 8*4 = 32
    # bytes send 32 each (192). Ring attention: K/V of this rank's heads, 8 tokens * 8/2 * 4 = 128 bytes,
    # 2*2 hops forward (twice), 4 backward, 2 home: 10 * 128 = 1280. Times 4 layers.
    # DP x CP = 2, ZeRO-3: 1696 params * 4 = 6784 bytes, scattered once (3392), gathered twice (6784).
    got = step_traffic(TINY, Plan(tp=2, sp=True, cp=2, micro_batch=2, recompute="full", zero=3), 8, itemsize=4)
    assert got == {("tp", "all_gather"): 4096.0, ("tp", "reduce_scatter"): 3072.0, ("tp", "all_reduce"): 768.0,
                   ("cp", "p2p"): 5120.0, ("dp", "reduce_scatter"): 3392.0, ("dp", "all_gather"): 6784.0}


def test_step_uneven_pipeline_counts_the_first_stages_layers_and_every_microbatch():
    # 5 layers on PP2: the busiest stage holds 3. Three micro-batches of 4 tokens: TP all-reduces 256 bytes
    # a layer (as above) * 3 layers * 3 = 2304. Two stages: each micro-batch's 64-byte activation (no SP)
    # crosses once: 192. DP2 over TP2 x PP2: 4176/4 = 1044 params, 2088 bytes: ZeRO-1 scatters and gathers
    # half each.
    got = step_traffic(TINY5, Plan(tp=2, pp=2, dp=2, microbatches=3), 4)
    assert got == {("tp", "all_reduce"): 2304.0, ("pp", "p2p"): 192.0,
                   ("dp", "reduce_scatter"): 1044.0, ("dp", "all_gather"): 1044.0}


def test_step_pipeline_activation_is_split_by_sp():
    # SP leaves each TP rank 4/2 tokens: 2 * 8 * 2 = 32 bytes per micro-batch, 2 micro-batches (m = pp)
    assert step_traffic(TINY, Plan(tp=2, sp=True, pp=2), 4)[("pp", "p2p")] == 64.0


def test_step_moe_with_sp_routes_the_sp_share_and_reduces_experts_over_edp():
    # seq 8 on TP2 + SP: a 128-byte activation; attention alone is TP-split in an MoE layer: gathers 3 * 64,
    # scatters 2 * 64; grads summed over TP: two norms' weights and biases, attention's row bias and the
    # router's 4 rows, 9 * 16; times 2 layers. Each rank routes its SP share, 4 tokens, to 2 experts, half remote:
    # 4*2*8*2/2 = 64 bytes an all-to-all, 4 of them a layer: 512 for 2 layers. DP2 reduces the dense
    # 864/2 = 432 params (864 bytes); the experts, 4096/EP2 = 2048 params (4096 bytes), are reduced over
    # the expert-data group of world 4 / EP2 = 2.
    got = step_traffic(TINY_MOE, Plan(tp=2, sp=True, ep=2, dp=2, zero=0), 8)
    assert got == {("tp", "all_gather"): 384.0, ("tp", "reduce_scatter"): 256.0, ("tp", "all_reduce"): 288.0,
                   ("ep", "all_to_all"): 512.0, ("dp", "all_reduce"): 864.0, ("edp", "all_reduce"): 4096.0}


def test_step_moe_pipeline_full_recompute_zero3():
    # PP2, DP4, EP2: world 8, one (MoE) layer per stage, 3 micro-batches of 8 tokens, no TP. All 8 tokens
    # routed: 8*2*8*2/2 = 128 bytes an all-to-all, 6 of them with the forward run twice: 768 * 3 = 2304.
    # PP: 128-byte activation * 3. Dense 864/2 = 432 params, 864 bytes over DP4 (ZeRO-3): scatter 3/4 = 648,
    # gathers 2 * 648. Experts 4096/(EP2 * PP2) = 1024 params, 2048 bytes over 8/(2*2) = 2: 1024, 2 * 1024.
    got = step_traffic(TINY_MOE, Plan(pp=2, dp=4, ep=2, zero=3, recompute="full", microbatches=3), 8)
    assert got == {("ep", "all_to_all"): 2304.0, ("pp", "p2p"): 384.0,
                   ("dp", "reduce_scatter"): 648.0, ("dp", "all_gather"): 1296.0,
                   ("edp", "reduce_scatter"): 1024.0, ("edp", "all_gather"): 2048.0}


def test_step_expert_reduction_uses_the_item_size():
    # DP4 x EP2: experts 4096/2 = 2048 params at 4 bytes, 8192 bytes all-reduced over 4/2 = 2 ranks: 8192
    got = step_traffic(TINY_MOE, Plan(dp=4, ep=2, zero=0), 8, itemsize=4)
    assert got[("edp", "all_reduce")] == 8192.0


# -- MoE all-to-alls -----------------------------------------------------------------------------------
def test_moe_traffic_pair_count_and_dedup_figure():
    # 4 tokens to 2 of 4 experts over EP2, h 8, 2 bytes: 4*2*8*2 * 1/2 = 64 per all-to-all, 4 a layer
    assert moe_traffic(8, 4, 2, 2) == {("ep", "all_to_all"): 256.0}
    assert moe_traffic(8, 4, 2, 2, recompute=True) == {("ep", "all_to_all"): 384.0}  # 6 passes
    assert moe_traffic(8, 4, 2, 1) == {}
    # dedup: a token skips the other GPU only if both picks land home, C(2,2)/C(4,2) = 1/6: 4 * 5/6 = 10/3
    # rows; dispatch rows carry h + 2 gates (20 bytes), combine rows h (16): 36 bytes a row each way,
    # forward (once, or twice with recompute) plus backward.
    got = moe_traffic(8, 4, 2, 2, experts=4)
    assert got[("ep", "all_to_all_dedup")] == pytest.approx(2 * 36 * 10 / 3)
    got = moe_traffic(8, 4, 2, 2, recompute=True, experts=4)
    assert got[("ep", "all_to_all_dedup")] == pytest.approx(3 * 36 * 10 / 3)


@pytest.mark.parametrize("tokens, k, experts, ep, want", [
    (4, 2, 4, 2, 10 / 3),  # see above
    (8, 1, 4, 4, 6.0),  # one expert per GPU, one pick: 3/4 of the 8 tokens leave
    (8, 2, 4, 1, 0.0),  # one GPU: nothing leaves
])
def test_ep_expected_rows(tokens, k, experts, ep, want):
    assert ep_expected_rows(tokens, k, experts, ep) == pytest.approx(want)


def test_ep_expected_bytes_default_two_bytes():
    rows = 10 / 3  # as above; wide rows h 8 + 2 gates, narrow rows h 8, at 2 bytes
    got = ep_expected_bytes(4, 2, 4, 2, 8)
    assert got == pytest.approx({"dispatch": rows * 20, "combine": rows * 16, "combine backward": rows * 16,
                                 "dispatch backward": rows * 20})


def test_ep_bytes_from_a_hand_routing():
    # EP2, 4 experts (0-1 on rank 0, 2-3 on rank 1), h 3, 2 bytes: dispatch rows (3 + 2 gates) * 2 = 10 bytes,
    # combine rows 6. Rank 0: [0,1] stays home, [0,2] and [2,3] each send one row to rank 1 (two experts on
    # one GPU share the row). Rank 1: [3,2] stays, [1,2] sends one row to rank 0.
    routing = [[[0, 1], [0, 2], [2, 3]], [[3, 2], [1, 2]]]
    assert ep_bytes_from_routing(routing, 2, 4, 3) == [
        {"dispatch": 20, "combine": 6, "combine backward": 12, "dispatch backward": 10},
        {"dispatch": 10, "combine": 12, "combine backward": 6, "dispatch backward": 20}]


@pytest.mark.parametrize("routing, ep, experts", [
    ([[[0]]], 2, 4),  # one routing for two ranks
    ([[[0]], [[1]]], 2, 3),  # 3 experts do not split over 2 ranks
])
def test_ep_bytes_from_routing_rejects_bad_shapes(routing, ep, experts):
    with pytest.raises(ValueError, match="EP rank"):
        ep_bytes_from_routing(routing, ep, experts, 3)


# -- FLOPs and time ------------------------------------------------------------------------------------
def test_attention_flops_bidirectional_and_selective():
    # QK^T and PV: 4 s^2 h per layer; s 4, h 8, 4 layers: 2048 without a causal mask
    assert attention_flops(TINY, 4, causal=False) == 2048 * 3  # forward + backward (twice forward)
    assert attention_flops(TINY, 4, "selective", causal=False) == 2048 * 4  # scores recomputed
    assert attention_flops(TINY, 4) == 1024 * 3  # causal halves it


@pytest.mark.parametrize("recompute, lin_passes, attn_passes", [
    ("none", 3, 3), ("selective", 3, 4), ("full", 4, 4)])
def test_step_flops(recompute, lin_passes, attn_passes):
    # 2 sequences a micro-batch * 3 micro-batches * DP2 = 12 sequences of 4 tokens. Matmuls: 2 FLOPs per
    # parameter per token over the 3136 non-embedding params and the 16*8 output head: 2*3264*4 = 26112 a
    # sequence forward. Causal scores: 4 * 4^2 * 8 * 4 layers / 2 = 1024 forward.
    got = step_flops(TINY, Plan(dp=2, micro_batch=2, microbatches=3, recompute=recompute), 4)
    lin, attn = 26112 * lin_passes * 12, 1024 * attn_passes * 12
    assert got == {"matmul": lin, "attention": attn, "total": lin + attn}


@pytest.mark.parametrize("plan, axis, node, inside", [
    (Plan(tp=4), "tp", 4, True),  # a group exactly the node's size fits
    (Plan(tp=4), "tp", 2, False),
    (Plan(tp=2, cp=2), "cp", 4, True),  # the CP group spans tp x cp
    (Plan(tp=2, cp=4), "cp", 4, False),
    (Plan(tp=2, cp=2, dp=2), "dp", 8, True),  # the DP group spans tp x cp x dp
    (Plan(tp=2, cp=2, dp=2), "dp", 4, False),
    (Plan(tp=2, pp=2), "pp", 4, True),  # PP is outermost: it spans the world
    (Plan(tp=2, pp=2), "pp", 2, False),
    (Plan(dp=4, ep=4), "ep", 4, True),  # the EP group spans etp x ep
    (Plan(dp=4, ep=4), "ep", 2, False),
    (Plan(tp=2, dp=4, pp=2), "edp", 8, True),  # expert-data: one stage's ranks, 16 / 2
    (Plan(tp=2, dp=4, pp=2), "edp", 4, False),
])
def test_inside_node(plan, axis, node, inside):
    assert inside_node(plan, axis, node) is inside

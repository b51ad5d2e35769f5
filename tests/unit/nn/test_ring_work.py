"""Ring attention's bookkeeping worked out by hand: the blocks, flops and K/V owners of each ring step,
the labels and dtypes of its hops, and the sizes its splits accept."""

import pytest

import parasim
from parasim.nn.ring_attention import RingAttention, positions

B, HEADS, D = 2, 3, 5


def _run(seq: int, dtype: str = "float64"):
    def program(ctx):
        ring = RingAttention(ctx, ctx.new_group(range(2), "cp"), seq)  # the defaults: contiguous, causal
        x = ctx.xp.take(ctx.shared_rng("x").normal((B, HEADS, seq, D)), ctx.xp.asarray(ring.pos[ring.r]), axis=2)
        x = x.astype(dtype)
        out, cache = ring.forward(x, x, x)
        ring.backward(cache, out)
        return ring.work
    return parasim.run(program, 2)


def test_contiguous_causal_work_by_hand():
    """cp = 2, 8 tokens: the fine split has 4 chunks of 2. Rank 0 holds chunks {0, 1}: against its own
    keys a half diagonal, a full block and another half diagonal (2 blocks); rank 1's keys all come later
    (skipped). Rank 1 holds {2, 3}: 2 blocks on its own keys, then all 4 blocks of rank 0's. A block is
    4*b*heads*2*2*d = 480 flops (QK^T and PV, two flops per multiply-add)."""
    res = _run(8)
    w0, w1 = res.values
    assert (w0.steps, w0.held, w0.blocks, w0.skipped, w0.flops) == ([2.0, 0.0], [0, 1], 2.0, 1, 960.0)
    assert (w1.steps, w1.held, w1.blocks, w1.skipped, w1.flops) == ([2.0, 4.0], [1, 0], 6.0, 0, 2880.0)
    attend = [(e.members[0].rank, e.params["flops"]) for e in res.trace.events if e.kind == "compute"]
    assert sorted(attend) == [(0, 0), (0, 960.0), (1, 960.0), (1, 1920.0)]


def test_uneven_fine_split_counts_in_cp_chunks():
    """6 tokens do not split 4 ways, so blocks are counted in the cp-way chunks of 3: rank 0 does half its
    diagonal; rank 1 half its own and all of rank 0's block, 4*2*3*3*3*5 = 1080 flops a block."""
    w0, w1 = _run(6).values
    assert (w0.steps, w0.flops) == ([0.5, 0.0], 540.0)
    assert (w1.steps, w1.flops) == ([0.5, 1.0], 1620.0)


def test_every_hop_is_labelled_and_typed():
    """Forward: each rank passes its own chunk's K and V on; backward: K, V, dK and dV of the chunk it holds,
    then the dK and dV it ends with (CP rank r + 1's, two ranks round) brought home. Each transfer names its
    tensor and whose chunk it is. A float32 run receives float32."""
    res = _run(8, "float32")
    p2p = [e for e in res.trace.events if e.kind == "p2p"]
    by_sender = {(e.params["src"], e.label) for e in p2p}
    forward = {(r, f"ring: pass {t} of CP rank {r} on") for r in (0, 1) for t in ("K", "V")}
    backward = {(r, f"ring backward: pass {t} of CP rank {r} on") for r in (0, 1) for t in ("K", "V", "dK", "dV")}
    home = {(r, f"ring backward: {t} of CP rank {1 - r} home") for r in (0, 1) for t in ("dK", "dV")}
    assert by_sender == forward | backward | home and len(p2p) == 4 + 8 + 4
    order = [e.label.split(": ")[0] + (" home" if e.label.endswith("home") else "") for e in p2p]
    assert list(dict.fromkeys(order)) == ["ring", "ring backward", "ring backward home"]  # in this order
    assert {t.dtype for e in p2p for m in e.members for t in m.outs} == {"float32"}


@pytest.mark.parametrize("split, seq, cp, ok", [("zigzag", 6, 2, False), ("zigzag", 8, 2, True),
                                                ("contiguous", 6, 2, True), ("contiguous", 7, 2, False)])
def test_split_sizes(split, seq, cp, ok):
    """Zigzag cuts the sequence into 2*cp chunks, contiguous into cp."""
    if ok:
        assert sorted(sum((positions(split, seq, cp, r) for r in range(cp)), [])) == list(range(seq))
    else:
        with pytest.raises(ValueError, match=f"sequence {seq} does not divide by "
                                             + ("2\\*cp" if split == "zigzag" else "cp$")):
            positions(split, seq, cp, 0)


def test_a_layer_names_its_ring():
    """Inside a transformer layer the ring carries the attention block's name, so a trace says whose K/V
    moved; and the layer's ring is causal (a contiguous split skips the later rank's keys)."""
    from parasim.layout import Layout
    from parasim.nn import Saved, ParallelContext
    from parasim.nn.layer import TransformerLayer, layer_weights
    from parasim.layout import ModelSpec
    shape = ModelSpec(hidden=4, heads=2, dropout=0.0)

    def program(ctx):
        t = ParallelContext(ctx, None, cp_group=ctx.groups["cp"], seq=4, cp_split="contiguous")
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0", name="L0")
        x = ctx.xp.take(ctx.shared_rng("x").normal((4, 1, 4)), ctx.xp.asarray(t.token_positions()), axis=0)
        y, cache = layer.forward(x, Saved())
        layer.backward(cache, y)
    res = parasim.run(program, layout=Layout(cp=2))
    rings = {e.label.split(": ")[0] for e in res.trace.events if e.kind == "p2p"}
    assert rings == {"L0.attn.ring backward", "L0.attn.ring"}
    skips = [e.op for e in res.trace.events if e.kind == "compute" and ": skip " in e.op]
    assert skips == ["L0.attn.ring: skip K/V of CP rank 1"]


def test_a_ring_without_a_group_is_one_ranks_whole_sequence():
    """No CP group: one rank (cp 1, rank 0) holding every position, in one chunk."""
    def program(ctx):
        ring = RingAttention(ctx, None, 4)
        return ring.cp, ring.r, ring.pos

    assert parasim.run(program, 1).values[0] == (1, 0, [[0, 1, 2, 3]])


def test_each_rank_of_a_ring_of_four_passes_on_to_the_next_and_hears_from_the_one_before():
    def program(ctx):
        return RingAttention(ctx, ctx.new_group([3, 1, 0, 2], "cp"), 8)._peers()

    # the ring in group order 3 -> 1 -> 0 -> 2 -> 3: (next, previous) of each global rank 0..3
    assert parasim.run(program, 4).values == [(2, 1), (0, 3), (3, 0), (1, 2)]

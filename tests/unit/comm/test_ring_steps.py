"""The ring's schedule as data (comm/ring.py's `ring_steps`): the table against tables written out by hand, a
small simulation of its own (chunks as lists of whose parts they hold) showing what the steps achieve, the byte
counts read from it, and virtual ranks against gloo on every ring collective."""
import numpy as np
import pytest

import parasim
from parasim.comm.interface import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Group, ring_bytes
from parasim.comm.ring import ring_all_gather, ring_reduce_scatter, ring_steps
from parasim.engine.real import RealOptions, run_real

KINDS = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)


def _rows(steps):
    return [(s.phase, s.hop, s.reduce, s.send, s.to, s.recv, s.source) for s in steps]


def test_three_members_all_reduce_by_hand():
    """t = 3: member i sends to i+1 and receives from i-1. Reduce-scatter: at step k member i sends chunk
    i-1-k, the chunk member i-1 sends to it being i-2-k; all-gather: member i sends chunk i-k."""
    to, source = (1, 2, 0), (2, 0, 1)
    assert _rows(ring_steps(3, ALL_REDUCE)) == [
        ("reduce-scatter", 0, True, (2, 0, 1), to, (1, 2, 0), source),
        ("reduce-scatter", 1, True, (1, 2, 0), to, (0, 1, 2), source),
        ("all-gather", 0, False, (0, 1, 2), to, (2, 0, 1), source),
        ("all-gather", 1, False, (2, 0, 1), to, (1, 2, 0), source)]


def test_two_and_four_members_by_hand():
    assert _rows(ring_steps(2, REDUCE_SCATTER)) == [("reduce-scatter", 0, True, (1, 0), (1, 0), (0, 1), (1, 0))]
    assert _rows(ring_steps(2, ALL_GATHER)) == [("all-gather", 0, False, (0, 1), (1, 0), (1, 0), (1, 0))]
    rs = ring_steps(4, REDUCE_SCATTER)
    assert [s.send for s in rs] == [(3, 0, 1, 2), (2, 3, 0, 1), (1, 2, 3, 0)]
    assert [s.recv for s in rs] == [(2, 3, 0, 1), (1, 2, 3, 0), (0, 1, 2, 3)]  # the last: each its own chunk
    ag = ring_steps(4, ALL_GATHER)
    assert [s.send for s in ag] == [(0, 1, 2, 3), (3, 0, 1, 2), (2, 3, 0, 1)]
    assert {s.to for s in rs + ag} == {(1, 2, 3, 0)} and {s.source for s in rs + ag} == {(3, 0, 1, 2)}


def test_one_member_has_no_steps_and_all_reduce_is_the_two_halves():
    assert all(ring_steps(1, kind) == () for kind in KINDS)
    for t in (2, 3, 4, 5):
        assert ring_steps(t, ALL_REDUCE) == ring_steps(t, REDUCE_SCATTER) + ring_steps(t, ALL_GATHER)
        assert [s.hop for s in ring_steps(t, ALL_REDUCE)] == list(range(t - 1)) * 2


@pytest.mark.parametrize("t", [2, 3, 4, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_every_member_sends_and_receives_once_a_step(t, kind):
    for s in ring_steps(t, kind):
        assert sorted(s.to) == sorted(s.source) == list(range(t))  # one send and one receive each
        for i in range(t):
            assert s.to[i] != i and s.source[s.to[i]] == i  # the receiver hears from the sender ...
            assert s.recv[s.to[i]] == s.send[i]  # ... and takes the chunk the sender sends
        assert sorted(s.send) == list(range(t))  # every chunk on the move, once


def _simulate(t, steps):
    """Member i starts with its own part of every chunk: held[i][c] = [i]. A reducing step adds the received
    list to the receiver's; any other step replaces it."""
    held = [[[i] for _ in range(t)] for i in range(t)]
    for s in steps:
        sent = [list(held[i][s.send[i]]) for i in range(t)]
        for i in range(t):
            j, c = s.to[i], s.send[i]
            held[j][c] = sorted(held[j][c] + sent[i]) if s.reduce else sent[i]
    return held


@pytest.mark.parametrize("t", [2, 3, 4, 5])
def test_reduce_scatter_leaves_member_i_the_sum_of_chunk_i(t):
    held = _simulate(t, ring_steps(t, REDUCE_SCATTER))
    assert [held[i][i] for i in range(t)] == [list(range(t))] * t  # every part added exactly once


@pytest.mark.parametrize("t", [2, 3, 4, 5])
def test_all_reduce_leaves_every_member_every_sum(t):
    held = _simulate(t, ring_steps(t, ALL_REDUCE))
    assert held == [[list(range(t))] * t] * t


@pytest.mark.parametrize("t", [2, 3, 4])
def test_all_gather_brings_every_chunk_to_every_member(t):
    """In an all-gather member i starts with chunk i only (marked by its own index)."""
    held = [[i if c == i else None for c in range(t)] for i in range(t)]
    for s in ring_steps(t, ALL_GATHER):
        sent = [held[i][s.send[i]] for i in range(t)]
        assert None not in sent  # nobody passes on a chunk it does not have yet
        for i in range(t):
            held[s.to[i]][s.send[i]] = sent[i]
    assert held == [list(range(t))] * t


def test_ring_bytes_by_hand_with_uneven_chunks():
    """10 elements of 2 bytes over 4 members: chunks of 3, 3, 2, 2 elements (6, 6, 4, 4 bytes, 20 in all).
    Reduce-scatter: member i sends every chunk but i and receives every chunk but i-1; all-gather: sends
    every chunk but i+1 and receives every chunk but its own."""
    assert ring_bytes(REDUCE_SCATTER, 20, 4, 2) == ((14, 16), (14, 14), (16, 14), (16, 16))
    assert ring_bytes(ALL_GATHER, 20, 4, 2) == ((14, 14), (16, 14), (16, 16), (14, 16))
    assert ring_bytes(ALL_REDUCE, 20, 4, 2) == ((28, 30), (30, 28), (32, 30), (30, 32))
    assert ring_bytes(ALL_REDUCE, 12, 3) == ((16, 16),) * 3  # even: 2(t-1)/t of the buffer
    assert ring_bytes(ALL_REDUCE, 20, 1, 2) == ((0, 0),)
    assert ring_bytes(ALL_GATHER, 7, 3) == ring_bytes(ALL_GATHER, 7, 3, 1)  # one-byte elements unless told
    with pytest.raises(ValueError):
        ring_bytes("broadcast", 20, 4)


def test_a_group_keeps_its_ring_bytes_for_its_run():
    g, same = Group((3, 1, 0, 2), "dp", 1), Group((3, 1, 0, 2), "dp", 1)
    assert g.ring_bytes(ALL_REDUCE, 20, 2) == ((28, 30), (30, 28), (32, 30), (30, 32))
    assert g.ring_bytes(ALL_REDUCE, 20, 2) is g.ring_bytes(ALL_REDUCE, 20, 2)  # worked out once
    assert g.ring_bytes(ALL_REDUCE, 20, 1) == ((30, 30),) * 4  # 20 one-byte elements: even chunks
    assert g.ring_bytes(ALL_GATHER, 20, 2) == ((14, 14), (16, 14), (16, 16), (14, 16))
    assert g == same and hash(g) == hash(same)  # what it has worked out is not part of the group's value
    assert Group((0, 1), "tp").ring_bytes(ALL_GATHER, 20, 2) == ring_bytes(ALL_GATHER, 20, 2, 2)
    steps = g.ring_steps(ALL_REDUCE)
    assert steps == ring_steps(4, ALL_REDUCE) and g.ring_steps(ALL_REDUCE) is steps  # worked out once
    assert g.ring_steps(REDUCE_SCATTER) == ring_steps(4, REDUCE_SCATTER) != steps  # kept by kind


MEMBERS = ([3, 1, 0, 2], [2, 0, 3], [3, 1])  # groups of 4, 3 and 2 members, in non-ascending order
X, Z = np.arange(1.0, 8.0), np.arange(12.0)  # 7 elements split unevenly; 12 divide by 2, 3 and 4


def rings(ctx):
    """Every ring collective on each group; integer-valued sums (exact in any order), float32 values for the
    average and the max."""
    comm = ctx.comm
    groups = [ctx.new_group(members, f"g{len(members)}") for members in MEMBERS]
    x, z = ctx.asarray(X) * 10 ** ctx.rank, ctx.asarray(Z) * 10 ** ctx.rank
    y = ctx.rng.normal((7,), dtype="float32")
    out = {}
    for n, g in enumerate(groups):
        if ctx.rank in g.ranks:
            out[f"sum{n}"] = comm.all_reduce(x, group=g, algo="ring")
            out[f"avg{n}"] = comm.all_reduce(y, op="avg", group=g, algo="ring")
            out[f"max{n}"] = comm.all_reduce(y, op="max", group=g, algo="ring")
            out[f"rs{n}"] = comm.reduce_scatter(z, op="avg", group=g, algo="ring")
            out[f"ag{n}"] = comm.all_gather(x, group=g, algo="ring")
    return out


@pytest.mark.slow  # real ranks: child processes, which a mutation run cannot switch
def test_every_ring_collective_on_gloo_equals_the_virtual_run_hop_for_hop():
    report = run_real(rings, 4, RealOptions("gloo", keep_values=16))
    assert report.match, report.differences
    virtual = parasim.run(rings, 4, keep_values=16)
    for r in range(4):
        assert report.values[r].keys() == virtual.values[r].keys()
        for k, v in virtual.values[r].items():
            assert report.values[r][k].tobytes() == v.tobytes(), (r, k)  # the same bits
    real_hops = [e.hops for e in report.trace.events if e.kind == "collective"]
    assert real_hops == [e.hops for e in virtual.trace.events if e.kind == "collective"]
    assert len(real_hops) == 15 and all(real_hops)
    _ring_values_hold(report.values)  # and the values are the collectives', worked out here


def _ring_values_hold(values):
    """Every member's sums, gathers and averaged reduce-scatter from `rings`, worked out here from the inputs."""
    for n, members in enumerate(MEMBERS):
        xs, t = [X * 10 ** m for m in members], len(members)
        zsum = sum(Z * 10 ** m for m in members) / t
        for i, r in enumerate(members):
            got = values[r]
            assert got[f"sum{n}"].tolist() == sum(xs).tolist()
            assert got[f"ag{n}"].tolist() == np.concatenate(xs).tolist()
            assert got[f"rs{n}"].tolist() == zsum[i * 12 // t:(i + 1) * 12 // t].tolist()


def test_every_ring_collective_on_virtual_ranks_gives_the_collectives_values():
    """The same program on virtual ranks alone (the gloo test above is slow, and a mutation run skips it). The
    average and the max of the float32 draws are held against each member's draw, taken by a run of its own
    (`rings` draws first, so a fresh run's first draw is the same)."""
    values = parasim.run(rings, 4, keep_values=16).values
    _ring_values_hold(values)
    drawn = parasim.run(lambda ctx: ctx.rng.normal((7,), dtype="float32"), 4).values
    for n, members in enumerate(MEMBERS):
        ys = [drawn[m].astype(np.float64) for m in members]
        for r in members:
            assert np.allclose(values[r][f"avg{n}"], sum(ys) / len(members), rtol=1e-6, atol=0)
            assert values[r][f"max{n}"].tolist() == np.max(ys, axis=0).astype(np.float32).tolist()
    # on a dim other than 0, a (2, 3) block from each of 3 members: side by side, not one after another
    blocks = parasim.run(lambda ctx: ctx.comm.all_gather(ctx.asarray(np.arange(6.0).reshape(2, 3) + 10 * ctx.rank),
                                                         dim=1, algo="ring"), 3).values
    want = np.concatenate([np.arange(6.0).reshape(2, 3) + 10 * r for r in range(3)], axis=1)
    assert all(blocks[r].tolist() == want.tolist() for r in range(3))


def test_each_kernel_plays_the_steps_it_is_given():
    """A run works out its group's steps once and passes them in: the kernel must play those, not its own.
    Given only its first step, reduce-scatter leaves every member's own chunk as it was (the whole ring would
    give 111 everywhere: the chunk a member keeps arrives last); all-gather given its steps twice
    over plays them twice (moving chunks every member already holds: same result, twice the hops)."""
    t, ranks = 3, (0, 1, 2)
    xs = [np.full(3, 10.0 ** i) for i in range(t)]  # member i holds 10^i everywhere
    outs, hops = ring_reduce_scatter(xs, ranks, 0, np.add, None, 0, steps=ring_steps(t, REDUCE_SCATTER)[:1])
    assert len(hops) == 1
    # member 1 receives chunk 2 from member 0 at step 0; its own chunk 1 is still only its own part
    assert [float(o[0]) for o in outs] == [1.0, 10.0, 100.0]
    outs, hops = ring_all_gather([x[:1] for x in xs], ranks, 0, 0, steps=ring_steps(t, ALL_GATHER) * 2)
    assert len(hops) == 2 * (t - 1) and [o.tolist() for o in outs] == [[1.0, 10.0, 100.0]] * t

"""Bytes inside a node and across nodes are counted hop by hop, on the link each hop takes (comm/hops.py),
not by whether the group as a whole spans nodes. Every expected value is worked out by hand below."""
import json
from dataclasses import replace

import pytest
from conftest import cli

import parasim
from parasim.comm.hops import chain_hops, crossing_share, pair_hops, ring_crossings, ring_hops
from parasim.estimate.traffic import across_share, inside_node

F64 = 8  # bytes per float64 value, what these programs send


# -- the hops themselves -----------------------------------------------------------------------------------

def test_a_ring_over_two_nodes_crosses_on_two_of_its_hops():
    # g0, g1 in node 0 and g8, g9 in node 1 (nodes of 8): 0->1 inside, 1->8 across, 8->9 inside, 9->0 across
    assert ring_hops([0, 1, 8, 9]) == [(0, 1), (1, 8), (8, 9), (9, 0)]
    assert ring_crossings([0, 1, 8, 9], 8) == [False, True, False, True]
    # the member order is the ring's: interleaved, every hop changes node
    assert ring_crossings([0, 8, 1, 9], 8) == [True, True, True, True]
    assert ring_hops([5]) == [] and ring_crossings([3, 4], 8) == [False, False]


def test_pairs_and_chains():
    # nodes of 2: {0, 1} and {2, 3}. 12 ordered pairs, 8 of them between the nodes
    assert len(pair_hops([0, 1, 2, 3])) == 12 and crossing_share([[0, 1, 2, 3]], "pairs", 2) == pytest.approx(8 / 12)
    # a pipeline 0-1-2-3: hops 0<->1, 1<->2, 2<->3 both ways; only 1<->2 crosses
    assert chain_hops([0, 1, 2, 3]) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)]
    assert crossing_share([[0, 1, 2, 3]], "chain", 2) == pytest.approx(2 / 6)
    # two rings of 4 over nodes of 8: one inside, one crossing on 2 of 4 hops: 2 of 8 hops in all
    assert crossing_share([[0, 1, 2, 3], [0, 1, 8, 9]], "ring", 8) == pytest.approx(2 / 8)


# -- what the engine counts ----------------------------------------------------------------------------------

def _reduce_scatter_over(members, algo="direct"):
    def prog(ctx):
        g = ctx.new_group(members, "four")
        if ctx.rank in members:
            ctx.comm.reduce_scatter(ctx.asarray([float(i) for i in range(8)]), group=g, algo=algo)
    return parasim.run(prog, 16).trace


@pytest.mark.parametrize("algo", ["direct", "ring"])
def test_a_reduce_scatter_over_two_nodes_sends_half_its_bytes_across(algo):
    """N = 8 float64 = 64 bytes over a ring of 4 (g0, g1 | g8, g9): 3 steps, each member sends one 16-byte
    chunk to its neighbour per step. 2 of the 4 hops cross, so per step 32 bytes inside and 32 across;
    over 3 steps 96 and 96 (the old rule counted all 192 across)."""
    trace = _reduce_scatter_over([0, 1, 8, 9], algo)
    assert sum(m.sent for m in trace.events[0].members) == 4 * 3 * 16
    assert trace.bytes_by_link(8)["four"] == {"inside": 96, "across": 96}
    if algo == "ring":  # the hops the ring recorded agree, transfer by transfer
        moved = {"inside": 0, "across": 0}
        for hop in trace.events[0].hops:
            for t in hop["transfers"]:
                moved["inside" if t["src"] // 8 == t["dst"] // 8 else "across"] += t["bytes"]
        assert moved == {"inside": 96, "across": 96}


def test_the_ring_runs_in_the_groups_member_order():
    # members g0, g8, g1, g9: every hop changes node, so all 192 bytes cross
    assert _reduce_scatter_over([0, 8, 1, 9]).bytes_by_link(8)["four"] == {"inside": 0, "across": 192}
    # nodes of 16: one node, nothing crosses
    assert _reduce_scatter_over([0, 8, 1, 9]).bytes_by_link(16)["four"] == {"inside": 192, "across": 0}


def test_all_to_all_counts_each_pair_on_its_own_link():
    """4 ranks, nodes of 2 ({0, 1}, {2, 3}); member i sends member j a chunk of j + 1 values (8 bytes each),
    its own chunk staying put. Inside: 0->1 16, 1->0 8, 2->3 32, 3->2 24 = 80. Across: 0->2 24, 0->3 32,
    1->2 24, 1->3 32, 2->0 8, 2->1 16, 3->0 8, 3->1 16 = 160. Sent in all: 80 + 160 = 240."""
    def prog(ctx):
        ctx.comm.all_to_all([ctx.asarray([1.0] * (j + 1)) for j in range(4)])
    trace = parasim.run(prog, 4).trace
    assert sum(m.sent for m in trace.events[0].members) == 240
    assert trace.bytes_by_link(2)["world"] == {"inside": 80, "across": 160}


@pytest.mark.parametrize("op, root, expected", [
    # broadcast from g2 over 0-1-2-3, a chain round the ring: 2->3 inside, 3->0 across, 0->1 inside
    ("broadcast", 2, {"inside": 2 * F64, "across": F64}),
    # reduce into g2, that chain backwards: 1->0 inside, 0->3 across, 3->2 inside
    ("reduce", 2, {"inside": 2 * F64, "across": F64}),
    # scatter from g0 of 4 values: one each to 1 (inside), 2 and 3 (across)
    ("scatter", 0, {"inside": F64, "across": 2 * F64}),
])
def test_broadcast_reduce_and_scatter_on_their_hops(op, root, expected):
    def prog(ctx):
        if op == "broadcast":
            ctx.comm.broadcast(ctx.asarray([1.0]), root)
        elif op == "reduce":
            ctx.comm.reduce(ctx.asarray([1.0]), root)
        else:
            ctx.comm.scatter(ctx.asarray([1.0, 2.0, 3.0, 4.0]), root)
    trace = parasim.run(prog, 4).trace
    by = trace.bytes_by_link(2)["world"]
    assert by == expected and by["inside"] + by["across"] == sum(m.sent for m in trace.events[0].members)


# -- the trace command of the issue ----------------------------------------------------------------------------

TRACE = ("--tp", "2", "--cp", "2", "--pp", "1", "--dp", "4", "--ep", "4", "--sp", "--token", "contract")


def _issue_run():
    from parasim.examples.moe16 import MICRO_BATCHES, MOE16, find_token, make_program, replicas
    from parasim.layout import Layout
    layout = Layout(tp=2, cp=2, pp=1, dp=4, ep=4, etp=1, sp=True, model=replace(MOE16), zigzag=False)
    reps = replicas(layout.dp, MICRO_BATCHES)
    watch = find_token("contract", [s for rep in reps for s in rep])
    return layout, parasim.run(make_program(watch, layout, MICRO_BATCHES, "learned"), layout.world, seed=0).trace


def test_the_issues_trace_splits_dp_cp_and_expert_dp_by_hop():
    """TP 2 is innermost, then CP 2, DP 4 (16 GPUs, nodes of 8: g0-g7, g8-g15).
    dp-cp (DP x CP, 8 GPUs) takes every other rank: g0 g2 ... g14 and g1 g3 ... g15. Its ring crosses on
    g6->g8 and g14->g0: 2 of 8 hops. expert-dp (EP 4 inside DP x CP's 8, ETP 1: 16 / 4 = 4 GPUs) takes every
    fourth rank: g0 g4 g8 g12, ...; its ring crosses on g4->g8 and g12->g0: 2 of 4 hops. Every member of a
    collective sends as many bytes (even chunks), so across = the members' bytes x 2/8 for dp-cp and x 2/4
    for expert-dp; the rest stays inside a node."""
    _, trace = _issue_run()
    groups = {(e.group.name, e.group.ranks) for e in trace.events if e.group.name in ("dp-cp", "expert-dp")}
    assert groups == {("dp-cp", tuple(range(0, 16, 2))), ("dp-cp", tuple(range(1, 16, 2)))} | {
        ("expert-dp", tuple(range(k, 16, 4))) for k in range(4)}
    crossing_of = {"dp-cp": 2, "expert-dp": 2}
    want = {name: {"inside": 0, "across": 0} for name in crossing_of}
    for e in trace.events:
        if e.group.name in crossing_of:
            (each,) = {m.sent for m in e.members}  # every member sends the same
            want[e.group.name]["across"] += crossing_of[e.group.name] * each
            want[e.group.name]["inside"] += (len(e.members) - crossing_of[e.group.name]) * each
    # the numbers, for the record: dp-cp's 4 collectives of 6,272 bytes a member, expert-dp's 8 of 6,144
    assert want == {"dp-cp": {"inside": 4 * 6 * 6272, "across": 4 * 2 * 6272},
                    "expert-dp": {"inside": 8 * 2 * 6144, "across": 8 * 2 * 6144}}
    out = cli("trace", *TRACE, "--json")
    by = json.loads(out.stdout)["bytes_by_link"]["by_group"]
    assert {g: by[g] for g in want} == want
    # tp, cp and ep groups stay inside their node
    assert all(by[g]["across"] == 0 for g in ("tp", "cp", "ep"))
    text = cli("trace", *TRACE).stdout
    assert "dp-cp 150,528 inside a node, 50,176 across nodes" in text
    assert "expert-dp 98,304 inside a node, 98,304 across nodes" in text


def test_the_estimator_counts_the_same_hops_as_the_engine():
    """The estimator's share of an axis's bytes across nodes is the engine's, for the issue's layout:
    dp 2/8 of the hops, edp 2/4, tp, cp and ep none."""
    layout, trace = _issue_run()
    by = trace.bytes_by_link(8)
    engine = {axis: by[g]["across"] / (by[g]["inside"] + by[g]["across"])
              for axis, g in {"dp": "dp-cp", "edp": "expert-dp", "tp": "tp", "cp": "cp", "ep": "ep"}.items()}
    assert engine == {"dp": 0.25, "edp": 0.5, "tp": 0.0, "cp": 0.0, "ep": 0.0}
    assert {axis: across_share(layout, axis, 8) for axis in engine} == engine
    assert not inside_node(layout, "dp", 8) and inside_node(layout, "ep", 8)


def test_an_all_to_all_over_two_nodes_is_timed_pair_by_pair():
    """EP 4 over nodes of 2 (the EP group is g0-g3): each member sends a third of its bytes to its node's
    other GPU over NVLink and two thirds to the other node over the network, both at once, so the
    network's share sets the time; a DP ring over 4 GPUs on two nodes moves in lockstep with its crossing
    hops: every step pays the network's latency, and the bytes go at the bus bandwidth measured across nodes
    (the clock's costs, clock/costs.py, at the rates of estimate/kernels.py's measured tables)."""
    from parasim.clock.costs import machine, pairs_seconds, ring_seconds
    from parasim.clock.plan import _link, _share
    from parasim.estimate.memory import Plan
    from parasim.estimate.kernels import collective_bandwidth
    plan = Plan(dp=4, ep=4, gpus_per_node=2)
    assert _share(plan, "ep", "pairs") == pytest.approx(2 / 3) and _link(plan, "dp-cp") == "across"
    m = machine("h100", gpus_per_node=2)
    call, across = m.latency["call"], m.latency["across"]
    # the whole all-to-all buffer a member's bytes stand for: (t-1)/t of it leaves; inside, the node's 2 members
    nvlink = collective_bandwidth("h100", "all_to_all", int(100e6 * 2 / 1), "inside", 2).value
    network = collective_bandwidth("h100", "all_to_all", int(200e6 * 4 / 3), "across", 4).value
    assert pairs_seconds(100e6, 200e6, m, 4) == pytest.approx(call + max(100e6 / nvlink, across + 200e6 / network))
    assert across + 200e6 / network > 100e6 / nvlink  # the network's share sets the time
    # an all-reduce of 4 moves 2 x 3/4 of its buffer a member: 300e6 bytes is a 200e6-byte buffer, 6 ring steps
    busbw = collective_bandwidth("h100", "all_reduce", int(200e6), "across", 4).value
    assert ring_seconds("all_reduce", 4, 300e6, "across", m) == pytest.approx(call + 6 * across + 300e6 / busbw)


@pytest.mark.parametrize("pattern", ["ring", "chain", "pairs"])
def test_groups_of_one_size_are_counted_as_the_hops_one_by_one_count_them(pattern):
    """crossing_share takes groups of one size as one array: the same share as adding up each group's hops."""
    import numpy as np

    from parasim.comm.hops import CROSSINGS

    rng = np.random.default_rng(0)
    for size, gpn in ((1, 8), (2, 4), (5, 8), (8, 2)):
        groups = [list(rng.permutation(64)[:size]) for _ in range(7)]
        counted = [CROSSINGS[pattern](g, gpn) for g in groups]
        hops = sum(n for _, n in counted)
        want = sum(c for c, _ in counted) / hops if hops else 0.0
        assert crossing_share(groups, pattern, gpn) == want
        assert crossing_share(iter(groups), pattern, gpn) == want  # any iterable, as before


def test_groups_of_different_sizes_are_counted_one_by_one():
    """Rings of 3 and of 2 over nodes of 2: (0,1) stays, (1,2) and (2,0) cross; (3,4) and (4,3) cross: 4 of 5."""
    assert crossing_share([[0, 1, 2], [3, 4]], "ring", 2) == 4 / 5
    assert crossing_share([[0, 1, 2], [3, 4]], "pairs", 2) == (4 + 2) / (6 + 2)  # 0-1 and 1-0 stay
    assert crossing_share([], "ring", 2) == 0.0


def test_all_to_all_groups_out_of_node_order_are_counted_group_by_group():
    """[2, 3] and [0, 1] each stay in a node, [0, 2] crosses both ways: 2 of 6 (a node's count is per group, even
    where a later group sits on an earlier node)."""
    assert crossing_share([[2, 3], [0, 2], [0, 1]], "pairs", 2) == 2 / 6

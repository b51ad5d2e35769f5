"""The longest-sequence solver and the layout search on tiny models: which layouts are enumerated (counted
by hand), how families are named, what a search result holds.

The search's lengths are held to `fit` on each plan alone: the scalar path, one Plan at a time, is the
reference for the vectorised one. TINY: 4 layers, hidden 8, 2 heads (so TP can only be 1 or 2).
"""
from collections import Counter

import numpy as np
import pytest

from parasim.errors import UsageError
from parasim.estimate import Plan
from parasim.estimate.fit import Fit, Plans, enumerate_plans, family, fit, parse_nodes, search, solve
from parasim.estimate.memory import Breakdown
from parasim.layout import ModelSpec

TINY = ModelSpec("tiny", layers=4, hidden=8, heads=2, vocab=16)
TINY_MOE = ModelSpec("tiny-moe", layers=2, hidden=8, heads=2, vocab=16, experts=4, top_k=2)
USABLE = 1e6  # bytes: TINY's 3392 params need 54 KB of model state, a token ~1 KB of activations


@pytest.mark.parametrize("a, b, c, avail, want", [
    (0.0, 2.0, 1.0, 8.0, 2.0),  # s^2 + 2s = 8
    (0.0, 2.0, 2.0, 24.0, 3.0),  # 2s^2 + 2s = 24
    (0.0, 1.0, 0.5, 4.0, 2.0),  # s^2/2 + s = 4
    (0.0, 0.5, 0.0, 2.0, 4.0),  # linear: s/2 = 2
    (5.0, 1.0, 1.0, 3.0, 0.0),  # the fixed part alone is over: nothing fits
])
def test_solve_quadratic_and_linear(a, b, c, avail, want):
    assert solve(a, b, c, avail) == pytest.approx(want)


def test_solve_with_nothing_growing_has_no_limit():
    assert np.isinf(solve(1.0, 0.0, 0.0, 5.0))


def test_fit_to_dict_reports_in_the_unit_asked():
    plan = Plan(tp=2, pp=2)
    bd = Breakdown(TINY, plan, 1000, 1, {"weights": 2e9, "gradients": 1e9, "optimizer": 3e9, "activations": 4e9})
    got = Fit(plan, 120e9, 1000, bd).to_dict()
    assert got == {"model": "tiny", "layout": plan.to_dict(), "usable": 120.0, "unit_bytes": 1e9,
                   "max_seq_tokens": 1000, "binding_stage": 2,  # stage 1 counted from 1
                   "model_state": 6.0,  # weights + gradients + optimizer
                   "memory_at_max": bd.to_dict(1e9)}
    gib = Fit(plan, 120e9, 1000, bd).to_dict(2.0 ** 30)
    assert gib["usable"] == 120e9 / 2 ** 30 and gib["unit_bytes"] == 2 ** 30


def test_plans_row_carries_every_choice():
    plans = Plans(tp=np.array([1, 2]), sp=np.array([False, True]), cp=np.array([1, 2]), pp=np.array([1, 2]),
                  dp=np.array([1, 3]), ep=np.array([1, 2]), etp=np.array([1, 2]), zero=np.array([0, 3]),
                  rc=np.array([0, 1]), nodes=np.array([1, 3]), flash=False, dropout=False, micro_batch=2,
                  chunked_loss=True, working_layers=3)
    assert len(plans) == 2
    assert plans.plan(1) == Plan(tp=2, sp=True, cp=2, pp=2, dp=3, ep=2, etp=2, zero=3, recompute="selective",
                                 flash=False, dropout=False, micro_batch=2, chunked_loss=True, working_layers=3)


# -- enumeration -------------------------------------------------------------------------------------------
def layouts(plans):
    """(tp, sp, cp, pp, dp, ep) of each row, counted."""
    return Counter(zip(plans.tp.tolist(), plans.sp.tolist(), plans.cp.tolist(), plans.pp.tolist(),
                       plans.dp.tolist(), plans.ep.tolist()))


def test_enumerate_one_node_of_two():
    # world 2: TP1 with DP2, CP2 or PP2, or TP2 (with or without SP). Layouts that shard over DP x CP take
    # every ZeRO stage (4) and recomputation (3): 12 rows; the others only ZeRO-1: 3 rows.
    plans = enumerate_plans(TINY, range(1, 2), 2)
    assert layouts(plans) == {(1, False, 1, 1, 2, 1): 12, (1, False, 2, 1, 1, 1): 12, (1, False, 1, 2, 1, 1): 3,
                              (2, False, 1, 1, 1, 1): 3, (2, True, 1, 1, 1, 1): 3}
    rows = {(int(d), int(c), int(r), int(z)) for d, c, r, z in zip(plans.dp, plans.cp, plans.rc, plans.zero)}
    assert {(r, z) for d, c, r, z in rows if d * c == 1} == {(r, 1) for r in range(3)}
    assert {(r, z) for d, c, r, z in rows if d * c > 1} == {(r, z) for r in range(3) for z in range(4)}
    assert set(plans.nodes.tolist()) == {1} and set(plans.etp.tolist()) == {1}


def test_enumerate_defaults_to_eight_gpus_a_node():
    plans = enumerate_plans(TINY, range(1, 2), zero=1, recompute="none")
    assert set((plans.tp * plans.cp * plans.pp * plans.dp).tolist()) == {8}
    assert set(plans.tp.tolist()) == {1, 2}  # 2 heads: TP 4 and 8 do not divide them


@pytest.mark.parametrize("heads, kv, tps", [
    (4, 2, {1, 2, 4}),  # TP4 > 2 kv heads: each kv head replicated on 2 ranks; TP8 does not divide 4 heads
    (6, 3, {1}),  # TP2 would split 3 kv heads unevenly
])
def test_enumerate_tp_follows_heads_and_kv_heads(heads, kv, tps):
    model = ModelSpec("gqa", layers=2, hidden=2 * heads, heads=heads, kv_heads=kv, vocab=16)
    assert set(enumerate_plans(model, range(1, 2), 8, zero=1, recompute="none").tp.tolist()) == tps


def test_enumerate_skips_pipeline_sizes_that_do_not_divide_the_layers():
    # 3 nodes of 4: world 12; with TP1, PP 3, 6 and 12 do not divide 4 layers but PP4 does
    plans = enumerate_plans(TINY, range(3, 4), 4, zero=1, recompute="none")
    assert set(plans.pp[plans.tp == 1].tolist()) == {1, 2, 4}


@pytest.mark.parametrize("zero, recompute", [(2, "selective"), (0, "full")])
def test_enumerate_fixed_zero_and_recompute(zero, recompute):
    plans = enumerate_plans(TINY, range(1, 2), 2, zero=zero, recompute=recompute)
    assert set(plans.zero.tolist()) == {zero}
    assert set(plans.rc.tolist()) == {("none", "selective", "full").index(recompute)}


def test_enumerate_passes_the_training_choices_on():
    plans = enumerate_plans(TINY, range(1, 2), 2, flash=False, micro_batch=4)
    assert plans.flash is False and plans.micro_batch == 4


def test_enumerate_moe_every_ep_and_sp_with_tp():
    # world 2, 4 experts: EP 1 or 2 wherever the non-pipeline ranks allow it; TP2 only with SP (Megatron).
    # ZeRO stages differ only when something is sharded: over DP x CP, or the experts over EP.
    plans = enumerate_plans(TINY_MOE, range(1, 2), 2, recompute="none")
    # with TP 2 the experts are whole (ETP 1) or split as attention is (ETP 2): TP2 alone twice; TP2 beside EP 2
    # on two GPUs only with ETP 1 (ETP x EP must fit in the GPUs)
    assert layouts(plans) == {(1, False, 1, 1, 2, 1): 4, (1, False, 1, 1, 2, 2): 4, (1, False, 2, 1, 1, 1): 4,
                              (1, False, 2, 1, 1, 2): 4, (1, False, 1, 2, 1, 1): 1, (2, True, 1, 1, 1, 1): 2,
                              (2, True, 1, 1, 1, 2): 4}
    assert sorted({(int(t), int(e), int(x)) for t, e, x in zip(plans.tp, plans.ep, plans.etp)}) == [
        (1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 1, 2), (2, 2, 1)]


# -- families ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("plan, name", [
    (Plan(), "no TP"),
    (Plan(tp=2), "TP"),
    (Plan(tp=2, sp=True, recompute="selective"), "TP+SP + selective"),
    (Plan(cp=2), "no TP + CP"),
    (Plan(pp=2, recompute="full"), "no TP + PP + recompute"),
    (Plan(dp=2, ep=2), "no TP + EP"),
    (Plan(tp=2, sp=True, cp=2, pp=2, ep=2, recompute="full"), "TP+SP + CP + PP + EP + recompute"),
])
def test_family_names_the_techniques_not_the_sizes(plan, name):
    assert family(plan) == name


# -- the search --------------------------------------------------------------------------------------------
def best_by_family(model, plans, usable, nodes):
    """The reference: fit each plan of one node count alone, keep the longest per family."""
    out = {}
    for i in range(len(plans)):
        if plans.nodes[i] == nodes:
            p = plans.plan(i)
            out[family(p)] = max(out.get(family(p), 0), fit(model, p, usable).seq)
    return out


def test_search_two_node_counts_of_two_gpus():
    res = search(TINY, range(1, 3), USABLE, gpus_per_node=2, top=3)
    # world 4: TP1 x (PP1: CP 1/2/4, 3*12; PP2: CP 1/2, 2*12; PP4: 3) + TP2 x 2 SP x (PP1: CP 1/2, 2*12;
    # PP2: 3) = 36 + 24 + 3 + 48 + 6 = 117 layouts; world 2: 33 (test_enumerate_one_node_of_two)
    assert (res["model"], res["usable"], res["layouts_tried"]) == ("tiny", USABLE, 150)
    assert [(r["nodes"], r["gpus"], r["layouts"], len(r["top"])) for r in res["nodes"]] == [(1, 2, 33, 3),
                                                                                         (2, 4, 117, 3)]
    plans = enumerate_plans(TINY, range(1, 3), 2)
    for r in res["nodes"]:
        n = r["nodes"]
        want = best_by_family(TINY, plans, USABLE, n)
        assert r["best"] == r["top"][0] and r["best"]["max_seq_tokens"] == max(want.values())
        assert {name: runs[n] for name, runs in res["families"].items() if n in runs} == want
    # every family of one node: 5 TP/CP/PP choices, each without, with selective or with full recomputation
    one_node = {name for name, runs in res["families"].items() if 1 in runs}
    assert one_node == {base + rc for base in ("no TP", "no TP + CP", "no TP + PP", "TP", "TP+SP")
                        for rc in ("", " + selective", " + recompute")}


def test_search_moe_families_include_ep():
    res = search(TINY_MOE, range(1, 2), USABLE, gpus_per_node=2, zero=1, recompute="none")
    want = best_by_family(TINY_MOE, enumerate_plans(TINY_MOE, range(1, 2), 2, zero=1, recompute="none"), USABLE, 1)
    assert set(want) == {"no TP", "no TP + EP", "no TP + CP", "no TP + CP + EP", "no TP + PP", "TP+SP",
                         "TP+SP + EP"}
    assert {name: runs[1] for name, runs in res["families"].items()} == want


def test_search_keeps_lengths_of_zero_and_skips_node_counts_a_family_lacks():
    # 40 KB: one GPU cannot even hold the 54 KB of model state (length 0); two GPUs sharding it can.
    # CP and PP need two GPUs: those families have no one-node entry at all.
    res = search(TINY, range(1, 3), 40e3, gpus_per_node=1)
    assert res["nodes"][0]["best"]["max_seq_tokens"] == 0
    fam = res["families"]
    assert {name: sorted(runs) for name, runs in fam.items()} == {
        f"{base}{rc}": ([1, 2] if base == "no TP" else [2])
        for base in ("no TP", "no TP + CP", "no TP + PP") for rc in ("", " + selective", " + recompute")}
    assert fam["no TP"][1] == 0 and fam["no TP"][2] > 0


def test_search_defaults_eight_gpus_a_node_and_a_top_five():
    res = search(TINY, range(1, 2), USABLE)
    assert res["nodes"][0]["gpus"] == 8 and len(res["nodes"][0]["top"]) == 5


def test_search_passes_choices_and_may_list_nothing():
    res = search(TINY, range(1, 2), USABLE, gpus_per_node=2, top=0, recompute="none")
    assert res["nodes"][0] == {"nodes": 1, "gpus": 2, "layouts": 11, "best": None, "top": []}  # 33 / 3


@pytest.mark.parametrize("text, nodes", [("4", range(4, 5)), ("2-5", range(2, 6)), ("4096", range(4096, 4097))])
def test_parse_nodes(text, nodes):
    assert parse_nodes(text) == nodes


def test_parse_nodes_caps_at_4096():
    with pytest.raises(UsageError, match="4096"):
        parse_nodes("1-4097")

"""clock/fastest.py piece by piece, fast: a step's parts written out by hand, and a whole search on a small
model over one node of 2 GPUs (every row checked against the clock's own time for its plan, the ranking's
order and ties, what each loser loses most on, and the counts of layouts left out), so each mutant of the
search runs in seconds (tests/unit/clock/test_search_by_time.py searches a real model)."""
from __future__ import annotations

import numpy as np
import pytest

from parasim.clock.fastest import TIME_PARTS, search_by_time, time_parts
from parasim.clock.plan import plan_time
from parasim.clock.uncertainty import step_range
from parasim.estimate import Plan
from parasim.estimate.fit import enumerate_plans, longest
from parasim.layout import ModelSpec

TINY = ModelSpec("tiny", layers=4, hidden=512, heads=8, ffn=2048, vocab=32000)
SEQ, USABLE = 4096, 1.5e9  # at 1.5 GB a GPU all but one of its layouts hold 4,096 tokens
# held-out runs as the search reads them (key, GPU, family, error), written here: the real table times every
# published run (seconds), which clock/uncertainty.py's own tests check
HELD_OUT = [("a", "h200", "model-parallel", 0.1), ("b", "h200", "model-parallel", -0.2),
            ("c", "h200", "model-parallel", 0.3), ("d", "h100", "data-parallel", 0.05),
            ("e", "h100", "data-parallel", -0.05), ("f", "a100", "data-parallel", 0.5)]


def test_the_parts_of_a_step_written_out():
    """Per micro-batch: products 1, attention 2, elementwise 3, logits 4 (10 a micro-batch, 40 over 4); TP 5 with
    1 hidden (16), CP 7 with 2 hidden (20), EP 11 with 3 hidden (32); p2p 0.25 exposed a micro-batch (1); the
    rest once a step."""
    t = {"microbatches": 4,
         "parts_per_microbatch_s": {"matmul": 1.0, "attention": 2.0, "elementwise": 3.0, "logits": 4.0, "tp": 5.0,
                                    "cp": 7.0, "ep": 11.0},
         "bubble_s": 0.5, "tp_hidden_s": 1.0, "cp_hidden_s": 2.0, "ep_hidden_s": 3.0, "exposed_p2p_s": 0.25,
         "exposed_grads_s": 0.125, "exposed_params_s": 0.0625, "optimizer_s": 0.03125}
    assert time_parts(t) == {"compute": 40.0, "bubble": 0.5, "tp": 16.0, "cp": 20.0, "ep": 32.0, "p2p": 1.0,
                             "dp": 0.125, "gathers": 0.0625, "optimizer": 0.03125}
    assert list(time_parts(t)) == list(TIME_PARTS)


def _search(usable: float, seq: int, global_batch: int, nodes: range = range(1, 2), **kw) -> dict:
    """search_by_time on TINY with recompute off, reading HELD_OUT as its held-out runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("parasim.clock.fastest.held_out", lambda: HELD_OUT)
        return search_by_time(TINY, nodes, usable, seq, global_batch, "h200", recompute="none", **kw)


@pytest.fixture(scope="module")
def searched():
    """The search for 6 sequences (every layout), for 3 keeping the top 2, and the other cases below."""
    out = {(gb, top): _search(USABLE, SEQ, gb, gpus_per_node=2, top=top, overlap=("tp",))
           for gb, top in ((6, 100), (3, 2))}
    out["defaults"] = _search(USABLE, SEQ, 8)
    out["two nodes"] = _search(USABLE, SEQ, 4, range(2, 3), gpus_per_node=2, top=100)
    out["none fit"] = _search(1e6, SEQ, 6, gpus_per_node=2)
    out["micro-batch 2"] = _search(4e9, SEQ, 6, gpus_per_node=2, top=100, micro_batch=2)
    return out


@pytest.fixture(scope="module")
def plans():
    p = enumerate_plans(TINY, range(1, 2), 2, recompute="none")
    return p, np.floor(longest(TINY, p, USABLE)) >= SEQ


def test_a_small_search_times_every_layout_that_fits_as_the_clock_does(plans, searched):
    p, fits = plans
    out = searched[6, 100]
    assert {k: out[k] for k in ("model", "by", "seq", "global_batch", "gpu", "usable", "overlap", "layouts_tried")} == {
        "model": "tiny", "by": "time", "seq": SEQ, "global_batch": 6, "gpu": "h200", "usable": USABLE,
        "overlap": ["tp"], "layouts_tried": len(p)}
    (node,) = out["nodes"]
    assert 0 < fits.sum() < len(p)  # the case is worth its salt: some fit, some do not
    assert (node["nodes"], node["gpus"], node["layouts"], node["not_fitting"], node["batch_not_dividing"]) == (
        1, 2, int(fits.sum()), int((~fits).sum()), 0)
    assert len(node["top"]) == node["layouts"] and node["best"] == node["top"][0]
    for row in node["top"]:
        plan = Plan(tp=row["tp"], sp=row["sp"], cp=row["cp"], pp=row["pp"], dp=row["dp"], zero=row["zero"],
                    recompute=row["recompute"], microbatches=6 // row["dp"], gpus_per_node=2)
        t = plan_time(TINY, plan, SEQ, "h200", ("tp",))
        assert (row["step_s"], row["tokens_per_s_per_gpu"], row["mfu"]) == (
            t["step_s"], t["tokens_per_s_per_gpu"], t["mfu"]), row["label"]
        assert row["parts_s"] == time_parts(t) and row["microbatches"] == 6 // row["dp"]
        assert row["range"] == step_range(TINY, plan, "h200", HELD_OUT).to_dict(t["step_s"])
        assert row["range"]["low_s"] < row["step_s"] < row["range"]["high_s"]


def test_the_ranking_is_fastest_first_and_ties_go_to_less_sharding(searched):
    top = searched[6, 100]["nodes"][0]["top"]
    keys = [(-r["tokens_per_s_per_gpu"], r["zero"], r["pp"], r["cp"], r["tp"]) for r in top]
    assert keys == sorted(keys)
    assert any(a[0] == b[0] and a[1] < b[1] for a, b in zip(keys, keys[1:]))  # a tie decided by ZeRO


def test_each_loser_names_the_part_it_spends_most_more_on(searched):
    top = searched[6, 100]["nodes"][0]["top"]
    best = top[0]
    assert "loses" not in best
    for row in top[1:]:
        extra = {part: row["parts_s"][part] - best["parts_s"][part] for part in TIME_PARTS}
        most = max(extra.values())
        assert row["loses"]["most_s"] == most and extra[row["loses"]["most"]] == most
        assert row["loses"]["words"] == TIME_PARTS[row["loses"]["most"]]
        assert row["loses"]["slower"] == pytest.approx(row["step_s"] / best["step_s"] - 1, rel=1e-12)


def test_a_batch_that_does_not_split_over_the_replicas_leaves_the_layout_out(plans, searched):
    """3 sequences do not split over 2 replicas: every layout with dp 2 that fits is counted out; top 2 keeps
    the best two of the rest."""
    p, fits = plans
    node = searched[3, 2]["nodes"][0]
    assert node["batch_not_dividing"] == int((fits & (p.dp == 2)).sum()) > 0
    assert node["layouts"] == int((fits & (p.dp == 1)).sum()) > 2
    assert len(node["top"]) == 2 and all(r["dp"] == 1 and r["microbatches"] == 3 for r in node["top"])


def test_the_defaults_search_nodes_of_8_and_keep_the_best_5(searched):
    node = searched["defaults"]["nodes"][0]
    assert node["gpus"] == 8 and node["layouts"] > 5 and len(node["top"]) == 5


def test_plans_across_two_nodes_are_timed_with_the_nodes_size(searched):
    """Two nodes of 2 GPUs: a layout over 4 GPUs crosses nodes, and is timed so (not as one node of 8)."""
    (node,) = searched["two nodes"]["nodes"]
    assert node["gpus"] == 4 and node["top"]
    for row in node["top"]:
        plan = Plan(tp=row["tp"], sp=row["sp"], cp=row["cp"], pp=row["pp"], dp=row["dp"], zero=row["zero"],
                    recompute=row["recompute"], microbatches=4 // row["dp"], gpus_per_node=2)
        assert row["step_s"] == plan_time(TINY, plan, SEQ, "h200")["step_s"], row["label"]


def test_a_node_count_where_nothing_fits_has_no_best(searched):
    out = searched["none fit"]
    (node,) = out["nodes"]
    assert (node["layouts"], node["best"], node["top"], node["not_fitting"]) == (0, None, [], out["layouts_tried"])


def test_micro_batches_of_two_sequences_split_the_batch_by_dp_times_two(searched):
    """6 sequences in micro-batches of 2 (at 4 GB a GPU, where dp 2 fits too): dp 1 runs 3 micro-batches; dp 2
    would need 4 sequences a step, which 6 is not a multiple of: left out."""
    node = searched["micro-batch 2"]["nodes"][0]
    assert node["top"] and all(r["dp"] == 1 and r["micro_batch"] == 2 for r in node["top"])
    assert all(type(r["microbatches"]) is int and r["microbatches"] == 3 for r in node["top"])
    assert node["batch_not_dividing"] > 0


def test_a_layout_that_holds_the_sequence_exactly_fits(plans):
    """The sequence set to the longest one layout holds (the memory model's floor): that layout is counted."""
    p, _ = plans
    room = np.floor(longest(TINY, p, USABLE)).astype(int)
    seq = int(np.sort(room)[len(room) // 2])
    out = _search(USABLE, seq, 1, gpus_per_node=2)
    assert out["nodes"][0]["layouts"] == int((room >= seq).sum()) > int((room > seq).sum())

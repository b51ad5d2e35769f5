"""`parasim fit --search --by time`: the layouts that fit a sequence, ranked by the clock's step time, with
what costs each loser most against the winner."""
from __future__ import annotations

import json

import pytest

from parasim.clock.plan import plan_time
from parasim.estimate import Plan, get_model
from parasim.clock.fastest import search_by_time, time_parts
from tests.conftest import cli


@pytest.fixture(scope="module")
def one_node():
    return search_by_time(get_model("27b"), range(1, 2), 120e9, 4096, 64, "h200", top=1000)["nodes"][0]


def test_the_ranking_is_by_tokens_per_second_and_every_layout_fits(one_node):
    speeds = [r["tokens_per_s_per_gpu"] for r in one_node["top"]]
    assert speeds == sorted(speeds, reverse=True) and one_node["layouts"] == len(one_node["top"]) > 10
    # each row's time is the clock's for that plan, its micro-batches the batch over its replicas
    r = one_node["top"][3]
    plan = Plan(tp=r["tp"], sp=r["sp"], cp=r["cp"], pp=r["pp"], dp=r["dp"], zero=r["zero"], recompute=r["recompute"],
                microbatches=64 // r["dp"])
    assert plan_time(get_model("27b"), plan, 4096, "h200")["step_s"] == pytest.approx(r["step_s"])


@pytest.mark.parametrize("overlap", [(), ("tp", "cp", "p2p", "grad-reduce", "prefetch"), ("dualpipe", "cp")])
@pytest.mark.parametrize("model, plan", [
    ("27b", Plan(tp=2, sp=True, pp=2, cp=2, microbatches=8)),
    ("27b", Plan(tp=2, sp=True, pp=2, chunks=2, cp=2, dp=2, zero=1, microbatches=8)),
    ("moe16", Plan(tp=2, sp=True, pp=2, cp=2, ep=2, dp=2, microbatches=8))], ids=["dense", "interleaved", "moe"])
def test_the_parts_of_a_step_add_up_to_it(model, plan, overlap):
    """With every overlap switch too: a part that hides (CP's ring behind attention, EP's all-to-alls behind the
    other chunk's compute under DualPipe) is counted once, net of what it slows."""
    t = plan_time(get_model(model), plan, 4096, "h200", overlap)
    parts = time_parts(t)
    assert sum(parts.values()) == pytest.approx(t["step_s"], rel=1e-12)
    per = t["parts_per_microbatch_s"]
    for part in ("tp", "cp", "ep"):
        assert 0 <= parts[part] <= per[part] * t["microbatches"] * (1 + 1e-12), part
    if "cp" in overlap:
        assert parts["cp"] < per["cp"] * t["microbatches"]


def test_tp8_loses_to_its_tp_collectives_and_recomputation_to_compute(one_node):
    """Against the winner, TP 8 on one node pays most for its TP all-reduces, and a layout that differs from
    another only by full recomputation pays most for compute: worked out from the layouts' own nature."""
    by = {r["label"]: r for r in one_node["top"]}
    assert by["TP8"]["loses"]["most"] == "tp"
    win = one_node["top"][0]
    same = ("tp", "sp", "cp", "pp", "dp", "zero")
    (again,) = [r for r in one_node["top"] if r["recompute"] == "full" and all(r[k] == win[k] for k in same)]
    assert again["loses"]["most"] == "compute"  # the winner's layout, every forward run twice


@pytest.mark.parametrize("argv, words", [
    (["fit", "--model", "27b", "--by", "time"], "give --search"),
    (["fit", "--model", "27b", "--search", "--seq", "4096"], "give --by time"),
    (["fit", "--model", "27b", "--search", "--by", "time", "--megatron-args"], "go with --by length"),
])
def test_what_does_not_go_together_is_one_line(argv, words):
    r = cli(*argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_the_command_names_the_winner_and_why_each_other_loses():
    r = cli("fit", "--model", "27b", "--search", "--by", "time", "--nodes", "1-4", "--top", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(ln.startswith("    1. ") for ln in lines) == 4
    assert all("slower than 1, most of it" in ln or "as fast as 1" in ln for ln in lines if ln.startswith(("    2.", "    3.")))
    out = json.loads(cli("fit", "--model", "27b", "--search", "--by", "time", "--nodes", "2", "--json").stdout)
    assert out["by"] == "time" and out["nodes"][0]["best"]["tokens_per_s_per_gpu"] > 0

"""ZeRO-3's gathered layers at real size: DeepSeek-V3's config (tests/data/jobs/hf), where gathering a whole MoE
layer is what rules ZeRO-3 without EP out, and the search that must therefore find EP."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import cli

from parasim.estimate import Plan
from parasim.estimate.memory import items
from parasim.estimate.models import from_hf_config

CONFIG = Path(__file__).parents[2] / "data" / "jobs" / "hf" / "deepseek_v3_reference_config.json"


def test_a_deepseek_v3_moe_layer_gathered_whole_at_ep_1():
    model = from_hf_config(str(CONFIG))
    # one MoE layer's routed experts, from the config by hand: 256 experts x 3 matrices x 7168 x 2048
    experts = 256 * 3 * 7168 * 2048
    plan = Plan(pp=16, dp=128, zero=3)
    plan.check(model)
    # stage 2 holds MoE layers only (3 dense layers, then MoE): two layers' weights in BF16 and one gradient
    got = float(items(model, plan, 2)["ZeRO-3 gathered layers"][0])
    assert experts * (2 * 2 + 2) < got < 1.05 * experts * (2 * 2 + 2)  # the rest of the layer is under 5%
    doc = (Path(__file__).parents[3] / "docs" / "estimator.md").read_text()
    assert f"every expert ({got / 1e9:.0f} GB a GPU for DeepSeek-V3's at PP 16)" in doc  # the figure docs quote
    # EP 128 leaves each GPU 2 experts, sharded over nothing (expert DP 1): only the dense part is gathered
    spread = Plan(pp=16, dp=128, ep=128, zero=3)
    spread.check(model)
    assert float(items(model, spread, 2)["ZeRO-3 gathered layers"][0]) < 0.05 * experts * 6


def test_the_search_on_256_nodes_picks_expert_parallelism():
    r = cli("fit", "--config", str(CONFIG), "--search", "--nodes", "256", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["nodes"]
    assert row["gpus"] == 2048 and row["best"]["ep"] > 1, row["best"]["label"]


def test_tables_show_the_gathered_row_only_under_zero_3():
    """--json keeps every item; a table leaves ZeRO-3's row out below stage 3, where it is zero by definition."""
    for zero, shown in ((1, False), (3, True)):
        r = cli("memory", "--model", "27b", "--dp", "8", "--zero", str(zero))
        assert r.returncode == 0 and ("ZeRO-3 gathered layers" in r.stdout) is shown, zero
        data = json.loads(cli("memory", "--model", "27b", "--dp", "8", "--zero", str(zero), "--json").stdout)
        assert ("ZeRO-3 gathered layers" in data["items"]) and (data["items"]["ZeRO-3 gathered layers"] > 0) is shown


def test_a_ranked_layout_on_unlike_stages_says_how_many_layers_each_holds():
    """61 layers on PP stages that do not divide them: as even as can be, the first 61 mod pp one layer more."""
    r = cli("fit", "--config", str(CONFIG), "--search", "--nodes", "16", "--zero", "1", "--top", "40", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["nodes"][0]["top"]
    piped = [x for x in rows if x["pp"] > 1]
    assert piped, [x["label"] for x in rows]
    for x in piped:
        pp = x["pp"]
        want = [61 // pp + (s < 61 % pp) for s in range(pp)]
        assert x.get("stage_layers", want) == want and ("stage_layers" in x) == (61 % pp != 0)

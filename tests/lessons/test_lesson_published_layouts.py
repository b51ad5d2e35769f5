"""published-layouts: the post's two reference layouts, Megatron-LM's 8.3B (TP 8 x DP 64 on 512 V100s) and
DeepSeek-V3 (PP 16 x EP 64, no TP, ZeRO-1 over DP, on 2,048 H800s). Every expected figure is worked out here
from the models' shapes and the layouts' sizes, never read from the lesson's tables or notes."""

import json

import pytest

from conftest import cli
from parasim.lesson import get_lesson, run_lesson
from parasim.render.walkthrough import walkthrough

# Megatron-LM 8.3B: 72 layers, hidden 3,072, vocabulary 51,200; TP 8 x DP 64, servers of 16 V100s of 32 GB
L, H, V, S = 72, 3072, 51200, 1024
# DeepSeek-V3-like: 61 layers (3 dense, MLP 18,432), hidden 7,168, 256 routed experts and 1 shared of 2,048
# (gated: 3 matrices each), vocabulary 129,280; PP 16 x EP 64 on 2,048 GPUs, 8 a node
DL, DD, DH, DE, DF, DFF, DV = 61, 3, 7168, 256, 2048, 18432, 129280


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("published-layouts"))


def _table(lr, start):
    (t,) = [t for t in lr.tables if t.title.startswith(start)]
    return {label: dict(zip(t.columns[1:], cells)) for label, cells in t.rows}


def test_every_check_holds_and_the_three_tables_are_made(lr):
    assert lr.checks and all(c.ok for c in lr.checks), [c.name for c in lr.checks if not c.ok]
    assert [len(t.rows) for t in lr.tables] == [7, 5, 9]


def test_the_groups_by_hand(lr):
    g = _table(lr, "Each layout's groups")
    # TP fastest: 64 TP groups of 8 consecutive GPUs, each inside a 16-GPU server; a DP group every 8th GPU,
    # 64 of them over 512 / 16 = 32 servers
    assert (g["8.3B: TP"]["size"], g["8.3B: TP"]["groups"], g["8.3B: TP"]["inside a node"]) == (8, 64, "yes")
    assert (g["8.3B: DP"]["size"], g["8.3B: DP"]["nodes one spans"]) == (64, 512 // 16)
    # EP 64 consecutive GPUs over 64 / 8 nodes; PP 16 stages 2048 / 16 = 128 GPUs apart, one node each
    assert (g["V3: EP"]["size"], g["V3: EP"]["groups"], g["V3: EP"]["nodes one spans"]) == (64, 2048 // 64, 8)
    assert (g["V3: PP"]["size"], g["V3: PP"]["nodes one spans"]) == (16, 16)
    assert g["V3: PP"]["the first group's GPUs"] == f"0, 128, ..., {128 * 15}"
    # expert DP: 2048 / (EP 64 x PP 16) = 2 copies of each expert, 64 GPUs apart
    assert (g["V3: expert DP"]["size"], g["V3: expert DP"]["the first group's GPUs"]) == (2, "0, 64")


def test_memory_by_hand(lr):
    m = _table(lr, "Memory a GPU needs")
    p = 12 * L * H * H + 2 * L * H + 2 * V * H  # the 8.3B's parameters, the output head apart
    usable = 32 * 0.85  # GB: parasim's share (68 of an 80 GB card) of a 32 GB V100
    pub, z1 = m["8.3B as published (ZeRO-0)"], m["8.3B + ZeRO-1"]
    assert pub["Adam"] == round(12 * p / 8 / 1e9, 2) and z1["Adam"] == round(12 * p / 8 / 64 / 1e9, 2)
    assert pub["weights + grads"] == round(4 * p / 8 / 1e9, 2)
    # one layer keeps s h (10 + 24/8) bytes at TP 8 without SP; SP keeps 34 s h / 8; plus the fp32 logits
    # 4 V / 8 bytes a token
    logits = 4 * V / 8 * S
    assert pub["activations"] == round((L * S * H * 13 + logits) / 1e9, 2)
    assert m["8.3B + ZeRO-1 + SP"]["activations"] == round((L * S * H * 34 / 8 + logits) / 1e9, 2)
    assert pub["GPU"] == f"V100 32GB ({usable:.1f})" and pub["fits"] == "yes"
    # DeepSeek-V3: dense parameters over PP 16 and sharded over DP 128; experts over EP 64 x PP 16, over EDP 2
    moe = DL - DD
    routed = moe * DE * 3 * DH * DF
    total = DL * 4 * DH * DH + DD * 3 * DH * DFF + routed + moe * (3 * DH * DF + DE * DH) + 2 * DL * DH + 2 * DV * DH
    dense = total - routed
    full = m["V3, full recompute"]
    assert full["weights + grads"] == round(4 * (dense / 16 + routed / 1024) / 1e9, 2)
    assert full["Adam"] == round(12 * (dense / 16 / 128 + routed / 1024 / 2) / 1e9, 2)
    assert (full["fits"], m["V3, no recompute"]["fits"]) == ("yes", "no")


def test_the_rules_read_as_the_post_would_expect(lr):
    t = [t for t in lr.tables if t.title.startswith("Each layout against the rules")][0]
    here = {(a, cells[0]): cells[1] for a, cells in t.rows}
    assert here[("8.3B", "TP inside a node")] == "kept" and here[("V3", "TP inside a node")] == "kept"
    assert here[("8.3B", "SP whenever TP is on")] == "broken" and here[("8.3B", "ZeRO-1 over DP")] == "broken"
    assert here[("V3", "EP inside a node if possible")] == "broken" and here[("V3", "ZeRO-1 over DP")] == "kept"
    ep = next(cells[2] for a, cells in t.rows if cells[0].startswith("EP inside"))
    assert "EP 64 spans 8 nodes" in ep and "DualPipe" in ep


@pytest.mark.parametrize("width", [100, 200])
def test_the_tables_read_across(lr, width):
    text = walkthrough(lr, width=width)
    tables = text[text.index("== tables") : text.index("== checks")]
    assert max(map(len, text.splitlines())) <= width
    assert "(columns" not in tables and "(turned to fit" not in tables
    for t in lr.tables:
        assert any(line.startswith(f"  {t.rows[0][0]}  ") for line in tables.splitlines()), t.title


def test_listed_after_fit_is_not_fast_with_no_picture_and_why():
    rows = json.loads(cli("lesson", "--list", "--json").stdout)
    names = [r["name"] for r in rows]
    assert names.index("published-layouts") == names.index("fit-is-not-fast") + 1
    row = rows[names.index("published-layouts")]
    assert row["picture"] is None and "2,048" in row["no_picture"]

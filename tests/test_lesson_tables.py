"""The post's tables as tables: named columns and one labelled row each, in --json and the walk-through
(issue 33, defect 2 and build item 1)."""
import json

from conftest import cli

from parasim.lesson import Table
from parasim.render.tables import table_lines

VARIANTS = ["the post's layout", "zigzag CP split", "ETP 2 (EP 2, EDP 2)", "EP 8 (EDP 1)", "PP 1, DP 4"]


def test_moe16_variants_names_every_variant_in_its_tables():
    out = cli("lesson", "moe16-variants", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["tables"]
    for table in data["tables"]:
        assert table["columns"][0] == "variant"
        assert [row["variant"] for row in table["rows"]] == VARIANTS
        assert all(set(row) == set(table["columns"]) for row in table["rows"])
    where = {row["variant"]: row for row in data["tables"][0]["rows"]}
    assert where["zigzag CP split"]["held by"] == "g3"  # contiguous keeps t6 on g2; zigzag gives it to g3
    assert "g0+g1" in where["ETP 2 (EP 2, EDP 2)"]["layer 1 sends it to"]  # an ETP-2 expert lives on a pair
    stores = next(t for t in data["tables"] if "groups crossing nodes" in t["columns"])  # names, not bytes
    assert {row["groups crossing nodes"] for row in stores["rows"]} >= {"pp", "dp-cp, expert-dp"}
    checks = {c["name"]: c for c in data["checks"]}
    holder = checks["the GPU holding 'contract' (t6 of A)"]
    assert list(holder["got"]) == VARIANTS


def test_the_walk_through_prints_the_tables_with_their_headers():
    text = cli("lesson", "moe16-variants", "--plain").stdout
    assert "== tables (every figure from the run) ==" in text
    rows = [line for line in text.splitlines() if line.startswith("  ETP 2 (EP 2, EDP 2)")]
    assert len(rows) == 2 and all(len(line) <= 96 for line in rows)


def test_an_etp_2_trace_says_the_expert_is_split_over_a_pair():
    text = cli("trace", "--etp", "2", "--ep", "2", "--tp", "2", "--cp", "2", "--pp", "2", "--dp", "2", "--sp").stdout
    assert "split over g0 and g1" in text and "E4 (gate 0.21) on g0" not in text


def test_numbers_line_up_on_the_right_and_words_on_the_left():
    t = Table("t", ["name", "count", "where"], [("a", [5, "g1"]), ("bbb", [1234, "g10"])])
    lines = table_lines(t, 96)
    assert lines[0] == "t"
    assert lines[1] == "  name  count  where"  # each column as wide as its widest cell or header
    assert lines[3] == "  a         5  g1" and lines[4] == "  bbb   1,234  g10"


def test_a_table_wider_than_the_page_is_printed_row_by_row_uncut():
    t = Table("wide", ["row", "first column", "second column"], [("r1", ["x" * 60, "y" * 60])])
    lines = table_lines(t, 96)
    assert all(len(line) <= 96 for line in lines)
    assert "      first column: " + "x" * 60 in lines and "      second column: " + "y" * 60 in lines


def test_a_table_refuses_two_columns_of_one_name_and_short_rows():
    import pytest
    with pytest.raises(ValueError, match="share a name"):
        Table("t", ["rank", "share", "share"], [])
    with pytest.raises(ValueError, match="cells"):
        Table("t", ["rank", "a", "b"], [("r0", [1])])


def test_ring_attention_table_is_the_post_s_rotation():
    data = json.loads(cli("lesson", "ring-attention", "--json").stdout)
    (table,) = data["tables"]
    t = 4
    for j, row in enumerate(table["rows"]):  # step j: GPU i holds GPU (i - j)'s chunk
        assert [row[f"GPU {i + 1}"] for i in range(t)] == [f"K{(i - j) % t + 1},V{(i - j) % t + 1}" for i in range(t)]
    assert len(table["rows"]) == t


def test_pp_vs_zero3_table_has_both_columns_from_the_runs():
    data = json.loads(cli("lesson", "pp-vs-zero3", "--json").stdout)
    (table,) = data["tables"]
    rows = {r["figure"]: r for r in table["rows"]}
    p = m = 4  # 4 stages, 4 micro-batches under 1F1B
    assert rows["bubble (idle share of the step)"]["PP"] == f"{p - 1}/{m + p - 1}"
    assert rows["bubble (idle share of the step)"]["ZeRO-3"] == "0"
    assert (rows["bytes x when batch doubles"]["PP"], rows["bytes x when batch doubles"]["ZeRO-3"]) == ("2", "1")
    assert all(c["ok"] for c in data["checks"])


def test_moe16_summary_and_what_g2_stores():
    data = json.loads(cli("lesson", "moe16", "--json").stdout)
    summary, stores = data["tables"]
    rows = {r["axis"]: r for r in summary["rows"]}
    # the post's layout: TP 2, CP 2, PP 2, DP 2, EP 4, ETP 1 (EDP 2); g2 is TP rank 0, CP rank 1 of node A
    assert {a: rows[a]["size"] for a in rows} == {"DP + ZeRO-1": 4, "PP": 2, "TP + SP": 2, "CP": 2, "EP": 4,
                                                  "ETP": 1, "EDP": 2}
    assert rows["PP"]["g2's group"] == "g2 g10" and rows["EP"]["g2's group"] == "g0 g1 g2 g3"
    assert rows["ETP"]["collectives it joined"] == "none" and rows["ETP"]["bytes sent"] == 0
    assert "all-to-all" in rows["EP"]["collectives it joined"]
    what = {r["what"]: r for r in stores["rows"]}
    assert what["attention weights (its TP shards)"]["share"] == "1/4 of all"  # TP 2 x PP 2
    assert what["experts E5, E6"]["share"] == "1/8 of all"  # 2 of 8 experts, 2 of 4 layers
    assert what["tokens between matmuls (SP)"]["share"] == "t5 (the) t6 (contract)"
    assert "DP 2 x CP 2 = 4" in summary["notes"][1]


def test_at_scale_sets_the_post_s_411_mb_beside_what_the_run_sent():
    data = json.loads(cli("lesson", "at-scale", "--json").stdout)
    (table,) = data["tables"]
    T, K, d, ep = 4096, 8, 7168, 8  # DeepSeek-V3's hidden size, 8 picks of 256 experts, EP 8
    post_mb = T * K * d * 2 * (ep - 1) / ep / 1e6
    assert round(post_mb) == 411 and f"= {post_mb:,.0f} MB per GPU" in table["notes"][0]
    assert len(table["rows"]) == ep
    for row in table["rows"]:
        assert row["run / pairs"] < 1 and row["the run sent (MB)"] < row["pairs x d x 2 B (MB)"]


def test_ranks_that_did_the_same_are_one_line():
    """Issue 53: zero's gradient buckets are all-reduced by 8 ranks that each send and receive the same bytes
    from the same line: one 'ranks 0-7' line each, not eight; tp-mlp's two ranks stay one line each."""
    text = cli("lesson", "zero", "--plain").stdout
    assert "    ranks 0-7 float64[400] -> float64[400]" in text
    assert not any(line.startswith("    rank 3 ") for line in text.splitlines())
    small = cli("lesson", "tp-mlp", "--plain").stdout
    assert "    rank 0 " in small and "    rank 1 " in small and "ranks 0-1" not in small

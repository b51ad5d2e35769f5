"""The post's tables as tables: named columns and one labelled row each, in --json and the walk-through
(issue 33, defect 2 and build item 1)."""
import json

import pytest

from conftest import cli

from parasim.lesson import Table, get_lesson, run_lesson
from parasim.render.tables import table_lines

VARIANTS = ["the post's layout", "zigzag CP split", "ETP 2 (EP 2, EDP 2)", "EP 8 (EDP 1)", "PP 1, DP 4"]


def test_moe16_variants_names_every_variant_in_its_tables():
    out = cli("lesson", "moe16-variants", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["tables"]
    *variants, no_sp = data["tables"]  # the last: no SP, which the layout refuses, on the TP pair alone
    assert [row["the pair at the MoE layer"] for row in no_sp["rows"]] == ["without SP", "with SP"]
    pairs = [row["(token, expert) pairs computed"] for row in no_sp["rows"]]
    assert pairs[0] == 2 * pairs[1]  # without SP both GPUs of the pair compute every pair
    for table in variants:
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
    assert len(rows) == 3 and all(len(line) <= 96 for line in rows)
    # the third table: what the token's GPU sends by group; only ETP 2 sends in expert-TP groups
    header = next(line for line in text.splitlines() if line.startswith("  variant") and "expert-tp" in line)
    col = header.split().index("expert-tp")
    sends = {line[:21].strip(): line[21:].split() for line in text.splitlines()
             if line[:21].strip() in ("the post's layout", "ETP 2 (EP 2, EDP 2)", "EP 8 (EDP 1)")
             and len(line[21:].split()) == len(header.split()) - 1}
    assert float(sends["ETP 2 (EP 2, EDP 2)"][col - 1]) > 0
    assert float(sends["the post's layout"][col - 1]) == float(sends["EP 8 (EDP 1)"][col - 1]) == 0


def test_an_etp_2_trace_says_the_expert_is_split_over_a_pair():
    text = cli("trace", "--etp", "2", "--ep", "2", "--tp", "2", "--cp", "2", "--pp", "2", "--dp", "2", "--sp").stdout
    assert "split over g0 and g1" in text and "E4 (gate 0.21) on g0" not in text


def test_numbers_line_up_on_the_right_and_words_on_the_left():
    t = Table("t", ["name", "count", "where"], [("a", [5, "g1"]), ("bbb", [1234, "g10"])])
    lines = table_lines(t, 96)
    assert lines[0] == "t"
    assert lines[1] == "  name  count  where"  # each column as wide as its widest cell or header
    assert lines[3] == "  a         5  g1" and lines[4] == "  bbb   1,234  g10"


def test_a_table_that_fits_only_with_its_headers_wrapped_reads_across():
    """Headers of three words in columns of one-digit cells: each column as wide as its longest header word,
    the headers over two lines, sitting on the rule."""
    t = Table("t", ["rank", "contiguous share %", "zigzag share %"], [("rank 0", [6, 25]), ("rank 1", [19, 25])])
    assert table_lines(t, 30) == ["t",
                                  "          contiguous   zigzag",
                                  "  rank       share %  share %",
                                  "  ------  ----------  -------",
                                  "  rank 0           6       25",
                                  "  rank 1          19       25"]
    assert table_lines(t, 96)[1] == "  rank    contiguous share %  zigzag share %"  # one line where it fits


def test_a_table_too_wide_even_wrapped_is_turned_when_that_fits():
    """Two rows of long labels and five short columns: as columns, the two labels fit; the note says so."""
    t = Table("t", ["variant", "a", "b", "c", "d", "e"],
              [("the first variant, long", [1, 2, 3, 4, 5]), ("the second variant, long", [6, 7, 8, 9, 10])])
    lines = table_lines(t, 40)
    assert max(map(len, lines)) <= 40 and "turned to fit: a column per variant" in lines[1]
    rule = next(i for i, line in enumerate(lines) if set(line) == {" ", "-"})
    assert " ".join(" ".join(lines[2:rule]).split()) == "the first the second variant variant, long variant, long"
    rows = {line.split()[0]: line.split()[1:] for line in lines[rule + 1:]}
    assert rows == {"a": ["1", "6"], "b": ["2", "7"], "c": ["3", "8"], "d": ["4", "9"], "e": ["5", "10"]}


def test_a_table_neither_way_fits_prints_its_columns_in_blocks_with_the_labels():
    t = Table("t", ["row"] + [f"col{i}" for i in range(6)], [(f"label number {j}", ["x" * 9] * 6) for j in range(6)])
    lines = table_lines(t, 40)
    assert all(len(line) <= 40 for line in lines)
    blocks = [line for line in lines if line.startswith("  (column")]
    assert blocks == ["  (columns 1-2 of 6)", "  (columns 3-4 of 6)", "  (columns 5-6 of 6)"]
    assert sum(line.startswith("  label number 0 ") for line in lines) == 3  # the labels in every block


def test_long_words_in_a_text_column_wrap_inside_their_cell():
    t = Table("t", ["way", "how it is timed", "step (s)"],
              [("the post's", ["40% of the peak", 92.1]), ("the plan's", ["causal halved, the backward 2.5x", 90.8])])
    lines = table_lines(t, 36)
    assert max(map(len, lines)) <= 36
    at = next(i for i, line in enumerate(lines) if line.startswith("  the plan's"))
    assert lines[at].split()[-1] == "90.8"
    assert " ".join(" ".join(lines[at:at + 3]).split()) == "the plan's causal halved, 90.8 the backward 2.5x"


def test_a_table_with_a_cell_wider_than_the_page_is_printed_row_by_row_uncut():
    t = Table("wide", ["row", "first column", "second column"], [("r1", ["x" * 100, "y" * 60])])
    lines = table_lines(t, 96)
    assert "      first column: " + "x" * 100 in lines and "      second column: " + "y" * 60 in lines


def test_a_table_refuses_two_columns_of_one_name_and_short_rows():
    import pytest
    with pytest.raises(ValueError, match="share a name"):
        Table("t", ["rank", "share", "share"], [])
    with pytest.raises(ValueError, match="cells"):
        Table("t", ["rank", "a", "b"], [("r0", [1])])


def test_ring_attention_table_is_the_post_s_rotation():
    data = json.loads(cli("lesson", "ring-attention", "--json").stdout)
    table = data["tables"][0]  # the rotation first; the causal 4-token grid after it
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
    assert (rows["bytes x when batch doubles"]["PP"], rows["bytes x when batch doubles"]["ZeRO-3"]) == (2, 1)
    assert all(c["ok"] for c in data["checks"])


def test_moe16_summary_and_what_g2_stores():
    data = json.loads(cli("lesson", "moe16", "--json").stdout)
    summary, stores = data["tables"][:2]  # then the map (test_moe16.py) and the slot table
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
    table = data["tables"][0]
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


TABLE_LESSONS = ("cp-causal", "hot-expert", "all-to-all-hidden", "tp-across-nodes", "fit-is-not-fast", "moe16-variants")


@pytest.mark.parametrize("width", [100, 200])
@pytest.mark.parametrize("name", TABLE_LESSONS)
def test_every_lessons_tables_read_across_at_100_and_200_columns(name, width):
    """Issue 53: at 100 and 200 columns no line of the tables is longer than the page and no table is stacked
    as "column: value" lines; each table's first row starts with its label."""
    out = cli("lesson", name, "--plain", "--width", str(width))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    tables = text[text.index("== tables"):text.index("\n", text.index(" events over "))]
    assert max(map(len, tables.splitlines())) <= width
    data = json.loads(cli("lesson", name, "--json").stdout)["tables"]
    for t in data:
        first = t["rows"][0]
        label = str(first[t["columns"][0]])
        rows = [line for line in tables.splitlines() if line.startswith("  " + label + " ")]
        assert rows, (name, label)
        stacked = [f"      {c}: " for c in t["columns"][1:]]  # how a table printed a row at a time looks
        assert not any(line.startswith(tuple(stacked)) for line in tables.splitlines()), name


def test_the_width_is_the_terminals_and_bounded():
    assert "--width N" in cli("lesson", "--help").stdout
    for bad in ("30", "300", "x"):
        out = cli("lesson", "hot-expert", "--plain", "--width", bad)
        assert out.returncode == 2 and out.stderr.count("\n") == 1


def test_pp_zero_bubble_puts_the_three_schedules_side_by_side():
    """Issue 53: makespan, idle, bubble, held and the model's depth of each schedule, from the run; p = 4,
    m = 8, F = 2 and B = I + W = 4 half-stage units: 1F1B m(F+B) + (p-1)(F+B) = 66 with 18 idle, ZB-H1
    (p-1)(F+I-W) = 6 idle, DualPipeV half that on 2p stages; its loss differs and the narrative says why."""
    data = json.loads(cli("lesson", "pp-zero-bubble", "--json").stdout)
    (table,) = data["tables"]
    rows = {r["schedule"]: r for r in table["rows"]}
    assert rows["1F1B"]["makespan"] == 8 * 6 + 3 * 6 and rows["1F1B"]["idle per GPU"] == 3 * 6
    assert rows["ZB-H1"]["idle per GPU"] == 3 * 2 and rows["DualPipeV"]["idle per GPU"] == 3
    assert rows["1F1B"]["bubble"] == "3/11" and rows["ZB-H1"]["held (micro-batches)"] == 4
    assert rows["DualPipeV"]["held (micro-batches)"] == 4 + 0.5  # 2p + 1 half-depth chunks: p + 1/2 micro-batches
    assert [rows[s]["stages (layers)"] for s in ("1F1B", "ZB-H1", "DualPipeV")] == [4, 4, 8]
    assert rows["1F1B"]["loss"] == rows["ZB-H1"]["loss"] != rows["DualPipeV"]["loss"]
    text = " ".join(cli("lesson", "pp-zero-bubble", "--plain").stdout.split())
    assert "twice the depth of the model 1F1B and ZB-H1 split" in text


def test_pp_zero_bubble_held_counts_line_up_on_the_right():
    """The held column is numbers (DualPipeV's half micro-batch as 4.5, not the string '9/2'), so the plain
    table puts each under the right edge of its header; as strings they once sat at its left edge, a column's
    width away from the stages beside them ('4                                   4')."""
    text = cli("lesson", "pp-zero-bubble", "--plain", "--width", "100").stdout
    lines = text[text.index("4 GPUs, 8 micro-batches"):].splitlines()
    head = next(line for line in lines if "(micro-batches)" in line)  # the header's last line ("held" over it)
    right = head.index("(micro-batches)") + len("(micro-batches)")
    cells = {}
    for name in ("1F1B", "ZB-H1", "DualPipeV"):
        row = next(line for line in lines if line.strip().startswith(name + " "))
        cells[name] = row[:right].split()[-1]
        assert row[right] == " ", row  # the cell ends at the header's right edge
    assert cells == {"1F1B": "4", "ZB-H1": "4", "DualPipeV": "4.5"}  # p = 4; 2p + 1 half-depth chunks


def test_tp_mlp_at_tp_4_says_why_ranks_send_unequal_bytes():
    """Issue 53: Z's 2 values over a ring of 4 ranks: chunks of 1, 1, 0, 0 values; the ranks' average is the
    ring's 2(t-1)/t x 16 B = 24 B, as the trace's own sends add up to."""
    out = cli("lesson", "tp-mlp", "--tp", "4", "--json")
    data = json.loads(out.stdout)
    text = cli("lesson", "tp-mlp", "--tp", "4", "--plain").stdout
    assert "its chunks hold 1, 1, 0, 0 values" in text and "24 B here, is the ranks' average" in text
    g = next(e for e in data["events"] if e.get("label") == "g forward")
    sent = [m["sent"] for m in g["members"]]
    assert len(set(sent)) > 1 and sum(sent) / len(sent) == 2 * 3 * 16 / 4
    assert "ring of" not in cli("lesson", "tp-mlp", "--plain").stdout  # at the post's TP 2 the chunks are even


def test_all_to_all_hidden_computes_the_posts_ep_arithmetic_beside_the_run():
    """Issue 53 item 6: T K d b (EP-1)/EP = 4,096 x 8 x 7,168 x 2 x 7/8 = 411.0 MB one way (the combine sends it
    to the byte), 822.1 MB forward and as much backward; a TP 8 all-reduce 2 T d b 2(t-1)/t = 205.5 MB; gathering
    the layer's 256 experts of 2 x 7,168 x 2,048 BF16 weights 15,032.4 MB."""
    data = json.loads(cli("lesson", "all-to-all-hidden", "--json").stdout)
    (table,) = [t for t in data["tables"] if t["columns"][0] == "figure"]
    rows = {r["figure"].split(":")[0].split(" (")[0]: r for r in table["rows"]}
    post = "the post's formula (MB)"
    assert rows["dispatch, one direction"][post] == 411.0 and rows["combine, the way back"]["the run (MB)"] == 411.0
    assert rows["dispatch + combine, forward"][post] == 822.1 and rows["the same backward"][post] == 822.1
    assert rows["a TP 8 all-reduce of the tokens instead"][post] == 205.5
    assert rows["ZeRO-3's way"][post] == 15032.4


def test_wrapped_text_columns_share_the_spare_width_by_what_each_lacks():
    """Three text columns, each far wider than a 100-column page allows: each gets a share of the spare width in
    proportion to its longest cell (here equal), so none is left a word wide beside one that took it all."""
    words = " ".join(["word"] * 40)  # 199 characters a cell
    t = Table("three long columns", ["row", "a", "b", "c"], [("r", [words, words, words])])
    lines = table_lines(t, 100)
    head = next(line for line in lines if line.lstrip().startswith("---"))
    widths = [len(dashes) for dashes in head.split()][1:]
    assert max(widths) - min(widths) <= 1 and min(widths) >= 25, widths
    assert max(map(len, lines)) <= 100


def test_the_sends_table_counts_the_token_s_gpu_alone():
    """The post's layout's row is the lesson's own run: what g2 (the GPU holding 'contract') sent in each group,
    summed here from the run's trace."""
    lr = run_lesson(get_lesson("moe16-variants"))
    table = lr.tables[2]
    mine: dict = {}
    for e in lr.result.trace.events:
        if e.kind != "compute" and e.group is not None:
            mine[e.group.name] = mine.get(e.group.name, 0) + sum(m.sent for m in e.members if m.rank == 2)
    row = dict(table.rows)["the post's layout"]
    assert {g: v for g, v in zip(table.columns[1:], row)} == {g: round(mine.get(g, 0) / 1e3, 1) for g in table.columns[1:]}

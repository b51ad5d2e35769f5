"""`parasim cheatsheet` (issue 53, build item 3): the post's cheat sheet with every cell read from a lesson's
run. Each figure is worked out here by hand (or is the post's own), never taken from the code under test."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from conftest import cli
from parasim.examples.cheatsheet import CHEAT_ROWS, cheat_sheet

_SHEET: list = []


def sheet():
    if not _SHEET:
        _SHEET.append(cheat_sheet())
    return _SHEET[0]


def figures(method: str) -> dict:
    return next(r.figures for r in sheet().rows if r.method == method)


def test_one_row_per_method_in_the_posts_order():
    assert [r.method for r in sheet().rows] == ["DP", "ZeRO-1/2/3", "TP", "SP", "CP", "PP", "EP"]
    assert [m.name for m in CHEAT_ROWS] == [r.method for r in sheet().rows]


def test_bytes_a_parameter_by_hand():
    # 2 bytes of weight, 2 of gradient, 12 of Adam (an FP32 copy, two moments); ZeRO shards over DP 8:
    # stage 1 the 12, stage 2 the gradients too, stage 3 everything
    dp = 8
    assert figures("DP")["bytes_per_parameter"] == 2 + 2 + 12
    assert figures("ZeRO-1/2/3")["bytes_per_parameter"] == {
        "DP": 16,
        "ZeRO-1": 2 + 2 + 12 / dp,
        "ZeRO-2": 2 + (2 + 12) / dp,
        "ZeRO-3": 16 / dp,
    }


def test_zero3_sends_one_and_a_half_times_dp():
    # DP: one all-reduce of the gradients, 2(n-1)/n of them; ZeRO-3: the weights gathered for forward and again
    # for backward, and the gradients reduce-scattered: 3(n-1)/n
    assert figures("ZeRO-1/2/3")["zero3_over_dp"] == pytest.approx(3 / 2)


def test_tp_four_all_reduces_a_layer_the_posts_figure():
    f = figures("TP")
    assert (f["all_reduce_forward"], f["all_reduce_backward"]) == (2, 2)
    assert (f["tp"], f["heads"]) == (4, 4)  # tp-attention at its default: 4 ranks, a head each


def test_tp_over_two_nodes_is_the_same_layers_time_at_tp_16_over_tp_8():
    """The TP row's limit: tp-across-nodes' own table, the layer's time at TP 16 over two nodes against TP 8 in
    one, read from that lesson's JSON (the cheat sheet reads its run)."""
    import json

    from tests.conftest import cli

    data = json.loads(cli("lesson", "tp-across-nodes", "--json").stdout)
    rows = {r["layout"]: r["layer (ms)"] for t in data["tables"] for r in t["rows"] if "layer (ms)" in r}
    ratio = rows["TP 16 over two nodes"] / rows["TP 8 inside one node"]
    assert figures("TP")["over_two_nodes"] == f"{ratio:.2f}x" and ratio > 2


def test_sp_bytes_and_memory_by_hand():
    f, t = figures("SP"), 8
    # 8 ring passes of an activation a layer under TP; SP adds backward's two re-gathers: 10 of them
    assert f["bytes_over_tp"] == pytest.approx(10 / 8, rel=0.01)
    # Korthikanti et al.: sbh(10 + 24/t) kept against 34sbh/t
    assert f["activations_less"] == pytest.approx((10 + 24 / t) / (34 / t), abs=0.001)


def test_cp_ring_passes_and_zigzag_by_hand():
    f = figures("CP")
    assert f["sends_forward"] == 2 * (f["cp"] - 1)  # K and V, from each of the other cp - 1 ranks
    # 4 ranks, 16 tokens in 8 pieces: the contiguous split's last rank computes 7 + 6 + ... blocks (14 of the
    # quarter-pieces' causal triangle), zigzag's every rank 8
    assert f["zigzag_speedup"] == pytest.approx(14 / 8)


def test_pp_bubble_and_sends_by_hand():
    f = figures("PP")
    p, m = f["pp"], f["microbatches"]
    assert Fraction(f["bubble"]) == Fraction(p - 1, m + p - 1) == Fraction(3, 7)
    assert f["p2p"] == 2 * (p - 1) * m  # an activation forward and its gradient back, at each cut


def test_ep_all_to_alls_a_layer():
    assert figures("EP")["all_to_all_per_layer"] == 4  # dispatch and combine, forward and backward


def test_command_plain_json_and_width():
    out = cli("cheatsheet", "--width", "100")
    assert out.returncode == 0 and out.stderr == "", out.stderr  # no progress into a pipe
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "(columns" not in out.stdout
    for method in ("DP", "ZeRO-1/2/3", "TP", "SP", "CP", "PP", "EP"):
        assert any(line.startswith(f"  {method} ") for line in lines)
    got = json.loads(cli("cheatsheet", "--json").stdout)
    assert [r["lessons"] for r in got["rows"]][0] == ["zero"] and len(got["rows"]) == 7
    bad = cli("cheatsheet", "--width", "30")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--width" in bad.stderr


def _row(method: str):
    return next(r for r in sheet().rows if r.method == method)


def test_sp_says_at_its_row_why_it_sends_more_than_tp():
    """The post: SP moves the same bytes as TP. The run: 1.25x, and the note under the row says why, with the
    sp lesson's figures worked by hand: one layer of s = 16 tokens, b = 1, h = 16, float64, over t = 8 ranks.
    A ring all-reduce sends 2(t - 1)/t of its array, an all-gather or a reduce-scatter (t - 1)/t: TP's 4
    all-reduces equal SP's 4 pairs, and backward adds 2 all-gathers of the saved slices (fc1's and qkv's
    inputs, before their weight gradients), while 6 all-reduces of h values sum the norms' and biases'
    gradients."""
    sbh, t, word = 16 * 1 * 16, 8, 8
    tp = 4 * 2 * (t - 1) * sbh * word // t
    again = 2 * (t - 1) * sbh * word // t
    sums = 6 * 2 * (t - 1) * 16 * word // t
    f = figures("SP")
    assert (f["tp_bytes"], f["pairs_bytes"], f["regathers"], f["regathered_bytes"], f["gradient_sum_bytes"]) == (
        tp, tp, 2, again, sums)
    assert f["bytes_over_tp"] == (tp + again) / tp == 1.25
    note = " ".join(_row("SP").notes["communication"].split())
    for said in (f"{tp:,} B against {tp:,} B", "the same bytes", "2 more all-gathers", f"({again:,} B)",
                 "fc1 and qkv", "weight-gradient", f"6 small all-reduces ({sums:,} B)", "1.25x"):
        assert said in note, said


def test_cp_names_its_mask_limit_and_the_note_says_it():
    row = _row("CP")
    assert "custom masks" in row.limit
    note = row.notes["limit"]
    assert "mask" in note and "chunk by chunk" in note and f"{figures('CP')['zigzag_speedup']:g}x" in note


def test_a_note_is_marked_at_its_cell_and_printed_under_the_table():
    from parasim.examples.cheatsheet import footnoted

    t = sheet().table()
    cells = dict(t.rows)
    marked = {m: [c for c in cells[m] if c.endswith("]")] for m in cells}
    assert marked["SP"] == [f"{_row('SP').communication} [2]"]  # TP's limit has note 1
    assert marked["CP"] == [f"{_row('CP').limit} [3]"] and marked["DP"] == []
    assert [n.split(" ", 2)[:2] for n in t.notes[:-1]] == [["[1]", "TP:"], ["[2]", "SP:"], ["[3]", "CP:"],
                                                          ["[4]", "EP:"]]
    # a table of some columns only numbers only their notes: the splits and what moves carry SP's alone
    _, notes = footnoted(sheet().rows, ("splits", "communication"))
    assert len(notes) == 1 and notes[0].startswith("[1] SP: ")


def test_at_200_columns_every_row_reads_across_on_one_line():
    """Issue: the cheat sheet's cells wrapped even at --width 200. Each row is one line there (the line after a
    method's is the next method's), and at 100 every line still fits the page."""
    out = cli("cheatsheet", "--width", "200")
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 200
    methods = ["DP", "ZeRO-1/2/3", "TP", "SP", "CP", "PP", "EP"]
    first = next(i for i, line in enumerate(lines) if line.startswith("  DP "))
    assert [line.split("  ")[1] for line in lines[first:first + 7]] == methods
    assert lines[first + 7].startswith("  [1] ")
    narrow = cli("cheatsheet", "--width", "100").stdout.splitlines()
    assert max(map(len, narrow)) <= 100 and sum(line.startswith("  [") for line in narrow) == 4

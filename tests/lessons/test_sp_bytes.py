"""TP + SP against TP alone, in bytes: the lessons that say "the same bytes" show where the rest comes from
(issue 33, defect 10)."""
import json

import pytest
from conftest import cli


@pytest.mark.parametrize("lesson", ["longest-sequence", "memory"])
def test_the_table_accounts_for_every_byte_sp_sends(lesson):
    data = json.loads(cli("lesson", lesson, "--json").stdout)
    table = next(t for t in data["tables"] if t["title"].startswith("Bytes rank 0 sent"))
    rows = {r["collectives"]: r for r in table["rows"]}
    alone, sp = rows["total"]["TP alone"], rows["total"]["TP + SP"]
    # a layer of s = 16 tokens, h = 16, float64, over t = 4 ranks: TP's 4 all-reduces each send 2(t-1)/t sbh
    s, h, t, item = 16, 16, 4, 8
    assert alone == 4 * 2 * (t - 1) * s * h * item // t
    assert rows["all-gathers and reduce-scatters in their place"]["TP + SP"] == alone  # the post's "same bytes"
    # backward gathers the two saved input slices (qkv's and fc1's) again: 2 all-gathers of (t-1)/t sbh
    assert rows["backward's second all-gather of the saved slices"]["TP + SP"] == 2 * (t - 1) * s * h * item // t
    parts = [r["TP + SP"] for name, r in rows.items() if name != "total"]
    assert sum(parts) == sp > alone
    assert f"{alone:,} B against {sp:,} B" in table["notes"][0]

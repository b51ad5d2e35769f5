"""The post's 34 sbh broken into its parts (issue 53, the walk's activations section): the memory lesson's table
of what one layer keeps, item by item, held against Korthikanti et al.'s count worked here by hand."""
import pytest

import parasim

# bytes a token per unit of h: (item, one GPU, split by TP alone, split by SP)
HAND = [("ln1: input", 2, False), ("attn.qkv: input", 2, False), ("attn: q", 2, True), ("attn: k", 2, True),
        ("attn: v", 2, True), ("attn.out: input", 2, True), ("attn dropout: mask", 1, False),
        ("ln2: input", 2, False), ("mlp.fc1: input", 2, False), ("mlp: activation input", 8, True),
        ("mlp.fc2: input", 8, True), ("mlp dropout: mask", 1, False)]


@pytest.mark.parametrize("t", [2, 4])
def test_the_34_item_by_item(t):
    lr = parasim.lesson("memory", tp=t)
    table = next(x for x in lr.tables if x.title.startswith("What one layer keeps for backward, item by item"))
    rows = dict(table.rows)
    for name, whole, tp_splits in HAND:
        assert rows[name] == [whole, whole / t if tp_splits else whole, whole / t], name
    assert rows["all of it"] == [34, 10 + 24 / t, 34 / t]
    note = " ".join(table.notes)
    assert "attention 11" in note and "norms' inputs 4" in note and "the MLP 19" in note

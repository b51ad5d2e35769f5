"""Ranks' notes alike but for their figures (issue 53, walls of text): a 64-GPU run's every rank saying its
count is said for the first four and the last two, with one line for those between; notes that say different
things, or few of them, are each said."""
from parasim.render.walkthrough import _note_lines, _same_note


def _notes(ranks, words="its 4,096 tokens' picks lie on {} pairs"):
    return [f"rank {r}: " + words.format(18_000 + 7 * r) for r in ranks]


def test_many_alike_notes_fold_to_the_first_four_and_the_last_two():
    lines = _note_lines(_notes(range(64)))
    assert lines[:4] == [f"  {n}" for n in _notes(range(4))]
    assert lines[4] == "  ... ranks 4 to 61 (58): the same, each with its own figures"
    assert lines[5:] == [f"  {n}" for n in _notes((62, 63))]


def test_few_notes_or_ranks_out_of_order_are_said_or_named_as_they_are():
    assert _note_lines(_notes(range(8))) == [f"  {n}" for n in _notes(range(8))]  # 8: each said
    odd = _note_lines(_notes([0, 1, 2, 3, 5, 9, 12, 13, 14]))
    assert odd[4] == "  ... the ranks between (3): the same, each with its own figures"


def test_notes_alike_only_where_only_figures_differ():
    a, b = _notes([0, 1])
    assert _same_note(b, a)
    assert not _same_note("rank 1: its 4,096 tokens' picks lie on 3 nodes", a)
    assert not _same_note("a note of the run, not a rank's", a)

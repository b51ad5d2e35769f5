"""One number formatter for every renderer (issue 33, build item 7): render/numbers.py, and the walk-through,
the tables and the app writing the same number the same way."""
import pytest

from parasim.lesson import Table
from parasim.render.numbers import nbytes, scalar
from parasim.render.tables import cell, table_lines
from parasim.render.walkthrough import fmt_bytes, fmt_value
from parasim.tui.view import fmt


@pytest.mark.parametrize("v, want", [(1234, "1,234"), (2.0, "2"), (-1e6, "-1,000,000"), (0.1 + 0.2, "0.3"),
                                     (1 / 3, "0.333333"), (12345.678, "12,345.7"), (1e20, "1e+20"), (0, "0"),
                                     ("3/7", "3/7"), (True, "True")])
def test_a_number_alone(v, want):
    assert scalar(v) == want


def test_bytes_and_lists():
    assert nbytes(5600) == "5,600 B" == fmt_bytes(5600)
    assert fmt_value([1111, 2222.0]) == "[1111, 2222]"  # inside a list written with commas: no separators
    assert fmt_value({"a": 1024}) == "{a: 1,024}"
    assert fmt([[1111.0, 0.125]]) == "[1111 0.125]"  # a tensor's values in the app
    assert fmt(2 / 3) == "0.6667"  # 4 digits in the app's narrow panels


@pytest.mark.parametrize("v", [12288, 16512.0, 0.75, 855638016])
def test_the_walk_through_and_a_table_write_a_number_alike(v):
    line = table_lines(Table("t", ["what", "value"], [("x", [v])]))[-1]
    assert fmt_value(v) == cell(v) == line.split()[-1]


def test_a_short_byte_count_is_exact_below_a_million_and_three_figures_past_it():
    """The walk-through's member columns: every byte of a lesson's small sends, a real size's in three figures
    of the decimal unit the post writes (94,371,840 B is 94.4 MB)."""
    from parasim.render.numbers import nbytes_short

    assert [nbytes_short(n) for n in (0, 32, 999_999)] == ["0 B", "32 B", "999,999 B"]
    assert [nbytes_short(n) for n in (1_000_000, 94_371_840, 1_210_000_000, 5 * 10**12)] == [
        "1 MB", "94.4 MB", "1.21 GB", "5 TB"]


def test_a_tables_title_and_notes_never_cut_a_hyphenated_word():
    """A note naming lessons (all-to-all-hidden) or groups (expert-dp) wraps between words, never at a hyphen
    inside one (the walk-through's own rule, wrap_words); every line still within the width."""
    note = "compare " + " ".join(["at-scale", "all-to-all-hidden", "expert-dp"] * 6)
    lines = table_lines(Table("a title with all-to-all-hidden " * 3, ["what", "value"], [("x", [1])], notes=[note]),
                        60)
    words = {w for line in lines for w in line.split()}
    assert {"at-scale", "all-to-all-hidden", "expert-dp"} <= words
    cut = [line for line in lines if line.rstrip().endswith("-") and set(line.strip()) != {"-", " "}]  # not rules
    assert not cut and max(map(len, lines)) <= 60

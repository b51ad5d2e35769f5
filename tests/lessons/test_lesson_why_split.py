"""Lesson why-split (the post's opening): a parameter's copies under mixed-precision Adam, held by the run; the
27B model's state against an H200; the six ways to split, each row from the lessons that run it."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from parasim.lesson import get_lesson, run_lesson
from tests.conftest import cli


@pytest.fixture(scope="module")
def ran():
    return run_lesson(get_lesson("why-split"))


def _table(lr, start: str):
    return next(t for t in lr.tables if t.title.startswith(start))


def test_a_parameter_takes_16_bytes_as_the_ranks_hold_it(ran):
    """2 + 2 bytes of bfloat16 weight and gradient, 4 + 4 + 4 of float32 master weight and Adam's moments:
    the dtypes' sizes from numpy and ml_dtypes, not from parasim."""
    bf16, fp32 = np.dtype(ml_dtypes.bfloat16).itemsize, np.dtype(np.float32).itemsize
    assert (bf16, fp32) == (2, 4)
    for v in ran.result.values:
        assert list(v["bytes"].values()) == [bf16, bf16, fp32, fp32, fp32]
        assert v["dtypes"]["weight"] == "bfloat16" and v["dtypes"]["master weight"] == "float32"
    rows = dict(_table(ran, "One parameter").rows)
    assert rows["all of them"][-1] == 2 * bf16 + 3 * fp32 == 16
    assert all(c.ok for c in ran.checks)


def test_the_27b_model_needs_432_gb_against_an_h200s_141(ran):
    """The post's opening figures: 27 x 10^9 parameters x 16 B = 432 GB, over three H200s' 141 GB each."""
    rows = {name: cells[0] for name, cells in _table(ran, "The 27B model").rows}
    assert rows["weights, gradients and Adam's state"] == pytest.approx(27e9 * 16 / 1e9)
    assert rows["the same, from the estimator"] == pytest.approx(432)
    assert rows["one GPU's memory (datasheet)"] == 141
    # activations of one sequence are as large as the model's state when the attention scores are kept
    assert rows["activations of one 4,096-token sequence, scores kept"] > rows["one GPU's memory (datasheet)"]


def test_the_six_ways_each_name_the_lessons_that_run_them(ran):
    """DP and ZeRO, TP, SP, CP, PP, EP: each row read from runs of real lessons, named in its last column."""
    from parasim.lesson import load_lessons

    ways = _table(ran, "Six ways")
    assert [name for name, _ in ways.rows] == ["DP", "ZeRO-1/2/3", "TP", "SP", "CP", "PP", "EP"]
    names = set(load_lessons())
    assert all(set(cells[-1].split(", ")) <= names for _, cells in ways.rows)


def test_the_replicas_step_together_after_summing_their_gradients(ran):
    """One all-reduce of the bfloat16 gradients over the two ranks, then the same Adam step on each."""
    (event,) = ran.result.trace.events
    assert event.op == "all_reduce" and sorted(event.ranks) == [0, 1]
    assert all(m.sent == 1024 * 2 for m in event.members)  # a ring of two: each sends its whole 2 KiB once
    a, b = (v["weight"] for v in ran.result.values)
    assert np.array_equal(a, b)


def test_the_quiz_asks_for_the_432_gb():
    out = cli("lesson", "why-split", "--quiz", "--answer", "432 GB", "--json")
    (graded,) = json.loads(out.stdout)["quiz"]
    assert graded["right"] and graded["answer"] == pytest.approx(432)


def test_the_sp_row_says_why_it_moves_more_than_tp(ran):
    """The post says SP moves TP's bytes; the row reads 1.25x. Its cell is marked and the note under the table
    says why: backward gathers the saved slices again (2 all-gathers a layer in the sp lesson). The limit
    column is not shown here, so CP's mask note is not either."""
    ways = _table(ran, "Six ways")
    cells = dict(ways.rows)
    assert cells["SP"][1].endswith("1.25x TP's bytes [1]")
    assert [m for m, c in cells.items() if any(str(x).endswith("]") for x in c)] == ["SP"]
    (note,) = ways.notes
    assert note.startswith("[1] SP: ") and "2 more all-gathers" in note and "before the weight-gradient" in note


@pytest.mark.parametrize("width", [100, 200])
def test_the_lesson_fits_the_page(width):
    out = cli("lesson", "why-split", "--plain", "--width", str(width))
    assert out.returncode == 0 and max(map(len, out.stdout.splitlines())) <= width
    assert "  SP " in out.stdout and "[1] SP: " in out.stdout

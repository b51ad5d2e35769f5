"""The plain walk-through's folding of calls alike on other groups (render/walkthrough, Lesson.fold_alike):
only calls that did the very same thing are folded: the same arrays in and out, the same bytes, the same line."""
import re

import numpy as np

from parasim.engine import run
from parasim.lesson import Lesson, LessonRun
from parasim.render.walkthrough import walkthrough


def program(ctx):
    pairs = [ctx.new_group(g, "pair") for g in ([0, 1], [2, 3])]
    four = ctx.new_group([4, 5, 6, 7], "four")
    x = np.ones(4)
    mine = pairs[ctx.rank // 2] if ctx.rank < 4 else four
    ctx.comm.all_gather(x, group=mine, label="gather")  # the same array in; out and bytes differ by group size
    return None


def text() -> str:
    lesson = Lesson("fold", "folding", 8, program, {}, lambda r: [], fold_alike=True)
    return walkthrough(LessonRun(lesson, run(program, 8), []), width=100)


def test_only_calls_with_the_same_arrays_out_and_bytes_fold():
    said = text()
    assert "... and the same call on 1 more pair group: [2, 3]" in said
    assert said.count("step   1  all_gather") == 2  # the pairs' calls once, the group of four's apart
    assert "on four[4-7]" in said  # consecutive ranks as a range


def test_a_slot_table_numbers_its_slots_above_its_rows():
    """pp-1f1b's slot table: a line numbering the slots 1 to 14 above the rows, each number over its column
    (the post's tables run a 'time' line above theirs)."""
    from tests.conftest import cli

    lines = cli("lesson", "pp-1f1b", "--plain", "--width", "100").stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("  rank 0: GPU 1:"))
    ruler, row = lines[i - 1], lines[i]
    assert ruler.split() == ["slot", *map(str, range(1, 15))]
    # each slot's number starts where its cell does
    starts = [m.start() for m in re.finditer(r"\S+", row)][4:]  # after "rank 0: GPU 1:"
    assert [m.start() for m in re.finditer(r"\d+", ruler)] == starts

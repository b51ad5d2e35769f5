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


def test_a_phase_that_repeats_anothers_calls_says_so_once_and_alike_notes_are_one_line():
    """sp runs TP + SP twice (FlashAttention, then scores kept): the second phase's 16 calls are the first's, on
    the same group, so it names them in one line with both phases' steps; its ranks' notes stay (their figures
    differ from the first's), and eight ranks that noted the very same words are one 'ranks 0-7' line."""
    from parasim.lesson import get_lesson, run_lesson

    lr = run_lesson(get_lesson("sp"))
    text = walkthrough(lr, width=100)
    steps = {p: [e.step for e in lr.result.trace.events if e.phase == p] for p in ("TP + SP", "TP + SP, scores kept")}
    first, again = steps["TP + SP"], steps["TP + SP, scores kept"]
    block = text.split("== TP + SP, scores kept ==")[1].split("\n== ")[0]
    said = " ".join(block.split())
    assert (f"the same {len(again)} calls as 'TP + SP' (steps {first[0]}-{first[-1]}), here at steps "
            f"{again[0]}-{again[-1]}") in said and "\nstep " not in block
    assert "ranks 0-7: keeps" in block and "rank 3: keeps" not in block
    assert "== TP + SP ==\n" in text and text.split("== TP + SP ==")[1].count("\nstep ") == len(first)

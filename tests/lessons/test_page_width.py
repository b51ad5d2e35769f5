"""Every lesson's plain walk-through fits the page it is asked for: at 100 columns (a laptop's terminal) and at
200, no line runs past the width, so that a terminal never wraps a line in the middle of its columns. The
run is made once a lesson and laid out at both widths."""

from __future__ import annotations

import pytest

from parasim.lesson import load_lessons, run_lesson
from parasim.render.walkthrough import event_lines, walkthrough

SLOW_LESSONS = {"moe16-variants", "at-scale", "node-limited", "rules-of-thumb"}  # several seconds each


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_LESSONS else n for n in load_lessons()]
)
def test_every_line_of_every_lesson_fits_100_and_200_columns(name):
    lr = run_lesson(load_lessons()[name])
    for width in (100, 200):
        over = [line for line in walkthrough(lr, width=width).splitlines() if len(line) > width]
        assert not over, f"{name} at {width}: {len(over)} lines too long, the first: {over[0]!r}"


def _moe16_dispatch():
    lr = run_lesson(load_lessons()["moe16"])
    return next(e for e in lr.result.trace.events if e.op == "all_to_all")


def test_an_events_source_line_is_said_once_on_its_head_and_its_members_keep_their_columns():
    """moe16's first dispatch: every member called it from nn/moe.py, said once on the head (wrapped under
    it at 100 columns); each member's line holds its chunks' rows, in rank order, and its bytes, whole."""
    e = _moe16_dispatch()
    lines = list(event_lines(e, 100))
    site = e.members[0].site
    assert site.startswith("parasim/nn/moe.py:") and sum(site in line for line in lines) == 1
    members = [line for line in lines if line.startswith("    rank ")]
    assert len(members) == len(e.members)
    m = e.members[0]
    rows = "/".join(str(t.shape[0]) for t in m.ins)
    assert f"{len(m.ins)} x float64[{rows}, " in members[0] and members[0].split()[-3:] == ["recv", f"{m.recv:,}", "B"]
    assert all(len(line) <= 100 for line in lines)
    # at 200 columns the head is one line, the source line at its end
    assert next(iter(event_lines(e, 200))).endswith(site)


def test_the_list_of_lessons_takes_the_page_width():
    """`lesson --list --width 200` lays its table out on 200 columns (a walk found it wrapped at 80 whatever the
    width): each lesson's title on one line; at 100 no line is longer than 100."""
    from tests.conftest import cli

    wide = cli("lesson", "--list", "--width", "200").stdout.splitlines()
    assert max(map(len, wide)) <= 200 and any(
        "The three collectives: all-reduce, reduce-scatter, all-gather" in line for line in wide)
    assert max(map(len, cli("lesson", "--list", "--width", "100").stdout.splitlines())) <= 100

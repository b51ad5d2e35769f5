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


def test_a_source_line_goes_under_a_head_with_no_room_for_it():
    """moe16's first all-gather: its head fits 100 columns, with its source line it would not; the source line
    goes on the line under it (said once for every member), and at 200 columns at the head's end."""
    lr = run_lesson(load_lessons()["moe16"])
    e = next(e for e in lr.result.trace.events if e.op == "all_gather")
    site = e.members[0].site
    narrow, wide = list(event_lines(e, 100)), list(event_lines(e, 200))
    assert site not in narrow[0] and narrow[1] == " " * 12 + site and narrow[2].startswith("    rank ")
    assert wide[0].endswith(f"  {site}") and len(wide[0]) > 100
    assert sum(site in line for line in narrow + wide) == 2  # once at each width, never on a member's line


def _event_of(members: int, ins, outs, sent: int = 10**8):
    from parasim.comm.interface import Group
    from parasim.comm.trace import Event, Member

    group = Group(tuple(range(members)), "tp", 0)
    return Event(0, 1, "collective", "all_gather", group,
                 [Member(r, ins, outs, sent, sent, "x.py (f)") for r in range(members)])


def test_sixteen_members_alike_are_one_line_and_a_long_line_keeps_its_numbers_whole():
    """A group of 16 that did the same: one 'ranks 0-15' line, not 8 of them and a gap (alike ranks fold before
    a big group is cut); a member's line too wide for its columns closes them up, and where even that is too
    wide its bytes go under its arrays, never a number apart from its unit."""
    from parasim.comm.trace import Tensor

    t = Tensor((256, 2, 6144), "bfloat16")
    lines = list(event_lines(_event_of(16, (t,), (t,)), 100))
    assert [line.split()[:2] for line in lines[1:]] == [["ranks", "0-15"]]
    assert lines[1].endswith(" sent    100 MB  recv    100 MB")  # in columns, right-aligned: it fits
    many = tuple(Tensor((1600 + i, 7184), "bfloat16") for i in range(16))
    lines = list(event_lines(_event_of(16, many, many), 100))
    assert lines[1].split()[:2] == ["ranks", "0-15"] and lines[2] == " " * 14 + "sent 100 MB, recv 100 MB"
    assert all(len(line) <= 100 for line in lines)
    mid = (Tensor((1600, 71), "bfloat16"),) * 3
    lines = list(event_lines(_event_of(16, mid, mid), 110))  # 114 in columns, 109 closed up
    assert len(lines) == 2 and lines[1].endswith("  sent 100 MB, recv 100 MB")  # closed up, one line


@pytest.mark.slow
def test_moe16_variants_shows_no_event_of_the_layout_it_replays():
    """moe16-variants steps through the post's layout again (lesson moe16 walks it event by event): no event of
    its phases, named once with a count (test_lesson_moe16_walk.py), so its tables come early, not after 970
    lines."""
    import re

    lr = run_lesson(load_lessons()["moe16-variants"])
    text = walkthrough(lr, width=100)
    for block in text.split("\n== ")[1:-2]:
        assert len(re.findall(r"^step +\d+ ", block, re.M)) == 0
    assert len(text.splitlines()) < 150


def test_three_alike_ranks_fold_and_two_do_not():
    """Three ranks in a row that did the same are one 'ranks a-b' line (FOLDED); two stay two lines."""
    from parasim.comm.trace import Tensor

    t = Tensor((4,), "float64")
    three = list(event_lines(_event_of(3, (t,), (t,), sent=32), 100))[1:]
    two = list(event_lines(_event_of(2, (t,), (t,), sent=32), 100))[1:]
    assert [line.split()[:2] for line in three] == [["ranks", "0-2"]]
    assert [line.split()[:2] for line in two] == [["rank", "0"], ["rank", "1"]]


def test_a_quiz_fits_the_page_right_or_wrong():
    """The walk-through's questions, verdicts and worked answers held to --width, as the rest of the page."""
    from tests.conftest import cli

    for width in ("100", "60"):
        out = cli("lesson", "cp-causal", "--quiz", "--answer", "10%", "--answer", "3", "--width", width).stdout
        quiz = out.split("right.")[0]
        assert "how: " in quiz and max(map(len, quiz.splitlines())) <= int(width)

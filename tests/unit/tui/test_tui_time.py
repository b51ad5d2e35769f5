"""The app's timeline on the clock (issue 34, build item 3): key u switches the grid from logical steps to
microseconds on the clock, every GPU's compute, transfers and idle time in columns of equal time, the
critical path marked; clicks and stepping follow the events where they run."""
import pytest

from parasim.clock.costs import machine
from parasim.clock.timeline import simulate
from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.timeline import Timeline
from parasim.tui.view import View


@pytest.fixture(scope="module")
def pipe():
    lr = run_lesson(get_lesson("pp-1f1b"))
    return View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)


def test_the_grid_on_the_clock(pipe):
    steps = pipe.columns
    pipe.toggle_time()
    try:
        tl = simulate(pipe.trace, machine("h200"))
        clock = pipe.clock
        assert pipe.columns == clock.columns >= steps and clock.columns * clock.seconds == pytest.approx(tl.step)
        # the first event, stage 0's first send, starts the step (after a moment of compute): column 0
        first = pipe.events[0]
        assert tl.events[first.seq][0] < clock.seconds and pipe.column_of(0) == 0
        text, style, critical, index = pipe.time_cell(0, 1)
        assert (text, style, index) == ("S>", "send", 0) and critical
        assert pipe.at(0, 1) == 0
        # rank 3 (the last stage) waits for the pipeline to fill: idle in the first column
        assert pipe.time_cell(3, 1)[:2] == ("··", "idle")
        # every event's column is where its transfer starts
        for i, e in enumerate(pipe.events):
            assert pipe.column_of(i) == min(clock.columns - 1, int(tl.events[e.seq][0] / clock.seconds))
        # the critical path shows: some cell of every column the step's chain passes through is marked
        marked = {c for row in range(len(pipe.rows)) for c in range(1, clock.columns + 1)
                  if pipe.time_cell(row, c)[2]}
        assert len(marked) > clock.columns // 2
        assert "path" in pipe.status(0) and "a column" in pipe.status(0)
        # a span shorter than a column still shows: the pipeline's compute here lasts far less than one
        # every column's cell by brute force (each span's overlap with the column, no search): the stream
        # that covers more of it shows, and a span shorter than a column still does (the pipeline's compute
        # here lasts far less than one)
        assert all(s.seconds < clock.seconds for s in tl.spans if s.kind == "compute")
        for c in range(1, clock.columns + 1):
            lo, hi = (c - 1) * clock.seconds, c * clock.seconds
            cover = {k: max([min(s.end, hi) - max(s.start, lo) for s in tl.spans if s.kind == k and 0 in s.ranks]
                            + [0.0]) for k in ("comm", "compute")}
            shown = pipe.time_cell(0, c)[0]
            if max(cover.values()) <= 0:
                assert shown == "··", c
            elif cover["compute"] > cover["comm"]:
                assert shown == "▒▒", c
            else:
                assert shown not in ("▒▒", "··"), c
    finally:
        pipe.toggle_time()
    assert pipe.columns == steps and "a column" not in pipe.status(0)


async def test_key_u_switches_the_app_between_steps_and_time():
    lr = run_lesson(get_lesson("pp-1f1b"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(100, 30)) as pilot:
        timeline = app.query_one(Timeline)
        assert "logical steps" in str(timeline.border_title)
        await pilot.press("u")
        assert app.view.time_mode and "ranks x us on the clock" in str(timeline.border_title)
        assert "critical path" in str(app.query_one("#legend").render())
        await pilot.press("right", "right")
        assert app.index == 2
        await pilot.press("u")
        assert not app.view.time_mode and "logical steps" in str(timeline.border_title)


def test_a_real_size_runs_time_status_says_its_range_and_a_toy_runs_does_not(pipe):
    """all-to-all-hidden runs DeepSeek-style MoE layers at real size: the app's time status gives the held-out
    MoE runs' ratios beside the step; pp-1f1b is an exact toy run, with no range."""
    from parasim.clock.uncertainty import held_out
    lr = run_lesson(get_lesson("all-to-all-hidden"))
    view = View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)
    view.toggle_time()
    ratios = [1 + e for _, _, f, e in held_out() if f == "moe"]
    assert f"; runs like it {min(ratios):.2f}-{max(ratios):.2f}x" in view.clock.setting()
    pipe.toggle_time()
    try:
        assert "runs like it" not in pipe.clock.setting()
    finally:
        pipe.toggle_time()


async def test_the_time_titles_unit_is_the_rulers():
    """Issue 53: a real-size step of 88 ms is ruled in milliseconds, and the title says milliseconds (it once
    said microseconds over a ruler in ms); pp-1f1b's toy step is in microseconds, as the key test above sees."""
    lr = run_lesson(get_lesson("all-to-all-hidden"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("u")
        assert app.view.clock.unit()[1] == "ms" and app.view.clock.tl.step >= 1e-2
        assert "ranks x ms on the clock" in str(app.query_one(Timeline).border_title)

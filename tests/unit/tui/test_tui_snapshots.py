"""Snapshot tests of the step-through app: the first screen and a middle screen of every lesson, 120x40; and
at the smallest and a large terminal (100x30, 200x50) for collectives, tp-mlp and moe16, each checked to show
the selected event and the footer's keys before it is compared.

Baselines live in tests/__snapshots__/test_tui_snapshots/. After an intended change to the app's look:
    pytest tests/unit/tui/test_tui_snapshots.py --snapshot-update
and look at the new SVGs (a failed run writes snapshot_report.html showing old and new side by side).
Call sites show as file and function (tests/helpers/helpers_sites.py), not file and line: a line that moves in the
package changes no snapshot (tests/unit/tui/test_snapshot_sites.py checks the SVGs keep none).
"""
from __future__ import annotations

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from helpers_sites import by_function, lines_left  # noqa: E402

from parasim.lesson import load_lessons, run_lesson  # noqa: E402
from parasim.tui.app import ParasimApp  # noqa: E402
from parasim.tui.view import View  # noqa: E402

SIZE = (120, 40)
LESSONS = list(load_lessons())


def make_app(name: str) -> ParasimApp:
    lr = run_lesson(load_lessons()[name])
    trace = by_function(lr.result.trace)
    assert lines_left(trace.to_json()) == [], "a call site with a line number would put it in the snapshot"
    return ParasimApp(View(trace, lr.lesson.narrative, lr.lesson.title))


def test_there_are_lessons():
    assert LESSONS, "no lessons found: the snapshot tests below would test nothing"


@pytest.mark.parametrize("name", LESSONS)
def test_first_screen(snap_compare, name):
    assert snap_compare(make_app(name), terminal_size=SIZE)


@pytest.mark.parametrize("name", LESSONS)
def test_middle_screen(snap_compare, name):
    app = make_app(name)
    steps = len(app.view.events) // 2
    assert app.view.events  # a lesson of one event (why-split) has its first event in the middle
    # go there with the g prompt, as a user would on a long trace (pressing Right 600 times takes a minute)
    assert snap_compare(app, press=["g", *str(steps + 1), "enter"], terminal_size=SIZE)


READABLE = ["collectives", "tp-mlp", "moe16"]
SIZES = {"100x30": (100, 30), "200x50": (200, 50)}


async def shows_the_event_and_the_keys(pilot) -> None:
    """Before the picture is taken: the selected event's panel and the keys' line are on the screen."""
    await pilot.pause()
    app = pilot.app
    screen = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    assert "selected event" in screen and app.view.detail(app.index)[0][:30] in screen, screen
    assert "z quiz  ? help" in screen.splitlines()[-1], screen


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", READABLE)
def test_readable_first_screen(snap_compare, name, size):
    assert snap_compare(make_app(name), terminal_size=SIZES[size], run_before=shows_the_event_and_the_keys)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", READABLE)
def test_readable_middle_screen(snap_compare, name, size):
    app = make_app(name)
    middle = len(app.view.events) // 2 + 1

    async def go_there(pilot) -> None:
        await pilot.press("g", *str(middle), "enter")
        await shows_the_event_and_the_keys(pilot)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=go_there)


def test_help_at_100x30(snap_compare):
    assert snap_compare(make_app("tp-mlp"), press=["question_mark"], terminal_size=SIZES["100x30"])


def test_what_if_at_100x30(snap_compare):
    """k, --tp 4, enter: sp's run at TP 8 beside its run at TP 4 (the figures that changed, both timelines)."""
    from parasim.tui.whatif import WhatIf
    lr = run_lesson(load_lessons()["sp"])
    app = ParasimApp(View(by_function(lr.result.trace), lr.lesson.narrative, lr.lesson.title),
                     whatif=WhatIf(lr.lesson, lr))

    async def turn_the_knob(pilot) -> None:
        await pilot.press("k")
        await pilot.pause()
        app.screen.query_one("#knob-tp").value = "4"
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZES["100x30"], run_before=turn_the_knob)


def test_time_at_100x30(snap_compare):
    """Key u: the pipeline's timeline in microseconds on the clock, the critical path in bold."""
    assert snap_compare(make_app("pp-1f1b"), press=["u", "right", "right"], terminal_size=SIZES["100x30"])

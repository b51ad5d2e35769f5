"""The pipeline's two tables: action kinds (pipeline/action.py: KINDS) and registered schedules
(pipeline/schedules.py: SCHEDULES). The timing, the executor, the slot table, the plots and the app read
each kind's entry; the CLI and generate() read the registry, so one entry is all a new schedule needs."""
import dataclasses
import json
import re

import pytest
from rich.color import Color

from parasim.errors import UsageError
from parasim.pipeline import schedules
from parasim.pipeline.action import KINDS, Action, ActionKind, Need, kind_of
from parasim.pipeline.executor import transfers
from parasim.pipeline.schedules import ONE, SEVERAL, V_SHAPE, ScheduleEntry, generate
from parasim.pipeline.timing import time_schedule

# the colours the app, the schedule table (rich) and the plots (matplotlib) drew before the table held them
RICH = {"F": "cyan", "B": "magenta", "I": "magenta", "W": "yellow"}
PLOT = {"F": "#4c9be8", "B": "#d264b6", "I": "#d264b6", "W": "#e8b04c"}


def rows(t):
    return [" ".join(x or "." for x in row) for row in t.slots]


def test_every_kind_has_every_field():
    assert set(KINDS) == {"F", "B", "I", "W"}  # torch.distributed.pipelining's letters
    for letter, k in KINDS.items():
        assert isinstance(k, ActionKind) and k.letter == letter and len(letter) == 1 and letter.isupper()
        assert k.title and isinstance(k.title, str)
        assert k.needs and all(isinstance(n, Need) and n.kinds and set(n.kinds) <= set(KINDS) and n.offset in (-1, 0, 1)
                               for n in k.needs)
        assert isinstance(k.cost, int) and k.cost == 1  # the post draws every action one slot wide
        assert k.passes is None or (k.passes[0] in ("act", "grad") and k.passes[1] in (-1, 1))
        assert k.holds in (-1, 0, 1)
        Color.parse(k.rich)  # rich / Textual must know the name
        assert re.fullmatch(r"#[0-9a-f]{6}", k.plot)
    assert {k: v.rich for k, v in KINDS.items()} == RICH
    assert {k: v.plot for k, v in KINDS.items()} == PLOT


def test_a_label_names_its_kind():
    assert [kind_of(x).letter for x in ("F1", "f2", "B3", "i1", "W5:4")] == ["F", "F", "B", "I", "W"]
    assert kind_of(".") is None and kind_of("") is None and kind_of("X1") is None


def test_dependencies_as_the_post_draws_them():
    """Hand-placed: F waits for the previous stage's F, B for the next stage's backward and its own F, W for its
    I. Each line below breaks if one kind's needs in the table are changed."""
    two = [[Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 0, 1), Action("B", 0, 1)]]
    assert rows(time_schedule(two)) == ["F1 . . B1", ". F1 B1 ."]
    zb = [[Action("F", 0, 0), Action("I", 0, 0), Action("W", 0, 0)], [Action("F", 0, 1), Action("I", 0, 1),
                                                                      Action("W", 0, 1)]]
    assert rows(time_schedule(zb)) == ["F1 . . I1 W1", ". F1 I1 W1 ."]
    # a weight pass listed before its input pass waits for it forever
    with pytest.raises(UsageError, match="deadlocks"):
        time_schedule([[Action("F", 0, 0), Action("W", 0, 0), Action("I", 0, 0)]])
    # a backward waits for the next stage's input-only backward as for its full one
    mixed = [[Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 0, 1), Action("I", 0, 1), Action("W", 0, 1)]]
    assert rows(time_schedule(mixed)) == ["F1 . . B1", ". F1 I1 W1"]


def test_the_timing_reads_its_dependencies_from_the_table(monkeypatch):
    """Drop W's need of its I: the schedule that deadlocked now runs, W first."""
    monkeypatch.setitem(KINDS, "W", dataclasses.replace(KINDS["W"], needs=()))
    t = time_schedule([[Action("F", 0, 0), Action("W", 0, 0), Action("I", 0, 0)]])
    assert rows(t) == ["F1 W1 I1"]
    # a forward that no longer waits for the previous stage starts at once on every rank
    monkeypatch.setitem(KINDS, "F", dataclasses.replace(KINDS["F"], needs=()))
    assert rows(time_schedule([[Action("F", 0, 0)], [Action("F", 0, 1)]])) == ["F1", "F1"]


def test_default_costs_and_peaks_come_from_the_table(monkeypatch):
    plan = [[Action("F", 0, 0), Action("I", 0, 0), Action("F", 1, 0), Action("W", 0, 0)]]
    t = time_schedule(plan)
    assert t.costs == {"F": 1, "B": 1, "I": 1, "W": 1} and t.makespan == 4
    assert t.peak == [2]  # I frees nothing: both micro-batches are held until W1 ends
    monkeypatch.setitem(KINDS, "I", dataclasses.replace(KINDS["I"], cost=3, holds=-1))
    t = time_schedule(plan)
    assert t.makespan == 6 and rows(t) == ["F1 I1 I1 I1 F2 W1"] and t.peak == [1]
    assert time_schedule(plan, {"I": 1}).makespan == 4  # a caller's costs still win


def test_the_executor_sends_what_the_table_passes(monkeypatch):
    """Two ranks, one micro-batch: the forward's activation goes up at the end of its slot, the backward's
    gradient comes down at the end of its own; a weight pass sends nothing."""
    plan = [[Action("F", 0, 0), Action("I", 0, 0), Action("W", 0, 0)],
            [Action("F", 0, 1), Action("B", 0, 1)]]
    assert transfers(plan, time_schedule(plan)) == [(1, 0, 1, "act", 0, 0), (3, 1, 0, "grad", 1, 0)]
    monkeypatch.setitem(KINDS, "F", dataclasses.replace(KINDS["F"], passes=None))
    assert transfers(plan, time_schedule(plan)) == [(3, 1, 0, "grad", 1, 0)]


def test_the_slot_table_colours_each_kind_from_the_table(monkeypatch, capsys):
    from parasim.render.schedule import print_schedule
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setitem(KINDS, "W", dataclasses.replace(KINDS["W"], rich="green"))
    plan = [[Action("F", 0, 0), Action("I", 0, 0), Action("W", 0, 0)]]
    print_schedule(time_schedule(plan), "hand", 1, 1, 1, None, None)
    out = capsys.readouterr().out
    assert "\x1b[36mF1" in out and "\x1b[35mI1" in out and "\x1b[32mW1" in out  # cyan, magenta, the green set here


# -- the schedule registry ---------------------------------------------------------------------------------------

def test_the_registry():
    got = {e.name: (e.chunks, e.default_chunks, e.torch_name) for e in schedules.SCHEDULES}
    assert got == {"gpipe": (ONE, 1, None), "1f1b": (ONE, 1, "Schedule1F1B"),
                   "interleaved": (SEVERAL, 2, "ScheduleInterleaved1F1B"),
                   "zb-h1": (ONE, 1, "ScheduleInterleavedZeroBubble"),
                   "interleaved-zb": (SEVERAL, 2, "ScheduleInterleavedZeroBubble"),
                   "zbv": (V_SHAPE, 2, "ScheduleZBVZeroBubble"), "dualpipev": (V_SHAPE, 2, "ScheduleDualPipeV")}
    assert list(got) == ["gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "zbv", "dualpipev"]  # --help's order


def _in_order(pp, m, v):
    """A test's own schedule: GPipe with the backwards in micro-batch order (first in, first out)."""
    return [[Action("F", k, r) for k in range(m)] + [Action("B", k, r) for k in range(m)] for r in range(pp)]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(schedules, "SCHEDULES", schedules.SCHEDULES + (ScheduleEntry("in-order", _in_order, ONE, None),))


def test_a_registered_schedule_reaches_generate_and_the_cli(registered):
    from conftest import cli
    assert [[str(a) for a in acts] for acts in generate("in-order", 2, 2)] == [["F1", "F2", "B1", "B2"]] * 2
    with pytest.raises(UsageError, match="in-order runs one chunk per rank"):
        generate("in-order", 2, 2, 2)
    with pytest.raises(UsageError, match="schedules: gpipe, .*, dualpipev, in-order$"):
        generate("pipedream", 2, 2)
    out = cli("schedule", "--schedule", "in-order", "--pp", "2", "-m", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [" ".join(x or "." for x in row) for row in data["slots"]] == ["F1 F2 . . B1 B2", ". F1 F2 B1 B2 ."]
    assert data["bubble"] == "1/3" and data["chunks"] == 1
    helped = cli("schedule", "--help").stdout
    assert "dualpipev,in-order}" in helped and "zb-h1, in-order: 1" in re.sub(r"\s+", " ", helped)


def test_an_unregistered_schedule_is_refused_by_the_cli():
    from conftest import cli
    bad = cli("schedule", "--schedule", "in-order")
    assert bad.returncode == 2 and "invalid choice: 'in-order'" in bad.stderr


async def test_the_apps_slot_panel_colours_each_kind_from_the_table(monkeypatch):
    from parasim.lesson import get_lesson, run_lesson
    from parasim.tui.app import ParasimApp
    from parasim.tui.view import View
    monkeypatch.setitem(KINDS, "B", dataclasses.replace(KINDS["B"], rich="green"))
    lr = run_lesson(get_lesson("pp-1f1b"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("end")  # the last transfer: every action but the last one done, drawn in its colour
        panel = app.query_one("#slots").render()
        styles = {panel.plain[s.start:s.end].strip(): str(s.style) for s in panel.spans[:13]}  # GPU 1's row
    assert styles["F1"] == "ansi_cyan" and styles["B1"] == "ansi_green" and styles["."] == "dim"


def test_two_digit_micro_batches_print_whole_in_windows_that_fit_100_columns():
    """`schedule --pp 4 -m 16`, the post's m = 16: every cell whole (F16, B16, never cut to F…), the slots cut
    into windows of at most 100 columns, each with its ruler, every slot shown once."""
    import os
    import re
    import subprocess
    import sys
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "parasim", "schedule", "--pp", "4", "-m", "16"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "…" not in text and all(len(line) <= 100 for line in text.splitlines())
    rulers = [int(n) for line in text.splitlines() if line.strip().startswith("time ->")
              for n in line.split()[2:]]
    makespan = 16 * 2 + 2 * (4 - 1)  # m(F+B) + (p-1)(F+B) slots with F = B = 1
    assert rulers == list(range(1, makespan + 1))
    for mb in range(1, 17):
        for kind in "FB":
            assert len(re.findall(rf"\b{kind}{mb}\b", text)) == 4  # once per GPU

"""Issue 52: a lesson is its file. A scratch lesson, one file declaring its section, its place in the post's
order and its picture (and nothing added anywhere else), is listed in its place, runs through `parasim lesson`
(the walk-through, --json with the clock, --chrome, --plot) and opens in the app."""
import json
import shutil

import pytest

import parasim.lesson
from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.view import View

from conftest import cli

TOY = '''
from parasim.lesson import Lesson, Picture, check


def program(ctx):
    ctx.phase("sum")
    x = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
    return ctx.comm.all_reduce(x, label="add the ranks' rows")


def checks(result):
    return [check("the sum on rank 0", result.values[0], [6.0, 12.0])]  # 1 + 2 + 3 times [1, 2]


def draw(lr, path):
    with open(path, "w") as f:
        f.write(f"{len(lr.result.trace.events)} events")


LESSON = Lesson(name="toy", title="A scratch lesson: three ranks add their rows", world=3, program=program,
                narrative={"sum": "Each rank brings its row; the all-reduce leaves the sum on every rank."},
                checks=checks, section="First: the three collectives (a scratch lesson)", order=15,
                picture=Picture(draw, "how many events the run made"))
'''


@pytest.fixture
def lessons(tmp_path, monkeypatch):
    """A lessons folder of two of the post's lessons (orders 10 and 20) and the scratch one (order 15)."""
    folder = tmp_path / "lessons"
    folder.mkdir()
    for name in ("collectives.py", "bf16_sums.py"):
        shutil.copy(parasim.lesson.lessons_dir() / name, folder / name)
    (folder / "toy.py").write_text(TOY)
    monkeypatch.setattr(parasim.lesson, "lessons_dir", lambda: folder)
    return tmp_path


def test_a_new_lesson_is_listed_in_its_place_with_its_section_and_picture(lessons):
    rows = json.loads(cli("lesson", "--list", "--json").stdout)
    assert [r["name"] for r in rows] == ["collectives", "toy", "bf16-sums"]
    toy = rows[1]
    assert toy["section"] == "First: the three collectives (a scratch lesson)"
    assert toy["picture"] == "how many events the run made" and rows[0]["picture"] is None


def test_a_new_lesson_runs_through_the_cli_the_clock_the_exports_and_the_app(lessons):
    chrome, picture = lessons / "c.json", lessons / "p.png"
    out = cli("lesson", "toy", "--plain", "--chrome", str(chrome), "--plot", str(picture))
    assert out.returncode == 0, out.stderr
    assert "A scratch lesson" in out.stdout and "the sum on rank 0" in out.stdout
    assert picture.read_text() == "1 events"
    slices = [e for e in json.loads(chrome.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert [e["name"] for e in slices] == ["all_reduce"] * 3 and all(e["dur"] > 0 for e in slices)  # one a rank
    run = json.loads(cli("lesson", "toy", "--json").stdout)
    assert run["lesson"] == "toy" and run["clock"]["step_us"] > 0 and [c["ok"] for c in run["checks"]] == [True]
    bad = cli("lesson", "collectives", "--plot", str(picture))
    assert bad.returncode == 2 and "lessons that draw one: toy" in bad.stderr


async def test_a_new_lesson_opens_in_the_app(lessons):
    lr = run_lesson(get_lesson("toy"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert "AR" in app.export_screenshot()

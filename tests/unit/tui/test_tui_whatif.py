"""What-if in the app (issue 33, build item 5): k opens the lesson's settings as a form, enter re-runs the lesson
there and sets the new run beside the old one (the figures that changed, both timelines); enter opens it,
escape goes back. The plain model (tui/whatif.py) reads and refuses settings as the command line does."""
import pytest

from parasim.errors import UsageError
from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.screens import KnobsScreen, WhatIfScreen
from parasim.tui.timeline import Timeline
from parasim.tui.view import View
from parasim.tui.whatif import WhatIf, settings_text


def whatif(name: str, **knobs) -> WhatIf:
    lesson = get_lesson(name)
    return WhatIf(lesson, run_lesson(lesson, knobs=knobs or None))


def make(name: str) -> ParasimApp:
    w = whatif(name)
    return ParasimApp(View(w.run.result.trace, w.lesson.narrative, w.lesson.title), whatif=w)


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def test_the_form_reads_settings_as_the_command_line_does():
    w = whatif("pp-1f1b")
    assert [(f.flag, f.value, f.post) for f in w.fields()] == [("--pp", 4, 4), ("-m", 4, 4)]
    assert w.parse({"pp": "8", "m": ""}) == {"pp": 8, "m": 4}  # empty keeps the value on screen
    for typed, needle in (({"pp": "0"}, "--pp takes a positive integer"), ({"m": "two"}, "-m takes"),
                          ({"pp": "-1"}, "--pp takes")):
        with pytest.raises(UsageError, match=needle):
            w.parse(typed)
    with pytest.raises(UsageError, match="--tp 1 or 2 or 4 or 8, not 3"):
        whatif("sp").parse({"tp": "3"})
    assert settings_text({"pp": 8, "m": 16}) == "--pp 8 -m 16"


def test_the_changes_table_marks_what_changed_first():
    old = whatif("sp")
    new = old.rerun(old.parse({"tp": "4"}))
    table = old.changes(new)
    rows = {label: values for label, values in table.rows}
    assert rows["* ranks"] == [8, 4]
    assert rows["collectives"] == [36, 36]  # the same layer on fewer ranks: as many collectives, unmarked
    marked = [label for label, _ in table.rows if label.startswith("* ")]
    assert [label for label, _ in table.rows][:len(marked)] == marked  # the changed figures come first
    assert "--tp 8" in table.title and "--tp 4" in table.title
    assert new.checks_line().startswith(f"{len(new.run.checks)} of {len(new.run.checks)} checks hold")


def test_the_checks_line_says_whether_the_run_is_at_the_post_s_settings():
    """At the post's --tp 8 the post's own figures are among the checks; at --tp 4 the line says they hold
    at the post's settings only (the two were once the wrong way round, and no test saw it)."""
    at_post = whatif("sp")
    elsewhere = at_post.rerun(at_post.parse({"tp": "4"}))
    assert at_post.checks_line().endswith(" checks hold (at the post's settings)")
    assert elsewhere.checks_line().endswith(" checks hold (the post's own figures hold at the lesson's defaults "
                                            "only)")
    heads = whatif("tp-attention")  # its default is TP 4 (the model's 4 heads), the post's GQA case TP 16
    assert heads.checks_line().endswith(" checks hold (at the lesson's defaults)")
    assert whatif("moe16").checks_line().endswith(" checks hold (at the post's settings)")  # the post's routing


async def test_k_re_runs_the_lesson_and_enter_opens_the_new_run():
    app = make("sp")
    async with app.run_test(size=(100, 30)) as pilot:
        assert "k what if" in screen_text(app).splitlines()[-1]
        await pilot.press("k")
        assert isinstance(app.screen, KnobsScreen)
        assert "--tp" in screen_text(app) and "the post's: 8" in screen_text(app)
        app.screen.query_one("#knob-tp").value = "4"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, WhatIfScreen)
        text = screen_text(app)
        assert "* ranks" in text and "before: --tp 8" in text and "after: --tp 4" in text
        before, after = (app.screen.query_one(f"#whatif-{w}", Timeline) for w in ("before", "after"))
        assert before.view.trace.world == 8 and after.view.trace.world == 4
        await pilot.press("right")  # the step keys belong to the main screen: nothing moves underneath
        assert app.index == 0
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, WhatIfScreen)
        assert app.view.trace.world == 4 and "(--tp 4)" in app.sub_title
        await pilot.press("right")
        assert app.index == 1  # the new run steps as the first did
        await pilot.press("k")  # a second what-if compares with the run now on screen
        assert "On screen: --tp 4" in screen_text(app)


async def test_escape_goes_back_to_the_run_before_and_a_refused_value_stays_on_the_form():
    app = make("pp-1f1b")
    async with app.run_test(size=(100, 30)) as pilot:
        old = app.view
        await pilot.press("k")
        app.screen.query_one("#knob-m").value = "0"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, KnobsScreen) and "-m takes a positive integer" in screen_text(app)
        await pilot.press("tab")  # typed as a learner would: tab moves from one setting to the next
        assert app.focused.id == "knob-m"
        app.focused.value = ""
        await pilot.press("1", "6", "enter")
        await pilot.pause()
        assert isinstance(app.screen, WhatIfScreen) and "after: --pp 4 -m 16" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert app.view is old and app.whatif.settings == {"pp": 4, "m": 4}


async def test_a_run_without_settings_says_so():
    lr = run_lesson(get_lesson("tp-mlp"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))  # a saved trace: no lesson
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("k")
        await pilot.pause()
        assert not app.screen.is_modal
        assert any("no settings to turn" in str(n.message) for n in app._notifications)

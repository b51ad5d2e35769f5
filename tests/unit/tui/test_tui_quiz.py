"""Predict, then see in the app (issue 53, build item 5): --quiz opens the app asking the lesson's questions; z
asks them again; each answer is graded when entered, with the worked formula where it was not right, and enter
goes on. A run without questions says so. The browser runs this same app (parasim serve NAME --quiz)."""

from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.screens import QuizScreen
from parasim.tui.view import View
from parasim.tui.whatif import WhatIf


def make(name: str, quiz: bool) -> ParasimApp:
    lesson = get_lesson(name)
    w = WhatIf(lesson, run_lesson(lesson))
    return ParasimApp(View(w.run.result.trace, lesson.narrative, lesson.title), whatif=w, quiz=quiz)


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def test_the_app_opens_asking_grades_each_answer_and_goes_on():
    app = make("pp-1f1b", quiz=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, QuizScreen)
        assert "Q1 of 2. 1F1B with p = 4 stages and m = 4 micro-batches" in " ".join(screen_text(app).split())
        await pilot.press("right")  # the step keys are the main screen's: typing goes to the answer
        assert app.index == 0
        app.screen.query_one("#prompt").value = "3/7"
        await pilot.press("enter")
        text = " ".join(screen_text(app).split())
        assert "right: the run's is 3/7 (0.429) of the step" in text and "how:" not in text
        await pilot.press("enter")
        assert "Q2 of 2." in screen_text(app) and "right:" not in screen_text(app)
        await pilot.press("2", "enter")
        text = " ".join(screen_text(app).split())
        assert "not quite (yours 2, 0.5x the run's); the run's: 4 micro-batches" in text
        assert "how: stage 1 runs p forwards before its first backward" in text and "(enter: done)" in text
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, QuizScreen)
        assert any("1 of 2 right (z asks again)" in str(n.message) for n in app._notifications)
        await pilot.press("z")  # asks again
        assert isinstance(app.screen, QuizScreen) and "Q1 of 2." in screen_text(app)
        await pilot.press("escape")  # stops, scoring what was answered
        await pilot.pause()
        assert not isinstance(app.screen, QuizScreen)
        assert any("0 of 2 right" in str(n.message) for n in app._notifications)


async def test_a_run_without_questions_says_so_and_opens_as_ever():
    app = make("tp-mlp", quiz=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert not isinstance(app.screen, QuizScreen)
        await pilot.press("z")
        await pilot.pause()
        assert not app.screen.is_modal
        assert any("this run asks no questions" in str(n.message) for n in app._notifications)

"""The app's other screens: a one-line prompt (go to an event, filter, focus a rank), the help, the lesson's
tables and the what-if form, each modal over the step-through screen, which it leaves as it was (the app's
step keys are off while one is open); and the what-if comparison, a screen of its own with both runs."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Static

from .keys import KEYS


class PromptScreen(ModalScreen[str | None]):
    """Asks for one line; dismisses with what was typed (enter) or None (escape)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, kind: str, question: str, placeholder: str) -> None:
        super().__init__(id=f"prompt-{kind}")
        self.kind, self.question, self.placeholder = kind, question, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Static(Text(self.question), id="prompt-question")
            yield Input(placeholder=self.placeholder, id="prompt")

    def on_mount(self) -> None:
        self.query_one(Input).cursor_blink = False  # a blinking cursor would make screenshots differ

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuizScreen(ModalScreen[int]):
    """Predict, then see (examples/quiz.py): the lesson's questions one at a time; enter grades an answer and
    shows how the run's figure comes out, enter again goes on; dismisses with the number answered right
    (escape: stop, with those so far)."""

    BINDINGS = [Binding("escape", "stop", "stop")]

    def __init__(self, questions: list) -> None:
        super().__init__(id="quiz")
        self.questions, self.at, self.right, self.graded = questions, 0, 0, False

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Static(id="quiz-question")
            yield Static(id="quiz-verdict")
            yield Input(placeholder="your figure, then enter (escape: stop)", id="prompt")

    def on_mount(self) -> None:
        self.query_one(Input).cursor_blink = False  # a blinking cursor would make screenshots differ
        self._show()

    def _show(self) -> None:
        from ..examples.quiz import prompt_of

        self.query_one("#quiz-question", Static).update(
            Text(prompt_of(self.questions[self.at], self.at + 1, len(self.questions)))
        )
        self.query_one("#quiz-verdict", Static).update(Text(""))
        self.query_one(Input).value = ""

    def on_input_submitted(self, event: Input.Submitted) -> None:
        from ..examples.quiz import MAX_ANSWER, grade, quiz_lines

        event.stop()
        if self.graded:  # enter again: the next question, or the score
            self.at, self.graded = self.at + 1, False
            if self.at == len(self.questions):
                self.dismiss(self.right)
                return
            self._show()
            return
        (graded,) = grade([self.questions[self.at]], [event.value[:MAX_ANSWER]])
        self.right += bool(graded.right)
        self.graded = True
        more = "enter: the next question" if self.at + 1 < len(self.questions) else "enter: done"
        self.query_one("#quiz-verdict", Static).update(Text("\n".join([*quiz_lines(graded), f"  ({more})"])))

    def action_stop(self) -> None:
        self.dismiss(self.right)


class TablesScreen(ModalScreen[None]):
    """The lesson's tables (the post's tables, computed by the run), as the walk-through prints them; escape,
    T or q closes it."""

    BINDINGS = [Binding("escape,T,q", "close", "close")]

    def __init__(self, tables: list, width: int) -> None:
        super().__init__()
        self.tables, self.width = tables, width

    def compose(self) -> ComposeResult:
        from ..render.tables import table_lines

        lines: list[str] = []
        for t in self.tables:
            lines += ([""] if lines else []) + table_lines(t, self.width)
        with VerticalScroll(id="tables-box") as box:
            box.border_title = "tables (every figure from the run)"
            box.border_subtitle = "escape closes"
            yield Static(Text("\n".join(lines)), id="tables")

    def action_close(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key and what it does, from the view's key table; any of escape, ? or q closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def compose(self) -> ComposeResult:
        width = max(len(k.shown) for k in KEYS)
        text = Text()
        for n, k in enumerate(KEYS):
            text.append(("\n" if n else "") + k.shown.ljust(width), style="bold")
            text.append(f"  {k.help}")
        text.append(
            "\n\nThe timeline: a row per rank (f: per group), a column per logical step (u: per slice of "
            "time); the selected event's cells are reversed. Click a cell to select its event.",
            style="italic",
        )
        text.append("\n\nescape, ? or q closes this help.", style="dim")
        with VerticalScroll(id="help-box") as box:
            box.border_title = "keys"
            yield Static(text, id="help")

    def action_close(self) -> None:
        self.dismiss(None)


class KnobsScreen(ModalScreen[object]):
    """What if: the lesson's settings as a form, one line each with the run's value; enter runs the lesson again
    at the typed settings and dismisses with the new run (tui/whatif.py's WhatIf), escape with None. A setting
    the lesson refuses is said on the form, which stays open."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, whatif) -> None:
        super().__init__(id="knobs")
        self.whatif = whatif

    def compose(self) -> ComposeResult:
        from .whatif import settings_text

        fields = self.whatif.fields()
        # a real-size step's seven settings sit closer, to fit 30 rows (the lessons' two or three keep their space)
        with Vertical(id="knobs-box", classes="many" if len(fields) > 4 else "") as box:
            box.border_title = f"what if: change the {self.whatif.noun}'s settings"
            box.border_subtitle = "tab moves, enter runs, escape cancels"
            yield Static(
                Text(
                    f"On screen: {settings_text(self.whatif.settings)}. Type new values (empty keeps "
                    f"one), then enter: the {self.whatif.noun} runs again and its new run is set beside this one."
                ),
                id="knobs-intro",
            )
            for f in fields:
                yield Static(Text.assemble((f.flag, "bold"), f"  {f.help} ({f.hint})"), classes="knob-label")
                yield Input(value=str(f.value), placeholder=f.hint, id=f"knob-{f.name}")
            yield Static("", id="knobs-error")

    def on_mount(self) -> None:
        for box in self.query(Input):
            box.cursor_blink = False  # a blinking cursor would make screenshots differ
        # the figures of the run on screen, worked out while the learner types (a real-size step's take a clock)
        self.call_after_refresh(self.whatif.prepare)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        from ..engine.collector import CollectorHold
        from ..errors import ParasimError

        event.stop()
        typed = {box.id.removeprefix("knob-"): box.value for box in self.query(Input)}
        # the collector's pass over the new run's records waits until the comparison is on screen (WhatIfScreen)
        hold = CollectorHold()
        try:
            new = self.whatif.rerun(self.whatif.parse(typed))
            view = new.view()
        except ParasimError as e:  # a refused value or a layout the lesson cannot run: said here, form stays
            hold.release()
            self.query_one("#knobs-error", Static).update(Text(str(e), style="bold red"))
            return
        except BaseException:
            hold.release()
            raise
        self.dismiss((new, view, hold))

    def action_cancel(self) -> None:
        self.dismiss(None)


class WhatIfScreen(Screen[bool]):
    """Two runs of one lesson side by side: the figures that changed (a table) and both timelines, the run on
    screen above the new one. Enter opens the new run in the app; escape goes back to the one before."""

    BINDINGS = [
        Binding("enter,o", "choose(True)", "open the new run"),
        Binding("escape,b", "choose(False)", "back to the run before"),
    ]

    def __init__(self, old, new, old_view, new_view, index: int, painted: Any = None) -> None:
        """`painted`: called once the screen is first on screen (the collector's pass, released then)."""
        super().__init__(id="whatif")
        self.old, self.new, self.old_view, self.new_view, self.index = old, new, old_view, new_view, index
        self.painted = painted

    def compose(self) -> ComposeResult:
        from ..render.tables import table_lines
        from .timeline import Timeline
        from .whatif import settings_text

        width = max(40, self.app.size.width - 6)
        yield Static(
            Text(f"{self.new.name} at {settings_text(self.new.settings)}: {self.new.checks_line()}", style="bold"),
            id="whatif-head",
        )
        with VerticalScroll(id="whatif-figures") as box:
            box.border_title = "the same figures from both runs"
            yield Static(Text("\n".join(table_lines(self.old.changes(self.new), width))), id="whatif-table")
        for which, view, run in (("before", self.old_view, self.old), ("after", self.new_view, self.new)):
            line = Timeline(view, id=f"whatif-{which}")
            line.border_title = (
                f"{which}: {settings_text(run.settings)} ({len(view.events)} events, {view.step_columns} steps)"
            )
            yield line
        yield Static(
            Text.assemble((" enter", "bold"), " open the new run   ", ("escape", "bold"), " back to the run before"),
            id="whatif-keys",
        )

    def on_mount(self) -> None:
        from .timeline import Timeline

        self.query_one("#whatif-before", Timeline).index = self.index
        self.query_one("#whatif-after", Timeline).index = 0
        if self.painted is not None:
            self.call_after_refresh(self.painted)

    def action_choose(self, open_new: bool) -> None:
        self.dismiss(open_new)

"""The step-through app: timeline on top, the selected event and what each rank holds below, the lesson's
narrative beside them, the status line and the keys at the bottom.

The app holds two reactives, the selected event's `index` and the view's `revision` (bumped when a key changes
what the view shows: hops, folding, a filter, the focused rank, play), and binds every panel's to them: each
panel redraws itself from the view model (view.py), which alone decides what is on screen. Every key goes
through one action per verb (the key table is keys.KEYS); prompts and help are modal screens (screens.py). A
lesson's app also holds its run (whatif.py): k re-runs the lesson at other settings and, once the learner opens
the new run, the app composes its panels again over the new view."""

from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Header

from .panels import (
    SPEEDS,
    EventPanel,
    HoldingsPanel,
    KeyLine,
    Legend,
    MapPanel,
    MemoryPanel,
    MovesPanel,
    NarrativePanel,
    SlotsPanel,
    StatusLine,
    WatchPanel,
    WorkPanel,
)
from .screens import HelpScreen, KnobsScreen, PromptScreen, QuizScreen, TablesScreen, WhatIfScreen
from .timeline import Timeline
from .keys import KEYS
from .view import View
from .whatif import StepWhatIf, WhatIf, settings_text

OWN_ACTIONS = {k.action.split("(")[0] for k in KEYS}  # the actions the app's key table binds
WIDE = 180  # columns from which the selected event and what each rank holds sit side by side

# what each prompt asks (kind -> question, placeholder)
PROMPTS = {
    "go": ("Go to event number (as in 'event k/N' on the status line):", "a number"),
    "filter": (
        "Step only through events whose op, axis (group) or label holds:",
        "a word, e.g. all_gather or tp (empty: all events)",
    ),
    "rank": ("Step only through the events of rank:", "a rank number (empty: all ranks)"),
}


class ParasimApp(App):
    CSS_PATH = "parasim.tcss"
    TITLE = "parasim"
    # priority: the timeline is a scroll view with its own arrow keys, and they must not win (check_action turns
    # these off while a prompt or the help is open, so typed letters reach it)
    BINDINGS = [Binding(k.keys, k.action, k.footer or k.help, priority=True, show=False) for k in KEYS]
    index = reactive(0, repaint=False, always_update=True)  # the selected event (always: Home re-shows it)
    revision = reactive(0, repaint=False)  # bumped when the view's settings change
    playing = reactive(False, repaint=False)
    speed = reactive(2, repaint=False)  # position in SPEEDS

    def __init__(
        self,
        view: View,
        start: int | None = None,
        whatif: WhatIf | StepWhatIf | None = None,
        painted: Callable[[], None] | None = None,
        quiz: bool = False,
    ) -> None:
        """`start`: the event index to open at (`parasim check --tui`: the one the divergence is pinned on).
        `whatif`: the lesson and its run on screen, for the what-if key (None: a saved trace, nothing to re-run).
        `painted`: called once the first screen is painted (open_app's hold on the collector, released then).
        `quiz`: open with the lesson's questions (--quiz), before the walk-through shows their answers."""
        super().__init__()
        self.theme = "textual-dark"
        self.view = view
        self.whatif = whatif
        self.painted = painted
        self.sub_title = (
            view.title
            if whatif is None or not whatif.has_settings
            else f"{view.title} ({settings_text(whatif.settings)})"
        )
        self._timer: Timer | None = None
        self.ask_first = quiz
        if start is not None:
            self.set_reactive(ParasimApp.index, view.clamp(start))

    def compose(self) -> ComposeResult:
        view, bound = self.view, (ParasimApp.index, ParasimApp.revision)
        yield Header()
        yield Timeline(view, id="timeline").data_bind(*bound)
        yield Legend(view, id="legend")
        with Horizontal(id="panels"):
            with VerticalScroll(id="left"):
                with Horizontal(id="event-row"):  # side by side on a wide screen, one above the other else
                    with Vertical(id="event-col"):  # what moves sits under the event it belongs to
                        yield EventPanel(view, id="detail").data_bind(*bound)
                        yield MovesPanel(view, id="moves").data_bind(*bound)
                    yield HoldingsPanel(view, id="holdings").data_bind(*bound)
                yield WatchPanel(view, id="watch").data_bind(*bound)
                yield MapPanel(view, id="map").data_bind(*bound)
                yield SlotsPanel(view, id="slots").data_bind(*bound)
                yield MemoryPanel(view, id="memory").data_bind(*bound)
                yield WorkPanel(view, id="work").data_bind(*bound)
            with VerticalScroll(id="right") as right:
                right.border_title = "narrative"
                yield NarrativePanel(view, id="narrative").data_bind(*bound)
        yield StatusLine(view, id="status").data_bind(*bound, ParasimApp.playing, ParasimApp.speed)
        yield KeyLine(id="keys")

    def on_mount(self) -> None:
        self._title_timeline()
        self.query_one(Timeline).focus()
        if self.painted is not None:
            self.call_after_refresh(self.painted)
        if self.ask_first:
            self.ask_first = False
            self.action_quiz()

    def _title_timeline(self) -> None:
        if self.view.time_mode:  # the ruler's own unit (us, or ms for a longer step), as its numbers are in
            unit = self.view.clock.unit()[1]
            self.query_one(Timeline).border_title = Text(
                f"timeline: ranks x {unit} on the clock: {self.view.clock.setting()} (u: steps)"
            )  # Text: the GPU's name is not markup
        else:
            self.query_one(Timeline).border_title = "timeline: ranks x logical steps (u: time)"

    def on_resize(self, event: Resize) -> None:
        self.query_one("#panels").set_class(event.size.width >= WIDE, "-wide")

    # -- actions -----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The step keys are off while another screen is open (a prompt, the help, what-if): the keys are theirs.
        Textual's own (tab moves the focus on a form) stay on."""
        return self.screen is self.screen_stack[0] or action not in OWN_ACTIONS

    def action_step(self, delta: int) -> None:
        self.index = self.view.move(self.index, delta)

    def action_jump(self, where: str) -> None:
        if self.view.visible:
            self.index = self.view.visible[0 if where == "first" else -1]

    def action_diverged(self) -> None:
        """Jump to the event `parasim check` pinned the first divergence on."""
        i = self.view.diverged()
        if i is not None:
            self.index = i

    def action_play(self) -> None:
        self.playing = not self.playing

    def watch_playing(self, playing: bool) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if playing:
            self._timer = self.set_interval(SPEEDS[self.speed], self._tick)

    def _tick(self) -> None:
        nxt = self.view.move(self.index, 1)
        if nxt == self.index:
            self.playing = False  # the end: stop
        self.index = nxt

    def action_speed(self, delta: int) -> None:
        self.speed = max(0, min(len(SPEEDS) - 1, self.speed + delta))

    def watch_speed(self) -> None:
        self.watch_playing(self.playing)  # a running timer takes the new pace

    def action_hops(self) -> None:
        self.view.show_hops = not self.view.show_hops
        self.revision += 1

    def action_time(self) -> None:
        self.view.toggle_time()
        self._title_timeline()
        self.query_one(Legend).redraw()
        self.revision += 1

    def action_fold(self) -> None:
        axis = self.view.next_fold()
        self.notify(f"rows: one per {axis} group" if axis else "rows: one per rank", timeout=2, markup=False)
        self.revision += 1

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_tables(self) -> None:
        tables = self.view.all_tables()
        if not tables:
            self.notify("this lesson has no tables", timeout=2, markup=False)
            return
        # the box is 96% of the screen, less its border, padding and scrollbar (6 columns): a row fits its line
        self.push_screen(TablesScreen(tables, max(40, int(self.size.width * 0.96) - 6)))

    def action_quiz(self) -> None:
        """Predict, then see: the lesson's questions of the run on screen, one at a time."""
        asked = self.whatif.questions() if isinstance(self.whatif, WhatIf) else []
        if not asked:
            self.notify(
                'this run asks no questions (lessons that do: parasim lesson --list --json, "quiz")',
                timeout=3,
                markup=False,
            )
            return
        self.push_screen(QuizScreen(asked), lambda right: self._scored(right, len(asked)))

    def _scored(self, right: int | None, total: int) -> None:
        self.notify(f"{right or 0} of {total} right (z asks again)", timeout=4, markup=False)

    def action_whatif(self) -> None:
        """What if: the lesson's settings as a form; the new run beside this one; enter there opens it."""
        if self.whatif is None or not self.whatif.has_settings:
            self.notify(
                "this run has no settings to turn (lessons that take some: parasim lesson --list --json)",
                timeout=3,
                markup=False,
            )
            return
        self.push_screen(KnobsScreen(self.whatif), self._ran)

    def _ran(self, made: tuple | None) -> None:
        """The form's answer: None (escape), or the new what-if, its view and the collector held meanwhile."""
        if made is None:
            return
        new, view, hold = made
        self.push_screen(
            WhatIfScreen(self.whatif, new, self.view, view, self.index, hold.release),
            lambda open_new: self._chosen(new, view) if open_new else None,
        )

    async def _chosen(self, new: WhatIf | StepWhatIf, view: View) -> None:
        """Open the new run: every panel made again over its view, the first event selected."""
        self.whatif, self.view = new, view
        self.sub_title = f"{view.title} ({settings_text(new.settings)})"
        await self.recompose()
        self.index = view.clamp(0)
        self.on_mount()

    def action_prompt(self, kind: str) -> None:
        question, placeholder = PROMPTS[kind]
        self.push_screen(PromptScreen(kind, question, placeholder), lambda value: self._answered(kind, value))

    def _answered(self, kind: str, value: str | None) -> None:
        """What a prompt was answered with (None: cancelled, nothing changes)."""
        view = self.view
        if value is None:
            return
        if kind == "go" and value.isdigit() and view.visible:
            self.index = view.visible[max(0, min(len(view.visible), int(value)) - 1)]
            return
        if kind == "filter":
            view.set_filter(value)
        elif kind == "rank":
            view.set_focus(int(value) if value.isdigit() and int(value) < view.trace.world else None)
        else:
            return
        self.revision += 1
        self.index = view.clamp(self.index)

    def on_timeline_selected(self, message: Timeline.Selected) -> None:
        self.index = message.index

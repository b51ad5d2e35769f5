"""The app's modal screens: a one-line prompt (go to an event, filter, focus a rank) and the help. Each sits
over the step-through screen and leaves it as it was; the app's step keys are off while one is open."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from .view import KEYS


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
        text.append("\n\nThe timeline: a row per rank (f: per group), a column per logical step; the selected "
                    "event's cells are reversed. Click a cell to select its event.", style="italic")
        text.append("\n\nescape, ? or q closes this help.", style="dim")
        with VerticalScroll(id="help-box") as box:
            box.border_title = "keys"
            yield Static(text, id="help")

    def action_close(self) -> None:
        self.dismiss(None)

"""`parasim memory --app`: the estimator as a live view. Up and down pick a setting, left and right (or - and +)
move it, and the memory bar, the fit and the step's time redraw at once (tui/estimator.py answers in a few
milliseconds after the first). The same app runs in a browser through `parasim serve --memory ARGS`."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header, Static

from .estimator import Estimator, bar

# one colour per memory item, in the order estimate/memory.py lists them
ITEM_COLOURS = ("dodger_blue1", "cyan", "magenta", "green", "gold1", "dark_orange", "grey70", "salmon1")


class EstimatorApp(App):
    """The settings on the left, the answer on the right."""

    TITLE = "parasim memory: the live estimator"
    CSS = """
    #settings { width: 44; padding: 0 1; border: round $accent; }
    #answer { width: 1fr; padding: 0 1; border: round $accent; }
    """
    BINDINGS = [
        Binding("up,k", "pick(-1)", "setting up", show=False),
        Binding("down,j", "pick(1)", "setting down", show=False),
        Binding("right,plus,l", "move(1)", "more"),
        Binding("left,minus,h", "move(-1)", "less"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.estimator = estimator
        self.picked = 0
        self.answer: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield Static(id="settings")
            yield Static(id="answer")
        yield Footer()

    def on_mount(self) -> None:
        self.answer = self.estimator.answer()
        self.redraw()

    def on_resize(self) -> None:
        self.call_after_refresh(self.redraw)  # the bar's width follows the panel's

    def action_pick(self, step: int) -> None:
        self.picked = (self.picked + step) % len(self.estimator.settings())
        self.redraw()

    def action_move(self, step: int) -> None:
        setting = self.estimator.settings()[self.picked]
        self.estimator.move(setting.name, step)
        self.answer = self.estimator.answer()
        self.redraw()

    def redraw(self) -> None:
        self.query_one("#settings", Static).update(self.settings_text())
        self.query_one("#answer", Static).update(self.answer_text())

    def settings_text(self) -> Text:
        out = Text("up/down: pick, left/right: move\n\n")
        for i, s in enumerate(self.estimator.settings()):
            value = self.estimator.values[s.name]
            if isinstance(value, bool):
                shown = "on" if value else "off"
            else:
                shown = f"{value:,}" if isinstance(value, int) else str(value)
            line = f"{'>' if i == self.picked else ' '} {s.name:<12}{shown:>18}\n"
            out.append(line, style="reverse" if i == self.picked else "")
        out.append(f"\n{self.estimator.settings()[self.picked].what}", style="italic")
        return out

    def answer_text(self) -> Text:
        a = self.answer
        if "refused" in a:
            return Text(f"these settings break a layout rule:\n{a['refused']}", style="bold red")
        room = self.query_one("#answer", Static).content_size.width or (self.size.width or 100) - 50
        width = max(20, room - 10)  # the bar, and the usable mark's words after it, inside the panel
        out = Text(f"{self.estimator.model.name}, {a['label']}\n\n")
        colour = {name: ITEM_COLOURS[i % len(ITEM_COLOURS)] for i, name in enumerate(a["items"])}
        for name, cells in bar(a["items"], a["usable"], width):
            out.append("█" * cells, style=colour[name])
        out.append("\n")
        limit = round(a["usable"] / max(a["total"], a["usable"]) * width)  # where the usable memory ends
        out.append(" " * max(0, limit - 1) + "^ usable\n\n", style="bold")
        for name, gb in a["items"].items():
            out.append("■ ", style=colour[name])
            out.append(f"{name:<26}{gb:>10,.2f} GB\n")
        verdict = "fits" if a["fits"] else "does NOT fit"
        out.append(
            f"\n{a['total']:,.2f} GB of {a['usable']:,.0f} GB usable on an {a['gpu']}: {verdict}\n",
            style="bold green" if a["fits"] else "bold red",
        )
        if a["step_s"] is not None:
            out.append(f"step {a['step_s']:,.3g} s, {a['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU\n")
        return out


def open_estimator(query: Any) -> None:
    """The live estimator over a JobQuery (memory's flags), on this terminal until q."""
    EstimatorApp(Estimator.from_query(query)).run()

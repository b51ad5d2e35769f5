"""The step-through app: timeline on top, the selected event and what each rank holds below, the lesson's
narrative beside them. Every key goes through one action per verb; widgets only draw the view model."""
from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Footer, Header, Input, Static

from ..pipeline import action as pipeline_action
from .memory import describe
from .timeline import Timeline
from .view import COLOURS, IDLE, KINDS, MapView, SlotWindow, View, Watch, kind_of

SPEEDS = (2.0, 1.0, 0.5, 0.25, 0.1)
HELP = ("right/n next  left/p previous  home/end first/last  space play/pause  +/- speed  g go to event  "
        "/ filter by op or axis  r focus a rank  t ring hops  f fold ranks into groups  d first divergence "
        "(parasim check --tui)  ? help  q quit")


class ParasimApp(App):
    CSS_PATH = "parasim.tcss"
    TITLE = "parasim"
    BINDINGS = [
        Binding("right,n", "step(1)", "next", priority=True),
        Binding("left,p", "step(-1)", "prev", priority=True),
        Binding("home", "jump('first')", "first", priority=True, show=False),
        Binding("end", "jump('last')", "last", priority=True, show=False),
        Binding("space", "play", "play/pause", priority=True),
        Binding("plus,equals_sign", "speed(1)", "faster", priority=True, show=False),
        Binding("minus", "speed(-1)", "slower", priority=True, show=False),
        Binding("g", "prompt('go')", "go to", priority=True),
        Binding("slash", "prompt('filter')", "filter", priority=True),
        Binding("r", "prompt('rank')", "rank", priority=True),
        Binding("t", "hops", "ring hops", priority=True),
        Binding("f", "fold", "fold ranks", priority=True),
        Binding("d", "diverged", "divergence", priority=True, show=False),
        Binding("question_mark", "help", "help", priority=True),
        Binding("q", "quit", "quit", priority=True),
        Binding("escape", "cancel", "cancel", priority=True, show=False),
    ]
    index = reactive(0, repaint=False)  # _show redraws what changed; a repaint would redraw the whole screen

    def __init__(self, view: View, start: int | None = None) -> None:
        """`start`: the event index to open at (`parasim check --tui`: the one the divergence is pinned on)."""
        super().__init__()
        self._start = start
        self.theme = "textual-dark"
        self.view = view
        self.sub_title = view.title
        self.playing = False
        self.speed = 2
        self.prompt_kind: str | None = None
        self._timer = None
        self._shown: dict[str, Text] = {}  # what each panel shows now
        self._panels_ready = False  # on_mount made the panels (App.is_mounted is a method: always true)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Timeline(self.view, id="timeline")
        yield Static(self._legend(), id="legend")
        with Horizontal(id="panels"):
            with VerticalScroll(id="left"):
                yield Static(id="watch")
                yield Static(id="map")
                yield Static(id="slots")
                yield Static(id="memory")
                yield Static(id="detail")
                yield Static(id="holdings")
                yield Static(id="work")
            with VerticalScroll(id="right"):
                yield Static(id="narrative")
        yield Static(id="status")
        yield Input(id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#prompt", Input).display = False
        self.query_one("#detail").border_title = "selected event"
        self.query_one("#holdings").border_title = "what each rank holds"
        self.query_one("#work").border_title = "compute so far, per rank (flops)"
        self.query_one("#right").border_title = "narrative"
        self.query_one(Timeline).border_title = "timeline: ranks x logical steps"
        if self._start is not None:  # set here, not before run(): the index's watcher draws the panels
            self.index = self.view.clamp(self._start)
        self._panels_ready = True
        self._show()

    # -- drawing -----------------------------------------------------------------------------------
    def _legend(self) -> Text:
        """The kinds of cell this trace holds, in the op table's order, each in its grid colour."""
        seen = {kind_of(e, m.rank) for e in self.view.events for m in e.members}
        text = Text()
        for code, style in [KINDS[k] for k in KINDS if k in seen] + [IDLE]:
            colour = Color.parse(COLOURS[style]).rich_color.name if style in COLOURS else "grey30"  # idle
            text.append(f"{code}", style=f"reverse {colour}")
            text.append(f" {style} ")
        return text

    def watch_index(self, index: int) -> None:
        if self._panels_ready:
            self._show()

    def _show(self) -> None:  # noqa: C901 (one place that pushes the view model into every widget)
        view, i = self.view, self.index
        watch = view.watch(i)
        self.query_one(Timeline).select(i, watch.rank if watch else None)
        self._show_watch(watch)
        self._show_map(view.map(i))
        self._put("detail", Text("\n".join(view.detail(i))))
        width = self.query_one("#left").size.width
        self._show_slots(view.slots(i, max(8, (width - 12) // 4) if width else 16))
        rows = [(f"rank {h.rank}", h.role, h.shape, h.placement, h.values) for h in view.holdings(i)]
        widths = [max([len(r[c]) for r in rows] + [0]) for c in range(5)]
        held = Text()
        for n, r in enumerate(rows):
            held.append(("\n" if n else "") + " ".join(v.ljust(w) for v, w in zip(r[:4], widths)))
            held.append(f" {r[4]}", style="bold")
        self._put("holdings", held)
        self.query_one("#holdings").display = bool(rows)
        work = view.work(i)
        if self._shown_if("work", work or None) is not None:
            top = max(f for _, f, _ in work) or 1.0
            self._put("work", _bars([(rank, flops / top, f" {flops:>9,.0f}  {last.split(': ', 1)[-1]}")
                                     for rank, flops, last in work], 16, " ", "green"))
        self._show_memory(view.held(i))
        phase, text, notes = view.phase_text(i)
        body = Text()
        if phase:
            body.append(phase + "\n", style="bold")
        body.append(text + "\n")
        for n in notes:
            body.append("\n" + n, style="italic")
        self._put("narrative", body)
        play = "playing" if self.playing else "paused"
        self._put("status", Text(f" {view.status(i)}   {play} ({SPEEDS[self.speed]} s/step)"))

    def _show_memory(self, rows: list) -> None:
        panel = self._shown_if("memory", rows or None)
        if panel is None:
            return
        top = max(r.peak for r in rows) or 1
        many = len(self.view.events[self.index].members) if self.view.events else 0
        more = f", the first {len(rows)} of {many} ranks" if many > len(rows) else ""
        panel.border_title = f"bytes held now (full bar: phase peak, {top:,} B{more})"
        self._put("memory", _bars([(r.rank, r.total / top, f" {r.total:>7,} B  {describe(r)}") for r in rows],
                                  10, "░", "magenta"))

    def _put(self, name: str, text: Text) -> None:
        """Update a panel, skipping the screen's layout pass when the panel keeps its height (same line
        count, no line wider than the panel): stepping then redraws without re-arranging the screen."""
        widget = self.query_one(f"#{name}", Static)
        before = self._shown.get(name)
        if before is not None and before == text:
            return
        lines = text.plain.split("\n")
        width = widget.content_size.width
        same = (before is not None and before.plain.count("\n") == len(lines) - 1 and width
                and max(map(len, lines)) <= width)
        widget.update(text, layout=not same)
        self._shown[name] = text

    def _shown_if(self, name: str, content: object) -> Static | None:
        """A panel shown only when there is something to put in it: the panel, or None (hidden)."""
        panel = self.query_one(f"#{name}", Static)
        panel.display = content is not None
        return panel if content is not None else None

    def _show_watch(self, watch: Watch | None) -> None:
        """The followed token: which GPU holds it in this phase (its row label is red in the timeline)."""
        panel = self._shown_if("watch", watch)
        if panel is None:
            return
        panel.border_title = Text(f"following {watch.token}")  # Text: a token's name is not markup
        text = Text()
        if watch.rank is None:
            text.append("not in this phase (another micro-batch, or the gradient sums)", style="dim")
        else:
            text.append(f"on g{watch.rank} (rank {watch.rank}) in this phase", style="bold red")
            for note in watch.notes:
                text.append("\n" + note)
        self._put("watch", text)

    def _show_map(self, m: MapView | None) -> None:
        """GPUs by node: the selected event's GPUs reversed, the followed token's GPU red."""
        panel = self._shown_if("map", m)
        if panel is None:
            return
        panel.border_title = f"GPUs by node ({m.gpus_per_node} each): this event's reversed, the token's red"
        text = Text()
        for n, rows in enumerate(m.nodes):
            text.append(("\n" if n else "") + f"node {n}", style="bold")
            for row in rows:
                text.append("\n ")
                for g in row:
                    style = ("bold red " if g == m.token else "") + ("reverse" if g in m.involved else "")
                    text.append(f" g{g:<3}", style=style.strip() or None)
        self._put("map", text)

    def _show_slots(self, win: SlotWindow | None) -> None:
        """The pipeline's slot table around the selected transfer: done actions bright, the one that just
        finished reversed, later ones dim; '>' marks the GPUs moving data."""
        panel = self._shown_if("slots", win)
        if panel is None:
            return
        text = Text()
        for g, (name, row) in enumerate(zip(win.names, win.rows)):
            text.append(("\n" if g else "") + (">" if g in win.ranks else " ") + f"{name:<6}")
            for t in range(win.first, win.last):
                cell = row[t] if t < len(row) else "."
                style = ("dim" if cell == "." else "bold reverse" if win.slot is not None and t == win.slot - 1
                         else "dim" if win.slot is not None and t >= win.slot else _slot_style(cell))
                text.append(f"{cell:>4}", style=style)
        where = f"after slot {win.slot}" if win.slot is not None else "the plan"
        panel.border_title = f"pipeline slots {win.first + 1}-{win.last}: {where}"
        self._put("slots", text)

    # -- actions -----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if self.prompt_kind is not None and action not in ("cancel",):
            return False  # let the prompt have the keys
        return True

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
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if self.playing:
            self._timer = self.set_interval(SPEEDS[self.speed], self._tick)
        self._show()

    def _tick(self) -> None:
        nxt = self.view.move(self.index, 1)
        if nxt == self.index:
            self.action_play()  # the end: stop
        self.index = nxt

    def action_speed(self, delta: int) -> None:
        self.speed = max(0, min(len(SPEEDS) - 1, self.speed + delta))
        if self.playing:
            self.action_play()
            self.action_play()
        self._show()

    def action_hops(self) -> None:
        self.view.show_hops = not self.view.show_hops
        self._show()

    def action_fold(self) -> None:
        axis = self.view.next_fold()
        self.query_one(Timeline).resize_rows()
        self.notify(f"rows: one per {axis} group" if axis else "rows: one per rank", timeout=2, markup=False)
        self._show()

    def action_help(self) -> None:
        self.notify(HELP, title="keys", timeout=8)

    def action_prompt(self, kind: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self.prompt_kind = kind
        prompt.placeholder = {"go": "go to event number", "filter": "op or axis (empty: all)",
                              "rank": "rank to focus (empty: all)"}[kind]
        prompt.value = ""
        prompt.display = True
        prompt.focus()

    def action_cancel(self) -> None:
        self._close_prompt()

    def _close_prompt(self) -> None:
        self.prompt_kind = None
        prompt = self.query_one("#prompt", Input)
        prompt.display = False
        self.query_one(Timeline).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        kind, value = self.prompt_kind, event.value.strip()
        self._close_prompt()
        view = self.view
        if kind == "go" and value.isdigit() and view.visible:
            self.index = view.visible[max(0, min(len(view.visible), int(value)) - 1)]
        elif kind == "filter":
            view.set_filter(value)
            self.index = view.clamp(self.index)
        elif kind == "rank":
            view.set_focus(int(value) if value.isdigit() and int(value) < view.trace.world else None)
            self.index = view.clamp(self.index)
        self._show()

    def on_timeline_selected(self, message: Timeline.Selected) -> None:
        self.index = message.index


def _slot_style(label: str) -> str:
    """A slot's colour: its action kind's, from the pipeline's kind table (none for a label it does not know)."""
    kind = pipeline_action.kind_of(label)
    return kind.rich if kind is not None else ""


def _bars(rows: list[tuple[int, float, str]], width: int, rest: str, style: str) -> Text:
    """One line per rank: its label, a bar filled to `share` (0..1) of `width` cells, then its words."""
    bars = Text()
    for n, (rank, share, words) in enumerate(rows):
        full = int(round(width * share))
        bars.append(("\n" if n else "") + f"rank {rank:<3}")
        bars.append("█" * full + rest * (width - full), style=style)
        bars.append(words)
    return bars

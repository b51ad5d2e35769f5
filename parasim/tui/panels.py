"""The app's panels, one widget each. Every panel holds the selected event's index and the view's revision
(bumped when hops, folding, a filter or the play state change) as reactives bound to the app's, and redraws
itself from the view model when either changes: the app never pushes text into a panel.

A panel's `content()` returns what it shows (Rich Text, which reads no markup: names from the trace stay
literal), or None to hide the panel. Its look is in parasim.tcss."""

from __future__ import annotations

from rich.text import Text
from textual.color import Color
from textual.content import Content
from textual.reactive import var
from textual.widgets import Static

from ..pipeline import action as pipeline_action
from .memory import describe
from .grid import COLOURS, IDLE, CELLS
from .keys import footer_keys
from .view import View

SPEEDS = (2.0, 1.0, 0.5, 0.25, 0.1)  # seconds per step while playing, slowest first (+/- moves along)


class Panel(Static):
    """A panel drawn from the view model at the selected event."""

    TITLE = ""
    index: var[int] = var(0, init=False)  # bound to the app's: the selected event
    revision: var[int] = var(0, init=False)  # bound to the app's: the view's settings changed

    def __init__(self, view: View, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = view
        self._shown: Text | None = None
        self._drawn: tuple[int | None, int] = (None, 0)  # (lines, width) the panel took when last drawn
        self._key: tuple | None = None  # (event, revision, width) it was drawn for

    def on_mount(self) -> None:
        if self.TITLE:
            self.border_title = self.TITLE
        self.redraw()

    def watch_index(self) -> None:
        self.redraw()

    def watch_revision(self) -> None:
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def content(self, index: int) -> Text | None:
        raise NotImplementedError

    def redraw(self, force: bool = False) -> None:
        """Draw the panel at the selected event, unless it is drawn there already (mounting, binding and the
        first resize all ask)."""
        if not self.is_mounted:
            return
        key = (self.index, self.revision, self.content_size.width)
        if key == self._key and not force:
            return
        self._key = key
        text = self.content(self.index)
        self.display = text is not None
        if text is None or text == self._shown:
            return
        # a panel that keeps its height redraws without the screen's layout pass: stepping then costs one
        # repaint, not a re-arrangement of every widget. The height is Textual's own, wrapping included.
        content = Content.from_rich_text(text)
        width = self.content_size.width
        height = content.get_height(self.styles, width) if width > 0 else None
        same = height is not None and (height, width) == self._drawn
        self._shown, self._drawn = text, (height, width)
        self.update(content, layout=not same)


class EventPanel(Panel):
    """The selected event: op, group, parameters, each rank's tensors and bytes (and a ring's hops on t)."""

    TITLE = "selected event"

    def content(self, index: int) -> Text:
        return Text("\n".join(self.view.detail(index)))


class MovesPanel(Panel):
    """What moves at the selected event: who sends how many bytes to whom (a matrix for an all-to-all)."""

    TITLE = "what moves"

    def content(self, index: int) -> Text | None:
        lines = self.view.moves(index)
        return None if lines is None else Text("\n".join(lines))


class HoldingsPanel(Panel):
    """Per rank taking part: what it held going in and coming out, its placement and values."""

    TITLE = "what each rank holds"

    def content(self, index: int) -> Text | None:
        rows = [(f"rank {h.rank}", h.role, h.shape, h.placement, h.values) for h in self.view.holdings(index)]
        if not rows:
            return None
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        held = Text()
        for n, r in enumerate(rows):
            held.append(("\n" if n else "") + " ".join(v.ljust(w) for v, w in zip(r[:4], widths)))
            held.append(f" {r[4]}", style="bold")
        return held


class WatchPanel(Panel):
    """The followed token: which GPU holds it in this phase (its row label is red in the timeline)."""

    def content(self, index: int) -> Text | None:
        watch = self.view.watch(index)
        if watch is None:
            return None
        self.border_title = Text(f"following {watch.token}")  # Text: a token's name is not markup
        if watch.rank is None:
            return Text("not in this phase (another micro-batch, or the gradient sums)", style="dim")
        text = Text(f"on g{watch.rank} (rank {watch.rank}) in this phase", style="bold red")
        for note in watch.notes:
            text.append("\n" + note)
        return text


class MapPanel(Panel):
    """GPUs by node: the selected event's GPUs reversed, the followed token's GPU red."""

    def content(self, index: int) -> Text | None:
        m = self.view.map(index)
        if m is None:
            return None
        self.border_title = f"GPUs by node ({m.gpus_per_node} each): this event's reversed, the token's red"
        text = Text()
        for n, rows in enumerate(m.nodes):
            text.append(("\n" if n else "") + f"node {n}", style="bold")
            for row in rows:
                text.append("\n ")
                for g in row:
                    style = ("bold red " if g == m.token else "") + ("reverse" if g in m.involved else "")
                    text.append(f" g{g:<3}", style=style.strip() or None)
        return text


class SlotsPanel(Panel):
    """The pipeline's slot table around the selected transfer: done actions bright, the one that just
    finished reversed, later ones dim; '>' marks the GPUs moving data."""

    def content(self, index: int) -> Text | None:
        width = self.content_size.width
        win = self.view.slots(index, max(8, (width - 8) // 4) if width else 16)
        if win is None:
            return None
        text = Text()
        for g, (name, row) in enumerate(zip(win.names, win.rows)):
            text.append(("\n" if g else "") + (">" if g in win.ranks else " ") + f"{name:<6}")
            for t in range(win.first, win.last):
                cell = row[t] if t < len(row) else "."
                style = (
                    "dim"
                    if cell == "."
                    else "bold reverse"
                    if win.slot is not None and t == win.slot - 1
                    else "dim"
                    if win.slot is not None and t >= win.slot
                    else _slot_style(cell)
                )
                text.append(f"{cell:>4}", style=style)
        where = f"after slot {win.slot}" if win.slot is not None else "the plan"
        self.border_title = f"pipeline slots {win.first + 1}-{win.last}: {where}"
        return text


class MemoryPanel(Panel):
    """Bytes each rank of the event held while it ran, as a bar against the phase's peak."""

    def content(self, index: int) -> Text | None:
        rows = self.view.held(index)
        if not rows:
            return None
        top = max(r.peak for r in rows) or 1
        many = len(self.view.events[index].members)
        more = f", the first {len(rows)} of {many} ranks" if many > len(rows) else ""
        self.border_title = f"bytes held now (full bar: phase peak, {top:,} B{more})"
        return _bars([(r.rank, r.total / top, f" {r.total:>7,} B  {describe(r)}") for r in rows], 10, "░", "magenta")


class WorkPanel(Panel):
    """Compute flops each rank recorded so far, as bars against the busiest rank."""

    TITLE = "compute so far in this phase, per rank (FLOPs)"

    def content(self, index: int) -> Text | None:
        work = self.view.work(index)
        if not work:
            return None
        top = max(f for _, f, _ in work) or 1.0
        return _bars(
            [(rank, flops / top, f" {flops:>9,.0f}  {last.split(': ', 1)[-1]}") for rank, flops, last in work],
            16,
            " ",
            "green",
        )


class NarrativePanel(Panel):
    """The lesson's words for the selected event's phase (after those of the quiet phases just before it), then
    what each rank noted there."""

    def content(self, index: int) -> Text:
        body = Text()
        # phases before this one that hold no event (a schedule's words and table) are said first
        for phase, words, notes in self.view.quiet_phases(index):
            body.append(phase + "\n", style="bold")
            body.append(words + "\n" if words else "")
            for n in notes:
                body.append("\n" + n, style="italic")
            body.append("\n\n")
        phase, words, notes = self.view.phase_text(index)
        if phase:
            body.append(phase + "\n", style="bold")
        if words:
            body.append(words + "\n")
        for n in notes:
            body.append("\n" + n, style="italic")
        return body


class StatusLine(Panel):
    """Where stepping is (event k of N, filter, focused rank), whether it plays, and why t shows nothing."""

    playing: var[bool] = var(False, init=False)
    speed: var[int] = var(2, init=False)

    def watch_playing(self) -> None:
        self.redraw(force=True)

    def watch_speed(self) -> None:
        self.redraw(force=True)

    def content(self, index: int) -> Text:
        play = f"playing ({SPEEDS[self.speed]} s/step)" if self.playing else "paused"
        # whether it plays comes before the rest, which a narrow terminal cuts from the right
        where, _, rest = self.view.status(index).partition("  ")
        line = Text(f" {where}  {play}" + (f"   {rest}" if rest else ""))
        hops = self.view.hops_note(index)
        if hops:
            line.append(f"   t: {hops}", style="bold")
        return line


class KeyLine(Static):
    """The footer: the keys a learner needs, from the view's key table (? lists them all)."""

    def on_mount(self) -> None:
        line = Text(" ")
        for n, (key, word) in enumerate(footer_keys()):
            line.append(("  " if n else "") + key, style="bold")
            line.append(f" {word}")
        self.update(line)


class Legend(Static):
    """The kinds of cell this trace holds, in the op table's order, each in its grid colour."""

    def __init__(self, view: View, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = view

    def on_mount(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        """The legend of the grid as it is now: on the clock, compute's cell and the critical path's mark too."""
        seen = self.view.kinds_seen()
        cells = [CELLS[k] for k in CELLS if k in seen and not (self.view.time_mode and k == "compute")]
        if self.view.time_mode:
            from .clockgrid import COMPUTE

            cells.append(COMPUTE)
        text = Text()
        for code, style in cells + [IDLE]:
            colour = Color.parse(COLOURS[style]).rich_color.name if style in COLOURS else "grey30"  # idle
            text.append(f"{code}", style=f"reverse {colour}")
            text.append(f" {style} ")
        if self.view.time_mode:
            text.append("xx", style="bold underline")
            text.append(" critical path")
        self.update(text)


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

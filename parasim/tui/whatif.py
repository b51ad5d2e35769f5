"""What-if in the app, in plain Python (no Textual): the settings as a form shows them, a re-run at the
settings a learner typed, and what changed between the run on screen and the new one.

The app holds one what-if for the run on screen: a `WhatIf` for a lesson, a `StepWhatIf` for a real-size step
(`parasim trace --symbolic --app`); each hands back a new one for the run it makes (so a second what-if
compares with the run then on screen). Both answer the app alike: `has_settings`, `settings`, `fields`,
`parse`, `rerun`, `view`, `changes` and `checks_line`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import UsageError
from ..layout.axes import SIZED
from ..lesson import KNOB_KINDS, Lesson, LessonRun, Table, run_lesson


@dataclass(frozen=True)
class Field:
    """One setting as the form shows it: the knob's name, its flag, what it is, the value of the run on screen,
    the post's value and the values it takes (None: any positive integer)."""

    name: str
    flag: str
    help: str
    value: Any
    post: Any
    choices: tuple | None
    origin: str = "the post's"  # whose value `post` is: the post's, or a preset's
    takes: str | None = None  # what it takes, where that is neither choices nor a positive integer

    @property
    def hint(self) -> str:
        takes = self.takes or (" or ".join(map(str, self.choices)) if self.choices else "a positive integer")
        return f"{takes}; {self.origin}: {self.post}"


def settings_text(settings: dict[str, Any]) -> str:
    """'--tp 4 -m 16': the settings as the command line spells them."""
    flag = {n: KNOB_KINDS[n].flags[0] if n in KNOB_KINDS else f"--{n}" for n in settings}  # --overlap: a clock flag
    return " ".join(f"{flag[n]} {v}" for n, v in settings.items()) or "the lesson's own"


def _read(name: str, text: str) -> Any:
    """A setting as the command line reads it (UsageError names the flag)."""
    kind = KNOB_KINDS[name]
    if kind.parse is int:
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"{kind.flags[0]} takes a positive integer, not {text!r}")
        return int(text)
    return kind.parse(text)


def changes_table(old_f: dict[str, Any], new_f: dict[str, Any], before: str, after: str, notes: list[str]) -> Table:
    """The figures of two runs, the ones that changed first and marked (as parasim compare marks them)."""
    from ..figures import differing

    names = list(dict.fromkeys([*old_f, *new_f]))
    changed = differing([{"figures": old_f}, {"figures": new_f}])
    rows = [
        (("* " if n in changed else "") + n, [old_f.get(n), new_f.get(n)])
        for n in changed + [n for n in names if n not in changed]
    ]
    said = [f"* marks the {len(changed)} figures that changed" if changed else "no figure changed"]
    return Table(
        f"Before: {before}; after: {after} (bytes in B, every figure from a run)",
        ["figure", "before", "after"],
        rows,
        said + notes,
    )


@dataclass
class WhatIf:
    lesson: Lesson
    run: LessonRun
    timeout: float | None = None

    noun = "lesson"  # what runs again, in the form's words

    @property
    def has_settings(self) -> bool:
        return bool(self.lesson.knobs)

    @property
    def name(self) -> str:
        return self.lesson.name

    def prepare(self) -> None:
        """Nothing to work out ahead: a lesson's figures come from its small run at once."""

    def questions(self) -> list[Any]:
        """The lesson's quiz of the run on screen (examples/quiz.Question)."""
        return self.run.questions()

    def view(self) -> Any:
        """The app's view of this run."""
        from .view import View

        return View(self.run.result.trace, self.lesson.narrative, self.lesson.title, tables=list(self.run.tables))

    @property
    def settings(self) -> dict[str, Any]:
        """Every knob's value in the run on screen (the defaults where the run was made without knobs)."""
        return {**self.lesson.settings(), **self.run.result.trace.meta.get("knobs", {})}

    def fields(self) -> list[Field]:
        now = self.settings
        return [
            Field(n, KNOB_KINDS[n].flags[0], KNOB_KINDS[n].help, now[n], k.default, k.choices)
            for n, k in self.lesson.knobs.items()
        ]

    def parse(self, typed: dict[str, str]) -> dict[str, Any]:
        """The settings a learner typed (knob name -> text; empty text keeps the value on screen), read as the
        command line reads them and validated by the lesson: UsageError names the flag."""
        out = dict(self.settings)
        for name, text in typed.items():
            text = text.strip()
            if text:
                out[name] = _read(name, text)
        self.lesson.settings(out)  # a value the lesson refuses: UsageError before any run
        return out

    def rerun(self, settings: dict[str, Any]) -> "WhatIf":
        """The lesson run again at `settings` (a UsageError when the lesson cannot run there)."""
        return WhatIf(self.lesson, run_lesson(self.lesson, timeout=self.timeout, knobs=settings), self.timeout)

    def changes(self, new: "WhatIf") -> Table:
        """The figures of both runs (parasim compare's: bytes per axis, memory, the lesson's own), the ones that
        changed first and marked."""
        from ..figures import run_figures

        notes = []
        if not new.run.ok:
            notes.append(
                "the new run disagrees with its reference: " + "; ".join(c.name for c in new.run.checks if not c.ok)
            )
        before, after = settings_text(self.settings), settings_text(new.settings)
        return changes_table(run_figures(self.run), run_figures(new.run), before, after, notes)

    def checks_line(self) -> str:
        """The new run's checks in one line: how many hold, and whether the post's own figures apply."""
        held, total = sum(c.ok for c in self.run.checks), len(self.run.checks)
        post = self.lesson.at_post_settings(self.settings)
        own = self.lesson.settings_words(self.settings) == "(the post's)"
        return f"{held} of {total} checks hold" + (
            (" (at the post's settings)" if own else " (at the lesson's defaults)")
            if post
            else " (the post's own figures hold at the lesson's defaults only)"
        )


def step_figures(q: Any, step: Any, gpu: int = 0, overlap: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a what-if sets side by side for a real-size step (`StepWhatIf`; `q`, `step`: examples/tracing's
    TraceQuery and TracedStep): its size, GPU `gpu`'s peak memory and the bytes it sent on each axis, and the
    step on the clock with the switches in `overlap` on. Read from GPU `gpu`'s part of the trace alone: a folded
    trace is never written out for it (2,048 GPUs' events would be 600,000)."""
    from ..examples.tracing import step_times
    from ..figures import event_axis

    trace, layout = step.result.trace, step.layout
    out: dict[str, Any] = {"GPUs": layout.world, "micro-batches": step.microbatches}
    sent: dict[str, int] = {}
    for e in trace.events_of(gpu):
        for mm in e.members:
            if mm.rank == gpu and e.kind != "compute":
                sent[event_axis(e)] = sent.get(event_axis(e), 0) + mm.sent
    out.update({f"bytes GPU {gpu} sent on {axis}": sent[axis] for axis in sorted(sent)})
    if any(mk.kind == "held" for mk in trace.marks_of(gpu)):
        out[f"GPU {gpu}'s peak memory (B)"] = trace.peak(gpu)["bytes"]
    if "flops" in trace.meta:
        from ..estimate.kernels import NoMeasurement

        try:
            t = step_times(q.gpu_model, trace, layout, gpu, step.microbatches, step.plan, False, overlap)
        except NoMeasurement:  # a GPU type with a datasheet and no kernel table: no time to set beside
            return out
        out[f"step on the clock (s, {t['gpu']})"] = round(t["step_s"], 4)
        out[f"GPU {gpu}'s compute (s)"] = round(t["this"]["compute_s"], 4)
        if "mfu" in t:
            out["MFU (%)"] = round(100 * t["mfu"], 1)
    return out


# what a real-size step's what-if turns: every size but expert TP's (as for lessons) and m (KNOB_KINDS' names),
# then the clock's switches (`--overlap`: the step is not run again for them, only laid out again)
STEP_SETTINGS = (*(a for a in SIZED if a != "etp"), "m")
SWITCHES = "overlap"


@dataclass
class StepWhatIf:
    """What-if on a real-size step (`parasim trace --symbolic --app`): its layout's sizes, its micro-batches and
    the clock's overlap switches as a form; the step run again at the typed sizes (each stage's layers once per
    shape, train/repeat.py: about a second at 2,048 GPUs), or only laid out again on the clock when the switches
    alone changed; GPU 0's figures from both (`step_figures`). `origin`: the layout the learner opened, whose
    values the form offers beside the ones on screen; `overlap`: the switches the step is timed with."""

    query: Any  # examples/tracing.TraceQuery
    step: Any  # examples/tracing.TracedStep, run at `query`
    origin: Any = None  # the Layout first opened (None: query's)
    overlap: tuple[str, ...] = ()
    shown: Any = None  # a view of this very step on another clock, to share (tui/view.View.on_clock)
    _figures: dict | None = None

    has_settings = True
    noun = "step"

    @property
    def name(self) -> str:
        return self.query.name

    @property
    def title(self) -> str:
        return f"{self.query.name}: one training step on {self.step.layout.world:,} symbolic GPUs"

    @property
    def settings(self) -> dict[str, Any]:
        layout = self.step.layout
        return {
            **{a: getattr(layout, a) for a in STEP_SETTINGS if a != "m"},
            "m": self.step.microbatches,
            SWITCHES: ",".join(self.overlap) or "none",
        }

    def fields(self) -> list[Field]:
        from ..clock.overlaps import TRACE, names

        now, first = self.settings, self.origin or self.query.layout
        origin = "the job's" if self.query.job is not None else "the preset's"
        out = [
            Field(
                n,
                KNOB_KINDS[n].flags[0],
                KNOB_KINDS[n].help,
                now[n],
                getattr(first, n) if n != "m" else first.pp,  # a step's micro-batches default to its stages
                None,
                origin,
            )
            for n in STEP_SETTINGS
        ]
        takes = f"a comma-separated list of {', '.join(names(TRACE))}, or all, or none"
        what = "communication run beside compute on the clock (the step is laid out again, not run again)"
        return out + [Field(SWITCHES, "--overlap", what, now[SWITCHES], "none", None, "the step's default", takes)]

    def parse(self, typed: dict[str, str]) -> dict[str, Any]:
        """The settings typed (empty keeps the value on screen): each size a positive integer, the switches as
        `--overlap` takes them; the layout they make is checked here (UsageError or LayoutError names what does
        not fit) before any run."""
        from ..clock.overlaps import TRACE, parse

        out = dict(self.settings)
        for name, text in typed.items():
            if text.strip():
                out[name] = (
                    ",".join(parse(text.strip(), TRACE)) or "none" if name == SWITCHES else _read(name, text.strip())
                )
        self._query(out)
        return out

    def _query(self, settings: dict[str, Any]) -> Any:
        from ..limits import check_app_gpus

        sizes = {a: settings[a] for a in STEP_SETTINGS if a != "m"}
        now = self.query.layout
        # the world follows the sizes; expert TP follows TP where it was TP's (Megatron's default)
        etp = None if now.etp == now.tp else now.etp
        layout = replace(now, **sizes, etp=etp, world=None)
        check_app_gpus(layout.world, settings["m"])
        return replace(self.query, layout=layout, microbatches=settings["m"])

    def rerun(self, settings: dict[str, Any]) -> "StepWhatIf":
        """The step at `settings`: run again where a size or the micro-batches changed (a ParasimError when it
        cannot run there), else this very step on the clock with the other switches."""
        from ..clock.overlaps import TRACE, parse
        from ..examples.tracing import traced_step

        q, overlap, first = self._query(settings), parse(settings[SWITCHES], TRACE), self.origin or self.query.layout
        if q == self._query(self.settings):  # the switches alone: the same step laid out again
            return StepWhatIf(q, self.step, first, overlap, self.shown)
        return StepWhatIf(q, traced_step(q), first, overlap)

    def view(self) -> Any:
        from ..clock.report import ClockChoice
        from .view import View

        choice = ClockChoice(self.query.gpu_model, None, self.overlap)
        if self.shown is None:
            self.shown = View(self.step.result.trace, {}, self.title, clock_choice=choice)
            return self.shown
        return self.shown.on_clock(choice)

    def prepare(self) -> None:
        """This run's figures, worked out ahead (while the form is filled in), so the comparison waits only on
        the new run's."""
        self.figures()

    def figures(self) -> dict[str, Any]:
        if self._figures is None:
            self._figures = step_figures(self.query, self.step, overlap=self.overlap)
        return self._figures

    def changes(self, new: "StepWhatIf") -> Table:
        before, after = settings_text(self.settings), settings_text(new.settings)
        notes = [] if new.step is not self.step else ["the same step, laid out again on the clock"]
        if new.step is self.step and new.figures() == self.figures():
            # train/step.py sums the gradients once the schedule is done: no product is left to hide them behind
            notes.append(
                "the switches hide nothing on this step: its gradient sums and gathers run after its last "
                "backward, with no compute beside them"
            )
        return changes_table(self.figures(), new.figures(), before, after, notes)

    def checks_line(self) -> str:
        """The new step in one line: how many GPUs, how many ran, GPU 0's peak memory."""
        ran = len(set(self.step.result.trace.meta.get("fold") or range(self.step.layout.world)))
        f = self.figures()
        peak = f.get("GPU 0's peak memory (B)")
        return f"{self.step.layout.world:,} GPUs, {ran} run on symbolic ranks" + (
            f", GPU 0 holds {peak / 1e9:.1f} GB at its peak" if peak is not None else ""
        )

"""What-if in the app, in plain Python (no Textual): the lesson's settings as a form shows them, a re-run at
the settings a learner typed, and what changed between the run on screen and the new one.

The app holds one `WhatIf` per lesson it opened: it knows the lesson and the run on screen, and hands back
a new `WhatIf` for the run it makes (so a second what-if compares with the run then on screen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
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

    @property
    def hint(self) -> str:
        takes = " or ".join(map(str, self.choices)) if self.choices else "a positive integer"
        return f"{takes}; the post's: {self.post}"


def settings_text(settings: dict[str, Any]) -> str:
    """'--tp 4 -m 16': the settings as the command line spells them."""
    return " ".join(f"{KNOB_KINDS[n].flags[0]} {v}" for n, v in settings.items()) or "the lesson's own"


@dataclass
class WhatIf:
    lesson: Lesson
    run: LessonRun
    timeout: float | None = None

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
            if not text:
                continue
            kind = KNOB_KINDS[name]
            if kind.parse is int:
                if not text.isdigit() or int(text) < 1:
                    raise UsageError(f"{kind.flags[0]} takes a positive integer, not {text!r}")
                out[name] = int(text)
            else:
                out[name] = kind.parse(text)
        self.lesson.settings(out)  # a value the lesson refuses: UsageError before any run
        return out

    def rerun(self, settings: dict[str, Any]) -> "WhatIf":
        """The lesson run again at `settings` (a UsageError when the lesson cannot run there)."""
        return WhatIf(self.lesson, run_lesson(self.lesson, timeout=self.timeout, knobs=settings), self.timeout)

    def changes(self, new: "WhatIf") -> Table:
        """The figures of both runs (parasim compare's: bytes per axis, memory, the lesson's own), the ones that
        changed first and marked."""
        from ..figures import differing, run_figures

        old_f, new_f = run_figures(self.run), run_figures(new.run)
        names = list(dict.fromkeys([*old_f, *new_f]))
        changed = differing([{"figures": old_f}, {"figures": new_f}])  # as parasim compare marks them
        rows = [
            (("* " if n in changed else "") + n, [old_f.get(n), new_f.get(n)])
            for n in changed + [n for n in names if n not in changed]
        ]
        before, after = settings_text(self.settings), settings_text(new.settings)
        notes = [f"* marks the {len(changed)} figures that changed" if changed else "no figure changed"]
        if not new.run.ok:
            notes.append(
                "the new run disagrees with its reference: " + "; ".join(c.name for c in new.run.checks if not c.ok)
            )
        return Table(
            f"Before: {before}; after: {after} (bytes in B, every figure from a run)",
            ["figure", "before", "after"],
            rows,
            notes,
        )

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

"""What a lesson is, where lessons live, and how one runs.

A lesson is a short module in the top-level `lessons/` folder (shipped inside the wheel as
`parasim/lessons`) that defines `LESSON = Lesson(...)`: a name, a title, the post's section it works
through and its place in the post's order, a world size, an SPMD program, narrative text for each phase, a
`checks` function comparing what the run computed with an independent single-device reference, and the
picture `--plot` draws of a run, if any. The list, its order and the pictures are read from the files:
a new lesson is its file (and its test). Lessons are loaded by path, so they need not be importable.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .engine.runner import RunResult, run
from .errors import UsageError
from .layout.axes import AXES, SIZED
from .limits import TIMEOUT
from .jsonout import jsonable


@dataclass(frozen=True)
class Check:
    """One comparison of a computed figure with its reference."""

    name: str
    got: Any
    expected: Any
    ok: bool

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "got": jsonable(self.got, f"check {self.name!r}: got"),
            "expected": jsonable(self.expected, f"check {self.name!r}: expected"),
            "ok": self.ok,
        }


def check(name: str, got: Any, expected: Any, *, rtol: float = 0.0, atol: float = 0.0) -> Check:
    """Compare numbers, arrays or nested lists; exact unless a tolerance is given."""
    g, e = jsonable(got), jsonable(expected)
    try:
        ga, ea = np.asarray(g, dtype=float), np.asarray(e, dtype=float)
        ok = ga.shape == ea.shape and bool(np.allclose(ga, ea, rtol=rtol, atol=atol, equal_nan=False))
    except (TypeError, ValueError):
        ok = g == e
    return Check(name, g, e, ok)


@dataclass(frozen=True)
class Table:
    """One of a lesson's tables (the post's tables, computed by the run): named columns, one labelled row
    each, and notes under it (where the run and the post differ: the post's figure, the run's, and why)."""

    title: str
    columns: list[str]  # the first names the row labels
    rows: list[tuple[str, list[Any]]]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(set(self.columns)) != len(self.columns):  # the JSON names each row's cells by column
            raise ValueError(f"table {self.title!r}: two columns share a name: {self.columns}")
        if any(len(values) != len(self.columns) - 1 for _, values in self.rows):
            raise ValueError(f"table {self.title!r}: a row's cells do not match its columns")

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [
                {
                    self.columns[0]: label,
                    **{c: jsonable(v, f"table {self.title!r}") for c, v in zip(self.columns[1:], values)},
                }
                for label, values in self.rows
            ],
            "notes": list(self.notes),
        }

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame, indexed by its first column (pandas is not one of parasim's own
        dependencies: install it to use this)."""
        from .jsonout import data_frame

        return data_frame(self.to_dict()["rows"], self.columns[0])

    def _repr_html_(self) -> str:
        from .jsonout import table_html

        return table_html(self.title, self.columns, [[label, *values] for label, values in self.rows], self.notes)


@dataclass(frozen=True)
class Picture:
    """The picture `parasim lesson NAME --plot FILE.png` draws of a lesson's run: its function (the run, the
    file to write) and, in words, what it shows (`parasim lesson --list` says it)."""

    draw: Callable[[Any, str], None]
    shows: str


@dataclass(frozen=True)
class KnobKind:
    """A setting some lessons let a learner turn, as the command line spells it."""

    flags: tuple[str, ...]
    metavar: str
    help: str
    parse: Callable[[str], Any] = int


# Every knob any lesson has, one entry each: `parasim lesson` offers these flags, and a lesson says which
# of them it takes (`Lesson.knobs`). A flag the lesson does not take is refused in one line.
KNOB_KINDS: dict[str, KnobKind] = {
    # a layout's sizes, one per mesh axis (layout/axes.py: its flag, placeholder and words); no lesson turns
    # expert TP (moe16-variants runs ETP 2 as one of its layouts), so `parasim lesson` does not offer it
    **{name: KnobKind((f"--{name}",), AXES[name].metavar, AXES[name].what) for name in SIZED if name != "etp"},
    "m": KnobKind(("-m", "--microbatches"), "M", "micro-batches per step (what a pipeline interleaves)"),
    "chunks": KnobKind(("--chunks",), "V", "model chunks per GPU (interleaved pipeline)"),
    "routing": KnobKind(
        ("--routing",),
        "HOW",
        "how tokens pick experts: the run's own router (learned) or the "
        "post's drawn choices (post); at-scale: a policy (uniform or balanced)",
        str,
    ),
}


AS_DEFAULT = object()  # Knob.post: the post's value is the lesson's default
NOT_IN_POST = object()  # Knob.post: the post gives no value for this setting


@dataclass(frozen=True)
class Knob:
    """One setting a lesson takes: its default (the setting its checks are made for: the post's where the post
    gives one that runs here), the values it accepts (None: any positive integer), whether it is the number of
    ranks, and the post's own value where that is not the default (`post`: a value, AS_DEFAULT, or NOT_IN_POST
    where the post names none), so a walk-through says "(the post's)" only where it is."""

    default: Any
    choices: tuple | None = None
    world: bool = False
    post: Any = AS_DEFAULT
    why: str = ""  # where the default is not the post's: why the lesson runs another (one clause)
    limits: str = ""  # where `choices` are given: why only those (one clause), said when another is refused

    def post_words(self, flag: str) -> str | None:
        """None where the post's value is the default; else the post's value, or its absence, in words."""
        if self.post is AS_DEFAULT:
            return None
        said = f"the post gives no {flag}" if self.post is NOT_IN_POST else f"the post's is {flag} {self.post}"
        return said + (f": {self.why}" if self.why else "")


@dataclass(frozen=True)
class Lesson:
    name: str
    title: str
    world: int
    program: Callable[[Any], Any]
    narrative: dict[str, str]  # phase name -> what the learner should see in it
    checks: Callable[[RunResult], list[Check]]
    summary: str = ""
    section: str = ""  # the post's section it works through (its heading, shortened); "" for a user's program
    # its place in the post's order: lessons are listed by it (then by name), those without one last; the
    # lessons of the post take 10, 20, 30, ..., so a new one finds a place between two without renumbering
    order: float = float("inf")
    picture: Picture | None = None  # what `--plot` draws of a run
    no_picture: str = ""  # where it draws none: why, in one clause, and where a picture of it is (--plot says it)
    keep_values: int = 64  # arrays up to this many elements are shown by value
    # the plain walk-through's events a phase, the rest counted by op in one line (None: every one); --json and
    # the app keep them all
    events_shown: int | None = None
    # the plain walk-through's events of a step that did the same on other groups or ranks (a TP all-gather in
    # every TP group, a CP ring's passes) said once, with a line naming the others
    fold_alike: bool = False
    seed: int = 0
    min_world: int = 1  # the program adapts to ctx.world within [min_world, max_world]
    max_world: int | None = None
    worlds: tuple[int, ...] | None = None  # or exactly these world sizes
    source: str = field(default="", compare=False)  # the lesson's file, set when it is loaded
    reference: Callable[[Any], Any] | None = None  # one rank, marking whole tensors: `parasim check` compares
    variants: dict[str, Callable[[Any], Any]] = field(default_factory=dict)  # `parasim check --bug NAME`
    # the same program on other layout sizes ({"tp": 2, "sp": True, ...}) -> (program, world): `parasim check
    # --reference-layout` compares a run with it (None: the program adapts to the world size alone)
    on_layout: Callable[[dict], tuple[Callable[[Any], Any], int]] | None = None
    backend: str = "virtual"  # "symbolic": the lesson works at real sizes, shapes and bytes without values
    knobs: dict[str, Knob] = field(default_factory=dict)  # settings a learner may turn (KNOB_KINDS' names)
    # the lesson's own figures of a run, name -> value, that `parasim compare` sets side by side
    figures: Callable[[RunResult], dict[str, Any]] | None = None
    # the lesson's tables of a run; with `study`, checks and tables are handed what it measured (work both
    # need, done once: moe16-variants runs every variant)
    tables: Callable[..., list[Table]] | None = None
    study: Callable[[RunResult], Any] | None = None
    # predict, then see (`--quiz`): the figures of a run a learner is asked for first (examples/quiz.Question)
    quiz: Callable[[RunResult], list[Any]] | None = None

    def judge(self, result: RunResult) -> tuple[list[Check], list[Table]]:
        """The lesson's checks and tables of a run."""
        args = (result,) if self.study is None else (result, self.study(result))
        return list(self.checks(*args)), list(self.tables(*args)) if self.tables is not None else []

    def settings(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every knob's value for a run: the given ones (validated, UsageError naming the flag) over the
        defaults. A knob the lesson does not take is refused, naming the ones it does."""
        given = {k: v for k, v in (given or {}).items() if v is not None}
        for name, value in given.items():
            knob = self.knobs.get(name)
            flag = KNOB_KINDS[name].flags[-1] if name in KNOB_KINDS else name
            if knob is None:
                takes = ", ".join(KNOB_KINDS[k].flags[-1] for k in self.knobs) or "none"
                raise UsageError(f"lesson {self.name!r} has no {flag} (the settings it takes: {takes})")
            if knob.choices is not None and value not in knob.choices:
                said = "; ".join(w for w in (knob.limits, knob.why) if w)
                raise UsageError(
                    f"lesson {self.name!r} takes {flag} {' or '.join(map(str, knob.choices))}, "
                    f"not {value}" + (f" ({said})" if said else "")
                )
        return {name: given.get(name, knob.default) for name, knob in self.knobs.items()}

    def listing(self) -> dict[str, Any]:
        """What `parasim lesson --list --json` says of the lesson: its names, the picture `--plot` draws, and
        each knob by its flag (the post's value null where the post names none)."""

        def post(k: Knob) -> Any:
            return k.default if k.post is AS_DEFAULT else None if k.post is NOT_IN_POST else k.post

        return {
            "name": self.name,
            "section": self.section,
            "title": self.title,
            "world": self.world,
            "summary": self.summary,
            "picture": self.picture.shows if self.picture else None,
            "no_picture": None if self.picture else self.no_picture or None,
            "quiz": self.quiz is not None,
            "knobs": {
                KNOB_KINDS[n].flags[-1]: {"default": k.default, "choices": k.choices, "post": post(k)}
                for n, k in self.knobs.items()
            },
        }

    def check_asks(self) -> None:
        """--quiz on a lesson without questions: one line naming the lessons that ask some."""
        if self.quiz is None:
            asking = [name for name, other in load_lessons().items() if other.quiz is not None]
            raise UsageError(f"--quiz: {self.name} asks no questions yet; lessons that do: {', '.join(asking)}")

    def world_of_flag(self) -> str:
        return next((KNOB_KINDS[n].flags[-1] for n, k in self.knobs.items() if k.world), "--world")

    def at_post_settings(self, settings: dict[str, Any]) -> bool:
        """True when every knob is at the lesson's default (the settings its checks of the post's figures are
        made for; `settings_words` says where those are not the post's own)."""
        return all(settings.get(n, k.default) == k.default for n, k in self.knobs.items())

    def settings_words(self, settings: dict[str, Any]) -> str:
        """How `settings` stand to the post: "(the post's)" only where every setting is the post's own value;
        at the lesson's defaults, where some are not, the post's value (or that it gives none) for each; else
        the post's values."""
        flag = {n: KNOB_KINDS[n].flags[-1] for n in self.knobs}
        post = {n: k.default if k.post is AS_DEFAULT else k.post for n, k in self.knobs.items()}
        silent = [f"it gives no {flag[n]}" for n, v in post.items() if v is NOT_IN_POST]
        if not silent and all(settings.get(n, k.default) == post[n] for n, k in self.knobs.items()):
            return "(the post's)"
        if self.at_post_settings(settings):
            differ = [w for n, k in self.knobs.items() if (w := k.post_words(flag[n])) is not None]
            return f"(the lesson's defaults; {'; '.join(differ)})"
        given = ", ".join(f"{flag[n]} {v}" for n, v in post.items() if v is not NOT_IN_POST)
        return f"(the post's: {'; '.join(([given] if given else []) + silent)})"

    @property
    def target(self) -> tuple[str, str]:
        """How real ranks find the program: (file, function name); lesson files are loaded by path."""
        return self.source, self.program.__name__

    def fits(self, world: int) -> bool:
        if self.worlds is not None:
            return world in self.worlds
        return self.min_world <= world and (self.max_world is None or world <= self.max_world)

    def check_world(self, world: int) -> None:
        """Raise UsageError unless the lesson can run on `world` ranks."""
        if self.worlds is not None:
            if world not in self.worlds:
                raise UsageError(f"lesson {self.name!r} runs on {', '.join(map(str, self.worlds))} ranks, not {world}")
            return
        hi = self.max_world
        if world < self.min_world or (hi is not None and world > hi):
            span = (
                (f"exactly {hi}" if hi == self.min_world else f"{self.min_world} to {hi}")
                if hi is not None
                else f"at least {self.min_world}"
            )
            raise UsageError(f"lesson {self.name!r} runs on {span} ranks, not {world}")


@dataclass
class LessonRun:
    lesson: Lesson
    result: RunResult
    checks: list[Check]
    tables: list[Table] = field(default_factory=list)
    timing: Any = None  # clock/report.ClockChoice the JSON times the run on (None: an H200, no overlap)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def timeline(self) -> Any:
        """The run on the clock (clock/timeline.Timeline, on `timing`): made once, beside the trace."""
        from .clock.report import ClockChoice, timeline_of

        choice = self.timing or ClockChoice()
        if getattr(self, "_timed", None) is None or self._timed[0] != choice:
            self._timed = (choice, timeline_of(self.result.trace, choice))
        return self._timed[1]

    def clock(self) -> dict:
        """The run's step on the clock (clock/report.py) and what each overlap switch would save on it."""
        from .clock.report import ClockChoice, clock_report

        return clock_report(self.result.trace, self.timing or ClockChoice(), self.timeline())

    def to_dict(self) -> dict:
        from .clock.timeline import event_time

        tl = self.timeline()
        return {
            "lesson": self.lesson.name,
            "title": self.lesson.title,
            "world": self.result.world,
            "clock": self.clock(),
            "events": [{**e.to_dict(), "time": event_time(tl, e)} for e in self.result.trace.events],
            "values": [jsonable(v, f"rank {r}'s value") for r, v in enumerate(self.result.values)],
            "checks": [c.to_dict() for c in self.checks],
            **({"settings": self.result.trace.meta["knobs"]} if "knobs" in self.result.trace.meta else {}),
            **({"tables": [t.to_dict() for t in self.tables]} if self.tables else {}),
            **({"held": self.held()} if any(m.kind == "held" for m in self.result.trace.marks) else {}),
        }

    def _repr_html_(self) -> str:
        """In a notebook: the lesson's title, each check with what the run computed, and its tables."""
        from .jsonout import lines_html, table_html

        checks = [[c.name, "yes" if c.ok else "NO", c.got, c.expected] for c in self.checks]
        return (
            lines_html([f"{self.lesson.name}: {self.lesson.title} ({self.result.world} ranks)"])
            + table_html("checks", ["check", "holds", "computed", "reference"], checks)
            + "".join(t._repr_html_() for t in self.tables)
        )

    def plot(self) -> Any:
        """The lesson's picture of this run (what `parasim lesson NAME --plot FILE.png` draws), for a notebook."""
        import tempfile
        from pathlib import Path

        from .jsonout import Png

        if self.lesson.picture is None:
            raise UsageError(f"lesson {self.lesson.name} has no picture: {self.lesson.no_picture}")
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "picture.png")
            self.lesson.picture.draw(self, path)
            return Png(Path(path).read_bytes())

    def questions(self) -> list[Any]:
        """The lesson's questions of this run (examples/quiz.Question), each answer the run's: [] where it asks none."""
        return [] if self.lesson.quiz is None else list(self.lesson.quiz(self.result))

    def held(self) -> dict:
        """What the run told the trace its ranks hold: each rank's peak (bytes, by kind, where) and what it
        still holds at the end."""
        trace = self.result.trace
        return {
            "peak": [trace.peak(r) for r in range(trace.world)],
            "at_end": [trace.held(r) for r in range(trace.world)],
        }


def run_lesson(
    lesson: Lesson, world: int | None = None, timeout: float | None = TIMEOUT, knobs: dict[str, Any] | None = None
) -> LessonRun:
    """Run a lesson on virtual ranks, or symbolic ones if it says so (its own world size unless `world` or a
    knob that is the world is given). `timeout`: seconds a rank may run without reaching a collective or
    returning (None: no limit). `knobs`: the lesson's settings to change ({"tp": 4}); the program reads them
    from `ctx.knobs`, the checks from `result.trace.meta["knobs"]`."""
    from .engine.context import WithKnobs

    settings = lesson.settings(knobs)
    world_knob = next((n for n, k in lesson.knobs.items() if k.world), None)
    if world_knob is not None and (knobs or {}).get(world_knob) is not None:
        if world is not None and world != settings[world_knob]:
            raise UsageError(
                f"--world {world} and {lesson.world_of_flag()} {settings[world_knob]} disagree: give one of them"
            )
        world = settings[world_knob]
    world = lesson.world if world is None else world
    if world_knob is not None:
        settings[world_knob] = world
    lesson.check_world(world)
    keep = lesson.keep_values if lesson.backend == "virtual" else 0
    program = WithKnobs(lesson.program, settings) if settings else lesson.program
    result = run(program, world, lesson.backend, seed=lesson.seed, keep_values=keep, timeout=timeout)
    result.trace.meta["lesson"] = lesson.name
    if settings:
        result.trace.meta["knobs"] = settings
    checks, tables = lesson.judge(result)
    return LessonRun(lesson, result, checks, tables)


def sent_in_phase(result: Any, phase: str | None, keep: Callable[[Any], bool] | None = None, rank: int = 0) -> int:
    """Bytes `rank` sent in `phase` (None: in every phase), as the trace recorded them, on the events
    `keep(event)` picks (None: all of them). The one place lessons and tables add up what a rank sent."""
    return sum(
        m.sent
        for e in result.trace.events
        if (phase is None or e.phase == phase) and (keep is None or keep(e))
        for m in e.members
        if m.rank == rank
    )


def lessons_dir() -> Path:
    """parasim/lessons inside an installed wheel, else lessons/ beside the package in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lessons", here.parent / "lessons"):
        if candidate.is_dir():
            return candidate
    raise UsageError("no lessons folder found next to the parasim package (is the install complete?)")


def lesson_module(stem: str) -> types.ModuleType:
    """A lesson file's module (lessons/STEM.py), loaded by its path: lessons are files, not a package."""
    path = lessons_dir() / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"parasim_lesson_{stem.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def load_lessons() -> dict[str, Lesson]:
    """Every lesson, by name, in the order of the post's sections (each lesson's `order`, then its name)."""
    out: dict[str, Lesson] = {}
    for path in sorted(lessons_dir().glob("*.py")):
        if path.name.startswith("_"):
            continue
        lesson = getattr(lesson_module(path.stem), "LESSON", None)
        if isinstance(lesson, Lesson):
            out[lesson.name] = replace(lesson, source=str(path))
    return {name: out[name] for name in sorted(out, key=lambda n: (out[n].order, n))}


def is_program(name: str) -> bool:
    """`path/to/file.py:function`: a user's SPMD program rather than a lesson's name."""
    path, colon, fn = name.rpartition(":")
    return bool(colon) and path.endswith(".py") and fn.isidentifier()


def program_lesson(name: str, world: int | None, flag: str = "--world", timeout: float | None = TIMEOUT) -> Lesson:
    """A user's program (`file.py:function`) as a lesson, so everything that runs lessons runs it. The file
    may define NARRATIVE (phase -> text), TITLE, WORLD, KEEP_VALUES, checks(result) -> [Check] and
    reference(ctx); it is loaded by path, as lessons are, so real ranks find the function the same way.
    Whatever is wrong with the file is one UsageError naming its line (engine/program_file.py)."""
    from .engine.program_file import load_program

    path, _, fn = name.rpartition(":")
    f = load_program(path, fn, timeout)
    n = world if world is not None else f.world
    if n is None:
        raise UsageError(f"say how many ranks {name} runs on: {flag} N (or WORLD = N in {f.path.name})")
    checks = (lambda result: []) if f.checks is None else partial(_user_checks, f.checks, f.checks_at, f.path)
    return Lesson(
        name=name,
        title=f.title or f"{fn} from {f.path.name}",
        world=n,
        program=f.program,
        narrative=f.narrative,
        checks=checks,
        summary=f"a user program: {name}",
        keep_values=64 if f.keep_values is None else f.keep_values,
        source=str(f.path.resolve()),
        reference=f.reference,
    )


def _user_checks(checks: Callable[[Any], Any], where: str, path: Path, result: RunResult) -> list[Check]:
    """A user file's checks(result), whose answer must be a list of `check(...)` results."""
    from .engine.program_file import one_line, raised_at
    from .limits import brief

    try:
        out = checks(result)
    except Exception as exc:
        raise UsageError(
            f"{where}: checks(result) raised {type(exc).__name__}: {one_line(exc)} at {raised_at(exc, path)}"
        ) from None
    if out is None or isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
        raise UsageError(
            f"{where}: checks(result) must return a list of parasim.lesson.check(...) results, got {brief(out)}"
        )
    out = list(out)
    for i, c in enumerate(out):
        if not isinstance(c, Check):
            raise UsageError(
                f"{where}: checks(result) must return a list of parasim.lesson.check(...) results; "
                f"item {i} is {brief(c)}"
            )
    return out


def get_lesson(name: str, world: int | None = None, flag: str = "--world", timeout: float | None = TIMEOUT) -> Lesson:
    """A lesson by name, or a user's program given as `file.py:function` (which needs `world`, the command's
    `flag`; loading its file may take `timeout` seconds at most)."""
    if is_program(name):
        return program_lesson(name, world, flag, timeout)
    lessons = load_lessons()
    if name not in lessons:
        raise UsageError(f"unknown lesson {name!r}; lessons: {', '.join(lessons) or 'none'}")
    return lessons[name]


def knob(result: RunResult, name: str, default: Any) -> Any:
    """A lesson's setting as the run used it (its checks call this; `default` when run without knobs)."""
    return result.trace.meta.get("knobs", {}).get(name, default)


class _CallableModule(types.ModuleType):
    """This module, callable: `parasim.lesson("tp-mlp", tp=4)` runs a lesson, as api.lesson does. The package's
    attribute `lesson` is this module whenever anything has imported it, so the call lives here."""

    def __call__(self, name: str, world: int | None = None, **knobs: Any) -> LessonRun:
        return run_lesson(get_lesson(name, world), world, knobs=knobs or None)


sys.modules[__name__].__class__ = _CallableModule

"""Predict, then see (`parasim lesson NAME --quiz`): a lesson asks for a figure before the learner sees it (the
bytes a rank sends, the bubble at p and m, the GPUs a token lands on, ZeRO's bytes per parameter), grades the
answer against what the run computed, and shows the worked formula with the run's numbers.

A lesson's questions are one function of its run (`Lesson.quiz`), each answer read from the run, never typed
in: the walk-through, `--json`, the app (key z) and the browser all ask the same ones and grade them here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MAX_ANSWER = 200  # characters of an answer read: a figure or a few GPU names, never more


@dataclass(frozen=True)
class Question:
    """One figure a learner is asked to predict: the question (with the run's settings in it), the run's
    answer (a number, or names such as "g3, g5" where the order does not matter), its unit as the answer is
    to be given, and how the figure comes out, worked with the run's numbers. A number within `rtol` of the
    run's counts as right (the post rounds: 3/7 given as 0.43 is right)."""

    ask: str
    answer: float | int | Fraction | str
    unit: str
    worked: str
    rtol: float = 0.02

    @property
    def numeric(self) -> bool:
        return not isinstance(self.answer, str)

    def shown(self) -> str:
        """The run's answer as the walk-through prints it."""
        a = self.answer
        if isinstance(a, Fraction) and a.denominator != 1:
            return f"{a.numerator}/{a.denominator} ({float(a):.3g})"
        if isinstance(a, str):
            return a
        return f"{int(a):,}" if float(a).is_integer() else f"{float(a):.4g}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ask": self.ask,
            "answer": float(self.answer) if isinstance(self.answer, Fraction) else self.answer,
            "unit": self.unit,
            "worked": self.worked,
            "rtol": self.rtol,
        }


_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


# a size's suffix as a learner writes it: 7k, 7 KB, 7 KiB, 1.5M, 2 GB
_SCALE = {
    **{p: 1000.0**i for i, p in enumerate("kmgt", 1)},
    **{p + "b": 1000.0**i for i, p in enumerate("kmgt", 1)},
    **{p + "i": 1024.0**i for i, p in enumerate("kmgt", 1)},
    **{p + "ib": 1024.0**i for i, p in enumerate("kmgt", 1)},
    "%": 0.01,
}


def parse_number(text: str) -> float | None:
    """A learner's figure: 7168, 7,168, 7.2e3, 7k, 7 KiB, 3/7, 0.43 or 43% (a share), a unit word after it
    ignored ("7168 B", "3.75 bytes"). None: no number in it."""
    s = text.strip().replace("_", "")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # 7,168: a thousands separator
    m = re.match(rf"\s*({_NUMBER.pattern})\s*/\s*({_NUMBER.pattern})", s)
    if m:
        top, bottom = float(m.group(1)), float(m.group(5))
        return top / bottom if bottom else None
    m = re.match(rf"\s*({_NUMBER.pattern})\s*(%|[A-Za-z]+)?", s)
    if not m:
        return None
    # a size's suffix scales the number; any other word after it is its unit ("bytes", "micro-batches")
    return float(m.group(1)) * _SCALE.get((m.group(5) or "").lower(), 1.0)


def in_unit(text: str, unit: str) -> float | None:
    """A learner's figure in a question's unit: where the unit is a size ("GB") and the answer gives a size
    too ("432 GB", "0.432 TB"), the answer's bytes over the unit's; a bare number is in the unit already."""
    value = parse_number(text)
    scale = _SCALE.get(unit.strip().lower())
    m = re.match(rf"\s*({_NUMBER.pattern})\s*([A-Za-z]+)", text.strip().replace(",", ""))
    if value is None or scale is None or m is None or m.group(5).lower() not in (*_SCALE, "b", "byte", "bytes"):
        return value
    return value / scale


def readings(text: str, unit: str) -> list[float]:
    """A learner's figure as it may be meant: `in_unit`'s, and where it gives a decimal size ("3.5KB"), the same
    read in binary too (3.5 x 1,024: the lessons write 4,096 B as 4 KB, as most people do)."""
    value = in_unit(text, unit)
    if value is None:
        return []
    m = re.match(rf"\s*({_NUMBER.pattern})\s*([kmgtKMGT][bB]?)\b", text.strip().replace(",", ""))
    if m is None:
        return [value]
    power = "kmgt".index(m.group(5)[0].lower()) + 1
    return [value, value * (1024 / 1000) ** power]


def _names(text: str) -> frozenset[str]:
    """Names given in any order and case, with or without "GPU": "g3, g5" = "G5 g3" = "gpu 3 and gpu 5"."""
    t = re.sub(r"\bgpu\s*(\d+)", r"g\1", text.lower())
    return frozenset(w for w in re.split(r"[\s,;/+]+|\band\b", t) if w)


@dataclass(frozen=True)
class Graded:
    """A question and what the learner said (None: no answer), and whether it matches the run."""

    question: Question
    given: str | None

    @property
    def right(self) -> bool | None:
        q, given = self.question, self.given
        if given is None or not given.strip():
            return None
        if not q.numeric:
            return _names(given) == _names(str(q.answer))
        want = float(q.answer)  # type: ignore[arg-type]
        return any(abs(v - want) <= q.rtol * abs(want) + 1e-12 for v in readings(given, q.unit))

    def verdict(self) -> str:
        """One line: right, or the run's figure against the learner's (how far off, where both are numbers)."""
        q, right = self.question, self.right
        unit = f" {q.unit}" if q.unit else ""
        if right is None:
            return f"no answer; the run's: {q.shown()}{unit}"
        if right:
            return f"right: the run's is {q.shown()}{unit}"
        value = in_unit(self.given or "", q.unit) if q.numeric else None
        if value is None:
            said = "not a number" if q.numeric else f"you said {self.given}"
            return f"not quite ({said}); the run's: {q.shown()}{unit}"
        want = float(q.answer)  # type: ignore[arg-type]
        off = (
            f"{value / want:.2g}x the run's"
            if want and value and value / want > 0 and not 0.5 < value / want < 2
            else f"{'over' if value > want else 'under'} by {abs(value - want):.3g}"
        )
        return f"not quite (yours {value:.4g}, {off}); the run's: {q.shown()}{unit}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.question.to_dict(), "given": self.given, "right": self.right, "verdict": self.verdict()}


def grade(questions: list[Question], answers: list[str | None]) -> list[Graded]:
    """Each question with the learner's answer in order (missing ones: None)."""
    return [Graded(q, answers[i] if i < len(answers) else None) for i, q in enumerate(questions)]


def quiz_lines(graded: Graded) -> list[str]:
    """What the walk-through prints once a question is answered: the verdict, and, for anything but a right
    answer, the worked formula."""
    out = [f"  {graded.verdict()}"]
    if not graded.right:
        out.append(f"  how: {graded.question.worked}")
    return out


def prompt_of(q: Question, number: int, total: int) -> str:
    return f"Q{number} of {total}. {q.ask}" + (f" ({q.unit})" if q.unit else "")

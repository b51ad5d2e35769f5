"""One step of a pipeline schedule, named as torch.distributed.pipelining names it, and the table of action
kinds: one entry per kind, everything about it in one place.

An entry says what the kind waits for (`needs`, read by the slot timing: timing.py), how many slots it
takes unless told otherwise (`cost`), what it hands to a neighbouring stage (`passes`, read by the
executor: executor.py), how it holds activations (`holds`, the timing's activation peaks), and how it is
drawn (`letter`, `rich` for the app and the schedule table, `plot` for matplotlib, `title` for a learner).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    """An action waits for the end of one action of `kinds` (the first of them found, in this order) on
    stage `stage + offset`, same micro-batch. Where that stage does not exist (before the first, after the
    last) the need is void: the first forward takes the input, the last backward the loss."""

    kinds: tuple[str, ...]
    offset: int


@dataclass(frozen=True)
class ActionKind:
    letter: str  # as Action.kind and the slot tables write it (a rank's second chunk in lower case)
    title: str  # for a learner
    needs: tuple[Need, ...]  # what it waits for; an action runs once every need has ended
    cost: int  # slots it takes unless the caller gives other costs
    passes: tuple[str, int] | None  # what it hands on at its end, and to which stage: ("act", +1), ("grad", -1)
    holds: int  # +1: holds its micro-batch's activations from its start; -1: frees them at its end; 0: neither
    rich: str  # colour in rich / Textual (the app, the schedule table)
    plot: str  # colour in matplotlib (render/plots.py)


KINDS: dict[str, ActionKind] = {
    k.letter: k
    for k in (
        ActionKind("F", "forward", (Need(("F",), -1),), 1, ("act", +1), +1, "cyan", "#4c9be8"),
        ActionKind(
            "B",
            "full backward (input and weights)",
            (Need(("F",), 0), Need(("B", "I"), +1)),
            1,
            ("grad", -1),
            -1,
            "magenta",
            "#d264b6",
        ),
        # an input-only backward still leaves the weight pass its inputs: it frees nothing
        ActionKind(
            "I",
            "backward for the input only",
            (Need(("F",), 0), Need(("B", "I"), +1)),
            1,
            ("grad", -1),
            0,
            "magenta",
            "#d264b6",
        ),
        ActionKind("W", "backward for the weights (deferred)", (Need(("I",), 0),), 1, None, -1, "yellow", "#e8b04c"),
    )
}


def kind_of(label: str) -> ActionKind | None:
    """The kind of a slot-table label ("F1", "b2", "W3:4"); None for an idle slot or an unknown letter."""
    return KINDS.get(label[:1].upper())


@dataclass(frozen=True)
class Action:
    kind: str  # a key of KINDS: "F", "B", "I" or "W"
    mb: int  # micro-batch, 0-based
    stage: int  # global pipeline stage (model chunk)
    chunk: int = 0  # which of its rank's chunks: 0 first, 1 second, ...

    def __str__(self) -> str:
        if self.chunk == 0:
            return f"{self.kind}{self.mb + 1}"
        if self.chunk == 1:
            return f"{self.kind.lower()}{self.mb + 1}"
        return f"{self.kind}{self.mb + 1}:{self.chunk + 1}"

    def torch_name(self) -> str:
        """torch.distributed.pipelining's string form: <stage><kind><micro-batch>, 0-based."""
        return f"{self.stage}{self.kind}{self.mb}"


Schedule = list[list[Action]]

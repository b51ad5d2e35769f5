"""The worked examples `parasim trace` follows a token through, one entry each, by name (`--example`). An entry
says what a command needs of an example: the layout preset it runs on by default, its small model's sentence
length, its micro-batches, the routings that keep the model's own router (so the run can be held to the
unsplit model), and the functions that check a layout, find a word, build the program, read the token's path
and hold the run to one device. `parasim trace`, `parasim compare layout` and `parasim serve --trace` read the
entry; none of them names an example. The post's 16-GPU MoE example (examples/moe16.py) is the first.

Adding one: its module (its data, its program, its path and its exactness), then its entry here and its test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class WorkedExample:
    """One worked example (see the module's docstring)."""

    name: str
    what: str  # one line for `parasim trace --help`
    layout: str  # the layout preset it runs on when no sizes are given
    model: Any  # its small model (layout.ModelSpec): what sizes given without a preset are built on
    seq: int  # tokens a sequence: a model of this length follows a word, any other runs at real size
    micro_batches: int  # per DP replica, unless -m says otherwise
    routings: tuple[str, ...]  # the routings that keep the router: a run held to the unsplit model
    check_runnable: Callable[[Any, int, str], None]  # (layout, micro-batches, routing): one line if it cannot run
    replicas: Callable[[int, int], tuple]  # (dp, micro-batches) -> each replica's sequences
    find_token: Callable[[str, Any], tuple[str, int]]  # (word, the sequences run) -> (sequence, position)
    make_program: Callable[..., Any]  # (watched token, layout, micro-batches, routing) -> the SPMD program
    token_path: Callable[..., dict]  # (trace, watched token, replicas, layout name) -> the path `trace` prints
    token_figures: Callable[[Any], dict]  # (trace) -> the figures `compare layout` sets side by side
    exactness: Callable[..., dict]  # (values, layout, micro-batches, routing) -> the run against one device


def _moe16() -> WorkedExample:
    from .moe16 import (
        LAYOUT,
        MICRO_BATCHES,
        MOE16,
        ROUTINGS,
        SEQUENCES,
        check_runnable,
        find_token,
        make_program,
        replicas,
    )
    from .moe16_exact import exactness
    from .moe16_path import token_figures, token_path

    return WorkedExample(
        "moe16",
        "the post's MoE example: 4 layers, 8 experts, top-2, 8-token sequences",
        LAYOUT,
        MOE16,
        len(SEQUENCES["A"]),
        MICRO_BATCHES,
        ROUTINGS,
        check_runnable,
        replicas,
        find_token,
        make_program,
        token_path,
        token_figures,
        exactness,
    )


# name -> how to load it: an example's modules are imported when it is asked for (a command's start stays quick)
EXAMPLES: dict[str, Callable[[], WorkedExample]] = {"moe16": _moe16}
DEFAULT = "moe16"  # the example a command runs when none is named


def example(name: str) -> WorkedExample:
    """The worked example named `name`; one that is not there is refused in one line."""
    from ..errors import UsageError

    if name not in EXAMPLES:
        raise UsageError(f"unknown worked example {name!r}; examples: {', '.join(EXAMPLES)}")
    return EXAMPLES[name]()

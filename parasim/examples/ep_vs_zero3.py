"""EP's all-to-alls against ZeRO-3's gather of the experts: one formula for the three lessons that set them side
by side (ep-split, at-scale, all-to-all-hidden). Each lesson counts at its own sizes and with its own routing, so
each finds its own ratio; `table` sets the three side by side with the quantities that make them differ.

The three lessons import it; it reads the other two's figures from their modules (parasim.lesson.lesson_module).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb
from typing import Any

FILES = {"ep-split": "ep_split", "at-scale": "at_scale", "all-to-all-hidden": "all_to_all_hidden"}  # their stems
FORMULA = "s x E x 2hF / (T x r x (2h + E/EP))"


def parts(*, share: float, experts: int, ep: int, hidden: int, width: int, tokens: int, rows: float) -> dict:
    """ZeRO-3's bytes over EP's, for one GPU, one MoE layer, forward only. ZeRO-3 sends `share` of the layer's
    `experts`, two hidden x width matrices each; EP sends `rows` rows for each of its `tokens` to other GPUs,
    each row out as `hidden` values with the gates of the experts/ep experts there and back as `hidden` values.
    Both sides move values of one dtype, so a value's bytes cancel."""
    gates = experts / ep
    return {
        "share": share,
        "F/T": width / tokens,
        "rows": rows,
        "gates": gates / (2 * hidden + gates),  # the gates' part of a row's bytes, out and back
        "ratio": share * experts * 2 * hidden * width / (tokens * rows * (2 * hidden + gates)),
    }


def uniform_rows(experts: int, ep: int, k: int) -> float:
    """Rows a token sends, on average, when its k picks are k different experts drawn at random: one to each
    other GPU holding at least one of them (two picks on one GPU share a row)."""
    return (ep - 1) * (1 - comb(experts - experts // ep, k) / comb(experts, k))


def counts(but: str = "") -> dict[str, dict]:
    """The three lessons' `parts` (all `but` one), each from its constants alone (its routing's rows a token on
    average)."""
    from ..lesson import lesson_module

    return {name: lesson_module(FILES[name]).ep_vs_zero3() for name in FILES if name != but}


def _share(s: float) -> str:
    return str(Fraction(s).limit_denominator(64))


def ratio_table(me: str, mine: dict, counted: str, routing: str) -> Any:
    """The three lessons' ZeRO-3-over-EP ratios side by side, one row each (lesson `me`'s from its run: `mine`,
    its `parts`; the other two from their constants), the quantities that set each ratio across (s, F/T, r, the
    gates' share of a row's bytes), and one sentence saying what they are: `counted`, which experts s is the
    share of here; `routing`, what sets r here."""
    from ..lesson import Table

    got = {**counts(but=me), me: mine}
    rows = [
        (
            name + (" (this run)" if name == me else ""),
            [_share(p["share"]), round(p["F/T"], 3), round(p["rows"], 2), f"{p['gates']:.1%}", f"{p['ratio']:.0f}x"],
        )
        for name, p in ((n, got[n]) for n in FILES)
    ]
    return Table(
        f"ZeRO-3's bytes over EP's, one GPU, one MoE layer forward: {FORMULA}",
        ["lesson", "s", "F/T", "r", "gates", "ratio"],
        rows,
        notes=[
            f"s: the share of the layer's experts a GPU gathers (here {counted}); F/T: an expert's width over a "
            f"GPU's tokens; r: rows a token sends to other GPUs (here {routing}; the other rows: their routings' "
            "average); gates: the E/EP gates' share of a row's bytes out and back; one dtype on both sides, so a "
            "value's bytes cancel."
        ],
    )

"""EP's all-to-alls against ZeRO-3's gather of the experts: one formula for the three lessons that set them side
by side (ep-split, at-scale, all-to-all-hidden). Each lesson counts at its own sizes and with its own routing, so
each finds its own ratio; `why` says which quantities make the three differ, each from its lesson's constants.

The three lessons import it; it reads the other two's figures from their modules (parasim.lesson.lesson_module).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

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


def _by(o: dict, m: dict) -> str:
    """How much `o`'s ratio is of `m`'s, and the quantities in which the two differ, each with what it does."""
    said = []
    if abs(o["share"] / m["share"] - 1) > 1e-3:
        said.append(f"s = {_share(o['share'])} (x{o['share'] / m['share']:.2f})")
    if abs(o["F/T"] / m["F/T"] - 1) > 1e-3:
        said.append(f"F/T = {o['F/T']:g} (x{o['F/T'] / m['F/T']:.2f})")
    if abs(o["rows"] / m["rows"] - 1) > 0.01:
        said.append(f"r = {o['rows']:.2f} (x{m['rows'] / o['rows']:.2f})")
    if abs((1 - o["gates"]) / (1 - m["gates"]) - 1) > 0.01:
        said.append(f"gates {o['gates']:.1%} (x{(1 - o['gates']) / (1 - m['gates']):.2f})")
    return f"x{o['ratio'] / m['ratio']:.2f} this one's, for its " + ", ".join(said)


def why(me: str, mine: dict, counted: str, routing: str) -> str:
    """One sentence: what lesson `me`'s ratio counts (`mine`: its run's `parts`; `counted`: which experts s is
    the share of; `routing`: what sets its r) and why the other two lessons' ratios differ from it."""
    others = counts(but=me)
    return (
        f"{mine['ratio']:.0f}x here, "
        + " and ".join(f"{p['ratio']:.0f}x in {n}" for n, p in others.items())
        + f", each one GPU's ZeRO-3 bytes over its dispatch + combine forward: {FORMULA}, with s the share of "
        "the layer's experts gathered, F/T an expert's width over a GPU's tokens, r the rows a token sends to "
        "other GPUs and E/EP the gates riding out beside a row's h values (h come back), one dtype on both sides "
        f"so a value's bytes cancel; here s = {_share(mine['share'])} ({counted}), F/T = {mine['F/T']:g}, "
        f"r = {mine['rows']:.2f} ({routing}) and the gates are {mine['gates']:.1%} of the rows' bytes; "
        + "; ".join(f"{n}'s ratio is {_by(p, mine)}" for n, p in others.items())
        + "."
    )

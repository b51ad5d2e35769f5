"""The app's keys, one table: the bindings, the footer line and the help screen are all made from it."""

from __future__ import annotations

from typing import NamedTuple


class Key(NamedTuple):
    """One key of the app: Textual's key names, the action it runs, how the footer and help write the key,
    the footer's word for it ("": help only) and the help's sentence."""

    keys: str
    action: str
    shown: str
    footer: str
    help: str


# The app's keys. The bindings, the footer line and the help screen are all made from this table. The footer
# holds what a learner reaches for and fits 100 columns; go to, fold and quit are in the help (?).
KEYS: tuple[Key, ...] = (
    Key("right,n", "step(1)", "→ n", "next", "the next event, in the order events completed"),
    Key("left,p", "step(-1)", "← p", "prev", "the previous event"),
    Key("home", "jump('first')", "home", "", "the first event"),
    Key("end", "jump('last')", "end", "", "the last event"),
    Key("space", "play", "space", "play", "play or pause: step on by itself"),
    Key("plus,equals_sign", "speed(1)", "+", "", "play faster"),
    Key("minus", "speed(-1)", "-", "", "play slower"),
    Key("g", "prompt('go')", "g", "", "go to event k (k as in 'event k/N' on the status line)"),
    Key(
        "slash",
        "prompt('filter')",
        "/",
        "filter",
        "step only through events whose op, axis (group) or label holds a word",
    ),
    Key("r", "prompt('rank')", "r", "rank", "step only through the events one rank takes part in"),
    Key("t", "hops", "t", "hops", "show or hide the hops of a ring collective: who sends which chunk to whom"),
    Key("f", "fold", "f", "", "timeline rows: one per group of an axis (tp, dp, ...), then one per rank"),
    Key(
        "u",
        "time",
        "u",
        "time",
        "the timeline in time (on the clock, in microseconds or milliseconds: an H200 node "
        "of 8, no overlap) or in logical steps: compute, transfers and idle per GPU, the critical path in bold",
    ),
    Key("d", "diverged", "d", "", "jump to the first divergence (when opened by parasim check --tui)"),
    Key("T", "tables", "T", "tables", "the lesson's tables: the post's tables, every figure from this run"),
    Key(
        "k",
        "whatif",
        "k",
        "what if",
        "what if: change the lesson's settings (--tp, -m, ...), run it again and see the new run beside this one",
    ),
    Key(
        "z",
        "quiz",
        "z",
        "quiz",
        "predict, then see: the lesson's questions (a figure of this run asked first, graded, then worked)",
    ),
    Key("question_mark", "help", "?", "help", "this help"),
    Key("q", "quit", "q", "", "quit"),
)


def footer_keys() -> list[tuple[str, str]]:
    """(key, word) pairs of the footer line: the step keys together, then each key with a footer word."""
    shown = [("← →", "step")]
    return shown + [(k.shown, k.footer) for k in KEYS if k.footer and k.action not in ("step(1)", "step(-1)")]

"""Text from outside (a trace file, a user's program, a config) made safe to print: shown, never executed.

A terminal acts on some characters instead of showing them: ESC and the C1 controls start escape
sequences (colours, clearing the screen, an OSC 52 write to the clipboard, a window title), BEL rings,
a carriage return or a backspace overwrites what was printed, a newline fakes a line of output, and the
bidirectional overrides reorder what follows so that a line reads differently from what it holds. A lone
surrogate cannot be encoded at all and would end the program with a UnicodeEncodeError. Every renderer
passes outside text through `printable` where it enters the output; each such character is written as
the escape Python would use for it (ESC as \\x1b, U+202E as \\u202e), so a learner sees what is there.
Rich and Textual markup in such text (`[bold red]`, `[link=...]`) is a second, separate question: it is
escaped where the text goes into a Rich or Textual string that is parsed for markup (`markup_safe`).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

# C0 controls (tab and newline included: a name is one line), DEL, the C1 controls, the Arabic letter
# mark, the left-to-right and right-to-left marks, the line and paragraph separators, the embeddings and
# overrides (U+202A-U+202E), the isolates (U+2066-U+2069), and lone surrogates
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}  # the three Python writes by a letter


def _escape(m: re.Match) -> str:
    c = m.group()
    if c in NAMED:
        return NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: Any) -> str:
    """`text` (str() of it when it is not a string) with every character a terminal would act on, or could not
    encode, written as its escape: '\\x1b[31mred' for ESC [ 3 1 m r e d. Text that is already safe is returned
    as it is."""
    s = text if isinstance(text, str) else str(text)
    return UNSAFE.sub(_escape, s) if UNSAFE.search(s) else s


def printable_lines(lines: Iterable[Any]) -> str:
    """Lines of a report that quote a file or a path (a config's model_type, a launch script's flags), joined
    by newlines, each made `printable`: a newline inside one line is shown as \\n, never taken as a new line."""
    return "\n".join(printable(line) for line in lines)


def markup_safe(text: Any) -> str:
    """`printable(text)` with Rich / Textual markup escaped, for strings that are parsed as markup (a Rich
    console's print, a Textual border title): '[bold]x[/]' shows as those very characters."""
    from rich.markup import escape

    return escape(printable(text))

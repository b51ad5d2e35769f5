"""Writing a file whole or not at all, and text a terminal can show.

A file is written to a temporary file in the same folder and renamed over its name (`os.replace`, one
step on every file system): a reader never sees half of it, a full disk leaves nothing behind, and an old
file of that name stays as it was until the new one is complete. A name that is not a regular file (a
device such as /dev/stdout, a named pipe) is written directly: there is nothing to rename over.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Callable

from ..errors import OutputError, UsageError

# errors of the writing itself, not of the name: the same write to another disk would work
_WRITE_FAILED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EPIPE, errno.EBADF}

# ASCII spellings of the characters parasim's own text uses, for a terminal that cannot show them
ASCII = str.maketrans(
    {
        "→": "->",
        "←": "<-",
        "↔": "<->",
        "↓": "v",
        "↑": "^",
        "×": "x",
        "·": ".",
        "…": "...",
        "≤": "<=",
        "≥": ">=",
        "≈": "~",
        "≠": "!=",
        "—": "--",
        "–": "-",
        "−": "-",
        "²": "^2",
        "³": "^3",
        "√": "sqrt",
        "∑": "sum",
        "Σ": "sum",
        "✓": "ok",
        "✗": "x",
        "•": "*",
        "─": "-",
        "━": "-",
        "│": "|",
        "┃": "|",
        "┌": "+",
        "┐": "+",
        "└": "+",
        "┘": "+",
        "├": "+",
        "┤": "+",
        "┬": "+",
        "┴": "+",
        "┼": "+",
        "╭": "+",
        "╮": "+",
        "╰": "+",
        "╯": "+",
        "▏": "|",
        "▎": "|",
        "█": "#",
        "░": ".",
        "▒": ":",
        "▓": "#",
    }
)


def shown(text: str, encoding: str | None) -> str:
    """`text` as a terminal of `encoding` can show it: arrows, box lines and signs in their ASCII spellings
    (-> for an arrow, x for a times sign), anything else it cannot encode as '?'."""
    enc = encoding or "utf-8"
    try:
        text.encode(enc)
        return text
    except (UnicodeEncodeError, LookupError):
        pass
    try:
        return text.translate(ASCII).encode(enc, "replace").decode(enc)
    except LookupError:  # an encoding Python does not know: ASCII is safe everywhere
        return text.translate(ASCII).encode("ascii", "replace").decode("ascii")


def write_whole(path: str, write: Callable[[str], None] | bytes | str) -> None:
    """Write `path` whole or not at all: `write` is the data (bytes or text), or a function that writes the
    file at the path it is given (matplotlib's savefig). UsageError when the name cannot be written (no
    such folder, no permission: exit 2); OutputError when the writing fails (a full disk: exit 1); either
    way no file of that name is made or changed."""
    if not path:
        raise UsageError("an empty file name: give a path to write to")
    target = os.path.realpath(path)  # a link is followed: the file it names is replaced, not the link
    try:
        direct = not stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        direct = False
    except OSError as exc:
        raise _error(path, exc) from None
    if direct:  # a device or a pipe: written as it is
        try:
            _put(target, write)
        except OSError as exc:
            raise _error(path, exc) from None
        return
    folder, name = os.path.split(target)
    root, ext = os.path.splitext(name)
    temp = os.path.join(folder, f".{root}.tmp-{os.getpid()}-{id(write):x}{ext}")  # the suffix names the format
    try:
        _put(temp, write)
        os.replace(temp, target)
    except BaseException as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _error(path, exc) from None
        raise


def _put(path: str, write: Callable[[str], None] | bytes | str) -> None:
    if callable(write):
        write(path)
        return
    data = write.encode() if isinstance(write, str) else write
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # 0o666: the umask decides, as for open()
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _error(path: str, exc: OSError) -> Exception:
    why = exc.strerror or str(exc)
    if exc.errno in _WRITE_FAILED:
        return OutputError(f"cannot write {path}: {why} (nothing was written)")
    return UsageError(f"cannot write {path}: {why}")

"""Call sites: which line of a program made a call, named the same way on every backend."""
from __future__ import annotations

import os
import sys
from functools import lru_cache

_COMM_DIR = os.path.dirname(os.path.abspath(__file__))
_PKG_DIR = os.path.dirname(_COMM_DIR)
_PKG_ROOT = os.path.dirname(_PKG_DIR)
# Frames in these files are wrappers around the interface; a call site names the line that called them.
# So are a mutation tester's trampolines (mutmut puts one between every caller and every function), and
# any module that sets `_SITE_SKIP` (a helper that makes a call on its caller's behalf).
_WRAPPERS = (_COMM_DIR, os.path.join(_PKG_DIR, "engine", "context.py"))
_TRAMPOLINE = os.path.join("mutmut", "mutation", "trampoline.py")


@lru_cache(maxsize=512)
def short_path(filename: str) -> str:
    """A stable, readable name for a source file: relative to the checkout (or site-packages), else cwd."""
    path = os.path.abspath(filename)
    for base in (_PKG_ROOT, os.getcwd()):
        if path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return path


def _wrapper(filename: str, globs: dict) -> bool:
    return filename.startswith(_WRAPPERS) or filename.endswith(_TRAMPOLINE) or "_SITE_SKIP" in globs


def raised_site(exc: BaseException) -> str | None:
    """'file:line' of the call that led to `exc`: the innermost frame of its traceback outside the interface
    (the program's line that made the bad call), or None when every frame is a wrapper."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_globals))
        tb = tb.tb_next
    for filename, line, globs in reversed(frames):
        if not _wrapper(filename, globs):
            return site_name((filename, line))
    return None


def with_call_site(exc: Exception) -> Exception:
    """A call that can never work (a CollectiveError) said with the program's line that made it, on every
    backend; `exc` itself when it names the line already."""
    site = raised_site(exc)
    if site is None or site in str(exc):
        return exc
    return type(exc)(f"{exc} (called at {site})")


def call_site(depth: int = 2) -> tuple[str, int]:
    """(file, line) of the first caller outside parasim.comm and the context (a layer's line, not ours).

    Kept raw on the hot path; `site_name` turns it into 'file:line' when an event is recorded."""
    frame = sys._getframe(depth)
    while _wrapper(frame.f_code.co_filename, frame.f_globals) and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


@lru_cache(maxsize=4096)
def site_name(site: tuple[str, int]) -> str:
    return f"{short_path(site[0])}:{site[1]}"

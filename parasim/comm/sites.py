"""Call sites: which line of a program made a call, named the same way on every backend.

A call site is the first frame outside the wrappers: the frames of parasim.comm and of the rank context
(the interface and its backends), and any function that declares itself one, a helper that makes a call
on its caller's behalf, with a local flag as pytest's `__tracebackhide__` is declared:

    def settle(tp, placed, grad, label):
        __site_hide__ = True  # noqa: F841 (comm/sites.py: a call site names the layer line that called settle)

`is_wrapper` decides, frame by frame. Nothing here is kept between calls; a run keeps the names it made
(`SiteNames`)."""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

_COMM_DIR = os.path.dirname(os.path.abspath(__file__))
_PKG_DIR = os.path.dirname(_COMM_DIR)
_PKG_ROOT = os.path.dirname(_PKG_DIR)
# Frames in these files are wrappers around the interface; a call site names the line that called them.
_WRAPPERS = (_COMM_DIR, os.path.join(_PKG_DIR, "engine", "context.py"))
HIDE = "__site_hide__"  # the local a function sets true to be passed over as a wrapper


def is_wrapper(frame: FrameType) -> bool:
    """True for a frame that makes a call on its caller's behalf: in parasim.comm or the rank context, or a
    function whose `__site_hide__` local is true (its locals are read only for the functions that declare one:
    the name test on the code object is what every other frame costs)."""
    code = frame.f_code
    if code.co_filename.startswith(_WRAPPERS):
        return True
    return HIDE in code.co_varnames and bool(frame.f_locals.get(HIDE))


def short_path(filename: str) -> str:
    """A stable, readable name for a source file: relative to the checkout (or site-packages), else cwd."""
    path = os.path.abspath(filename)
    for base in (_PKG_ROOT, os.getcwd()):
        if path.startswith(base + os.sep):
            return path[len(base) + 1 :]  # what os.path.relpath says for a path below base, without its walk
    return path


def site_name(site: tuple[str, int]) -> str:
    """'file:line' of a (file, line) site, worked out afresh (a run names its sites once: `SiteNames`)."""
    return f"{short_path(site[0])}:{site[1]}"


class SiteNames(dict):
    """`site_name` for one run, each site named once: a run names the same few lines over and over (every
    member of every event, every rank's every group), and a name costs microseconds to work out. A backend
    makes one per run (the virtual world's `site_names`); the names go with the run. Called, or indexed (a
    dict's lookup: what the per-member hot path uses)."""

    def __missing__(self, site: tuple[str, int]) -> str:
        name = self[site] = site_name(site)
        return name

    def __call__(self, site: tuple[str, int]) -> str:
        return self[site]


def raised_site(exc: BaseException) -> str | None:
    """'file:line' of the call that led to `exc`: the innermost frame of its traceback outside the interface
    (the program's line that made the bad call), or None when every frame is a wrapper."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    for frame, line in reversed(frames):
        if not is_wrapper(frame):
            return site_name((frame.f_code.co_filename, line))
    return None


def with_call_site(exc: Exception) -> Exception:
    """A call that can never work (a CollectiveError) said with the program's line that made it, on every
    backend; `exc` itself when it names the line already."""
    site = raised_site(exc)
    if site is None or site in str(exc):
        return exc
    return type(exc)(f"{exc} (called at {site})")


PLAIN_CODES = 4096  # code objects a run's memo of call sites holds at most (`call_site`)


class SiteMemo:
    """A run's memo for `call_site`, of the code objects whose frames need no look at their locals (no
    `__site_hide__`): the wrappers, passed over, and the others' call sites by instruction. At most PLAIN_CODES
    code objects (programs compiled afresh in one run).

    Keyed by each code object's id, not the object: a code object's hash is worked out afresh on every lookup
    from its name, bytecode and constants (0.1-0.3 us for a layer's function, on every rank's every call). The
    memo holds each code object it keys (`held`), so no id it knows is reused while it lives."""

    __slots__ = ("sites", "passed", "held")

    def __init__(self) -> None:
        self.sites: dict[int, dict[int, tuple[str, int]]] = {}  # id(code) -> instruction -> (file, line)
        self.passed: set[int] = set()  # id(code) of the wrappers met
        self.held: dict[int, CodeType] = {}  # id(code) -> code, for every id above

    def room(self, code: CodeType) -> bool:
        return HIDE not in code.co_varnames and len(self.held) < PLAIN_CODES

    def hold(self, code: CodeType) -> int:
        """`code`'s key, the code kept alive beside it."""
        self.held[id(code)] = code
        return id(code)


def call_site(depth: int, memo: SiteMemo | None = None) -> tuple[str, int]:
    """(file, line) of the first caller outside the wrappers (a layer's line, not ours).

    Kept raw on the hot path; `site_name` turns it into 'file:line' when an event is recorded. With a run's `memo`,
    frames met before are read from it: a call is named without asking `is_wrapper` of each frame and without
    working out its line from the line table (a tenth of a microsecond, on every rank's every call)."""
    frame = sys._getframe(depth)
    if memo is not None:  # the usual call: frames met before (every tiny call's cost)
        sites, passed = memo.sites, memo.passed
        while True:
            key = id(frame.f_code)
            lines = sites.get(key)
            if lines is not None:
                site = lines.get(frame.f_lasti)
                if site is None:
                    site = lines[frame.f_lasti] = (frame.f_code.co_filename, frame.f_lineno)
                return site
            if key not in passed or frame.f_back is None:
                break  # not met yet, or an outermost wrapper: the walk below says
            frame = frame.f_back
    while True:
        code = frame.f_code
        keep = memo if memo is not None and memo.room(code) else None
        if not is_wrapper(frame):
            site = (code.co_filename, frame.f_lineno)
            if keep is not None:
                keep.sites.setdefault(keep.hold(code), {})[frame.f_lasti] = site
            return site
        if keep is not None:
            keep.passed.add(keep.hold(code))
        if frame.f_back is None:
            return code.co_filename, frame.f_lineno
        frame = frame.f_back

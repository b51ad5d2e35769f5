"""A time limit for code that runs in this process: virtual ranks, and a user's file as it is loaded.

Virtual ranks share one thread and hand over to each other only at collectives, so a rank that loops or
sleeps outside any collective would hold the whole run forever. A watchdog thread watches a progress
count (handovers between ranks); when it has not moved for `seconds`, it interrupts the main thread with
a signal, whose handler raises `Stopped` in whatever Python code runs there (the stuck rank's, or a
module's top level), so the caller can name the rank and the line it was on. `Stopped` derives from
BaseException: a program's `except Exception:` does not swallow it.

Signals reach only the main thread. Elsewhere (a run started from a worker thread) the exception is set
asynchronously on the running thread instead, which stops a Python loop but not a sleep in C.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sysconfig
import threading
import time
from types import FrameType
from typing import Any, Callable

SIGNAL = signal.SIGALRM  # chained to whatever handler was there (pytest-timeout uses SIGALRM too)
_REPEAT = 1.0  # seconds between interruptions once expired, in case one is swallowed
GRACE = 5.0  # seconds the stopped code has to notice: Python code does at once; a loop inside C never does
_REARM = 1.0  # seconds between re-arming the last resort while the code keeps moving


class Stopped(BaseException):
    """Raised in the code that ran past its time limit. `frame`: where it was stopped."""

    def __init__(self, frame: FrameType | None = None):  # no frame when raised asynchronously
        super().__init__("stopped by parasim's time limit")
        self.frame = frame

    def at(self) -> FrameType | None:
        """The frame it was raised in: the handler's view, or else the innermost of its traceback."""
        return self.frame if self.frame is not None else innermost(self)


def innermost(exc: BaseException) -> FrameType | None:
    """The frame an exception was raised in (the last of its traceback)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


class TimeLimit:
    """`with TimeLimit(seconds, progress):` stops the code inside once `progress()` has returned the same
    value for `seconds` (a constant `progress`: a plain deadline). `expired` says whether it fired.

    Code that never returns to the interpreter (a loop inside C) holds the GIL, so neither the signal
    handler nor the watchdog thread can run while it does. The last resort is faulthandler's own timer, a
    thread in C: GRACE seconds after the limit it writes where every thread is to stderr and ends the
    process (exit code 1). It is re-armed while the code moves, and cancelled on the way out."""

    def __init__(self, seconds: float | None, progress: Callable[[], Any] = lambda: None):
        self.seconds, self.progress = seconds, progress
        self.expired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target = threading.get_ident()
        self._prev: Any = None
        self._main = False
        self._limit = 0.0  # `seconds` once armed (a number: without one nothing is armed)

    def __enter__(self) -> "TimeLimit":
        if self.seconds is None:
            return self
        self._limit = self.seconds
        self._main = threading.current_thread() is threading.main_thread()
        if self._main:
            self._prev = signal.signal(SIGNAL, self._handler)
        self._arm()
        self._thread = threading.Thread(target=self._watch, name="parasim-watchdog", daemon=True)
        self._thread.start()
        return self

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self._limit + GRACE, exit=True, file=2)

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        faulthandler.cancel_dump_traceback_later()
        if self._main:
            signal.signal(SIGNAL, self._prev if self._prev is not None else signal.SIG_DFL)

    def _watch(self) -> None:
        poll = min(0.25, self._limit / 4)
        last, since = self.progress(), time.monotonic()
        armed = since
        while not self._stop.wait(poll):
            now = self.progress()
            if now != last:
                last, since = now, time.monotonic()
                if since - armed >= _REARM:
                    self._arm()
                    armed = since
            elif time.monotonic() - since >= self._limit:
                self.expired = True
                while not self._stop.is_set():
                    self._interrupt()
                    self._stop.wait(_REPEAT)
                return

    def _interrupt(self) -> None:
        if self._main:
            main = threading.main_thread().ident
            assert main is not None  # the main thread has started: it is running this program
            signal.pthread_kill(main, SIGNAL)
        else:  # no signal reaches another thread: raise at its next bytecode
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), ctypes.py_object(Stopped))

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.expired and not self._stop.is_set():
            raise Stopped(frame)
        prev = self._prev
        if callable(prev):  # not ours: whoever set SIGALRM before us (pytest-timeout) gets it
            prev(signum, frame)


_SKIP = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], os.path.dirname(os.__file__)})
_OURS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), d) + os.sep
    for d in ("comm", "engine", "symbolic")
)  # the backends run a program; nn, lessons are its code
_LIBS = ("site-packages" + os.sep, "dist-packages" + os.sep)


def where(frame: FrameType | None) -> FrameType | None:
    """The frame a person would call 'the line it was on': the innermost one in the program's own code (a
    user's file, a lesson, a layer), not in the engine, the standard library or another installed package;
    the innermost frame when there is none."""
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith("<"):  # <frozen importlib._bootstrap>, <string>: no file to show
            name = os.path.realpath(name)
            lib = any(s in name for s in _LIBS) and f"{os.sep}parasim{os.sep}" not in name
            if not name.startswith(_SKIP + _OURS) and not lib:
                return f
        f = f.f_back
    return frame


def frame_text(frame: FrameType | None) -> str:
    """'file.py:12 (in fn)' for the frame `where` picks, or 'an unknown line'."""
    from .sites import site_name

    f = where(frame)
    if f is None:
        return "an unknown line"
    return f"{site_name((f.f_code.co_filename, f.f_lineno))} (in {f.f_code.co_name})"


def raised_text(rank: int, exc: BaseException) -> str:
    """'rank 1 raised KeyError: 'b' at mine.py:12 (in program)' and the traceback below it: a rank's own error,
    said the same on every backend. sys.exit() is the program's own choice to end: its line says it all,
    so no traceback follows."""
    head = f"rank {rank} raised {type(exc).__name__}: {exc} at {frame_text(innermost(exc))}"
    if isinstance(exc, SystemExit):
        return head + "\n"
    import traceback

    return f"{head}\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

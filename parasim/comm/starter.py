"""The processes a local launch needs besides its ranks, and their ends: the fork server the ranks are forked
from (it imports torch once for every launch of this process), multiprocessing's resource tracker beside it,
a rank's watch on its launch, and the folders of launches that were killed. Whatever way a command ends
(done, Ctrl-C, SIGTERM), nothing of these outlives it: the launcher kills the ranks it knows of, a rank whose
start an interrupt cut short leaves by itself (`leave_with`), and the command stops the rest (`stop_starter`)."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from typing import Any, Iterator


LEFT_ALONE = 0.2  # seconds between a worker's looks at whether its launch still wants it


def leave_with(launcher: int, folder: str) -> None:
    """End this worker, silently, as soon as its launch is over without it: the launcher's process is gone
    (killed, even by SIGKILL) or its folder is (the launch ended, by Ctrl-C or SIGTERM among others). The
    launcher kills the workers it knows of on every way out, but one whose start was cut short by an
    interrupt (forked by the fork server, its pid never handed back) is known only to itself, and would
    otherwise wait for the run's store until its time-out, then print torch's C++ frames."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(LEFT_ALONE)
            try:
                os.kill(launcher, 0)
                gone = not os.path.isdir(folder)
            except ProcessLookupError:
                gone = True
            except OSError:  # PermissionError: a pid taken by another user's process
                gone = True
            if gone:
                os._exit(1)

    threading.Thread(target=watch, name="parasim-launch-watch", daemon=True).start()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is over, then go where they went before. A worker's start is
    a talk with the fork server (connect, hand over the pipes, write the pickled program); a signal that ends
    the launcher in the middle of it leaves the server reading a socket that closed early, and it dies
    printing an EOFError traceback on the command's stderr (the worker forked for it prints one too). Held
    over each start, the signal ends the launch between two starts, where the launcher's cleanup kills the
    workers already started. Only the main thread takes signals; elsewhere the block runs as it is."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    before = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if held:  # the first one, to what takes it now (a second would be ignored by the command's handler)
            signal.raise_signal(held[0])


def starter() -> Any:
    """How worker processes start: forked from a server that imported torch once (torch's import is most
    of a rank's start-up), so that the ranks of a launch, and every later launch of this process, skip it.
    The server is started fresh (no threads, no CUDA), so forking it is safe; where the platform has no
    fork, spawn."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "torch.distributed", "parasim.comm.torchdist", "parasim.engine"])
    _start_forkserver()
    return ctx


def _start_forkserver() -> None:
    """Start the fork server so that it imports the parasim this process runs. It starts as `python -c ...`,
    which puts the current folder first on its path, and Python before 3.13 ignores the path it is handed:
    run from a checkout with parasim installed elsewhere, the ranks would import the checkout's copy (other
    code, other file names for the same lines). PYTHONSAFEPATH (3.11+) keeps the current folder off, and
    the folder this process imported parasim from goes first on PYTHONPATH (3.10 too)."""
    import multiprocessing.forkserver
    import signal
    import threading

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONPATH")}
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    # The fork server imports torch before it ignores Ctrl-C itself: a terminal's Ctrl-C to the process group
    # would print its KeyboardInterrupt traceback meanwhile. It starts with SIGINT ignored, which its exec
    # keeps (Python leaves an ignored SIGINT ignored), so it never takes one (the launcher ends it); here
    # Ctrl-C is ignored only for the fork and exec that start it.
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        if main:
            signal.signal(signal.SIGINT, before)


def stop_starter() -> None:
    """End the fork server `starter` started, at once, as a command does on its way out: left to itself it
    outlives the command by the seconds it takes to tear torch down (it ends when the last process holding
    its pipe does). Its workers have ended by then (launch._end, `leave_with`). Python 3.11's multiprocessing has
    no public way to stop either helper process: their pids are read from the modules' own instances."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import signal

    server: Any = getattr(multiprocessing.forkserver, "_forkserver", None)  # its private state: no types
    pid = getattr(server, "_forkserver_pid", None)
    if isinstance(pid, int):
        # its workers first: one whose start an interrupt cut short ends within LEFT_ALONE, and is reaped by
        # the fork server (killed before that, its workers would be left as zombies for init to reap)
        deadline = time.monotonic() + 1.0
        while _children(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError, TypeError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_pid = server._forkserver_alive_fd = None  # a later launch here starts a new one
    # multiprocessing's resource tracker, which the fork server started beside it: it ends once every process
    # holding its pipe has (this one closes its end here), and is waited for, so that no zombie is left
    tracker: Any = getattr(multiprocessing.resource_tracker, "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    if isinstance(pid, int):
        with contextlib.suppress(OSError, TypeError):
            os.close(tracker._fd)
        deadline = time.monotonic() + 2.0  # a worker whose start was cut short leaves within LEFT_ALONE
        with contextlib.suppress(OSError):
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.02)
        tracker._pid = tracker._fd = None


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc; none where there is no /proc)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (name)": the name may hold spaces
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.split("/")[2]))
    return found


def sweep_folders() -> None:
    """Remove the folders of earlier launches whose process is gone (killed before it could clean up):
    each is named parasim-PID-..., so only a dead owner's folder is touched."""
    import shutil

    for path in glob.glob(os.path.join(tempfile.gettempdir(), "parasim-*-*")):
        pid = os.path.basename(path).split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)

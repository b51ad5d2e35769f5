"""comm/watchdog.py's TimeLimit as a run sees it from inside: on the main thread its own alarm handler is in
place and its thread is running; an alarm that is not its own goes to the handler it found; a run without a
limit arms nothing."""
import signal
import threading

import parasim
from parasim.comm.watchdog import SIGNAL


def test_a_limited_run_on_the_main_thread_has_the_watchdogs_handler_and_thread():
    def prog(ctx):
        return getattr(signal.getsignal(SIGNAL), "__qualname__", None), [t.name for t in threading.enumerate()]

    handler, threads = parasim.run(prog, 1, timeout=30).values[0]
    assert handler == "TimeLimit._handler" and "parasim-watchdog" in threads
    handler, threads = parasim.run(prog, 1, timeout=None).values[0]
    assert handler != "TimeLimit._handler" and "parasim-watchdog" not in threads


def test_an_alarm_that_is_not_the_watchdogs_goes_to_the_handler_it_found():
    got = []
    old = signal.signal(SIGNAL, lambda signum, frame: got.append(signum))
    try:
        def prog(ctx):
            signal.raise_signal(SIGNAL)  # someone else's alarm, while the run's limit is armed
            return ctx.rank

        assert parasim.run(prog, 1, timeout=30).values == [0]
        assert got == [SIGNAL]
    finally:
        signal.signal(SIGNAL, old)


def test_a_limited_run_works_while_stderr_is_captured():
    """A notebook or a test that captures stderr in memory (no file descriptor): the last resort still writes
    to the process's own stderr, so the run is limited and runs."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        assert parasim.run(lambda ctx: ctx.rank, 2, timeout=30).values == [0, 1]

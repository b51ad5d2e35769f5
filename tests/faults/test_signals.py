"""SIGINT and SIGTERM at any moment of a command: one line on stderr, the exit code README gives (130
interrupted, 143 terminated), and nothing left running (no rank, no fork server, no resource tracker), whether
the signal comes from a terminal's Ctrl-C (the whole process group) or from a supervisor (the command's own
pid only), during the imports, the real ranks' start or the run."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from conftest import session_pids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def _alive_in_session(sid: int) -> list[str]:
    """The processes of session `sid` still running, each as its pid and command line."""
    out = []
    for pid in session_pids(sid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid} {command[:120]}")
        except OSError:  # gone meanwhile
            continue
    return out


def _left_running(sid: int) -> list[str]:
    """What of session `sid` is still running once its leader has exited, polled for up to 10 s (far less than
    the 30 s a rank waits for a store that has gone: a rank left behind would still be there)."""
    left = _alive_in_session(sid)
    for _ in range(100):
        if not left:
            break
        time.sleep(0.1)
        left = _alive_in_session(sid)
    return left


NUMPY = "as numpy loads"  # a moment among the imports: numpy's extension mapped in the process (parasim's
# handler is set before its imports begin), whatever the machine's load makes of the interpreter's start


def _until_numpy_loads(proc: subprocess.Popen, limit: float = 30) -> None:
    """Wait until numpy's compiled core is mapped into `proc` (or it has exited, or `limit` seconds passed)."""
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                if "_multiarray_umath" in f.read():
                    return
        except OSError:
            return
        time.sleep(0.005)


def _signalled(args: list[str], after: float | str, sig: signal.Signals, group: bool,
               limit: float = 120) -> tuple[int, str, str, list[str]]:
    """`python -m parasim ARGS` in a session of its own, sent `sig` after `after` seconds (to its process
    group as a terminal's Ctrl-C is, or to its pid alone); its exit code, stdout, stderr and what of its
    session was still running once it had exited (polled for up to 10 s, far less than the 30 s a rank
    waits for a store that has gone: a rank left behind would still be there)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # not pipes: a process left behind holding
    # one would block reading it
    proc = subprocess.Popen([sys.executable, "-m", "parasim", *args], stdout=out, stderr=err,
                            start_new_session=True, cwd=ROOT)
    try:
        if after == NUMPY:
            _until_numpy_loads(proc)
        else:
            time.sleep(after)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=limit)
        left = _left_running(proc.pid)
    finally:
        if proc.poll() is None or _alive_in_session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out.seek(0)
    err.seek(0)
    return code, out.read().decode(errors="replace"), err.read().decode(errors="replace"), left


def _finished_before(code: int, stdout: str, stderr: str, sig: signal.Signals) -> bool:
    """The command had done its work when the signal came: its output is whole (its last line, the checks'
    count, was written), and it ended with 0, or, had the signal come as Python was exiting, killed by it
    (a shell reports that as 128 + the signal too)."""
    done = stdout.rstrip().endswith(" ok") or stdout.rstrip().endswith("checks ok.")
    return done and stderr == "" and code in (0, -sig)


LESSON = ["lesson", "moe16", "--plain"]
RUN = ["run", "collectives", "--nproc", "4", "--timeout", "30"]

# (what, command, seconds before the signal, the signal, to the whole group?)
CASES = [
    ("lesson: Ctrl-C among the imports", LESSON, NUMPY, signal.SIGINT, True),
    ("lesson: Ctrl-C while it runs", LESSON, 1.5, signal.SIGINT, True),
    ("lesson: SIGTERM to its pid", LESSON, 0.5, signal.SIGTERM, False),
    ("run: Ctrl-C while torch is imported", RUN, 0.6, signal.SIGINT, True),
    ("run: Ctrl-C as the ranks start", RUN, 1.5, signal.SIGINT, True),
    ("run: SIGINT to its pid as the ranks start", RUN, 1.5, signal.SIGINT, False),
    ("run: SIGINT to its pid while they run", RUN, 3.0, signal.SIGINT, False),
    ("run: SIGTERM to its pid as the ranks start", RUN, 1.5, signal.SIGTERM, False),
    ("run: SIGTERM to its pid while they run", RUN, 3.0, signal.SIGTERM, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("what,args,after,sig,group", CASES, ids=[c[0] for c in CASES])
def test_a_signal_at_any_moment_ends_in_one_line_with_nothing_left(what, args, after, sig, group):
    if args[0] == "run":
        pytest.importorskip("torch")
    code, stdout, stderr, left = _signalled(args, after, sig, group)
    assert left == [], f"{what}: left running after parasim exited: {left}"
    if _finished_before(code, stdout, stderr, sig):  # a fast machine: the command was done before the signal
        return
    want = ("parasim: terminated", 143) if sig == signal.SIGTERM else ("parasim: interrupted", 130)
    assert (stderr.strip(), code) == want, f"{what}: exit {code}, stderr:\n{stderr[-3000:]}"


# An interrupt in the middle of an import, exactly: the hook sends SIGINT to this process as numpy's import
# begins (numpy turns a KeyboardInterrupt inside its own import into an ImportError, which is the traceback
# a learner saw)
INTERRUPTED_IMPORT = textwrap.dedent("""
    import builtins, os, signal, sys
    real = builtins.__import__
    def hook(name, *args, **kwargs):
        if name.split(".")[0] == sys.argv[1] and not getattr(hook, "sent", False):
            hook.sent = True
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        return real(name, *args, **kwargs)
    builtins.__import__ = hook
    from parasim.cli import main
    sys.exit(main(["lesson", "tp-mlp", "--plain"]))
""")


@pytest.mark.parametrize("module,sig,want", [
    ("numpy", "SIGINT", ("parasim: interrupted", 130)),
    ("numpy", "SIGTERM", ("parasim: terminated", 143)),
    ("commands", "SIGINT", ("parasim: interrupted", 130)),  # `from .commands import ...` in parasim.cli
])
def test_a_signal_inside_the_start_up_imports_is_one_line(module, sig, want):
    got = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, module, sig], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert "Traceback" not in got.stderr
    assert (got.stderr, got.returncode) == (want[0] + "\n", want[1])


def test_importing_parasim_imports_neither_numpy_nor_the_commands():
    """What the start-up's one line rests on: `from parasim.cli import main` (the console script's first
    line) runs before any signal is taken over, so it must not import what takes time."""
    got = subprocess.run([sys.executable, "-c", "import sys; import parasim, parasim.cli; "
                          "print(sorted(m for m in ('numpy', 'rich', 'parasim.cli.commands', 'parasim.engine') "
                          "if m in sys.modules))"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert got.stdout.strip() == "[]", got.stderr
    got = subprocess.run([sys.executable, "-c", "import parasim; print(parasim.run.__module__, "
                          "parasim.UsageError.__name__, parasim.layout.__name__)"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert got.stdout.split() == ["parasim.engine.runner", "UsageError", "parasim.layout"], got.stderr


# A worker whose start an interrupt cut short: forked by the fork server, its pid never reached the launcher,
# which therefore cannot kill it. It must leave by itself once its launch's folder is gone (the launch ended)
# or its launcher is (even killed with SIGKILL).
ORPHAN = textwrap.dedent("""
    import sys, time
    from parasim.comm.starter import leave_with
    leave_with(int(sys.argv[1]), sys.argv[2])
    print("watching", flush=True)
    time.sleep(60)
    print("still here", flush=True)
""")


@pytest.mark.parametrize("gone", ["folder", "launcher"])
def test_a_worker_leaves_when_its_launch_is_over(tmp_path, gone):
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = tmp_path / "launch"
    folder.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", ORPHAN, str(launcher.pid), str(folder)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert worker.stdout.readline().strip() == "watching"
        time.sleep(0.5)
        assert worker.poll() is None  # its launch is still on: it stays
        if gone == "folder":
            folder.rmdir()
        else:
            launcher.kill()
            launcher.wait()
        assert worker.wait(timeout=30) == 1
        assert worker.stdout.read() == ""
    finally:
        for p in (worker, launcher):
            if p.poll() is None:
                p.kill()
                p.wait()


# A signal once the command has answered, while it stops what real ranks left (the fork server): the answer
# stands, the cleanup runs to its end, and Python's exit is not interrupted either
SIGNAL_IN_CLEANUP = textwrap.dedent("""
    import os, signal, sys, time
    import parasim.comm.starter as starter
    SIG = getattr(signal, sys.argv[1])
    def stop_starter():
        os.kill(os.getpid(), SIG)
        time.sleep(0.2)  # the signal is handled here, in the cleanup
        print("cleaned up", flush=True)
    starter.stop_starter = stop_starter
    sys.argv = ["parasim", "lesson", "tp-mlp", "--plain"]
    from parasim.cli import main
    sys.exit(main())
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_after_the_command_has_answered_changes_nothing(sig):
    got = subprocess.run([sys.executable, "-c", SIGNAL_IN_CLEANUP, sig], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert (got.returncode, got.stderr) == (0, "")
    assert got.stdout.rstrip().endswith("cleaned up") and "checks ok." in got.stdout


FORK_SERVER_IGNORES = textwrap.dedent("""
    import multiprocessing.forkserver, signal
    from parasim.comm import starter
    starter.starter()  # the fork server starts, and imports torch for a second or more
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    with open(f"/proc/{pid}/status") as f:
        ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    print(bool(ignored & (1 << (signal.SIGINT - 1))))
    starter.stop_starter()
""")


def test_the_fork_server_ignores_ctrl_c_from_its_first_instruction():
    """A terminal's Ctrl-C reaches the fork server too (one process group): while it imports torch, before it
    ignores SIGINT itself, it would print a KeyboardInterrupt traceback. It starts with SIGINT ignored."""
    pytest.importorskip("torch")
    got = subprocess.run([sys.executable, "-c", FORK_SERVER_IGNORES], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert got.stdout.strip() == "True", got.stderr[-2000:]


SIGNAL_AT_EXIT = textwrap.dedent("""
    import atexit, os, signal, sys, time
    SIG = getattr(signal, sys.argv[1])
    def at_exit():  # as torch's own atexit callbacks run, once the command is done
        os.kill(os.getpid(), SIG)
        time.sleep(0.2)
        print("exited", flush=True)
    atexit.register(at_exit)
    sys.argv = ["parasim", "lesson", "tp-mlp", "--plain"]
    from parasim.cli import main
    sys.exit(main())
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_as_python_exits_after_the_command_changes_nothing(sig):
    got = subprocess.run([sys.executable, "-c", SIGNAL_AT_EXIT, sig], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert (got.returncode, got.stderr) == (0, "")
    assert got.stdout.rstrip().endswith("exited")


def test_an_interrupt_raised_again_on_the_way_out_still_exits_130():
    """The command had said its line and a KeyboardInterrupt reached main() anyway (C code that held the first
    one and raised it again, once seen under load as an exit by SIGINT, -2): main() ends with 130, the code for
    an interrupt, and leaves at once without Python's shutdown."""
    script = textwrap.dedent("""
        import parasim.cli.commands as commands
        def again(*args, **kwargs):
            import sys
            print("parasim: interrupted", file=sys.stderr)
            raise KeyboardInterrupt
        commands.run_command = again
        from parasim.cli import main
        main()
        print("not reached")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (done.returncode, done.stderr.strip(), done.stdout) == (130, "parasim: interrupted", "")


# A signal in the middle of a worker's start, exactly: the hook sends it to this process as the launcher is
# about to hand the fork server the pipes of rank 1. Taken there, the fork server would read a socket that closed early
# and die printing an EOFError traceback (CI saw it once, under load, as "run: SIGTERM ... while they run").
SIGNAL_IN_A_START = textwrap.dedent("""
    import multiprocessing.reduction, os, signal, sys
    real = multiprocessing.reduction.sendfds
    def hook(sock, fds):
        hook.calls = getattr(hook, "calls", 0) + 1
        if hook.calls == 2:  # rank 1's start: rank 0's was answered, so the fork server is past its imports
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        return real(sock, fds)
    multiprocessing.reduction.sendfds = hook
    import time
    import parasim.comm.starter as starter
    stop = starter.stop_starter
    def stop_later():  # the fork server is given time to print what it would (stopped at once, it could not)
        time.sleep(1.0)
        stop()
    starter.stop_starter = stop_later
    from parasim.cli import main
    sys.exit(main(["run", "collectives", "--nproc", "2", "--timeout", "30"]))
""")


@pytest.mark.parametrize("sig,want", [("SIGTERM", ("parasim: terminated", 143)),
                                      ("SIGINT", ("parasim: interrupted", 130))])
def test_a_signal_while_a_worker_starts_waits_for_the_start_then_ends_in_one_line(sig, want):
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_IN_A_START, sig], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
        left = _left_running(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert left == []
    assert (err.strip(), proc.returncode) == want, err[-3000:]


def test_signals_held_hands_the_first_signal_on_once_the_block_is_over():
    from parasim.comm.starter import signals_held
    seen = []
    sigint = signal.getsignal(signal.SIGINT)  # pytest's, or SIG_IGN in an xdist worker
    def handler(signum, frame):
        seen.append(("handled", signum))

    before = signal.signal(signal.SIGTERM, handler)
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append("inside")
            os.kill(os.getpid(), signal.SIGTERM)
        seen.append("after")
        back = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == ["inside", ("handled", signal.SIGTERM), "after"]
    assert back == (sigint, handler)  # each signal goes where it went before the block

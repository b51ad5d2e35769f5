"""Faults on real ranks (gloo, 127.0.0.1): nothing listens beyond loopback, and a rank that dies without
raising is named with its exit code or signal; no process or folder is left behind."""
import os
import signal
import tempfile

import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from helpers_real import LOOPBACK, listening  # noqa: E402
from parasim import RealRunFailed  # noqa: E402

pytestmark = pytest.mark.slow


def sockets_of_the_run(ctx):
    """Rank 0, once every rank has joined: the listening sockets of the launcher and all its workers."""
    ctx.comm.barrier()
    out = None
    if ctx.rank == 0:
        parent = os.getppid()
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            pids = [parent, *map(int, f.read().split())]
        out = (len(pids), listening(pids))
    ctx.comm.barrier()  # nobody leaves before rank 0 has looked
    return out


def test_nothing_listens_beyond_loopback(tmp_path, monkeypatch):
    # the launch's temporary files go to a folder of this test's own: another test's torchrun on another worker
    # (its torchelastic folder) cannot be taken for something this launch left, and need not be waited for
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (npids, sockets), *_ = parasim.run(sockets_of_the_run, 3, backend="gloo", timeout=20).values
    assert npids >= 4  # the launcher and its 3 workers were looked at
    assert len(sockets) >= 2, sockets  # the store, and gloo's own listeners
    assert [s for s in sockets if s[0] not in LOOPBACK] == []
    # this launch left no folder of its own in the temp directory, nor a torchelastic one (multiprocessing's fork
    # server, started here if not before, keeps its pymp- folder while it lives, and removes it at exit)
    assert [p for p in os.listdir(tmp_path) if not p.startswith("pymp-")] == []


def exits_on_rank_1(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        os._exit(3)
    ctx.comm.all_reduce(ctx.asarray([1.0]))


def killed_on_rank_2(ctx):
    ctx.comm.barrier()
    if ctx.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.comm.all_reduce(ctx.asarray([1.0]))


@pytest.mark.parametrize("program, rank, how", [(exits_on_rank_1, 1, "exited with code 3"),
                                                (killed_on_rank_2, 2, "was killed by signal SIGKILL")])
def test_a_rank_that_dies_without_raising_is_named(program, rank, how):
    with pytest.raises(RealRunFailed) as info:
        parasim.run(program, 4, backend="gloo", timeout=20)
    assert str(info.value) == f"rank {rank} {how} without raising an error; the other ranks were stopped"
    assert info.value.rank == rank


def returns_a_generator(ctx):
    return (x for x in range(3)) if ctx.rank == 1 else 0


def test_a_result_that_cannot_travel_is_named():
    with pytest.raises(RealRunFailed, match=r"^rank 1: its results cannot be sent back to the launcher \(TypeError"):
        parasim.run(returns_a_generator, 2, backend="gloo", timeout=20)


def test_a_program_that_cannot_travel_is_a_usage_error():
    with pytest.raises(parasim.UsageError, match="real ranks need a function defined at a module's top level"):
        parasim.run(lambda ctx: None, 2, backend="gloo", timeout=20)


PROGRAM = '''
from parasim import Recv, Send


def prog(ctx):
    pair = ctx.new_group([0, 1], "pair")
    x = ctx.asarray([1.0, 2.0]) * (ctx.rank + 1)
    y = ctx.comm.all_reduce(x, group=pair)
    other = 1 - ctx.rank
    (z,) = ctx.comm.exchange([Send(y, other), Recv(other, (2,), "float64")])
    return z
'''


def test_a_program_deep_in_folders_runs(tmp_path):
    """Every call's signature names its file; one far longer than a signature blob (512 bytes) still
    travels, for collectives, group creation and point-to-point transfers alike."""
    from parasim.engine.launch import RealOptions
    from parasim.engine.real import run_real
    folder = tmp_path.joinpath(*["d" * 200] * 3)
    folder.mkdir(parents=True)
    path = folder / "deep.py"
    path.write_text(PROGRAM)
    assert len(str(path)) > 600
    report = run_real((str(path), "prog"), 2, RealOptions("gloo", timeout=20))
    assert report.match, report.differences
    assert [e.op for e in report.trace.events] == ["all_reduce", "p2p", "p2p"]


SLEEPER = '''
import signal, sys, time
import parasim

# Ctrl-C as in a terminal: a test run started in the background by a script inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)


def sleeper(ctx):
    ctx.comm.barrier()
    if ctx.rank == 0:
        print("started", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    try:
        parasim.run(sleeper, 2, backend="gloo", timeout=120)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
'''


def test_ctrl_c_ends_every_rank_quietly(tmp_path):
    """Ctrl-C reaches the launcher and its workers (one process group, as in a terminal): the workers
    leave it to the launcher, which ends them; one line on stderr, nothing left running."""
    import subprocess
    import sys
    import time
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # say what was left running before ending it
        tree = subprocess.run(["ps", "-s", str(proc.pid), "-o", "pid,stat,wchan:20,cmd"], capture_output=True,
                              text=True).stdout
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the launcher did not end within 30 s of Ctrl-C; processes:\n{tree}\nstderr:\n{err[-3000:]}")
    assert (proc.returncode, err.strip()) == (130, "interrupted")
    for _ in range(50):  # the workers are gone at once; multiprocessing's resource tracker follows its parent
        left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == []


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_a_bad_timeout_is_refused_before_anything_starts(value, capsys):
    from parasim.cli import main
    assert main(["run", "collectives", "--backend", "gloo", "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("parasim run: argument --timeout: ")
    # a decimal written out (not nan, inf or -1), then in range
    assert ("timeout must be a number of seconds above 0" in err) if value in ("0", "1e9") else \
        ("expected a number of seconds" in err)
    with pytest.raises(parasim.UsageError, match="timeout must be"):
        parasim.run(sleeper_never_started, 2, backend="gloo", timeout=float(value))


def sleeper_never_started(ctx):
    raise AssertionError("no rank may start with a bad timeout")


def spins_after_a_call(ctx):
    ctx.comm.barrier()
    while True:  # every rank busy outside any collective: no backend time-out can fire
        pass


@pytest.mark.timeout(60)
def test_ranks_that_hang_outside_collectives_are_stopped_at_the_timeout():
    with pytest.raises(parasim.Deadlock, match=r"^no rank finished a call for 6 s \(twice the run's timeout\)"):
        parasim.run(spins_after_a_call, 2, backend="gloo", timeout=3)  # the test's own limit is 60 s


def test_a_dead_launchers_folder_is_swept_by_the_next_launch():
    """A launcher killed outright cannot remove its folder; the next launch does, and only the folders of
    processes that are gone (this test's own pid and a live one are left alone)."""
    import subprocess
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tempfile.mkdtemp(prefix=f"parasim-{gone.pid}-")
    live = tempfile.mkdtemp(prefix=f"parasim-{os.getppid()}-")
    try:
        parasim.run(sockets_of_the_run, 2, backend="gloo", timeout=20)
        assert not os.path.exists(stale) and os.path.exists(live)
    finally:
        os.rmdir(live)


def skips_in_a_pair(ctx):
    pair = ctx.new_group([0, 1], "pair")
    if ctx.rank == 0:
        ctx.comm.all_reduce(ctx.asarray([1.0]), group=pair)  # rank 1 never comes


def test_a_skip_in_a_sub_group_is_a_deadlock_naming_the_waiter():
    with pytest.raises(parasim.Deadlock, match=r"rank 0 timed out in all_reduce\(.*\) on group pair\[0, 1\] at "
                                               r"tests/faults/test_real_faults.py:\d+"):
        parasim.run(skips_in_a_pair, 3, backend="gloo", timeout=3)


def reads_env(ctx):
    import os
    return ctx.asarray([float(os.environ.get("PARASIM_TEST_VALUE", "-1"))])


def test_ranks_see_the_launchers_environment_of_now(monkeypatch):
    """Ranks fork from a server started once; each launch still hands them the environment of its own time."""
    import parasim
    monkeypatch.setenv("PARASIM_TEST_VALUE", "1")
    assert [float(v[0]) for v in parasim.run(reads_env, 2, backend="gloo").values] == [1.0, 1.0]
    monkeypatch.setenv("PARASIM_TEST_VALUE", "2")
    assert [float(v[0]) for v in parasim.run(reads_env, 2, backend="gloo").values] == [2.0, 2.0]

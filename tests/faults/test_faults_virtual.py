"""A user's own program on virtual ranks: whatever it does wrong ends quickly with one line naming the rank,
the file and the line (exit 1 for a run that fails, 2 for a file that cannot be a program), never a hang
or a traceback of ours. A rank that loops or sleeps outside any collective is stopped by the run's time
limit (--timeout), and the line it was on is named."""
import signal
import textwrap
import threading
import time

import pytest

import parasim
from tests.conftest import cli, cli_process

PROGRAMS = textwrap.dedent("""\
    import sys
    import threading
    import time

    def spin(ctx):
        if ctx.rank == 1:
            while True:  # spins here
                pass
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def sleeps(ctx):
        if ctx.rank == 1:
            time.sleep(1000)  # sleeps here
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def swallows(ctx):
        while ctx.rank == 1:
            try:
                time.sleep(0.01)  # swallows here
            except Exception:
                pass
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def late(ctx):
        x = ctx.comm.all_reduce(ctx.xp.ones(2))
        ctx.phase("after the sum")
        while ctx.rank == 0: pass  # spins late
        return x

    def exits0(ctx):
        if ctx.rank == 1:
            sys.exit(0)  # exits 0
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def exits3(ctx):
        if ctx.rank == 1:
            sys.exit(3)  # exits 3
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def threads(ctx):
        out = []
        t = threading.Thread(target=lambda: out.append(ctx.comm.all_reduce(ctx.xp.ones(2))))  # in a thread
        t.start()
        t.join()
        return out

    def threads_p2p(ctx):
        if ctx.rank == 0:
            t = threading.Thread(target=lambda: ctx.comm.send(ctx.xp.ones(2), 1))  # p2p in a thread
            t.start()
            t.join()
        return None

    def gives_generator(ctx):
        return (ctx.comm.all_reduce(ctx.xp.ones(2)) for _ in range(1))

    def gives_coroutine(ctx):
        async def later():
            return 1
        return later()

    def gives_async_generator(ctx):
        async def later():
            yield 1
        return later()

    def outsider(ctx):
        g = ctx.new_group([0], "tp")
        return ctx.comm.all_reduce(ctx.xp.ones(2), group=g)  # not a member

    def in_c(ctx):
        import collections
        import itertools
        if ctx.rank == 1:
            collections.deque(itertools.count(), maxlen=0)  # a loop inside C
        return ctx.comm.all_reduce(ctx.xp.ones(2))

    def sends_a_list(ctx):
        if ctx.rank == 0:
            ctx.comm.send([1.0, 2.0], 1)  # a list
        else:
            ctx.comm.recv(0, (2,), "float64")

    def yields(ctx):
        yield 1

    async def awaits(ctx):
        return 1

    class Thing:
        pass

    number = 3
    """)


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(PROGRAMS)
    return path


def _line(path, marker: str) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.rstrip().endswith(f"# {marker}")]
    return n


# (program, extra flags, exit code, words in stderr: {line:MARKER} is the file:line of that marker)
RUNS = [
    ("spin", ["--timeout", "1"], 1, ["rank 1 ran for 1 s without reaching a collective", "{line:spins here}",
                                     "rank 0: waits in all_reduce"]),
    ("sleeps", ["--timeout", "1"], 1, ["rank 1 ran for 1 s", "{line:sleeps here}"]),
    ("swallows", ["--timeout", "1"], 1, ["rank 1 ran for 1 s", "(in swallows)"]),  # a line of its loop
    ("late", ["--timeout", "1"], 1, ["rank 0 ran for 1 s", "{line:spins late}", "in phase 'after the sum'",
                                     "rank 1: finished"]),
    ("exits0", [], 1, ["rank 1 raised SystemExit: 0", "{line:exits 0}"]),
    ("exits3", [], 1, ["rank 1 raised SystemExit: 3"]),
    ("threads", [], 2, ["called all_reduce at {line:in a thread} from a thread it started"]),
    ("threads_p2p", [], 2, ["rank 0 called point-to-point at {line:p2p in a thread} from a thread it started"]),
    ("gives_generator", [], 2, ["rank 0's program returned a generator, so its body never ran"]),
    ("gives_coroutine", [], 2, ["rank 0's program returned a coroutine, so its body never ran"]),
    ("gives_async_generator", [], 2, ["rank 0's program returned an async generator, so its body never ran"]),
    ("outsider", [], 1, ["rank 1 is not a member of group tp[0] (called at {line:not a member})"]),
    ("sends_a_list", [], 1, ["send expects a numpy array on virtual ranks, got list (called at {line:a list})"]),
]


def _fill(words, path):
    out = []
    for w in words:
        if "{line:" in w:
            head, _, rest = w.partition("{line:")
            marker, _, tail = rest.partition("}")
            w = f"{head}{path.name}:{_line(path, marker)}{tail}"
        out.append(w)
    return out


@pytest.mark.timeout(30)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's quiet exit
@pytest.mark.parametrize("fn, flags, code, words", RUNS, ids=[r[0] for r in RUNS])
def test_a_faulty_program_ends_in_one_message(mine, monkeypatch, fn, flags, code, words):
    monkeypatch.chdir(mine.parent)  # sites are named from the working directory
    out = cli("lesson", f"{mine.name}:{fn}", "--world", "2", "--plain", *flags)  # the message says which limit
    assert out.returncode == code, out.stderr
    for w in _fill(words, mine):
        assert w in out.stderr, out.stderr
    if code == 2:
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    if fn.startswith(("exits", "spin", "sleeps", "late")):  # ended on purpose, or stopped: the line says it all
        assert "Traceback" not in out.stderr
    assert "Exception in thread" not in out.stderr


# a file that cannot be a program: (file text, function, words); always one line and exit 2
FILES = [
    ("def f(ctx)\n    return 1\n", "f", "bad.py:1: it does not compile: expected ':'"),
    ("import not_a_module_xyz\ndef f(ctx):\n    return 1\n", "f",
     "bad.py: loading it raised ModuleNotFoundError: No module named 'not_a_module_xyz' at bad.py:1"),
    (b"x = '\xff\xfe'\ndef f(ctx):\n    return 1\n", "f", "bad.py:1: it does not compile: (unicode error)"),
    ("\0", "f", "bad.py: it does not compile: source code string cannot contain null bytes"),
    ("WORLD = 'two'\ndef f(ctx):\n    return 1\n", "f", "bad.py:1: WORLD must be a whole number of ranks from 1 to "
     "16,384, got 'two'"),
    ("WORLD = True\ndef f(ctx):\n    return 1\n", "f", "bad.py:1: WORLD must be a whole number of ranks"),
    ("WORLD = 0\ndef f(ctx):\n    return 1\n", "f", "bad.py:1: WORLD must be a whole number of ranks"),
    ("WORLD = 2\nNARRATIVE = ['a']\ndef f(ctx):\n    return 1\n", "f",
     "bad.py:2: NARRATIVE must be a dict of phase name -> text (strings), got ['a']"),
    ("WORLD = 2\nNARRATIVE = {'a': 1}\ndef f(ctx):\n    return 1\n", "f", "bad.py:2: NARRATIVE must be a dict"),
    ("WORLD = 2\nTITLE = 7\ndef f(ctx):\n    return 1\n", "f", "bad.py:2: TITLE must be a string, got 7"),
    ("WORLD = 2\nKEEP_VALUES = -1\ndef f(ctx):\n    return 1\n", "f", "bad.py:2: KEEP_VALUES must be a whole number"),
    ("WORLD = 2\nchecks = 5\ndef f(ctx):\n    return 1\n", "f", "bad.py:2: checks must be a function"),
    ("WORLD = 2\ndef f(ctx):\n    return 1\ndef checks(result):\n    return None\n", "f",
     "bad.py:4: checks(result) must return a list of parasim.lesson.check(...) results, got None"),
    ("WORLD = 2\ndef f(ctx):\n    return 1\ndef checks(result):\n    return 'ok'\n", "f",
     "bad.py:4: checks(result) must return a list of parasim.lesson.check(...) results, got 'ok'"),
    ("WORLD = 2\ndef f(ctx):\n    return 1\ndef checks(result):\n    return ['ok']\n", "f", "item 0 is 'ok'"),
    ("WORLD = 2\ndef f(ctx):\n    return 1\ndef checks(result):\n    return result.nothing\n", "f",
     "bad.py:4: checks(result) raised AttributeError: 'RunResult' object has no attribute 'nothing' at bad.py:5"),
    ("import sys\nsys.exit(3)\n", "f", "bad.py: loading it raised SystemExit: 3 at bad.py:2"),
    ("def f(ctx):\n    return 1\n", "__init__", "'__init__' in bad.py is a method-wrapper, not a function"),
    ("def f(ctx):\n    yield 1\n", "f", "'f' in bad.py:1 is a generator function (it uses yield)"),
    ("async def f(ctx):\n    return 1\n", "f", "'f' in bad.py:1 is an async function"),
    ("class f:\n    pass\n", "f", "'f' in bad.py:1 is a class, not a function"),
    ("f = 3\n", "f", "'f' in bad.py:1 is an int, not a function"),
    ("def f(ctx):\n    return 1\n", "g", "bad.py has no function 'g'; it defines f"),
    ("def f(ctx):\n    return 1\ndef reference(ctx):\n    yield 1\n", "f", "'reference' in bad.py:3 is a generator"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text, fn, words", FILES, ids=[f"file{i}" for i in range(len(FILES))])
def test_a_file_that_cannot_be_a_program_is_one_line_and_exit_2(tmp_path, monkeypatch, text, fn, words):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.py"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for command in (["lesson", f"bad.py:{fn}", "--world", "2", "--plain"], ["check", f"bad.py:{fn}", "--world", "2"]):
        out = cli(*command)
        assert out.returncode == 2, (command, out.stderr)
        assert words in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_a_top_level_that_loops_is_stopped_while_loading(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loops.py").write_text("WORLD = 2\nwhile True:\n    pass\ndef f(ctx):\n    return 1\n")
    out = cli("lesson", "loops.py:f", "--plain", "--timeout", "0.5")
    assert out.returncode == 2 and "loops.py: loading it ran for 0.5 s" in out.stderr
    assert "stopped at loops.py:2 (in <module>)" in out.stderr


def test_prints_of_a_files_top_level_do_not_spoil_json(tmp_path, monkeypatch):
    import json
    monkeypatch.chdir(tmp_path)
    (tmp_path / "talks.py").write_text("print('hello from the top')\nWORLD = 2\ndef f(ctx):\n    return 1\n")
    out = cli("lesson", "talks.py:f", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["values"] == [1, 1]
    assert "hello from the top" in out.stderr


@pytest.mark.timeout(30)
def test_check_stops_a_spinning_rank_too(mine, monkeypatch):
    monkeypatch.chdir(mine.parent)
    out = cli("check", f"{mine.name}:spin", "--world", "2", "--timeout", "1")
    assert out.returncode == 1 and "rank 1 ran for 1 s" in out.stderr
    assert f"{mine.name}:{_line(mine, 'spins here')}" in out.stderr


def _spin(ctx):
    if ctx.rank == 1:
        while True:
            pass
    return ctx.comm.all_reduce(ctx.xp.ones(2))


def _slow_but_moving(ctx):
    x = ctx.xp.ones(2)
    for _ in range(12):
        time.sleep(0.05)  # each turn is short; the whole run is longer than the limit
        x = ctx.comm.all_reduce(x) / 2
    return x


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", ["virtual", "symbolic"])
def test_the_library_raises_timed_out_with_the_rank_and_its_line(backend):
    with pytest.raises(parasim.TimedOut) as info:
        parasim.run(_spin, 2, backend, timeout=0.5)
    assert info.value.rank == 1 and info.value.site.endswith(f"test_faults_virtual.py:{_spin.__code__.co_firstlineno + 2}")
    assert isinstance(info.value, parasim.RankFailed)


def test_a_run_that_keeps_moving_is_not_stopped():
    res = parasim.run(_slow_but_moving, 2, timeout=0.3)  # 12 x 0.05 s x 2 ranks = 1.2 s in all
    assert res.values[0].tolist() == [1.0, 1.0]


def test_the_time_limit_gives_back_the_handler_it_found():
    def mine(signum, frame):
        pass
    old = signal.signal(signal.SIGALRM, mine)
    try:
        with pytest.raises(parasim.TimedOut):
            parasim.run(_spin, 2, timeout=0.3)
        assert signal.getsignal(signal.SIGALRM) is mine
        parasim.run(_slow_but_moving, 2, timeout=5)
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, old)


@pytest.mark.timeout(30)
def test_a_run_in_another_thread_is_stopped_too():
    got = []

    def body():
        try:
            parasim.run(_spin, 2, timeout=0.5)
        except parasim.TimedOut as exc:
            got.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join(20)
    assert not t.is_alive() and got and got[0].rank == 1


def test_no_limit_when_asked_for_none():
    assert parasim.run(_slow_but_moving, 2, timeout=None).values[1].tolist() == [1.0, 1.0]


@pytest.mark.timeout(60)
def test_the_default_limit_stops_a_spinning_rank(mine, monkeypatch):
    """The acceptance line: no --timeout given, the run ends at the default limit (30 s) naming rank 1 and
    its line. The watchdog's clock runs 100 times faster here, so the 30 s of its default pass in 0.3 s:
    the limit comes from the command's own default, unchanged."""
    import types

    from parasim.comm import watchdog
    fast = types.SimpleNamespace(monotonic=lambda: 100 * time.monotonic())
    monkeypatch.setattr(watchdog, "time", fast)
    monkeypatch.chdir(mine.parent)
    t = time.monotonic()
    out = cli("lesson", f"{mine.name}:spin", "--world", "2", "--plain")
    # under 30 s of real time: the limit was read on the watchdog's (fast) clock, whatever the machine's load
    assert out.returncode == 1 and time.monotonic() - t < 29
    assert "rank 1 ran for 30 s" in out.stderr and f"mine.py:{_line(mine, 'spins here')}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("command", [["lesson"], ["check"]], ids=["lesson", "check"])
def test_prints_of_a_program_while_it_runs_go_to_stderr_under_json(tmp_path, monkeypatch, command):
    import json
    monkeypatch.chdir(tmp_path)
    (tmp_path / "talks.py").write_text("def f(ctx):\n    print('rank', ctx.rank, 'says hi')\n"
                                       "    return ctx.comm.all_reduce(ctx.xp.ones(1))\n")
    out = cli(*command, "talks.py:f", "--world", "2", "--json")
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    assert "rank 0 says hi" in out.stderr and "rank 1 says hi" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_loop_inside_c_ends_the_process_naming_its_line(mine):
    """Code that never returns to the interpreter takes no interrupt: the last resort (faulthandler's timer,
    GRACE seconds past the limit) writes where it is and ends the process with exit code 1."""
    from parasim.comm.watchdog import GRACE
    out = cli_process("lesson", f"{mine}:in_c", "--world", "2", "--plain", "--timeout", "1",
                      timeout=max(50, 1 + GRACE + 45))  # past it the loop was never stopped: TimeoutExpired
    assert out.returncode == 1
    assert f'File "{mine}", line {_line(mine, "a loop inside C")} in in_c' in out.stderr

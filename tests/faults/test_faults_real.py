"""Real ranks (gloo) that fail, leave or hang, and what listens where. Every case ends within its limit with
the error on stderr (one line, or a few where they add facts), exit 1 for a failing run and 2 for bad
input, no traceback, and no process left behind; the programs are this file's functions, run as
`tests/faults/real_fault_programs.py:function`."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import session_pids, site_at
from helpers_real import LOOPBACK, children, interface, listening, listening_alive

pytest.importorskip("torch")

import parasim

pytestmark = pytest.mark.slow
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_fault_programs.py")  # the programs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(name: str, *flags: str) -> list[str]:
    return ["run", f"{PROGRAMS}:{name}", "--nproc", "2", *flags]


PORT = _free_port()  # nobody serves it
TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(PORT)}
NOT_SET = "are not: unset"
STUCK = "rank 1 ran for 3 s without reaching a collective or returning (the time limit, --timeout): stopped"

# (id, argv, environment added, exit code, lines on stderr, words the error must hold)
CASES = [
    ("exit-0", _run("leaves_early", "--timeout", "20"), {}, 1, 1,
     ["parasim: rank 1 exited with code 0 before its program returned; the other ranks were stopped"]),
    ("all-exit-0", ["run", f"{PROGRAMS}:all_leave", "--nproc", "3"], {}, 1, 1,
     ["parasim: ranks 0-2 each exited with code 0 before its program returned\n"]),
    ("sys-exit", _run("exits"), {}, 1, 1,
     [f"parasim: rank 1 raised SystemExit: 3 at {site_at(PROGRAMS, 'exits 3')} (in exits)\n"]),
    ("send-list", _run("sends_a_list"), {}, 1, 1,
     [f"parasim: CollectiveError: send expects a torch tensor on real ranks, got list (called at "
      f"{site_at(PROGRAMS, 'send list')})\n"]),
    ("timeout-1e-3", ["run", "collectives", "--timeout", "0.001"], {}, 2, 1,
     ["timeout must be at least 1 s on real ranks, got 0.001:"]),
    ("timeout-1e-5", ["run", "collectives", "--timeout", "1e-5"], {}, 2, 1, ["at least 1 s on real ranks, got 1e-05"]),
    ("timeout-1e-300", ["run", "collectives", "--timeout", "1e-300"], {}, 2, 1, ["at least 1 s", "got 1e-300"]),
    ("device-cuda", ["run", "collectives", "--device", "cuda"], {"CUDA_VISIBLE_DEVICES": ""}, 2, 1,
     ["--device cuda needs a CUDA GPU and none is visible here"]),
    ("nccl-on-cpu", ["run", "collectives", "--backend", "nccl", "--device", "cpu"], {}, 2, 1,
     ["--backend nccl keeps tensors on GPUs; --device cpu needs --backend gloo"]),
    ("check-timeout", ["check", f"{PROGRAMS}:spins", "--world", "2", "--against", "gloo", "--timeout", "0.5"], {}, 2, 1,
     ["timeout must be at least 1 s on real ranks, got 0.5"]),
    ("run-id", ["run", "collectives"], {"TORCHELASTIC_RUN_ID": "x"}, 2, 1,
     ["TORCHELASTIC_RUN_ID is set", "but RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
      f"{NOT_SET} TORCHELASTIC_RUN_ID to start"]),
    ("rank", ["run", "collectives"], {"RANK": "1"}, 2, 1, ["RANK is set", f"{NOT_SET} RANK to start"]),
    ("world", ["run", "collectives", "--nproc", "2"], {"WORLD_SIZE": "2"}, 2, 1, ["WORLD_SIZE is set"]),
    ("no-master", ["run", "collectives"], {k: TORCHRUN[k] for k in list(TORCHRUN)[:5]}, 2, 1,
     ["but MASTER_ADDR, MASTER_PORT are not", "unset TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE to start"]),
    ("world-two", ["run", "collectives"], {**TORCHRUN, "WORLD_SIZE": "two"}, 2, 1,
     ["WORLD_SIZE must be a whole number, got 'two'"]),
    ("rank-past", ["run", "collectives"], {**TORCHRUN, "RANK": "2"}, 2, 1,
     ["do not fit together (RANK=2, WORLD_SIZE=2,"]),
    ("no-store", ["run", "collectives", "--timeout", "1"], TORCHRUN, 1, 1,
     [f"rank 1 could not meet the job's other ranks at 127.0.0.1:{PORT} (MASTER_ADDR, MASTER_PORT) within 1 s"]),
    ("spin", _run("spins", "--timeout", "3"), {}, 1, 3,
     [f"{STUCK} at {site_at(PROGRAMS, 'spin')} (in spins)\nranks left waiting:\n  rank 0: waits in all_reduce(",
      f"on group world[0, 1] at {site_at(PROGRAMS, 'after spin')}"]),
    ("sleep", _run("sleeps", "--timeout", "3"), {}, 1, 3,
     [f"{STUCK} at {site_at(PROGRAMS, 'sleep')} (in sleeps)", f"at {site_at(PROGRAMS, 'after sleep')}"]),
    ("in-c", _run("busy_in_c", "--timeout", "3"), {}, 1, 3, [f"{STUCK} in code that does not return to Python"]),
    ("check-spin", ["check", f"{PROGRAMS}:spins", "--world", "2", "--against", "gloo", "--timeout", "3"], {}, 1, 3,
     [f"{STUCK} at {site_at(PROGRAMS, 'spin')} (in spins)", "rank 0: waits in all_reduce("]),
    ("all-spin", _run("all_spin", "--timeout", "2"), {}, 1, 2,
     ["parasim: Deadlock: no rank finished a call for 4 s (twice the run's timeout); the ranks outside any "
      f"collective were stopped:\n  ranks 0, 1: at {site_at(PROGRAMS, 'all spin')} (in all_spin)\n"]),
    ("virtual-side", _run("spins_on_virtual_ranks", "--timeout", "3"), {}, 1, 3,
     [f"{STUCK} at {site_at(PROGRAMS, 'virtual spin')}"]),
]


def _parasim(args: list[str], env: dict[str, str], limit: float = 90) -> subprocess.CompletedProcess:
    """`python -m parasim ARGS` in a session of its own; fails the test if it runs past `limit` seconds or
    leaves a process behind."""
    proc = subprocess.Popen([sys.executable, "-m", "parasim", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"parasim {' '.join(args)} ran past {limit} s; stderr:\n{err[-3000:]}")
    for _ in range(50):  # multiprocessing's helpers (fork server, resource tracker) follow their parent out
        left = session_pids(proc.pid)
        if not left:
            break
        time.sleep(0.1)
    assert left == [], f"left running: {left}"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _in_process(args: list[str], limit: float = 90) -> subprocess.CompletedProcess:
    """`parasim ARGS` in this process (its ranks forked by the fork server this test process keeps, so no
    interpreter and torch start each time); fails the test if it runs past `limit` seconds or leaves a rank
    behind."""
    from conftest import cli
    t = time.monotonic()
    out = cli(*args)
    assert time.monotonic() - t < limit, f"parasim {' '.join(args)} ran past {limit} s"
    for _ in range(50):
        left = children()
        if not left:
            break
        time.sleep(0.1)
    assert left == [], f"left running: {left}"
    return out


@pytest.mark.parametrize("argv, env, code, lines, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_failing_or_refused_real_run_ends_in_a_line(argv, env, code, lines, words):
    # an environment of its own needs a process of its own (torchrun's variables, the visible GPUs)
    out = _parasim(argv, env) if env else _in_process(argv)
    assert (out.returncode, out.stderr.count("\n")) == (code, lines), out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in out.stderr, out.stderr


def lists_sockets(ctx):
    """Rank 0, once every rank has joined the world and a pair group (each a process group with its own
    sockets): the listening sockets of every rank."""
    pair = ctx.new_group([0, 1], "pair")
    if ctx.rank in pair.ranks:
        ctx.comm.all_reduce(ctx.asarray([1.0]), group=pair)
    ctx.comm.barrier()
    out = None
    if ctx.rank == 0:
        server = os.getppid()  # ranks are forked from one server: its children are the ranks
        with open(f"/proc/{server}/task/{server}/children") as f:
            out = listening([int(p) for p in f.read().split()])
    ctx.comm.barrier()  # nobody leaves before rank 0 has looked
    return out


IFACE = interface()
ENVS = [("gloo-ifname", {"GLOO_SOCKET_IFNAME": IFACE}), ("gloo-ifnames", {"GLOO_SOCKET_IFNAME": f"{IFACE},lo"}),
        ("transport-uv", {"GLOO_DEVICE_TRANSPORT": "UV", "GLOO_SOCKET_IFNAME": IFACE}),
        ("tp-ifname", {"TP_SOCKET_IFNAME": IFACE}), ("master-addr", {"MASTER_ADDR": "0.0.0.0", "MASTER_PORT": "1"})]


@pytest.mark.parametrize("env", [e for _, e in ENVS], ids=[i for i, _ in ENVS])
def test_a_local_run_listens_on_loopback_whatever_the_environment_says(env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    sockets = parasim.run(lists_sockets, 3, backend="gloo", timeout=20).values[0]
    assert len(sockets) >= 3, sockets  # gloo listens in every rank
    assert [s for s in sockets if s[0] not in LOOPBACK] == []


def test_the_collectives_lesson_listens_on_loopback_with_an_interface_exported():
    """The acceptance case, from outside: `GLOO_SOCKET_IFNAME=<eth0> parasim run collectives --nproc 4`, its
    processes' listening sockets read while they run."""
    proc = subprocess.Popen([sys.executable, "-m", "parasim", "run", "collectives", "--nproc", "4", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "GLOO_SOCKET_IFNAME": IFACE})
    seen: set[tuple[int, str, int]] = set()
    try:
        while proc.poll() is None:
            pids = session_pids(proc.pid)
            seen |= {(len(pids), *s) for s in listening_alive(pids)}
            time.sleep(0.02)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-2000:]
    sockets = {s[1:] for s in seen}
    assert max(n for n, *_ in seen) >= 5 and len(sockets) >= 5, seen  # the store, and gloo in each of 4 ranks
    assert [s for s in sockets if s[0] not in LOOPBACK] == []


SCRIPT = '''
import parasim


def prog(ctx):
    return ctx.comm.all_reduce(ctx.asarray([1.0]))


res = parasim.run(prog, world=2, backend="gloo")
print(res.values)
'''


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("Traceback") == 1  # the script's own: the error ends it, no rank's
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parasim.errors.UsageError: each real rank starts by importing the script ")
    assert last.endswith("unguarded.py, and it calls parasim.run again as it is imported: put that call under "
                         "`if __name__ == \"__main__\":`")


def test_a_local_launch_gives_its_workers_loopback_for_gloo_and_nccl(monkeypatch):
    """What the workers of a one-machine launch get, whatever was exported for a multi-node run: gloo's
    and NCCL's sockets on the loopback interface (NCCL's cannot be run without GPUs; its variable is set)."""
    from parasim.comm.loopback import local_env as _local_env
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("GLOO_DEVICE_TRANSPORT", "UV")
    env = _local_env()
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo" and "GLOO_DEVICE_TRANSPORT" not in env
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"  # the launcher's own environment is left as it was


def test_what_ranks_print_goes_to_stderr_and_json_stays_whole():
    """A real run's ranks print on stderr (stdout carries the verdict or the JSON alone), and `ctx.xp`
    takes a dtype's name on real ranks as numpy's does, so one program runs on both."""
    import json
    out = _parasim(["run", f"{PROGRAMS}:talks", "--nproc", "2", "--json"], {})
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["match"] is True
    assert "rank 0 says hi" in out.stderr and "rank 1 says hi" in out.stderr


@pytest.mark.parametrize("call, dtype", [
    (lambda xp: xp.ones(3, dtype="bfloat16"), "torch.bfloat16"),
    (lambda xp: xp.zeros((2,), dtype="f4"), "torch.float32"),  # numpy's short names too
    (lambda xp: xp.astype(xp.ones(2), "float16"), "torch.float16"),  # astype's dtype comes second
    (lambda xp: xp.full((1,), 2.0, dtype="int64"), "torch.int64"),
], ids=["ones", "short-name", "astype", "full"])
def test_ctx_xp_on_real_ranks_takes_dtype_names(call, dtype):
    import array_api_compat.torch as torch_xp

    from parasim.engine.torch_xp import TorchNamespace
    assert str(call(TorchNamespace(torch_xp)).dtype) == dtype
    assert str(TorchNamespace(torch_xp).finfo("bfloat16").bits) == "16"  # finfo's comes first


def test_a_dtype_torch_has_not_is_one_line():
    import array_api_compat.torch as torch_xp

    from parasim.engine.torch_xp import TorchNamespace
    with pytest.raises(parasim.UsageError, match="'float65' is not a dtype torch has"):
        TorchNamespace(torch_xp).ones(2, dtype="float65")

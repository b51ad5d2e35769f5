"""Several nodes: two torchrun "nodes" on this machine (README's recipe: they meet through a file, rank 0
serves the ranks' store) run the same lesson; the global rank 0 prints one verdict, it matches the virtual
run, and every socket that any of their processes listens on is on loopback, although an interface is
exported for gloo as a multi-node recipe would."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from helpers_real import LOOPBACK, interface, listening_alive  # noqa: E402

pytestmark = pytest.mark.slow


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants (torchrun starts its ranks in sessions of their own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
        out.append(p)
    return out


def test_two_torchrun_nodes_give_one_verdict_that_matches_and_listen_on_loopback_only(tmp_path):
    # TMPDIR: torchrun leaves its torchelastic folders behind; in the test's own folder they go with it
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": interface(), "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-conf", "store_type=file", "--rdzv-endpoint", str(tmp_path / "rdzv"),
           "--rdzv-id", "parasim-test", "--local-addr", "127.0.0.1", "--max-restarts", "0",
           "-m", "parasim", "run", "collectives", "--json", "--timeout", "60"]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              start_new_session=True) for _ in range(2)]
    seen: set[tuple[str, int]] = set()
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while any(p.poll() is None for p in nodes) and time.monotonic() < deadline:
            now = [pid for p in nodes for pid in _tree(p.pid)]
            pids |= set(now)
            seen |= set(listening_alive(now))
            time.sleep(0.02)
        outs = []
        for p in nodes:
            out, err = p.communicate(timeout=10)
            assert p.returncode == 0, err[-2000:]
            outs.append(out)
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    printed = [o for o in outs if o.strip()]
    assert len(printed) == 1  # only the node holding global rank 0 reports
    verdict = json.loads(printed[0])
    assert (verdict["world"], verdict["backend"], verdict["match"], verdict["differences"]) == (4, "gloo", True, [])
    assert verdict["checks"] and all(c["ok"] for c in verdict["checks"])
    # every collective of the lesson ran over 4 ranks spread over both nodes: 3 kinds, 14 events (the pair's
    # three and its two backward ones, the ring's three, and rs, ag, ar for groups of 2 and 4)
    assert sorted(verdict["timings"]) == ["all_gather", "all_reduce", "reduce_scatter"] and verdict["events"] == 14
    # the agents and their 4 ranks were looked at; rank 0's store and each rank's gloo listened, on loopback
    assert len(pids) >= 6 and len(seen) >= 5, (pids, seen)
    assert [s for s in seen if s[0] not in LOOPBACK] == []

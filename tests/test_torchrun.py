"""Several nodes: two torchrun "nodes" on this machine (c10d rendezvous on 127.0.0.1, two processes
each) run the same lesson; the global rank 0 prints one verdict, and it matches the virtual run."""
import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_give_one_verdict_that_matches():
    port = _free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # every byte on loopback
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "parasim-test",
           "--local-addr", "127.0.0.1", "--max-restarts", "0",
           "-m", "parasim", "run", "collectives", "--json", "--timeout", "60"]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = []
    try:
        for p in nodes:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
            outs.append(out)
    finally:
        for p in nodes:
            p.kill()
    printed = [o for o in outs if o.strip()]
    assert len(printed) == 1  # only the node holding global rank 0 reports
    verdict = json.loads(printed[0])
    assert (verdict["world"], verdict["backend"], verdict["match"], verdict["differences"]) == (4, "gloo", True, [])
    assert verdict["checks"] and all(c["ok"] for c in verdict["checks"])
    # every collective of the lesson ran over 4 ranks spread over both nodes: 3 kinds, 12 events
    assert sorted(verdict["timings"]) == ["all_gather", "all_reduce", "reduce_scatter"] and verdict["events"] == 12

"""Virtual runs are deterministic independently of Python's string hashing: the same lessons, run in two
processes with different PYTHONHASHSEED values, give byte-identical traces and values.

Within one process every rank sees the same hash order, so iterating a set of names (say, an optimizer's
parameters) keeps the ranks consistent and every check passes; only a second process with another seed
shows that the run depends on it. ZeRO-1 Adam (moe16, memory) lays its flat buffer out in its key order,
which decides each rank's share and so the per-share numbers it returns.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ("collectives", "tp-mlp", "moe16", "pp-1f1b", "memory")

SCRIPT = """
import hashlib, json, sys
from parasim.lesson import get_lesson, jsonable, run_lesson

for name in sys.argv[1:]:
    run = run_lesson(get_lesson(name))
    parts = {"trace": run.result.trace.to_json(), "values": json.dumps(jsonable(run.result.values)),
             "checks": json.dumps([c.to_dict() for c in run.checks])}
    print(name, *(f"{k}={hashlib.sha256(v.encode()).hexdigest()}" for k, v in parts.items()))
"""


def _digests(seeds: tuple[str, ...]) -> list[str]:
    """Run SCRIPT once per seed, the processes side by side; each one's stdout."""
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, *LESSONS], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONHASHSEED": seed}) for seed in seeds]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=100)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


def test_a_virtual_run_does_not_depend_on_string_hashing():
    first, second = _digests(("0", "12345"))
    lines = first.splitlines()
    assert [ln.split()[0] for ln in lines] == list(LESSONS)
    assert all(len(ln.split()) == 4 for ln in lines)
    assert first == second, "\n".join(f"{a}\n{b}\n" for a, b in zip(lines, second.splitlines()) if a != b)

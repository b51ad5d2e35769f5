"""The tp-mlp lesson reproduces the post's 2-GPU MLP figures by running the layers."""
import json
import subprocess
import sys

import pytest

from parasim.lesson import get_lesson, run_lesson


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("tp-mlp"))


def flat(a):
    return [float(v) for v in a.reshape(-1)]


def test_checks_hold(lr):
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_the_posts_figures(lr):
    v = lr.result.values
    assert flat(v[0]["ReLU then sum"]) == [1, 2, 2, 2]  # the wrong row split
    assert flat(v[0]["sum then ReLU"]) == [1, 2, 1, 0]
    assert [flat(v[r]["Y_i"]) for r in (0, 1)] == [[1, 2], [1, 0]]
    assert [flat(v[r]["Z"]) for r in (0, 1)] == [[2, 3], [2, 3]]
    assert [flat(v[r]["dL/dY_i"]) for r in (0, 1)] == [[1, 1], [2, 1]]
    assert [flat(v[r]["dL/d(X·A_i)"]) for r in (0, 1)] == [[1, 1], [2, 0]]  # ReLU'(0) = 0
    assert [flat(v[r]["dL/dX"]) for r in (0, 1)] == [[-1, 3], [-1, 3]]
    f_backward = next(e for e in lr.result.trace.events if e.label == "f backward")
    assert [m.before for m in f_backward.members] == [([[[1.0, 1.0]]],), ([[[-2.0, 2.0]]],)]


def test_json_and_world_rules():
    out = subprocess.run([sys.executable, "-m", "parasim", "lesson", "tp-mlp", "--json"], capture_output=True,
                         text=True, timeout=60)
    data = json.loads(out.stdout)
    assert out.returncode == 0 and all(c["ok"] for c in data["checks"]) and data["world"] == 2
    bad = subprocess.run([sys.executable, "-m", "parasim", "lesson", "tp-mlp", "--world", "4"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "runs on exactly 2 ranks" in bad.stderr

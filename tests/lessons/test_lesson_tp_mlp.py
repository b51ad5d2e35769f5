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
    bad = subprocess.run([sys.executable, "-m", "parasim", "lesson", "tp-mlp", "--world", "3"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "runs on 1, 2, 4 ranks, not 3" in bad.stderr


def test_the_column_split_has_an_event_the_app_can_stop_on():
    """The column split moves nothing, but it is the lesson's key step: an event of its own (compute, on
    each rank) puts its phase, and the notes Y1 = [1, 2], Y2 = [1, 0], on the app's timeline."""
    from parasim.lesson import get_lesson, run_lesson
    trace = run_lesson(get_lesson("tp-mlp")).result.trace
    split = [e for e in trace.events if e.phase == "splitting A by columns"]
    assert [(e.kind, e.ranks) for e in split] == [("compute", [0]), ("compute", [1])]
    assert split[0].params["flops"] == 2 * 2 * 2  # X [1 x 2] times A_i [2 x 2]
    notes = {r: text for phase, r, text, _ in trace.notes() if phase == "splitting A by columns"}
    assert "Y_i = [1 2]" in notes[0] and "Y_i = [1 0]" in notes[1]
    phases = list(dict.fromkeys(e.phase for e in trace.events))
    assert phases.index("splitting A by rows") < phases.index("splitting A by columns") \
        < phases.index("splitting B by rows, one all-reduce")

"""The tp-mlp lesson reproduces the post's 2-GPU MLP figures by running the layers."""
import json
import subprocess
import sys

import numpy as np
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
    assert "Y_i = [1, 2]" in notes[0] and "Y_i = [1, 0]" in notes[1]  # vectors as the post writes them
    phases = list(dict.fromkeys(e.phase for e in trace.events))
    assert phases.index("splitting A by rows") < phases.index("splitting A by columns") \
        < phases.index("splitting B by rows, one all-reduce")


def _plain(tp: int = 2) -> str:
    out = subprocess.run([sys.executable, "-m", "parasim", "lesson", "tp-mlp", "--tp", str(tp), "--plain", "--width",
                          "100"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


def _vec(a) -> str:
    return "[" + ", ".join(f"{v:g}" for v in np.ravel(a)) + "]"


X, A = np.array([1.0, 2.0]), np.array([[1.0, 0, -1, 2], [0, 1, 1, -1]])


def test_the_row_split_fails_first_then_is_done_right_each_labelled(lr):
    """The post splits A by rows and shows it failing: each GPU's partial X_i·A_i, the ReLUs of the partials
    summed to [1, 2, 2, 2] (wrong), against ReLU(X·A) = [1, 2, 1, 0]. The lesson runs the wrong order first and
    says so in its event labels, notes and checks, then the right one; its notes give the vectors flat, as the
    post writes them (the run holds [1, 1, 4] arrays)."""
    rows = [e for e in lr.result.trace.events if e.phase == "splitting A by rows"]
    assert [e.label.split(":")[0] for e in rows] == ["wrong", "right"]
    partial = [X[i] * A[i] for i in range(2)]  # GPU i: X's entry i times row i of A
    assert [m.after for m in rows[0].members] == [([[list(sum(np.maximum(q, 0) for q in partial))]],)] * 2
    assert [m.after for m in rows[1].members] == [([[list(sum(partial))]],)] * 2
    text = _plain()
    for i in range(2):
        row = "[" + " ".join(f"{v:g}" for v in A[i]) + "]"
        assert f"holds row {i + 1} of A and the matching part of X: [{X[i]:g}]·{row} = {_vec(partial[i])}, a " \
               f"partial sum; its ReLU is {_vec(np.maximum(partial[i], 0))}" in text
    wrong, right = sum(np.maximum(q, 0) for q in partial), np.maximum(X @ A, 0)
    assert (_vec(wrong), _vec(right)) == ("[1, 2, 2, 2]", "[1, 2, 1, 0]")  # the post's two vectors
    assert f"wrong: the ReLUs summed give {_vec(wrong)}; right: the ReLU of the sum gives {_vec(right)}" in text
    names = [c.name for c in lr.checks]
    assert names.index("rows of A, wrong: the ReLU of each partial, summed") < \
        names.index("rows of A, right: all-reduce before the ReLU gives ReLU(X·A)")


def test_backward_notes_each_rank_s_part_of_dl_dx_through_a(lr):
    """The post: through A, GPU 1 gives [1, 1]·A1ᵀ = [1, 1] and GPU 2 [2, 0]·A2ᵀ = [-2, 2]; the all-reduce adds
    them to dL/dX = [-1, 3]. Worked out here from A's columns and the ReLU's gradient on each rank."""
    B = np.array([[1.0, 0], [0, 1], [1, 1], [2, -1]])
    h = X @ A
    dh = (np.ones(2) @ B.T) * (h > 0)
    text = _plain()
    parts = []
    for i, c in enumerate(np.split(np.arange(4), 2)):
        part = dh[c] @ A[:, c].T
        parts.append(part)
        assert f"through A: {_vec(dh[c])}·A_iᵀ = {_vec(part)}, this rank's part of dL/dX" in text
    assert [_vec(p) for p in parts] == ["[1, 1]", "[-2, 2]"] and _vec(sum(parts)) == "[-1, 3]"
    (c,) = [c for c in lr.checks if c.name.startswith("backward through A, each rank alone")]
    assert c.ok and [np.ravel(g).tolist() for g in c.got] == [p.tolist() for p in parts]

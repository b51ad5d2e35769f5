"""`parasim compare`: a lesson at several settings, the same figures side by side (issue 33, build item 4)."""
import json
from fractions import Fraction

import pytest
from conftest import cli


def _json(*args):
    out = cli("compare", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_sp_at_tp_2_4_8_one_row_per_setting():
    data = _json("sp", "--tp", "2,4,8")
    assert data["lesson"] == "sp" and [r["settings"] for r in data["rows"]] == [{"tp": 2}, {"tp": 4}, {"tp": 8}]
    assert all(r["ok"] for r in data["rows"])
    sbh = 16 * 1 * 16  # the lesson's layer
    kept = [r["figures"]["bytes rank 0 keeps for backward: TP + SP"] for r in data["rows"]]
    assert kept == [34 * sbh // t for t in (2, 4, 8)]  # Korthikanti et al.'s 34sbh/t
    alone = [r["figures"]["bytes rank 0 keeps for backward: TP alone"] for r in data["rows"]]
    assert alone == [sbh * (10 + 24 // t) for t in (2, 4, 8)]
    assert "ranks" in data["differ"] and "checks ok" not in data["differ"]


def test_pipeline_settings_multiply():
    data = _json("pp-1f1b", "--pp", "2,4", "-m", "4,8")
    got = {(r["settings"]["pp"], r["settings"]["m"]): Fraction(r["figures"]["bubble (idle share of the step)"])
           for r in data["rows"]}
    assert got == {(p, m): Fraction(p - 1, m + p - 1) for p in (2, 4) for m in (4, 8)}


def test_the_table_marks_what_changes():
    text = cli("compare", "cp-causal", "--cp", "2,4").stdout
    lines = text.splitlines()
    changed = next(line for line in lines if "slowest rank's blocks, contiguous" in line)
    same = next(line for line in lines if "checks ok" in line)
    assert "* slowest" in changed and "* checks" not in same
    assert "--cp 2" in text and "--cp 4" in text


@pytest.mark.parametrize("args, needle", [
    (("sp",), "give the settings"),
    (("sp", "--tp", "2,2"), "twice"),
    (("sp", "--tp", "2,,4"), "commas"),
    (("sp", "--cp", "2,4"), "has no --cp"),
    (("sp", "--tp", "2,3"), "not 3"),
    (("nope", "--tp", "2"), "unknown lesson"),
])
def test_bad_settings_are_one_line_exit_2(args, needle):
    out = cli("compare", *args)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1 and needle in out.stderr


def test_the_busiest_gpu_is_a_middle_stage():
    """pp 4: a middle stage sends m activations on and m gradients back; the first stage only activations.
    An activation here is [4, 1, 8] float64 = 256 B."""
    data = _json("pp-1f1b", "--pp", "2,4", "-m", "4")
    got = [r["figures"]["bytes sent by the busiest GPU on p2p"] for r in data["rows"]]
    assert got == [4 * 256, 2 * 4 * 256]


@pytest.mark.parametrize("json_out", [False, True])
def test_one_run_that_disagrees_with_its_reference_makes_the_comparison_fail(monkeypatch, json_out):
    """Exit 1 when any run disagrees, not only when every one does: the run at --tp 4 is made to fail one
    check (its checks are the lesson's own comparisons with the unsplit layer)."""
    import dataclasses

    import parasim.figures as figures_module  # compare_lesson's runner
    real = figures_module.run_lesson

    def one_fails(lesson, **kwargs):
        lr = real(lesson, **kwargs)
        if (kwargs.get("knobs") or {}).get("tp") == 4:
            lr.checks[0] = dataclasses.replace(lr.checks[0], ok=False)
        return lr
    monkeypatch.setattr(figures_module, "run_lesson", one_fails)
    out = cli("compare", "sp", "--tp", "2,4,8", *(["--json"] if json_out else []))
    assert out.returncode == 1, out.stderr
    if json_out:
        assert [r["ok"] for r in json.loads(out.stdout)["rows"]] == [True, False, True]
    else:
        assert "1 disagree" in out.stdout


def test_a_notebook_gets_what_the_command_prints():
    """Issue 52's thin CLI: `compare_lesson` and `compare_layouts` are the calls the command makes; their
    comparisons' to_dict is the --json, and a run that disagrees is not ok."""
    from parasim.examples.worked import example
    from parasim.figures import LayoutRun, compare_layouts, compare_lesson
    from parasim.lesson import get_lesson
    from parasim.layout import Layout

    lesson = compare_lesson(get_lesson("sp"), [{"tp": 2}, {"tp": 4}], timeout=60)
    assert lesson.to_dict() == _json("sp", "--tp", "2,4") and lesson.ok
    ex = example("moe16")
    runs = []
    for ep in (2, 4):
        layout = Layout(tp=1, ep=ep, etp=1, world=4, model=ex.model, zigzag=False)
        reps = ex.replicas(layout.dp, ex.micro_batches)
        watch = ex.find_token("contract", [s for rep in reps for s in rep])
        runs.append(LayoutRun({"ep": ep, "world": 4}, layout, ex.micro_batches, ex.routings[0], watch))
    layouts = compare_layouts(ex, runs, sp=False, timeout=60)
    assert layouts.to_dict() == _json("layout", "--ep", "2,4", "--world", "4")
    assert layouts.name == "layout (GPUs 4 in every run)" and layouts.hidden == {"world"}

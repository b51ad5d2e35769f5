"""scripts/gpu_check.py (what a GPU machine checks) on CPU: torch.cuda faked (one H200, or eight), the
commands it would run and the table it prints; its runner stopping a command and its ranks at the limit;
and scripts/gpu_programs.py on virtual ranks against closed forms."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import parasim
from parasim.lesson import load_lessons

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gc = _load("gpu_check")
gp = _load("gpu_programs")
PY = sys.executable


def fake_torch(gpus: int = 1, name: str = "NVIDIA H200"):
    """Just what gpu_check asks of torch: its version, CUDA's, the GPUs and NCCL's version."""
    cuda = SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus,
                           get_device_name=lambda i: name, nccl=SimpleNamespace(version=lambda: (2, 27, 3)))
    return SimpleNamespace(__version__="2.11.0+cu130", version=SimpleNamespace(cuda="13.0"), cuda=cuda)


def lesson(name, world, worlds=(1, 2, 4, 8, 16), backend="virtual"):
    return SimpleNamespace(name=name, world=world, backend=backend, fits=lambda w: w in worlds)


LESSONS = [lesson("one", 2, (1, 2)), lesson("pair", 2, (2,)), lesson("big", 16, (16,)),
           lesson("shapes", 8, (8,), "symbolic")]
RUN = [PY, "-m", "parasim", "run"]


def commands(checks):
    """(part, backend, world, argv after `parasim run` or pytest's, env) of every check that would run."""
    return [(c.part, c.backend, c.world, c.argv[4:] if c.argv[:4] == RUN else c.argv[1:], c.env)
            for c in checks if c.argv]


def unchecked(checks):
    return {(c.part, c.backend): c.why_not for c in checks if c.argv is None}


# ---------------------------------------------------------------------------------------------
# The plan

def test_one_gpu_without_the_device_option():
    checks = gc.plan(LESSONS, gc.probe(fake_torch(1)), device_option=False, python=PY)
    cuda = {"PARASIM_GPU_CHECK_DEVICE": "cuda"}
    assert commands(checks) == [
        ("tests/e2e/test_nccl.py (pytest -m nccl)", "nccl", "1",
         ["-m", "pytest", "-q", "-m", "nccl", "tests/e2e/test_nccl.py", "-p", "no:cacheprovider"], {}),
        ("lessons on 1 rank", "nccl", "1", ["all", "--backend", "nccl", "--nproc", "1", "--json"], {}),
        ("every kind of call", "nccl", "1",
         ["scripts/gpu_programs.py:every_call", "--backend", "nccl", "--nproc", "1", "--json"], cuda),
        ("gloo itself on CUDA tensors", "gloo", "2", ["scripts/gpu_gloo_direct.py", "--device", "cuda", "--timeout", "20"],
         {}),
        ("bf16 all-reduce (and float32)", "nccl", "1",
         ["scripts/gpu_programs.py:bf16_sum", "--backend", "nccl", "--nproc", "1", "--json"], cuda),
        ("bf16 all-reduce (and float32), bit for bit", "gloo", "4",
         ["scripts/gpu_programs.py:bf16_sum", "--backend", "gloo", "--nproc", "4", "--json"], {})]
    assert [c.lessons for c in checks if c.part == "lessons on 1 rank"] == [("one",)]
    why = unchecked(checks)
    assert why[("lessons on more ranks than GPUs", "nccl")] == \
        "pair, big: NCCL takes one GPU per rank and 1 is visible"
    assert "symbolic ranks only" in why[("lesson shapes", "-")]
    assert "two ranks need two GPUs" in why[("every kind of call", "nccl")]
    for part in ("every kind of call", "bf16 all-reduce (and float32)", "every lesson on its own world"):
        assert "no --device option" in why[(part, "gloo")], part


def test_one_gpu_with_the_device_option():
    checks = gc.plan(LESSONS, gc.probe(fake_torch(1)), device_option=True, python=PY)
    gloo = [c for c in commands(checks) if c[1] == "gloo"]
    assert [(part, world, argv) for part, _, world, argv, _ in gloo] == [
        ("every kind of call", "4",
         ["scripts/gpu_programs.py:every_call", "--backend", "gloo", "--nproc", "4", "--device", "cuda", "--json"]),
        ("gloo itself on CUDA tensors", "2", ["scripts/gpu_gloo_direct.py", "--device", "cuda", "--timeout", "20"]),
        ("bf16 all-reduce (and float32)", "4",
         ["scripts/gpu_programs.py:bf16_sum", "--backend", "gloo", "--device", "cuda", "--nproc", "4", "--json"]),
        ("bf16 all-reduce (and float32), bit for bit", "4",
         ["scripts/gpu_programs.py:bf16_sum", "--backend", "gloo", "--nproc", "4", "--json"]),
        ("every lesson on its own world", "own", ["all", "--backend", "gloo", "--device", "cuda", "--json"])]
    every = next(c for c in checks if c.part == "every lesson on its own world")
    assert every.lessons == ("one", "pair", "big")  # the symbolic one has no values to run
    assert [s.argv[4:] for s in every.split] == [[n, "--backend", "gloo", "--device", "cuda", "--json"]
                                                 for n in ("one", "pair", "big")]
    calls = next(c for c in checks if c.part == "every kind of call" and c.backend == "gloo")
    assert [s.argv[4] for s in calls.split] == [f"scripts/gpu_programs.py:{k}" for k in gp.KINDS]
    assert all(s.env == {"PARASIM_GPU_CHECK_DEVICE": "cuda"} for s in calls.split)
    assert ("every kind of call", "gloo") not in unchecked(checks)


def test_eight_gpus_run_nccl_on_every_world_up_to_eight():
    checks = gc.plan(LESSONS, gc.probe(fake_torch(8)), device_option=False, python=PY)
    nccl = [(c.world, c.argv[4:]) for c in checks if c.argv and c.backend == "nccl" and c.argv[4] == "all"]
    assert nccl == [("1", ["all", "--backend", "nccl", "--nproc", "1", "--json"]),
                    ("2", ["all", "--backend", "nccl", "--nproc", "2", "--json"])]  # no lesson fits 4 or 8
    assert [c.argv[4:8] for c in checks if c.part.startswith("every kind") and c.argv] == [
        ["scripts/gpu_programs.py:every_call", "--backend", "nccl", "--nproc"]] * 2
    assert [c.world for c in checks if c.part.startswith("every kind") and c.argv] == ["1", "4"]
    assert unchecked(checks)[("lessons on more ranks than GPUs", "nccl")] == \
        "big: NCCL takes one GPU per rank and 8 are visible"


def test_the_device_option_is_asked_of_parasim_run_itself():
    from conftest import cli
    assert gc.has_device_option() == ("--device" in cli("run", "--help").stdout)


def test_every_lesson_has_a_row_on_one_gpu():
    """With the lessons as they are: each one is run, or a row says why not."""
    lessons = list(load_lessons().values())
    for option in (False, True):
        rows, _ = gc.execute(gc.plan(lessons, gc.probe(fake_torch(1)), option, PY), None, 60, 60, dry=True)
        text = " ".join(f"{r.part} {r.result}" for r in rows)
        for x in lessons:
            assert f"lesson {x.name} " in text or f"{x.name}," in text or f"{x.name}:" in text, (option, x.name)


# ---------------------------------------------------------------------------------------------
# Running it, with the commands' outputs faked

def report(name=None, match=True, tolerance="exact", checks=(True,), world=2, differences=()):
    out = {"backend": "nccl", "world": world, "match": match, "differences": list(differences),
           "tolerance": tolerance, "checks": [{"name": f"c{i}", "ok": ok} for i, ok in enumerate(checks)]}
    return out if name is None else {**out, "lesson": name}


class Fake:
    """A runner that answers each command from a table (by a word of its argv) and records what it ran."""

    def __init__(self, answers):
        self.answers, self.ran = answers, []

    def __call__(self, argv, env, timeout):
        self.ran.append((argv, env, timeout))
        for key, (code, out, err) in self.answers.items():
            if key in " ".join(argv):
                return gc.Outcome(code, out if isinstance(out, str) else json.dumps(out), err, 1.5)
        raise AssertionError(f"unexpected command {argv}")


TOL = {"float32": 1e-5}
CASES = [  # (what the command gave, the rows' results)
    ("exact", (0, report("a"), ""), ["yes, exact"]),
    ("rounding", (0, report("a", tolerance=TOL), ""), ["yes, within rounding"]),
    ("mismatch", (1, report("a", match=False, differences=["rank 1, call 0: values after differ"]), ""),
     ["NO: differs from virtual ranks: rank 1, call 0: values after differ"]),
    ("check", (1, report("a", checks=(True, False)), ""), ["NO: check failed: c1"]),
    ("crash", (1, "", "Traceback ...\nparasim: rank 0 raised RuntimeError: no CUDA\nmore"),
     ["error (exit 1): parasim: rank 0 raised RuntimeError: no CUDA"]),
    ("pipe", (1, "", "parasim: error: a | b"), ["error (exit 1): parasim: error: a \\| b"]),
]


@pytest.mark.parametrize("answer, want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_program_gives_one_row(answer, want):
    c = gc.Check("prog", "nccl", "cuda", "1", RUN + ["x.py:f", "--json"])
    rows, ran = gc.execute([c], Fake({"x.py": answer}), 100, 50)
    assert [r.result for r in rows] == want and [r.command for r in rows] == [1]
    assert len(ran) == 1 and ran[0][2].code == answer[0]


def test_bit_for_bit_refuses_a_tolerance():
    c = gc.Check("bf16", "gloo", "cpu", "4", RUN + ["x.py:f", "--json"], exact=True)
    rows, _ = gc.execute([c], Fake({"x.py": (0, report(tolerance=TOL), "")}), 100, 50)
    assert [r.result for r in rows] == ["NO: equal only within a tolerance, bit for bit expected"]
    assert rows[0].failed


def test_a_match_within_rounding_says_how_close():
    words = "within 3 bf16 roundings of each sum: largest gap 0.0012 <= 0.0039"
    c = gc.Check("bf16", "nccl", "cuda", "4", RUN + ["x.py:f", "--json"])
    rows, _ = gc.execute([c], Fake({"x.py": (0, report(tolerance={"words": words, "gap": 0.0012}), "")}), 100, 50)
    assert [r.result for r in rows] == [f"yes, {words}"]


@pytest.mark.parametrize("device, wire, want", [("cuda", "cpu", "cuda, via host copies"), ("cuda", "cuda", "cuda"),
                                                 ("cpu", "cpu", "cpu")], ids=["staged", "direct", "host"])
def test_the_tensors_cell_is_where_the_report_says_they_were(device, wire, want):
    c = gc.Check("p", "gloo", "cuda", "4", RUN + ["x.py:f", "--json"])
    rows, _ = gc.execute([c], Fake({"x.py": (0, {**report(), "device": device, "wire": wire}, "")}), 100, 50)
    assert [r.tensors for r in rows] == [want]


def test_gloo_asked_directly_gives_a_row_per_kind():
    kinds = ("all_reduce", "scatter", "send_recv", "barrier", "reduce")
    answer = {"kinds": [{"kind": "all_reduce", "ok": True, "result": "takes them"},
                        {"kind": "scatter", "ok": False, "result": "refused: ProcessGroupGloo::scatter: invalid tensor "
                                                                   "type | device"},
                        {"kind": "send_recv", "ok": False, "result": "wrong values"},
                        {"kind": "barrier", "ok": False, "result": "not tried: an earlier call ended the probe"}]}
    c = gc.Check("gloo itself", "gloo", "cuda, handed to gloo", "2", [PY, "scripts/gpu_gloo_direct.py"],
                 lessons=kinds, per="gloo itself: ")
    rows, _ = gc.execute([c], Fake({"gpu_gloo_direct": (0, answer, "")}), 100, 50)
    assert [(r.part, r.result) for r in rows] == [
        ("gloo itself: all_reduce", "yes: gloo takes CUDA tensors for it itself"),
        ("gloo itself: scatter", "not on CUDA tensors: gloo refused: ProcessGroupGloo::scatter: invalid tensor type \\| "
                                 "device (parasim copies to the host)"),
        ("gloo itself: send_recv", "NO: wrong values"),
        ("gloo itself: barrier", "not checked: not tried: an earlier call ended the probe"),
        ("gloo itself: reduce", "NO: not reported")]
    assert [r.failed for r in rows] == [False, False, True, False, True]
    text = gc.table(gc.probe(fake_torch(1)), rows, [])
    assert "1 passed, 2 failed, 1 not checked, 1 not on CUDA tensors in gloo itself" in text
    dry, _ = gc.execute([c], None, 100, 50, dry=True)
    assert [r.part for r in dry] == [f"gloo itself: {k}" for k in kinds]


def test_the_probe_asks_every_kind_the_programs_have():
    assert _load("gpu_gloo_direct").KINDS == gp.KINDS


def test_the_probe_without_a_gpu_is_one_line_and_exit_2():
    pytest.importorskip("torch")
    out = subprocess.run([PY, str(ROOT / "scripts" / "gpu_gloo_direct.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no CUDA GPU visible" in out.stderr


@pytest.mark.slow
def test_the_probe_on_the_host_finds_gloo_takes_every_kind():
    """The same calls on CPU tensors, 2 real gloo processes: every kind taken, its values right."""
    pytest.importorskip("torch")
    out = subprocess.run([PY, str(ROOT / "scripts" / "gpu_gloo_direct.py"), "--device", "cpu", "--timeout", "20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["device"] == "cpu" and [(k["kind"], k["ok"]) for k in got["kinds"]] == [(k, True) for k in gp.KINDS]


@pytest.mark.slow
def test_a_real_run_reports_where_its_tensors_were():
    """`parasim run --json` on gloo's CPU ranks: the report the table reads says cpu for both."""
    pytest.importorskip("torch")
    from conftest import cli_process
    out = cli_process("run", "scripts/gpu_programs.py:bf16_sum", "--nproc", "2", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["device"], got["wire"], got["tolerance"]) == ("cpu", "cpu", "exact")


def test_run_all_gives_a_row_per_lesson_and_splits_when_it_gives_no_report():
    whole = report()
    whole["lessons"] = [report("a", world=1), report("b", world=1, tolerance=TOL)]
    batch = gc.Check("lessons on 1 rank", "nccl", "cuda", "1", RUN + ["all", "--nproc", "1", "--json"],
                     lessons=("a", "b", "c"))
    broken = gc.Check("own", "gloo", "cuda", "own", RUN + ["all", "--device", "--json"], lessons=("a", "b"),
                      split=[gc.Check(f"lesson {n}", "gloo", "cuda", "2", RUN + [n, "--solo"], lessons=(n,))
                             for n in ("a", "b")])
    fake = Fake({"--nproc 1": (1, whole, ""), "--device": (1, "", "parasim: rank 3 raised RuntimeError: x"),
                 "a --solo": (0, report("a"), ""), "b --solo": (1, "", "parasim: Deadlock: stuck")})
    rows, ran = gc.execute([batch, broken], fake, 100, 50)
    assert [(r.part, r.world, r.result, r.command) for r in rows] == [
        ("lesson a", "1", "yes, exact", 1), ("lesson b", "1", "yes, within rounding", 1),
        ("lesson c", "1", "not run by `parasim run all`", 1),
        ("own", "own", "error (exit 1): parasim: rank 3 raised RuntimeError: x; each one alone below", 2),
        ("lesson a", "2", "yes, exact", 3), ("lesson b", "2", "error (exit 1): parasim: Deadlock: stuck", 4)]
    assert len(ran) == 4


def test_the_budget_cuts_the_rest_and_each_command_gets_what_is_left():
    clock = iter([0.0, 10.0, 95.0, 99.5]).__next__  # the start, then before each command
    checks = [gc.Check(f"p{i}", "nccl", "cuda", "1", RUN + [f"x{i}.py:f"]) for i in range(3)]
    fake = Fake({f"x{i}.py": (0, report(), "") for i in range(3)})
    rows, _ = gc.execute(checks, fake, 100, 50, clock=clock)
    assert [r.result for r in rows] == ["yes, exact", "yes, exact", "not checked: out of time (--budget 100 s)"]
    assert [t for _, _, t in fake.ran] == [50, 5.0]  # min(each, the budget left)


@pytest.mark.parametrize("code, out, want", [
    (0, "..\n1 passed, 1 skipped in 3.10s\n", "yes: 1 passed, 1 skipped in 3.10s"),
    (1, "F\n1 failed in 2.00s\n", "NO (exit 1): 1 failed in 2.00s"),
    (5, "\nno tests ran in 0.01s\n", "not checked: pytest collected no test")], ids=["pass", "fail", "none"])
def test_pytest_rows(code, out, want):
    c = gc.Check("nccl tests", "nccl", "cuda", "1", [PY, "-m", "pytest", "-q"])
    rows, _ = gc.execute([c], Fake({"pytest": (code, out, "")}), 100, 50)
    assert [r.result for r in rows] == [want]


def test_the_table_is_the_one_docs_gpu_md_waits_for():
    machine = gc.probe(fake_torch(1))
    rows = [gc.Row("lesson a", "nccl", "cuda", "1", "yes, exact", 1),
            gc.Row("every kind of call", "gloo", "cuda", "4", "not checked: no --device", None),
            gc.Row("lesson b", "nccl", "cuda", "1", "NO: check failed: c1", 1)]
    text = gc.table(machine, rows, [(RUN + ["all"], {"PARASIM_GPU_CHECK_DEVICE": "cuda"}, gc.Outcome(1, "", "", 2.25))])
    assert text.splitlines() == [
        "GPUs: 1 (NVIDIA H200); torch 2.11.0+cu130, CUDA 13.0, NCCL 2.27.3", "",
        "| part | backend | tensors on | ranks | result | command |", "|---|---|---|---|---|---|",
        "| lesson a | nccl | cuda | 1 | yes, exact | #1 |",
        "| every kind of call | gloo | cuda | 4 | not checked: no --device | - |",
        "| lesson b | nccl | cuda | 1 | NO: check failed: c1 | #1 |", "",
        "1 passed, 1 failed, 1 not checked", "", "Commands:",
        "- #1 (exit 1, 2.2 s): `PARASIM_GPU_CHECK_DEVICE=cuda python -m parasim run all`"]
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert "\n".join(text.splitlines()[2:4]) in docs  # the results table's header, to paste under


# ---------------------------------------------------------------------------------------------
# The script as a whole

def test_main_with_a_faked_gpu_prints_the_table_and_fails_on_a_failed_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gc, "has_device_option", lambda: False)  # as launch.py is today (docs/gpu.md)
    fake = Fake({"pytest": (0, "1 passed, 1 skipped in 1s", ""), "run all --backend nccl": (0, {"lessons": []}, ""),
                 "every_call": (0, report(), ""), "bf16_sum --backend nccl": (0, report(tolerance=TOL), ""),
                 "gpu_gloo_direct": (0, {"kinds": [{"kind": k, "ok": True, "result": "takes them"} for k in gp.KINDS]},
                                     ""),
                 "bf16_sum --backend gloo": (1, report(match=False, differences=["rank 0: bf16 differs"]), "")})
    out = tmp_path / "t.md"
    code = gc.main(["--out", str(out), "--budget", "100"], torch=fake_torch(1), runner=fake)
    printed = capsys.readouterr().out
    assert code == 1 and out.read_text() == printed
    assert "| bf16 all-reduce (and float32), bit for bit | gloo | cpu | 4 | NO: differs from virtual ranks: rank 0: " \
           "bf16 differs | #6 |" in printed
    assert "| bf16 all-reduce (and float32) | nccl | cuda | 1 | yes, within rounding | #5 |" in printed
    assert "| gloo itself: scatter | gloo | cuda, handed to gloo | 2 | yes: gloo takes CUDA tensors for it itself | #4 |" \
        in printed
    assert [a[4] if a[1] == "-m" else a[1] for a, _, _ in fake.ran[1:]] == [
        "all", "scripts/gpu_programs.py:every_call", "scripts/gpu_gloo_direct.py", "scripts/gpu_programs.py:bf16_sum",
        "scripts/gpu_programs.py:bf16_sum"]


@pytest.mark.parametrize("gpus, missing, want", [(0, [], "no CUDA GPU visible"), (1, ["greenlet"], "cannot import greenlet")],
                         ids=["no-gpu", "no-greenlet"])
def test_nothing_to_run_is_one_line_and_exit_2(monkeypatch, capsys, gpus, missing, want):
    monkeypatch.setattr(gc, "missing_modules", lambda names=gc.NEEDED: missing)
    torch = None if missing else fake_torch(gpus)
    assert gc.main([], torch=torch, runner=Fake({})) == 2
    err = capsys.readouterr().err
    assert want in err and err.count("\n") == 1


BAD = [(["--gpus", "8"], "use it with --dry-run"), (["--budget", "nan"], "a number above 0"),
       (["--each", "-1"], "a number above 0"), (["--dry-run", "--gpus", "0"], "from 1 to 64")]


@pytest.mark.parametrize("argv, want", BAD, ids=["gpus-alone", "nan", "negative", "zero-gpus"])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, want):
    with pytest.raises(SystemExit) as info:
        gc.main(argv, torch=fake_torch(1), runner=Fake({}))
    err = capsys.readouterr().err
    assert info.value.code == 2 and want in err and err.count("\n") == 1


def test_a_dry_run_plans_for_the_gpus_asked(capsys, monkeypatch):
    monkeypatch.setattr(gc, "has_device_option", lambda: False)
    assert gc.main(["--dry-run", "--gpus", "4"], torch=fake_torch(0), runner=Fake({})) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPUs: 4 (4 planned, 0 visible);")
    assert "`python -m parasim run all --backend nccl --nproc 4 --json`" in out
    assert "nccl --nproc 8" not in out


def test_the_shell_script_dry_run_with_a_fake_torch_on_the_path(tmp_path):
    """bash scripts/gpu_check.sh --dry-run, its Python given a torch package whose cuda says one GPU."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "__version__ = '0.0+fake'\nfrom types import SimpleNamespace as _N\nversion = _N(cuda='12.9')\n"
        "cuda = _N(is_available=lambda: True, device_count=lambda: 1, get_device_name=lambda i: 'Fake GPU',\n"
        "          nccl=_N(version=lambda: (2, 1, 0)))\n")
    env = {**os.environ, "PYTHON": PY, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "GPUs: 1 (Fake GPU); torch 0.0+fake, CUDA 12.9, NCCL 2.1.0"
    assert "| lesson collectives | nccl | cuda | 1 | not run (dry run) | #2 |" in lines
    assert "- #2 (not run): `python -m parasim run all --backend nccl --nproc 1 --json`" in lines


def test_a_command_past_its_limit_is_ended_with_its_children(tmp_path):
    pid_file = tmp_path / "child"
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(c.pid))\ntime.sleep(60)\n")
    t = time.monotonic()
    got = gc.run_command([PY, "-c", code], {}, 2)
    assert got.code == 124 and "stopped after 2 s" in got.stderr and time.monotonic() - t < 55  # not its 60 s sleep
    child = int(pid_file.read_text())
    for _ in range(50):  # the killed child may stay a zombie until its new parent reaps it: not running
        state = Path(f"/proc/{child}/stat")
        if not state.exists() or state.read_text().split(") ")[1][0] in "ZX":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child} still running")


# ---------------------------------------------------------------------------------------------
# The programs it runs, on virtual ranks

def test_every_call_on_three_virtual_ranks_gives_the_closed_forms(monkeypatch):
    monkeypatch.setenv(gp.EXPECT, "cuda")  # numpy arrays have no device type: virtual ranks pass the guard
    res = parasim.run(gp.every_call, 3)
    base = np.arange(1.0, 9.0)
    total = base * 111  # ranks hold base * 1, * 10, * 100
    v0, v2 = res.values[0], res.values[2]
    assert [a.tolist() for a in v0["all_reduce"]] == [total.tolist(), (base * 100).tolist(), total.tolist()]
    assert v2["reduce_scatter"].tolist() == [555.0, 666.0]  # (5, 6) of 1..6 summed over the ranks
    assert v0["all_gather"].tolist() == (np.concatenate([base, base * 10, base * 100])).tolist()
    assert [c.tolist() for c in v2["all_to_all"]] == [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]
    assert v0["broadcast"].tolist() == (base * 100).tolist()
    assert v2["reduce"].tolist() == total.tolist() and v0["reduce"] is None  # to the last rank only
    assert [res.values[r]["scatter"].tolist() for r in range(3)] == [[100.0, 200.0], [300.0, 400.0], [500.0, 600.0]]
    assert v0["send_recv"].tolist() == (base * 100).tolist()  # from the previous rank, 2
    assert [res.values[r]["barrier"] for r in range(3)] == [0, 1, 2]


def test_the_device_guard_refuses_tensors_elsewhere(monkeypatch):
    torch = pytest.importorskip("torch")
    ctx = SimpleNamespace(rank=0, asarray=lambda v: torch.tensor(v))
    monkeypatch.setenv(gp.EXPECT, "cuda")
    with pytest.raises(RuntimeError, match="rank 0: tensors are on cpu, not on cuda"):
        gp._data(ctx)
    monkeypatch.setenv(gp.EXPECT, "cpu")
    assert gp._data(ctx).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def test_bf16_sum_rounds_where_float32_does_not():
    pytest.importorskip("ml_dtypes")
    res = parasim.run(gp.bf16_sum, 4)
    bf16, fp32 = np.asarray(res.values[0]["bf16"], dtype=np.float64), np.asarray(res.values[0]["fp32"], dtype=np.float64)
    exact = np.array([4 + 6 / 64, 1024 + 6, 4 * 0.333984375, -30.0])  # sums over ranks 0..3, worked by hand
    assert fp32.tolist() == exact.tolist()  # float32 holds every one of these sums
    # 1030 needs 10 significant bits and bf16 has 8: near 1024 its step is 8, so 1024 or 1032, whatever order
    # the ranks add in; 4 + 6/64 and -30 it holds exactly
    assert bf16[1] in (1024.0, 1032.0) and bf16[0] == exact[0] and bf16[3] == exact[3]

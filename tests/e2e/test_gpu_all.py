"""scripts/gpu_all.sh (the one prepared call on a lent GPU machine) on CPU: its dry run prints the commands in
order with the budgets split as its header says, and a run with every command faked installs the wheels,
runs the check and the sweep with those budgets, leaves their outputs under $OUT and exits with their status."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_all.sh"


def dry(*args, out=None):
    env = {**os.environ, "PYTHON": "python3"}
    env.pop("OUT", None)
    if out is not None:
        env["OUT"] = out
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def split(total):
    """The budgets, worked out from the rule the script's header states."""
    rest = total - 30
    check = rest * 55 // 100
    return {"check": check, "each": min(180, check), "check_hard": check + 30,
            "kernels": rest - (check + 30) - 20, "kernels_hard": rest - (check + 30)}


@pytest.mark.parametrize("total", [540, 300, 570])
def test_the_dry_run_prints_every_command_in_order_with_its_budget(total):
    b = split(total)
    assert 30 + b["check_hard"] + b["kernels_hard"] == total  # the hard limits fill the call's budget exactly
    out = dry() if total == 540 else dry("--budget", str(total), out="/tmp/lent/out")
    where = "gpu-out" if total == 540 else "/tmp/lent/out"
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"gpu_all: --budget {total} s: install 30 s, gpu_check {b['check']} s (+30 s to stop), gpu_kernels "
        f"{b['kernels']} s (+20 s to stop)",
        "1. timeout -k 5 30 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl"
        "   (only when greenlet or array_api_compat does not import)",
        f"2. PYTHONPATH=/tmp/site:. timeout -k 5 {b['check_hard']} bash scripts/gpu_check.sh --budget {b['check']} "
        f"--each {b['each']} --out {where}/gpu-table.md",
        f"3. PYTHONPATH=/tmp/site:. timeout -k 5 {b['kernels_hard']} python3 scripts/gpu_kernels.py --budget "
        f"{b['kernels']} --out {where}/gpu-kernels.json",
        f"outputs under {where}: gpu-table.md, gpu-kernels.json, gpu-check.log, gpu-kernels.log, nvidia-smi.txt"]


def test_the_docs_name_the_default_budgets():
    """docs/gpu.md's run command and its words agree with the script's default split."""
    b = split(540)
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert "bash scripts/gpu_all.sh" in docs
    assert f"gpu_check {b['check']} s" in docs and f"gpu_kernels {b['kernels']} s" in docs


@pytest.mark.parametrize("args, words", [(["--budget", "9000"], "--budget takes whole seconds from 240 to 570, got '9000'"),
                                         (["--budget", "4.5"], "--budget takes whole seconds from 240 to 570, got '4.5'"),
                                         (["--budget"], "--budget needs a number of seconds"),
                                         (["--now"], "unknown argument '--now'")],
                         ids=["too-long", "not-whole", "missing", "unknown"])
def test_bad_flags_are_one_line_and_exit_2(args, words):
    out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith(f"gpu_all: {words}") and out.stderr.count("\n") == 1
    assert out.stdout == ""


def _fake_checkout(tmp_path: Path, check_status: int) -> tuple[Path, Path, dict]:
    """A copy of gpu_all.sh in a checkout whose Python and gpu_check.sh only write down how they were called."""
    repo, log = tmp_path / "repo", tmp_path / "calls.log"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "gpu_all.sh")
    (repo / "scripts" / "gpu_check.sh").write_text(
        f'echo "check $*" >> "$LOG"\necho "| table |"\nexit {check_status}\n')
    python = tmp_path / "python3"
    python.write_text('#!/bin/bash\necho "python $*" >> "$LOG"\ncase "$*" in *"import greenlet"*) exit 1;; esac\n'
                      'echo "kernels done"\nexit 0\n')
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "LOG": str(log), "PYTHON": str(python), "OUT": str(tmp_path / "out")}
    return repo, log, env


def test_a_run_installs_the_wheels_then_runs_the_check_and_the_sweep(tmp_path):
    repo, log, env = _fake_checkout(tmp_path, check_status=1)
    (repo / ".whl").mkdir()
    for name in ("greenlet-3.5.6-cp312-cp312-manylinux_2_28_x86_64.whl", "array_api_compat-1.16.0-py3-none-any.whl"):
        (repo / ".whl" / name).write_text("")
    out = subprocess.run(["bash", str(repo / "scripts" / "gpu_all.sh")], capture_output=True, text=True, env=env,
                         timeout=120)
    b, outdir = split(540), env["OUT"]
    assert out.returncode == 1, out.stderr  # the check's status: one of its rows failed
    assert log.read_text().splitlines() == [
        "python -c import greenlet, array_api_compat",
        "python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "
        ".whl/array_api_compat-1.16.0-py3-none-any.whl .whl/greenlet-3.5.6-cp312-cp312-manylinux_2_28_x86_64.whl",
        f"check --budget {b['check']} --each {b['each']} --out {outdir}/gpu-table.md",
        f"python scripts/gpu_kernels.py --budget {b['kernels']} --out {outdir}/gpu-kernels.json"]
    assert (Path(outdir) / "gpu-check.log").read_text() == "| table |\n"
    assert (Path(outdir) / "gpu-kernels.log").read_text() == "kernels done\n"
    assert "gpu_all: gpu_check exited 1" in out.stdout and "gpu_all: gpu_kernels exited 0" in out.stdout


def test_without_the_wheels_it_stops_in_one_line(tmp_path):
    repo, log, env = _fake_checkout(tmp_path, check_status=0)
    out = subprocess.run(["bash", str(repo / "scripts" / "gpu_all.sh")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no .whl/*.whl here" in out.stderr
    assert [x for x in log.read_text().splitlines() if x.startswith("check")] == []

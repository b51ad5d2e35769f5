"""Issue 52: the package is linted (ruff, pyproject.toml's rules) and formatted (ruff format), and the packages issue 52 lists (clock, comm,
engine, layout, nn, pipeline) type-check (mypy), in the suite, so CI runs both. A model's size that may be
unknown is read through `ModelSpec.size`, which names what the model lacks; the sizes a Layout derives are ints
once it is made."""
import subprocess
import sys
from pathlib import Path

import parasim

REPO = Path(parasim.__file__).parent.parent
LINTED = ("parasim", "lessons", "tests", "scripts", "benchmarks", "examples")
TYPED = ("parasim/clock", "parasim/comm", "parasim/engine", "parasim/job", "parasim/layout", "parasim/nn", "parasim/pipeline")


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    out = _run("ruff", "check", "--no-cache", *LINTED)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_package_is_formatted():
    out = _run("ruff", "format", "--check", "--no-cache", "parasim")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_mypy_passes_on_the_typed_packages():
    out = _run("mypy", "--no-incremental", "--cache-dir=/dev/null", *TYPED)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_both_find_what_they_are_for(tmp_path):
    """The three checks can fail: an unused import and a mutable default are found by the repository's rules,
    the same file's cramped layout by the formatter, a wrong argument type by mypy."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f(x: int, seen: list = []) -> int:\n    return x\n\n\n"
                                     "f('one')\n")
    lint = _run("ruff", "check", "--no-cache", "bad.py", cwd=tmp_path)
    assert lint.returncode == 1 and "F401" in lint.stdout and "B006" in lint.stdout
    layout = _run("ruff", "format", "--check", "--no-cache", "bad.py", cwd=tmp_path)
    assert layout.returncode == 1 and "bad.py" in layout.stdout
    types = _run("mypy", "--no-incremental", "--cache-dir=/dev/null", "bad.py", cwd=tmp_path)
    assert types.returncode == 1 and "arg-type" in types.stdout

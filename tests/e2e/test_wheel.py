"""The wheel works anywhere: `python -m build` makes one that holds every lesson, the app's styles and the
package's data files, whose metadata `twine check` passes, and which, installed apart from the checkout and
run from a folder outside it, lists and runs the lessons, paints the app and runs real gloo ranks.

The wheel is built once for the module (`--no-isolation`: offline, with the hatchling installed here) and
installed with `pip install --no-deps --target`: the dependencies are the ones this environment has, so
nothing is downloaded. Every command runs with that folder first on PYTHONPATH and its cwd outside the
checkout, so a path worked out from the repository (or the current folder) would fail here."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]  # the checkout
LESSONS = sorted(p.name for p in (ROOT / "lessons").glob("*.py") if not p.name.startswith("_"))


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    missing = _missing("build", "hatchling")
    if missing:
        pytest.skip(f"building the wheel needs {' and '.join(missing)} (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("parasim-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, Path]:
    """(site, outside): the wheel installed into `site` without its dependencies, and an empty folder to
    run from."""
    if _missing("pip"):
        pytest.skip("installing the wheel needs pip")
    base = tmp_path_factory.mktemp("installed")
    site, outside = base / "site", base / "elsewhere"
    outside.mkdir()
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
                           "--disable-pip-version-check", "--no-index", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return site, outside


def _run(installed: tuple[Path, Path], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """ARGS (after the interpreter) with the installed wheel first on the path, from outside the checkout."""
    site, outside = installed
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=outside,
                          env=env)


def test_the_wheel_holds_the_lessons_the_styles_and_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"parasim/lessons/{n}" for n in LESSONS} <= names
    assert "parasim/tui/parasim.tcss" in names
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "parasim").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert package <= names, f"not in the wheel: {sorted(package - names)}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "parasim = parasim.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_twine_check_passes(wheel):
    if _missing("twine"):
        pytest.skip("twine is not installed (pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_installed_package_is_the_wheels_and_lists_every_lesson(installed):
    site, _ = installed
    where = _run(installed, "-c", "import parasim; print(parasim.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve().is_relative_to(site.resolve())  # not the editable checkout
    listed = _run(installed, "-m", "parasim", "lesson", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    names = [l["name"] for l in json.loads(listed.stdout)]
    assert sorted(n.replace("-", "_") + ".py" for n in names) == LESSONS
    script = site / "bin" / "parasim"  # the console script pip wrote, run by this interpreter
    if script.exists():
        plain = _run(installed, str(script), "lesson", "--list")
        assert plain.returncode == 0 and all(n in plain.stdout for n in names), plain.stderr
    bad = _run(installed, "-m", "parasim", "lesson", "no-such-lesson", "--plain")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("name", ["tp-mlp", "checkpoint"])
def test_a_lesson_runs_from_the_installed_package(installed, name):
    done = _run(installed, "-m", "parasim", "lesson", name, "--plain")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert f"parasim/lessons/{name.replace('-', '_')}.py:" in done.stdout  # call sites in the wheel's lesson
    assert str(ROOT) not in done.stdout + done.stderr


PAINT = """
import asyncio, parasim
from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.view import View
lr = run_lesson(get_lesson("tp-mlp"))
app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title, tables=list(lr.tables)))
async def main():
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        print(parasim.__file__)
        print(*[str(p) for p in app.css_path], sep=",")
        print(*sorted({path for path, _ in app.stylesheet.source}), sep=",")
        print("timeline" in app.export_screenshot())
asyncio.run(main())
"""


def test_the_app_paints_with_the_wheels_styles(installed):
    site, _ = installed
    done = _run(installed, "-c", PAINT)
    assert done.returncode == 0, done.stdout + done.stderr
    package, css, sources, painted = done.stdout.strip().splitlines()[-4:]
    tcss = str(site / "parasim" / "tui" / "parasim.tcss")
    assert package.startswith(str(site)) and css == tcss and tcss in sources.split(",")
    assert painted == "True"


def test_real_gloo_ranks_run_from_the_installed_package(installed):
    if _missing("torch"):
        pytest.skip("real ranks need torch (pip install -e '.[torch]')")
    done = _run(installed, "-m", "parasim", "run", "collectives", "--backend", "gloo", timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "MATCH" in done.stdout


def test_the_wheel_carries_its_license(wheel):
    """Issue 54: the package claims MIT, so it ships the license: a PEP 639 expression and the LICENSE file."""
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and any(n.endswith("licenses/LICENSE") for n in names)


def test_the_sdist_carries_the_license_and_readme_s_pictures(tmp_path):
    """The source distribution holds LICENSE and every picture README shows (README's links are relative: the
    package index cannot show them, and README says where they are)."""
    import re
    import tarfile

    missing = _missing("build", "hatchling")
    if missing:
        pytest.skip(f"building the sdist needs {' and '.join(missing)} (pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (sdist,) = tmp_path.glob("parasim-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    readme = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert "LICENSE" in names and pictures and [p for p in pictures if p not in names] == []
    assert "pictures in this README are files of the repository" in " ".join(readme.split())

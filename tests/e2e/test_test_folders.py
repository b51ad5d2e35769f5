"""The suite's folders (docs/testing.md, "Where the tests live"): every test file sits in a folder the page
names, a unit folder is named after a package of parasim, file names are unique across folders (pytest imports
each test file by its name alone), and every path the page's tables give is there."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PAGE = (ROOT / "docs" / "testing.md").read_text()
TOP = {"unit", "refs", "lessons", "faults", "e2e", "helpers", "data"}


def _section() -> str:
    start = PAGE.index("## Where the tests live")
    return PAGE[start:PAGE.index("\n## ", start + 1)]


def test_every_test_file_is_in_a_folder_the_page_names():
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        parts = path.relative_to(TESTS).parts
        if len(parts) < 2 or parts[0] not in TOP - {"helpers", "data"}:
            misplaced.append(str(path.relative_to(ROOT)))
        elif parts[0] == "unit" and (len(parts) != 3 or not (ROOT / "parasim" / parts[1]).is_dir()):
            misplaced.append(str(path.relative_to(ROOT)))
        elif parts[0] != "unit" and len(parts) != 2:
            misplaced.append(str(path.relative_to(ROOT)))
    assert misplaced == []
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))} <= TOP
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["conftest.py"]


def test_helpers_hold_no_tests_and_names_are_unique():
    assert list((TESTS / "helpers").glob("test_*.py")) == []
    names = Counter(p.name for p in TESTS.rglob("*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_every_unit_folder_and_path_the_page_gives_is_there():
    section = _section()
    units = sorted(p.name for p in (TESTS / "unit").iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert units and all(f"`tests/unit/{u}/`" in section for u in units), units
    named = re.findall(r"`(tests/[\w/.]+)`", section)
    assert len(named) > 30
    assert [n for n in named if "<" not in n and not (ROOT / n).exists()] == []
    for folder in TOP:
        assert f"`tests/{folder}/`" in section or folder == "unit"

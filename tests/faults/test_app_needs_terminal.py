"""The app reads keys from a terminal: asked for without one (stdin and stdout redirected) it would wait
for ever. Each way of asking for it is refused in one line, exit 2, before any work; a command that opens
the app only by default prints text instead."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ASKED = [
    (["trace", "--app"], "--app opens the app, which needs a terminal"),
    (["trace", "--symbolic", "--layout", "deepseek-v3", "--routing", "balanced", "--app"],
     "--app opens the app, which needs a terminal"),
    (["lesson", "tp-mlp", "--tui"], "--tui opens the app, which needs a terminal"),
    (["check", "silent-bugs", "--tui"], "--tui opens the app, which needs a terminal"),
]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TEXTUAL_DRIVER"}


@pytest.mark.parametrize("argv,words", ASKED, ids=[" ".join(a) for a, _ in ASKED])
def test_the_app_without_a_terminal_is_refused_in_one_line(argv, words):
    got = subprocess.run([sys.executable, "-m", "parasim", *argv], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60, env=_env())
    assert got.returncode == 2
    assert got.stderr.count("\n") == 1 and words in got.stderr, got.stderr


def test_a_program_viewed_without_a_terminal_prints_its_walk_through(tmp_path):
    (tmp_path / "p.py").write_text("def prog(ctx):\n    return ctx.comm.all_reduce(ctx.xp.ones(2))\n")
    got = subprocess.run([sys.executable, "-m", "parasim", "view", "p.py:prog", "--world", "2"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=_env())
    assert got.returncode == 0, got.stderr
    assert "all_reduce" in got.stdout

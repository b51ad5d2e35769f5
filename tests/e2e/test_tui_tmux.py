"""The app in a real terminal: `python -m parasim lesson tp-mlp` in a detached tmux session of 100x30 (the
smallest size the app is laid out for),
driven with send-keys and read with capture-pane. Plus: piped to another program, the same command prints
the plain walk-through and no escape codes. The tmux test is skipped where tmux is not installed."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 100, 30


def _tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10, check=check)


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-t", session, "-p").stdout


def _wait_for(session: str, predicate, timeout: float = 15.0) -> str:
    """Poll the pane until predicate(screen) holds; return the last screen either way."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    return screen


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_app_in_tmux(tmp_path):
    session = f"parasim-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rc_file = tmp_path / "rc"
    app_cmd = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "parasim", "lesson", "tp-mlp"))
    # the pane runs the app, then writes its exit code; `sleep` keeps the pane alive to be read after a crash
    shell = (f"cd {shlex.quote(str(ROOT))} && TERM=xterm-256color COLORTERM=truecolor {app_cmd}; "
             f"echo $? > {shlex.quote(str(rc_file))}; sleep 30")
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("TMUX", None)  # works when the tests themselves run inside tmux
    for name in ("COLUMNS", "LINES"):  # pytest-xdist's workers set 80 x 24, which the app would take over tmux's
        env.pop(name, None)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), shell],
                   env=env, check=True, timeout=10)
    try:
        # every panel painted, not only the first ones (a loaded machine paints in several frames)
        screen = _wait_for(session, lambda s: "timeline" in s and "event 1/" in s and "[1 2 2 2]" in s
                           and "splitting A by rows" in s and "? help  q quit" in s)
        assert "timeline" in screen, f"the app did not start within 15 s; the screen:\n{screen}"
        assert "selected event" in screen, screen
        assert "[1 2 2 2]" in screen, screen  # the first all-reduce: rank values, replicated after it
        assert "splitting A by rows" in screen, screen  # the narrative's heading of the first phase
        assert "z quiz  ? help" in screen, screen  # the footer's keys
        events = int(screen.split("event 1/", 1)[1].split()[0])  # the lesson's event count, as the app says it

        for _ in range(events - 1):
            _tmux("send-keys", "-t", session, "Right")
            time.sleep(0.2)
        screen = _wait_for(session, lambda s: f"event {events}/{events}" in s, timeout=5)
        assert f"event {events}/{events}" in screen, screen
        assert "backward" in screen, screen  # the last event's phase

        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (rc_file.exists() and rc_file.read_text().strip()):
            time.sleep(0.1)
        assert rc_file.exists(), f"the app did not quit on q; the screen:\n{_screen(session)}"
        assert rc_file.read_text().strip() == "0", _screen(session)
    finally:
        _tmux("kill-session", "-t", session, check=False)


def test_piped_output_is_plain_text():
    proc = subprocess.run(f"{shlex.quote(sys.executable)} -m parasim lesson tp-mlp | cat", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TERM": "xterm-256color"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b" not in out
    assert "splitting A by rows" in out
    assert "== splitting A by rows ==" in out
    assert "all_reduce" in out
    assert "[[[1, 2, 2, 2]]]" in out  # rank values of the first all-reduce

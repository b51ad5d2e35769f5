"""`parasim serve`: bad input refused in one line before any server starts; the server on 127.0.0.1 only by
default, its page needing nothing from the network, websockets only for its own page, Ctrl-C ending it
cleanly; and a real browser (headless Chromium) that steps through tp-mlp and reads the all-reduce's values
from the page. Every connection goes to 127.0.0.1."""
from __future__ import annotations

import importlib.util
import re
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import cli

ROOT = Path(__file__).resolve().parents[2]


def _helpers():
    """scripts/serve_screenshot.py: the server and browser helpers the README's screenshot is made with."""
    spec = importlib.util.spec_from_file_location("serve_screenshot", ROOT / "scripts" / "serve_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _not_a_trace(tmp_path: Path) -> str:
    path = tmp_path / "t.json"
    path.write_text("{}")
    return str(path)


BAD = [
    (["serve"], "nothing to serve: give a lesson NAME, --view TRACE.json, --trace ARGS or --memory ARGS"),
    (["serve", "--memory", "--model 27b --tp 5"], "heads 48 do not divide by tp 5"),
    (["serve", "--memory", "--model 27b --bogus"], "arguments parasim memory does not take: --bogus"),
    (["serve", "--memory", "--model \"27b"], "No closing quotation"),
    (["serve", "no-such-lesson"], "unknown lesson 'no-such-lesson'"),
    (["serve", "tp-mlp", "--world", "4"], "--world is for a program given as file.py:function"),
    (["serve", "tp-mlp", "--view", "t.json"], "give one of NAME, --view, --trace and --memory, not NAME and --view"),
    (["serve", "--view", "/no/such/trace.json"], "cannot read trace /no/such/trace.json"),
    (["serve", "--view", "{not_a_trace}"], "not a parasim trace"),
    (["serve", "--view", "examples/x.py:fn"], "--view takes a saved trace"),
    (["serve", "--trace", "--tp 3 --token contract"], "do not divide by tp 3"),
    (["serve", "--trace", "--tp 2 --bogus"], "arguments parasim trace does not take: --bogus"),
    (["serve", "--trace", "--tp two --sp"], "argument --tp: expected a positive integer"),
    (["serve", "--trace", "--token \"contract"], "No closing quotation"),
    (["serve", "tp-mlp", "--port", "0"], "argument --port: expected a positive integer up to 65,535"),
    (["serve", "tp-mlp", "--port", "65536"], "65,536 is more than the limit of 65,535"),
    (["serve", "tp-mlp", "--port", "http"], "argument --port: expected a positive integer"),
    # an address of no interface here (TEST-NET-1): bind fails without a packet sent or a name looked up
    (["serve", "tp-mlp", "--host", "192.0.2.1", "--port", "8000"], "cannot listen on 192.0.2.1 port 8000"),
    # a name is never looked up (tests/e2e/test_serve_guard.py: nor is anything else)
    (["serve", "tp-mlp", "--host", "example.com"], "--host 'example.com': not an IP address"),
    (["serve", "tp-mlp", "--max-apps", "65"], "65 is more than the limit of 64"),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(args, says, tmp_path):
    args = [a.replace("{not_a_trace}", _not_a_trace(tmp_path)) for a in args]
    r = cli(*args)
    assert r.returncode == 2, r
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert says in r.stderr


def test_a_port_in_use_is_refused_before_serving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = cli("serve", "tp-mlp", "--port", str(port))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"parasim: error: cannot listen on 127.0.0.1 port {port}: in use: give another with --port\n"


def test_help_reads_at_100_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    r = cli("serve", "--help")
    assert r.returncode == 0 and r.stderr == ""
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    for says in ("--view TRACE.json", "--trace ARGS", "default 127.0.0.1", "default 8000", "Ctrl-C", "--max-apps N",
                 "default 8", "a name is not looked up"):
        assert says in r.stdout
    assert "--open-app" not in r.stdout  # the app process's own flag is not the user's


def _listeners(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* write them) of sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1, never a proxy
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc/net/tcp")
def test_serves_on_loopback_only_a_page_that_needs_no_network_and_ends_on_ctrl_c(tmp_path):
    h = _helpers()
    port = h.free_port()
    base = f"http://127.0.0.1:{port}"
    with h.served(["tp-mlp", "--port", str(port)], tmp_path / "serve.log") as proc:
        assert _listeners(port) == ["0100007F"]  # 127.0.0.1 and nothing else: no 0.0.0.0, no IPv6
        status, page = _get(f"{base}/")
        assert status == 200
        assert f'data-session-websocket-url="ws://127.0.0.1:{port}/ws"' in page
        fetched = re.findall(r"(?:href|src|url)\(?=?\"?(https?://[^\"')]+)", page)
        assert fetched and all(u.startswith(f"{base}/static/") for u in fetched), fetched
        assert [u for u in re.findall(r"https?://[^\s\"')]+", page)
                if not u.startswith((base, "http://www.w3.org/"))] == []  # no font or script from elsewhere
        assert "fonts.googleapis" not in page and "RobotoMono" in page
        assert _get(f"{base}/static/fonts/RobotoMono-VariableFont_wght.ttf")[0] == 200
        # a websocket starts a process: another site's page, or a DNS name rebound to 127.0.0.1, gets none
        assert _get(f"{base}/ws", {"Origin": "http://elsewhere.example"})[0] == 403
        assert _get(f"{base}/ws", {"Host": f"rebound.example:{port}",
                                   "Origin": f"http://rebound.example:{port}"})[0] == 403
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    log = (tmp_path / "serve.log").read_text()
    assert log == f"parasim: serving parasim lesson tp-mlp at {base}/ - open it in a browser (Ctrl-C to stop)\n"


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_a_browser_steps_through_tp_mlp_and_reads_the_all_reduce(tmp_path):
    """Headless Chromium opens the served page, presses the right arrow until the forward all-reduce 'g
    forward' is selected, and reads from the page what each rank held before and after it: the partial
    products Y_i·B_i = [1 2] and [1 1] of the post's example, summed to Z = [2 3] on both ranks (as
    `parasim lesson tp-mlp --plain` prints them). Ctrl-C then ends the server and the app it started."""
    h = _helpers()
    if (why := h.missing()) is not None:
        pytest.skip(f"no browser for this test: {why}")
    port = h.free_port()
    with h.served(["tp-mlp", "--port", str(port)], tmp_path / "serve.log") as proc, h.browser() as driver:
        first = h.open_app(driver, port)
        assert "#0  step 1  all_reduce" in first and "'wrong: each rank's ReLU, then the sum'" in first
        seen = [h.event_number(first)]
        text = first
        while "'g forward'" not in text:
            text = h.step(driver)
            seen.append(h.event_number(text))
        assert seen == [1, 2, 3, 4, 5]  # two all-reduces of the wrong split, two ranks' compute, then g
        assert "#4  step 4  all_reduce" in text and "group tp [0, 1]" in text
        assert "each rank sent 16 B and received 16 B" in text
        holds = [re.sub(r"\s+", " ", m) for m in re.findall(r"rank \d (?:in|out) +float64\S* +[a-z ]+\[[^\]]*\]", text)]
        assert holds == ["rank 0 in float64[1,1,2] partial sum [1 2]", "rank 0 out float64[1,1,2] replicated [2 3]",
                         "rank 1 in float64[1,1,2] partial sum [1 1]", "rank 1 out float64[1,1,2] replicated [2 3]"]
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert fetched and all(u.startswith(f"http://127.0.0.1:{port}/") for u in fetched), fetched
        apps = _children(proc.pid)
        assert len(apps) == 1  # this tab's app
        proc.send_signal(signal.SIGINT)  # the browser still connected
        assert proc.wait(10) == 0
        h.wait_for("the page to say its session ended",
                   lambda: "-closed" in driver.execute_script("return document.body.className"), 5)
    assert not any(Path(f"/proc/{pid}").exists() for pid in apps)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and log.count("\n") == 1, log


@pytest.mark.slow
def test_a_tab_past_max_apps_shows_why(tmp_path):
    """`--max-apps 1`: the first tab gets its app; a second tab's page says why it has none (the reason the
    server closed its websocket with) in its "Session ended" dialog, and no second app starts."""
    h = _helpers()
    if (why := h.missing()) is not None:
        pytest.skip(f"no browser for this test: {why}")
    port = h.free_port()
    with h.served(["tp-mlp", "--port", str(port), "--max-apps", "1"], tmp_path / "serve.log") as proc, \
            h.browser() as driver:
        h.open_app(driver, port)
        assert len(_children(proc.pid)) == 1
        driver.switch_to.new_window("tab")
        driver.get(f"http://127.0.0.1:{port}/")
        said = h.wait_for("the second tab to say why its session ended", lambda: driver.execute_script(
            "return document.body.classList.contains('-closed') && "
            "document.querySelector('.closed-dialog .message').textContent"), 10)
        assert said == "Session ended: try again later: this server already runs 1 app (--max-apps)"
        assert len(_children(proc.pid)) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and log.count("\n") == 2, log  # where it serves, and the tab refused


def test_each_tab_runs_the_command_that_opens_the_app(tmp_path):
    """What textual-serve runs per browser tab: parasim itself under this interpreter, with the flag that
    opens the app although stdout is a pipe, and `exec`, so that ending the process ends the app."""
    import argparse
    import shlex
    import sys

    from parasim.cli.serve import app_command

    trace = tmp_path / "t.json"
    assert cli("lesson", "tp-mlp", "--trace", str(trace), "--json").returncode == 0
    base = dict(name=None, view=None, trace=None, memory=None, world=None, quiz=False)
    python = ["exec", sys.executable, "-m", "parasim"]
    for given, words, title in (
            ({"name": "tp-mlp"}, ["lesson", "tp-mlp", "--tui"], "parasim lesson tp-mlp"),
            ({"view": str(trace)}, ["serve", "--view", str(trace), "--open-app"], f"parasim view {trace}"),
            ({"trace": "--tp 2 --sp --token 'the'"}, ["trace", "--tp", "2", "--sp", "--token", "the", "--app"],
             "parasim trace --tp 2 --sp --token 'the'"),
            ({"memory": "--model 27b --tp 8 --sp"}, ["memory", "--model", "27b", "--tp", "8", "--sp", "--app"],
             "parasim memory --model 27b --tp 8 --sp --app")):
        command, shown = app_command(argparse.Namespace(**{**base, **given}))
        assert shlex.split(command) == python + words and shown == title


@pytest.mark.slow
def test_a_browser_opens_a_saved_trace(tmp_path):
    """`parasim serve --view TRACE.json`: the page shows the app over the saved trace, the lesson's title and
    narrative found from the trace as `parasim view` finds them; closing the tab ends its app."""
    h = _helpers()
    if (why := h.missing()) is not None:
        pytest.skip(f"no browser for this test: {why}")
    trace = tmp_path / "t.json"
    assert cli("lesson", "tp-mlp", "--trace", str(trace), "--json").returncode == 0
    port = h.free_port()
    with h.served(["--view", str(trace), "--port", str(port)], tmp_path / "serve.log") as proc, \
            h.browser() as driver:
        first = h.open_app(driver, port)
        assert "Tensor parallelism: the MLP split by columns, then rows" in first
        assert "event 1/6" in first and "'wrong: each rank's ReLU, then the sum'" in first
        assert "splitting A by rows" in first
        apps = _children(proc.pid)
        assert len(apps) == 1
        page = driver.current_window_handle
        driver.switch_to.new_window("tab")  # the browser stays open while the page's tab is closed
        driver.switch_to.window(page)
        driver.close()
        driver.switch_to.window(driver.window_handles[0])
        h.wait_for("the app to end with its tab", lambda: _children(proc.pid) == [], 10)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_a_browser_moves_the_live_estimator(tmp_path):
    """`parasim serve --memory "--model 27b --tp 8 --sp"`: the page shows the estimator at TP 8; three presses of
    the down arrow pick TP and the right arrow moves it to 16, and the page redraws the layout and its fit."""
    h = _helpers()
    if (why := h.missing()) is not None:
        pytest.skip(f"no browser for this test: {why}")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    port = h.free_port()
    with h.served(["--memory", "--model 27b --tp 8 --sp --seq 8192", "--port", str(port)], tmp_path / "serve.log") \
            as proc, h.browser() as driver:
        driver.get(f"http://127.0.0.1:{port}/")
        first = h.wait_for("the estimator in the page", lambda: "TP8 + SP on 8 GPUs" in (s := h.screen(driver)) and s)
        assert "the live estimator" in first and "usable on an H200: fits" in first
        keys = driver.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea")
        for key in (Keys.ARROW_DOWN, Keys.ARROW_DOWN, Keys.ARROW_DOWN, Keys.ARROW_RIGHT):
            keys.send_keys(key)
        moved = h.wait_for("TP 16 on the page", lambda: "TP16 + SP on 16 GPUs" in (s := h.screen(driver)) and s, 20)
        assert "fits" in moved
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert "Traceback" not in (tmp_path / "serve.log").read_text()

"""Screenshot of the app in a web browser, for README: `parasim serve tp-mlp` on a free port of 127.0.0.1,
headless Chromium (Debian's chromium and chromium-driver, driven by Selenium), the lesson stepped to the
forward all-reduce ('g forward'), the page saved as a PNG.

    python scripts/serve_screenshot.py [--out docs/images/serve-tp-mlp.png] [--size 1200x800]

tests/e2e/test_serve.py drives the browser with the helpers below. The page's text is read from xterm.js's own
buffer: textual-serve's script keeps its Terminal inside a closure, so a script that runs before the page's
(HOOK) catches the Terminal when the page stores it as `this.terminal`, and `screen` reads its rows.
Nothing leaves this machine: Selenium is given the driver's path (so Selenium Manager never runs or
downloads), and Chromium resolves no name and starts none of its background fetches.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOST = "127.0.0.1"

# Runs before the page's own script: the first object that stores a Terminal (xterm.js's public class: a
# buffer and an open method) as its `terminal` keeps it as an ordinary property, and the page's window
# gets a reference to it.
HOOK = """
Object.defineProperty(Object.prototype, "terminal", {configurable: true, set(value) {
  Object.defineProperty(this, "terminal", {value: value, writable: true, configurable: true, enumerable: true});
  if (value && value.buffer && typeof value.open === "function" && !window.parasimTerminal) {
    window.parasimTerminal = value;
  }
}});
"""
# The terminal's visible rows as text, one line each (null until the page has made its Terminal).
READ = """
const t = window.parasimTerminal;
if (!t) { return null; }
const rows = [];
for (let y = 0; y < t.rows; y++) {
  const line = t.buffer.active.getLine(t.buffer.active.viewportY + y);
  rows.push(line ? line.translateToString(true) : "");
}
return rows.join("\\n");
"""
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-default-apps", "--disable-extensions",
    # no proxy, and every name but 127.0.0.1 fails to resolve: the page cannot reach anything else
    "--no-proxy-server", f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {HOST}",
)


def missing() -> str | None:
    """Why the browser cannot run here (no chromium or chromedriver), or None."""
    absent = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if absent:
        return f"{' and '.join(absent)} not installed (apt-get install chromium chromium-driver)"
    return None


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], seconds: float = 15.0) -> Any:
    """`check()` until it gives something true (returned), or AssertionError naming `what` after `seconds`."""
    end = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"waited {seconds:g} s for {what}")
        time.sleep(0.05)


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
        return True
    return False


@contextlib.contextmanager
def served(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """`python -m parasim serve ARGS` running (its stdout and stderr in `log`) once its port takes
    connections; on the way out it is sent SIGINT, as Ctrl-C would, and killed if it has not ended in 10 s."""
    port = int(args[args.index("--port") + 1])
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "parasim", "serve", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(f"parasim serve to listen on port {port}", lambda: proc.poll() is not None or listening(port))
        if proc.poll() is not None:
            raise AssertionError(f"parasim serve ended with {proc.returncode}: {log.read_text()}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def browser(width: int = 1200, height: int = 800) -> Iterator[Any]:
    """Headless Chromium whose page is `width` x `height` CSS pixels, with HOOK installed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    # a driver path given: Selenium uses it and never starts Selenium Manager (which would download one)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOK})
        yield driver
    finally:
        driver.quit()


def screen(driver: Any) -> str:
    """The text the app shows now, read from the page's terminal ("" before there is one)."""
    return driver.execute_script(READ) or ""


def open_app(driver: Any, port: int) -> str:
    """Open the served page and wait for the app's first screen (its status line, 'event 1/N')."""
    driver.get(f"http://{HOST}:{port}/")
    return wait_for("the app's first screen in the page", lambda: "event 1/" in (s := screen(driver)) and s)


def event_number(text: str) -> int:
    """k of the status line's 'event k/N'."""
    import re
    found = re.search(r"event (\d+)/\d+", text)
    return int(found.group(1)) if found else 0


def step(driver: Any) -> str:
    """Press the right arrow in the page and wait until the app shows the next event."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    before = event_number(screen(driver))
    driver.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea").send_keys(Keys.ARROW_RIGHT)
    return wait_for(f"event {before + 1} after the right arrow",
                    lambda: event_number(s := screen(driver)) == before + 1 and s, 10)


def step_to(driver: Any, label: str, most: int = 50) -> str:
    """Step until the selected event is the one labelled `label`; the screen then."""
    text = screen(driver)
    for _ in range(most):
        if f"'{label}'" in text:
            return text
        text = step(driver)
    raise AssertionError(f"no event labelled {label!r} in {most} steps")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "serve-tp-mlp.png")
    parser.add_argument("--size", default="1200x800", help="the page's size in CSS pixels, WIDTHxHEIGHT")
    args = parser.parse_args()
    if (why := missing()) is not None:
        print(f"serve_screenshot: {why}", file=sys.stderr)
        return 1
    width, height = (int(n) for n in args.size.split("x"))
    port = free_port()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with served(["tp-mlp", "--port", str(port)], Path(tmp) / "serve.log"), browser(width, height) as driver:
            open_app(driver, port)
            step_to(driver, "g forward")
            time.sleep(0.5)  # the buffer holds the text a frame before the canvas shows it
            driver.save_screenshot(str(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`parasim serve` against what a browser (or another site's page in it) may send: the DNS-rebinding and
Origin guard decided from the address the socket is bound to (however --host spells it), the cap on apps
running at once, no app left running after Ctrl-C whatever state its tab was in, malformed requests
answered 400 in one log line, and --host taking IP addresses and localhost only, never a name to look up.

The servers are real `python -m parasim serve` processes and the clients real websockets (aiohttp's). Each
server's environment holds a marker of its own, which every app process it starts inherits: the apps are
found in /proc by it, and none may be left once the server has ended. Every connection goes to 127.0.0.1
or ::1."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import aiohttp
import pytest
from conftest import cli

from parasim.cli import serve
from parasim.comm.loopback import is_loopback
from parasim.tui import browser

ROOT = Path(__file__).resolve().parents[2]
MARK = "PARASIM_SERVE_TEST"

needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds a server's apps by their environment in Linux's /proc")


# -- in-process: the decisions ----------------------------------------------------------------------------
LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "::ffff:127.0.0.1", "::ffff:127.1.2.3", "[::1]",
            "::1%lo"]
NOT_LOOPBACK = ["10.0.0.1", "[127.0.0.1]", "192.168.1.1", "172.16.0.1", "169.254.1.1", "fe80::1", "fe80::1%eth0", "fc00::1", "0.0.0.0", "::",
                "8.8.8.8", "::ffff:10.0.0.1", "::ffff:192.168.1.1", "128.0.0.1", "localhost", "evil.example",
                "127.1", ""]  # 127.1 is how --host may spell it; the bound socket says 127.0.0.1


@pytest.mark.parametrize("address", LOOPBACK)
def test_a_loopback_address_is_loopback(address):
    assert is_loopback(address)


@pytest.mark.parametrize("address", NOT_LOOPBACK)
def test_a_private_or_public_address_or_a_name_is_not_loopback(address):
    assert not is_loopback(address)


@pytest.mark.parametrize("spelled,bound", [("127.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("0x7f.1", "127.0.0.1"),
                                           ("::ffff:127.0.0.1", "::ffff:127.0.0.1"), ("localhost", "127.0.0.1"),
                                           ("[::1]", "::1")])
def test_the_loopback_decision_is_the_bound_sockets(spelled, bound):
    """What is checked is the address the socket is bound to, whatever --host wrote: 127.1 binds 127.0.0.1."""
    family = socket.AF_INET6 if ":" in bound else socket.AF_INET
    try:
        sock = serve.bind(spelled, _free_port(bound, family))
    except serve.UsageError as exc:  # a machine without IPv6 (or without 127.0.0.2)
        pytest.skip(str(exc))
    with sock:
        assert sock.getsockname()[0] == bound and is_loopback(sock.getsockname()[0])


HOSTS = [  # a request's Host header: does it name this machine by loopback?
    ("localhost", True), ("localhost:8000", True), ("LocalHost:8000", True), ("127.0.0.1", True),
    ("127.0.0.1:8000", True), ("127.0.0.2:8000", True), ("[::1]:8000", True), ("[::1]", True), ("::1", True),
    ("[::ffff:127.0.0.1]:8000", True), ("[::ffff:7f00:1]:8000", True),
    ("evil.example", False), ("evil.example:8000", False), ("localhost.evil.example:8000", False),
    ("127.0.0.1.evil.example", False), ("10.0.0.1:8000", False), ("192.168.1.1", False), ("172.16.0.1:80", False),
    ("169.254.1.1:8000", False), ("[fe80::1]:8000", False), ("0.0.0.0:8000", False), ("[::]:8000", False),
    ("8.8.8.8:8000", False), ("127.1:8000", False), ("", False), ("[::1", False), ("[::1]x", False),
    ("[127.0.0.1]:8000", False), ("localhost:http", False), ("localhost:", True), ("localhost:80:80", False),
]


@pytest.mark.parametrize("host,loopback", HOSTS, ids=[h or "(empty)" for h, _ in HOSTS])
def test_which_host_headers_name_this_machine_by_loopback(host, loopback):
    assert browser.loopback_host(host) is loopback


@pytest.mark.parametrize("host,says", [("::1", "http://[::1]:8000/"), ("[::1]", "http://[::1]:8000/"), ("[127.0.0.1]", "http://[127.0.0.1]:8000/"),
                                       ("127.0.0.1", "http://127.0.0.1:8000/"), ("127.1", "http://127.0.0.1:8000/"),
                                       ("::ffff:127.0.0.1", "http://[::ffff:127.0.0.1]:8000/"),
                                       ("fe80::1", "http://[fe80::1]:8000/"), ("10.1.2.3", "http://10.1.2.3:8000/")])
def test_the_printed_address_can_be_opened(host, says):
    assert serve.url(host, 8000) == says


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::", "[::]", ""])
def test_every_interface_is_printed_as_the_machines_name(host):
    assert serve.url(host, 8000) == f"http://{socket.gethostname()}:8000/"


NAMES = ["example.com", "evil.example", "localhost.localdomain", "my-machine", "127.0.0.1 ", "127.0.0.1.5",
         "[127.0.0.1]", "x" * 300, "ex\u00e4mple.com"]


@pytest.mark.parametrize("host", NAMES, ids=[h[:20] for h in NAMES])
def test_a_host_that_is_no_ip_address_is_one_line_without_a_lookup(host, monkeypatch):
    """A name is refused before anything resolves it: every address lookup the command makes is numeric
    (AI_NUMERICHOST), and the name-only resolvers are not called at all."""
    looked_up = []
    real = socket.getaddrinfo

    def numeric_only(name, *args, **kwargs):
        flags = kwargs.get("flags", args[4] if len(args) > 4 else 0)
        if not flags & socket.AI_NUMERICHOST:
            looked_up.append(name)
        return real(name, *args, **kwargs)

    def never(*args, **kwargs):
        looked_up.append(args)
        raise OSError("no lookup")

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    for resolver in ("gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getfqdn"):
        monkeypatch.setattr(socket, resolver, never)
    r = cli("serve", "tp-mlp", "--host", host, "--port", "8000")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r
    assert "not an IP address" in r.stderr and "Traceback" not in r.stderr
    assert looked_up == []


@pytest.mark.parametrize("given", ["0", "65", "1000", "-1", "two", "8K"])
def test_max_apps_is_bounded(given):
    r = cli("serve", "tp-mlp", "--max-apps", given)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r
    assert "--max-apps" in r.stderr


def test_a_programs_path_reaches_the_app_absolute(tmp_path, monkeypatch):
    """The app process is handed the program's absolute path, whatever folder it starts in."""
    (tmp_path / "prog.py").write_text((ROOT / "examples" / "my_tp.py").read_text())
    monkeypatch.chdir(tmp_path)
    command, title = serve.app_command(argparse.Namespace(name="prog.py:program", view=None, trace=None, memory=None,
                                                          world=2))
    words = shlex.split(command)
    program = [w for w in words if w.endswith(":program")]
    assert program == [f"{tmp_path / 'prog.py'}:program"] and os.path.isabs(program[0])
    assert words[words.index(program[0]) + 1:] == ["--world", "2", "--tui"]
    assert title == "parasim lesson prog.py:program"


# -- real servers -----------------------------------------------------------------------------------------
def _free_port(address: str, family: int = socket.AF_INET) -> int:
    with socket.socket(family) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], seconds: float = 30.0) -> Any:
    """`check()` until it is true (returned); AssertionError naming `what` after a generous `seconds`."""
    end = time.monotonic() + seconds
    while not (got := check()):
        if time.monotonic() > end:
            raise AssertionError(f"waited {seconds:g} s for {what}")
        time.sleep(0.05)
    return got


def marked(marker: str) -> set[int]:
    """The live processes (zombies are not: they have ended) whose environment holds `marker`."""
    found = set()
    tag = f"{MARK}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if tag in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                found.add(int(entry.name))
    return found


def children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(p) for p in (task / "children").read_text().split())
    return found


class Served:
    """A running `python -m parasim serve ARGS --host HOST --port PORT`, reached at `connect`."""

    def __init__(self, proc: subprocess.Popen, port: int, connect: str, marker: str, out: Path, err: Path):
        self.proc, self.port, self.marker, self.out, self.err = proc, port, marker, out, err
        self.base = f"http://{f'[{connect}]' if ':' in connect else connect}:{port}"
        self.own = self.base.removeprefix("http://")  # the Host a browser sends for the printed address

    def apps(self) -> set[int]:
        """The app processes this server started that are running now."""
        return marked(self.marker) - {self.proc.pid}

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)


@contextlib.contextmanager
def served(args: list[str], host: str, folder: Path, connect: str = "127.0.0.1",
           cwd: Path = ROOT) -> Iterator[Served]:
    """The server, once its port takes connections; on the way out it is stopped as Ctrl-C stops it (killed
    if it has not ended in a minute) and no process it started may be left (any that is, is killed)."""
    family = socket.AF_INET6 if ":" in connect else socket.AF_INET
    port = _free_port(connect, family)
    marker = uuid.uuid4().hex
    out, err = folder / f"serve-{marker}.out", folder / f"serve-{marker}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "parasim", "serve", *args, "--host", host, "--port", str(port)],
                                stdout=o, stderr=e, cwd=cwd, env={**os.environ, MARK: marker})
    server = Served(proc, port, connect, marker, out, err)

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.socket(family) as s:
            s.settimeout(1)
            s.connect((connect, port))
            return True
        return False

    try:
        wait_for(f"parasim serve to listen on {connect} port {port}", lambda: proc.poll() is not None or listening())
        assert proc.poll() is None, f"parasim serve ended with {proc.returncode}: {err.read_text()}"
        # it listens before it says where: the line may come a moment after the port takes connections
        wait_for("parasim serve to say where it serves", lambda: "\n" in out.read_text())
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            wait_for("the server's apps to end with it", lambda: not marked(marker), 10)
        finally:
            for pid in marked(marker):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 120))


async def handshake(session: aiohttp.ClientSession, server: Served, headers: dict | None = None) -> Any:
    """A websocket to the server's /ws as textual-serve's page opens it: the open socket, or the HTTP status
    that refused it."""
    try:
        return await session.ws_connect(f"{server.base}/ws?width=100&height=30", headers=headers or {},
                                        autoclose=False, autoping=True, heartbeat=None)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status


async def first(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    """The first message that is a screen (an app's output) or a close."""
    while True:
        message = await ws.receive()
        if message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                            aiohttp.WSMsgType.ERROR):
            return message


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(trust_env=False)  # straight to 127.0.0.1 / ::1, never a proxy


BINDS = {"127.1": "127.0.0.1", "::1": "::1", "127.0.0.1": "127.0.0.1"}  # --host -> the address connected to


@pytest.fixture(scope="module")
def loopback_servers(tmp_path_factory) -> Iterator[dict[str, Served]]:
    """One tp-mlp server per loopback bind, shared by the tests of this module."""
    if not Path("/proc/self/environ").exists():
        pytest.skip("finds a server's apps by their environment in Linux's /proc")
    folder = tmp_path_factory.mktemp("serve")
    with contextlib.ExitStack() as stack:
        servers = {}
        for host, connect in BINDS.items():
            if ":" in connect and not socket.has_ipv6:
                continue
            servers[host] = stack.enter_context(served(["tp-mlp"], host, folder, connect))
        yield servers


def _server(servers: dict[str, Served], host: str) -> Served:
    if host not in servers:
        pytest.skip(f"no {host} here")
    return servers[host]


@pytest.mark.parametrize("host", BINDS)
def test_the_printed_address_is_the_bound_one(loopback_servers, host):
    server = _server(loopback_servers, host)
    shown = "[::1]" if host == "::1" else "127.0.0.1"
    assert server.out.read_text() == (f"parasim: serving parasim lesson tp-mlp at http://{shown}:{server.port}/ - "
                                      "open it in a browser (Ctrl-C to stop)\n")


REFUSED = [  # headers of a websocket that must get 403: PORT is the server's port
    ("a foreign Host and Origin", {"Host": "evil.example", "Origin": "http://evil.example"}),
    ("a rebound name", {"Host": "evil.example:PORT", "Origin": "http://evil.example:PORT"}),
    ("a rebound name without Origin", {"Host": "evil.example:PORT"}),
    ("a foreign Origin", {"Origin": "http://evil.example"}),
    ("a foreign Origin on this port", {"Origin": "http://evil.example:PORT"}),
    ("the null Origin", {"Origin": "null"}),
    ("localhost's page opening 127.0.0.1", {"Origin": "http://localhost:PORT"}),
    *[(f"the private address {a}", {"Host": f"{a}:PORT", "Origin": f"http://{a}:PORT"})
      for a in ("10.0.0.1", "192.168.1.1", "172.16.0.1", "169.254.1.1", "[fe80::1]", "[fc00::1]", "0.0.0.0")],
]


@needs_proc
@pytest.mark.parametrize("host", BINDS)
def test_another_sites_websocket_is_refused_and_starts_nothing(loopback_servers, host):
    server = _server(loopback_servers, host)

    async def check() -> dict[str, Any]:
        got = {}
        async with _session() as session:
            for what, headers in REFUSED:
                answer = await handshake(session, server, {k: v.replace("PORT", str(server.port))
                                                           for k, v in headers.items()})
                got[what] = answer if isinstance(answer, int) else 101
                if not isinstance(answer, int):
                    await answer.close()
        return got

    assert run(check()) == {what: 403 for what, _ in REFUSED}
    assert server.apps() == set() and children(server.proc.pid) == set()


PAGES = [("localhost:PORT", 200), ("localhost", 200), ("127.0.0.2:PORT", 200), ("[::1]:PORT", 200),
         ("evil.example", 403), ("evil.example:PORT", 403), ("10.0.0.1:PORT", 403), ("192.168.1.1", 403),
         ("[fe80::1]:PORT", 403)]


@pytest.mark.parametrize("host", BINDS)
def test_the_page_answers_only_to_loopback_names(loopback_servers, host):
    server = _server(loopback_servers, host)

    async def check() -> list[tuple[str, int]]:
        async with _session() as session:
            got = []
            for name, _ in PAGES:
                async with session.get(f"{server.base}/", headers={"Host": name.replace("PORT", str(server.port))}) as r:
                    got.append((name, r.status))
            async with session.get(f"{server.base}/") as r:
                assert f'data-session-websocket-url="ws://{server.own}/ws"' in await r.text()
            return got

    assert run(check()) == PAGES


@needs_proc
@pytest.mark.parametrize("host", BINDS)
def test_its_own_page_gets_an_app_that_ends_with_the_socket(loopback_servers, host):
    server = _server(loopback_servers, host)

    async def check() -> None:
        async with _session() as session:
            ws = await handshake(session, server, {"Origin": server.base})
            assert not isinstance(ws, int), f"refused with {ws}"
            message = await first(ws)
            assert message.type == aiohttp.WSMsgType.BINARY, message  # the app's first screen
            (app,) = server.apps()
            assert children(server.proc.pid) == {app}  # the server's own child
            await ws.close()
            await asyncio.to_thread(wait_for, "the app to end with its socket", lambda: not server.apps())

    run(check())
    assert server.proc.poll() is None


@needs_proc
def test_a_served_program_starts_from_another_folder(tmp_path):
    """`parasim serve prog.py:program --world 2` given in the program's folder: the app process is given the
    program's absolute path and shows its first screen."""
    (tmp_path / "prog.py").write_text((ROOT / "examples" / "my_tp.py").read_text())
    with served(["prog.py:program", "--world", "2"], "127.0.0.1", tmp_path, cwd=tmp_path) as server:
        async def check() -> None:
            async with _session() as session:
                ws = await handshake(session, server)
                message = await first(ws)
                assert message.type == aiohttp.WSMsgType.BINARY, (message, server.out.read_text())
                (app,) = server.apps()
                words = Path(f"/proc/{app}/cmdline").read_bytes().split(b"\0")
                assert f"{tmp_path / 'prog.py'}:program".encode() in words, words
                await ws.close()
        run(check())
        assert server.stop() == 0


@needs_proc
def test_no_more_apps_than_max_apps_run_at_once(tmp_path):
    """--max-apps 2 and five tabs opened at once: two get an app; the other three are accepted and closed at
    once with code 1013 and the reason (which the page shows), each logged in one line, and no third app
    starts. The cap counts apps running now: once a tab has gone, a new one gets an app."""
    reason = "try again later: this server already runs 2 apps (--max-apps)"
    with served(["tp-mlp", "--max-apps", "2"], "127.0.0.1", tmp_path) as server:
        async def check() -> None:
            async with _session() as session:
                tabs = await asyncio.gather(*(handshake(session, server) for _ in range(5)))
                assert not any(isinstance(ws, int) for ws in tabs), tabs  # every handshake accepted
                firsts = await asyncio.gather(*(first(ws) for ws in tabs))
                served_ = [ws for ws, m in zip(tabs, firsts) if m.type == aiohttp.WSMsgType.BINARY]
                refused = [(m.type, m.data, m.extra) for m in firsts if m.type != aiohttp.WSMsgType.BINARY]
                assert len(served_) == 2 and refused == [(aiohttp.WSMsgType.CLOSE, 1013, reason)] * 3, firsts
                assert len(server.apps()) == 2 and len(children(server.proc.pid)) == 2
                await served_[0].close()
                await asyncio.to_thread(wait_for, "the first tab's app to end", lambda: len(server.apps()) == 1)
                # the server counts the app until it has waited for it, a moment after its process is gone: a
                # tab opened in that moment is refused too, and a later one gets an app
                end = time.monotonic() + 30
                while (message := await first(again := await handshake(session, server))).type != \
                        aiohttp.WSMsgType.BINARY:
                    assert (message.data, message.extra) == (1013, reason) and time.monotonic() < end, message
                    refusals.append(message)
                    await asyncio.sleep(0.05)
                assert len(server.apps()) == 2
                for ws in (*tabs, again):
                    await ws.close()
        refusals: list = []
        run(check())
        assert server.stop() == 0
    assert server.err.read_text() == f"parasim serve: a browser tab refused: {reason}\n" * (3 + len(refusals))


def test_the_page_loses_every_link_to_another_site_and_keeps_its_own():
    page = ('<head><link rel="stylesheet" href="{{ static }}css/x.css" />\n'
            "<link\n  href='https://fonts.example/css?f=A'\n  rel=\"stylesheet\"\n/>\n"
            '<LINK HREF="//cdn.example/y.css"><link rel="icon" href="http://evil.example/i.png">'
            '<a href="https://not.a.link/">x</a></head>')
    links = browser._OutsideLinks()
    links.feed(page)
    assert links.tags == ["<link\n  href='https://fonts.example/css?f=A'\n  rel=\"stylesheet\"\n/>",
                          '<LINK HREF="//cdn.example/y.css">', '<link rel="icon" href="http://evil.example/i.png">']


def test_every_address_a_page_names_is_found_wherever_it_is_written():
    text = ('<img src="HTTPS://a.example/p?q=1">url(http://b.example/f.ttf) '
            "fetch('https://c.example/x')\n<svg xmlns=\"http://www.w3.org/2000/svg\"> http://d.example<")
    assert browser.addresses(text) == ["HTTPS://a.example/p?q=1", "http://b.example/f.ttf", "https://c.example/x",
                                       "http://www.w3.org/2000/svg", "http://d.example"]
    assert browser.addresses("no address, only http:/ and https:") == []


@pytest.mark.parametrize("said,kept", [
    ("Bad status line: b'\\x16\\x03'", "Bad status line"),
    ("Invalid method encountered:\n\n  bytearray(b'GE\\x00T')", "Invalid method encountered"),
    ('Got more than 8190 bytes when reading: b"aaaa"', "Got more than 8190 bytes when reading"),
    ("Pause on PRI/Upgrade: b is a letter", "Pause on PRI/Upgrade: b is a letter"),
    ("Too many headers: 20000", "Too many headers: 20000"),
])
def test_a_logged_error_stops_before_the_bytes_it_quotes(said, kept):
    assert browser.without_bytes(said) == kept


@needs_proc
def test_the_page_shows_why_its_session_was_closed():
    """The page served carries the script that puts a close's reason into its "Session ended" dialog."""
    page = browser.page()
    assert browser.SHOW_CLOSE_REASON in page and page.index(browser.SHOW_CLOSE_REASON) < page.index("js/textual.js")
    assert "event.reason" in browser.SHOW_CLOSE_REASON and ".closed-dialog .message" in browser.SHOW_CLOSE_REASON


@needs_proc
def test_ctrl_c_while_tabs_connect_leaves_no_app_running(tmp_path):
    """40 tabs open at once (none waited for) and Ctrl-C while they connect: some apps are running, some
    being started, some tabs still in their handshake. When the server has ended, no process it started is
    left, and while it ran every app was its own child."""
    with served(["tp-mlp", "--max-apps", "40"], "127.0.0.1", tmp_path) as server:
        async def storm() -> tuple[int, set[int], set[int]]:
            async with _session() as session:
                async def tab() -> None:
                    ws = await handshake(session, server)
                    if not isinstance(ws, int):
                        await first(ws)
                        await ws.receive()  # until the server closes it
                tabs = [asyncio.ensure_future(tab()) for _ in range(40)]
                while not (apps := server.apps()):  # the first app processes exist: others are being started
                    await asyncio.sleep(0.01)
                kids = children(server.proc.pid)
                server.proc.send_signal(signal.SIGINT)
                code = await asyncio.to_thread(server.proc.wait, 60)
                await asyncio.wait(tabs, timeout=30)
                for t in tabs:
                    t.cancel()
                return code, apps, kids

        code, apps, kids = run(storm())
        assert code == 0
        assert apps <= kids  # every app the server's own child (an app seen has not ended before Ctrl-C)
        left = marked(server.marker)
        assert left == set(), f"{len(left)} apps left running after the server ended"
        assert "Traceback" not in server.out.read_text()
        assert server.err.read_text() == ""  # not even an "Application failed to start" for an app it stopped


BAD_REQUESTS = [
    ("an 8 KB request line", lambda host: b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"),
    ("a 200 KB header", lambda host: b"GET / HTTP/1.1\r\nHost: " + host + b"\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"),
    ("20,000 headers", lambda host: b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n"
     + b"".join(b"X-%d: v\r\n" % i for i in range(20_000)) + b"\r\n"),
]


def _raw(port: int, request: bytes) -> bytes:
    """What the server answers `request` sent over a plain socket to 127.0.0.1 (the whole of it, as far as
    the server read it before answering)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        with contextlib.suppress(OSError):
            s.sendall(request)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
    return got


@pytest.mark.parametrize("what,request_of", BAD_REQUESTS, ids=[w for w, _ in BAD_REQUESTS])
def test_a_malformed_request_is_answered_400_in_one_log_line(loopback_servers, what, request_of):
    server = loopback_servers["127.0.0.1"]
    before = server.err.read_text()
    answer = _raw(server.port, request_of(server.own.encode()))
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
    logged = wait_for("the bad request's log line", lambda: server.err.read_text()[len(before):])
    assert "Traceback" not in logged and logged.count("\n") == 1, logged
    assert logged.startswith("parasim serve: a bad request (") and logged.endswith("): answered 400\n"), logged
    assert _raw(server.port, b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                % server.own.encode()).startswith(b"HTTP/1.1 200 ")  # and it serves on
    assert server.proc.poll() is None


@pytest.mark.parametrize("host", BINDS)
def test_a_request_without_a_host_is_answered_400(loopback_servers, host):
    """HTTP/1.0 allows no Host; this server answers such a request 400 (and never looks a name up for it)."""
    server = _server(loopback_servers, host)
    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(30)
        s.connect((BINDS[host], server.port))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert re.match(rb"HTTP/1\.[01] 400 ", answer) and answer.endswith(b"a request names its Host"), answer


@pytest.mark.parametrize("host,shown", [("localhost", "127.0.0.1"), ("0", None)])
def test_localhost_and_0_are_served(tmp_path, host, shown):
    """--host localhost is 127.0.0.1 (no lookup); 0 is every interface, printed as the machine's name (and
    reached here through 127.0.0.1 only)."""
    with served(["tp-mlp"], host, tmp_path) as server:
        async def page() -> int:
            async with _session() as session, session.get(f"{server.base}/") as r:
                return r.status
        assert run(page()) == 200
        assert server.stop() == 0
    name = shown or socket.gethostname()
    assert server.out.read_text() == (f"parasim: serving parasim lesson tp-mlp at http://{name}:{server.port}/ - "
                                      "open it in a browser (Ctrl-C to stop)\n")
    assert server.err.read_text() == ""

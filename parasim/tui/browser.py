"""The app in a web browser: textual-serve's server, with every browser tab's app its own process, guarded.

textual-serve runs one app process per tab that opens its page and relays the app's screen over a
websocket. This server adds what a server on a user's machine needs: a page that fetches nothing from the
internet, requests answered only from its own page (and, on a loopback address, only by a loopback name: a
DNS-rebinding guard), at most `max_apps` apps at once, one log line per event, and every app it started
ended when it stops, whatever state its tab is in. `parasim serve` (cli/serve.py) checks the command's input
and binds the socket; `serve` here runs until SIGINT or SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from html.parser import HTMLParser
from typing import Any

from ..comm.loopback import ip_of, is_loopback
from ..errors import UsageError

DEFAULT_MAX_APPS = 8  # each browser tab's app is a process of its own (some 70 MB)


def loopback_host(host: str) -> bool:
    """Whether a request's Host header names this machine by loopback: localhost or a loopback address,
    with or without a port (localhost:8000, 127.0.0.1:8000, [::1]:8000). Any other name might be a DNS name
    rebound to 127.0.0.1 by another site, whose page would then reach this server."""
    name, port = host, ""
    if host.startswith("["):  # [IPv6] or [IPv6]:port
        inside, bracket, rest = host[1:].partition("]")
        if not bracket or rest and not rest.startswith(":"):
            return False
        name, port = inside, rest[1:] if rest else ""
        if not isinstance(ip_of(name), ipaddress.IPv6Address):
            return False
    elif ip_of(host) is None and ":" in host:  # name:port (an IPv6 address without brackets has no port)
        name, _, port = host.rpartition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return False
    return name.lower() == "localhost" or is_loopback(name)


# Runs before textual-serve's script: a websocket the server closes with a reason (too many apps, the
# server stopping) shows that reason in the page's "Session ended." dialog.
SHOW_CLOSE_REASON = """<script>
window.WebSocket = class extends window.WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("close", (event) => {
      const message = document.querySelector(".closed-dialog .message");
      if (event.reason && message) { message.textContent = "Session ended: " + event.reason; }
    });
  }
};
</script>"""


class _OutsideLinks(HTMLParser):
    """The `<link>` tags of a page whose href is on another site, each as written (to be cut out whole)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href") or ""
        if tag == "link" and href.lower().startswith(("http://", "https://", "//")):
            self.tags.append(self.get_starttag_text() or "")


def addresses(text: str) -> list[str]:
    """Every http(s) address written in `text` (in a tag, a script or a style), up to the first space,
    quote or bracket that ends it."""
    found, lower, at = [], text.lower(), 0
    while (at := min((i for i in (lower.find("http://", at), lower.find("https://", at)) if i >= 0), default=-1)) >= 0:
        end = at
        while end < len(text) and not text[end].isspace() and text[end] not in "\"')<>":
            end += 1
        found.append(text[at:end])
        at = end
    return found


def page() -> str:
    """textual-serve's page without the font it fetches from Google: an @font-face gives the same Roboto
    Mono from the copy textual-serve ships in its static folder, so the page needs no network (the check
    below refuses to serve a page that still names another site, should textual-serve's page change). The
    page also shows why the server closed a tab's session (SHOW_CLOSE_REASON)."""
    from pathlib import Path

    import textual_serve

    page = (Path(textual_serve.__file__).parent / "templates" / "app_index.html").read_text(encoding="utf-8")
    links = _OutsideLinks()
    links.feed(page)
    links.close()
    for tag in links.tags:
        page = page.replace(tag, "", 1)
    face = (
        '<style>@font-face { font-family: "Roboto Mono"; src: url("{{ config.static.url }}fonts/'
        'RobotoMono-VariableFont_wght.ttf") format("truetype"); }</style>'
    )
    page = page.replace("</head>", f"{face}\n  </head>", 1)
    page = page.replace("<script src=", f"{SHOW_CLOSE_REASON}\n    <script src=", 1)
    outside = [u for u in addresses(page) if not u.startswith("http://www.w3.org/")]
    if outside:  # a namespace is a name, never fetched; anything else would be
        raise UsageError(
            f"textual-serve's page fetches {outside[0]}; this parasim serves only pages that need no network"
        )
    return page


def without_bytes(said: str) -> str:
    """An error's words up to the bytes it quotes (aiohttp's "Bad status line: b'...'" or
    ": bytearray(b'...')"): those bytes came from the request, and may be anything."""
    at = 0
    while (at := said.find(":", at)) >= 0:
        rest = said[at + 1 :].lstrip()
        if rest.removeprefix("bytearray(")[:2] in ("b'", 'b"'):
            return said[:at]
        at += 1
    return said


class _OneLine(logging.Formatter):
    """Every log record as one line: an exception is named after the message, never its traceback (aiohttp
    logs one with each malformed request it answers 400, such as an 8 KB request line)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            said = getattr(exc, "message", None) or str(exc)  # aiohttp's HTTP errors: without "400, message="
            said = without_bytes(str(said))  # not the bytes it could not read
            said = " ".join(said.split())[:200]
            what = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
            if record.name == "aiohttp.server" and getattr(exc, "code", None) == 400:
                message = f"a bad request ({what}): answered 400"
            else:
                message = f"{message} ({what})"
        return "parasim serve: " + " ".join(message.split())


def serve(
    command: str, title: str, page: str, listening: socket.socket, loopback_only: bool, max_apps: int = DEFAULT_MAX_APPS
) -> None:
    """Run textual-serve's server on `listening` until Ctrl-C (SIGINT) or SIGTERM; then every app process it
    started is asked to quit, killed if it has not within seconds, and waited for. `loopback_only`: the
    socket is bound to a loopback address, so requests must name this machine by one (a DNS-rebinding
    guard). At most `max_apps` apps run at once; a browser tab opened past them is told why."""
    import asyncio
    import contextlib
    import signal
    from urllib.parse import urlsplit

    import aiohttp_jinja2
    import jinja2
    from aiohttp import WSCloseCode, web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server, to_int

    log = logging.getLogger("textual-serve")
    started: set[asyncio.subprocess.Process] = set()  # every app process started and not yet waited for

    def kill(process: asyncio.subprocess.Process) -> None:
        """SIGKILL to the app's process group (the app leads one: whatever it started ends with it)."""
        if process.returncode is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (AttributeError, OSError):  # Windows (no process groups), or a group already gone
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def end(service: AppService) -> None:
        """Ask the app to quit (textual-serve's way: a quit message, then its output to its end), kill it if
        it has not within seconds, and wait for it."""
        process = service._process  # exec in the command: this process is the app
        if process is None:  # never started
            return
        try:
            await asyncio.wait_for(service.stop(), 3)
            await asyncio.wait_for(process.wait(), 3)
        except Exception:  # an app that does not quit (or cannot be told to) is killed
            pass
        kill(process)
        await process.wait()
        started.discard(process)

    class App(AppService):
        """textual-serve's AppService, but the process leads a session of its own (so that the server can end
        it with whatever it starts, and a Ctrl-C on the server's terminal reaches the server only) and is
        recorded the moment it exists, to be killed at the server's end whatever became of its tab."""

        async def _open_app_process(self, width: int = 80, height: int = 24) -> asyncio.subprocess.Process:
            pipe = asyncio.subprocess.PIPE
            self._process = process = await asyncio.create_subprocess_shell(
                self.command,
                stdin=pipe,
                stdout=pipe,
                stderr=pipe,
                env=self._build_environment(width=width, height=height),
                start_new_session=True,
            )
            started.add(process)
            self._stdin = process.stdin
            return process

    def refusal(request: web.Request) -> str | None:
        """Why this server does not answer `request` (403), or None. Any web page the user visits may send
        requests to this port, and a websocket starts a process: only this server's own page may (its Origin
        is this Host), and on a loopback address only by a loopback name (a DNS name rebound to 127.0.0.1 is
        not)."""
        host = request.headers["Host"]
        if loopback_only and not loopback_host(host):
            return "this server answers only to this machine's loopback names (localhost, 127.0.0.1, [::1])"
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != host:
            return "this server starts apps only for its own page"
        return None

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if "Host" not in request.headers:  # (aiohttp's request.host would look this machine's name up)
            raise web.HTTPBadRequest(text="a request names its Host")
        if (why := refusal(request)) is not None:
            raise web.HTTPForbidden(text=why)
        return await handler(request)

    class AppServer(Server):
        """textual-serve's Server with the page above, addresses taken from the browser's request (so that
        --host 0.0.0.0 works from another machine), requests answered only from this server's page (guard),
        at most `max_apps` apps at once, and every app ended when the server stops (textual-serve 1.1 leaves
        them running)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # each browser tab's app and its socket: registered before the app's process starts (the cap counts
            # it from then on), until the tab's handler is done with it
            self.apps: dict[AppService, web.WebSocketResponse] = {}
            self.stopping = False  # from the first signal on, no tab gets an app

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(guard)
            aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({"app_index.html": page}))
            return app

        async def on_startup(self, app: web.Application) -> None:
            pass  # textual-serve prints a banner here; cmd_serve has said where to go

        async def on_shutdown(self, app: web.Application) -> None:
            self.stopping = True
            await asyncio.gather(
                *(
                    ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server stopped")
                    for ws in list(self.apps.values())
                ),
                return_exceptions=True,
            )
            await asyncio.gather(*(end(service) for service in list(self.apps)), return_exceptions=True)

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            ws = "wss" if request.scheme == "https" else "ws"
            host = request.headers["Host"]  # guard: there is one
            return {
                "font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": f"{ws}://{host}/ws",
                "config": {"static": {"url": f"{request.scheme}://{host}/static/"}},
                "application": {"name": self.title},
            }

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            websocket = web.WebSocketResponse(heartbeat=15)
            await websocket.prepare(request)
            # accepted, then closed with a reason: the page shows a close's reason, not a refused handshake's
            if self.stopping:
                await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"the server stopped")
                return websocket
            if len(self.apps) >= max_apps:
                apps = f"{max_apps} app" + ("s" if max_apps > 1 else "")
                why = f"try again later: this server already runs {apps} (--max-apps)"
                log.warning("a browser tab refused: %s", why)
                await websocket.close(code=WSCloseCode.TRY_AGAIN_LATER, message=why.encode())
                return websocket
            service = App(
                self.command,
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=websocket.close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            self.apps[service] = websocket  # counted from now on, before its process exists
            reading = None
            try:
                await service.start(
                    to_int(request.query.get("width", "80"), 80), to_int(request.query.get("height", "24"), 24)
                )
                if self.stopping:  # began while this app started: no tab will see it
                    return websocket
                # until the tab goes or the app ends: an app that fails before its first screen sends no
                # "exit", and without this its tab would wait on the opening dialog for ever
                reading = asyncio.ensure_future(self._process_messages(websocket, service))
                done, _ = await asyncio.wait({reading, service._task}, return_when=asyncio.FIRST_COMPLETED)
                if reading in done:
                    reading.result()  # a message it could not read is logged below
            except Exception as exc:  # one tab's failure is logged; the server serves on
                log.warning("a browser tab's app failed: %s", exc)
            finally:
                if reading is not None:
                    reading.cancel()
                if not self.stopping:  # once the server stops, on_shutdown and then _serve's end end the apps
                    await end(service)
                self.apps.pop(service, None)
                await websocket.close()
            return websocket

    server = AppServer(command, host=listening.getsockname()[0], title=title)  # (textual-serve keeps it; the
    # socket it serves on is `listening`)
    # warnings only (textual-serve and aiohttp log every request), each in one line; an app the server
    # stopped before its first screen is no failure
    shown = logging.StreamHandler(sys.stderr)
    shown.setFormatter(_OneLine())
    shown.addFilter(lambda record: not (server.stopping and record.getMessage() == "Application failed to start"))
    logging.basicConfig(level=logging.WARNING, handlers=[shown])
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()

    def request_exit() -> None:
        server.stopping = True
        stop.set()

    async def run() -> None:
        runner = web.AppRunner(await server._make_app(), handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        try:
            await web.SockSite(runner, listening).start()
            await stop.wait()
        finally:
            server.stopping = True
            await runner.cleanup()  # stops listening, then on_shutdown, then each request's end

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: Ctrl-C is a KeyboardInterrupt there
            loop.add_signal_handler(sig, request_exit)
    try:
        main = loop.create_task(run())
        try:
            loop.run_until_complete(main)
        except KeyboardInterrupt:
            request_exit()
            loop.run_until_complete(main)
    finally:
        try:
            # whatever is still running (a handler aiohttp gave up on, an app still starting) is cancelled;
            # then every app process this server ever started and that is still alive is killed, whatever
            # became of its tab, and waited for
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            alive = [process for process in started if process.returncode is None]
            for process in alive:
                kill(process)
            if alive:
                loop.run_until_complete(asyncio.wait([loop.create_task(p.wait()) for p in alive], timeout=10))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            listening.close()
            loop.close()
            asyncio.set_event_loop(None)

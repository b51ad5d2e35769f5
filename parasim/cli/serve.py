"""`parasim serve`: the step-through app in a web browser. textual-serve runs one app process per browser tab
that opens the page (the command `parasim lesson NAME --tui` would run on a terminal) and relays its screen
over a websocket; everything here is checked before the server starts, and Ctrl-C ends it and its apps."""
from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import re
import shlex
import socket
import sys
from typing import Any

from ..errors import UsageError
from .common import positive, positive_up_to

DEFAULT_HOST = "127.0.0.1"  # loopback: nobody else can reach the apps unless --host says so
DEFAULT_PORT = 8000
DEFAULT_MAX_APPS = 8  # each browser tab's app is a process of its own (some 70 MB)
MOST_APPS = 64


def add_serve(sub: Any) -> None:
    sp = sub.add_parser(
        "serve", help="open the app in a web browser: a lesson, a saved trace or a token's trace",
        description="Serve the step-through app to a web browser. Every tab that opens the page gets an app of "
                    "its own, the one `parasim lesson NAME` opens on a terminal, with the same keys, up to "
                    "--max-apps at once. The page, its script and its font all come from this server: nothing is "
                    "fetched from the internet. Only this machine can connect unless --host says otherwise. "
                    "Ctrl-C stops the server and the apps it started.",
        epilog="examples: parasim serve tp-mlp;  parasim serve --trace \"--tp 2 --sp --token t6\" --port 8080")
    sp.add_argument("name", nargs="?", metavar="NAME", help="the lesson to serve (parasim lesson lists them), or "
                    "your own SPMD program as path/to/file.py:function (with --world)")
    sp.add_argument("--view", metavar="TRACE.json", help="serve a saved trace instead, as `parasim view` opens it")
    sp.add_argument("--trace", metavar="ARGS", help="serve `parasim trace ARGS --app` instead: the flags of "
                    "parasim trace in one quoted argument, such as \"--tp 2 --sp --token contract\" (a "
                    "single flag is written --trace=--FLAG)")
    sp.add_argument("--world", type=positive, metavar="N", help="ranks for a program given as file.py:function")
    sp.add_argument("--host", default=DEFAULT_HOST, help=f"the IP address to listen on, or localhost (default "
                    f"{DEFAULT_HOST}: this machine only; 0.0.0.0 lets other machines connect); a name is not "
                    "looked up")
    sp.add_argument("--port", type=positive_up_to(65535, "the largest TCP port"), default=DEFAULT_PORT,
                    help=f"the TCP port to listen on (default {DEFAULT_PORT})")
    sp.add_argument("--max-apps", type=positive_up_to(MOST_APPS, "apps one server runs at once"),
                    default=DEFAULT_MAX_APPS, metavar="N",
                    help=f"the most apps (browser tabs) running at once (default {DEFAULT_MAX_APPS}); a tab "
                         "opened past them is told to try again later")
    # what each browser tab's process runs for --view: `parasim view` prints text when stdout is not a
    # terminal, and under textual-serve it never is
    sp.add_argument("--open-app", action="store_true", help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.open_app:
        return _open_view(args)
    command, title = app_command(args)
    page = _page()
    listening = bind(args.host, args.port)  # the socket the server will use: a refusal is one line, exit 2
    # what is served and guarded is what the socket is bound to, however --host spelled it (127.1, 0, ...)
    address, port = listening.getsockname()[:2]
    print(f"parasim: serving {title} at {url(address, port)} - open it in a browser (Ctrl-C to stop)",
          flush=True)
    _serve(command, title, page, listening, loopback_only=is_loopback(address), max_apps=args.max_apps)
    return 0  # Ctrl-C is how a server is meant to stop: done, not interrupted (130)


def app_command(args: argparse.Namespace) -> tuple[str, str]:
    """The shell command each browser tab's app process runs, and what is served in words; every input is
    checked here, before the server starts (UsageError: one line, exit 2)."""
    chosen = [what for what, given in (("NAME", args.name), ("--view", args.view), ("--trace", args.trace))
              if given is not None]
    if not chosen:
        raise UsageError("nothing to serve: give a lesson NAME, --view TRACE.json or --trace ARGS "
                         "(see parasim serve --help)")
    if len(chosen) > 1:
        raise UsageError(f"give one of NAME, --view and --trace, not {' and '.join(chosen)}")
    if args.world is not None and args.name is None:
        raise UsageError("--world is for a program given as file.py:function")
    # sys.executable -m parasim: the same interpreter and parasim as this one, however it was installed
    argv = [sys.executable, "-m", "parasim"]
    if args.name is not None:
        argv += ["lesson", *_lesson_args(args.name, args.world), "--tui"]
        title = f"parasim lesson {args.name}"
    elif args.view is not None:
        argv += ["serve", "--view", _trace_file(args.view), "--open-app"]
        title = f"parasim view {args.view}"
    else:
        argv += ["trace", *_trace_args(args.trace), "--app"]
        title = f"parasim trace {args.trace}".rstrip()
    # exec: the shell that textual-serve starts the command with becomes the app, so that ending the
    # shell's process ends the app
    return "exec " + shlex.join(argv), title


def _lesson_args(name: str, world: int | None) -> list[str]:
    from ..lesson import get_lesson, is_program
    get_lesson(name, world)  # an unknown lesson, or a program that cannot load: refused now
    if is_program(name):
        path, _, fn = name.rpartition(":")
        name = f"{os.path.abspath(path)}:{fn}"  # the app's process need not start in this folder
    elif world is not None:
        raise UsageError("--world is for a program given as file.py:function; a lesson has its own")
    return [name] + (["--world", str(world)] if world is not None else [])


def _trace_file(path: str) -> str:
    from ..lesson import is_program
    from ..trace import Trace
    if is_program(path):
        raise UsageError(f"--view takes a saved trace; serve a program as: parasim serve {path} --world N")
    Trace.load(path)  # a missing or broken file is refused now, not in each browser tab
    return os.path.abspath(path)


def _trace_args(text: str) -> list[str]:
    """`--trace ARGS` as the words of `parasim trace`, parsed by its own parser and its layout built, so that a
    wrong flag or layout is refused now. What only the run itself finds (a word that is not in the example's
    sentences) ends that browser tab's app with parasim trace's own line on the server's output."""
    from .common import Parser, gpu_preset
    from .trace import _layout, add_trace
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--trace {text!r}: {exc}") from None
    parser = Parser(prog="parasim")
    add_trace(parser.add_subparsers(parser_class=Parser))
    parsed, extra = parser.parse_known_args(["trace", *words, "--app"])
    if extra:
        raise UsageError(f"--trace: arguments parasim trace does not take: {' '.join(extra)} "
                         "(see parasim trace --help)")
    _layout(parsed)
    gpu_preset(parsed.gpu_model, "--gpu-model")
    return words


def _open_view(args: argparse.Namespace) -> int:
    """The app over a saved trace, in this process (what `parasim view` opens on a terminal)."""
    from ..lesson import load_lessons
    from ..trace import Trace
    from .lesson import _open_tui
    if args.view is None:
        raise UsageError("--open-app opens the app of --view TRACE.json")
    trace = Trace.load(args.view)
    lesson = load_lessons().get(trace.meta.get("lesson", ""))
    _open_tui(trace, lesson.narrative if lesson else {}, lesson.title if lesson else args.view)
    return 0


# -- the server ------------------------------------------------------------------------------------------
def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address written in full (127.0.0.1, ::1, ::ffff:127.0.0.1, [::1]), or None."""
    text = _unbracket(text)
    if text.startswith("["):  # [127.0.0.1] is no address
        return None
    try:
        return ipaddress.ip_address(text.partition("%")[0])  # an IPv6 zone (%eth0) is no part of the address
    except ValueError:
        return None


def is_loopback(address: str) -> bool:
    """Whether the IP address `address` (a bound socket's, or a Host header's without its port) is one of
    this machine's loopback addresses: 127.0.0.0/8, ::1, or 127.x written as IPv6 (::ffff:127.0.0.1). A
    private address (10.x, 192.168.x, fe80::) is not: other machines reach it. A name is not either."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


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
        if not isinstance(_ip(name), ipaddress.IPv6Address):
            return False
    elif _ip(host) is None and ":" in host:  # name:port (an IPv6 address without brackets has no port)
        name, _, port = host.rpartition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return False
    return name.lower() == "localhost" or is_loopback(name)


def url(host: str, port: int) -> str:
    """The address to open in a browser for a server listening on `host` (an IP address, as written to
    --host or as the bound socket gives it): IPv6 in brackets, and every interface (0.0.0.0, ::, 0) the
    machine's name."""
    address = _numeric(host) if host != "localhost" else host
    ip = _ip(address)
    if ip is None and address == "" or ip is not None and ip.is_unspecified:  # every address: name the machine
        name = socket.gethostname()
    elif isinstance(ip, ipaddress.IPv6Address):
        name = f"[{address.partition('%')[0]}]"  # a browser takes no zone (%eth0)
    else:
        name = address
    return f"http://{name}:{port}/"


def _numeric(host: str) -> str:
    """`host` written as the socket library reads a numeric address (127.1 is 127.0.0.1, 0 is 0.0.0.0) in
    full, or `host` itself when it is no address. No name is ever looked up (AI_NUMERICHOST)."""
    try:
        return socket.getaddrinfo(_unbracket(host), None, flags=socket.AI_NUMERICHOST)[0][4][0]
    except (OSError, UnicodeError, ValueError, IndexError):
        return host


def _unbracket(host: str) -> str:
    """[IPv6] as IPv6 (as a URL writes it); anything else as it is."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") and ":" in host else host


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, or one line saying why there cannot be one (UsageError). `host`
    is an IP address (as the socket library reads it: 127.1 and 0 too; IPv6 with or without brackets) or
    localhost (127.0.0.1); a name is refused without being looked up, since what a name resolves to can
    change between this check and a browser's request. The server is given this socket, so the port
    checked is the port served."""
    numeric = "127.0.0.1" if host.lower() == "localhost" else _unbracket(host)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            numeric, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)[0]
    except (OSError, UnicodeError, ValueError, IndexError):
        raise UsageError(f"--host {host[:80]!r}: not an IP address (give one of this machine's, such as "
                         f"127.0.0.1, ::1 or 0.0.0.0, or localhost; names are not looked up)") from None
    sock = socket.socket(family, kind, proto)
    try:
        # as aiohttp does: a port left in TIME_WAIT by a server that just stopped can be listened on again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "in use: give another with --port" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise UsageError(f"cannot listen on {host} port {port}: {why}") from None
    sock.setblocking(False)
    return sock


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


def _page() -> str:
    """textual-serve's page without the font it fetches from Google: an @font-face gives the same Roboto
    Mono from the copy textual-serve ships in its static folder, so the page needs no network (the check
    below refuses to serve a page that still names another site, should textual-serve's page change). The
    page also shows why the server closed a tab's session (SHOW_CLOSE_REASON)."""
    from pathlib import Path

    import textual_serve
    page = (Path(textual_serve.__file__).parent / "templates" / "app_index.html").read_text(encoding="utf-8")
    page = re.sub(r"<link\b[^>]*\bhref=\"https?://[^>]*>", "", page)
    face = ("<style>@font-face { font-family: \"Roboto Mono\"; src: url(\"{{ config.static.url }}fonts/"
            "RobotoMono-VariableFont_wght.ttf\") format(\"truetype\"); }</style>")
    page = page.replace("</head>", f"{face}\n  </head>", 1)
    page = page.replace("<script src=", f"{SHOW_CLOSE_REASON}\n    <script src=", 1)
    outside = [u for u in re.findall(r"https?://[^\s\"')]+", page) if not u.startswith("http://www.w3.org/")]
    if outside:  # a namespace is a name, never fetched; anything else would be
        raise UsageError(f"textual-serve's page fetches {outside[0]}; this parasim serves only pages that "
                         "need no network")
    return page


class _OneLine(logging.Formatter):
    """Every log record as one line: an exception is named after the message, never its traceback (aiohttp
    logs one with each malformed request it answers 400, such as an 8 KB request line)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            said = getattr(exc, "message", None) or str(exc)  # aiohttp's HTTP errors: without "400, message="
            said = re.split(r":\s*(?:bytearray\()?b['\"]", str(said))[0]  # not the bytes it could not read
            said = " ".join(said.split())[:200]
            what = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
            if record.name == "aiohttp.server" and getattr(exc, "code", None) == 400:
                message = f"a bad request ({what}): answered 400"
            else:
                message = f"{message} ({what})"
        return "parasim serve: " + " ".join(message.split())


def _serve(command: str, title: str, page: str, listening: socket.socket, loopback_only: bool,
           max_apps: int = DEFAULT_MAX_APPS) -> None:
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
                self.command, stdin=pipe, stdout=pipe, stderr=pipe,
                env=self._build_environment(width=width, height=height), start_new_session=True)
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
            await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server stopped")
                                   for ws in list(self.apps.values())), return_exceptions=True)
            await asyncio.gather(*(end(service) for service in list(self.apps)), return_exceptions=True)

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            ws = "wss" if request.scheme == "https" else "ws"
            host = request.headers["Host"]  # guard: there is one
            return {"font_size": to_int(request.query.get("fontsize", "16"), 16),
                    "app_websocket_url": f"{ws}://{host}/ws",
                    "config": {"static": {"url": f"{request.scheme}://{host}/static/"}},
                    "application": {"name": self.title}}

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
            service = App(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                          close=websocket.close, download_manager=self.download_manager, debug=self.debug)
            self.apps[service] = websocket  # counted from now on, before its process exists
            reading = None
            try:
                await service.start(to_int(request.query.get("width", "80"), 80),
                                    to_int(request.query.get("height", "24"), 24))
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

    server = AppServer(command, host=DEFAULT_HOST, title=title)
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

"""`parasim serve`: the step-through app in a web browser. textual-serve runs one app process per browser tab
that opens the page (the command `parasim lesson NAME --tui` would run on a terminal) and relays its screen
over a websocket; everything here is checked before the server starts, and Ctrl-C ends it and its apps."""
from __future__ import annotations

import argparse
import errno
import ipaddress
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


def add_serve(sub: Any) -> None:
    sp = sub.add_parser(
        "serve", help="open the app in a web browser: a lesson, a saved trace or a token's trace",
        description="Serve the step-through app to a web browser. Every tab that opens the page gets an app of "
                    "its own, the one `parasim lesson NAME` opens on a terminal, with the same keys. The page, its "
                    "script and its font all come from this server: nothing is fetched from the internet. Only "
                    "this machine can connect unless --host says otherwise. Ctrl-C stops the server and the "
                    "apps it started.",
        epilog="examples: parasim serve tp-mlp;  parasim serve --trace \"--tp 2 --sp --token t6\" --port 8080")
    sp.add_argument("name", nargs="?", metavar="NAME", help="the lesson to serve (parasim lesson lists them), or "
                    "your own SPMD program as path/to/file.py:function (with --world)")
    sp.add_argument("--view", metavar="TRACE.json", help="serve a saved trace instead, as `parasim view` opens it")
    sp.add_argument("--trace", metavar="ARGS", help="serve `parasim trace ARGS --app` instead: the flags of "
                    "parasim trace in one quoted argument, such as \"--tp 2 --sp --token contract\" (a "
                    "single flag is written --trace=--FLAG)")
    sp.add_argument("--world", type=positive, metavar="N", help="ranks for a program given as file.py:function")
    sp.add_argument("--host", default=DEFAULT_HOST, help=f"the address to listen on (default {DEFAULT_HOST}: this "
                    "machine only; 0.0.0.0 lets other machines connect)")
    sp.add_argument("--port", type=positive_up_to(65535, "the largest TCP port"), default=DEFAULT_PORT,
                    help=f"the TCP port to listen on (default {DEFAULT_PORT})")
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
    print(f"parasim: serving {title} at {url(args.host, args.port)} - open it in a browser (Ctrl-C to stop)",
          flush=True)
    _serve(command, title, page, listening, loopback_only=is_loopback(args.host))
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
def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.1, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url(host: str, port: int) -> str:
    """The address to open in a browser."""
    if host in ("", "0.0.0.0", "::"):  # every address of this machine: name the machine
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, or one line saying why there cannot be one (UsageError). The
    server is given this socket, so the port checked is the port served."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r}: not an address of this machine ({exc})") from None
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


def _page() -> str:
    """textual-serve's page without the font it fetches from Google: an @font-face gives the same Roboto
    Mono from the copy textual-serve ships in its static folder, so the page needs no network (the check
    below refuses to serve a page that still names another site, should textual-serve's page change)."""
    from pathlib import Path

    import textual_serve
    page = (Path(textual_serve.__file__).parent / "templates" / "app_index.html").read_text(encoding="utf-8")
    page = re.sub(r"<link\b[^>]*\bhref=\"https?://[^>]*>", "", page)
    face = ("<style>@font-face { font-family: \"Roboto Mono\"; src: url(\"{{ config.static.url }}fonts/"
            "RobotoMono-VariableFont_wght.ttf\") format(\"truetype\"); }</style>")
    page = page.replace("</head>", f"{face}\n  </head>", 1)
    outside = [u for u in re.findall(r"https?://[^\s\"')]+", page) if not u.startswith("http://www.w3.org/")]
    if outside:  # a namespace is a name, never fetched; anything else would be
        raise UsageError(f"textual-serve's page fetches {outside[0]}; this parasim serves only pages that "
                         "need no network")
    return page


def _serve(command: str, title: str, page: str, listening: socket.socket, loopback_only: bool) -> None:
    """Run textual-serve's server on `listening` until Ctrl-C (SIGINT) or SIGTERM; then every app process it
    started is asked to quit, killed if it has not within seconds, and waited for."""
    import asyncio
    import contextlib
    import logging
    import signal
    from urllib.parse import urlsplit

    import aiohttp_jinja2
    import jinja2
    from aiohttp import WSCloseCode, web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server, to_int

    log = logging.getLogger("textual-serve")

    async def end(service: AppService) -> None:
        process = service._process  # exec in the command: this process is the app
        if process is None:
            return
        try:  # textual-serve's own way: a quit message, then the app's output to its end
            await asyncio.wait_for(service.stop(), 3)
            await asyncio.wait_for(process.wait(), 3)
        except Exception:  # an app that does not quit (or cannot be told to) is killed
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    class AppServer(Server):
        """textual-serve's Server with the page above, addresses taken from the browser's request (so that
        --host 0.0.0.0 works from another machine), apps started only for pages this server sent, and every
        app ended when the server stops (textual-serve 1.1 leaves them running)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.apps: dict[AppService, web.WebSocketResponse] = {}  # each browser tab's app and its socket

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({"app_index.html": page}))
            return app

        async def on_startup(self, app: web.Application) -> None:
            pass  # textual-serve prints a banner here; cmd_serve has said where to go

        async def on_shutdown(self, app: web.Application) -> None:
            await asyncio.gather(*(end(service) for service in list(self.apps)))
            await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server stopped")
                                   for ws in list(self.apps.values())))

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            ws = "wss" if request.scheme == "https" else "ws"
            return {"font_size": to_int(request.query.get("fontsize", "16"), 16),
                    "app_websocket_url": f"{ws}://{request.host}/ws",
                    "config": {"static": {"url": f"{request.scheme}://{request.host}/static/"}},
                    "application": {"name": self.title}}

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            # Any web page the user visits may open a websocket to this port, and each one starts a
            # process: only a page from this server (its Origin is this Host) may, and on loopback only by
            # a loopback name (a rebound DNS name is refused).
            origin = request.headers.get("Origin")
            if origin is not None and urlsplit(origin).netloc != request.host or \
                    loopback_only and not is_loopback(urlsplit(f"//{request.host}").hostname or ""):
                raise web.HTTPForbidden(text="this server starts apps only for its own page")
            websocket = web.WebSocketResponse(heartbeat=15)
            await websocket.prepare(request)
            service = AppService(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                 close=websocket.close, download_manager=self.download_manager, debug=self.debug)
            self.apps[service] = websocket
            reading = None
            try:
                await service.start(to_int(request.query.get("width", "80"), 80),
                                    to_int(request.query.get("height", "24"), 24))
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
                self.apps.pop(service, None)
                await end(service)
                await websocket.close()
            return websocket

    server = AppServer(command, host=DEFAULT_HOST, title=title)
    # warnings only: textual-serve and aiohttp log every request; an app that fails to start is a warning
    logging.basicConfig(level=logging.WARNING, format="parasim serve: %(message)s", stream=sys.stderr)
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: Ctrl-C is a KeyboardInterrupt there
            loop.add_signal_handler(sig, server.request_exit)  # GracefulExit: aiohttp's clean shutdown
    try:
        web.run_app(server._make_app(), sock=listening, handle_signals=False, loop=loop, print=None,
                    shutdown_timeout=5)
    finally:
        listening.close()
        loop.close()

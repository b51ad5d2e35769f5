"""`parasim serve`: the step-through app in a web browser. textual-serve runs one app process per browser tab
that opens the page (the command `parasim lesson NAME --tui` would run on a terminal) and relays its screen
over a websocket; everything here is checked before the server starts, and Ctrl-C ends it and its apps."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import shlex
import socket
import sys
from typing import Any

from ..comm.loopback import ip_of, is_loopback, unbracket
from ..errors import UsageError
from ..tui import browser
from ..tui.browser import DEFAULT_MAX_APPS
from .common import positive, positive_up_to

DEFAULT_HOST = "127.0.0.1"  # loopback: nobody else can reach the apps unless --host says so
DEFAULT_PORT = 8000
MOST_APPS = 64


def add_serve(sub: Any) -> None:
    sp = sub.add_parser(
        "serve",
        help="open the app in a web browser: a lesson, a saved trace or a token's trace",
        description="Serve the step-through app to a web browser. Every tab that opens the page gets an app of "
        "its own, the one `parasim lesson NAME` opens on a terminal, with the same keys, up to "
        "--max-apps at once. The page, its script and its font all come from this server: nothing is "
        "fetched from the internet. Only this machine can connect unless --host says otherwise. "
        "Ctrl-C stops the server and the apps it started.",
        epilog='examples: parasim serve tp-mlp;  parasim serve --trace "--tp 2 --sp --token t6" --port 8080',
    )
    sp.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="the lesson to serve (parasim lesson lists them), or "
        "your own SPMD program as path/to/file.py:function (with --world)",
    )
    sp.add_argument("--view", metavar="TRACE.json", help="serve a saved trace instead, as `parasim view` opens it")
    sp.add_argument(
        "--trace",
        metavar="ARGS",
        help="serve `parasim trace ARGS --app` instead: the flags of "
        'parasim trace in one quoted argument, such as "--tp 2 --sp --token contract" (a '
        "single flag is written --trace=--FLAG)",
    )
    sp.add_argument(
        "--memory",
        metavar="ARGS",
        help="serve the live estimator, `parasim memory ARGS --app`: the flags of parasim memory in one quoted "
        'argument, such as "--model 27b --tp 8 --sp" (where its settings start)',
    )
    sp.add_argument("--world", type=positive, metavar="N", help="ranks for a program given as file.py:function")
    sp.add_argument(
        "--quiz",
        action="store_true",
        help="with a lesson NAME: the app opens asking the lesson's questions (predict, then see; key z asks "
        "them again)",
    )
    sp.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the IP address to listen on, or localhost (default "
        f"{DEFAULT_HOST}: this machine only; 0.0.0.0 lets other machines connect); a name is not "
        "looked up",
    )
    sp.add_argument(
        "--port",
        type=positive_up_to(65535, "the largest TCP port"),
        default=DEFAULT_PORT,
        help=f"the TCP port to listen on (default {DEFAULT_PORT})",
    )
    sp.add_argument(
        "--max-apps",
        type=positive_up_to(MOST_APPS, "apps one server runs at once"),
        default=DEFAULT_MAX_APPS,
        metavar="N",
        help=f"the most apps (browser tabs) running at once (default {DEFAULT_MAX_APPS}); a tab "
        "opened past them is told to try again later",
    )
    # what each browser tab's process runs for --view: `parasim view` prints text when stdout is not a
    # terminal, and under textual-serve it never is
    sp.add_argument("--open-app", action="store_true", help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.open_app:
        return _open_view(args)
    command, title = app_command(args)
    page = browser.page()
    listening = bind(args.host, args.port)  # the socket the server will use: a refusal is one line, exit 2
    # what is served and guarded is what the socket is bound to, however --host spelled it (127.1, 0, ...)
    address, port = listening.getsockname()[:2]
    print(f"parasim: serving {title} at {url(address, port)} - open it in a browser (Ctrl-C to stop)", flush=True)
    browser.serve(command, title, page, listening, loopback_only=is_loopback(address), max_apps=args.max_apps)
    return 0  # Ctrl-C is how a server is meant to stop: done, not interrupted (130)


def app_command(args: argparse.Namespace) -> tuple[str, str]:
    """The shell command each browser tab's app process runs, and what is served in words; every input is
    checked here, before the server starts (UsageError: one line, exit 2)."""
    chosen = [
        what
        for what, given in (
            ("NAME", args.name),
            ("--view", args.view),
            ("--trace", args.trace),
            ("--memory", args.memory),
        )
        if given is not None
    ]
    if not chosen:
        raise UsageError(
            "nothing to serve: give a lesson NAME, --view TRACE.json, --trace ARGS or --memory ARGS (see parasim "
            "serve --help)"
        )
    if len(chosen) > 1:
        raise UsageError(f"give one of NAME, --view, --trace and --memory, not {' and '.join(chosen)}")
    if args.world is not None and args.name is None:
        raise UsageError("--world is for a program given as file.py:function")
    quiz = getattr(args, "quiz", False)  # (a caller's own Namespace may predate the flag)
    if quiz and args.name is None:
        raise UsageError("--quiz asks a lesson's questions: give a lesson NAME")
    # sys.executable -m parasim: the same interpreter and parasim as this one, however it was installed
    argv = [sys.executable, "-m", "parasim"]
    if args.name is not None:
        argv += ["lesson", *_lesson_args(args.name, args.world, quiz), "--tui"]
        title = f"parasim lesson {args.name}"
    elif args.view is not None:
        argv += ["serve", "--view", _trace_file(args.view), "--open-app"]
        title = f"parasim view {args.view}"
    elif args.memory is not None:
        argv += ["memory", *_memory_args(args.memory), "--app"]
        title = f"parasim memory {args.memory} --app"
    else:
        argv += ["trace", *_trace_args(args.trace), "--app"]
        title = f"parasim trace {args.trace}".rstrip()
    # exec: the shell that textual-serve starts the command with becomes the app, so that ending the
    # shell's process ends the app
    return "exec " + shlex.join(argv), title


def _lesson_args(name: str, world: int | None, quiz: bool = False) -> list[str]:
    from ..lesson import get_lesson, is_program

    lesson = get_lesson(name, world)  # an unknown lesson, or a program that cannot load: refused now
    if quiz:
        lesson.check_asks()
    if is_program(name):
        path, _, fn = name.rpartition(":")
        name = f"{os.path.abspath(path)}:{fn}"  # the app's process need not start in this folder
    elif world is not None:
        raise UsageError("--world is for a program given as file.py:function; a lesson has its own")
    return [name] + (["--world", str(world)] if world is not None else []) + (["--quiz"] if quiz else [])


def _trace_file(path: str) -> str:
    from ..lesson import is_program
    from ..comm.trace import Trace

    if is_program(path):
        raise UsageError(f"--view takes a saved trace; serve a program as: parasim serve {path} --world N")
    Trace.load(path)  # a missing or broken file is refused now, not in each browser tab
    return os.path.abspath(path)


def _trace_args(text: str) -> list[str]:
    """`--trace ARGS` as the words of `parasim trace`, parsed by its own parser and its layout built, so that a
    wrong flag or layout is refused now. What only the run itself finds (a word that is not in the example's
    sentences) ends that browser tab's app with parasim trace's own line on the server's output."""
    from ..estimate.traffic import gpu_spec
    from .common import Parser
    from .trace import add_trace, layout_of_args

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--trace {text!r}: {exc}") from None
    parser = Parser(prog="parasim")
    add_trace(parser.add_subparsers(parser_class=Parser))
    parsed, extra = parser.parse_known_args(["trace", *words, "--app"])
    if extra:
        raise UsageError(
            f"--trace: arguments parasim trace does not take: {' '.join(extra)} (see parasim trace --help)"
        )
    layout_of_args(parsed)
    gpu_spec(parsed.gpu_model, "--gpu-model")
    return words


def _memory_args(text: str) -> list[str]:
    """`--memory ARGS` as the words of `parasim memory`, parsed by its own parser and its query built, so that a
    wrong flag, model or layout is refused now, before the server starts."""
    from .common import Parser
    from .estimate import add_estimate_commands, query_of

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--memory {text!r}: {exc}") from None
    parser = Parser(prog="parasim")
    add_estimate_commands(parser.add_subparsers(parser_class=Parser))
    parsed, extra = parser.parse_known_args(["memory", *words, "--app"])
    if extra:
        raise UsageError(
            f"--memory: arguments parasim memory does not take: {' '.join(extra)} (see parasim memory --help)"
        )
    query_of(parsed)
    return words


def _open_view(args: argparse.Namespace) -> int:
    """The app over a saved trace, in this process (what `parasim view` opens on a terminal)."""
    from ..lesson import load_lessons
    from ..comm.trace import Trace
    from .common import open_app

    if args.view is None:
        raise UsageError("--open-app opens the app of --view TRACE.json")
    trace = Trace.load(args.view)
    lesson = load_lessons().get(trace.meta.get("lesson", ""))
    open_app(trace, lesson.narrative if lesson else {}, lesson.title if lesson else args.view)
    return 0


# -- where it listens -------------------------------------------------------------------------------------
def url(host: str, port: int) -> str:
    """The address to open in a browser for a server listening on `host` (an IP address, as written to
    --host or as the bound socket gives it): IPv6 in brackets, and every interface (0.0.0.0, ::, 0) the
    machine's name."""
    address = _numeric(host) if host != "localhost" else host
    ip = ip_of(address)
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
        return socket.getaddrinfo(unbracket(host), None, flags=socket.AI_NUMERICHOST)[0][4][0]
    except (OSError, UnicodeError, ValueError, IndexError):
        return host


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, or one line saying why there cannot be one (UsageError). `host`
    is an IP address (as the socket library reads it: 127.1 and 0 too; IPv6 with or without brackets) or
    localhost (127.0.0.1); a name is refused without being looked up, since what a name resolves to can
    change between this check and a browser's request. The server is given this socket, so the port
    checked is the port served."""
    numeric = "127.0.0.1" if host.lower() == "localhost" else unbracket(host)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            numeric, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST
        )[0]
    except (OSError, UnicodeError, ValueError, IndexError):
        raise UsageError(
            f"--host {host[:80]!r}: not an IP address (give one of this machine's, such as "
            f"127.0.0.1, ::1 or 0.0.0.0, or localhost; names are not looked up)"
        ) from None
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

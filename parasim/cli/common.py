"""What every command shares: a parser whose errors are one line, flag types that read digits only and
bound each size, and the ways out: JSON printed whole, files written whole, and a standard output that
may be full, closed, gone (a broken pipe) or unable to show a character."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..errors import OutputError, UsageError
from ..limits import decimal, digits, size_arg

if TYPE_CHECKING:  # a type only: the commands import nothing heavy before they run
    from ..comm.trace import Trace

# said by every command that runs a user's program on virtual ranks (their --help)
SHARED_PROCESS = (
    "Virtual ranks share parasim's one process: a program that ends that process itself (os._exit, "
    "a crash in C code) ends parasim with the program's own exit code and no line naming the rank. "
    "`parasim run FILE.py:FN --nproc N` (or check --against gloo) runs each rank in a process of its "
    "own, and names the rank that died."
)
INTERRUPTED = 130  # Ctrl-C, or SIGINT to parasim's own process: 128 + SIGINT
TERMINATED = 143  # SIGTERM: 128 + SIGTERM
BROKEN_PIPE = 141  # the exit code when stdout's reader has gone (`| head`): 128 + SIGPIPE, as a shell reports it


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (never a traceback or a usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


@contextlib.contextmanager
def signals_to(handler: Callable[[int, Any], None] | int, after: int | None = None) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` while the block runs; then back to what they went to before, or
    to `after` (signal.SIG_IGN: a process whose work is done, exiting). Only the main thread may set a
    handler: elsewhere (a caller's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was if after is None else after)


def end_now(signum: int, frame: Any) -> None:
    """A signal while nothing has started and nothing has been written: its one line, and out at once."""
    word, code = ("terminated", TERMINATED) if signum == signal.SIGTERM else ("interrupted", INTERRUPTED)
    os.write(2, f"parasim: {word}\n".encode())
    os._exit(code)


def import_before_starting(*modules: str) -> None:
    """Import `modules` (torch: seconds, and C++ code that an interrupt cut short can abort in) before a
    command starts anything, with Ctrl-C or SIGTERM meanwhile ending the process at once in one line. A
    module that is not installed is left to the command, which says what to install."""
    import importlib

    with signals_to(end_now):
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:
                return


def need_terminal(flag: str) -> None:
    """The app draws on a terminal and reads its keys: without one (stdin or stdout redirected, `< /dev/null
    > /dev/null`) it would wait for keys for ever. Refused in one line, before any work. Under `parasim
    serve` the app's terminal is the browser tab (textual-serve names its driver in TEXTUAL_DRIVER)."""
    missing = _not_terminals()
    if missing:
        raise UsageError(
            f"{flag} opens the app, which needs a terminal, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not one: run it from a terminal, or leave "
            f"{flag} out for text (--json for JSON; parasim serve puts the app in a browser)"
        )


def on_terminal() -> bool:
    """Whether the app can run here (see need_terminal): where a command opens it by default."""
    return not _not_terminals()


def _not_terminals() -> list[str]:
    if os.environ.get("TEXTUAL_DRIVER"):
        return []
    return [
        name
        for name, stream in (("standard input", sys.stdin), ("standard output", sys.stdout))
        if stream is None or not _is_terminal(stream)
    ]


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def positive(text: str) -> int:
    """A size flag: digits only, from 1 to limits.MAX_SIZE."""
    return size_arg(digits, text)


def add_sizes(
    parser: Any, parse: Callable[[str], Any] = positive, said: dict[str, str] | None = None, megatron: bool = False
) -> None:
    """A layout's size flags, one per mesh axis a layout is given a size for (layout/axes.py: --tp ... --etp,
    each with its own help and placeholder; `said`: what a command adds to an axis's help, such as its
    default); with `megatron`, each also under Megatron-LM's name (--tensor-model-parallel-size)."""
    from ..layout.axes import AXES, SIZED

    said = said or {}
    for name in SIZED:
        axis = AXES[name]
        flags = (f"--{name}",) + ((axis.megatron,) if megatron and axis.megatron else ())
        parser.add_argument(
            *flags,
            dest=name,
            type=parse,
            metavar=axis.metavar,
            help=axis.what + (f" ({said[name]})" if name in said else ""),
        )


def positive_up_to(limit: int, why: str) -> Callable[[str], int]:
    """A size flag bounded by what its command can do in seconds: the refusal names `limit` and `why`."""

    def parse(text: str) -> int:
        return size_arg(digits, text, limit, why)

    return parse


def count(text: str) -> int:
    """A number of things that may be none (0 experts: a dense model): digits only, up to limits.MAX_SIZE."""
    return size_arg(digits, text, least=0)


def seconds_arg(text: str) -> float:
    """A time limit in seconds: a finite number above 0, written as a decimal (checked before anything starts)."""
    from ..limits import check_timeout

    try:
        value = decimal(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds (such as 30 or 0.5), got {text[:40]!r}"
        ) from None
    try:
        check_timeout(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_timeout(p: argparse.ArgumentParser) -> None:
    """`--timeout S` on a command that runs programs on virtual ranks."""
    from ..limits import TIMEOUT

    p.add_argument(
        "--timeout",
        type=seconds_arg,
        default=TIMEOUT,
        metavar="S",
        help=f"seconds a rank may run without reaching a collective or returning (default {TIMEOUT:g}); "
        "past it the run stops, naming the rank and the line it was on",
    )


def width_arg(text: str) -> int:
    """`--width N`: a plain page's line width, 60 to the walk-through's widest."""
    from ..render.walkthrough import WIDEST

    width = positive_up_to(WIDEST, "wider lines stop reading at a glance")(text)
    if width < 60:
        raise argparse.ArgumentTypeError(f"--width {width}: at least 60 (a plain page's tables and lines need it)")
    return width


def progress_line(line: str) -> None:
    """A library call's progress, on stderr (stdout may be --json)."""
    print(line, file=sys.stderr, flush=True)


# -- the layers on pipeline stages ----------------------------------------------------------------------------
def stage_list(text: str) -> tuple[int, ...]:
    """`--stage-layers 4,4,4,3`: each stage's layers, first to last, digits only."""
    from ..layout.stages import STAGE_LIST_MAX

    words = text.split(",")
    if len(text) > 21 * STAGE_LIST_MAX or len(words) > STAGE_LIST_MAX:
        raise argparse.ArgumentTypeError(f"at most {STAGE_LIST_MAX:,} stages in a stage list")
    try:
        return tuple(size_arg(digits, w) for w in words)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected layer counts separated by commas (such as 4,4,4,3), got {text[:40]!r}"
        ) from None


def add_stages(p: Any) -> None:
    """The layers on pipeline stages, for layout, memory, fit and trace (layout/stages.py has the rules)."""
    g = p.add_argument_group(
        "layers on pipeline stages",
        "default: evenly (the layers divide by pp); a Hugging "
        "Face config whose layers do not divide, and the deepseek-v3 preset, as even as can be "
        "(the first L mod pp stages one layer more); with --megatron, the job's",
    )
    g.add_argument(
        "--first-stage-layers",
        "--decoder-first-pipeline-num-layers",
        dest="first_stage_layers",
        type=positive,
        metavar="N",
        help="layers on the first stage, the rest split evenly over the middle "
        "stages (Megatron's --decoder-first-pipeline-num-layers)",
    )
    g.add_argument(
        "--last-stage-layers",
        "--decoder-last-pipeline-num-layers",
        dest="last_stage_layers",
        type=positive,
        metavar="M",
        help="layers on the last stage (Megatron's --decoder-last-pipeline-num-layers)",
    )
    g.add_argument(
        "--stage-layers",
        type=stage_list,
        metavar="LIST",
        help="every stage's layers, first to last, one per stage (e.g. 4,4,4,3)",
    )


def stage_rule(args: argparse.Namespace) -> Any:
    """The stage rule the flags give (layout/stages.py's Stages), or None when none is given."""
    from ..layout.stages import Stages

    first, last = getattr(args, "first_stage_layers", None), getattr(args, "last_stage_layers", None)
    listed = getattr(args, "stage_layers", None)
    if listed is not None and (first is not None or last is not None):
        raise UsageError("give --stage-layers, or --first-stage-layers/--last-stage-layers, not both")
    if listed is not None:
        return Stages(counts=listed)
    if first is not None or last is not None:
        return Stages(first=first, last=last)
    return None


def with_stages(args: argparse.Namespace, model: Any) -> Any:
    """`model` with the stage rule the flags give in place of its own (unchanged when none is given)."""
    rule = stage_rule(args)
    if rule is None:
        return model
    if model is None or model.layers is None:
        raise UsageError("layers on stages need the model's layers (--layers N)")
    from dataclasses import replace

    return replace(model, stages=rule)


# -- output ---------------------------------------------------------------------------------------------
def program_output(args: argparse.Namespace) -> Any:
    """While a command's programs run: under --json, what they print goes to stderr, so that stdout
    carries the JSON alone (a user's program may print on every rank)."""
    import contextlib

    return contextlib.redirect_stdout(sys.stderr) if getattr(args, "json", False) else contextlib.nullcontext()


def json_text(obj: Any, indent: int | None = 1, where: str = "the output") -> str:
    """`obj` as strict JSON text (jsonout.py: no NaN or Infinity; a value with no JSON form is named in
    one line, UsageError). Made whole before anything is printed or written."""
    from ..jsonout import dumps

    return dumps(obj, indent=indent, where=where)


def print_json(obj: Any, indent: int | None = 1, where: str = "the output") -> None:
    """`--json`: `obj` as strict JSON on stdout, all of it or (a value with no JSON form) none of it."""
    text = json_text(obj, indent, where)
    sys.stdout.write(text + "\n")


def check_folder(path: str) -> None:
    """An output file's folder exists (checked before any work; the file itself is written at the end)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {path}: there is no folder {folder}")
    if os.path.isdir(path):
        raise UsageError(f"cannot write {path}: it is a folder; give a file name")


def write(path: str, text: str | bytes) -> None:
    """An output file (--trace, --chrome, ...) written whole or not at all (render/output.write_whole):
    UsageError (exit 2) for a name that cannot be written, OutputError (exit 1) when the disk is full."""
    from ..render.output import write_whole

    write_whole(path, text)


def write_json(path: str, obj: Any, where: str = "the file") -> None:
    """`obj` as strict JSON in file `path`, whole or not at all."""
    write(path, json_text(obj, None, where) + "\n")


def write_hta(path: str, trace: Trace, times: Any = None, work: Any = None) -> None:
    """`--hta DIR`: one Kineto-style trace per rank (DIR/rank<r>.json) for Holistic Trace Analysis; each
    file whole or not at all (all texts are made before the first is written)."""
    from ..render.chrome import to_hta

    if not path:
        raise UsageError("an empty folder name: give a folder to write the HTA traces to")
    texts = {r: json_text(f, None, f"rank {r}'s HTA trace") for r, f in to_hta(trace, times=times, work=work).items()}
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    for r, text in texts.items():
        write(os.path.join(path, f"rank{r}.json"), text)


class Stdout:
    """sys.stdout while a command runs. A character the terminal's encoding cannot show is written in an
    ASCII spelling (-> for an arrow) instead of failing; a write that fails (a full disk, a closed stdout)
    is an OutputError, one line and exit 1; a reader that went away (BrokenPipeError) is left to `main`,
    which ends quietly. Everything else is the stream's own."""

    def __init__(self, stream: Any):
        self.stream = stream  # None when the program started with stdout closed (`>&-`)

    def write(self, text: str) -> int:
        stream = self._open()
        try:
            try:
                return stream.write(text)
            except UnicodeEncodeError:  # a text stream encodes the whole string before it buffers any of it
                from ..render.output import shown

                return stream.write(shown(text, getattr(stream, "encoding", None)))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _failed(exc) from None

    def flush(self) -> None:
        if self.stream is None:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _failed(exc) from None

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    def _open(self) -> Any:
        if self.stream is None:
            raise OutputError("cannot write the output: standard output is closed (was it started with >&-?)")
        return self.stream

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer, ...: the stream's own
        return getattr(self._open(), name)


def _failed(exc: OSError) -> OutputError:
    return OutputError(f"cannot write the output: {exc.strerror or exc}")


def silence_stdout(stream: Any) -> None:
    """After stdout failed (a broken pipe, a full disk): point the process's file descriptor 1 at /dev/null,
    so that the interpreter's own flush at exit does not fail again with "Exception ignored" (the recipe in
    Python's documentation, "Note on SIGPIPE"). Only for the process's real stdout (not a test's capture)."""
    if stream is None or stream is not sys.__stdout__:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def add_clock(p: argparse.ArgumentParser) -> None:
    """The machine a run is timed on (clock/): --gpu-model, --gpus-per-node, --overlap."""
    from ..clock.overlaps import TRACE, names
    from ..estimate.hardware import GPUS

    g = p.add_argument_group(
        "timing",
        "the machine the run is timed on: every event gets a start and an end "
        "(parasim hardware lists the constants and their sources)",
    )
    g.add_argument("--gpu-model", choices=tuple(GPUS), default="h200", help="GPU type (default h200)")
    g.add_argument(
        "--gpus-per-node",
        type=positive,
        metavar="N",
        dest="clock_gpus_per_node",
        help="GPUs per node: hops between nodes take the network (default 8)",
    )
    g.add_argument(
        "--overlap",
        metavar="LIST",
        default="none",
        help=f"communication run beside compute: a comma-separated list of {', '.join(names(TRACE))}, "
        "or all, or none (the default); tp, p2p and cp are modelled in a plan's step "
        "(parasim memory, fit), not on a run's trace",
    )


def clock_choice(args: argparse.Namespace) -> Any:
    from ..clock.overlaps import TRACE, parse
    from ..clock.report import ClockChoice

    # commands that run a lesson's path without the timing flags (parasim view FILE.py:fn) time it on the defaults
    return ClockChoice(
        getattr(args, "gpu_model", "h200"),
        getattr(args, "clock_gpus_per_node", None),
        parse(getattr(args, "overlap", "none"), TRACE),
    )


def open_app(
    trace: Trace,
    narrative: dict,
    title: str,
    tables: list | None = None,
    run: Any = None,
    timeout: float | None = None,
    whatif: Any = None,
    quiz: bool = False,
) -> None:
    """The app over a trace, in this process (lesson, view, trace and serve open it); with the lesson's `run`,
    its what-if key re-runs the lesson at other settings; `whatif` (a real-size step's, tui/whatif.StepWhatIf)
    re-runs that instead. `quiz`: the lesson's questions asked as the app opens."""
    from ..engine.collector import CollectorHold
    from ..tui.app import ParasimApp
    from ..tui.view import View
    from ..tui.whatif import WhatIf

    # the collector's pass over the view's records (a real-size trace written out: half a second at 2,048 GPUs)
    # waits until the first screen is painted
    hold = CollectorHold()
    try:
        if run is not None:
            whatif = WhatIf(run.lesson, run, timeout)
            view = View(trace, narrative, title, tables=list(tables or []))
        else:  # a real-size step's what-if makes the view (on its clock, and shared with a re-timing of the step)
            view = whatif.view() if whatif is not None else View(trace, narrative, title, tables=list(tables or []))
        ParasimApp(view, whatif=whatif, painted=hold.release, quiz=quiz).run()
    finally:
        hold.release()

"""The sizes parasim accepts, checked before any work starts: past them a run would exhaust memory or
time on a workstation long before it taught anything. Each refusal is one line naming the limit and why."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

from .errors import UsageError

VIRTUAL_WORLD = 16_384  # virtual ranks hold real arrays: one greenlet, context and comm each (~15 KB)
LOCAL_PROCESSES = 128  # real ranks on one machine: one process with its own torch each (~300 MB)
LAYOUT_WORLD = 65_536  # GPUs in a layout: its groups are built and listed rank by rank
SCHEDULE_CELLS = 100_000  # ranks x micro-batches x chunks of a pipeline schedule: its slot table
FILE_BYTES = 1 << 30  # a trace or config file read whole into memory
KEPT_VALUES = 4_000_000  # numbers a virtual run keeps in its trace (keep_values), over all its calls:
# as Python lists about 32 bytes each, 128 MB; past it a call's values are dropped and counted
RECORD_KINDS = 65_536  # kinds of call (a signature on a group) whose members' records a virtual run reuses: each
# holds a few small tuples a member; past it a call's records are worked out afresh
JSON_DEPTH = 100  # levels of [ and { in a file read as JSON: parasim's own nest about 12 deep; Python's reader
# and printer recurse once a level and stop near 1,000
MAX_SIZE = 10**12  # any one size (hidden, tokens, GPUs, ...): far beyond every model, small enough for float64
PLOT_FORMATS = (".png", ".svg", ".pdf")


# What each command can do in seconds (measured on one core; each limit names what grows with it)
SLOT_TABLE = 1_000_000  # ranks x time slots of a schedule's timing: it fills them one by one
SLOTS_SHOWN = 10_000  # slots printed as a table (Rich lays out every cell: about 0.2 ms each)
SLOTS_PLOTTED = 2_000  # slots drawn as a picture (matplotlib sets out a box and a label for each: ~1 ms)
PLOT_GPUS = 256  # GPUs drawn in a layout picture (one box and label each, on a canvas that grows with them)
# GPUs x micro-batches of a real-size step the app lays out: it writes every GPU's part of the trace out, which grows
# with both (DeepSeek-V3's 2,048 x 16: 70,944 events, under a second; 2,048 x 64: 277,536, about 4 s and 0.8 GB)
APP_GPU_BATCHES = 65_536
NODES_SHOWN = 64  # nodes `parasim layout` draws, one panel each
EXPERTS_SHOWN = 131_072  # expert names drawn, GPUs x experts each holds (a table cell each: ~20 us a name)
TRACE_PASSES = 2_048  # GPUs x micro-batches x layers of the token trace's step on virtual ranks (~4 ms each)
TRACE_EXPERT_LAYERS = 1_024  # experts x layers in the token trace: every expert's weights, run and checked
SYMBOLIC_TOKENS = 1 << 22  # tokens per sequence in a symbolic step: it keeps each token's position (~100 bytes)
SYMBOLIC_PASSES = 256  # micro-batches x pipeline stages x CP ranks of a symbolic step with CP (each runs its layers)
# micro-batches x pipeline stages of a symbolic step without CP, whose layers run once per shape and are repeated on
# the trace for the other micro-batches (train/repeat.py): DeepSeek-V3's 64 x 16 in about 1.5 s and 0.8 GB
SYMBOLIC_REPEATED = 1_024
SEARCH_LAYOUTS = 200_000  # layouts one `fit --search` builds and checks by the layout rules (~40 us each)
SEARCH_TOP = 100  # layouts listed per node count
_DIGITS = re.compile(r"[0-9]+")  # int() also reads '1_000', '+5', ' 5' and '٥': not what a person meant
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")  # float() also reads 'nan'


def digits(text: str) -> int:
    """`text` as an integer when it is ASCII digits and nothing else; ValueError otherwise. Python's int()
    also takes underscores, a sign, spaces around and digits of other scripts, which a size never has."""
    if len(text) > 20 or not _DIGITS.fullmatch(text):  # 20: longer than any size (int() of 5,000 digits is slow)
        raise ValueError(f"not digits: {text[:40]!r}")
    return int(text)


def decimal(text: str) -> float:
    """`text` as a float when it is written as a plain decimal (4, 0.4, .5, 27e9); ValueError otherwise
    (float() also reads 'nan', 'inf', '1_0', ' 4' and '+4')."""
    if len(text) > 40 or not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal: {text[:40]!r}")
    return float(text)


def size_arg(parse: Callable[[str], int], text: str, limit: int = MAX_SIZE, why: str = "", least: int = 1) -> int:
    """A command-line size: `parse(text)`, from `least` (1) to `limit` (MAX_SIZE; `why` says why it is lower).
    `parse` is given only ASCII text that starts with a digit (it reads the rest, a suffix included)."""
    import argparse

    try:
        n = parse(text) if len(text) <= 20 and text.isascii() and text[:1].isdigit() else None
    except (ValueError, OverflowError):  # OverflowError: 'infK' is an infinity
        n = None
    if n is None or n < least or (n > limit and limit == MAX_SIZE):
        low = "a positive integer" if least == 1 else f"an integer from {least}"
        raise argparse.ArgumentTypeError(
            f"expected {low} up to {_amount(limit)}, got {text[:40]!r} (digits only, such as 4096)"
        )
    if n > limit:
        raise argparse.ArgumentTypeError(f"{n:,} is more than the limit of {limit:,} ({why})")
    return n


def _amount(n: int) -> str:
    return f"{n:.0e}" if n >= 10**9 else f"{n:,}"


def number_arg(text: str, low: float, high: float, what: str) -> float:
    """A command-line real number from `low` to `high` written as a plain decimal (see `decimal`)."""
    import argparse

    try:
        x = decimal(text)
    except ValueError:
        x = None
    if x is None or not low <= x <= high:
        raise argparse.ArgumentTypeError(
            f"expected {what} from {low:g} to {high:g}, got {text[:40]!r} (a decimal such as 0.4 or 27e9)"
        )
    return x


def at_most(what: str, value: Any, limit: int, why: str) -> None:
    """UsageError unless `value` <= `limit` (both already integers)."""
    if value > limit:
        raise UsageError(f"{what}: {value:,} is more than the limit of {limit:,} ({why})")


def check_symbolic_step(seq: int | None, microbatches: int, stages: int, cp: int = 1) -> None:
    """A step on symbolic ranks at real size (`memory/fit --symbolic`, `trace --symbolic` on a preset);
    `seq` None: a length not yet known. The ranks of a stage are folded onto one; `cp`: the CP ranks of a stage
    that run themselves (a ring's pass K and V to each other point to point; 1 where they fold,
    engine/symbolic/fold.keep_of): a stage's micro-batches run once per CP rank that runs."""
    if seq is not None:
        at_most(
            "tokens per sequence of a symbolic step",
            seq,
            SYMBOLIC_TOKENS,
            "the step keeps each token's position, about 100 bytes a token",
        )
    if cp == 1:
        at_most(
            f"micro-batches x pipeline stages of a symbolic step ({microbatches:,} x {stages:,})",
            microbatches * stages,
            SYMBOLIC_REPEATED,
            "each stage runs its layers once and tells the trace every micro-batch's events",
        )
        return
    at_most(
        f"micro-batches x pipeline stages x CP ranks of a symbolic step ({microbatches:,} x {stages:,} x {cp:,})",
        microbatches * stages * cp,
        SYMBOLIC_PASSES,
        "each runs its stage's layers forward and backward; CP ranks pass K and V to each other point to point, "
        "so each runs itself rather than folded (CP by all-gather, --cp-comm all_gather, folds them); parasim memory "
        "estimates such a layout without running it",
    )


def check_experts_shown(gpus: int, each: int) -> None:
    """A drawing that names each GPU's experts (E1 E2 ...): `gpus` drawn, holding `each` experts."""
    at_most(
        f"expert names drawn ({gpus:,} GPUs x {each:,} experts each)",
        gpus * each,
        EXPERTS_SHOWN,
        "each is written out; draw fewer nodes (--nodes) or split the experts over more EP ranks (--ep)",
    )


def check_app_gpus(world: int, microbatches: int) -> None:
    """A real-size step opened in the app (`trace --symbolic --app`, and its what-if)."""
    at_most(
        f"GPUs x micro-batches of a real-size step in the app ({world:,} x {microbatches:,})",
        world * microbatches,
        APP_GPU_BATCHES,
        "the app writes out and lays out every GPU's part of the step; --gpu N gives one GPU's view at any size",
    )


def check_plot_gpus(world: int) -> None:
    """A layout picture: one box per GPU."""
    at_most("GPUs in a layout picture", world, PLOT_GPUS, "--plot draws a box and a label for each GPU")


TIMEOUT = 30.0  # seconds: the default time limit of a rank (real: in one call; virtual: between two calls)
MAX_TIMEOUT = 1e6


def check_timeout(timeout: Any) -> None:
    """UsageError unless `timeout` is a finite number of seconds above zero (checked before any start)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < MAX_TIMEOUT:
        raise UsageError(f"timeout must be a number of seconds above 0 and below 1e6, got {timeout!r}")


REAL_MIN_TIMEOUT = 1.0  # seconds: real ranks are processes that must start, meet and answer each other in it


def check_real_timeout(timeout: Any) -> None:
    """check_timeout, and at least REAL_MIN_TIMEOUT: on real ranks the limit also bounds each process's
    start and its meeting with the others, which a shorter limit cuts off before the program runs."""
    check_timeout(timeout)
    if timeout < REAL_MIN_TIMEOUT:
        raise UsageError(
            f"timeout must be at least {REAL_MIN_TIMEOUT:g} s on real ranks, got {timeout!r}: the same "
            "limit bounds how long the rank processes may take to start and connect to each other, "
            "which can take longer than that"
        )


def check_processes(nproc: int) -> None:
    at_most(
        "real ranks (processes)",
        nproc,
        LOCAL_PROCESSES,
        "each real rank is a process with its own torch, all on this machine",
    )


def read_bounded(path: str, what: str = "file", limit: int = FILE_BYTES) -> bytes:
    """A file's bytes, refusing what is not a regular file (a device, a pipe, a folder) or is too large."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    import stat

    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path} is not a regular file")
    at_most(f"{what} {path}: bytes", st.st_size, limit, "parasim reads it whole into memory")
    try:
        with open(path, "rb") as f:  # read(n) allocates n bytes first: ask for what the file holds
            data = f.read(st.st_size + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    at_most(f"{what} {path}: bytes", len(data), limit, "parasim reads it whole into memory")  # it grew
    return data


# -- JSON files ---------------------------------------------------------------------------------------------
# json.loads alone lets a hostile file through in several ways: UTF-16 text it decodes silently, nesting deep
# enough to raise RecursionError, an integer of thousands of digits (seconds to read, then a ValueError), a
# field given twice (the last one silently wins), NaN; and where it fails it seldom says where. Each is one
# line here, naming the place where it can. Traces, checkpoints' listings and model configs are read so.
JSON_DIGITS = 20  # digits of an integer in a file: uint64 has 20, and no size or count parasim reads needs more
_WIDE = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),  # before UTF-16: FF FE starts both
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
# strings (escapes inside), numbers, and the punctuation that opens, closes and separates
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|NaN|-?Infinity|[\[\]{},]')


def read_json(data: bytes, name: str, what: str = "a JSON file", constants: bool = False) -> Any:
    """A file's bytes (`name` says which file) as JSON: UTF-8 (a leading byte-order mark allowed), integers
    of at most JSON_DIGITS digits, each field once in an object, floats in range, and NaN or Infinity only
    with `constants` (traces written before strict JSON hold them). Anything else is one UsageError naming
    the file, what it should be (`what`, "a parasim trace") and, where it can, the place. Nesting too deep
    for the reader is named at level JSON_DEPTH; the caller's own checks bound the depth of what it reads."""
    text = _utf8(data, name, what)
    if not text.strip():
        raise UsageError(f"{name} is empty, not {what}")
    try:
        return json.loads(
            text,
            parse_int=_whole,
            parse_float=None if constants else _finite,
            parse_constant=None if constants else _no_constant,
            object_pairs_hook=_once,
        )
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")  # ran into the end
        raise UsageError(
            f"{name} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            + (" (the file ends there: was it cut short?)" if cut else "")
        ) from None
    except _Refused as exc:
        raise UsageError(f"{name} is not {what}: {_place(text, exc)}") from None
    except RecursionError:  # nested past the reader's own depth
        raise UsageError(f"{name} is not {what}: {_place(text, None)}") from None


def _utf8(raw: bytes, name: str, what: str) -> str:
    wide = next((enc for bom, enc in _WIDE if raw.startswith(bom)), None)
    if wide is None and b"\x00" in raw[:4]:  # JSON starts in ASCII: a NUL beside it is UTF-16/32 without a mark
        wide = "UTF-16" if raw[:4].count(b"\x00") <= 2 else "UTF-32"
    if wide is not None:
        raise UsageError(f"{name} is {wide} text; {what} is UTF-8 JSON (iconv -f {wide} -t UTF-8 converts it)")
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            raise UsageError(f"{name} ends in the middle of a character: the file was cut short") from None
        raise UsageError(
            f"{name} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start:,}); {what} is UTF-8 JSON"
        ) from None


class _Refused(ValueError):
    """A value json.loads read that the file may not hold; `why` says what it is."""

    def __init__(self, why: str, token: str | None = None):
        super().__init__(why)
        self.why, self.token = why, token


def _whole(text: str) -> int:
    if len(text.lstrip("-")) > JSON_DIGITS:  # before int(): Python would spend seconds on 100,000 digits
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (no count needs more than {JSON_DIGITS})", text)
    return int(text)


def _finite(text: str) -> float:
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise _Refused(f"{text[:30]} is past the range of a float", text)
    return x


def _no_constant(text: str) -> Any:
    raise _Refused(f"{text} is not a JSON number (strict JSON has no NaN or Infinity)", text)


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"the field {brief(k)} appears twice in one object")
        out[k] = v
    return out


def _place(text: str, exc: _Refused | None) -> str:
    """Where in JSON `text` it nests more than JSON_DEPTH levels deep (exc None) or holds the token `exc`
    refused, and which: what json.loads raised without saying where."""
    open_: list[list] = []  # per open container: [its key or index, whether an object's next string is a key]
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            if exc is None and len(open_) == JSON_DEPTH:
                return f"{_where(open_)}: nested more than {JSON_DEPTH} levels deep"
            open_.append([0, False] if tok == "[" else [None, True])
        elif tok in ("]", "}"):
            if open_:
                open_.pop()
        elif tok == ",":
            if open_:
                top = open_[-1]
                if isinstance(top[0], int):
                    top[0] += 1
                else:
                    top[1] = True
        elif tok[0] == '"':
            if open_ and open_[-1][1]:
                open_[-1][:] = [tok[1:-1], False]
        elif exc is not None and exc.token is not None and tok == exc.token:
            return f"{_where(open_)}: {exc.why}"
    if exc is not None:
        return exc.why
    return f"nested more than {JSON_DEPTH} levels deep"


def _where(open_: list[list]) -> str:
    """The path of the innermost open container's current place: groups[2].ranks[0], meta['a b']."""
    where = ""
    for key, _ in open_:
        where = json_step(where, key) if key is not None else where
    return cut_path(where) or "the top level"


def cut_path(where: str) -> str:
    """A path a hundred levels long, cut to its start (at a step's boundary): no line holds it whole."""
    if len(where) <= 80:
        return where
    at = max(where.rfind("[", 0, 60), where.rfind(".", 0, 60))
    return where[: at if at > 0 else 60] + "..."


def json_step(where: str, key: Any) -> str:
    """`where` and one step down: [3] for an index, .name for a key that reads as a name, else ['a key']."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{brief(key)}]"


def brief(v: Any) -> str:
    """A short repr of a value from a file, whatever its size: control characters escaped, long lists cut."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = 60
    r.maxlist = r.maxdict = 6
    r.maxlevel = 3
    return r.repr(v)


def check_plot_path(path: str) -> None:
    """A picture is written to a file named with a format matplotlib writes, not into a folder."""
    if not path or os.path.isdir(path):
        raise UsageError(f"--plot needs a file name (FILE.png), got {path!r}")
    if not path.lower().endswith(PLOT_FORMATS):
        raise UsageError(f"--plot {path}: name a {', '.join(PLOT_FORMATS)} file")

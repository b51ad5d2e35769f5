"""The `parasim` command: one thin module per command (parse, call the library, call a renderer).

Exit codes, the same for every command:
  0    done (and, for a command that checks, everything agreed)
  1    a failing run (a rank that raised, a mismatch, a divergence, a check that failed), or output that
       could not be written (a full disk, a closed stdout): one line on stderr. Files are written whole
       or not at all (a temporary file renamed over the name), so a failed write leaves nothing behind.
  2    bad input (a flag, a file, a user's program, an output path in a folder that does not exist):
       one line on stderr, before any work where it can be known then
  130  interrupted (Ctrl-C, or SIGINT sent to parasim's own process): `parasim: interrupted`
  143  stopped by SIGTERM (as a supervisor stops a job): `parasim: terminated`
  141  stdout's reader went away (`parasim lesson x | head -1`): nothing more is written and nothing is
       said, as other Unix tools end on a broken pipe (128 + SIGPIPE, the code a shell shows for them)
On 130 and 143 every process parasim started (real ranks, browser apps) has ended before it exits.
Virtual ranks share parasim's one process: a user's program that ends that process itself (os._exit(7), a
crash in C code) ends parasim with that program's code and no line of parasim's; run it with
`--backend gloo` (each rank its own process) to have the rank named.
A terminal that cannot show a character gets its ASCII spelling (-> for an arrow, x for a times sign).

This module is kept small: it takes over Ctrl-C and SIGTERM before the commands (numpy, Rich, the engine)
are imported, so an interrupt that lands during that import is one line too, not the traceback of
whichever import it cut short.
"""

from __future__ import annotations

import signal
from typing import Any, Sequence

from .common import end_now, signals_to  # argparse and parasim's errors: quick to import


def main(argv: Sequence[str] | None = None) -> int:
    """`parasim ARGS`: the exit code (see above)."""
    # argv None: this process is the `parasim` command, and once the command is done what is left is its exit
    # (a signal then would interrupt Python's shutdown, or torch's atexit callbacks, with a traceback)
    exiting = argv is None
    with signals_to(end_now, after=signal.SIG_IGN if exiting else None):
        # the imports and the parser (every command's module, numpy, Rich): nothing has started yet, and numpy
        # turns a KeyboardInterrupt inside its own import into an ImportError
        from .commands import build_parser as build, run_command
        from .common import INTERRUPTED, TERMINATED

        parser = build()
        try:
            code = run_command(argv, parser, exiting=exiting)  # its own handlers from here on
        except KeyboardInterrupt:  # raised again on the way out (C code that held the first one): still 130
            code = INTERRUPTED
    if exiting and code in (INTERRUPTED, TERMINATED):
        # an interrupted command has ended everything it started and said its line: it leaves with its code at
        # once, without Python's own shutdown (torch's exit callbacks), where an interrupt some C code kept
        # pending could turn the exit into a kill by SIGINT
        import contextlib
        import os
        import sys

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


def build_parser() -> Any:
    """The whole command line's parser (every command's flags)."""
    from .commands import build_parser as build

    return build()

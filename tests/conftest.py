"""Shared test helpers."""
from __future__ import annotations

import contextlib
import io
from unittest import mock
import os
import subprocess
import sys

import pytest
from hypothesis import Phase, settings

# Mutation runs (scripts/mutation.sh sets PARASIM_HYPOTHESIS=mutation) only need to know that a property
# fails: a mutant that breaks one must not then spend minutes shrinking the example.
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
if os.environ.get("PARASIM_HYPOTHESIS"):
    settings.load_profile(os.environ["PARASIM_HYPOTHESIS"])

# Mutation runs: mutmut 3 reaches every function of the mutated package through its trampoline, frames of
# mutmut/mutation/trampoline.py between each caller and the function it calls. They make the call on the
# caller's behalf, so a call site passes over them as over parasim's own wrappers (comm/sites.py
# `is_wrapper`). mutmut sets MUTANT_UNDER_TEST in every process that runs tests (scripts/mutation_focus.py
# too); no other run has trampolines, and the package itself knows nothing of them.
MUTMUT_TRAMPOLINE = os.path.join("mutmut", "mutation", "trampoline.py")


def pytest_configure(config: pytest.Config) -> None:
    if "MUTANT_UNDER_TEST" not in os.environ:
        return
    from parasim.comm import sites
    if hasattr(sites.is_wrapper, "plain"):  # a second session in the same process (mutmut runs several)
        return
    plain = sites.is_wrapper

    def is_wrapper(frame) -> bool:
        return frame.f_code.co_filename.endswith(MUTMUT_TRAMPOLINE) or plain(frame)

    is_wrapper.plain = plain  # the package's own test, for tests/unit/nn/test_hidden_state.py
    sites.is_wrapper = is_wrapper


def session_pids(sid: int) -> list[int]:
    """The live processes of session `sid` (a command started with start_new_session: it and all its own); a
    zombie has ended and is not counted."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(pid))
    return out


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """`parasim ARGS` in this process (so coverage and mutation testing see the code it runs), returning
    what a subprocess would: the exit code, stdout and stderr; `input`: what stdin holds (a quiz's answers).
    `python -m parasim` itself is tested apart."""
    from parasim.cli import main
    out, err = io.StringIO(), io.StringIO()
    stdin = contextlib.nullcontext() if input is None else mock.patch("sys.stdin", io.StringIO(input))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), stdin:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return subprocess.CompletedProcess(["parasim", *args], code, out.getvalue(), err.getvalue())


def cli_process(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m parasim ARGS` as a separate process (real ranks, the entry point itself)."""
    return subprocess.run([sys.executable, "-m", "parasim", *args], capture_output=True, text=True, timeout=timeout)


def site_at(path: str, marker: str) -> str:
    """'file:line' of the line of test file `path` ending in `# marker`, named from the package's root as
    the engine names call sites (a site an event or error must show)."""
    import os

    import parasim
    with open(path) as f:
        (n,) = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}")]
    return f"{os.path.relpath(path, os.path.dirname(os.path.dirname(parasim.__file__)))}:{n}"


def trace_key(trace) -> tuple[list, list]:
    """What two backends of one program must record alike: every event (step, op, group, members' tensors,
    bytes and sites) and the held, phase and tensor marks; not values or times."""
    events = [(e.step, e.kind, e.op, e.group.name, e.ranks, e.label, e.phase,
               [(m.rank, m.ins, m.outs, m.sent, m.recv, m.site) for m in e.members]) for e in trace.events]
    marks = [(m.rank, m.step, m.kind, m.text, m.data) for m in trace.marks if m.kind in ("held", "phase", "tensor")]
    return events, marks

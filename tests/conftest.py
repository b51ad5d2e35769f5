"""Shared test helpers."""
from __future__ import annotations

import contextlib
import io
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


def cli(*args: str) -> subprocess.CompletedProcess:
    """`parasim ARGS` in this process (so coverage and mutation testing see the code it runs), returning
    what a subprocess would: the exit code, stdout and stderr. `python -m parasim` itself is tested apart."""
    from parasim.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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


@pytest.fixture(autouse=True)
def _cold_caches():
    """Every test starts with the engine's pure memos empty (symbolic shape rules, ring positions): a test
    then exercises the rules themselves, whatever ran before it in the same process (mutation testing
    forks test processes from one that has run others)."""
    from parasim.nn.ring_attention import _positions, _slices
    from parasim.symbolic import array
    array._UFUNC_RESULTS.clear()
    _positions.cache_clear()
    _slices.cache_clear()
    yield

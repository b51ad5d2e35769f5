"""`parasim --completion bash|zsh`: the script is made from the parsers, and bash itself completes with it.
Each case types a partial command line and checks what bash offers (the words typed here by hand)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import cli


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    r = cli("--completion", "bash")
    assert r.returncode == 0 and r.stderr == ""
    path = tmp_path_factory.mktemp("completion") / "parasim.bash"
    path.write_text(r.stdout)
    return path


def offered(script, line: str) -> list[str]:
    """What bash's completion function offers for `line` (the cursor at its end), in a real bash."""
    words = line.split(" ")
    program = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        '_parasim; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True).stdout
    return sorted(w for w in out.split("\n") if w)


@pytest.mark.parametrize(
    "line, words",
    [
        ("parasim mem", ["memory"]),
        ("parasim --compl", ["--completion"]),
        ("parasim memory --job-f", ["--job-format"]),
        ("parasim memory --emit ", ["deepspeed", "megatron", "picotron", "torchtitan", "torchtitan-py"]),
        ("parasim memory --job-format p", ["picotron"]),
        ("parasim lesson tp-", ["tp-across-nodes", "tp-attention", "tp-mlp"]),
        ("parasim run pp-1", ["pp-1f1b"]),
        ("parasim validate ", ["--help", "-h", "moe-layer", "step-time"]),
        ("parasim schedule --schedule zb", ["zb-h1", "zbv"]),
        ("parasim memory --tp ", []),  # a number: nothing offered (bash falls back to its own completion)
    ],
)
def test_bash_completes(script, line, words):
    assert offered(script, line) == words


def test_zsh_takes_the_bash_script_through_bashcompinit():
    r = cli("--completion", "zsh")
    assert r.returncode == 0
    assert r.stdout.splitlines()[1] == "autoload -U +X bashcompinit && bashcompinit"
    assert "complete -o default -F _parasim parasim" in r.stdout
    if shutil.which("zsh") is None:
        pytest.skip("no zsh here to run the script")
    subprocess.run(["zsh", "-n", "-c", r.stdout], check=True, timeout=60)


def test_an_unknown_shell_is_refused():
    r = cli("--completion", "fish")
    assert r.returncode == 2 and "invalid choice" in r.stderr

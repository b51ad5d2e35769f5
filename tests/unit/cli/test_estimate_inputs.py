"""What `memory` and `fit` read from their flags and say back: a K or M suffix counts in powers of two (a 32K
context is 32,768 tokens), a plan given no degrees says it is for one GPU, and --json names what its active
parameter count leaves out. Every expected value is typed here or worked by hand beside it."""

from __future__ import annotations

import json

import pytest
from conftest import cli


def _json(*args: str) -> dict:
    r = cli("memory", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


TINY = ("--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "1000")


@pytest.mark.parametrize(
    "given, tokens",
    [
        ("32K", 32 * 1024),  # how context lengths are quoted: Llama 3's "8K" is 8,192
        ("32k", 32 * 1024),
        ("1.5K", 1536),
        ("1M", 1024 * 1024),
        ("32000", 32000),  # digits are taken as written
    ],
)
def test_seq_suffix_counts_in_powers_of_two(given, tokens):
    assert _json(*TINY, "--seq", given)["seq"] == tokens


def test_a_size_flag_takes_the_suffix_too():
    """A 128K vocabulary is 131,072 entries (estimator.md's assumption 2 reads the post's that way)."""
    base = ("--layers", "2", "--hidden", "64", "--heads", "4", "--vocab")
    assert _json(*base, "128K") == _json(*base, "131072") != _json(*base, "128000")


def test_one_gpu_plan_says_it_was_given_no_degrees():
    r = cli("memory", *TINY)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert "one GPU (--tp, --pp, --dp or --gpus N spread it)" in first and "1 GPUs" not in first
    r = cli("memory", *TINY, "--tp", "2")
    assert r.returncode == 0 and "TP2 on 2 GPUs" in r.stdout.splitlines()[0]


def test_active_params_say_what_they_leave_out():
    """Two layers of hidden 64 and a vocabulary of 1,000, embeddings untied: the input table and the output head
    hold 2 x 1,000 x 64 = 128,000 parameters; the count with them adds exactly those. For a dense model every
    parameter is active, so with the embeddings it is the whole count."""
    got = _json(*TINY)
    assert got["active_params_with_embeddings"] - got["active_params"] == 2 * 1000 * 64
    assert got["active_params_with_embeddings"] == got["params"]

"""Every `--json` output is strict JSON (RFC 8259): a reader that refuses NaN and Infinity reads it, over
every lesson and every command that takes --json, the cases that once wrote NaN or Infinity included.
A value with no JSON form is named in one line with nothing printed before it."""
from __future__ import annotations

import json
import math

import pytest

from parasim.lesson import load_lessons
from tests.conftest import cli

SLOW_LESSONS = {"moe16-variants", "at-scale", "node-limited", "rules-of-thumb"}  # several seconds each (rules-of-thumb: its own test reads its --json)


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON (RFC 8259)")


def strict(text: str):
    """What a strict reader makes of `text`; ValueError for NaN, Infinity or -Infinity."""
    return json.loads(text, parse_constant=_refuse)


def test_the_strict_reader_refuses_what_python_writes_by_default():
    """The reader above can fail: Python's own json.dumps writes NaN and Infinity, which it refuses."""
    with pytest.raises(ValueError, match="NaN is not JSON"):
        strict(json.dumps({"x": math.nan}))
    with pytest.raises(ValueError, match="Infinity is not JSON"):
        strict(json.dumps([1.0, -math.inf]))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_LESSONS else n
                                  for n in load_lessons()])
def test_every_lesson_json_is_strict(name):
    got = cli("lesson", name, "--json")
    assert got.returncode == 0, got.stderr
    data = strict(got.stdout)
    assert data["lesson"] == name and all(c["ok"] for c in data["checks"])


COMMANDS = [
    ["lesson", "--json"],
    ["trace", "--json"],
    ["trace", "--gpu", "3", "--json"],
    ["trace", "--symbolic", "--layout", "27b-tp2-sp-pp4", "--gpu", "0", "--json"],
    ["layout", "--tp", "2", "--cp", "2", "--json"],
    ["layout", "--list", "--json"],
    ["memory", "--model", "27b", "--tp", "8", "--sp", "--json"],
    ["memory", "--model", "deepseek-v3", "--pp", "16", "--ep", "64", "--gpus", "2048", "--json"],
    ["memory", "--model", "27b", "--tp", "2", "--sp", "--symbolic", "--json"],
    ["fit", "--model", "27b", "--tp", "8", "--sp", "--json"],
    ["fit", "--model", "27b", "--usable", "0.001", "--json"],  # nothing fits: the longest sequence is 0
    ["fit", "--model", "27b", "--search", "--nodes", "1-4", "--json"],
    ["schedule", "--json"],
    ["schedule", "--schedule", "dualpipev", "-m", "8", "--json"],
    ["check", "silent-bugs", "--json"],
    ["check", "silent-bugs", "--bug", "dense-over-dp", "--json"],
    ["hardware", "--json"],
    ["check-layout", "--megatron", "tests/data/megatron/train_mixtral_8x7b_distributed.sh", "--json"],
    ["validate", "step-time", "--json"],
    ["compare", "pp-1f1b", "--pp", "2,4", "--json"],
    # a Megatron-LM job read as it is, and answers written back as its flags
    ["memory", "--megatron", "tests/data/megatron/train_gpt3_175b_distributed.sh", "--megatron-args", "--json"],
    ["fit", "--megatron", "tests/data/megatron/train_llama3_8b_h100_fp8.sh", "--megatron-args", "--json"],
    ["fit", "--model", "27b", "--search", "--nodes", "1-2", "--megatron-args", "--json"],
    ["layout", "--megatron", "tests/data/megatron/train_mixtral_8x7b_distributed.sh", "--megatron-args", "--json"],
    ["trace", "--megatron", "tests/data/megatron/train_mixtral_8x7b_distributed.sh", "--gpu", "0", "--json"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[f"{a[0]}-{i}" for i, a in enumerate(COMMANDS)])
def test_every_command_json_is_strict(argv):
    got = cli(*argv)
    assert got.returncode in (0, 1), got.stderr  # 1: a check that found the planted bug
    strict(got.stdout)


PROGRAM = '''
import numpy as np


def program(ctx):
    g = ctx.new_group(range(ctx.world), "dp")
    y = ctx.comm.all_reduce(ctx.xp.ones(4), group=g, label="sum")
    return ctx.mark("y", y, "Replicate()", g)


def reference(ctx):  # zeros: the error relative to it is infinite
    g = ctx.new_group(range(ctx.world), "dp")
    return ctx.mark("y", ctx.xp.zeros(4), "Replicate()", g)


def odd(ctx):
    return {"nan": float("nan"), "inf": float("inf"), "values": np.array([np.nan, -np.inf, 1.0])}
'''


def test_what_was_nan_or_infinity_is_strict(tmp_path):
    """The cases that wrote NaN or Infinity: `check --json` against a reference of zeros (an infinite
    relative error), and a rank that returns NaN and infinities: each written as the strings JSON allows."""
    path = tmp_path / "odd.py"
    path.write_text(PROGRAM)
    got = cli("check", f"{path}:program", "--world", "2", "--json")
    assert got.returncode == 1, got.stderr
    assert strict(got.stdout)["first_divergence"]["max_rel"] == "inf"
    got = cli("lesson", f"{path}:odd", "--world", "2", "--json")
    assert got.returncode == 0, got.stderr
    assert strict(got.stdout)["values"][1] == {"nan": "nan", "inf": "inf", "values": ["nan", "-inf", 1.0]}


UNENCODABLE = [
    ("lambda: 0", "a function"),
    ("__import__('threading').Lock()", "a lock"),
    ("{1, 2}", "a set"),
    ("(x for x in range(2))", "a generator"),
    ("np.array([object()])", "a numpy array of dtype object"),
    ("np.array([1j])", "a numpy array of dtype complex128"),
]


@pytest.mark.parametrize("value, kind", UNENCODABLE, ids=["function", "lock", "set", "generator", "object", "complex"])
def test_a_value_with_no_json_form_is_named_and_nothing_printed(tmp_path, value, kind):
    path = tmp_path / "bad.py"
    path.write_text(f"import numpy as np\n\n\ndef fn(ctx):\n    return {{'k': {value}}} if ctx.rank == 1 else 0\n")
    chrome = tmp_path / "c.json"
    got = cli("lesson", f"{path}:fn", "--world", "2", "--json", "--chrome", str(chrome))
    assert got.returncode == 2 and got.stdout == "", got.stdout[:200]
    assert "rank 1's value, at ['k']" in got.stderr and kind in got.stderr and got.stderr.count("\n") == 1, got.stderr
    assert not chrome.exists()  # the JSON is made first: nothing is written when it cannot be


@pytest.mark.slow
def test_a_real_run_json_is_strict():
    got = cli("run", "collectives", "--json")
    assert got.returncode == 0, got.stderr
    assert strict(got.stdout)["backend"] == "gloo"

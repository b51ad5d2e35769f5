"""Issue 52: `parasim trace` takes a worked example by name (examples/worked.py). A scratch example added as
one entry (here the post's MoE example run with one micro-batch a replica, under another name) is offered by
`--example`, and trace and compare layout run it; neither command names an example."""
import dataclasses
import json

import pytest

from parasim.examples import worked
from parasim.errors import UsageError

from conftest import cli


@pytest.fixture
def scratch(monkeypatch):
    def one_micro_batch():
        return dataclasses.replace(worked.EXAMPLES["moe16"](), name="scratch", micro_batches=1)
    monkeypatch.setitem(worked.EXAMPLES, "scratch", one_micro_batch)


def _ep_bytes(out: str) -> int:
    return sum(json.loads(out)["bytes_by_link"]["by_group"]["ep"].values())


def test_a_new_example_is_its_one_entry_and_trace_runs_it(scratch):
    usual, mine = cli("trace", "--json"), cli("trace", "--example", "scratch", "--json")
    assert usual.returncode == 0 and mine.returncode == 0, mine.stderr
    # the post's example feeds each replica 2 micro-batches, the scratch one 1: 'contract' (sequence A, the first
    # micro-batch) is followed alike, and the all-to-alls, one set per micro-batch, run half as often (their
    # bytes follow where the router sends each sequence's tokens, so fewer, not exactly half)
    assert json.loads(mine.stdout)["micro_batch"] == json.loads(usual.stdout)["micro_batch"] == 1
    assert 0 < _ep_bytes(mine.stdout) < _ep_bytes(usual.stdout)
    assert "scratch" in " ".join(cli("trace", "--help").stdout.split())
    compared = cli("compare", "layout", "--example", "scratch", "--tp", "2", "--sp", "--ep", "2,4", "--world", "8",
                   "--json")
    assert compared.returncode == 0, compared.stderr
    assert [r["settings"]["ep"] for r in json.loads(compared.stdout)["rows"]] == [2, 4]


def test_an_unknown_example_is_one_line():
    assert cli("trace", "--example", "nope").returncode == 2
    with pytest.raises(UsageError, match="unknown worked example 'nope'; examples: moe16"):
        worked.example("nope")
    bad = cli("compare", "sp", "--example", "moe16", "--tp", "2,4")
    assert bad.returncode == 0 or "--example" not in bad.stderr  # the default example is no layout setting

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


def test_a_notebook_traces_a_token_and_views_a_gpu_as_the_command_does():
    """Issue 52's thin CLI: `parasim trace` parses its flags into a TraceQuery and calls examples/tracing.py;
    the same calls from Python give what --json prints, and say whether the run matched the unsplit model."""
    from parasim.examples.tracing import TraceQuery, gpu_view, token_trace, traced_step
    from parasim.layout import Layout

    ex = worked.example("moe16")
    layout = Layout(tp=2, ep=4, etp=1, sp=True, world=8, model=ex.model, zigzag=False)
    q = TraceQuery(layout, str(layout))
    path = token_trace(q)
    assert path.ok and path.to_dict() == json.loads(cli("trace", "--tp", "2", "--ep", "4", "--sp", "--world", "8",
                                                        "--json").stdout)
    view = gpu_view(q, 5, path.step)  # the same step, viewed from GPU 5: no second run
    assert view.step is path.step and view.to_dict()["gpu"] == 5 and view.ok
    assert view.to_dict() == json.loads(cli("trace", "--tp", "2", "--ep", "4", "--sp", "--world", "8", "--gpu", "5",
                                            "--json").stdout)
    # symbolic ranks have no router scores: a policy routes, and nothing is compared with the unsplit model
    sym = TraceQuery(layout, "x", routing="balanced", symbolic=True)
    step = traced_step(sym)
    assert step.result.trace.backend == "symbolic" and token_trace(sym, step).path["exactness"] is None
    assert token_trace(sym, step).path["routing"] == "balanced" and path.path["routing"] == "learned"
    assert token_trace(sym, step).to_dict() == json.loads(cli("trace", "--tp", "2", "--ep", "4", "--sp", "--world",
                                                              "8", "--routing", "balanced", "--symbolic", "--json",
                                                              ).stdout) | {"layout": "x"}
    with pytest.raises(UsageError, match="no router scores"):
        traced_step(TraceQuery(layout, "x", symbolic=True))
    # an unknown GPU type is one line, as the command says it, and before any step runs (a notebook's typo)
    with pytest.raises(UsageError, match=r"^unknown --gpu-model 'h900'; presets: .*\bh100\b"):
        gpu_view(TraceQuery(layout, "x", gpu_model="h900"), 5)


def test_a_gpu_at_real_size_is_viewed_from_its_own_stage():
    """A full-size preset on symbolic ranks (27B on TP 2 x PP 4): GPU 7 sits on the last stage, whose peak is
    not the first stage's; the view is the command's --json, and at real size there is no token to follow."""
    from parasim.examples.tracing import TraceQuery, gpu_view, token_trace
    from parasim.layout import preset

    q = TraceQuery(preset("27b-tp2-sp-pp4"), "27b-tp2-sp-pp4", symbolic=True)
    last, first = gpu_view(q, 7), gpu_view(q, 0)
    assert last.view["coords"]["pp"] == 3 and first.view["coords"]["pp"] == 0
    assert last.view["peak"]["bytes"] == last.step.result.trace.peak(7)["bytes"] < first.view["peak"]["bytes"]
    assert last.to_dict() == json.loads(cli("trace", "--layout", "27b-tp2-sp-pp4", "--symbolic", "--gpu", "7",
                                            "--json").stdout)
    with pytest.raises(UsageError, match="no word to follow"):
        token_trace(q)

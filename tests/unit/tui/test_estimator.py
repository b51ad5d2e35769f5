"""The live estimator (`parasim memory --app`): its settings move one step at a time and each answer is the one
`parasim memory --json` gives for the settings on screen (the command, parsing its own flags, is the
reference); the bar's cells worked by hand; the app driven with Pilot at 100 x 30."""

from __future__ import annotations

import json

import pytest
from conftest import cli

from parasim.api import _query
from parasim.tui.estimator import Estimator, bar


def estimator(**plan) -> Estimator:
    return Estimator.from_query(_query("27b", 8192, "h200", None, (), {"tp": 8, "sp": True, **plan}))


def command(*flags: str) -> dict:
    r = cli("memory", "--model", "27b", "--seq", "8192", *flags, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_app_starts_from_the_command_s_whole_plan():
    """What the view does not move (micro-batches, the kept attention scores, a job's kernels) stays the
    command's: the first answer is `parasim memory --json`'s for the same flags."""
    from parasim.cli.commands import build_parser
    from parasim.cli.estimate import query_of

    for flags in (["--pp", "4", "--microbatches", "16", "--dp", "2"], ["--no-flash", "--tp", "2"]):
        a = Estimator.from_query(query_of(build_parser().parse_args(["memory", "--model", "27b", *flags]))).answer()
        r = cli("memory", "--model", "27b", *flags, "--json")
        want = json.loads(r.stdout)
        assert (a["total"], a["step_s"]) == (want["total"], want["time"]["step_s"])


def shown(items: dict, zero: int) -> dict:
    """The view's bar, as a table's: ZeRO-3's gathered layers only under ZeRO-3 (--json keeps every item)."""
    return {k: v for k, v in items.items() if k != "ZeRO-3 gathered layers" or zero == 3}


def test_each_answer_is_the_command_s():
    e = estimator()
    a = e.answer()
    want = command("--tp", "8", "--sp")
    assert (a["items"], a["total"], a["fits"], a["step_s"]) == (
        shown(want["items"], 1), want["total"], want["fits"], want["time"]["step_s"])
    e.move("tp", 1)
    e.move("recompute", 1)
    e.move("dp", 1)
    a = e.answer()
    want = command("--tp", "16", "--sp", "--recompute", "selective", "--dp", "2")
    assert a["label"] == "TP16 + SP + DP2 + selective recompute on 32 GPUs"
    assert (a["items"], a["total"], a["step_s"]) == (shown(want["items"], 1), want["total"], want["time"]["step_s"])
    e.move("zero", 1)
    e.move("zero", 1)  # ZeRO-3: the gathered layers join the bar
    a = e.answer()
    want = command("--tp", "16", "--sp", "--recompute", "selective", "--dp", "2", "--zero", "3")
    assert a["items"] == want["items"] and a["items"]["ZeRO-3 gathered layers"] > 0


def test_moves_step_through_each_list_and_stop_at_its_ends():
    e = estimator()
    e.values["seq"] = 3000  # off the list of powers of two: a move goes to the next one that way
    e.move("seq", 1)
    assert e.values["seq"] == 4096
    e.values["seq"] = 3000
    e.move("seq", -1)
    assert e.values["seq"] == 2048
    e.values["tp"] = 1
    e.move("tp", -1)
    assert e.values["tp"] == 1
    for _ in range(5):
        e.move("zero", 1)
    assert e.values["zero"] == 3
    e.move("sp", -1)
    assert e.values["sp"] is False


def test_a_rule_broken_is_said_not_raised():
    """The 16-GPU MoE example has 4 heads: TP 16 cannot hold whole heads (the command says the same)."""
    e = estimator(tp=16)
    e.move("model", 1)
    assert e.values["model"] == "16-GPU MoE example"
    a = e.answer()
    assert "heads 4 do not divide by tp 16" in a["refused"]


def test_the_bar_by_hand():
    """30 + 10 GB against 80 GB usable in 40 cells: 80 GB is the bar's length, so 15 and 5 cells. 1.5 + 1.5 GB in
    3 cells rounds to 2 + 2 = 4 (round half to even): the widest gives one back."""
    assert bar({"a": 30.0, "b": 10.0, "c": 0.0}, 80.0, 40) == [("a", 15), ("b", 5)]
    assert bar({"a": 1.5, "b": 1.5}, 0.0, 3) == [("a", 1), ("b", 2)]
    assert bar({"a": 100.0, "b": 50.0}, 10.0, 10) == [("a", 7), ("b", 3)]


async def test_the_app_moves_tp_and_redraws():
    from parasim.tui.estimator_app import EstimatorApp

    app = EstimatorApp(estimator())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert "TP8 + SP on 8 GPUs" in str(app.query_one("#answer").render())
        await pilot.press("down", "down", "down", "right")
        await pilot.pause()
        answer = str(app.query_one("#answer").render())
        total = command("--tp", "16", "--sp")["total"]
        assert "TP16 + SP on 16 GPUs" in answer and f"{total:,.2f} GB of 120 GB usable on an H200: fits" in answer
        assert "> tp" in str(app.query_one("#settings").render())
        await pilot.press("q")
    assert app.return_code in (0, None)


@pytest.mark.parametrize("flags, said", [(["--app", "--json"], "--app shows the estimator live")])
def test_app_refuses_what_it_cannot_show(flags, said):
    r = cli("memory", "--model", "27b", *flags)
    assert r.returncode == 2 and said in r.stderr

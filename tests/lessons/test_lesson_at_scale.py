"""The at-scale lesson: the post's figures at their real sizes from symbolic runs. Expected values are the
post's parameters multiplied out here, or the estimator's own formulas (which the runs are held against)."""
import json

import pytest

from parasim.lesson import get_lesson, run_lesson
from tests.conftest import cli


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("at-scale"))


def test_every_check_holds_and_the_runs_were_symbolic(lr):
    assert lr.result.trace.backend == "symbolic"
    assert len(lr.checks) == 19 and all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_token_copies_are_the_posts(lr):
    (copies,) = [c for c in lr.checks if c.name.startswith("(token, expert) pairs")]
    assert copies.got == [2 * 4096 * 8, 4096 * 8] == [65_536, 32_768]


def test_the_all_to_all_counts(lr):
    by_name = {c.name.split(":")[0]: c for c in lr.checks}
    mb = next(c for n, c in by_name.items() if n.startswith("the post's one-direction all-to-all"))
    assert mb.expected == round(4096 * 8 * 7168 * 2 * 7 / 8 / 1e6) == 411 and abs(mb.got - 411) <= 8
    sent = next(c for n, c in by_name.items() if n.startswith("what the run sends instead"))
    assert all(b % ((7168 + 32) * 2) == 0 for b in sent.got)  # whole rows of a token and 32 gates
    assert all(b < 28_672 * 7168 * 2 for b in sent.got)  # fewer than the pairs' bytes at 7/8 of T x K


def test_the_27b_rows_reach_the_posts_lengths(lr):
    rows = [c for c in lr.checks if c.name.startswith("27B, ")]
    assert len(rows) == 9
    longest = max(int(c.name.split(" at ")[1].split(" tokens")[0].replace(",", "")) for c in rows)
    assert 800_000 < longest < 840_000  # the post's 820K for TP8 + SP + CP2 + full recompute


def test_real_ranks_refuse_it_and_check_says_why():
    out = cli("run", "at-scale", "--backend", "gloo", "--nproc", "8")
    assert out.returncode == 2 and "real ranks cannot run it" in out.stderr
    out = cli("check", "at-scale", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["first_divergence"] is None and d["compared"] == 0


def test_ep_beside_tp_and_zero3_by_hand(lr):
    """Issue 53, item 6: the post's EP comparisons, from the run, each worked out here from the post's T, d, K,
    EP and DeepSeek-V3's expert width (two matrices a run's expert)."""
    T, d, K, E, F, ep, b = 4096, 7168, 8, 256, 2048, 8, 2
    (table,) = [t for t in lr.tables if t.title.startswith("What one GPU sends for one MoE layer")]
    rows = {name: cells for name, cells in table.rows}
    post = 2 * T * K * d * b * (ep - 1) / ep
    assert rows["EP: dispatch + combine, forward"][1] == round(post / 1e9, 3) == 0.822  # "about 0.8 GB"
    assert rows["TP 8: two all-reduces of the activations, forward"] == [round(2 * T * d * b * 2 * 7 / 8 / 1e9, 3)] * 2
    assert rows["ZeRO-3: this layer's experts gathered to every GPU"][0] == round((ep - 1) * E // ep * 2 * d * F * b / 1e9, 3)
    trace = lr.result.trace
    a2a = [e for e in trace.events if e.op == "all_to_all" and e.phase == "EP 8 dispatch"]
    forward = sum(m.sent for e in a2a if "backward" not in e.label for m in e.members)
    backward = sum(m.sent for e in a2a if "backward" in e.label for m in e.members)
    assert len(a2a) == 4 and backward == forward  # the post: "backward doubles it"
    gpu0 = {way: sum(e.member(0).sent for e in a2a if ("backward" in e.label) == (way == "backward"))
            for way in ("forward", "backward")}
    assert [rows["EP: dispatch + combine, forward"][0], rows["EP: the same two, backward"][0]] == [
        round(gpu0["forward"] / 1e9, 3), round(gpu0["backward"] / 1e9, 3)]
    assert rows["EP: dispatch + combine, forward"][0] < rows["EP: dispatch + combine, forward"][1]  # merged tokens

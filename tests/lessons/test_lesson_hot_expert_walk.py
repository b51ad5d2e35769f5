"""hot-expert as a reader walks it: balanced routing evens the load yet makes the layer slower than uniform
routing (most of all at EP 8), and the lesson says why from its run: a token goes once to each GPU holding one
of its picks, and balanced routing's picks, spaced E/k apart, reach every GPU. biased:0.5 (DeepSeek-V3's
per-expert bias, nn/routing.py) evens the hot expert's load. The figures here are counted by hand from the
routing policies' draws (with Python sets and bincount) and from the trace's bytes, never from the lesson's
own helpers."""

from __future__ import annotations

import numpy as np
import pytest

from parasim.lesson import get_lesson, run_lesson
from parasim.nn.routing import Routing

T, D, E, K, WORLD, EPS = 4096, 7168, 64, 8, 8, (4, 8)  # the lesson's sizes (its module docstring and table)


@pytest.fixture(scope="module")
def ran():
    return run_lesson(get_lesson("hot-expert"))


def _picks(routing: str, ep: int):
    """(a GPU's place in its EP group, its tokens' picks as lists) for every GPU: the MoE layer's first call."""
    policy = Routing.parse(routing)
    for r in range(WORLD):
        me = r % ep
        yield me, policy.choose(f"moe.{routing}.ep{ep}#0", r, me * T, T, E, K).tolist()


def _visits(routing: str, ep: int) -> tuple[int, int]:
    """(token, GPU) visits over every GPU's tokens, and those to a GPU other than the token's own."""
    per, seen, away = E // ep, 0, 0
    for me, rows in _picks(routing, ep):
        for row in rows:
            gpus = {e // per for e in row}
            seen, away = seen + len(gpus), away + len(gpus - {me})
    return seen, away


def _table(lr):
    t = lr.tables[0]
    return {label: dict(zip(t.columns[1:], cells)) for label, cells in t.rows}, t


def _sent(lr, phase: str) -> int:
    return sum(m.sent for e in lr.result.trace.events if e.phase == phase and e.op == "all_to_all" for m in e.members)


def test_the_gpus_a_token_visits_counted_by_hand(ran):
    rows, _ = _table(ran)
    for ep in EPS:
        for routing in ("uniform", "skewed:0.5", "balanced"):
            seen, _ = _visits(routing, ep)
            assert rows[f"{routing} routing, EP {ep}"]["GPUs a token visits"] == round(seen / (WORLD * T), 2)
        # picks 8 experts apart, on GPUs of 64/ep experts: every GPU of the group gets one or more
        assert _visits("balanced", ep)[0] == ep * WORLD * T


def test_the_all_to_all_bytes_are_the_visits_to_other_gpus_by_hand(ran):
    """A token goes once to each other GPU that holds one of its picks: dispatch sends the token and that GPU's
    E/ep gates, combine brings D values home, and backward does both again (the lesson's trace: bfloat16)."""
    rows, _ = _table(ran)
    for ep in EPS:
        for routing in ("uniform", "skewed:0.5", "balanced"):
            _, away = _visits(routing, ep)
            phase = f"{routing} routing, EP {ep}"
            assert _sent(ran, phase) == away * (2 * (D + E // ep) + 2 * D) * 2, phase
            assert rows[phase]["sent (GB)"] == round(_sent(ran, phase) / 1e9, 2)


def test_balanced_is_slower_than_uniform_and_the_note_says_why(ran):
    rows, table = _table(ran)
    note = " ".join(next(n for n in table.notes if n.startswith("GPUs a token visits")).split())
    assert "Why balanced routing is slower than uniform" in note
    for ep in EPS:
        u, b = rows[f"uniform routing, EP {ep}"], rows[f"balanced routing, EP {ep}"]
        assert b["layer (ms)"] > u["layer (ms)"] and b["others wait (ms)"] == 0
        (us, ua), (bs, ba) = _visits("uniform", ep), _visits("balanced", ep)
        said = (
            f"a token visits {bs / (WORLD * T):g} GPUs against {us / (WORLD * T):.2f} ({ba / (WORLD * T):g} "
            f"against {ua / (WORLD * T):.2f} other than its own): {ba / ua:.2f}x the bytes"
        )
        assert said in note, said
    # the EP 8 ratio the reader asked about: 7 other GPUs against uniform's 8 (1 - C(56, 8)/C(64, 8)) - 1 on average
    assert _visits("balanced", 8)[1] / _visits("uniform", 8)[1] == pytest.approx(7 / 4.75, abs=0.01)


def test_the_ep8_balanced_narrative_says_every_token_travels_to_every_gpu(ran):
    text = " ".join(ran.lesson.narrative["balanced routing, EP 8"].split())
    assert "so every token travels to all 8" in text and "DeepSeek-V3" in text
    # EP 4's says what 'balanced' names (round-robin picks) and that biased:0.5 evens the load without it
    ep4 = " ".join(ran.lesson.narrative["balanced routing, EP 4"].split())
    assert ep4.startswith(f"Every token's picks spread round-robin over the experts, {E // K} apart")
    assert "biased:0.5" in ep4 and "the ideal a balancing method aims at" not in ep4


def test_biased_routing_evens_the_hot_experts_load(ran):
    """biased:0.5 against skewed:0.5, each GPU's pairs counted here with bincount: the busiest GPU near the mean
    with the bias, far above it without; the note under the table says both."""
    _, table = _table(ran)
    note = " ".join(next(n for n in table.notes if n.startswith("biased:0.5")).split())
    said = {}
    for routing in ("biased:0.5", "skewed:0.5"):
        for ep in EPS:
            per_gpu = np.zeros(WORLD)
            for r, (_, rows) in enumerate(_picks(routing, ep)):
                counts = np.bincount(np.ravel(rows), minlength=E).reshape(ep, E // ep).sum(axis=1)
                per_gpu[r - r % ep : r - r % ep + ep] += counts
            said[(routing, ep)] = per_gpu.max() / per_gpu.mean()
    assert said[("biased:0.5", 4)] < 1.02 and said[("biased:0.5", 8)] < 1.02
    assert said[("skewed:0.5", 8)] > 1.3
    assert (
        f"The busiest GPU gets {said[('biased:0.5', 4)]:.2f}x the mean pairs at EP 4 and "
        f"{said[('biased:0.5', 8)]:.2f}x at EP 8 (skewed: {said[('skewed:0.5', 4)]:.2f}x and "
        f"{said[('skewed:0.5', 8)]:.2f}x)"
    ) in note
    assert all(c.ok for c in ran.checks)


def test_the_walkthrough_shows_one_all_to_all_a_phase_and_counts_the_rest(ran):
    """Walk 25 (#24): about 400 of 460 lines were per-rank bytes of 24 all-to-alls. Each phase now shows its
    dispatch on the first EP group and counts the rest: the layer makes 4 all-to-alls (dispatch and combine,
    forward and backward) on each of the 8 / EP groups, so 7 more at EP 4 and 3 at EP 8."""
    import re
    from parasim.render.walkthrough import walkthrough
    text = walkthrough(ran, 100)
    assert len(text.splitlines()) < 220
    for ep in EPS:
        for routing in ("uniform", "skewed:0.5", "balanced"):
            block = text.split(f"== {routing} routing, EP {ep} ==")[1].split("\n== ")[0]
            steps = re.findall(r"^step +\d+  all_to_all  on ep\[(\d+)-\d+\].*dispatch", block, re.M)
            assert steps == ["0"], (routing, ep)
            more = 4 * (WORLD // ep) - 1
            assert f"... and {more} more events in this phase ({more} all_to_all)" in block
    note = " ".join(next(n for n in ran.tables[0].notes if n.startswith("GPUs a token visits")).split())
    assert "'Balanced' is this round-robin spreading" in note

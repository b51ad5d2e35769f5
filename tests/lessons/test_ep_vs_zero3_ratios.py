"""ZeRO-3's gather of the experts against EP's all-to-alls: ep-split finds about 48x, at-scale about 24x and
all-to-all-hidden about 18x. Each lesson says what its ratio counts and why the other two differ; here the
three ratios are taken from the runs' own bytes and the reasons multiplied out by hand from each lesson's sizes
(typed here as the lessons' docstrings state them): one GPU, forward dispatch + combine, against its share of
the gathered experts (7/8 in ep-split and at-scale, the whole layer in all-to-all-hidden)."""

from __future__ import annotations

from math import comb

import pytest

from parasim.lesson import get_lesson, run_lesson

E, K, EP = 256, 8, 8


@pytest.fixture(scope="module")
def runs():
    return {name: run_lesson(get_lesson(name)) for name in ("ep-split", "at-scale", "all-to-all-hidden")}


def _a2a(lr, phases, rank=None) -> int:
    """Bytes the forward dispatch + combine sent (one rank's, or all ranks')."""
    return sum(
        m.sent
        for e in lr.result.trace.events
        if e.op == "all_to_all" and e.phase in phases and "backward" not in (e.label or "")
        for m in e.members
        if rank is None or m.rank == rank
    )


def _figures(runs) -> dict:
    """Each lesson's ratio and its rows a token (r), from the traces; ZeRO-3's bytes from the sizes."""
    h, f, t, b = 16, 8, 4, 8  # ep-split: hidden, an expert's width, tokens a GPU, float64
    es = _a2a(runs["ep-split"], ("dispatch", "combine"))  # all 8 GPUs
    es_zero3 = EP * (EP - 1) * (E // EP) * 2 * h * f * b
    d, F, T = 7168, 2048, 4096  # DeepSeek-V3's hidden and expert width; tokens a GPU
    at = _a2a(runs["at-scale"], ("EP 8 dispatch",), rank=0)
    at_zero3 = (EP - 1) * (E // EP) * 2 * d * F * 2
    ah = _a2a(runs["all-to-all-hidden"], ("EP 8: micro-batch 1 forward",), rank=0)
    ah_zero3 = E * 2 * d * F * 2
    return {
        "ep-split": {"ratio": es_zero3 / es, "r": es / (EP * t * (2 * h + E // EP) * b)},
        "at-scale": {"ratio": at_zero3 / at, "r": at / (T * (2 * d + E // EP) * 2)},
        "all-to-all-hidden": {"ratio": ah_zero3 / ah, "r": ah / (T * (2 * d + E // EP) * 2)},
    }


def test_the_three_ratios_differ_for_the_reasons_the_lessons_give(runs):
    g = _figures(runs)
    assert [round(g[n]["ratio"]) for n in g] == [48, 24, 18]
    # ep-split and at-scale: tokens leave for about as many GPUs (r within 1%), so 48 / 24 = 2 is an expert's
    # width over a GPU's tokens, (8 / 4) / (2,048 / 4,096) = 4, times ep-split's rows being half gates: a
    # token's 16 values out and back beside 32 gates, (2 x 16) / (2 x 16 + 32) against (2d) / (2d + 32)
    assert g["ep-split"]["r"] == pytest.approx(g["at-scale"]["r"], rel=0.01)
    width = (8 / 4) / (2048 / 4096)
    gates = (32 / 64) / (2 * 7168 / (2 * 7168 + 32))
    assert g["ep-split"]["ratio"] / g["at-scale"]["ratio"] == pytest.approx(
        width * gates * g["at-scale"]["r"] / g["ep-split"]["r"], rel=1e-9
    )
    assert width * gates == pytest.approx(2, rel=0.01)
    # at-scale to all-to-all-hidden: the whole layer's experts, 8/7 of a GPU's share; balanced routing sends
    # a token to all 7 other GPUs, uniform routing to 4.6 on average (two picks on one GPU share a row)
    assert g["all-to-all-hidden"]["r"] == 7
    assert g["all-to-all-hidden"]["ratio"] / g["at-scale"]["ratio"] == pytest.approx(
        8 / 7 * g["at-scale"]["r"] / 7, rel=1e-9
    )
    assert 4.5 < g["at-scale"]["r"] < 4.8


def _why(lr) -> str:
    (note,) = [n for t in lr.tables for n in t.notes if n.startswith("Why ")]
    return note


def test_each_lesson_says_what_its_ratio_counts_and_why_the_others_differ(runs):
    g = _figures(runs)
    uniform = (EP - 1) * (1 - comb(E - E // EP, K) / comb(E, K))  # other GPUs holding one of 8 random picks
    expected = {
        "ep-split": g["ep-split"]["ratio"],
        "at-scale": g["at-scale"]["ratio"],
        "all-to-all-hidden": g["all-to-all-hidden"]["ratio"],
    }
    for name, lr in runs.items():
        note = _why(lr)
        others = [n for n in expected if n != name]
        assert note.startswith(
            f"Why {expected[name]:.0f}x here, {expected[others[0]]:.0f}x in {others[0]} and "
            f"{expected[others[1]]:.0f}x in {others[1]}, each one GPU's ZeRO-3 bytes"
        ), note
        assert f"r = {g[name]['r']:.2f}" in note and "dispatch + combine forward" in note
        assert "one dtype on both sides" in note  # float64 in ep-split, BF16 in the others: it cancels
    at = _why(runs["at-scale"])
    assert (
        "ep-split's ratio is x2.00 this one's, for its F/T = 2 (x4.00), gates 50.0% (x0.50)" in at
        and f"all-to-all-hidden's ratio is x{(8 / 7) * g['at-scale']['r'] / 7:.2f} this one's, for its s = 1 "
        f"(x{8 / 7:.2f}), r = 7.00 (x{g['at-scale']['r'] / 7:.2f})"
        in at
    ), at
    es = _why(runs["ep-split"])
    assert "here s = 7/8 (a GPU sends the experts the others lack), F/T = 2," in es
    assert "the gates are 50.0% of the rows' bytes" in es
    ah = _why(runs["all-to-all-hidden"])
    assert "here s = 1 (the whole layer's experts), F/T = 0.5, r = 7.00 (balanced routing" in ah
    assert (
        f"at-scale's ratio is x{7 / 8 * 7 / uniform:.2f} this one's, for its s = 7/8 (x0.88), r = {uniform:.2f}" in ah
    )

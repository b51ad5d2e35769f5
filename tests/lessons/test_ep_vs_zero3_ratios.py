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


def _table(lr):
    (t,) = [t for t in lr.tables if t.title.startswith("ZeRO-3's bytes over EP's")]
    return t


def test_each_lesson_sets_the_three_ratios_side_by_side_with_their_factors(runs):
    """Each lesson's shared table: its own row from its run (the ratio and r from its trace), the other two from
    their sizes and their routings' average r (uniform: the other GPUs holding one of 8 random picks; balanced:
    all 7), every cell worked out here from the lessons' sizes."""
    g = _figures(runs)
    uniform = (EP - 1) * (1 - comb(E - E // EP, K) / comb(E, K))  # other GPUs holding one of 8 random picks
    h, f, t = {"ep-split": 16}, {"ep-split": 8}, {"ep-split": 4}
    for n in ("at-scale", "all-to-all-hidden"):
        h[n], f[n], t[n] = 7168, 2048, 4096
    share = {"ep-split": (7, 8), "at-scale": (7, 8), "all-to-all-hidden": (1, 1)}
    average = {"ep-split": uniform, "at-scale": uniform, "all-to-all-hidden": 7}

    def ratio(n, r):
        s = share[n][0] / share[n][1]
        return s * E * 2 * h[n] * f[n] / (t[n] * r * (2 * h[n] + E // EP))

    for me, lr in runs.items():
        table = _table(lr)
        assert table.columns == ["lesson", "s", "F/T", "r", "gates", "ratio"]
        rows = dict(table.rows)
        assert list(rows) == [n + (" (this run)" if n == me else "") for n in runs]
        for n in runs:
            s, ft, r, gates, got = rows[n + (" (this run)" if n == me else "")]
            want_r = g[n]["r"] if n == me else average[n]
            assert r == round(want_r, 2)
            assert got == f"{(g[n]['ratio'] if n == me else ratio(n, average[n])):.0f}x"
            assert s == ("7/8" if share[n] == (7, 8) else "1") and ft == f[n] / t[n]
            assert gates == f"{(E // EP) / (2 * h[n] + E // EP):.1%}"
        assert len(table.notes) == 1 and "one dtype on both sides" in table.notes[0]
    # ep-split's 48x is at-scale's 24x times 4 for F/T and 0.5 for its rows being half gates (r alike)
    es = dict(_table(runs["ep-split"]).rows)
    assert [es["ep-split (this run)"][4], es["at-scale"][4], es["all-to-all-hidden"][4]] == ["48x", "24x", "18x"]
    assert es["ep-split (this run)"][3] == "50.0%" and es["at-scale"][3] == "0.2%"
    # no lesson keeps the old sentence
    assert not any(n.startswith("Why ") for lr in runs.values() for t in lr.tables for n in t.notes)

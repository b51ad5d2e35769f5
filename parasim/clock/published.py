"""The clock's step time (clock/plan.py) against the published training runs of clock/runs.py, scored per set.

Each run's figure is in its source's own unit (runs.UNITS), a FLOP rate counted by the source's own rule
(runs.RULES): parasim's step time, from the run's configuration alone with one set of constants per GPU type
(estimate/hardware.py), is put in that unit the same way, so the comparison is of times. Nothing is fitted per
run. The runs are split by source into a calibration set and a held-out set (runs.SOURCES); each set is scored
on its own, and the held-out set's score is the test of the model.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from .costs import machine
from ..estimate.kernels import NoMeasurement
from ..estimate.memory import Plan
from .plan import sequences, step_time
from .runs import SETS, UNITS, PublishedRun
from .sets import runs_of

BEYOND = 0.25  # an error past this is listed by name in a set's score


def predicted(r: PublishedRun, change: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    """parasim's figure for `r` in its unit (with `change` made to its plan or overlap, for a variant), and the
    step."""
    change = dict(change or {})
    overlap = change.pop("overlap", r.overlap)
    plan: Plan = replace(r.plan, **change)
    # the source's global batch stays: a larger micro-batch means fewer of them
    plan = replace(plan, microbatches=sequences(r.plan) // (plan.dp * plan.micro_batch))
    said: dict[str, Any] = dict(r.machine)  # the figures its source gives for the machine, over the datasheet's
    t = step_time(r.model, plan, r.seq, replace(machine(r.gpu, plan.gpus_per_node), **said), overlap)
    return UNITS[r.unit].of_step(r, plan, t["step_s"]), t


def error(r: PublishedRun, value: float) -> float:
    """The signed error of parasim's `value` for `r`: + means parasim's step is faster (runs.Unit.error)."""
    return UNITS[r.unit].error(r.published, value)


def all_runs(which: str | None = None) -> list[PublishedRun]:
    """Every run of every set (or of set `which`), the sets in clock/sets.py's order."""
    return runs_of(which)


def timed_run(
    r: PublishedRun, change: dict[str, Any] | None = None
) -> tuple[float | None, dict[str, Any] | None, str | None]:
    """predicted(r, change), or (None, None, why) where a kernel it needs was never measured on its GPU type
    (estimate/kernels.NoMeasurement): such a run is listed, not timed, and left out of its set's score."""
    try:
        value, t = predicted(r, change)
    except NoMeasurement as e:
        return None, None, str(e)
    return value, t, None


def rows(which: str | None = None) -> list[dict[str, Any]]:
    """Every run of set `which` (all of them for None), in all_runs' order, with parasim's figure, the
    error, what the run assumes and what the variants of that give; a run parasim cannot time (no measurement
    of a kernel it needs on its GPU type) has None for its figures and says why in `not_timed`."""
    out = []
    for r in all_runs(which):
        value, t, why = timed_run(r)
        short, document, address = r.cite
        row: dict[str, Any] = {
            "name": r.key,
            "set": r.set,
            "source": document,
            "cite": short,
            "address": address,
            "gpu": r.gpu,
            "gpus": r.gpus,
            "moe": r.moe,
            "published": r.published,
            "predicted": value,
            "unit": r.unit,
            "rule": r.rule,
            "error": None if value is None else error(r, value),
            "not_timed": why,
            "assumed": r.assumed,
            "step_s": t and t["step_s"],
            "bubble_share": t and t["bubble_s"] / t["step_s"],
            "variants": {},
        }
        for name, change in r.variants.items():
            v, _, why = timed_run(r, change)
            row["variants"][name] = {"predicted": v, "error": None if v is None else error(r, v), "not_timed": why}
        out.append(row)
    return out


def score(table: list[dict[str, Any]]) -> dict[str, Any]:
    """One set's score over its timed runs: how many, the median and the largest |error| (and whose), the bias
    (the mean signed error: + means parasim is faster on the whole), the MoE runs' median |error| (None without
    one), the runs beyond 25%, and the runs not timed (`rows`)."""
    timed = [r for r in table if r["error"] is not None]
    errors = [r["error"] for r in timed]
    worst = max(timed, key=lambda r: abs(r["error"]))
    moe = [abs(r["error"]) for r in timed if r["moe"]]
    return {
        "runs": len(timed),
        "median_abs_error": statistics.median(abs(e) for e in errors),
        "max_abs_error": abs(worst["error"]),
        "largest": worst["name"],
        "bias": statistics.fmean(errors),
        "moe_runs": len(moe),
        "moe_median_abs_error": statistics.median(moe) if moe else None,
        "beyond_25": [r["name"] for r in timed if abs(r["error"]) > BEYOND],
        "not_timed": [r["name"] for r in table if r["error"] is None],
    }


def scores(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each set's score, calibration first, for the sets that have rows in `table`."""
    return {s: score(part) for s in SETS if (part := [r for r in table if r["set"] == s])}

"""The sets of published runs the clock's step time is validated on, one entry each (RUN_SETS): the set's name,
the heading its table has in `parasim validate step-time`, the section docs/validation.md gives it, the module
and the tuple that hold its runs, and the notes that quote every figure. Everything else (the runs' `set`, the
command's --set, published.all_runs, the report and the page's generator) reads this table, so a new set is its
runs module, its notes and one entry here.

The sets are split by source, each fixed before it was scored: calibration (the sources the model was shaped on)
and held-out (never shaped on) in clock/runs.py; every later set was gathered after the one before it was scored,
from sources no earlier set reads, and scored once with the model of its day (what each title says). A set
scored once is read for causes afterwards, so only the newest one is a clean test.

This module imports nothing of parasim's, so that a command can list the sets' names without loading any run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class RunSet:
    """One set: `name` as a run's `set` and --set say it; `title` the report's heading; `heading` the
    docs/validation.md section that holds its table and score line; the runs are `module`'s `runs` (the
    calibration and held-out sets share runs.RUNS, each run saying its own set); `notes` quotes every figure."""

    name: str
    title: str
    heading: str
    module: str
    runs: str
    notes: str


RUN_SETS: tuple[RunSet, ...] = (
    RunSet(
        "calibration",
        "Calibration set: the sources the model was shaped on",
        "## Calibration runs",
        "runs",
        "RUNS",
        "step-time-runs.md",
    ),
    RunSet(
        "held-out",
        "Held-out set: sources the model was never shaped on (read for causes since: not a clean test)",
        "## Held-out runs",
        "runs",
        "RUNS",
        "step-time-runs.md",
    ),
    RunSet(
        "fresh",
        "Fresh set: five other sources, held out and scored once with an earlier model (read for "
        "causes since: not a clean test)",
        "## Fresh runs",
        "runs_fresh",
        "FRESH",
        "step-time-runs-fresh.md",
    ),
    RunSet(
        "fourth",
        "Fourth set: four more sources, scored once with that same earlier model (read for causes "
        "since: not a clean test)",
        "## Fourth runs",
        "runs_fourth",
        "FOURTH",
        "step-time-runs-fourth.md",
    ),
    RunSet(
        "fifth",
        "Fifth set: four more sources, gathered blind while an earlier model was made and scored once "
        "with it (read for causes since: not a clean test)",
        "## Fifth runs",
        "runs_fifth",
        "FIFTH",
        "step-time-runs-fifth.md",
    ),
    RunSet(
        "sixth",
        "Sixth set: two more sources (both BAAI's FlagPerf), scored once with the fifth's model (read "
        "for causes since: not a clean test)",
        "## Sixth runs",
        "runs_sixth",
        "SIXTH",
        "step-time-runs-sixth.md",
    ),
    RunSet(
        "seventh",
        "Seventh set: two more sources (both MLPerf Training), gathered blind while this model was "
        "made and scored once with it (its runs untouched by the changes since)",
        "## Seventh runs",
        "runs_seventh",
        "SEVENTH",
        "step-time-runs-seventh.md",
    ),
    RunSet(
        "eighth",
        "Eighth set: two more sources (MLPerf Training v6.0 and v4.1: an MoE model, B200s), gathered "
        "blind after the seventh's score and scored once with this model (read for causes since: not a clean "
        "test)",
        "## Eighth runs",
        "runs_eighth",
        "EIGHTH",
        "step-time-runs-eighth.md",
    ),
    RunSet(
        "ninth",
        "Ninth set: two more sources (NVIDIA NeMo's performance summaries 24.07 and 25.02: H100s and "
        "B200s), gathered blind after the eighth's score and scored once with the same model (read for causes "
        "since: not a clean test)",
        "## Ninth runs",
        "runs_ninth",
        "NINTH",
        "step-time-runs-ninth.md",
    ),
    RunSet(
        "tenth",
        "Tenth set: two more sources (MLPerf Training v5.0 and v5.1, Llama 3.1 8B and 405B on H100s, "
        "H200s and B200s), gathered blind after the ninth's score and scored once with the model after it (FP8 "
        "parameter gathers) (read for causes since: not a clean test)",
        "## Tenth runs",
        "runs_tenth",
        "TENTH",
        "step-time-runs-tenth.md",
    ),
    RunSet(
        "eleventh",
        "Eleventh set: two more sources (Google Cloud's gpu-recipes on H100s, H200s and B200s; AWS's "
        "torchtitan test case on H100s), gathered blind after the tenth's score and scored once with the model "
        "after it (B200 products by shape): the test",
        "## Eleventh runs",
        "runs_eleventh",
        "ELEVENTH",
        "step-time-runs-eleventh.md",
    ),
)
NAMES: tuple[str, ...] = tuple(s.name for s in RUN_SETS)
BY_NAME: dict[str, RunSet] = {s.name: s for s in RUN_SETS}


def runs_of(name: str | None = None) -> list[Any]:
    """Every run of every set, the sets in RUN_SETS' order (or the runs of set `name`): each module's runs once,
    filtered by the run's own `set`."""
    out: list[Any] = []
    for module, attr in dict.fromkeys((s.module, s.runs) for s in RUN_SETS):
        out += [
            r
            for r in getattr(import_module(f"{__package__}.{module}"), attr)
            if r.set in BY_NAME and (name is None or r.set == name)
        ]
    return out

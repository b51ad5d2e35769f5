"""How far a step time parasim prints may be from a measured one: the spread of the held-out runs like it.

The held-out runs (clock/runs.py) and the later sets' (clock/sets.py names each, held out too) were each scored
once a version of the time model was done; each one's error says how its measured step stood against parasim's
(error e, + when parasim is faster: measured = parasim's x (1 + e)); a run not timed has none. A
step time is printed with the smallest and the largest of those ratios among the held-out runs like it: the
same GPU type and the same kind of parallelism (FAMILIES, the first that matches); with fewer than MIN_RUNS
such runs, the same kind on any GPU; with fewer still, every held-out run. The range is the runs' own spread,
nothing fitted: a planner reads it as "runs like this one measured between these two times".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..estimate.memory import Plan
from .overlaps import DP_GROUPS
from .published import all_runs, rows
from .runs import CALIBRATION
from ..comm.trace import Trace

MIN_RUNS = 3  # fewer runs than this say too little about a family on one GPU type: the next wider circle


@dataclass(frozen=True)
class Family:
    """One kind of parallelism a run is counted in: its name, how the range says it, and the test."""

    name: str
    words: str
    matches: Callable[[Any, Plan], bool]


# the first entry a run matches is its family: an MoE run with FSDP is counted with the MoE runs
FAMILIES: tuple[Family, ...] = (
    Family("moe", "MoE", lambda model, plan: bool(model.experts)),
    Family("fsdp", "ZeRO-3 / FSDP", lambda model, plan: plan.zero == 3),
    Family("model-parallel", "TP, PP or CP", lambda model, plan: plan.tp * plan.pp * plan.cp > 1),
    Family("data-parallel", "data-parallel only", lambda model, plan: True),
)


def family(model: Any, plan: Plan) -> Family:
    return next(f for f in FAMILIES if f.matches(model, plan))


@dataclass(frozen=True)
class StepRange:
    """Measured step over parasim's, the smallest and the largest among `runs` (held-out runs' keys), and how
    they were chosen (`like`)."""

    low: float
    high: float
    runs: tuple[str, ...]
    like: str

    def to_dict(self, step_s: float) -> dict[str, Any]:
        return {
            "low_s": step_s * self.low,
            "high_s": step_s * self.high,
            "low_ratio": self.low,
            "high_ratio": self.high,
            "like": self.like,
            "runs": list(self.runs),
        }


def held_out() -> list[tuple[str, str, str, float]]:
    """Every held-out run as (key, GPU type, family, error): what `step_range` chooses from. Computed once by
    a caller that asks for many ranges (a layout search)."""
    by_key = {r.key: r for r in all_runs()}
    return [
        (row["name"], row["gpu"], family(by_key[row["name"]].model, by_key[row["name"]].plan).name, row["error"])
        for row in rows()
        if row["set"] != CALIBRATION and row["error"] is not None
    ]


def trace_family(trace: Trace) -> Family:
    """The family of what a run's trace did, read from its collectives' groups (Megatron-Core's names): MoE where
    a collective ran on an expert group; ZeRO-3 / FSDP where a rank gathered parameters over a data-parallel
    group more than once (ZeRO-1 gathers once a step, ZeRO-3 layer by layer); TP, PP or CP where one of those
    groups was used; else data-parallel only."""
    # the events that ran say it (a folded run's copies repeat them on ranks that do the same work)
    groups = {e.group.name for e in trace.ran_events if e.kind != "compute"}
    gathers: dict[int, int] = {}
    for e in trace.ran_events:
        if e.kind == "collective" and e.op == "all_gather" and e.group.name in DP_GROUPS:
            for r in e.ranks:
                gathers[r] = gathers.get(r, 0) + 1
    by_name = {f.name: f for f in FAMILIES}
    if any(g == "ep" or g.startswith("expert") for g in groups):
        return by_name["moe"]
    if max(gathers.values(), default=0) > 1:
        return by_name["fsdp"]
    if groups & {"tp", "pp", "cp", "tp-cp"} or any(e.kind == "p2p" for e in trace.events):
        return by_name["model-parallel"]
    return by_name["data-parallel"]


def step_range(model: Any, plan: Plan, gpu: str, table: list[tuple[str, str, str, float]]) -> StepRange:
    """The range of the held-out runs like `plan` of `model` on GPU type `gpu` (`table`: `held_out()`)."""
    return family_range(family(model, plan), gpu, table)


def family_range(fam: Family, gpu: str, table: list[tuple[str, str, str, float]]) -> StepRange:
    """The range of the held-out runs of family `fam` on GPU type `gpu`, widening as the module says."""
    from ..estimate.hardware import GPUS

    gpu_name = GPUS[gpu].name if gpu in GPUS else gpu
    circles = (
        (lambda g, f: g == gpu and f == fam.name, f"held-out {gpu_name} runs, {fam.words}"),
        (lambda g, f: f == fam.name, f"held-out runs on any GPU, {fam.words}"),
        (lambda g, f: True, "every held-out run"),
    )
    for keep, like in circles:
        chosen = [(key, err) for key, g, f, err in table if keep(g, f)]
        if len(chosen) >= MIN_RUNS or like == "every held-out run":
            ratios = [1 + err for _, err in chosen]
            return StepRange(min(ratios), max(ratios), tuple(k for k, _ in chosen), like)
    raise AssertionError("unreachable: the last circle keeps every run")

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
from typing import Any, Callable, Iterable, Iterator

from ..estimate.memory import Plan
from .overlaps import DP_GROUPS
from .published import all_runs, error, timed_run
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


class HeldOut:
    """The held-out runs (`all_runs` outside the calibration set), each timed the first time a range needs it:
    a range on one GPU type and family times the few runs it keeps, not all of them (a second or more). Iterated,
    it is every timed run as (key, GPU type, family, error): what `step_range` chooses from."""

    def __init__(self) -> None:
        self.runs = [r for r in all_runs() if r.set != CALIBRATION]
        self.families = {r.key: family(r.model, r.plan).name for r in self.runs}
        self._errors: dict[str, float | None] = {}

    def error(self, r: Any) -> float | None:
        """Run `r`'s signed error (None: not timed, a kernel it needs unmeasured on its GPU type)."""
        if r.key not in self._errors:
            value, _, _ = timed_run(r)
            self._errors[r.key] = None if value is None else error(r, value)
        return self._errors[r.key]

    def chosen(self, keep: Callable[[str, str], bool]) -> list[tuple[str, float]]:
        """(key, error) of each timed run whose (GPU type, family) `keep` keeps."""
        out = []
        for r in self.runs:
            if keep(r.gpu, self.families[r.key]):
                err = self.error(r)
                if err is not None:
                    out.append((r.key, err))
        return out

    def __iter__(self) -> Iterator[tuple[str, str, str, float]]:
        for r in self.runs:
            err = self.error(r)
            if err is not None:
                yield r.key, r.gpu, self.families[r.key], err


def held_out() -> HeldOut:
    """Every held-out run, timed as a range asks for it (`HeldOut`). Made once by a caller that asks for many
    ranges (a layout search), so each run is timed once."""
    return HeldOut()


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
    if groups & {"tp", "pp", "cp", "tp-cp"} or any(e.kind == "p2p" for e in trace.ran_events):
        return by_name["model-parallel"]
    return by_name["data-parallel"]


def step_range(model: Any, plan: Plan, gpu: str, table: Iterable[tuple[str, str, str, float]]) -> StepRange:
    """The range of the held-out runs like `plan` of `model` on GPU type `gpu` (`table`: `held_out()`)."""
    return family_range(family(model, plan), gpu, table)


def family_range(fam: Family, gpu: str, table: Iterable[tuple[str, str, str, float]]) -> StepRange:
    """The range of the held-out runs of family `fam` on GPU type `gpu`, widening as the module says."""
    from ..estimate.hardware import GPUS

    gpu_name = GPUS[gpu].name if gpu in GPUS else gpu
    circles = (
        (lambda g, f: g == gpu and f == fam.name, f"held-out {gpu_name} runs, {fam.words}"),
        (lambda g, f: f == fam.name, f"held-out runs on any GPU, {fam.words}"),
        (lambda g, f: True, "every held-out run"),
    )
    for keep, like in circles:
        if isinstance(table, HeldOut):  # times only the runs this circle keeps
            chosen = table.chosen(keep)
        else:
            chosen = [(key, err) for key, g, f, err in table if keep(g, f)]
        if len(chosen) >= MIN_RUNS or like == "every held-out run":
            ratios = [1 + err for _, err in chosen]
            return StepRange(min(ratios), max(ratios), tuple(k for k, _ in chosen), like)
    raise AssertionError("unreachable: the last circle keeps every run")

"""`parasim memory`'s answer as a value: a job's memory itemised on its binding stage, with the traffic, the
step's time on the clock, how the layers sit on stages and, when asked, the rules of thumb the layout breaks
and the plan written as Megatron-LM flags. `MemoryReport.to_dict` is the command's --json; the command's text
is rendered from the same report (render/estimate_text.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..clock.critic import critique
from ..clock.plan import plan_time
from ..clock.uncertainty import held_out, step_range
from ..errors import UsageError
from ..estimate.kernels import NoMeasurement
from ..estimate.memory import Breakdown, Plan, assumptions, breakdown
from ..estimate.traffic import gpu_spec, step_traffic
from ..layout import ModelSpec
from ..layout.stages import describe, stage_counts
from ..megatron.args import as_dict
from .query import JobQuery, JobReport


def timed(
    model: ModelSpec, plan: Plan, seq: int, gpu: str, overlap: tuple[str, ...], held: list | None = None
) -> dict[str, Any]:
    """The step's time on the clock (clock/plan.py), the same costs every timed figure of parasim uses, with the
    range the held-out runs like it measured (clock/uncertainty.py; `held`: its held_out() table, made once by
    a caller that times many plans); where a kernel the step runs has no measurement on `gpu`, no time and why
    ("step_s": None; the memory figures beside it need none)."""
    try:
        t = plan_time(model, plan, seq, gpu, overlap)
        table = held_out() if held is None else held
        return {**t, "range": step_range(model, plan, gpu, table).to_dict(t["step_s"])}
    except NoMeasurement as exc:  # a GPU type with its datasheet but not every kernel measured
        return {"step_s": None, "why": str(exc), "slowest_stage": None}


def stage_summary(model: ModelSpec, plan: Plan, memory: int, slowest: int | None) -> dict[str, Any]:
    """Every stage's layers by the model's rule, the rule, the stage that needs the most memory and the
    slowest stage (both counted from 1; the slowest None when nothing is timed)."""
    counts = stage_counts(model, plan.pp)
    return {
        "layers": list(counts),
        "rule": model.stages.to_dict(),
        "said": describe(counts),
        "most_memory": memory + 1,
        "slowest": slowest,
    }


@dataclass(frozen=True)
class MemoryReport(JobReport):
    """A job's memory, traffic and time: `breakdown` is the binding stage's bytes by item. In a notebook it
    shows as a table (`_repr_html_`), `to_pandas()` gives the items and `plot()` the stacked bars by ZeRO stage."""

    breakdown: Breakdown

    @property
    def fits(self) -> bool:
        """Whether the binding stage's GPU holds it within the usable memory."""
        return bool(self.data["fits"])

    def to_pandas(self) -> Any:
        """The items of the binding stage's GPU: bytes in the report's unit and share of the total."""
        from ..jsonout import data_frame

        unit, total = self.query.units, self.breakdown.total
        rows = [
            {"item": k, unit.name: v / unit.size, "share": v / total if total else 0.0}
            for k, v in self.breakdown.shown().items()
        ]
        return data_frame(rows, "item")

    def _repr_html_(self) -> str:
        from ..jsonout import lines_html, table_html

        q, unit = self.query, self.query.units
        rows = [[k, v / unit.size] for k, v in self.breakdown.shown().items()] + [
            ["total", self.breakdown.total / unit.size]
        ]
        step = self.data["time"].get("step_s")
        said = [
            f"{q.model.name}, {q.plan.label()} on {q.plan.world} GPUs, sequence {q.seq:,}: "
            + ("fits" if self.fits else "does NOT fit")
            + f" in {q.usable / unit.size:,.1f} {unit.name} a GPU"
            + (f"; step {step:.3g} s on {self.gpu.name}" if step is not None else "")
        ]
        return lines_html(said) + table_html("memory per GPU", ["item", unit.name], rows)

    def plot(self) -> Any:
        """Stacked bars of the items for ZeRO stages 0-3 against the usable memory (`memory --plot`'s)."""
        from ..jsonout import Png
        from ..render.plots import memory_figure

        q = self.query
        assert q.seq is not None  # a memory report is made for one sequence (memory_report refuses none)
        return Png.of(memory_figure(q.model, q.plan, q.seq, q.units.size, q.units.name, q.usable, self.gpu))


def memory_report(
    q: JobQuery,
    critic: bool = False,
    written: bool = False,
    against: str | None = None,
    progress: Callable[[str], None] | None = None,
    emit: str | None = None,
    held: list | None = None,
) -> MemoryReport:
    """The memory one GPU of `q`'s plan needs, itemised, on its binding stage, with the step's traffic by axis,
    its time and stages; with `critic`, the rules of thumb the layout breaks and what breaking each costs; with
    `written`, the plan as Megatron-LM flags and the torchrun line that runs them; with `emit` (a stack of
    job/formats.py), the plan as that stack's file ("emitted"); with `against` (a routing
    policy), one training step of the plan run on symbolic ranks beside the estimate, item by item ("run"), and
    `progress` told before it runs (seconds at real size)."""
    model, plan, seq, unit = q.model, q.plan, q.seq, q.units.size
    if seq is None:
        raise UsageError("a memory report is for one sequence length: give the query its seq")
    gpu = gpu_spec(q.gpu, "gpu")  # an unknown type refused in one line before anything is planned
    if against is not None:  # what the step cannot run is refused before any work
        from ..train.against import check_runs

        check_runs(model, plan, against, seq)
    bd = breakdown(model, plan, seq)
    timing = timed(model, plan, seq, q.gpu, q.overlap, held)
    traffic = {f"{axis} {op}": v / unit for (axis, op), v in sorted(step_traffic(model, plan, seq).items())}
    out = {
        **bd.to_dict(unit),
        **model.param_counts(),
        "unit": q.units.name,
        "usable": q.usable / unit,
        "fits": bd.total <= q.usable,
        "assumes": assumptions(plan),
        "traffic": traffic,
        "time": timing,
        "stages": stage_summary(model, plan, bd.stage, timing["slowest_stage"]),
        **q.sources.to_dict(),
    }
    if written:
        out["megatron_args"] = as_dict(model, plan, seq, q.overlap, q.sources.megatron)
    if emit is not None:
        from .formats import write_job

        out["emitted"] = write_job(emit, model, plan, seq, q.overlap, q.sources.plan_job).to_dict()
    if critic:
        out["critic"] = [f.to_dict() for f in critique(model, plan, seq, q.gpu, q.overlap, q.usable)]
    if against is not None:
        from ..train.against import compare, running_note

        if progress is not None:
            progress(running_note(plan, seq))
        out["run"] = compare(model, plan, seq, against)
    return MemoryReport(query=q, gpu=gpu, data=out, breakdown=bd)

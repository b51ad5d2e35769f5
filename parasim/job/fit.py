"""`parasim fit`'s answer for one layout as a value: the longest sequence the plan fits on its GPUs, the
memory at that length, the attention's FLOPs and the step's time there, how the layers sit on stages and, when
asked, the plan written as Megatron-LM flags at a length its layout splits evenly. `FitReport.to_dict` is the
command's --json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..estimate.fit import Fit, fit
from ..estimate.memory import Plan
from ..estimate.traffic import attention_flops, gpu_spec
from ..megatron.args import as_dict
from .memory import stage_summary, timed
from .query import JobQuery, JobReport


def fit_seq(seq: int, plan: Plan) -> int:
    """The longest sequence a plan fits, rounded down to what its layout splits evenly (CP's 2 x cp chunks,
    each cut over TP by SP): the --seq-length a job can run."""
    unit = 2 * plan.cp * (plan.tp if plan.sp else 1)
    return seq // unit * unit


def fit_run_report(q: JobQuery, routing: str = "balanced", progress: Callable[[str], None] | None = None) -> JobReport:
    """The estimator's longest sequence for `q`'s plan as the step runs it, held against one symbolic step there
    and one a granule longer (train/against.py's `fit_against_run`), in the query's unit; `progress` is told
    before the steps run (seconds at real size). Every refusal is one line before any work."""
    from ..train.against import check_runs, fit_against_run, running_note

    gpu = gpu_spec(q.gpu, "gpu")
    check_runs(q.model, q.plan, routing)
    if progress is not None:
        progress(running_note(q.plan, None))
    out = fit_against_run(q.model, q.plan, q.usable, routing)
    return JobReport(query=q, gpu=gpu, data={**out, "unit": q.units.name})


@dataclass(frozen=True)
class FitReport(JobReport):
    """The longest sequence the query's plan fits: `fit`, with the memory at that length."""

    fit: Fit

    @property
    def fits(self) -> bool:
        """Whether any sequence fits (the model state alone may not)."""
        return self.fit.seq > 0

    def to_pandas(self) -> Any:
        """The items of the binding GPU at the longest sequence, in the report's unit."""
        from ..jsonout import data_frame

        unit = self.query.units
        return data_frame([{"item": k, unit.name: v / unit.size} for k, v in self.fit.at_max.items.items()], "item")

    def _repr_html_(self) -> str:
        from ..jsonout import lines_html, table_html

        q, unit = self.query, self.query.units
        rows = [[k, v / unit.size] for k, v in self.fit.at_max.items.items()]
        return lines_html(
            [f"{q.model.name}, {q.plan.label()} on {q.plan.world} GPUs: the longest sequence {self.fit.seq:,} tokens"]
        ) + table_html(f"memory per GPU at {self.fit.seq:,} tokens", ["item", unit.name], rows)


def fit_report(q: JobQuery, written: bool = False, emit: str | None = None) -> FitReport:
    """The longest sequence one GPU of `q`'s plan holds (the query's own sequence is not read: it is the
    answer), with its time and stages there; with `written`, the plan as Megatron-LM flags at that length, with
    `emit`, as that stack's file (job/formats.py)."""
    model, plan, unit = q.model, q.plan, q.units.size
    gpu = gpu_spec(q.gpu, "gpu")  # an unknown type refused in one line before the search
    f = fit(model, plan, q.usable)
    out: dict[str, Any] = {**f.to_dict(unit), "unit": q.units.name}
    if f.seq:
        out["attention_flops"] = attention_flops(model, f.seq, plan.recompute)
        out["time"] = timed(model, plan, f.seq, q.gpu, q.overlap)
    out["stages"] = stage_summary(model, plan, f.at_max.stage, out["time"]["slowest_stage"] if f.seq else None)
    out.update(q.sources.to_dict())
    if written and f.seq:
        out["megatron_args"] = as_dict(model, plan, fit_seq(f.seq, plan), q.overlap, q.sources.megatron)
    if emit is not None and f.seq:
        from .formats import write_job

        out["emitted"] = write_job(emit, model, plan, fit_seq(f.seq, plan), q.overlap, q.sources.plan_job).to_dict()
    return FitReport(query=q, gpu=gpu, data=out, fit=f)

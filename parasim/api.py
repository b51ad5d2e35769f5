"""parasim from Python (a notebook, a script): each call returns the result object its command renders, which a
notebook shows as HTML, with `to_dict()` (the command's --json), `to_pandas()` where a table fits and `plot()`
where a picture does. docs/api.md shows each.

    import parasim
    run = parasim.lesson("tp-mlp", tp=4)          # a lesson's run: checks, tables, the trace
    report = parasim.memory("27b", tp=8, sp=True, seq=8192)
    report.fits, report.to_pandas(), report.plot()
    parasim.fit("27b", tp=8, sp=True).fit.seq       # the longest sequence that layout holds
    job = parasim.read_job("ds_config.json")        # a job file of any stack parasim reads

The commands call the same library functions (job/memory.py's memory_report, job/fit.py's fit_report, the
lesson runner), so a notebook and the command line answer alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UsageError


def lesson(name: str, world: int | None = None, **knobs: Any) -> Any:
    """Lesson `name` run on virtual ranks (its own world unless `world`), with its knobs set (`tp=4`): the
    LessonRun (`.checks`, `.tables`, `.result.trace`, `.to_dict()`, `.plot()`)."""
    from .lesson import get_lesson, run_lesson

    return run_lesson(get_lesson(name, world), world, knobs=knobs or None)


def model_of(model: Any) -> Any:
    """A ModelSpec from what a caller has: a ModelSpec, a preset's name ("27b", "deepseek-v3") or the path of a
    Hugging Face config.json."""
    return _model(model)[0]


def _model(model: Any) -> tuple[Any, Any]:
    """The model and what was read to make it (a config.json's fields, as `--config` reports them)."""
    from .job.query import Sources
    from .layout import ModelSpec

    if isinstance(model, ModelSpec):
        return model, Sources()
    if isinstance(model, (str, Path)) and (str(model).endswith(".json") or Path(model).is_file()):
        from .estimate.models import read_hf_config

        hf = read_hf_config(str(model))
        return hf.model, Sources(config=hf, config_path=str(model))
    if isinstance(model, str):
        from .estimate.models import get_model

        return get_model(model), Sources()
    raise UsageError(f"a model is a ModelSpec, a preset's name or a config.json's path, not {type(model).__name__}")


def _query(model: Any, seq: int | None, gpu: str, usable: float | None, overlap: tuple[str, ...], plan: dict) -> Any:
    from .clock.overlaps import PLAN, parse
    from .estimate.memory import Plan
    from .estimate.traffic import gpu_spec
    from .job.query import JobQuery, Units

    m, sources = _model(model)
    spec = gpu_spec(gpu, "gpu")
    p = Plan(**plan).check(m, seq)
    chosen = parse(",".join(overlap) or "none", PLAN)
    usable_bytes = spec.usable if usable is None else usable * 1e9
    return JobQuery(m, p, seq, gpu.lower(), usable_bytes, chosen, Units(), sources)


def memory(
    model: Any,
    seq: int = 4096,
    gpu: str = "h200",
    usable: float | None = None,
    overlap: tuple[str, ...] = (),
    **plan: Any,
) -> Any:
    """One GPU's memory for `model` on the layout and training choices `plan` gives (estimate.memory.Plan's
    fields: tp, sp, cp, pp, dp, ep, zero, recompute, micro_batch, precision, ...), with the step's traffic
    and time on `gpu`; `usable` in GB (default: the GPU's). A MemoryReport (`.fits`, `.to_pandas()`,
    `.plot()`, `.to_dict()`: `parasim memory --json`)."""
    from .job.memory import memory_report

    return memory_report(_query(model, seq, gpu, usable, tuple(overlap), plan))


def fit(model: Any, gpu: str = "h200", usable: float | None = None, overlap: tuple[str, ...] = (), **plan: Any) -> Any:
    """The longest sequence one GPU of the plan holds: a FitReport (`.fit.seq`, `.fits`, `.to_pandas()`)."""
    from .job.fit import fit_report

    return fit_report(_query(model, None, gpu, usable, tuple(overlap), plan))


def read_job(path: str, format: str | None = None, sets: tuple[str, ...] = ()) -> Any:
    """A job file of any stack parasim reads (job/formats.py: DeepSpeed, picotron, torchtitan's TOML files and
    its config functions as "FILE.py:NAME", Megatron-LM, a Hugging Face config), the format told from the file
    unless named, each of `sets` ("NAME=VALUE", as `--job-set`) in place of the file's field: the job as read,
    every field accounted for (`.used`, `.unmodelled`, `.unknown`, `.to_dict()`)."""
    from .job.formats import JOB_FORMATS, read_job_file

    if format is not None and format not in JOB_FORMATS:
        raise UsageError(f"format must be one of {', '.join(JOB_FORMATS)}, got {format!r}")
    if isinstance(sets, str):
        raise UsageError("sets must be a list of 'NAME=VALUE' strings, not one string")
    return read_job_file(str(path), format, tuple(sets))[1]


__all__ = ["fit", "lesson", "memory", "model_of", "read_job"]

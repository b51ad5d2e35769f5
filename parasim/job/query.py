"""What a job is, every flag read: the settings `parasim memory` (and a notebook) hands the job's report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..estimate.memory import Plan
from ..estimate.models import HFConfig
from ..estimate.traffic import GpuSpec
from ..layout import ModelSpec


@dataclass(frozen=True)
class Units:
    """The unit memory is reported in: GB (1e9 bytes, the default) or GiB (2^30)."""

    size: float = 1e9
    name: str = "GB"


GIB = Units(float(2**30), "GiB")


@dataclass(frozen=True)
class Sources:
    """Where a job's model and plan came from, each read once: a Megatron-LM job (--megatron FILE,
    megatron/job.py's Job), another stack's job file (--job FILE) and a Hugging Face config (--config FILE);
    None where not given."""

    megatron: Any = None
    config: HFConfig | None = None
    config_path: str | None = None
    job: Any = None  # another stack's job file (--job FILE: job/read.py's ReadJob)

    @property
    def plan_job(self) -> Any:
        """The job the plan is made from (Megatron's or another stack's), None where the flags alone give it."""
        return self.megatron if self.megatron is not None else self.job

    def to_dict(self) -> dict[str, Any]:
        """--json: the Megatron job as read ("megatron"), another stack's job ("job"), the config's fields
        ("config"), where given."""
        out: dict[str, Any] = {}
        if self.megatron is not None:
            out["megatron"] = self.megatron.to_dict()
        if self.job is not None:
            out["job"] = self.job.to_dict()
        if self.config is not None:
            out["config"] = {
                "path": self.config_path,
                "used": self.config.used,
                "unmodelled": self.config.unmodelled,
                **self.config.model.param_counts(),
            }
        return out


@dataclass(frozen=True)
class JobQuery:
    """A job to plan: `model` trained with `plan` on sequences of `seq` tokens on GPUs of type `gpu` (a key of
    estimate/hardware.py's table, lower case), the overlaps it turns on, the bytes a GPU may use (`usable`),
    the unit to report in, and what was read to make the model and plan. `seq` None asks how long a sequence
    fits (`fit_report`); the memory report needs one."""

    model: ModelSpec
    plan: Plan
    seq: int | None
    gpu: str
    usable: float
    overlap: tuple[str, ...] = ()
    units: Units = Units()
    sources: Sources = Sources()


@dataclass(frozen=True)
class JobReport:
    """What every planning command answers with: the query it answered, the GPU's preset, and the whole answer
    as its --json writes it (`to_dict`). Each command's report adds the value its text is drawn from."""

    query: JobQuery
    gpu: GpuSpec
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.data

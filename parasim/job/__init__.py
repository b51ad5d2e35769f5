"""A user's job planned, as one question and one answer a command or a notebook gets: what the job is
(`JobQuery`: the model, the plan, the sequence, the GPU, what was read to make them) and what it needs and
costs (`memory_report`: memory itemised, traffic, the step's time, the stages, the rules of thumb it breaks;
`fit_report`: the longest sequence it holds, and its time there; `fit_run_report`: that length held against
symbolic steps of the plan).

This room sits above the estimator's formulas (estimate/) and the clock (clock/), which it asks; the
commands (cli/estimate.py) parse flags into a `JobQuery`, call `memory_report` and render what it returns.
"""

from .fit import FitReport, fit_report, fit_run_report, fit_seq
from .memory import MemoryReport, memory_report, stage_summary, timed
from .query import GIB, JobQuery, JobReport, Sources, Units

__all__ = [
    "FitReport",
    "GIB",
    "JobQuery",
    "JobReport",
    "MemoryReport",
    "Sources",
    "Units",
    "fit_report",
    "fit_run_report",
    "fit_seq",
    "memory_report",
    "stage_summary",
    "timed",
]

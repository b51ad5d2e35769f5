"""The job files parasim reads, one entry per training stack: what the file gives (the model, the plan or
both), how to tell it from the others, and its reader. `--job FILE` on memory and fit reads any of them
(the format told from the file, or named by --job-format); everything else asks this table.

Adding a stack is its reader module (a `read(path)` returning job/read.py's ReadJob, and a `looks_like` on
the parsed file) and its entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError
from ..limits import read_bounded
from .deepspeed import looks_like as deepspeed_looks_like, read as read_deepspeed, write as write_deepspeed
from .picotron import looks_like as picotron_looks_like, read as read_picotron, write as write_picotron
from .torchtitan import looks_like as torchtitan_looks_like, read as read_torchtitan, toml_tree
from .torchtitan import write as write_torchtitan
from .torchtitan_registry import looks_like_path as registry_path, read as read_registry, write as write_registry
from .read import Written


@dataclass(frozen=True)
class JobFormat:
    """One stack's file: its name (for --job-format and --emit), the file in words, what it gives ("model",
    "plan" or "model and plan"), a test on the parsed file (None: told apart otherwise), the reader and the
    writer."""

    name: str
    title: str
    gives: str
    looks_like: Callable[[Any], bool] | None
    read: Callable[[str, tuple[str, ...]], Any]  # (path, --job-set NAME=VALUE of the command line)
    # a plan written as the stack's file (model, plan, seq, overlaps, the job read): None for a model's config
    write: Callable[..., Written] | None = None


def _no_sets(sets: tuple[str, ...], instead: str) -> None:
    if sets:
        raise UsageError(f"--job-set changes a field of a stack's config file: {instead}")


def _megatron(path: str, sets: tuple[str, ...] = ()) -> Any:
    from ..megatron.job import read_job

    _no_sets(sets, "a Megatron-LM job's flags are changed by parasim's own (--tp 8, --seq 4096, ...)")
    return read_job(path)


def _megatron_write(model: Any, plan: Any, seq: int, overlap: tuple[str, ...], job: Any = None) -> Written:
    from ..megatron.args import as_dict

    out = as_dict(model, plan, seq, overlap, job if getattr(job, "script", None) is not None else None)
    return Written("megatron", out["torchrun"] + "\n", tuple(out["notes"]))


def _hf(path: str, sets: tuple[str, ...] = ()) -> Any:
    from ..estimate.models import read_hf_config

    _no_sets(sets, "a model's sizes are changed by parasim's own flags (--layers, --hidden, ...)")
    return read_hf_config(path)


def _hf_looks_like(tree: Any) -> bool:
    marks = ("num_hidden_layers", "model_type", "architectures", "text_config", "n_layer")
    return isinstance(tree, dict) and any(k in tree for k in marks)


JOB_FORMATS: dict[str, JobFormat] = {
    f.name: f
    for f in (
        # JSON files in the order they are told apart: picotron's has a "distributed" grid, DeepSpeed's its batch
        # or ZeRO fields, a Hugging Face config the model's
        JobFormat(
            "picotron", "picotron config (JSON)", "model and plan", picotron_looks_like, read_picotron, write_picotron
        ),
        JobFormat(
            "deepspeed",
            "DeepSpeed config (ds_config JSON)",
            "plan",
            deepspeed_looks_like,
            read_deepspeed,
            write_deepspeed,
        ),
        JobFormat("hf", "Hugging Face config.json", "model", _hf_looks_like, _hf),
        JobFormat(
            "torchtitan",
            "torchtitan train config (TOML)",
            "model and plan",
            torchtitan_looks_like,
            read_torchtitan,
            write_torchtitan,
        ),
        # a Python file is told by its name (FILE.py:FUNCTION): it is read, never run
        JobFormat(
            "torchtitan-py",
            "torchtitan config function (Python, FILE.py:NAME)",
            "model and plan",
            None,
            read_registry,
            write_registry,
        ),
        JobFormat(
            "megatron", "Megatron-LM launch script or file of flags", "model and plan", None, _megatron, _megatron_write
        ),
    )
}


def detect(path: str) -> JobFormat:
    """The format of the job file at `path`: a Python file (FILE.py[:NAME]) torchtitan's config registry, a
    JSON object by its fields, a TOML file with torchtitan's tables; anything else is a Megatron-LM script (its
    reader says what it could not read)."""
    import json

    if registry_path(path):
        return JOB_FORMATS["torchtitan-py"]
    data = read_bounded(path, "job file")
    try:
        tree = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        tree = toml_tree(data)
        if tree is None or not torchtitan_looks_like(tree):
            return JOB_FORMATS["megatron"]
        return JOB_FORMATS["torchtitan"]
    for f in JOB_FORMATS.values():
        if f.looks_like is not None and f.looks_like(tree):
            return f
    raise UsageError(
        f"{path}: a JSON file parasim cannot place: not a "
        + ", ".join(f.title for f in JOB_FORMATS.values() if f.looks_like is not None)
        + " (name one by --job-format)"
    )


def read_job_file(path: str, name: str | None = None, sets: tuple[str, ...] = ()) -> tuple[JobFormat, Any]:
    """The job at `path` read by its stack's reader (`name`, or the format `detect` finds), each of `sets`
    (--job-set NAME=VALUE) in place of the file's field."""
    fmt = JOB_FORMATS[name] if name is not None else detect(path)
    return fmt, fmt.read(path, tuple(sets))


WRITERS = tuple(name for name, f in JOB_FORMATS.items() if f.write is not None)  # what --emit takes


def write_job(name: str, model: Any, plan: Any, seq: int, overlap: tuple[str, ...] = (), job: Any = None) -> Written:
    """`plan` of `model` at sequence `seq` written as stack `name`'s file, over `job` where it was read from
    that stack's file (its other fields come back as the user wrote them)."""
    writer = JOB_FORMATS[name].write
    if writer is None:
        raise UsageError(f"a {JOB_FORMATS[name].title} holds a model, not a plan: --emit one of {', '.join(WRITERS)}")
    return writer(model, plan, seq, overlap, job)


__all__ = ["JOB_FORMATS", "JobFormat", "WRITERS", "detect", "read_job_file", "write_job"]

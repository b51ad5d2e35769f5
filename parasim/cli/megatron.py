"""`--megatron FILE` and `--megatron-args`, shared by layout, memory, fit and trace: a Megatron-LM job read
as the command's model and layout (the command's own flags replace what the job says), and the answer
written back as Megatron flags with the torchrun line that runs them; and `--job FILE`, any stack's job
file (job/formats.py), on the same commands."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from ..limits import brief


MODEL_SIZES = ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn", "experts", "top_k", "expert_ffn", "params")


def add_megatron(
    p: argparse.ArgumentParser, write: bool = True, what: str = "model and layout", search: bool = False
) -> None:
    g = p.add_argument_group("Megatron-LM")
    g.add_argument(
        "--megatron",
        metavar="FILE",
        help=f"take the {what} from a Megatron-LM job: its launch script "
        "(torchrun ... pretrain_gpt.py --flags, with the script's variables and arrays) or a file of "
        "flags; every flag is accounted for, and flags given here replace the job's",
    )
    g.add_argument(
        "--megatron-env",
        metavar="NAME=VALUE",
        action="append",
        help="a variable the --megatron "
        "script reads but does not set, as if exported before it runs (its own assignments still win); "
        "repeat for more",
    )
    g.add_argument(
        "--megatron-env-from-shell",
        action="store_true",
        help="give the --megatron script every "
        "variable of parasim's own environment (--megatron-env replaces any of them)",
    )
    if write:
        g.add_argument(
            "--megatron-args",
            action="store_true",
            help="also print the answer as Megatron-LM flags in "
            "a torchrun line" + (" (with --search: for each node count's best layout)" if search else ""),
        )


def add_job(p: argparse.ArgumentParser, emit: bool = False, model_beside: bool = False) -> None:
    """--job FILE and --job-format (and, for memory and fit, --emit): another stack's job file, read by its
    entry of job/formats.py."""
    from ..job.formats import JOB_FORMATS, WRITERS

    j = p.add_argument_group("another stack's job")
    j.add_argument(
        "--job",
        metavar="FILE",
        help="take the plan (and the model, where it gives one) from a job file: "
        + "; ".join(f"{f.title} ({f.gives})" for f in JOB_FORMATS.values())
        + ". Every field is accounted for; flags given here replace the file's"
        + (". A file that names no model takes it from --config or --model" if model_beside else ""),
    )
    if emit:
        j.add_argument(
            "--emit",
            choices=WRITERS,
            default=None,
            help="print the plan as that stack's file and nothing else (redirect it to a file); what the "
            "stack cannot hold goes to stderr as notes. Over a --job file of the same stack, its other fields "
            "come back as written",
        )
    j.add_argument(
        "--job-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change one field of the --job file, as the stack's own command line does (torchtitan's "
        "--parallelism.tensor_parallel_degree 8 is --job-set parallelism.tensor_parallel_degree=8); repeat it",
    )
    j.add_argument(
        "--job-format",
        choices=tuple(JOB_FORMATS),
        default=None,
        help="the --job file's stack (default: told from the file)",
    )


def read_job_arg(args: argparse.Namespace) -> Any:
    """`--job FILE` of a command that takes its layout from it (layout, trace): a Megatron-LM job (read as
    --megatron reads it) or another stack's ReadJob; None without the flag. A model's config.json gives no
    layout: refused."""
    path = getattr(args, "job", None)
    if path is None:
        check_sets(args)
        return None
    if getattr(args, "megatron", None):
        raise UsageError("give the job by --job FILE or --megatron FILE, not both")
    from ..job.formats import read_job_file

    fmt, job = read_job_file(path, args.job_format, tuple(args.job_set))
    if fmt.name == "hf":
        raise UsageError(f"{path} is a model's config.json: it gives no layout (give --job a training job's file)")
    return job


def check_sets(args: argparse.Namespace) -> None:
    """--job-set without --job: refused in one line."""
    if getattr(args, "job_set", None) and getattr(args, "job", None) is None:
        raise UsageError("--job-set changes a field of a job file: give it with --job FILE")


def read_megatron(args: argparse.Namespace) -> Any:
    """The job of `--megatron FILE` (None without the flag); a command reads it once and hands it on."""
    path = getattr(args, "megatron", None)
    given = getattr(args, "megatron_env", None) or []
    if path is None:
        if given or getattr(args, "megatron_env_from_shell", False):
            raise UsageError(
                "--megatron-env and --megatron-env-from-shell give variables to a script: give it by --megatron FILE"
            )
        return None
    from ..megatron.job import read_job

    return read_job(path, outside=outside_variables(given, args.megatron_env_from_shell))


def outside_variables(given: list[str], from_shell: bool) -> dict[str, str]:
    """The variables a script gets from outside: parasim's own environment with `from_shell` (the names bash
    takes; bash leaves the others out too), then each NAME=VALUE of `given` in its place. Each name and the
    limits are checked where the script is read (megatron/script.py's check_outside)."""
    import os
    from ..megatron.words import NAME

    outside = {k: v for k, v in os.environ.items() if NAME.fullmatch(k)} if from_shell else {}
    for text in given:
        key, eq, value = text.partition("=")
        if not eq:
            raise UsageError(f"--megatron-env {brief(text)}: expected NAME=VALUE (such as NODES=4)")
        outside[key] = value
    return outside


def job_model(args: argparse.Namespace, job: Any) -> Any:
    """The job's model, with the size flags given on the command line in place of the job's: a Megatron-LM
    job's own; another stack's file over the model of `--config` (where the command has it and it is given)."""
    sizes = {k: getattr(args, k, None) for k in MODEL_SIZES}
    if getattr(job, "script", None) is not None:
        return job.model_spec(getattr(args, "tp", None), **sizes)
    config = getattr(args, "config", None)
    if config is None:  # (a command with --model has read the model already: this is trace's)
        return job.model_spec(None, beside="--config FILE (a Hugging Face config.json)", **sizes)
    from ..estimate.models import from_hf_config

    return job.model_spec(from_hf_config(config), **sizes)


def print_job(job: Any, args: argparse.Namespace) -> None:
    """The job in words, before the command's own answer (nothing under --json, which reports it): a Megatron-LM
    job's script and flags, or another stack's file field by field."""
    if getattr(args, "json", False):
        return
    from ..render.job_text import read_job_lines
    from ..render.megatron_text import job_lines
    from ..render.text import printable_lines

    lines = job_lines(job) if getattr(job, "script", None) is not None else read_job_lines(job)
    print(printable_lines(lines) + "\n")


def check_not_both(args: argparse.Namespace) -> None:
    if getattr(args, "megatron", None) and getattr(args, "job", None):
        raise UsageError("give the job by --job FILE or --megatron FILE, not both")
    if getattr(args, "megatron", None) and (getattr(args, "model", None) or getattr(args, "config", None)):
        raise UsageError("give the model by --megatron FILE or by --model/--config, not both")


def print_written(title: str, out: dict[str, Any]) -> None:
    from ..render.megatron_text import args_lines
    from ..render.text import printable_lines

    print()
    print(printable_lines(args_lines(title, out)))

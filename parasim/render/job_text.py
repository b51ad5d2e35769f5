"""Another stack's job file in words (`--job FILE`): every field parasim used and what it took, what the file
leaves open and parasim assumed, what it leaves out, what contradicts itself, the rest by name."""

from __future__ import annotations

from typing import Any

from .megatron_text import wrapped


def read_job_lines(job: Any) -> list[str]:
    """job/read.py's ReadJob, section by section, each line within the walk-through's width."""
    fields = len(job.values)
    # The count before the path: a long path wraps, and the count should not wrap with it.
    lines = wrapped(f"{job.title}, {fields} field{'s' if fields != 1 else ''}: {job.path}", "")
    if job.sets:
        lines += wrapped("set on the command line, in place of the file's: " + ", ".join(job.sets), "  ")
    if job.world is not None:
        lines += wrapped(f"runs on {job.world:,} GPU{'s' if job.world != 1 else ''}", "  ")
    lines.append(f"  fields read ({len(job.used)}):")
    col = min(40, max((len(f) for f, _ in job.used), default=0) + 2)
    for name, means in job.used:
        if len(name) < col:
            lines += wrapped(f"{name:<{col}}{means}", "    ")
        else:
            lines += wrapped(name, "    ") + wrapped(means, "    " + " " * col)
    for title, items in (
        (f"left open by the file; parasim takes ({len(job.assumed)})", job.assumed),
        (f"changes memory, traffic or time; not modelled ({len(job.unmodelled)})", job.unmodelled),
        (f"contradictions ({len(job.contradictions)})", job.contradictions),
    ):
        if items:
            lines.append(f"  {title}:")
            for item in items:
                lines += wrapped(item, "    ")
    if job.no_effect:
        lines += wrapped(f"change nothing parasim counts ({len(job.no_effect)}): {', '.join(job.no_effect)}", "  ")
    if job.unknown:
        lines += wrapped(
            f"not in parasim's table of {job.title} fields, so not read ({len(job.unknown)}): "
            + ", ".join(job.unknown),
            "  ",
        )
    return lines

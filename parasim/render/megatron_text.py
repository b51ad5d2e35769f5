"""A Megatron job in words: every flag parasim used and what it took, what it leaves out, what contradicts
itself; and a plan handed back as the torchrun line that runs it."""

from __future__ import annotations

import textwrap
from typing import Any

WIDTH = 100


def wrapped(text: str, indent: str, width: int = WIDTH) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    ) or [indent]


def job_lines(job: Any) -> list[str]:
    """`--megatron FILE`: what was read from the job, section by section, each line within WIDTH columns."""
    s = job.script
    where = (
        f"{' '.join(s.launcher[:1])} (line {s.line}) runs {s.program} with {len(job.given)} flags"
        if s.program
        else f"a file of {len(job.given)} flags"
    )
    lines = wrapped(f"Megatron-LM job {job.path}: {where}", "")
    if job.launched is not None:
        lines += wrapped(
            f"launches {job.launched:,} processes ({job.gpus_per_node} per node); parasim takes {job.world:,} GPUs",
            "  ",
        )
    lines.append(f"  flags read ({len(job.used)}):")
    col = min(40, max((len(f) for f, _ in job.used), default=0) + 2)
    for flag, means in job.used:
        if len(flag) <= col:
            lines += wrapped(f"{flag:<{col}}{means}", "    ")
        else:
            lines += wrapped(flag, "    ") + wrapped(means, "    " + " " * col)
    for title, items in (
        (f"changes memory, traffic or time; not modelled ({len(job.unmodelled)})", job.unmodelled),
        (f"contradictions ({len(job.contradictions)})", job.contradictions),
        (f"not read in the script ({len(s.notes)})", s.notes),
    ):
        if items:
            lines.append(f"  {title}:")
            for item in items:
                lines += wrapped(item, "    ")
    if s.outside_read:
        lines += wrapped(f"read from outside the script ({len(s.outside_read)}): {', '.join(s.outside_read)}", "  ")
    if job.no_effect:
        lines += wrapped(f"change nothing parasim counts ({len(job.no_effect)}): {', '.join(job.no_effect)}", "  ")
    if job.unknown:
        lines += wrapped(
            f"not in parasim's table of Megatron flags, so not read ({len(job.unknown)}): {', '.join(job.unknown)}",
            "  ",
        )
    return lines


def args_lines(title: str, megatron: dict[str, Any]) -> list[str]:
    """`--megatron-args`: the torchrun line, ready to paste, under a comment line saying where it runs."""
    notes = [
        line
        for note in megatron.get("notes", [])
        for line in textwrap.wrap(note, WIDTH, initial_indent="# ", subsequent_indent="#   ")
    ]
    return (
        textwrap.wrap(title, WIDTH, initial_indent="# ", subsequent_indent="#   ")
        + notes
        + megatron["torchrun"].split("\n")
    )

"""Megatron-LM's flags for the layers on pipeline stages, both ways: the split a job's flags give
(`split_of`, which megatron/job.py calls with what it read) and the flags that give a model's split back
(`pipeline_args`, which megatron/args.py writes), so that reading what is written gives the same stages.

The flags and their rules are Megatron-LM's, read from its source (this is our own code):
megatron/training/arguments.py (`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`,
`--pipeline-model-parallel-layout`, at most one way of stating virtual stages), megatron/core/transformer/
transformer_config.py (the uneven split's checks, the layout's exclusions) and pipeline_parallel_layer_layout.py
(the layout's grammar: stages split by "|", E the embedding, t a decoder layer, m an MTP layer, L the loss,
"(...)*n" and "x*n" repeat, commas only for the eye; virtual stage v of pipeline rank r is entry v x pp + r).
The rule each flag sets is layout/stages.py's `Stages`.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError
from ..layout.stages import Stages, is_uneven, stage_counts

FIRST, LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
EMBEDDING, LOSS = "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"
LAYOUT = "--pipeline-model-parallel-layout"
VIRTUAL = "--num-virtual-stages-per-pipeline-rank"
PER_VIRTUAL = "--num-layers-per-virtual-pipeline-stage"
LAYOUT_CHARS = 1_000  # a layout as written: "Et*3|(tt|)*29,m|L" is 17 characters
LAYOUT_UNROLLED = 100_000  # the layout with its repeats written out: a few characters per layer of a deep model
REPEAT_DIGITS = 6  # a repeat count's digits: more would unroll past the limit anyway
LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
# Megatron's own unrolling, in its order: "(...)*n" first, then "x*n"
REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


def split_of(layers: int | None, pp: int, given: dict[str, Any], chunks: int | None) -> tuple[Stages, int | None]:
    """The stage rule and the model chunks per GPU (None: as the other flags say) of a job's pipeline flags
    (`given`: FIRST and LAST as numbers, EMBEDDING and LOSS as switches, LAYOUT as text, VIRTUAL and
    PER_VIRTUAL as given), refused in one line where Megatron refuses them."""
    first, last, layout = given.get(FIRST), given.get(LAST), given.get(LAYOUT)
    counted = bool(given.get(EMBEDDING)) or bool(given.get(LOSS))
    if layout is not None:
        others = [f for f in (FIRST, LAST, EMBEDDING, LOSS, VIRTUAL, PER_VIRTUAL) if given.get(f)]
        if others:  # transformer_config.py and arguments.py: the layout says it all
            raise UsageError(
                f"{LAYOUT} with {others[0]}: Megatron takes the layout alone (it states every stage, "
                "and its virtual stages)"
            )
        counts, virtual = parse_layout(layout, pp, layers)
        return Stages(counts=counts), virtual
    if (first is not None or last is not None) and counted:
        raise UsageError(
            f"{FIRST if first is not None else LAST} with "
            f"{EMBEDDING if given.get(EMBEDDING) else LOSS}: Megatron takes one or the other"
        )
    if (first is not None or last is not None) and given.get(PER_VIRTUAL) is not None:
        raise UsageError(
            f"{FIRST if first is not None else LAST} with {PER_VIRTUAL}: Megatron asks for {VIRTUAL} to "
            "state virtual stages under an uneven split"
        )
    rule = Stages(first=first, last=last, embedding=bool(given.get(EMBEDDING)), loss=bool(given.get(LOSS)))
    if chunks and chunks > 1 and layers is not None and rule.given:
        _check_virtual(rule, layers, pp, chunks)
    return rule, None


def _check_virtual(rule: Stages, layers: int, pp: int, v: int) -> None:
    """Megatron's rule for virtual stages under an uneven split: each stage's layers divide by them."""
    if rule.embedding or rule.loss:
        per = (layers + int(rule.embedding) + int(rule.loss)) // pp
        if per % v:
            raise UsageError(
                f"{per} layers a stage (the embedding or loss counted) do not divide by {v} virtual "
                "stages, as Megatron needs"
            )
        return
    for flag, n in ((FIRST, rule.first), (LAST, rule.last)):
        if n is not None and n % v:
            raise UsageError(f"{flag} {n} does not divide by {v} virtual stages, as Megatron needs")
    ends = int(rule.first is not None) + int(rule.last is not None)
    if pp > ends:
        per = (layers - (rule.first or 0) - (rule.last or 0)) // (pp - ends)
        if per % v:
            raise UsageError(
                f"{per} layers on each middle stage do not divide by {v} virtual stages, as Megatron needs"
            )


def parse_layout(text: str, pp: int, layers: int | None) -> tuple[tuple[int, ...], int | None]:
    """A `--pipeline-model-parallel-layout` as Megatron reads it: each pipeline rank's decoder layers (over its
    virtual stages) and the virtual stages per rank (None for one)."""
    shown = text[:40] + ("..." if len(text) > 40 else "")
    if len(text) > LAYOUT_CHARS:
        raise UsageError(f"{LAYOUT} is {len(text):,} characters long, more than the limit of {LAYOUT_CHARS:,}")
    unrolled = text.replace(",", "")
    for pattern in REPEATS:
        unrolled = pattern.sub(lambda found: _repeat(found, shown), unrolled)
        if len(unrolled) > LAYOUT_UNROLLED:
            raise UsageError(f"{LAYOUT} {shown} unrolls to more than {LAYOUT_UNROLLED:,} characters, the limit")
    stages = unrolled.split("|")
    bad = sorted({c for c in unrolled if c != "|" and c not in LAYER_CHARS})
    if bad:
        raise UsageError(
            f"{LAYOUT} {shown}: {bad[0]!r} is not a layer (Megatron's are E, t, m and L, stages split by |)"
        )
    if len(stages) % pp:
        raise UsageError(f"{LAYOUT} {shown} has {len(stages)} stages, which do not divide by PP {pp}")
    flat = unrolled.replace("|", "")
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise UsageError(f"{LAYOUT} {shown}: Megatron needs the embedding (E) first and the loss (L) last, once each")
    if layers is not None and flat.count("t") != layers:
        raise UsageError(f"{LAYOUT} {shown} holds {flat.count('t')} decoder layers (t), --num-layers is {layers}")
    virtual = len(stages) // pp
    counts = tuple(sum(stages[v * pp + r].count("t") for v in range(virtual)) for r in range(pp))
    return counts, (virtual if virtual > 1 else None)


def _repeat(found: re.Match, shown: str) -> str:
    part, times = found.group(1), found.group(2)
    if len(times) > REPEAT_DIGITS or len(part) * int(times) > LAYOUT_UNROLLED:
        raise UsageError(f"{LAYOUT} {shown} unrolls to more than {LAYOUT_UNROLLED:,} characters, the limit")
    return part * int(times)


def pipeline_args(model: Any, plan: Any) -> list[str]:
    """The flags that give `model`'s layers on `plan`'s pipeline stages and its model chunks per GPU: none for
    an even split; Megatron's first/last or embedding/loss flags for those rules; a written-out layout for a
    list or an uneven spread (Megatron has no spread), which also carries the virtual stages."""
    chunks = getattr(plan, "chunks", 1)
    virtual = [VIRTUAL, str(chunks)] if chunks > 1 else []
    if model is None or model.layers is None:
        return virtual
    rule = model.stages
    if rule.first is not None or rule.last is not None:
        return (
            ([FIRST, str(rule.first)] if rule.first is not None else [])
            + ([LAST, str(rule.last)] if rule.last is not None else [])
            + virtual
        )
    if rule.embedding or rule.loss:
        return ([EMBEDDING] if rule.embedding else []) + ([LOSS] if rule.loss else []) + virtual
    counts = stage_counts(model, plan.pp)
    if not is_uneven(counts):
        return virtual
    return [LAYOUT, layout_text(counts, chunks)]


def layout_text(counts: tuple[int, ...], chunks: int = 1) -> str:
    """A `--pipeline-model-parallel-layout` for each pipeline rank's layers, split over `chunks` virtual
    stages as evenly as can be (the first ones one more), repeats written as Megatron's "(...)*n"."""
    pp = len(counts)
    per = [[n // chunks + (v < n % chunks) for v in range(chunks)] for n in counts]
    stages = [_layers(per[r][v]) for v in range(chunks) for r in range(pp)]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    out, i = "", 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:  # a run of alike stages
            j += 1
        run = j - i + 1
        out += f"({stages[i]}|)*{run}" if run > 1 and stages[i] else (stages[i] + "|") * run
        i = j + 1
    return out[:-1]


def _layers(n: int) -> str:
    return "" if n == 0 else "t" if n == 1 else f"t*{n}"

"""The step-time validation as a reader sees it (`parasim validate step-time`) and as docs/validation.md
prints it (`markdown_rows`, `score_line` and `markdown_constants`, which tests hold the page to)."""

from __future__ import annotations

from typing import Any

from ..clock.runs import RUNS, UNITS
from ..clock.sets import RUN_SETS

SET_TITLE = {s.name: s.title for s in RUN_SETS}  # each set as a heading names it
ERROR_SAID = (
    "Error: the throughput parasim's step gives over the published one, less one, a published time "
    "turned into its throughput; + means parasim's step is faster."
)


NOT_TIMED = "not timed"  # a run whose GPU type lacks a measurement of a kernel it needs (published.rows)


def _value(v: float | None, unit: str) -> str:
    return NOT_TIMED if v is None else f"{v:,.{UNITS[unit].decimals}f}"


def _error(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def score_line(which: str, s: dict[str, Any]) -> str:
    """One set's score in a sentence, as the command and the page print it."""
    moe = (
        f"MoE runs' median |error| {s['moe_median_abs_error']:.1%} ({s['moe_runs']} "
        f"run{'s' if s['moe_runs'] > 1 else ''})"
        if s["moe_runs"]
        else "no MoE runs"
    )
    beyond = f"beyond 25%: {', '.join(s['beyond_25'])}" if s["beyond_25"] else "none beyond 25%"
    missing = (
        f"; not timed (a kernel never measured on its GPU): {', '.join(s['not_timed'])}" if s.get("not_timed") else ""
    )
    return (
        f"{which.capitalize()}: {s['runs']} runs; median |error| {s['median_abs_error']:.1%}, the largest "
        f"{s['max_abs_error']:.1%} ({s['largest']}); bias {s['bias']:+.1%}; {moe}; {beyond}{missing}."
    )


def step_time_report(console: Any, table: list[dict], scores: dict[str, dict]) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    notes = ", ".join(dict.fromkeys(s.notes for s in RUN_SETS))
    console.print(
        escape(
            f"Step time against published runs. {ERROR_SAID} The runs are split by source, before "
            f"the model is tuned, into sets (docs/notes/: {notes})."
        )
    )
    for which, score in scores.items():
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left", title=SET_TITLE[which])
        t.add_column("run", overflow="fold")  # the long names fold, so that the figures fit 80 columns
        for col, just in (
            ("GPU", "left"),
            ("GPUs", "right"),
            ("unit", "left"),
            ("published", "right"),
            ("parasim", "right"),
            ("error", "right"),
        ):
            t.add_column(col, justify=just, no_wrap=True)
        for r in table:
            if r["set"] == which:
                t.add_row(
                    escape(r["name"]),
                    r["gpu"],
                    f"{r['gpus']:,}",
                    UNITS[r["unit"]].short,
                    _value(r["published"], r["unit"]),
                    _value(r["predicted"], r["unit"]),
                    _error(r["error"]),
                )
        console.print()
        console.print(t)
        console.print(escape(score_line(which, score)))
    console.print()
    console.print("[bold]What parasim assumes where a source is silent, and what the other choices give[/bold]")
    for r in table:
        if r["assumed"] or r["variants"] or r["not_timed"]:
            other = "; ".join(
                f"{k}: {_value(v['predicted'], r['unit'])} ({_error(v['error'])})" for k, v in r["variants"].items()
            )
            why = f" Not timed: {r['not_timed']}." if r["not_timed"] else ""
            console.print(
                escape(
                    f"- {r['name']}: {r['assumed'] or 'as published'}" + (f". Instead {other}" if other else "") + why
                )
            )
    console.print()
    console.print("[bold]Sources[/bold]")
    for source, which, address in dict.fromkeys((r["source"], r["set"], r["address"]) for r in table):
        console.print(escape(f"- {source} ({which}): {address}"))


def markdown_rows(table: list[dict]) -> list[str]:
    """A table of docs/validation.md's step-time section, a line per run (one set's runs at a time)."""
    out = ["| run | source | GPU | GPUs | unit | published | parasim | error |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        out.append(
            f"| {r['name']} | [{r['cite']}]({r['address']}) | {r['gpu']} | {r['gpus']:,} | "
            f"{r['unit']} | {_value(r['published'], r['unit'])} | {_value(r['predicted'], r['unit'])} | "
            f"{_error(r['error'])} |"
        )
    return out


def markdown_constants() -> list[str]:
    """The page's table of the constants the clock takes for each GPU type the runs ran on (estimate/hardware.py,
    where each is sourced): the figures that set a step's time."""
    from ..estimate.hardware import GPUS, UNITS as SCALE, WHAT

    used = [key for key in GPUS if any(r.gpu == key for r in RUNS)]
    out = ["| | " + " | ".join(GPUS[key].name for key in used) + " |", "|---" * (len(used) + 1) + "|"]
    for figure in ("peak_flops", "hbm", "nvlink", "network"):
        scale, unit = SCALE[figure]
        cells = (f"{GPUS[key].figures()[figure].value / scale:,.4g} {unit}" for key in used)
        out.append(f"| {WHAT[figure]} | " + " | ".join(cells) + " |")
    return out


MOE_LAYER_SAID = (
    "The clock's MoE layer (router, experts, shared expert, activation, permutation, EP all-to-alls) "
    "against Megatron-Core's MoE-layer performance test: one layer timed alone on an H100 of an EP 8 "
    "group, 4,096 tokens a GPU, routing forced to balance, each case with its own token dispatcher. "
    "Error: measured time over parasim's, less one; + means parasim's layer is faster."
)


def _ms_pair(pair: list[float]) -> str:
    return f"{pair[0]:.2f}/{pair[1]:.2f}"


def moe_layer_report(
    console: Any, table: list[dict], score: dict[str, Any], source: Any, a2a: list[dict], a2a_source: Any
) -> None:
    """`parasim validate moe-layer`: every case, parasim's items for the BF16 ones, what each dispatcher saves
    over NCCL's all-to-all (measured and timed), the all-to-all alone at EP 8-64, and the sources."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    console.print(escape(MOE_LAYER_SAID))
    t = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        title_justify="left",
        title="Forward and backward, milliseconds",
    )
    t.add_column("case", overflow="fold")
    for col in ("fwd", "parasim", "error", "bwd", "parasim", "error"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in table:
        t.add_row(
            escape(r["case"]),
            f"{r['forward_ms']:.2f}",
            f"{r['parasim_forward_ms']:.2f}",
            f"{r['forward_error']:+.1%}",
            f"{r['backward_ms']:.2f}",
            f"{r['parasim_backward_ms']:.2f}",
            f"{r['backward_error']:+.1%}",
        )
    console.print()
    console.print(t)
    console.print(
        f"{score['cases']} cases, {score['timings']} timings: median |error| {score['median_abs_error']:.1%}, "
        f"the largest {score['max_abs_error']:.1%}, bias {score['bias']:+.1%}."
    )
    bf16 = [r for r in table if r["precision"] == "megatron-bf16" and r["dispatcher"] == "alltoall"]
    once = {r["model"]: r for r in table if r["precision"] == "megatron-bf16" and r["dispatcher"] == "deepep"}
    items = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        title_justify="left",
        title="parasim's items in BF16, forward/backward, milliseconds (--json: every case's)",
    )
    items.add_column("item", no_wrap=True)
    for r in bf16:
        items.add_column(escape(r["model"]), justify="right", no_wrap=True)
    for name in dict.fromkeys(k for r in bf16 for k in r["items_ms"]):
        items.add_row(escape(name), *(_ms_pair(r["items_ms"][name]) if name in r["items_ms"] else "-" for r in bf16))
    for name in ("dispatch", "combine"):
        items.add_row(f"{name}, DeepEP/HybridEP", *(_ms_pair(once[r["model"]]["items_ms"][name]) for r in bf16))
    console.print()
    console.print(items)
    console.print()
    console.print(
        escape(
            "What DeepEP and HybridEP save over NCCL's all-to-all of the same layer and precision, "
            "forward/backward in milliseconds (they send a token once to each GPU holding one of its "
            "experts, where the all-to-all sends each of its top-k copies):"
        )
    )
    for r in table:
        if "saved_vs_alltoall_ms" in r:
            console.print(
                escape(
                    f"- {r['case']}: measured {_ms_pair(r['saved_vs_alltoall_ms'])}, parasim "
                    f"{_ms_pair(r['parasim_saved_vs_alltoall_ms'])}"
                )
            )
    console.print()
    console.print(escape(f"Source: {source.document}, {source.where}; {source.measured}. {source.address}"))
    alone = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        title_justify="left",
        title="NCCL's all-to-all alone, H100, microseconds (HybridEP's measured beside it, not timed)",
    )
    for col in ("EP", "nodes", "dispatch", "parasim", "error", "combine", "parasim", "error", "HybridEP"):
        alone.add_column(col, justify="right", no_wrap=True)
    for r in a2a:
        alone.add_row(
            str(r["ep"]),
            str(r["nodes"]),
            f"{r['dispatch_us']:,}",
            f"{r['parasim_dispatch_us']:,.0f}",
            f"{r['dispatch_error']:+.1%}",
            f"{r['combine_us']:,}",
            f"{r['parasim_combine_us']:,.0f}",
            f"{r['combine_error']:+.1%}",
            "/".join(f"{v:,}" for v in r["hybridep_us"]),
        )
    console.print()
    console.print(alone)
    console.print(
        escape(f"Source: {a2a_source.document}, {a2a_source.where}; {a2a_source.measured}. {a2a_source.address}")
    )

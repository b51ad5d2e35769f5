"""The step-time validation as a reader sees it (`parasim validate step-time`) and as docs/validation.md
prints it (`markdown_rows`, which tests hold the page to)."""
from __future__ import annotations

from typing import Any


SHORT = {"s per step": "s/step", "TFLOP/s per GPU": "TFLOP/s/GPU"}


def _value(v: float, unit: str) -> str:
    return f"{v:.2f}" if unit == "s per step" else f"{v:.1f}"


def step_time_report(console: Any, table: list[dict], score: dict) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left",
              title="Step time against published runs (error: parasim's throughput over the published, less one; "
                    "+ means parasim's step is faster)")
    for col, just in (("run", "left"), ("GPUs", "right"), ("unit", "left"), ("published", "right"),
                      ("parasim", "right"), ("error", "right")):
        t.add_column(col, justify=just, no_wrap=True)
    for r in table:
        t.add_row(("" if r["scored"] else "*") + r["name"], f"{r['gpus']:,}", SHORT[r["unit"]],
                  _value(r["published"], r["unit"]), _value(r["predicted"], r["unit"]), f"{r['error']:+.1%}")
    console.print(t)
    console.print(f"Scored rows: {score['rows']}; median |error| {score['median_abs_error']:.1%}, largest "
                  f"{score['max_abs_error']:.1%}" + (f"; beyond 25%: {', '.join(score['beyond_25'])}"
                                                     if score["beyond_25"] else "; none beyond 25%."))
    console.print("* not scored: the source leaves out settings that change the time (see the run's note).")
    console.print()
    console.print("[bold]What parasim assumes where a source is silent, and what the other choices give[/bold]")
    for r in table:
        if r["assumed"] or r["variants"]:
            other = "; ".join(f"{k}: {_value(v['predicted'], r['unit'])} ({v['error']:+.1%})"
                              for k, v in r["variants"].items())
            console.print(escape(f"- {r['name']}: {r['assumed'] or 'as published'}" + (f". Instead {other}"
                                                                                      if other else "")))
    console.print()
    console.print("[bold]Sources[/bold]")
    for source, address in dict.fromkeys((r["source"], r["address"]) for r in table):
        console.print(escape(f"- {source}: {address}"))


def markdown_rows(table: list[dict]) -> list[str]:
    """The table of docs/validation.md's step-time section, a line per run."""
    out = ["| run | source | GPUs | unit | published | parasim | error |", "|---|---|---|---|---|---|---|"]
    for r in table:
        name = r["name"] + ("" if r["scored"] else " (not scored)")
        out.append(f"| {name} | [{r['cite']}]({r['address']}) | {r['gpus']:,} | "
                   f"{r['unit']} | {_value(r['published'], r['unit'])} | {_value(r['predicted'], r['unit'])} | "
                   f"{r['error']:+.1%} |")
    return out

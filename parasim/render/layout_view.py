"""The picture `parasim layout` draws: GPUs by node and pipeline stage, each rank's coordinates and experts,
the groups that live inside each node and those that cross nodes, and where gradients are reduced.

A model's name and words can come from a config file: they are drawn as Rich Text (no markup), through
`printable`."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group as RichGroup
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..layout import COORDS, GROUP_NAMES, Layout, stage_counts, stage_span
from ..layout.stages import describe, is_uneven
from .text import printable

SHOWN_GROUPS = 8  # groups listed per kind before "... and N more"


def _members(g: list[int]) -> str:
    if len(g) <= 12:
        return "[" + ",".join(map(str, g)) + "]"
    return "[" + ",".join(map(str, g[:4])) + ",...," + ",".join(map(str, g[-2:])) + f"] ({len(g)} ranks)"


def _fmt(groups: list[list[int]], limit: int = SHOWN_GROUPS) -> str:
    text = " ".join(_members(g) for g in groups[:limit])
    return text + (f"  ... and {len(groups) - limit} more" if len(groups) > limit else "")


def _model_line(layout: Layout) -> str:
    m = layout.model
    if m is None:
        return "no model given (sizes only)"
    facts = [
        f"{v} {k}"
        for k, v in (
            ("layers", m.layers),
            ("hidden", m.hidden),
            ("heads", m.heads),
            ("kv heads", m.kv_heads),
            ("experts", m.experts),
        )
        if v
    ]
    if m.top_k:
        facts.append(f"top-{m.top_k} routing")
    if m.seq:
        facts.append(f"sequence {m.seq}")
    if m.tokens:
        facts.append("tokens: " + " ".join(m.tokens))
    counts = stage_counts(m, layout.pp) if m.layers else ()
    if is_uneven(counts):  # how the layers sit on the stages (layout/stages.py), when not evenly
        facts[0] = describe(counts)
    return (m.name + ": " if m.name else "") + ", ".join(facts)


def _stage_layers(layout: Layout, stage: int) -> str:
    """The layers stage `stage` holds, by the model's rule (layout/stages.py), counted from 1."""
    m = layout.model
    if m is None or not m.layers:
        return ""
    start, n = (int(x) for x in stage_span(m, layout.pp, stage))
    return f" (layer {start + 1})" if n == 1 else f" (layers {start + 1}-{start + n})"


def render(layout: Layout, title: str = "", max_nodes: int = 2) -> RichGroup:
    groups, coords = layout.groups(), layout.coords()
    per_node = min(layout.gpus_per_node, layout.world)
    nodes = (layout.world + per_node - 1) // per_node
    head = Text()
    if title:
        head.append(printable(title) + "\n", style="bold")
    head.append(f"{layout}, order {layout.order}\n")
    head.append(
        f"attention view of a stage: TP{layout.tp} x CP{layout.cp} x DP{layout.dp};  "
        f"MoE view of the same GPUs: ETP{layout.etp} x EP{layout.ep} x EDP{layout.edp}"
        + (
            " (MoE parallel folding: two layouts over one set of GPUs, TP x CP x DP = ETP x EP x EDP)\n"
            if layout.model is not None and layout.model.experts
            else "\n"
        )
    )
    head.append(printable(_model_line(layout)))
    parts: list = [head]
    for node in range(min(nodes, max_nodes)):
        ranks = range(node * per_node, min((node + 1) * per_node, layout.world))
        stages = sorted({coords[r]["pp"] for r in ranks})
        # stages counted from 1, as the post and `parasim trace` count them (the pp column is the 0-based rank)
        where = (
            f"pipeline stage {stages[0] + 1} (pp rank {stages[0]}){_stage_layers(layout, stages[0])}"
            if len(stages) == 1
            else f"pipeline stages {', '.join(str(s + 1) for s in stages)}"
        )
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("rank", *COORDS):
            table.add_column(col, justify="right")
        if layout.model and layout.model.experts:
            table.add_column("experts held")
        for r in ranks:
            c = coords[r]
            row = [str(r)] + [str(c[k]) for k in COORDS]
            if layout.model and layout.model.experts:
                row.append(" ".join(f"E{e + 1}" for e in layout.experts_of(c["ep"])))
            table.add_row(*row)
        inside = Table.grid(padding=(0, 2))
        inside.add_column(style="cyan")
        inside.add_column()
        for name in GROUP_NAMES:
            mine = [g for g in groups[name] if g[0] in ranks and g[-1] in ranks]
            if mine and len(groups[name][0]) > 1:
                inside.add_row(name, _fmt(mine))
        parts.append(
            Panel(
                RichGroup(table, inside),
                title=f"node {node}: ranks {ranks[0]}-{ranks[-1]}, {where}",
                title_align="left",
            )
        )
    if nodes > max_nodes:
        parts.append(
            Text(
                f"... {nodes - max_nodes} more node(s) of {per_node} GPUs, laid out the same way (--nodes N shows more)"
            )
        )
    across = Table.grid(padding=(0, 2))
    across.add_column(style="cyan")
    across.add_column()
    for name in GROUP_NAMES:
        crossing = [g for g in groups[name] if g[0] // per_node != g[-1] // per_node]
        if crossing:
            across.add_row(name, _fmt(crossing))
    if across.row_count:
        parts.append(Panel(across, title="groups that cross nodes", title_align="left"))
    grads = Text()
    grads.append("gradients: ", style="bold")
    grads.append(f"dense parameters are reduced over dp-cp {_fmt(groups['dp-cp'], 4)}")
    if layout.model and layout.model.experts:
        grads.append(f"; expert parameters over expert-dp {_fmt(groups['expert-dp'], 4)}")
    parts.append(grads)
    return RichGroup(*parts)


def print_layout(layout: Layout, title: str = "", max_nodes: int = 2, console: Console | None = None) -> None:
    (console or Console(highlight=False)).print(render(layout, title, max_nodes))

"""The layout as one picture, drawn as the post draws its 16-GPU map (nodes, DP replicas, the experts each GPU
holds, a dashed box per EP group, links between the GPUs that sum gradients, a legend), and one token's
path drawn on it (`parasim trace --plot`): where it is dispatched to and combined from, layer by layer, and
the pipeline hand-off to the next stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..layout import COORDS
from .plot_base import DPI, pyplot, save
from ..comm.trace import Trace

EP_COLOUR = "#7b2cbf"  # dashed purple, as the post draws its EP groups
TOKEN_COLOUR = "#d62828"  # red, as the post draws its token
PLAIN_FILL = "#dde8f3"  # a GPU's fill where there are no EP groups to tell apart
CELL = 0.9  # a GPU's square, in a unit grid
ROW_STEP = 1.5  # rows a GPU's height and a gap apart: links and arrows run in the gaps
PATH_ROW_STEP = 1.9  # with a token's path drawn: room between rows for its arrows and their numbers
NODE_GAP = 1.3  # between two nodes' frames: room for the next node's row labels
LINE_UNITS = 40  # grid units of nodes side by side before the next node starts a new line of them
ABOVE, BELOW = 1.5, 1.3  # a node's panel above its top row (arcs, arrows) and below its bottom row (labels, name)


@dataclass(frozen=True)
class GradientLinks:
    """A kind of gradient group drawn as links: the group (Layout.groups), what is summed over it, its style,
    and where in a GPU's square its links attach (a fraction of the width: two kinds never share a point)."""

    group: str
    says: str
    colour: str
    style: Any
    anchor: float
    experts: bool  # drawn only where the layout has experts (a dense model's expert groups hold nothing)


GRADIENT_LINKS = (
    GradientLinks(
        "dp-cp", "gradients of attention and other dense weights summed (DP x CP group)", "#2a9d3a", "-", 0.32, False
    ),
    GradientLinks("expert-dp", "gradients of the experts summed (EDP group)", "#0b6e4f", (0, (2, 1.5)), 0.68, True),
)


@dataclass(frozen=True)
class Hop:
    """One move of the followed token between GPUs: `kind` is dispatch, combine or hand-off."""

    src: int
    dst: int
    kind: str
    says: str
    layer: int


HOP_STYLES = {  # how each kind of hop is drawn: line style, line width, the side of the squares it leaves from
    "dispatch": ("-", 1.6, "top"),
    "combine": ((0, (3, 1.5)), 1.6, "bottom"),
    "hand-off": ("-", 2.4, "top"),
}


def layout_map(layout: Any) -> list[dict]:
    """Where each GPU is drawn, as the post draws its 16-GPU map: nodes left to right; in a node, one row per
    DP replica (of its pipeline stage) and one column per (CP rank, TP rank); each GPU with its coordinates,
    its EP group (an index) and the experts it holds (1-based)."""
    coords, groups = layout.coords(), layout.groups()
    ep_index = {r: i for i, g in enumerate(groups["ep"]) for r in g}
    cols = min(layout.tp * layout.cp, layout.gpus_per_node)
    out = []
    for c in coords:
        r = c["rank"]
        node, slot = divmod(r, layout.gpus_per_node)
        out.append(
            {
                "gpu": r,
                "node": node,
                "row": slot // cols,
                "col": slot % cols,
                "ep_group": ep_index[r],
                "experts": [e + 1 for e in layout.experts_of(c["ep"])],
                "coords": {k: c[k] for k in COORDS},
            }
        )
    return out


class _Grid:
    """Where each GPU's square lies: x from its node and column, y from its row (row 0 on top)."""

    def __init__(self, cells: list[dict], cols: int, row_step: float = ROW_STEP) -> None:
        self.cols, self.row_step = cols, row_step
        self.rows = max(c["row"] for c in cells) + 1
        self.nodes = max(c["node"] for c in cells) + 1
        self.cell = {c["gpu"]: c for c in cells}
        # many nodes go in lines of nodes, so that the picture stays readable at its size
        self.per_line = max(1, min(self.nodes, int(LINE_UNITS // (cols + NODE_GAP))))
        self.lines = -(-self.nodes // self.per_line)
        self.top = (self.rows - 1) * row_step + 1  # a panel's top row's upper edge, above its y0
        self.panel = self.top + ABOVE + BELOW

    def node_x(self, node: int) -> float:
        return (node % self.per_line) * (self.cols + NODE_GAP)

    def node_y(self, node: int) -> float:
        """The bottom of the node's bottom row (0 for the first line of nodes, lower for later lines)."""
        return -(node // self.per_line) * self.panel

    def row_y(self, node: int, row: int) -> float:
        return self.node_y(node) + (self.rows - 1 - row) * self.row_step

    def corner(self, gpu: int) -> tuple[float, float]:
        """The lower-left corner of the GPU's unit slot (its square is inset by (1 - CELL) / 2)."""
        c = self.cell[gpu]
        return self.node_x(c["node"]) + c["col"], self.row_y(c["node"], c["row"])

    def edge(self, gpu: int, side: str, along: float = 0.5) -> tuple[float, float]:
        """A point on the top or bottom edge of the GPU's square, `along` its width."""
        x, y = self.corner(gpu)
        inset = (1 - CELL) / 2
        return x + inset + CELL * along, y + (1 - inset if side == "top" else inset)


def _arc(
    plt_ax: Any, a: tuple[float, float], b: tuple[float, float], bulge: float | tuple[float, float], **style: Any
) -> Any:
    """A line (or arrow) from a to b whose middle is moved by `bulge` grid units (a number: up, or down when
    negative; a pair: that (x, y) offset, across the line), drawn as an annotation, so its two ends stay
    readable as .xyann (from) and .xy (to)."""
    ox, oy = (0.0, bulge) if isinstance(bulge, (int, float)) else bulge
    nx, ny = b[1] - a[1], a[0] - b[0]  # arc3 moves the middle by rad/2 * (dy, -dx)
    across = nx * nx + ny * ny
    rad = 0.0 if across < 1e-12 else 2 * (ox * nx + oy * ny) / across
    props = {
        "arrowstyle": style.pop("arrowstyle", "-"),
        "connectionstyle": f"arc3,rad={rad:.4f}",
        "shrinkA": 0,
        "shrinkB": 0,
        **style,
    }
    return plt_ax.annotate("", xy=b, xytext=a, xycoords="data", textcoords="data", arrowprops=props)


def _snake(grid: _Grid, members: list[int]) -> list[int]:
    """A group's members in the order one line through them runs: by node and row, each row alternately
    left to right and right to left, so consecutive members sit near each other."""
    rows: dict[tuple[int, int], list[int]] = {}
    for g in members:
        rows.setdefault((grid.cell[g]["node"], grid.cell[g]["row"]), []).append(g)
    out: list[int] = []
    for i, key in enumerate(sorted(rows)):
        row = sorted(rows[key], key=lambda g: grid.cell[g]["col"])
        out += row if i % 2 == 0 else row[::-1]
    return out


def _draw_gradient_links(ax: Any, grid: _Grid, groups: dict, faint: bool, experts: bool) -> list[Any]:
    """Every gradient group of more than one GPU as a chain of links (one artist per link, its gid naming
    the group): along a row the link bows over (top row) or under the squares, between rows it runs in
    the gap."""
    handles = []
    across = grid.nodes <= 2  # links between nodes, drawn only where they stay few enough to follow
    left_out = 0
    for kind in GRADIENT_LINKS:
        if kind.experts and not experts:
            continue
        drawn = False
        for gi, members in enumerate(groups[kind.group]):
            order = [g for g in _snake(grid, members) if g in grid.cell]
            if not across:  # each node's members linked among themselves
                left_out += len({grid.cell[g]["node"] for g in order}) > 1
                order = sorted(order, key=lambda g: grid.cell[g]["node"])
            for a, b in zip(order, order[1:]):
                if not across and grid.cell[a]["node"] != grid.cell[b]["node"]:
                    continue
                ra, rb = grid.cell[a]["row"], grid.cell[b]["row"]
                if ra == rb and grid.corner(a)[1] == grid.corner(b)[1]:
                    side = "top" if ra == 0 else "bottom"  # the top row's links bow above it, others below
                    pa, pb = grid.edge(a, side, kind.anchor), grid.edge(b, side, kind.anchor)
                    span = abs(pa[0] - pb[0])
                    bulge = (0.18 + 0.06 * span) * (1 if side == "top" else -1)
                else:  # from the lower edge of the upper GPU to the upper edge of the lower one
                    up, down = (a, b) if ra <= rb else (b, a)
                    pa, pb, bulge = grid.edge(up, "bottom", kind.anchor), grid.edge(down, "top", kind.anchor), 0.0
                art = _arc(ax, pa, pb, bulge, color=kind.colour, lw=1.3, ls=kind.style, alpha=0.35 if faint else 0.95)
                art.set_gid(f"gradient {kind.group} {gi}")
                art.set_zorder(2)
                drawn = True
        if drawn:
            handles.append((kind.colour, kind.style, kind.says))
    if left_out:
        handles.append(
            (
                "white",
                "-",
                f"{left_out} gradient groups span several nodes: linked inside each node here; "
                "`parasim layout` lists them whole",
            )
        )
    return handles


def _ep_boxes(grid: _Grid, ep_groups: list[list[int]]) -> list[tuple[int, float, float, float, float]]:
    """One dashed box per EP group: (group, x, y, width, height) around its GPUs; a group whose GPUs are
    not side by side in one row of one node gets a box around each run of neighbours."""
    out = []
    for gi, members in enumerate(ep_groups):
        runs: dict[tuple[int, int], list[int]] = {}
        for g in members:
            if g in grid.cell:
                runs.setdefault((grid.cell[g]["node"], grid.cell[g]["row"]), []).append(grid.cell[g]["col"])
        for (node, row), cols in sorted(runs.items()):
            cols.sort()
            start = prev = cols[0]
            for col in cols[1:] + [None]:
                if col is not None and col == prev + 1:
                    prev = col
                    continue
                x = grid.node_x(node) + start
                y = grid.row_y(node, row)
                out.append((gi, x + 0.015, y + 0.015, prev - start + 1 - 0.03, 1 - 0.03))
                if col is not None:
                    start = prev = col
    return out


def experts_text(experts: list[int]) -> str:
    """A GPU's experts as its square can hold them: two by name (E1 E2), more as their range (E1-E8), since
    each EP rank holds a contiguous block."""
    if len(experts) > 2 and experts == list(range(experts[0], experts[-1] + 1)):
        return f"E{experts[0]}\u2013E{experts[-1]}"
    return " ".join(f"E{e}" for e in experts)


def _ep_fill(groups: int) -> Any:
    """A light colour per EP group (Pastel1's nine, or tab20's twenty lightened: labels stay black on them)."""
    plt = pyplot()
    palette = plt.get_cmap("Pastel1" if groups <= 9 else "tab20")

    def colour(i: int) -> tuple[float, ...]:
        r, g, b, _ = palette(i % palette.N)
        return tuple(0.45 * v + 0.55 for v in (r, g, b)) if groups > 9 else (r, g, b)

    return colour


def _draw_map(ax: Any, layout: Any, grid: _Grid, cells: list[dict], held_by: set[int], faint_links: bool) -> list:
    """The nodes, the GPUs (their names and experts), the EP boxes and gradient links; the legend entries."""
    plt = pyplot()
    groups = layout.groups()
    fill = _ep_fill(len(groups["ep"])) if layout.ep > 1 else (lambda i: PLAIN_FILL)
    for c in cells:
        x, y = grid.corner(c["gpu"])
        inset = (1 - CELL) / 2
        mine = c["gpu"] in held_by
        square = plt.Rectangle(
            (x + inset, y + inset),
            CELL,
            CELL,
            facecolor=fill(c["ep_group"]),
            edgecolor=TOKEN_COLOUR if mine else "0.55",
            lw=2.5 if mine else 0.8,
            zorder=3,
        )
        square.set_gid(f"gpu {c['gpu']}")
        ax.add_patch(square)
        experts = experts_text(c["experts"])
        ax.text(
            x + 0.5,
            y + 0.5,
            f"g{c['gpu']}" + (f"\n{experts}" if experts else ""),
            ha="center",
            va="center",
            fontsize=7.5,
            color=TOKEN_COLOUR if mine else "black",
            zorder=4,
            fontweight="bold" if mine else "normal",
        )
    for n in range(grid.nodes):
        x0, y0 = grid.node_x(n), grid.node_y(n)
        ours = [c for c in cells if c["node"] == n]
        ax.add_patch(
            plt.Rectangle(
                (x0 - 0.12, y0 - 0.62), grid.cols + 0.24, grid.top + 1.5, fill=False, ec="0.45", lw=1, zorder=1
            )
        )
        stages = sorted({c["coords"]["pp"] for c in ours})
        stage = f": pipeline stage {stages[0] + 1} of {layout.pp}" if len(stages) == 1 and layout.pp > 1 else ""
        # under the frame: the space above the squares is the arcs' and arrows'
        ax.text(x0 + grid.cols / 2, y0 - 0.72, f"node {n}{stage}", ha="center", va="top", fontsize=9)
        for row in range(grid.rows):  # each row's DP replica, where the row is one replica
            dps = {c["coords"]["dp"] for c in ours if c["row"] == row}
            if len(dps) == 1:
                ax.text(
                    x0 - 0.18,
                    grid.row_y(n, row) + 0.5,
                    f"DP {dps.pop()}",
                    ha="right",
                    va="center",
                    fontsize=7,
                    color="0.3",
                )
        for c in (c for c in ours if c["row"] == max(o["row"] for o in ours)):  # under the bottom row: CP, TP
            ax.text(
                x0 + c["col"] + 0.5,
                y0 - 0.33,
                f"cp{c['coords']['cp']} tp{c['coords']['tp']}",
                ha="center",
                va="top",
                fontsize=6.5,
                color="0.35",
            )
    boxed = False
    if layout.ep > 1:
        for gi, x, y, w, h in _ep_boxes(grid, groups["ep"]):
            box = plt.Rectangle((x, y), w, h, fill=False, ec=EP_COLOUR, ls=(0, (4, 2)), lw=1.6, zorder=5)
            box.set_gid(f"ep {gi}")
            ax.add_patch(box)
            boxed = True
    links = _draw_gradient_links(ax, grid, groups, faint_links, layout.ep > 1 or layout.experts_each > 0)
    return _legend_entries(layout, boxed, links)


def _legend_entries(layout: Any, boxed: bool, links: list) -> list[tuple[Any, str]]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    entries: list[tuple[Any, str]] = [
        (
            Patch(facecolor=PLAIN_FILL, edgecolor="0.55"),
            "a GPU: g<rank>"
            + (", E<n>: the experts it holds" if layout.experts_each else "")
            + ("; its fill: its EP group" if layout.ep > 1 else ""),
        ),
    ]
    if boxed:
        entries.append(
            (
                Patch(fill=False, edgecolor=EP_COLOUR, ls=(0, (4, 2)), lw=1.6),
                f"one EP group: its {layout.ep} GPUs hold all {layout.model.experts} experts"
                if layout.model is not None and layout.model.experts
                else "one EP group",
            )
        )
    entries += [(Line2D([], [], color=colour, ls=style, lw=1.3), says) for colour, style, says in links]
    return entries


def _frame(layout: Any, row_step: float = ROW_STEP) -> tuple[Any, Any, _Grid, list[dict]]:
    from ..limits import check_experts_shown, check_plot_gpus

    check_plot_gpus(layout.world)
    check_experts_shown(layout.world, layout.experts_each)
    plt = pyplot()
    cells = layout_map(layout)
    grid = _Grid(cells, min(layout.tp * layout.cp, layout.gpus_per_node), row_step)
    width = grid.per_line * (grid.cols + NODE_GAP)
    height = grid.lines * grid.panel
    scale = max(0.75, min(1.1, 14 / width))  # inches per grid unit: never so small that a label outgrows its GPU
    fig, ax = plt.subplots(figsize=(max(7.0, width * scale + 0.6), height * scale + 2.2))
    return fig, ax, grid, cells


def _finish(fig: Any, ax: Any, grid: _Grid, entries: list, title: str, path: str, listing: str = "") -> None:
    """Limits, title and the legend under the map; `listing` (lines of text) to the legend's right, placed
    once the legend's size is known, so the two never overlap (the file is cropped to what is drawn)."""
    handles, labels = zip(*entries)
    ax.set_xlim(-0.8, grid.per_line * (grid.cols + NODE_GAP) - NODE_GAP + 0.3)
    ax.set_ylim(grid.node_y(grid.nodes - 1) - 1.1, grid.top + 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=9.5)
    legend = ax.legend(
        handles,
        labels,
        loc="upper left" if listing else "upper center",
        bbox_to_anchor=(0.0 if listing else 0.5, 0.0),
        ncol=1,
        fontsize=7.5,
        frameon=False,
    )
    if listing:
        fig.set_dpi(DPI)  # measured as it will be written
        fig.canvas.draw()
        box = legend.get_window_extent().transformed(fig.transFigure.inverted())
        fig.text(box.x1 + 0.02, box.y1, listing, ha="left", va="top", fontsize=7, family="monospace")
    save(fig, path)
    pyplot().close(fig)


def plot_layout_map(layout: Any, path: str, title: str = "", mark: int | None = None) -> None:
    """The layout in one picture: GPUs by node, each with its experts; a dashed box per EP group, links
    between the GPUs that sum gradients, and a legend saying what each mark means. GPU `mark` in red."""
    fig, ax, grid, cells = _frame(layout)
    entries = _draw_map(ax, layout, grid, cells, {mark} if mark is not None else set(), faint_links=False)
    _finish(fig, ax, grid, entries, title or f"{layout}: GPUs by node", path)


# -- one token's path ---------------------------------------------------------------------------------------------
def token_hops(path: dict, trace: Trace) -> list[Hop]:
    """The followed token's moves in the forward pass, in the order of `path` (examples/moe16_path.token_path,
    what `parasim trace --json` prints): at each MoE layer, dispatch from its GPU to each other GPU holding
    one of its experts and combine back (from the route the holder noted in the run); then the pipeline
    hand-off to the next stage's holder (from the point-to-point event itself)."""
    routes = {(ph, r): d for ph, r, _, d in trace.notes("watch") if d.get("watch") == "route"}
    events = {e.seq: e for e in trace.events}
    hops: list[Hop] = []
    for step in path["steps"]:
        if step.get("direction") != "forward":
            continue
        if "event" not in step and len(step["ranks"]) == 1:  # a note: the route, where the holder left one
            route = routes.get((step["phase"], step["ranks"][0]))
            if route is None:
                continue
            me, layer = step["ranks"][0], route["layer"]
            here = [f"E{e}" for e, g in zip(route["experts"], route["gpus"]) if g == me]
            away: dict[int, list[int]] = {}
            for e, g in zip(route["experts"], route["gpus"]):
                if g != me:
                    away.setdefault(g, []).append(e)
            stays = f"; {' '.join(here)} on g{me} itself" if here else ""
            for g, experts in away.items():
                hops.append(
                    Hop(
                        me,
                        g,
                        "dispatch",
                        f"layer {layer}: dispatch to g{g} ({' '.join(f'E{e}' for e in experts)}){stays}",
                        layer,
                    )
                )
            for g, experts in away.items():
                hops.append(Hop(g, me, "combine", f"layer {layer}: combine: g{g}'s expert output back to g{me}", layer))
        elif step.get("group") == "pp" and step.get("op") == "p2p":
            e = events[step["event"]]
            src, dst = e.params["src"], e.params["dst"]
            layer = int(step["phase"].rsplit(" ", 1)[-1]) if step["phase"].rsplit(" ", 1)[-1].isdigit() else 0
            hops.append(
                Hop(
                    src,
                    dst,
                    "hand-off",
                    f"after layer {layer}: pipeline hand-off g{src} -> g{dst} (to the next stage)",
                    layer,
                )
            )
    return hops


def _draw_hops(ax: Any, grid: _Grid, hops: list[Hop]) -> None:
    """One red arrow per distinct move, labelled with the numbers of the hops that make it (the same trip in
    several layers: one arrow, "1,5"). Along a row, dispatches bow over the squares and combines under
    them; between rows, dispatches bow left and combines right, so a trip and its return never coincide."""
    moves: dict[tuple[int, int, str], list[int]] = {}
    for n, hop in enumerate(hops, 1):
        moves.setdefault((hop.src, hop.dst, hop.kind), []).append(n)
    for (src, dst, kind), numbers in moves.items():
        style, lw, side = HOP_STYLES[kind]
        at = 0.5  # where along the arc its numbers go
        if kind == "hand-off":
            a, b = grid.edge(src, "top", 0.85), grid.edge(dst, "top", 0.15)
            bulge: tuple[float, float] = (0.0, 1.25)  # above the other arcs, out of one node's frame into the next
        elif grid.corner(src)[1] == grid.corner(dst)[1]:  # the same row
            a, b = grid.edge(src, side), grid.edge(dst, side)
            bulge = (0.0, 0.4 if side == "top" else -0.4)
        else:  # from the facing edges
            down = grid.corner(src)[1] > grid.corner(dst)[1]
            a, b = grid.edge(src, "bottom" if down else "top"), grid.edge(dst, "top" if down else "bottom")
            bulge = (-0.3 if kind == "dispatch" else 0.3, 0.0)
            # the numbers near the expert's GPU, where a dispatch and its combine are apart (one bowed each way);
            # at the holder's end every dispatch starts from one point
            at = 0.75 if kind == "dispatch" else 0.25
        arrow = _arc(
            ax,
            a,
            b,
            bulge,
            arrowstyle="-|>,head_length=0.5,head_width=0.25",
            color=TOKEN_COLOUR,
            lw=lw,
            ls=style,
            mutation_scale=10,
        )
        arrow.set_gid(f"{kind} g{src} g{dst}")
        arrow.set_zorder(6)
        # on the arc: arc3's quadratic curve has its control point at the chord's middle plus twice the bulge
        cx, cy = (a[0] + b[0]) / 2 + 2 * bulge[0], (a[1] + b[1]) / 2 + 2 * bulge[1]
        mx, my = (
            (1 - at) ** 2 * a[0] + 2 * at * (1 - at) * cx + at * at * b[0],
            (1 - at) ** 2 * a[1] + 2 * at * (1 - at) * cy + at * at * b[1],
        )
        ax.text(
            mx,
            my,
            ",".join(map(str, numbers)),
            ha="center",
            va="center",
            fontsize=6.5,
            color=TOKEN_COLOUR,
            zorder=7,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": TOKEN_COLOUR, "lw": 0.8},
        )


def _partners(path: dict, held_by: set[int]) -> list[str]:
    """In words, the GPUs each holder works with in attention (from the path's forward events): its TP group
    (all-gather, reduce-scatter) and CP ring (K/V), which the map leaves undrawn."""
    out = []
    for holder in sorted(held_by):
        with_ = {
            kind: sorted(
                {
                    r
                    for step in path["steps"]
                    if step.get("direction") == "forward" and step.get("group") == kind and holder in step["ranks"]
                    for r in step["ranks"]
                }
                - {holder}
            )
            for kind in ("tp", "cp")
        }
        said = [
            f"{', '.join(f'g{r}' for r in with_[k])} ({what})"
            for k, what in (("tp", "TP: all-gather, reduce-scatter"), ("cp", "CP ring: K/V"))
            if with_[k]
        ]
        if said:
            out.append(f"in attention, every layer, g{holder} works with " + " and ".join(said))
    return out


def plot_token_path(layout: Any, path: dict, trace: Trace, out: str, title: str) -> None:
    """The layout map with the followed token's path drawn on it: the GPUs holding it outlined in red, every
    move an arrow numbered in order (dispatch to its experts' GPUs, combine back, the pipeline hand-off),
    the numbered moves listed in words under the map, and a legend."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax, grid, cells = _frame(layout, PATH_ROW_STEP)
    held_by = {step["ranks"][0] for step in path["steps"] if step["phase"] == "data"}
    entries = _draw_map(ax, layout, grid, cells, held_by, faint_links=True)
    hops = token_hops(path, trace)
    _draw_hops(ax, grid, hops)
    entries[1:1] = [
        (Patch(fill=False, edgecolor=TOKEN_COLOUR, lw=2.5), f"a GPU holding {path['token']!r} (one per pipeline stage)")
    ]
    entries += [
        (
            Line2D([], [], color=TOKEN_COLOUR, lw=w, ls=s, marker=">", ms=4),
            f"the token's {kind}"
            + (
                " (to the GPUs of its top experts)"
                if kind == "dispatch"
                else " (expert outputs back, gate-weighted)"
                if kind == "combine"
                else " (activations to the next pipeline stage)"
            ),
        )
        for kind, (s, w, _) in HOP_STYLES.items()
        if any(h.kind == kind for h in hops)
    ]
    steps = [f"{n:>2}. {h.says}" for n, h in enumerate(hops, 1)] or [
        "no dispatch and no hand-off: it stays on its GPU through the forward pass"
    ]
    half = (len(steps) + 1) // 2 if len(steps) > 12 else len(steps)  # a long list in two columns
    width = max(len(x) for x in steps[:half]) + 3
    listing = "\n".join(
        [
            *_partners(path, held_by),
            "the token's moves in the forward pass, numbered as on the map (backward retraces them in reverse):",
        ]
        + [f"{a:<{width}}{b}".rstrip() for a, b in zip(steps[:half], steps[half:] + [""] * half)]
    )
    _finish(fig, ax, grid, entries, title, out, listing)

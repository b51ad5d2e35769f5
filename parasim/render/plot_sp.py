"""Sequence parallelism's flow through one layer as a picture (`parasim lesson sp --plot FILE`): the norms,
dropouts and residual adds on each rank's slice of the sequence, an all-gather before each block's
column-parallel product (where TP alone has the post's f, an identity forward) and a reduce-scatter after its
row-parallel one (where TP alone has g's all-reduce), and backward's mirror (the gradient gathered in g's place,
scattered in f's, and each block's kept input slice gathered again). Every shape and byte count is read from the
lesson's run: its trace's collectives on rank 0 and the weight slices the rank held."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .plot_base import pyplot, save

PHASE = "TP + SP"  # the sp lesson's run whose flow is drawn
SEQ_COLOUR, TP_COLOUR = "#d6e6f5", "#fde3c8"  # a box on the sequence slice, a box inside TP's products
GATHER, SCATTER = "tab:green", "tab:red"
KEPT_COLOUR = "#e4f2e4"  # the input slice a block kept from forward, gathered again in backward


@dataclass(frozen=True)
class SpCollective:
    """One of the run's sequence collectives on rank 0: the op, its label, the block it serves ("attn" or
    "mlp") and the module ("qkv", "out", "fc1", "fc2"), the tensor in and out, the bytes sent, and whether it
    is backward's second gather of a kept input slice."""

    op: str
    label: str
    block: str
    module: str
    src: tuple[int, ...]
    dst: tuple[int, ...]
    sent: int
    again: bool = False


@dataclass(frozen=True)
class SpFlow:
    """What the picture draws: the TP size, forward's and backward's sequence collectives in run order, rank
    0's weight slices by module, and backward's all-reduces of the weights every rank holds whole."""

    t: int
    forward: list[SpCollective]
    backward: list[SpCollective]
    shards: dict[str, tuple[int, ...]]
    sums: int
    sum_bytes: int

    @property
    def whole(self) -> tuple[int, ...]:
        """The whole activation [s, b, h], as the first all-gather gives it."""
        return self.forward[0].dst


def sp_flow(lr: Any, phase: str = PHASE) -> SpFlow:
    """The flow of `phase` in an sp lesson run, read from its trace (rank 0's part in each all-gather and
    reduce-scatter, and the all-reduces) and from the weight slices rank 0 returned."""
    trace = lr.result.trace
    forward: list[SpCollective] = []
    backward: list[SpCollective] = []
    sums = sum_bytes = 0
    for e in trace.events:
        if e.phase != phase or e.kind != "collective":
            continue
        m = e.member(0)
        if e.op == "all_reduce":
            sums, sum_bytes = sums + 1, sum_bytes + m.sent
            continue
        if e.op not in ("all_gather", "reduce_scatter"):
            continue
        label = e.label or ""
        parts = label.split(":")[0].split()[0].split(".")  # "layer.mlp.fc1 backward: ..." -> layer, mlp, fc1
        hop = SpCollective(
            e.op,
            label,
            parts[1] if len(parts) > 1 else "",
            parts[2] if len(parts) > 2 else "",
            tuple(m.ins[0].shape),
            tuple(m.outs[0].shape),
            m.sent,
            again=label.endswith("again"),
        )
        (backward if " backward" in label.split(":")[0] else forward).append(hop)
    if not forward:
        raise UsageError(
            f"the SP picture draws the collectives between TP ranks, and a run on {trace.world} rank has none: "
            "give --tp 2, 4 or 8"
        )
    shards = {k: tuple(v) for k, v in lr.result.values[0][phase]["shards"].items()}
    return SpFlow(trace.world, forward, backward, shards, sums, sum_bytes)


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in s) + "]"


NORM = {"attn": "LayerNorm 1", "mlp": "LayerNorm 2"}


def forward_boxes(flow: SpFlow) -> list[tuple[str, str, SpCollective | None]]:
    """Forward as (kind, text, the hop that follows or None): "seq" boxes on the rank's slice of the
    sequence, "tp" boxes inside a block's products, each collective between them."""
    out: list[tuple[str, str, SpCollective | None]] = []
    blocks = [h.block for h in flow.forward if h.op == "all_gather"]
    for i, block in enumerate(blocks):
        gather = next(h for h in flow.forward if h.block == block and h.op == "all_gather")
        scatter = next(h for h in flow.forward if h.block == block and h.op == "reduce_scatter")
        before = NORM.get(block, "the norm") + f" on my tokens {_shape(gather.src)}"
        if i > 0:
            out[-1] = ("seq", f"dropout + residual, then {before}", gather)
        else:
            out.append(("seq", f"input: my tokens; {before}", gather))
        if block == "attn":
            inside = (
                f"QKV column-parallel: W_qkv slice {_shape(flow.shards['qkv'])} on all {gather.dst[0]} tokens,\n"
                f"attention on this rank's heads; output row-parallel: W_o slice {_shape(flow.shards['out'])}\n"
                f"-> partial sums {_shape(scatter.src)}"
            )
        else:
            inside = (
                f"fc1 column-parallel: W1 slice {_shape(flow.shards['fc1'])}, the activation,\n"
                f"fc2 row-parallel: W2 slice {_shape(flow.shards['fc2'])} -> partial sums {_shape(scatter.src)}"
            )
        out.append(("tp", inside, scatter))
        out.append(("seq", f"dropout + residual on my tokens {_shape(scatter.dst)}: the layer's output", None))
    return out


def backward_boxes(flow: SpFlow) -> list[tuple[str, str, SpCollective | None]]:
    """Backward in run order (the MLP's first), as forward_boxes; a block's second gather of its kept input
    is drawn beside its "tp" box (kept_box, a dashed arrow from it)."""
    out: list[tuple[str, str, SpCollective | None]] = []
    blocks = list(dict.fromkeys(h.block for h in flow.backward))
    for i, block in enumerate(blocks):
        hops = [h for h in flow.backward if h.block == block]
        gather = next(h for h in hops if h.op == "all_gather" and not h.again)
        scatter = next(h for h in hops if h.op == "reduce_scatter")
        again = next((h for h in hops if h.again), None)
        if i == 0:
            out.append(("seq", f"the output's gradient: my tokens {_shape(gather.src)}", gather))
        else:
            held = _shape(next(h for h in flow.backward if h.block == blocks[i - 1] and h.op == "reduce_scatter").dst)
            out[-1] = ("seq", f"{NORM.get(blocks[i - 1], 'norm')} backward, residual, on my tokens {held}", gather)
        name = "attention" if block == "attn" else "MLP"
        kept = f",\nfrom its input gathered again ({_shape(again.dst)}, beside)" if again is not None else ""
        out.append(
            ("tp", f"{name} backward on all {gather.dst[0]} tokens, the weight slices' gradients{kept}", scatter)
        )
        last = NORM.get(block, "norm")
        out.append(("seq", f"{last} backward: the input's gradient, my tokens {_shape(scatter.dst)}", None))
    return out


# What TP alone runs where SP runs each collective, in the post's names: f is the identity forward and the
# all-reduce backward (before the column-parallel product), g the all-reduce forward and the identity backward
# (after the row-parallel one); the quoted names are TP alone's events in the same run's trace.
IN_PLACE_OF = {
    ("forward", "all_gather"): "in f's place (TP alone: the identity)",
    ("forward", "reduce_scatter"): "in g's place (TP alone: the all-reduce 'g forward')",
    ("backward", "all_gather"): "in g's place (TP alone: the identity)",
    ("backward", "reduce_scatter"): "in f's place (TP alone: the all-reduce 'f backward')",
}


def hop_text(h: SpCollective, direction: str) -> str:
    """An arrow's words: the op and what TP alone runs in its place (the post's f or g), then the shapes and
    the bytes rank 0 sent."""
    name = h.op.replace("_", "-")
    return f"{name}, {IN_PLACE_OF[(direction, h.op)]}\n{_shape(h.src)} -> {_shape(h.dst)}, {h.sent:,} B sent"


def kept_text(h: SpCollective, direction: str) -> str:
    """The words in the box beside a block: in forward the input slice it keeps for backward (the slice the
    all-gather `h` sends), in backward that slice gathered again (`h` is the second gather)."""
    norm = {"attn": "LayerNorm 1's", "mlp": "LayerNorm 2's"}.get(h.block, "its")
    if direction == "forward":
        return f"kept for backward:\n{norm} output,\nmy tokens {_shape(h.src)} only"
    return (
        f"kept from forward:\n{norm} output, my tokens\n{_shape(h.src)} -> all-gathered again\n"
        f"to {_shape(h.dst)}, {h.sent:,} B sent"
    )


def draw_sp(flow: SpFlow, title: str) -> Any:
    """The figure: forward down the left, backward down the right, a box per stretch of the layer coloured by
    where its tokens are, an arrow per collective with its shapes and bytes, and the key under both."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch, Patch

    panels = [("forward", forward_boxes(flow)), ("backward", backward_boxes(flow))]
    rows = max(len(b) for _, b in panels)
    box_h, gap = 1.0, 1.1
    left, width = 0.5, 8.1  # the layer's boxes; backward's kept slices sit right of them
    side, side_w = left + width + 0.7, 3.3
    fig, axes = plt.subplots(1, 2, figsize=(15.0, 1.2 + rows * 1.05), squeeze=False)
    for ax, (direction, boxes) in zip(axes[0], panels):
        top = rows * (box_h + gap)
        for i, (kind, text, hop) in enumerate(boxes):
            y = top - i * (box_h + gap)
            patch = FancyBboxPatch(
                (left, y - box_h),
                width,
                box_h,
                boxstyle="round,pad=0.02,rounding_size=0.12",
                facecolor=SEQ_COLOUR if kind == "seq" else TP_COLOUR,
                edgecolor="0.45",
                lw=0.8,
            )
            patch.set_gid(f"{direction} box {i} {kind}")
            ax.add_patch(patch)
            ax.text(left + width / 2, y - box_h / 2, text, ha="center", va="center", fontsize=7.5)
            again = None  # the block's second gather in backward, told beside the box that keeps or uses it
            if hop is not None and (direction, kind, hop.op) in (
                ("forward", "seq", "all_gather"),
                ("backward", "tp", "reduce_scatter"),
            ):
                again = next((h for h in flow.backward if h.again and h.block == hop.block), None)
            if again is not None:
                kept = FancyBboxPatch(
                    (side, y - box_h - 0.05),
                    side_w,
                    box_h + 0.1,
                    boxstyle="round,pad=0.02,rounding_size=0.12",
                    facecolor=KEPT_COLOUR,
                    edgecolor=GATHER,
                    lw=0.8,
                    ls="--",
                )
                kept.set_gid(f"{direction} kept {again.block}")
                ax.add_patch(kept)
                words = kept_text(hop if direction == "forward" else again, direction)
                ax.text(side + side_w / 2, y - box_h / 2, words, ha="center", va="center", fontsize=7)
                ends = [(left + width + 0.03, y - box_h / 2), (side - 0.03, y - box_h / 2)]
                if direction == "forward":  # the slice saved: a grey arrow into the box
                    style = {"arrowstyle": "-|>", "color": "0.45", "lw": 1.1}
                    ends.reverse()
                else:  # gathered again: a dashed all-gather out of it into the block
                    style = {"arrowstyle": "-|>", "color": GATHER, "lw": 1.3, "ls": "--"}
                arrow = ax.annotate("", xy=ends[0], xytext=ends[1], arrowprops=style)
                arrow.set_gid(f"{direction} kept {again.label}")
            if hop is None:
                continue
            colour = GATHER if hop.op == "all_gather" else SCATTER
            arrow = ax.annotate(
                "",
                xy=(2.2, y - box_h - gap + 0.04),
                xytext=(2.2, y - box_h - 0.04),
                arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.8, "mutation_scale": 12},
            )
            arrow.set_gid(f"{direction} {hop.op} {hop.label}")
            ax.text(
                2.55, y - box_h - gap / 2, hop_text(hop, direction), ha="left", va="center", fontsize=8, color=colour
            )
        ax.set_xlim(0, side + side_w + 0.1)
        ax.set_ylim(top - len(boxes) * (box_h + gap) + gap - 0.2, top + 0.2)
        ax.axis("off")
        said = "down the layer" if direction == "forward" else "from the layer's output back to its input"
        ax.set_title(f"{direction}: {said}", fontsize=9.5)
    s, b, h = flow.whole
    handles = [
        Patch(facecolor=SEQ_COLOUR, edgecolor="0.45"),
        Patch(facecolor=TP_COLOUR, edgecolor="0.45"),
        Line2D([], [], color=GATHER, lw=1.8),
        Line2D([], [], color=SCATTER, lw=1.8),
        Patch(facecolor=KEPT_COLOUR, edgecolor=GATHER, ls="--"),
        Line2D([], [], color=GATHER, lw=1.3, ls="--"),
    ]
    labels = [
        f"on a slice of the sequence: {s // flow.t} of the {s} tokens a rank, all h = {h} (norms, dropout, residual)",
        "inside a block: every token, the weights split by columns, then by rows (partial sums)",
        "all-gather along the sequence",
        "reduce-scatter along the sequence (sums the partial outputs)",
        "an input slice a block keeps for backward: this rank's tokens only",
        "backward's second gather of that kept slice",
    ]
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(title, fontsize=11)
    fig.text(
        0.5,
        -0.03,
        "f and g are the post's names for TP alone's pair: f before the column-parallel product (identity forward, "
        "all-reduce backward),\ng after the row-parallel one (all-reduce forward, identity backward). SP runs an "
        "all-gather where they run the identity and a reduce-scatter where they run the all-reduce.",
        ha="center",
        va="top",
        fontsize=8,
        color="0.25",
    )
    fig.text(
        0.5,
        -0.08,
        f"Backward also sums, over the {flow.t} ranks, the gradients of the weights each keeps whole (the norms' "
        f"and the row-parallel biases'): {flow.sums} all-reduces of {h} values, {flow.sum_bytes:,} B sent by "
        "rank 0 in all.",
        ha="center",
        va="top",
        fontsize=8,
        color="0.25",
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    return fig


def plot_sp(lr: Any, path: str) -> None:
    """The sp lesson's picture: its TP + SP run's flow through one layer, forward and backward."""
    flow = sp_flow(lr)
    s, b, h = flow.whole
    fig = draw_sp(
        flow,
        f"Sequence parallelism on {flow.t} TP ranks: one layer, shapes on rank 0 from the run (s = {s}, b = {b}, "
        f"h = {h})",
    )
    save(fig, path)
    pyplot().close(fig)

"""The mesh axes: one entry per axis, everything about it in one place.

An axis is a dimension of the GPU mesh (torchtitan's word; a tensor's dimension is a *dim*). Its entry says
how tables head it, what its size flag is called and says (`parasim trace --tp`, a lesson's `--tp`, Megatron-
LM's `--tensor-model-parallel-size`), which of Megatron-Core's two rank generators builds its groups and what
that generator calls it (MoE parallel folding: expert TP is the expert generator's "tp"), the layout's group
over it alone, what it does to a weight (placements), how its bytes travel (comm/hops.py's patterns) and the
group whose bytes the estimator books under it. The layout's coordinates, the placements, the estimator's
traffic, the app's map, `parasim compare` and every command's size flags read this table.

Adding an axis (HSDP's replicate and shard, say) is its entry here, the Layout field that holds its size and
the rank generator's rule for it (layout/mesh.py), and its tests (docs/architecture.md, "Add a mesh axis").
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("cut", "experts", "data", "stages")


@dataclass(frozen=True)
class Axis:
    """One mesh axis (see the module's docstring)."""

    name: str  # parasim's name: a Layout field, a coordinate, a size flag --<name>
    label: str  # a table's heading (TP)
    what: str  # its size flag's help
    metavar: str  # its size flag's placeholder
    group: str  # the layout's group over this axis alone (Megatron-Core's name: "tp", "expert-tp")
    generator: str  # the rank generator that builds it: "dense" (attention) or "expert" (MoE layers)
    named: str  # the generator's own name for it
    # What it does to a weight (layout/placement.py):
    #   "cut":     a Shard over it cuts the weight's tensor into slices (a checkpoint's piece), and under SP
    #              backward leaves a gradient Partial over it: the groups over these carry partial sums;
    #   "experts": it spreads whole experts over its ranks, each named by its index: no tensor is cut;
    #   "data":    copies see different data over it: data-parallel code sums the gradients there;
    #   "stages":  it holds different layers (pipeline stages): no weight lies over it.
    role: str
    hops: str  # how its bytes travel (comm/hops.CROSSINGS): round a "ring", between all "pairs", along a "chain"
    # the group whose bytes the estimator books under it (DP's gradients go over dp x cp); None: it books none
    # (expert TP: the estimator counts experts whole on a GPU)
    traffic: str | None
    megatron: str | None = None  # Megatron-LM's flag for its size (None: Megatron derives it)
    flag: bool = True  # a command takes its size as --<name> (expert DP is derived from the others)


AXES: dict[str, Axis] = {
    a.name: a
    for a in (
        Axis(
            "tp",
            "TP",
            "tensor-parallel size",
            "T",
            "tp",
            "dense",
            "tp",
            "cut",
            "ring",
            "tp",
            "--tensor-model-parallel-size",
        ),
        Axis(
            "cp",
            "CP",
            "context-parallel size",
            "C",
            "cp",
            "dense",
            "cp",
            "data",
            "ring",
            "cp",
            "--context-parallel-size",
        ),
        Axis(
            "dp", "DP", "data-parallel size", "D", "dp", "dense", "dp", "data", "ring", "dp-cp", "--data-parallel-size"
        ),  # Megatron-LM derives it; `parasim layout` also takes it by this name
        Axis(
            "pp",
            "PP",
            "pipeline stages",
            "P",
            "pp",
            "dense",
            "pp",
            "stages",
            "chain",
            "pp",
            "--pipeline-model-parallel-size",
        ),
        Axis(
            "ep",
            "EP",
            "expert-parallel size",
            "E",
            "ep",
            "expert",
            "ep",
            "experts",
            "pairs",
            "ep",
            "--expert-model-parallel-size",
        ),
        Axis(
            "etp",
            "ETP",
            "expert tensor-parallel size",
            "T",
            "expert-tp",
            "expert",
            "tp",
            "cut",
            "ring",
            None,
            "--expert-tensor-parallel-size",
        ),
        Axis(
            "edp",
            "EDP",
            "expert data-parallel size",
            "D",
            "expert-dp",
            "expert",
            "dp",
            "data",
            "ring",
            "expert-dp",
            flag=False,
        ),
    )
}
SIZED = tuple(name for name, a in AXES.items() if a.flag)  # the axes a command takes a size for: tp ... etp

"""Placements, as torch's DTensor names them, over named mesh axes, and what they decide.

A layer declares, for each of its weights, how the weight lies over the model axes that split it (tp; ep
for experts): `Shard(dim)` (each rank holds one slice), `Replicate()` (every rank holds it whole), or
`Partial()`: the weight is whole on every rank, but backward leaves each rank only a partial sum of its
gradient (under SP each TP rank saw its own tokens). That one declaration, per weight, drives:
  (a) `local`: cutting the whole weight into this rank's piece;
  (b) `sum_axes` / `grad_group`: the axes, and the layout's group, its gradient is summed over: the Partial
      model axes, then the data axes (dp x cp for dense weights, expert-dp for experts, which EP splits);
      layers sum the model axes in their backward (`settle`), data-parallel code sums the data axes;
  (c) `assemble`: the whole tensor back from the pieces of one axis's group (checks, `parasim check`, the
      app); `parse` / `spec` read and write a placement as text ("Shard(1)") for marked tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import UsageError
from . import AXES
from . import GROUP_KINDS, LayoutError


@dataclass(frozen=True)
class Replicate:
    """Every rank of the group holds the whole tensor."""

    def __str__(self) -> str:
        return "replicated"


@dataclass(frozen=True)
class Shard:
    """Each rank holds one slice along `dim`."""

    dim: int

    def __str__(self) -> str:
        return f"sharded on dim {self.dim}"


@dataclass(frozen=True)
class Partial:
    """Each rank holds a partial sum; the true value is the sum over the group."""

    def __str__(self) -> str:
        return "partial sum"


Placement = Replicate | Shard | Partial
Placed = Mapping[str, Placement]  # mesh axis -> placement; an axis not named is Replicate


# The mesh axes a weight can lie over: every axis of the one table (layout/axes.py: its generator, the
# generator's name for it, and what it does to a weight, its `role`) but the pipeline's, which holds layers
WEIGHT_AXES = {name: axis for name, axis in AXES.items() if axis.role != "stages"}
# per generator, ours -> the generator's name
_AXES = {gen: {a: ax.named for a, ax in WEIGHT_AXES.items() if ax.generator == gen} for gen in ("dense", "expert")}
DATA_AXES = tuple(a for a, ax in WEIGHT_AXES.items() if ax.role == "data")  # ("cp", "dp", "edp")
CUT_AXES = tuple(a for a, ax in WEIGHT_AXES.items() if ax.role == "cut")  # ("tp", "etp")


def axis_group(axis: str) -> str:
    """The name of the layout's group over one mesh axis alone: 'tp', 'expert-tp', 'expert-dp', ..."""
    return WEIGHT_AXES[axis].group


def is_expert(placed: Placed) -> bool:
    """Split over EP: an expert's weight, which the expert generator's groups serve."""
    return "ep" in placed


def data_axes(placed: Placed) -> tuple[str, ...]:
    """Where copies of a weight see different data: dp x cp for dense weights, expert-dp for experts."""
    return ("edp",) if is_expert(placed) else ("dp", "cp")


def model_axes(placed: Placed) -> tuple[str, ...]:
    """The model axes of the weight's group generator (tp for dense weights; etp and ep for experts): an
    axis its placement leaves out holds it whole (Replicate)."""
    return tuple(a for a in _AXES["expert" if is_expert(placed) else "dense"] if a not in DATA_AXES)


def sum_axes(placed: Placed) -> tuple[str, ...]:
    """Every axis this weight's gradient is summed over: its Partial model axes, then its data axes."""
    return tuple(a for a, p in placed.items() if isinstance(p, Partial)) + data_axes(placed)


def grad_group(placed: Placed, axes: Sequence[str] | None = None) -> str:
    """The name of the layout's group over `axes` (default: all of `sum_axes`), e.g. 'dp-cp', 'tp-dp-cp',
    'expert-dp'."""
    generator = "expert" if is_expert(placed) else "dense"
    axes = tuple(sum_axes(placed) if axes is None else axes)
    want = {_AXES[generator].get(a) for a in axes}  # an axis the generator lacks matches no group
    for name, gen, over in GROUP_KINDS:
        if gen == generator and set(over) == want:
            return name
    raise LayoutError(f"no {generator} group of the layout spans axes {', '.join(sorted(axes))}")


def local(whole: Any, p: Placement, size: int, index: int, xp: Any) -> Any:
    """(a) Rank `index` of a group of `size`: its piece of `whole` (a copy, so it owns its memory)."""
    if not isinstance(p, Shard) or size == 1:
        return xp.asarray(whole, copy=True)
    if whole.shape[p.dim] % size:
        raise LayoutError(
            f"size {whole.shape[p.dim]} of dim {p.dim} does not divide by the group's {size} ranks: "
            "each rank must hold an equal slice"
        )
    n = whole.shape[p.dim] // size
    cut = [slice(None)] * whole.ndim
    cut[p.dim] = slice(index * n, (index + 1) * n)
    return xp.asarray(whole[tuple(cut)], copy=True)


_SPEC = re.compile(r"^(Replicate|Partial)\(\)$|^Shard\((?:dim=)?(-?\d+)\)$")


def parse(p: "str | Placement") -> Placement:
    """A placement from its written form ("Shard(1)", "Replicate()", "Partial()"), as a program marking a
    tensor gives it (`ctx.mark`); a Placement is returned as it is."""
    if isinstance(p, (Replicate, Shard, Partial)):
        return p
    m = _SPEC.match(p) if isinstance(p, str) else None
    if not m:
        raise UsageError(f"placement must be Shard(d), Replicate() or Partial(), got {p!r}")
    if m.group(2) is not None:
        return Shard(int(m.group(2)))
    return Replicate() if m.group(1) == "Replicate" else Partial()


def spec(p: Placement) -> str:
    """The written form `parse` reads back (what a trace keeps)."""
    return f"Shard({p.dim})" if isinstance(p, Shard) else f"{type(p).__name__}()"


def assemble(pieces: Sequence[Any], p: Placement, xp: Any) -> Any:
    """(c) The whole tensor from the pieces of one group, in group-rank order."""
    if isinstance(p, Shard):
        return xp.concat(list(pieces), axis=p.dim)
    if isinstance(p, Partial):
        total = pieces[0]
        for x in pieces[1:]:
            total = total + x
        return total
    return pieces[0]  # replicated: every piece is the whole


def settle(par: Any, placed: Placed, grad: Any, label: str) -> Any:
    """(b), inside a layer: sum a fresh weight gradient over its Partial model axes (tp; etp for experts), so
    that what the layer keeps is whole there; the data axes are left to data-parallel code."""
    __site_hide__ = True  # noqa: F841 (comm/sites.py: a call site names the layer line that called settle)
    if par.options.partial_sums == "step":  # left partial: data-parallel code sums them once per step
        return grad
    groups = {"tp": par.tp_group, "etp": par.etp_group}  # the model groups a layer holds
    for axis, p in placed.items():
        if isinstance(p, Partial) and axis not in DATA_AXES:
            if axis not in groups:
                raise LayoutError(f"a gradient partial over {axis}: layers sum partial gradients over tp and etp only")
            group = groups[axis]
            if group is not None and group.size > 1:
                grad = par.comm.all_reduce(grad, group=group, label=label)
    return grad

"""Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_) when the gradient lies in pieces.

The norm must be the one a single device would compute over the whole model: every parameter counted
exactly once. On a split run a weight's gradient is spread out in several ways, and each needs its own rule:
  - TP / ETP / EP shards are different parts of the weight: add them;
  - ZeRO shares (after the reduce-scatter) are different parts of the summed gradient: add them;
  - pipeline stages hold different layers: add them;
  - a weight whole on every rank of a model axis (norms, router: Replicate, or Partial already summed) is a
    copy: count it on the axis's first rank only, or it is counted tp times.
Dense weights (summed over dp-cp) and experts (summed over expert-dp) enter one norm: clipping each group by
its own norm would scale them differently from one device. Each rank adds up the squares it alone is
responsible for, and one all-reduce over the world adds those up. None of these mistakes stops training,
which is why they are easy to miss.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..errors import UsageError
from ..layout.placement import DATA_AXES, Placed, Replicate, Shard, grad_group, is_expert, model_axes
from ..engine.context import Context

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing


def counts_here(ctx: Context, placed: Placed) -> bool:
    """Whether this rank counts its piece of a weight's gradient in the global norm: on every model axis the
    weight is not sharded over, only the first rank of that axis's group does (the others hold a copy)."""
    # the model axes of the weight's generator and any non-data axis it names (one table: placement.WEIGHT_AXES);
    # an axis the placement leaves out holds a copy
    axes = set(model_axes(placed)) | {a for a in placed if a not in DATA_AXES}
    for axis in sorted(axes):
        if isinstance(placed.get(axis, Replicate()), Shard):
            continue
        group = ctx.groups.get(grad_group(placed, (axis,)))
        if group is not None and group.group_rank(ctx.rank) != 0:
            return False
    return True


def global_norm(ctx: Context, share_sq: Mapping[str, float], placed: Mapping[str, Placed]) -> tuple[float, dict]:
    """The whole model's gradient norm from `share_sq` (each key's sum of squares of the gradient piece this
    rank holds, e.g. its ZeRO share of the summed gradient), with one all-reduce over the world. Returns
    (norm, {"dense": norm of the dense weights, "expert": norm of the experts}); every rank gets the same."""
    parts = [0.0, 0.0]  # dense, expert: one collective carries both, so the split can be shown
    for key, sq in share_sq.items():
        if counts_here(ctx, placed[key]):
            parts[int(is_expert(placed[key]))] += sq
    total = ctx.comm.all_reduce(
        ctx.asarray(parts),
        label="gradient clipping: add up the squares of the "
        "gradient pieces each rank alone holds (copies counted once)",
    )
    dense, expert = float(total[0]), float(total[1])
    return math.sqrt(dense + expert), {"dense": math.sqrt(dense), "expert": math.sqrt(expert)}


def clip_coefficient(norm: float, max_norm: float, eps: float = EPS) -> float:
    """What every gradient is multiplied by: min(1, max_norm / (norm + eps)), as torch computes it."""
    return min(1.0, max_norm / (norm + eps))


def check_max_norm(max_norm: float | None) -> None:
    """None (no clipping) or a positive number (inf: measure the norm, never clip); one line otherwise."""
    if max_norm is not None and not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise UsageError(f"max_norm must be a positive number (or None: no clipping), got {max_norm!r}")


def clip_shares(
    ctx: Context,
    shares: Mapping[str, Any],
    share_sq: Mapping[str, float],
    placed: Mapping[str, Placed],
    max_norm: float,
) -> tuple[dict[str, Any], float, float]:
    """Scale each optimizer's gradient share (`shares`: group name -> flat share) by the clip coefficient of
    the global norm. Returns (scaled shares, norm, coefficient); rank 0 notes them in the trace."""
    check_max_norm(max_norm)
    norm, parts = global_norm(ctx, share_sq, placed)
    coef = clip_coefficient(norm, max_norm)
    if ctx.rank == 0:  # every rank holds the same numbers: one line is enough
        what = f"every gradient scaled by {coef:.4g}" if coef < 1 else "below max norm: gradients unchanged"
        ctx.note(
            f"global gradient norm {norm:.6g} (dense {parts['dense']:.6g}, experts {parts['expert']:.6g}), "
            f"max norm {max_norm:g}: {what} before Adam",
            grad_norm=norm,
            dense_norm=parts["dense"],
            expert_norm=parts["expert"],
            max_norm=max_norm if math.isfinite(max_norm) else None,
            clip_coef=coef,
        )  # JSON has no infinity
    return {g: s * coef for g, s in shares.items()}, norm, coef

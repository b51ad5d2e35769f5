"""ZeRO-1: Adam whose state is split over the data-parallel group (Rajbhandari et al. 2020).

Every rank of the group holds the same weights and computed gradients on different data. Instead of an
all-reduce, the gradients are reduce-scattered: each rank receives the sum for its 1/n of one flat buffer,
keeps Adam's state (master copy, m, v) for that share only, updates it, and the updated shares are
all-gathered back into every rank's weights. The same bytes as the all-reduce (reduce-scatter +
all-gather), 1/n of the optimizer state per rank.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Group
from ..errors import UsageError
from .clip import check_max_norm, clip_shares
from .flat import FlatBuffer
from ..layout.placement import CUT_AXES, Partial, axis_group, data_axes, grad_group, is_expert
from ..engine.context import Context


def sum_partials(ctx: Context, grads: dict[str, Any], placed: dict[str, dict]) -> dict[str, Any]:
    """Gradients left partial over a model axis (tp; etp), summed there once for the step: one flat
    all-reduce per axis over this rank's group of the layout (what Megatron does for SP-split weights)."""
    xp, out = ctx.xp, dict(grads)
    for axis in CUT_AXES:  # the axes a gradient can be left partial over (placement.WEIGHT_AXES)
        keys = sorted(k for k in grads if isinstance(placed[k].get(axis), Partial))
        if not keys or ctx.groups[axis_group(axis)].size == 1:
            continue
        group = ctx.groups[axis_group(axis)]
        buf = FlatBuffer({k: grads[k] for k in keys})
        flat = ctx.comm.all_reduce(
            ctx.cast(buf.flat(xp, grads), "grad_reduce"),
            group=group,
            label=f"sum the gradients partial over {axis} (SP-split weights), once per step",
        )
        out.update(buf.unflat(xp, flat))
    return out


def zero1_step(
    ctx: Context, model: Any, lr: float, partials: bool = False, max_norm: float | None = None
) -> tuple[dict[str, Any], dict[str, float], dict[str, list[int]]]:
    """One ZeRO-1 Adam step for `model` (anything with params, grads and placements): each gradient is
    reduce-scattered over the data-parallel group its placement names (dp-cp for dense weights, expert-dp
    for experts), one optimizer per group; with `partials`, gradients the layers left partial over a model
    axis are first summed there (`sum_partials`). With `max_norm`, the summed gradients are clipped by their
    global norm over both groups before Adam (`clip.clip_shares`: one more all-reduce, a note on rank 0).
    Returns (new weights, each key's share of the summed gradient's sum of squares, before clipping,
    {"dense"|"expert": [optimizer values kept here, values of the whole state]})."""
    check_max_norm(max_norm)
    params, grads, placed = model.params(), model.grads, model.placements
    left = sorted(k for k in grads if any(isinstance(placed[k].get(a), Partial) for a in CUT_AXES))
    if max_norm is not None and not partials and left:  # a norm of unsummed pieces is no one's norm
        raise UsageError(
            f"clipping needs whole gradients, but {left[0]} is left partial over a model axis: pass partials=True"
        )
    if partials:
        grads = sum_partials(ctx, grads, placed)
    by_group: dict[str, list[str]] = {}
    for k in params:
        by_group.setdefault(grad_group(placed[k], data_axes(placed[k])), []).append(k)
    opts = {
        group: Zero1Adam(ctx, ctx.groups[group], {k: params[k] for k in keys}, lr=lr, name=f"ZeRO-1 over {group}")
        for group, keys in by_group.items()
    }
    new: dict[str, Any] = {}
    share_sq: dict[str, float] = {}
    if max_norm is None:  # each group on its own: reduce-scatter, Adam, all-gather
        for group, opt in opts.items():
            updated, sq = opt.step({k: grads[k] for k in opt.keys})
            new.update(updated)
            share_sq.update(sq)
    else:  # the norm needs every group's summed gradient: all reduce-scatters first, then clip, then Adam
        shares = {group: opt.reduce({k: grads[k] for k in opt.keys}) for group, opt in opts.items()}
        for group, opt in opts.items():
            share_sq.update(opt.share_sq(shares[group]))
        clipped, _, _ = clip_shares(ctx, shares, share_sq, placed, max_norm)
        for group, opt in opts.items():
            new.update(opt.update(clipped[group]))
    state = {
        "expert" if is_expert(placed[opt.keys[0]]) else "dense": [opt.state_elements, 3 * sum(opt.sizes.values())]
        for opt in opts.values()
    }
    return new, share_sq, state


def adam(
    xp: Any, master: Any, m: Any, v: Any, g: Any, t: int, lr: float, betas: tuple[float, float], eps: float
) -> tuple[Any, Any, Any]:
    """One Adam update (Kingma and Ba) of `master` with gradient `g` at step t: (master, m, v) after it."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return master - lr * m_hat / (xp.sqrt(v_hat) + eps), m, v


class Zero1Adam:
    def __init__(
        self,
        ctx: Context,
        group: Group,
        params: dict[str, Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        name: str = "zero-1",
    ) -> None:
        xp = ctx.xp
        self.ctx, self.group, self.lr, self.betas, self.eps, self.name = ctx, group, lr, betas, eps, name
        self.buf = FlatBuffer(params, group.size)
        self.keys, self.sizes, self.padded = self.buf.keys, self.buf.sizes, self.buf.padded
        share = self.padded // group.size
        me = group.group_rank(ctx.rank)
        self.lo, self.hi = me * share, (me + 1) * share
        flat = self._flat(params)
        # this rank's share of the weights, the optimizer's copy (FP32 master weights at real size), and Adam's
        # moments, each in the run's precision
        self.master = ctx.cast(flat[self.lo : self.hi], "master")
        self.m = ctx.cast(xp.zeros_like(self.master), "adam")
        self.v = ctx.cast(xp.zeros_like(self.master), "adam")
        self.t = 0

    def ranges(self, me: int | None = None) -> list[tuple[int, int]]:
        """[lo, hi) of the flat buffer group rank `me` (default: this rank) keeps: one even slice."""
        if me is None:
            return [(self.lo, self.hi)]
        share = self.padded // self.group.size
        return [(me * share, (me + 1) * share)]

    @property
    def state_elements(self) -> int:
        """Optimizer values this rank keeps: master copy, m and v for its share."""
        return 3 * int(self.master.shape[0])

    def _flat(self, tensors: dict[str, Any]) -> Any:
        return self.buf.flat(self.ctx.xp, tensors)

    def step(self, grads: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
        """Sum the gradients over the group (each rank gets its share), update the share with Adam, gather
        the new weights. Returns (new weights, this share's sum of squares of the summed gradient per key)."""
        g = self.reduce(grads)
        return self.update(g), self.share_sq(g)

    def reduce(self, grads: dict[str, Any]) -> Any:
        """This rank's share of the gradients summed over the group (one reduce-scatter of the flat buffer)."""
        return self.ctx.comm.reduce_scatter(
            self.ctx.cast(self._flat(grads), "grad_reduce"),
            group=self.group,
            label=f"{self.name}: reduce-scatter the gradients",
        )

    def update(self, g: Any) -> dict[str, Any]:
        """Adam on this rank's share with its summed (perhaps clipped) gradient `g`, then the new weights
        all-gathered: every key's whole updated weight."""
        xp = self.ctx.xp
        self.t += 1
        self.master, self.m, self.v = adam(xp, self.master, self.m, self.v, g, self.t, self.lr, self.betas, self.eps)
        flat = self.ctx.comm.all_gather(
            self.ctx.cast(self.master, "compute"),
            group=self.group,
            label=f"{self.name}: all-gather the updated weights",
        )
        return self.buf.unflat(xp, flat)

    def share_sq(self, g: Any) -> dict[str, float]:
        """Per key, the sum of squares of the part of the summed gradient this rank's share covers: adding
        them over the group gives each key's whole sum of squares."""
        xp = self.ctx.xp
        out, start = {}, 0
        for k in self.keys:
            lo, hi = max(start, self.lo), min(start + self.sizes[k], self.hi)
            part = g[lo - self.lo : hi - self.lo] if lo < hi else g[:0]
            out[k] = float(xp.sum(part * part))
            start += self.sizes[k]
        return out

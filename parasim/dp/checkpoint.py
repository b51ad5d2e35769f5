"""Sharded checkpoints: save weights and optimizer state after a step, resume on another layout.

Each rank describes what it holds in terms of the whole, unsplit tensors: its TP piece of each weight
(from the placements; the fused QKV weight from the heads it owns) and, for the optimizer, which stretch
of each weight its ZeRO share covers. Only that description is saved, so resuming needs no memory of the
old layout: a rank of the new layout reads the global tensors and cuts what it needs (weights, then the
master copy, m and v of its new share; t is the step).

Virtual ranks share one process: `shard_state` (inside the program) hands back a rank's part and
`save_checkpoint` (outside) writes them, one file per rank (checkpoint_format.py). Real ranks save with
torch.distributed.checkpoint (checkpoint_dcp.py), so torch's own tools read what they write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import UsageError
from ..layout.placement import CUT_AXES, Shard  # model axes that cut a weight; ep does not (experts go by index)
from .checkpoint_format import METADATA, Chunk, CheckpointReader, RankShard, Runs, cut, sweep, write_checkpoint
from ..engine.context import Context

STATE = ("master", "m", "v")  # Adam's state per value: fp32 master copy, first and second moments


@dataclass(frozen=True)
class Region:
    """Where a rank's piece of a weight lies in the whole weight: its shape, and per dim the runs covered."""

    shape: tuple[int, ...]
    index: Runs


# -- where pieces lie -------------------------------------------------------------------------------------
def regions(model: Any) -> dict[str, Region]:
    """Every weight of `model` (the layer protocol): the whole weight's shape and this rank's piece of it.
    A Shard over tp or etp cuts one dim evenly; attention's fused QKV holds whole heads (`_qkv`)."""
    params, placed = model.params(), model.placements
    cuts = _cuts(model)
    out = {}
    for k, x in params.items():
        shape = [int(d) for d in x.shape]
        index: Runs = [[(0, d)] for d in shape]
        for axis, p in placed[k].items():
            n, i = cuts.get(axis, (1, 0))
            if isinstance(p, Shard) and axis in CUT_AXES and n > 1:
                size = shape[p.dim]
                shape[p.dim] = size * n
                index[p.dim] = [(i * size, (i + 1) * size)]
        out[k] = Region(tuple(shape), index)
    for prefix, layer in _layers(model):
        out.update(_qkv(prefix, layer, params))
    return out


def _layers(model: Any) -> list[tuple[str, Any]]:
    """(name prefix, layer) of a Stack's layers, or the model itself."""
    if hasattr(model, "layers"):
        return [(f"{layer.key}.", layer) for layer in model.layers]
    stack = getattr(model, "stack", None)  # a pipeline stage on a Stack
    return _layers(stack) if stack is not None else [("", model)]


def _cuts(model: Any) -> dict[str, tuple[int, int]]:
    """(group size, place in it) over each model axis, from the ParallelContext the layers were built with."""
    for _, layer in _layers(model):
        par = getattr(layer, "par", None)
        if par is not None and hasattr(par, "tp_world_size"):
            return {"tp": (par.tp_world_size, par.tp_rank), "etp": (par.etp_world_size, par.etp_rank)}
    return {}


def _qkv(prefix: str, layer: Any, params: dict[str, Any]) -> dict[str, Region]:
    """The fused QKV weight and bias of a layer's attention. Its columns are Q, K, V, head by head; a TP rank
    holds its q heads and kv heads (a kv head may sit on several ranks), so its piece is three runs of
    columns, not the even slice Shard(1) alone would say."""
    attn = getattr(layer, "attn", None)
    if attn is None or not hasattr(attn, "q_heads"):
        return {}
    d, nq, nkv = attn.d, attn.heads * attn.d, attn.kv_heads * attn.d
    cols = [h * d + j for h in attn.q_heads for j in range(d)]
    cols += [nq + h * d + j for h in attn.kv_local for j in range(d)]
    cols += [nq + nkv + h * d + j for h in attn.kv_local for j in range(d)]
    runs: list[tuple[int, int]] = []
    for c in cols:
        if runs and runs[-1][1] == c:
            runs[-1] = (runs[-1][0], c + 1)
        else:
            runs.append((c, c + 1))
    width, out = nq + 2 * nkv, {}
    weight, bias = f"{prefix}attn.qkv.weight", f"{prefix}attn.qkv.bias"
    if weight in params:
        rows = int(params[weight].shape[0])
        out[weight] = Region((rows, width), [[(0, rows)], runs])
    if bias in params:
        out[bias] = Region((width,), [runs])
    return out


# -- the optimizer's share ---------------------------------------------------------------------------------
def share_ranges(opt: Any, me: int) -> list[tuple[int, int]]:
    """[lo, hi) of the flat buffer that group rank `me`'s optimizer state holds, in the order it holds them
    (the optimizer's own `ranges`: everything for DP, one slice for Zero1Adam, a slice of every bucket for
    bucketed ZeRO-1/2)."""
    if not hasattr(opt, "ranges"):
        raise UsageError(f"checkpoints know ShardedAdam and Zero1Adam, not {type(opt).__name__}")
    return opt.ranges(me)


def _share_map(opt: Any, rank: int) -> list[tuple[str, int, int, int]]:
    """(weight, lo, hi, at): values [lo, hi) of the weight's piece, flat, sit at `at` in the share."""
    buf, starts, s = opt.buf, {}, 0
    for k in buf.keys:
        starts[k], s = s, s + buf.sizes[k]
    out, at = [], 0
    for a, b in share_ranges(opt, opt.group.group_rank(rank)):
        for k in buf.keys:  # the padding past the last weight belongs to none
            lo, hi = max(a, starts[k]), min(b, starts[k] + buf.sizes[k])
            if lo < hi:
                out.append((k, lo - starts[k], hi - starts[k], at + lo - a))
        at += b - a
    return out


def _replica(opt: Any, rank: int) -> bool:
    """Whether what this rank holds whole (the weights; DP's whole state) is a copy group rank 0 writes."""
    return opt.group.group_rank(rank) != 0


def _host(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)


# -- save ----------------------------------------------------------------------------------------------
def shard_state(ctx: Context, model: Any, opt: Any) -> RankShard:
    """This rank's weights and optimizer share, described against the whole tensors; no collectives. Call
    it in the program after step k and hand the result back for `save_checkpoint`."""
    params, placed, where = model.params(), model.placements, regions(model)
    missing = sorted(set(opt.buf.keys) - set(params))
    if missing:
        raise UsageError(f"the optimizer holds {missing[0]}, which the model does not name")
    mine = share_ranges(opt, opt.group.group_rank(ctx.rank))
    width = sum(hi - lo for lo, hi in mine)
    if width != int(opt.master.shape[0]):
        raise UsageError(
            f"the optimizer's share ({int(opt.master.shape[0])} values) is not where checkpoint.py "
            f"places it ({width} values): the two no longer agree"
        )
    shard = RankShard(ctx.rank, int(opt.t), {}, [], _settings(opt))
    for k in sorted(opt.buf.keys):
        x = _host(params[k])
        meta = {
            "shape": list(where[k].shape),
            "dtype": str(x.dtype),
            "placement": {a: repr(p) for a, p in placed[k].items()},
        }
        shard.tensors[f"model/{k}"] = meta
        for s in STATE:
            shard.tensors[f"optim/{s}/{k}"] = {**meta, "dtype": str(_host(getattr(opt, s)).dtype)}
        if not _replica(opt, ctx.rank):
            shard.chunks.append(Chunk(f"model/{k}", where[k].index, (0, x.size), x.reshape(-1)))
    if getattr(opt, "stage", 1) or not _replica(opt, ctx.rank):  # DP's whole state: written once
        state = {s: _host(getattr(opt, s)) for s in STATE}
        for k, lo, hi, at in _share_map(opt, ctx.rank):
            for s in STATE:
                shard.chunks.append(Chunk(f"optim/{s}/{k}", where[k].index, (lo, hi), state[s][at : at + hi - lo]))
    return shard


def _settings(opt: Any) -> dict[str, Any]:
    return {
        "kind": type(opt).__name__,
        "stage": getattr(opt, "stage", 1),
        "group": opt.group.size,
        "lr": opt.lr,
        "betas": list(opt.betas),
        "eps": opt.eps,
        "bucket": getattr(opt, "bucket", None),
    }


def save_checkpoint(path: str | os.PathLike, shards: Sequence[RankShard]) -> str:
    """Write the ranks' parts (`shard_state` of every rank, any order) as one checkpoint, atomically."""
    return str(write_checkpoint(path, shards))


# -- resume --------------------------------------------------------------------------------------------
def restore(ctx: Context, path: str | os.PathLike, model: Any, opt: Any) -> int:
    """Load a checkpoint into `model` and `opt`, built on this run's layout (any layout): this rank's pieces
    of the weights, the master copy, m and v of its share, and the step. Returns the step. Rank 0 first
    removes what saves killed part way left beside the checkpoint (`checkpoint_format.sweep`)."""
    if ctx.rank == 0:
        sweep(Path(path), METADATA)
    reader = CheckpointReader(path)
    params, where = model.params(), regions(model)
    new, state = {}, {s: {} for s in STATE}
    for k in opt.buf.keys:
        shape = where[k].shape
        new[k] = _to(ctx, cut(reader.tensor(f"model/{k}", shape), where[k].index), params[k])
        for s in STATE:
            state[s][k] = _to(ctx, cut(reader.tensor(f"optim/{s}/{k}", shape), where[k].index), getattr(opt, s))
    model.load(new)
    xp = ctx.xp
    for s in STATE:
        flat = opt._flat(state[s])
        setattr(opt, s, xp.concat([flat[a:b] for a, b in share_ranges(opt, opt.group.group_rank(ctx.rank))]))
    if hasattr(opt, "weights"):
        opt.weights = opt._flat(new)
    if hasattr(opt, "grad"):
        opt.grad = None
    opt.t = reader.step
    return reader.step


def _to(ctx: Context, piece: np.ndarray, like: Any) -> Any:
    """A numpy piece as an array of this backend, in the dtype of what it replaces."""
    dtype = str(like.dtype).removeprefix("torch.")
    return ctx.asarray(piece, dtype=dtype)


def verify_checkpoint(path: str | os.PathLike) -> dict[str, int]:
    """Check a checkpoint whole (metadata, every shard's size and checksum, every tensor covered) without
    loading it into a model: {"step", "tensors", "files"}. Refuses a damaged one as `restore` would."""
    reader = CheckpointReader(path)
    for name in reader.meta["files"]:
        reader.shard(name)
    for name in reader.tensors:
        reader.tensor(name)
    return {"step": reader.step, "tensors": len(reader.tensors), "files": len(reader.meta["files"])}

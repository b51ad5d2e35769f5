"""Checkpoints on real ranks, written by torch.distributed.checkpoint (DCP), so torch's own tools
(`dcp.load`, `format_utils.dcp_to_torch_save`) read them.

The state dict DCP sees: `model.<name>` for each weight (a plain tensor: every rank of the group holds it
whole, DCP writes it once), `optim.master`, `optim.m` and `optim.v` over the whole flat buffer, unpadded
(a DTensor on a 1-D mesh of the group, Shard(0): rank i holds the i-th even slice), and `step`. A ZeRO
share laid over several buckets is not one slice, so it is first gathered and cut that way. Resuming,
each rank reads the whole flat state and keeps its new share, as the virtual format does.

Beside DCP's files, `parasim.json` lists every file's size and SHA-256: a damaged checkpoint is refused
before DCP reads it. Atomic as on virtual ranks: DCP writes into a temporary directory that rank 0 then
renames over the target. This path covers data parallelism over the whole world, with weights whole on
every rank; TP-split weights go through the virtual format.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .checkpoint import STATE, regions, share_ranges
from .checkpoint_format import check_file, fingerprint, fsync_dir, swap, write_synced

LISTING, KIND = "parasim.json", "parasim-dcp"


def _check_scope(ctx: Any, model: Any, opt: Any) -> None:
    if tuple(opt.group.ranks) != tuple(range(ctx.world)):
        raise UsageError("DCP checkpoints here need the optimizer's group to be every rank of the run")
    params, where = model.params(), regions(model)
    for k in opt.buf.keys:
        if where[k].shape != tuple(params[k].shape):
            raise UsageError(f"{k} is split over a model axis: save it with shard_state and save_checkpoint")


def _flat_state(ctx: Any, opt: Any, name: str) -> Any:
    """The whole flat buffer of one optimizer state, unpadded, from the group's shares (one all-gather)."""
    xp, n, share = ctx.xp, opt.group.size, getattr(opt, name)
    if not getattr(opt, "stage", 1):
        return share[:opt.buf.total]
    every = ctx.comm.all_gather(share, group=opt.group, label=f"checkpoint: gather optimizer {name} to lay it flat")
    width, pieces = int(share.shape[0]), {}
    for me in range(n):
        at = me * width
        for a, b in share_ranges(opt, me):
            pieces[a], at = every[at:at + b - a], at + b - a
    return xp.concat([pieces[a] for a in sorted(pieces)])[:opt.buf.total]


def _contiguous(opt: Any) -> bool:
    """Whether each rank's share is the rank-th even slice of the buffer (no buckets to interleave)."""
    n = opt.group.size
    return all(share_ranges(opt, me) == [(me * opt.buf.padded // n, (me + 1) * opt.buf.padded // n)]
               for me in range(n))


def save_dcp(ctx: Any, path: str | os.PathLike, model: Any, opt: Any) -> None:
    """Every rank calls this after the same step: DCP writes the weights and the optimizer's state."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    _check_scope(ctx, model, opt)
    target = Path(path)
    params, total, n = model.params(), opt.buf.total, opt.group.size
    me = opt.group.group_rank(ctx.rank)
    state: dict[str, Any] = {f"model.{k}": params[k].detach().clone() for k in opt.buf.keys}
    if not getattr(opt, "stage", 1):  # DP: the whole state on every rank, plain tensors like the weights
        state.update({f"optim.{s}": getattr(opt, s)[:total].clone() for s in STATE})
    else:
        mesh = DeviceMesh("cpu", list(opt.group.ranks))
        c = -(-total // n)  # torch's even split: ceil(total / n) each, the last ones shorter
        for s in STATE:
            flat = getattr(opt, s)[:c] if _contiguous(opt) else _flat_state(ctx, opt, s)[me * c:(me + 1) * c]
            local = flat[:max(0, min(c, total - me * c))].clone()
            state[f"optim.{s}"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                     shape=torch.Size([total]), stride=(1,))
    state["step"] = int(opt.t)
    box = [None]
    if ctx.rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        box[0] = tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    failed = None
    try:
        dcp.save(state, checkpoint_id=str(tmp))
    except Exception as exc:  # every rank must reach the next call, or the others wait on it forever
        failed = f"rank {ctx.rank}: {_line(exc)}"
    every: list[Any] = [None] * ctx.world
    dist.all_gather_object(every, failed)  # rank 0 commits only if no rank failed
    failed = next((f for f in every if f), None)
    word = [failed]
    if ctx.rank == 0:
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)
        word = [failed or _commit(tmp, target, opt)]
    dist.broadcast_object_list(word, src=0)
    if word[0]:
        raise UsageError(f"checkpoint {target} was not saved: {word[0]}")


def _line(exc: BaseException) -> str:
    """An exception in one line (DCP's own errors list every rank's traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _commit(tmp: Path, target: Path, opt: Any) -> str | None:
    """On rank 0 once DCP is done: list every file, fsync, and put the directory at `target`. Returns what
    went wrong, or None."""
    try:
        if target.exists() and not (target / LISTING).is_file():
            raise UsageError(f"{target} exists and is not a parasim DCP checkpoint; it is not replaced")
        files = {p.name: fingerprint(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        meta = {"format": KIND, "version": 1, "step": int(opt.t), "total": opt.buf.total,
                "keys": list(opt.buf.keys), "files": files}
        write_synced(tmp / LISTING, json.dumps(meta, indent=1).encode())
        fsync_dir(tmp)
        swap(tmp, target)
        return None
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return _line(exc)


def verify_dcp(path: str | os.PathLike) -> dict[str, Any]:
    """The listing of a DCP checkpoint, once every file it names has its size and checksum."""
    root = Path(path)
    try:
        meta = json.loads((root / LISTING).read_text())
        if meta.get("format") != KIND:
            raise ValueError(f"not format {KIND}")
        files = meta["files"]
    except FileNotFoundError:
        raise UsageError(f"checkpoint {root}: {LISTING} is missing") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"checkpoint {root}: {LISTING} is unreadable: {exc}") from None
    for name, want in files.items():
        check_file(root, name, want, LISTING)
    return meta


def restore_dcp(ctx: Any, path: str | os.PathLike, model: Any, opt: Any) -> int:
    """Every rank calls this with `model` and `opt` built on the new layout: DCP reads the whole state,
    each rank keeps its weights and its new share. Returns the step."""
    import torch
    import torch.distributed.checkpoint as dcp

    _check_scope(ctx, model, opt)
    meta = verify_dcp(path)
    params, total = model.params(), opt.buf.total
    if sorted(meta["keys"]) != sorted(opt.buf.keys) or meta["total"] != total:
        raise UsageError(f"checkpoint {path}: {LISTING} names other weights ({meta['total']} values) than "
                         f"the model here ({total})")
    like = getattr(opt, STATE[0])
    state: dict[str, Any] = {f"model.{k}": torch.empty_like(params[k]) for k in opt.buf.keys}
    state.update({f"optim.{s}": torch.empty(total, dtype=like.dtype) for s in STATE})
    state["step"] = 0
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:
        raise UsageError(f"checkpoint {path}: DCP could not read it: {_line(exc)}") from None
    new = {k: state[f"model.{k}"] for k in opt.buf.keys}
    model.load(new)
    pad = torch.zeros(opt.buf.padded - total, dtype=like.dtype)
    me = opt.group.group_rank(ctx.rank)
    for s in STATE:
        flat = torch.cat([state[f"optim.{s}"], pad])
        setattr(opt, s, torch.cat([flat[a:b] for a, b in share_ranges(opt, me)]))
    if hasattr(opt, "weights"):
        opt.weights = opt._flat(new)
    if hasattr(opt, "grad"):
        opt.grad = None
    opt.t = int(state["step"])
    return opt.t

"""Checkpoints on real ranks, written by torch.distributed.checkpoint (DCP), so torch's own tools
(`dcp.load`, `format_utils.dcp_to_torch_save`) read them.

The state dict DCP sees: `model.<name>` for each weight (a plain tensor: every rank of the group holds it
whole, DCP writes it once), `optim.master`, `optim.m` and `optim.v` over the whole flat buffer, unpadded
(a DTensor on a 1-D mesh of the group, Shard(0): rank i holds the i-th even slice), and `step`. A ZeRO
share laid over several buckets is not one slice, so it is first gathered and cut that way. Resuming,
each rank reads the whole flat state and keeps its new share, as the virtual format does.

Beside DCP's files, `parasim.json` lists every file's size and SHA-256: a damaged checkpoint is refused
before DCP reads it. Its fields are checked as the virtual format's are (strict JSON, every field's type
and range, plain file names), and DCP's own `.metadata`, a pickle, is first read by an unpickler that
builds only DCP's metadata classes (a pickle can name any function to call), its storage references held
against the listed files' sizes and its shapes against the model's, before `dcp.load` reads it. Atomic
as on virtual ranks: DCP writes into a temporary directory (locked by rank 0 while the ranks write, so
another save's sweep leaves it alone) that rank 0 then renames over the target. This path covers data
parallelism over the whole world, with weights whole on every rank; TP-split weights go through the
virtual format.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..limits import MAX_SIZE
from ..jsonout import dumps
from .checkpoint import STATE, regions, share_ranges
from .checkpoint_format import fresh_beside, fsync_dir, swap, sweep, write_synced
from .checkpoint_meta import DTYPES, Fields, check_file, fingerprint, item, read_listing, show
from ..engine.context import Context

LISTING, KIND, DCP_METADATA = "parasim.json", "parasim-dcp", ".metadata"
_DCP = "torch.distributed.checkpoint.metadata"
# What DCP's .metadata pickles (torch 2.x): its metadata dataclasses, shapes, dtypes, a layout and a path.
# Nothing else is built while reading it.
PICKLED = frozenset(
    {
        (_DCP, n)
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("collections", "OrderedDict"),
    }
    | {("torch", d) for d in (*DTYPES, "int64")}
)


def _check_scope(ctx: Context, model: Any, opt: Any) -> None:
    if tuple(opt.group.ranks) != tuple(range(ctx.world)):
        raise UsageError("DCP checkpoints here need the optimizer's group to be every rank of the run")
    params, where = model.params(), regions(model)
    for k in opt.buf.keys:
        if where[k].shape != tuple(params[k].shape):
            raise UsageError(f"{k} is split over a model axis: save it with shard_state and save_checkpoint")


def _flat_state(ctx: Context, opt: Any, name: str) -> Any:
    """The whole flat buffer of one optimizer state, unpadded, from the group's shares (one all-gather)."""
    xp, n, share = ctx.xp, opt.group.size, getattr(opt, name)
    if not getattr(opt, "stage", 1):
        return share[: opt.buf.total]
    every = ctx.comm.all_gather(share, group=opt.group, label=f"checkpoint: gather optimizer {name} to lay it flat")
    width, pieces = int(share.shape[0]), {}
    for me in range(n):
        at = me * width
        for a, b in share_ranges(opt, me):
            pieces[a], at = every[at : at + b - a], at + b - a
    return xp.concat([pieces[a] for a in sorted(pieces)])[: opt.buf.total]


def _contiguous(opt: Any) -> bool:
    """Whether each rank's share is the rank-th even slice of the buffer (no buckets to interleave)."""
    n = opt.group.size
    return all(share_ranges(opt, me) == [(me * opt.buf.padded // n, (me + 1) * opt.buf.padded // n)] for me in range(n))


def save_dcp(ctx: Context, path: str | os.PathLike, model: Any, opt: Any) -> None:
    # pragma: no mutate block
    # (real ranks only: DCP runs in torch.distributed processes a mutation tester cannot switch; the
    # gloo tests of tests/unit/dp/test_checkpoint.py check it, as they check comm/torchdist.py)
    """Every rank calls this after the same step: DCP writes the weights and the optimizer's state."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    _check_scope(ctx, model, opt)
    target = Path(path)
    step = opt.t
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_SIZE:
        raise UsageError(f"checkpoint {target}: the step must be a whole number from 0, got {step!r}")
    params, total, n = model.params(), opt.buf.total, opt.group.size
    me = opt.group.group_rank(ctx.rank)
    state: dict[str, Any] = {f"model.{k}": params[k].detach().clone() for k in opt.buf.keys}
    if not getattr(opt, "stage", 1):  # DP: the whole state on every rank, plain tensors like the weights
        state.update({f"optim.{s}": getattr(opt, s)[:total].clone() for s in STATE})
    else:
        mesh = DeviceMesh("cpu", list(opt.group.ranks))
        c = -(-total // n)  # torch's even split: ceil(total / n) each, the last ones shorter
        for s in STATE:
            flat = getattr(opt, s)[:c] if _contiguous(opt) else _flat_state(ctx, opt, s)[me * c : (me + 1) * c]
            local = flat[: max(0, min(c, total - me * c))].clone()
            state[f"optim.{s}"] = DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=torch.Size([total]), stride=(1,)
            )
    state["step"] = step
    box: list[Any] = [None, None]  # the temporary directory, or why rank 0 could not make one
    tmp, fd = None, None
    try:
        if ctx.rank == 0:
            try:
                sweep(target, LISTING)
                tmp, fd = fresh_beside(target, "tmp")
                box[0] = str(tmp)
            except OSError as exc:  # said to every rank, which would otherwise wait for the directory
                box[1] = f"rank 0: {_line(exc)}"
        dist.broadcast_object_list(box, src=0)
        if box[1]:
            raise UsageError(f"checkpoint {target} was not saved: {box[1]}")
        failed = None
        try:
            dcp.save(state, checkpoint_id=box[0])
        except Exception as exc:  # every rank must reach the next call, or the others wait on it forever
            failed = f"rank {ctx.rank}: {_line(exc)}"
        every: list[Any] = [None] * ctx.world
        dist.all_gather_object(every, failed)  # rank 0 commits only if no rank failed
        failed = next((f for f in every if f), None)
        word = [failed]
        if ctx.rank == 0:
            word = [failed or commit_dcp(Path(box[0]), target, opt)]
        dist.broadcast_object_list(word, src=0)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # a no-op once committed: it is then at `target`
        if fd is not None:
            os.close(fd)
    if word[0]:
        raise UsageError(f"checkpoint {target} was not saved: {word[0]}")


def _line(exc: BaseException) -> str:
    """An exception in one line (DCP's own errors list every rank's traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def commit_dcp(tmp: Path, target: Path, opt: Any) -> str | None:
    """On rank 0 once DCP is done: list every file, fsync, and put the directory at `target`. Returns what
    went wrong, or None."""
    try:
        if target.exists() and not (target / LISTING).is_file():
            raise UsageError(f"{target} exists and is not a parasim DCP checkpoint; it is not replaced")
        files = {p.name: fingerprint(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        meta = {
            "format": KIND,
            "version": 1,
            "step": int(opt.t),
            "total": opt.buf.total,
            "keys": list(opt.buf.keys),
            "files": files,
        }
        write_synced(tmp / LISTING, dumps(meta, where=f"checkpoint {target}'s listing").encode())
        fsync_dir(tmp)
        swap(tmp, target)
        sweep(target, LISTING)  # a previous copy an interrupted save left aside, now that `target` is whole
        return None
    except Exception as exc:
        return _line(exc)


def _listing(root: Path) -> tuple[Fields, dict[str, Any]]:
    """parasim.json, every field checked before use."""
    f = Fields(root, LISTING)
    where = root / LISTING
    if not where.exists():
        raise UsageError(f"checkpoint {root}: {LISTING} is missing")
    meta = f.obj(read_listing(where, f), "the top level")
    f.one_of(f.get(meta, "format", ""), "format", [KIND])
    f.one_of(f.get(meta, "version", ""), "version", [1])
    f.whole(f.get(meta, "step", ""), "step")
    f.whole(f.get(meta, "total", ""), "total")
    keys = f.list(f.get(meta, "keys", ""), "keys")
    for i, k in enumerate(keys):
        f.name(k, item("keys", i))
    if len(set(keys)) != len(keys):
        raise f.fail("keys", "names a weight twice")
    files = f.sizes(f.get(meta, "files", ""))
    if DCP_METADATA not in files:
        raise f.fail("files", f"does not list {DCP_METADATA}, the file DCP reads first")
    return f, meta


class _Unpickler(pickle.Unpickler):
    """Builds only what DCP's metadata is made of (PICKLED); any other name in the pickle is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in PICKLED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP's metadata never holds")
        return super().find_class(module, name)


def _dcp_metadata(root: Path, files: dict[str, Any]) -> Any:
    """DCP's .metadata (checksummed already), unpickled safely; each storage reference names a listed file
    and lies inside it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    where = DCP_METADATA
    try:
        md = _Unpickler(io.BytesIO((root / DCP_METADATA).read_bytes())).load()
    except Exception as exc:  # a pickle can fail in any way: each is one line
        raise UsageError(f"checkpoint {root}: {where} cannot be read safely: {_line(exc)}") from None
    if (
        not isinstance(md, Metadata)
        or not isinstance(md.storage_data, dict)
        or not isinstance(md.state_dict_metadata, dict)
    ):
        raise UsageError(f"checkpoint {root}: {where} is not DCP's metadata")
    for info in md.storage_data.values():
        if not isinstance(info, _StorageInfo) or not isinstance(info.relative_path, str):
            raise UsageError(
                f"checkpoint {root}: {where} has a storage entry that is not DCP's ({type(info).__name__})"
            )
        name = info.relative_path
        if name not in files or name == DCP_METADATA:
            raise UsageError(
                f"checkpoint {root}: {where} reads from {show(name)}, which {LISTING} does not list as a data file"
            )
        lo, n = info.offset, info.length
        if (
            any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in (lo, n))
            or lo + n > files[name]["bytes"]
        ):
            raise UsageError(
                f"checkpoint {root}: {where} reads {show(n)} bytes at {show(lo)} of {name}, which "
                f"has {files[name]['bytes']:,}"
            )
    return md


def verify_dcp(path: str | os.PathLike) -> dict[str, Any]:
    """The listing of a DCP checkpoint, once every file it names has its size and checksum and DCP's own
    metadata reads safely and points inside those files."""
    return verified_dcp(Path(path))[0]


def verified_dcp(root: Path) -> tuple[dict[str, Any], Any]:
    f, meta = _listing(root)
    for name, want in meta["files"].items():
        check_file(f, root, name, want)
    return meta, _dcp_metadata(root, meta["files"])


def check_dcp_shapes(root: Path, md: Any, want: dict[str, tuple[int, ...]]) -> None:
    """Each tensor DCP will load is there, with the shape this run needs."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for key, shape in want.items():
        got = md.state_dict_metadata.get(key)
        size = tuple(got.size) if isinstance(got, TensorStorageMetadata) else None
        if size != shape:
            have = "no tensor" if size is None else f"the shape {size}"
            raise UsageError(f"checkpoint {root}: {DCP_METADATA} gives {key} {have}, the model here needs {shape}")


def restore_dcp(ctx: Context, path: str | os.PathLike, model: Any, opt: Any) -> int:
    # pragma: no mutate block
    # (real ranks only, see save_dcp)
    """Every rank calls this with `model` and `opt` built on the new layout: DCP reads the whole state,
    each rank keeps its weights and its new share. Returns the step. Rank 0 first removes what saves
    killed part way left beside the checkpoint."""
    import torch
    import torch.distributed.checkpoint as dcp

    _check_scope(ctx, model, opt)
    root = Path(path)
    if ctx.rank == 0:
        sweep(root, LISTING)
    meta, md = verified_dcp(root)
    params, total = model.params(), opt.buf.total
    if sorted(meta["keys"]) != sorted(opt.buf.keys) or meta["total"] != total:
        raise UsageError(
            f"checkpoint {path}: {LISTING} names other weights ({meta['total']} values) than the model here ({total})"
        )
    check_dcp_shapes(
        root,
        md,
        {**{f"model.{k}": tuple(params[k].shape) for k in opt.buf.keys}, **{f"optim.{s}": (total,) for s in STATE}},
    )
    like = getattr(opt, STATE[0])
    state: dict[str, Any] = {f"model.{k}": torch.empty_like(params[k]) for k in opt.buf.keys}
    state.update({f"optim.{s}": torch.empty(total, dtype=like.dtype) for s in STATE})
    state["step"] = -1  # DCP puts the saved step here; a step left at -1 was not in the checkpoint
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:
        raise UsageError(f"checkpoint {path}: DCP could not read it: {_line(exc)}") from None
    if state["step"] != meta["step"] or isinstance(state["step"], bool):
        raise UsageError(f"checkpoint {path}: DCP holds step {show(state['step'])}, {LISTING} says {meta['step']}")
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
    opt.t = meta["step"]
    return opt.t

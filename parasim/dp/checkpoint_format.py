"""The on-disk form of a checkpoint saved from virtual ranks, apart from what a rank's state means.

A checkpoint is a directory: `metadata.json` plus one `rank<r>.npz` per rank. The metadata names every
global tensor (shape, dtype, placement) and each chunk of it a rank wrote: which file and array hold it,
the rows, columns, ... of the whole tensor the rank's piece covers (`index`: per dim, [lo, hi) runs, so a
fused QKV piece made of whole heads is one chunk), and which stretch of that piece, flattened, the chunk is
(`flat`: a ZeRO shard is a flat slice). Each file's byte size and SHA-256 are kept, so a missing,
truncated or altered shard is refused before it is read.

Saving is atomic: everything is written and fsynced in a temporary directory beside the target, which
then takes the target's name; a save that dies leaves the previous checkpoint as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import UsageError

FORMAT, VERSION, METADATA = "parasim-checkpoint", 1, "metadata.json"
Runs = list[list[tuple[int, int]]]  # per dim of the whole tensor, the [lo, hi) runs a piece covers


@dataclass
class Chunk:
    """Values of one global tensor held by a rank: elements [flat) of the piece `index` cuts, flattened."""

    tensor: str
    index: Runs
    flat: tuple[int, int]
    data: np.ndarray


@dataclass
class RankShard:
    """What one rank hands the writer: its chunks, and what every tensor is (the same on every rank)."""

    rank: int
    step: int
    tensors: dict[str, dict[str, Any]]  # name -> {"shape", "dtype", "placement"}
    chunks: list[Chunk] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # the optimizer's settings, for people reading it


def shard_file(rank: int) -> str:
    return f"rank{rank}.npz"


# -- writing --------------------------------------------------------------------------------------------
def write_checkpoint(path: str | os.PathLike, shards: Sequence[RankShard]) -> Path:
    """Write one file per rank and the metadata into a fresh directory beside `path`, fsync it all, then
    put it at `path` (replacing an older checkpoint there). Returns `path`."""
    target = Path(path)
    if target.exists() and not (target / METADATA).is_file() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} exists and is not a parasim checkpoint; it is not replaced")
    meta = _metadata(shards)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for shard in sorted(shards, key=lambda s: s.rank):
            name = shard_file(shard.rank)
            _write_shard(tmp / name, {f"c{i}": np.ascontiguousarray(c.data) for i, c in enumerate(shard.chunks)})
            meta["files"][name] = {"rank": shard.rank, **fingerprint(tmp / name)}
        write_synced(tmp / METADATA, json.dumps(meta, indent=1).encode())
        fsync_dir(tmp)
        swap(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _metadata(shards: Sequence[RankShard]) -> dict[str, Any]:
    if not shards:
        raise UsageError("a checkpoint needs the state of at least one rank")
    steps = {s.step for s in shards}
    if len(steps) != 1:
        raise UsageError(f"ranks were at different steps {sorted(steps)}: save them after the same step")
    tensors: dict[str, dict[str, Any]] = {}
    for s in shards:
        for name, t in s.tensors.items():
            known = tensors.setdefault(name, {**t, "chunks": []})
            if known["shape"] != t["shape"] or known["dtype"] != t["dtype"]:
                raise UsageError(f"ranks disagree on tensor {name}: {known['shape']} {known['dtype']} on one, "
                                 f"{t['shape']} {t['dtype']} on rank {s.rank}")
        for i, c in enumerate(s.chunks):
            tensors[c.tensor]["chunks"].append({"file": shard_file(s.rank), "array": f"c{i}",
                                                "index": c.index, "flat": list(c.flat)})
    return {"format": FORMAT, "version": VERSION, "step": shards[0].step, "world": len(shards),
            "optimizer": shards[0].info, "tensors": tensors, "files": {}}


def _write_shard(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())


def write_synced(path: Path, data: bytes) -> None:
    """Write and fsync: the rename that publishes a checkpoint must not reach the disk before its bytes."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap(tmp: Path, target: Path) -> None:
    """Put `tmp` at `target`. Two renames when an old checkpoint is there (POSIX cannot rename a directory
    over a full one); between them the old one waits under a hidden name, and `CheckpointReader` reads it
    from there if a crash left no checkpoint at `target`."""
    if not target.exists():
        os.rename(tmp, target)
        fsync_dir(target.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / "ckpt")
    os.rename(tmp, target)
    fsync_dir(target.parent)  # the new one is in place on disk before the old one goes
    shutil.rmtree(old, ignore_errors=True)


# -- reading --------------------------------------------------------------------------------------------
class CheckpointReader:
    """A checkpoint directory, checked: its metadata on opening, each shard file before its first use."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        left = sorted(self.path.parent.glob(f".{self.path.name}.old-*/ckpt"))
        if not self.path.exists() and left:  # a save died between its two renames: the previous one is whole
            self.path = left[-1]
        self.meta = self._read_metadata()
        self._files: dict[str, Any] = {}  # shard files already verified and opened

    def _fail(self, what: str) -> UsageError:
        return UsageError(f"checkpoint {self.path}: {what}")

    def _read_metadata(self) -> dict[str, Any]:
        where = self.path / METADATA
        if not where.is_file():
            left = sorted(self.path.parent.glob(f".{self.path.name}.old-*/ckpt"))
            hint = f" (an interrupted save left the previous one at {left[-1]})" if left else ""
            raise self._fail(f"{METADATA} is missing{hint}")
        try:
            meta = json.loads(where.read_text())
            if meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(f"not format {FORMAT} version {VERSION}")
            self.step = int(meta["step"])
            for name, t in meta["tensors"].items():
                self._check_tensor(meta, name, t)
        except UsageError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._fail(f"{METADATA} is unreadable: {type(exc).__name__}: {exc}") from None
        return meta

    def _check_tensor(self, meta: dict[str, Any], name: str, t: dict[str, Any]) -> None:
        shape = tuple(int(d) for d in t["shape"])
        np.dtype(t["dtype"])
        for c in t["chunks"]:
            if c["file"] not in meta["files"]:
                raise self._fail(f"{METADATA} names shard {c['file']} for {name} but lists no such file")
            if len(c["index"]) != len(shape) or any(not 0 <= lo <= hi <= d for runs, d in zip(c["index"], shape)
                                                    for lo, hi in runs):
                raise self._fail(f"{METADATA}: a chunk of {name} in {c['file']} lies outside its shape {shape}")
            lo, hi = c["flat"]
            if not 0 <= lo <= hi <= _box_size(c["index"]):
                raise self._fail(f"{METADATA}: a chunk of {name} in {c['file']} is longer than its piece")

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        return self.meta["tensors"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._entry(name)["shape"])

    def _entry(self, name: str) -> dict[str, Any]:
        if name not in self.tensors:
            raise self._fail(f"it holds no tensor {name}")
        return self.tensors[name]

    def shard(self, name: str) -> Any:
        """A shard file, once its size and checksum match the metadata's."""
        if name not in self._files:
            where = self.path / name
            check_file(self.path, name, self.meta["files"][name], METADATA)
            try:
                self._files[name] = dict(np.load(where, allow_pickle=False))
            except (OSError, ValueError, zipfile.BadZipFile) as exc:
                raise self._fail(f"shard {name} cannot be read: {exc}") from None
        return self._files[name]

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The whole tensor `name`, from every chunk that holds part of it; `shape`: what the caller needs
        (a checkpoint of another shape is refused)."""
        t = self._entry(name)
        have = self.shape(name)
        if shape is not None and tuple(shape) != have:
            raise self._fail(f"{METADATA} gives {name} the shape {have}, the model here needs {tuple(shape)}")
        out = np.zeros(int(np.prod(have)), dtype=np.dtype(t["dtype"]))
        seen = np.zeros(out.shape, dtype=bool)
        for c in t["chunks"]:
            data = self.shard(c["file"]).get(c["array"])
            lo, hi = c["flat"]
            if data is None or data.shape != (hi - lo,):
                raise self._fail(f"shard {c['file']} does not hold the {hi - lo} values of {name} "
                                 f"{METADATA} places there")
            where = flat_positions(c["index"], have)[lo:hi]
            out[where], seen[where] = data, True
        if not seen.all():
            raise self._fail(f"its shards cover {int(seen.sum())} of the {seen.size} values of {name}")
        return out.reshape(have)


def check_file(root: Path, name: str, want: dict[str, Any], listing: str) -> None:
    """Refuse, in one line naming it, a file of checkpoint `root` that is gone or whose size or SHA-256
    differs from what `listing` (the file that recorded them) says."""
    where = root / name
    if not where.is_file():
        raise UsageError(f"checkpoint {root}: shard {name} is missing")
    size = where.stat().st_size
    if size != want["bytes"]:
        word = "truncated" if size < want["bytes"] else "longer than saved"
        raise UsageError(f"checkpoint {root}: shard {name} is {word}: {size} bytes, {listing} says {want['bytes']}")
    if hashlib.sha256(where.read_bytes()).hexdigest() != want["sha256"]:
        raise UsageError(f"checkpoint {root}: shard {name} is corrupt: its SHA-256 differs from {listing}'s")


def fingerprint(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256, as the listing of a checkpoint keeps them."""
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _box_size(index: Runs) -> int:
    return int(np.prod([sum(hi - lo for lo, hi in runs) for runs in index]))


def flat_positions(index: Runs, shape: Sequence[int]) -> np.ndarray:
    """Where each element of the piece `index` cuts (flattened in C order) lies in the whole tensor, flat."""
    axes = [np.concatenate([np.arange(lo, hi) for lo, hi in runs] or [np.zeros(0, int)]) for runs in index]
    if not axes:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(np.ix_(*axes), tuple(shape)).reshape(-1)


def cut(whole: np.ndarray, index: Runs) -> np.ndarray:
    """The piece of `whole` that `index` names (its runs joined along each dim)."""
    axes = [np.concatenate([np.arange(lo, hi) for lo, hi in runs]) for runs in index]
    return whole[np.ix_(*axes)] if axes else whole.copy()

"""The on-disk form of a checkpoint saved from virtual ranks, apart from what a rank's state means.

A checkpoint is a directory: `metadata.json` plus one `rank<r>.npz` per rank. The metadata names every
global tensor (shape, dtype, placement) and each chunk of it a rank wrote: which file and array hold it,
the rows, columns, ... of the whole tensor the rank's piece covers (`index`: per dim, [lo, hi) runs, so a
fused QKV piece made of whole heads is one chunk), and which stretch of that piece, flattened, the chunk is
(`flat`: a ZeRO shard is a flat slice). Each file's byte size and SHA-256 are kept, so a missing,
truncated or altered shard is refused before it is read.

Reading trusts nothing in the folder: metadata.json is strict JSON of bounded size, and every field is
checked for its type and range before it is used (`_validate`); the values its chunks place in a file
must fit in the bytes that file has, and each array's own header must state the length and dtype the
metadata gives it, so nothing is allocated past what is on disk.

Saving is atomic: everything is written and fsynced in a temporary directory beside the target, which
then takes the target's name; a save that dies leaves the previous checkpoint as it was. A temporary is
named `.NAME.tmp-PID-XXXXXXXX` and locked (flock) by the process writing it for as long as it writes, so
the next save or resume into NAME removes the ones whose writer is gone (killed) and leaves alone those
another save, in this process or another, is still writing (`sweep`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import struct
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..comm.interface import numpy_dtype
from ..errors import UsageError
from ..limits import MAX_SIZE, at_most
from ..jsonout import dumps
from .checkpoint_meta import (
    DTYPES,
    FORMAT,
    METADATA,
    SHARD_BYTES,
    VERSION,
    Fields,
    check_sum,
    fingerprint,
    held,
    read_listing,
    shard_file,
    validate,
)

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


# -- temporaries --------------------------------------------------------------------------------------------
def _lock(path: Path, wait: bool) -> int | None:
    """An open descriptor of `path` holding its exclusive flock, or None when another holder has it (or the
    file system has no locks). flock belongs to the open file, so a second save in the same process is
    kept out as one in another process is; the kernel drops it when its holder dies, even by SIGKILL."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def fresh_beside(target: Path, kind: str) -> tuple[Path, int | None]:
    """A new directory `.NAME.KIND-PID-XXXXXXXX` beside `target` and the descriptor holding its lock (close
    it when done). It is created as `.NAME.new-...`, locked, then renamed: a directory `sweep` may take is
    locked from the moment it has that name, so a sweep can never take one between its birth and its lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    born = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-{os.getpid()}-", dir=target.parent))
    fd = _lock(born, wait=False)
    path = target.parent / f".{target.name}.{kind}-{born.name[len(target.name) + 6 :]}"
    try:
        os.replace(born, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        shutil.rmtree(born, ignore_errors=True)
        raise
    return path, fd


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):  # no process has such a number
        return False
    return True


def sweep(target: Path, whole: str) -> list[Path]:
    """Remove what earlier saves into `target` left beside it, and return what was removed:
    `.NAME.tmp-*` (a save killed while it wrote) and `.NAME.old-*` (the previous checkpoint of a save killed
    between its two renames, removed only once `target` is whole again, that is holds the file `whole`)
    whose lock nobody holds: its writer is gone. `.NAME.new-PID-*` (killed between creating its directory
    and locking it) goes once process PID is gone. Names without a PID, from older versions, count as
    unlocked temporaries. Nothing else is touched."""
    name = re.escape(target.name)
    left = re.compile(rf"\.{name}\.(tmp|old)-(?:\d+-)?[a-z0-9_]{{8}}")
    born = re.compile(rf"\.{name}\.new-(\d+)-[a-z0-9_]{{8}}")
    try:
        entries = sorted(os.scandir(target.parent), key=lambda e: e.name)
    except OSError:  # no folder yet, or one this process cannot list
        return []
    is_whole, removed = (target / whole).is_file(), []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if (m := born.fullmatch(entry.name)) is not None:
            if not _alive(int(m[1])):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            continue
        m = left.fullmatch(entry.name)
        if m is None or (m[1] == "old" and not is_whole):
            continue
        fd = _lock(path, wait=False)
        if fd is None:  # a save is writing it (or locks are unknown here: keep it)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(path)
    return removed


# -- writing --------------------------------------------------------------------------------------------
def write_checkpoint(path: str | os.PathLike, shards: Sequence[RankShard]) -> Path:
    """Write one file per rank and the metadata into a fresh directory beside `path`, fsync it all, then
    put it at `path` (replacing an older checkpoint there). Returns `path`. The ranks' parts are checked
    first, and the metadata as a reader will check it before anything is published."""
    target = Path(path)
    if target.exists() and not (target / METADATA).is_file() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} exists and is not a parasim checkpoint; it is not replaced")
    meta = _metadata(target, shards)
    sweep(target, METADATA)
    tmp, fd = fresh_beside(target, "tmp")
    try:
        for shard in sorted(shards, key=lambda s: s.rank):
            name = shard_file(shard.rank)
            _write_shard(tmp / name, {f"c{i}": np.ascontiguousarray(c.data) for i, c in enumerate(shard.chunks)})
            meta["files"][name] = {"rank": shard.rank, **fingerprint(tmp / name)}
        text = dumps(meta, where=f"checkpoint {target}'s metadata")
        try:
            validate(json.loads(text), Fields(target, METADATA), tmp)
        except UsageError as exc:
            raise UsageError(f"checkpoint {target} was not saved, as reading it would refuse it: {exc}") from None
        write_synced(tmp / METADATA, text.encode())
        fsync_dir(tmp)
        swap(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once swapped in: tmp is then at `target`
        _release(fd)
    sweep(target, METADATA)  # a previous copy an interrupted save left aside, now that `target` is whole
    return target


def _metadata(target: Path, shards: Sequence[RankShard]) -> dict[str, Any]:
    """The metadata of the ranks' parts (files still empty), once what each rank hands over is checked:
    ranks 0..n-1 once each, one whole step from 0, tensors of a known dtype, chunks of tensors named and of
    the length and dtype they claim."""
    if not shards:
        raise UsageError("a checkpoint needs the state of at least one rank")
    ranks = sorted(s.rank for s in shards)
    if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) for r in ranks) or ranks != list(
        range(len(shards))
    ):
        raise UsageError(
            f"checkpoint {target}: the ranks' parts must be those of ranks 0 to {len(shards) - 1}, "
            f"each once; got ranks {ranks}"
        )
    steps = {s.step for s in shards}
    if len(steps) != 1:
        raise UsageError(f"ranks were at different steps {sorted(steps)}: save them after the same step")
    step = shards[0].step
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_SIZE:
        raise UsageError(f"checkpoint {target}: the step must be a whole number from 0, got {step!r}")
    tensors: dict[str, dict[str, Any]] = {}
    for s in shards:
        for name, t in s.tensors.items():
            if t.get("dtype") not in DTYPES:
                raise UsageError(
                    f"checkpoint {target}: tensor {name} of rank {s.rank} has dtype {t.get('dtype')!r}; "
                    f"a checkpoint holds {', '.join(DTYPES)}"
                )
            known = tensors.setdefault(name, {**t, "chunks": []})
            if known["shape"] != t["shape"] or known["dtype"] != t["dtype"]:
                raise UsageError(
                    f"ranks disagree on tensor {name}: {known['shape']} {known['dtype']} on one, "
                    f"{t['shape']} {t['dtype']} on rank {s.rank}"
                )
    for s in shards:
        held = 0
        for i, c in enumerate(s.chunks):
            _check_chunk(target, s.rank, c, tensors.get(c.tensor))
            tensors[c.tensor]["chunks"].append(
                {"file": shard_file(s.rank), "array": f"c{i}", "index": c.index, "flat": list(c.flat)}
            )
            held += c.data.nbytes
        at_most(
            f"checkpoint {target}: the file of rank {s.rank}: bytes",
            held,
            SHARD_BYTES,
            "a rank's file is read whole into memory on resuming",
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "world": len(shards),
        "optimizer": shards[0].info,
        "tensors": tensors,
        "files": {},
    }


def _check_chunk(target: Path, rank: int, c: Chunk, tensor: dict[str, Any] | None) -> None:
    """A chunk names a tensor every rank describes, and holds flat values of its dtype, as many as it says."""
    if tensor is None:
        raise UsageError(f"checkpoint {target}: rank {rank} holds a chunk of {c.tensor}, which no rank describes")
    data, (lo, hi) = c.data, c.flat
    if not isinstance(data, np.ndarray) or data.dtype != numpy_dtype(tensor["dtype"]):
        kind = f"dtype {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise UsageError(
            f"checkpoint {target}: rank {rank}'s chunk of {c.tensor} holds {kind}, not the tensor's {tensor['dtype']}"
        )
    if data.ndim != 1 or data.size != hi - lo:
        raise UsageError(
            f"checkpoint {target}: rank {rank}'s chunk of {c.tensor} holds {data.shape} values, "
            f"not the {hi - lo} of its flat range [{lo}, {hi})"
        )


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
    from there if a crash left no checkpoint at `target`. Saves into the same folder take turns here (a
    lock on the folder), so two at once each find `target` as the other left it."""
    folder = _lock(target.parent, wait=True)
    try:
        if not target.exists():
            os.rename(tmp, target)
            fsync_dir(target.parent)
            return
        old, fd = fresh_beside(target, "old")
        try:
            os.rename(target, old / "ckpt")
            os.rename(tmp, target)
            fsync_dir(target.parent)  # the new one is in place on disk before the old one goes
            shutil.rmtree(old, ignore_errors=True)
        finally:  # on an error the old copy stays where the reader finds it; unlocked, a sweep may take it
            _release(fd)  # once `target` is whole again
    finally:
        _release(folder)


# -- reading --------------------------------------------------------------------------------------------
class CheckpointReader:
    """A checkpoint directory, checked: its metadata on opening, each shard file before its first use."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        left = sorted(self.path.parent.glob(f".{self.path.name}.old-*/ckpt"))
        if not self.path.exists() and left:  # a save died between its two renames: the previous one is whole
            self.path = left[-1]
        self.fields = Fields(self.path, METADATA)
        self.meta = self._read_metadata()
        self.step: int = self.meta["step"]
        self._files: dict[str, dict[str, np.ndarray]] = {}  # shard files already verified and read

    def _fail(self, what: str) -> UsageError:
        return UsageError(f"checkpoint {self.path}: {what}")

    def _read_metadata(self) -> dict[str, Any]:
        where = self.path / METADATA
        if not where.exists():  # anything else there is refused in reading it (a folder, a device)
            left = sorted(self.path.parent.glob(f".{self.path.name}.old-*/ckpt"))
            hint = f" (an interrupted save left the previous one at {left[-1]})" if left else ""
            raise self._fail(f"{METADATA} is missing{hint}")
        meta = read_listing(where, self.fields)
        self._arrays = validate(meta, self.fields, self.path)
        return meta

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        return self.meta["tensors"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def _entry(self, name: str) -> dict[str, Any]:
        if name not in self.tensors:
            raise self._fail(f"it holds no tensor {name}")
        return self.tensors[name]

    def shard(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of a shard file the metadata names, once the file's SHA-256 matches and each array's
        header states the length and dtype the metadata gives it."""
        if name not in self._files:
            check_sum(self.fields, self.path, name, self.meta["files"][name]["sha256"])
            self._files[name] = self._read_arrays(name)
        return self._files[name]

    def _read_arrays(self, name: str) -> dict[str, np.ndarray]:
        out = {}
        try:
            with zipfile.ZipFile(self.path / name) as z:
                for array, (tensor, n) in self._arrays[name].items():
                    out[array] = self._read_array(z, name, array, numpy_dtype(self.tensors[tensor]["dtype"]), n)
        except UsageError:
            raise
        except (
            OSError,
            ValueError,
            EOFError,
            SyntaxError,
            NotImplementedError,
            struct.error,
            zipfile.BadZipFile,
        ) as exc:  # a damaged zip or .npy header (its checksum matched: made so)
            raise self._fail(f"shard {name} cannot be read: {type(exc).__name__}: {exc}") from None
        return out

    def _read_array(self, z: zipfile.ZipFile, name: str, array: str, dtype: np.dtype, n: int) -> np.ndarray:
        """One array of an .npz, its header checked before its values are allocated."""
        try:
            info = z.getinfo(f"{array}.npy")
        except KeyError:
            raise self._fail(f"shard {name} has no array {array}, which {METADATA} places there") from None
        if info.compress_type != zipfile.ZIP_STORED:  # np.savez stores: a compressed member could inflate
            raise self._fail(f"shard {name}: array {array} is compressed, which parasim never writes")
        with z.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version not in ((1, 0), (2, 0)):
                raise self._fail(f"shard {name}: array {array} is in .npy version {version}, not 1.0 or 2.0")
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, got = header(member)
            # np.save writes bfloat16 (an ml_dtypes type numpy does not name) as raw 2-byte values
            same = got == dtype or (
                got.kind == "V" and got.names is None and got.itemsize == dtype.itemsize and dtype.kind == "V"
            )
            if shape != (n,) or not same:
                raise self._fail(
                    f"shard {name} holds array {array} as {shape} {got}, where {METADATA} places {n} values of {dtype}"
                )
            data = member.read(n * dtype.itemsize + 1)
        if len(data) != n * dtype.itemsize:
            raise self._fail(
                f"shard {name}: array {array} has {len(data):,} bytes of values, not {n * dtype.itemsize:,}"
            )
        return np.frombuffer(data, dtype=dtype)

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The whole tensor `name`, from every chunk that holds part of it; `shape`: what the caller needs
        (a checkpoint of another shape is refused). Its size is held against what its chunks hold before
        it is allocated."""
        t = self._entry(name)
        have = self.shape(name)
        if shape is not None and tuple(shape) != have:
            raise self._fail(f"{METADATA} gives {name} the shape {have}, the model here needs {tuple(shape)}")
        size, there = math.prod(have), held(self.meta, name)
        if there < size:
            raise self._fail(
                f"{METADATA}: the chunks of {name} hold {there:,} values, fewer than the {size:,} of its shape {have}"
            )
        out = np.zeros(size, dtype=numpy_dtype(t["dtype"]))
        seen = np.zeros(out.shape, dtype=bool)
        for c in t["chunks"]:
            data = self.shard(c["file"])[c["array"]]
            lo, hi = c["flat"]
            where = flat_positions(c["index"], have)[lo:hi]
            out[where], seen[where] = data, True
        if not seen.all():
            raise self._fail(f"its shards cover {int(seen.sum())} of the {seen.size} values of {name}")
        return out.reshape(have)


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

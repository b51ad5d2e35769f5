"""What a checkpoint's listing may say, checked before anything is used: every field of metadata.json (and of
the DCP listing) by type and range, the files' sizes and checksums on disk. Each refusal is one line
naming the checkpoint, the file and the field (`tensors['w'].chunks[0].flat`). The files themselves are
checkpoint_format.py's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Sequence

from ..comm.interface import numpy_dtype
from ..errors import UsageError
from ..limits import FILE_BYTES, MAX_SIZE, VIRTUAL_WORLD, read_bounded
from ..limits import read_json as parse_json

FORMAT, VERSION, METADATA = "parasim-checkpoint", 1, "metadata.json"
DTYPES = ("float64", "float32", "float16", "bfloat16")  # what weights and Adam's state are kept in
METADATA_BYTES = 64 << 20  # the metadata lists tensors and chunks: kilobytes for the models parasim runs
SHARD_BYTES = FILE_BYTES  # one rank's file is read whole into memory on resuming
MAX_DIMS = 32  # numpy allows 64; no weight has more than a handful
NAME_CHARS = 1000  # tensor, array and placement names


def shard_file(rank: int) -> str:
    return f"rank{rank}.npz"


class Fields:
    """Type and range checks of the fields of a checkpoint's listing file; each refusal is one line that
    names the checkpoint, the file and the field (`tensors['w'].chunks[0].flat`)."""

    def __init__(self, root: Path, listing: str) -> None:
        self.root, self.listing = root, listing

    def fail(self, where: str, what: str) -> UsageError:
        return UsageError(f"checkpoint {self.root}: {self.listing}: {where} {what}")

    def get(self, obj: dict[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            raise self.fail(at(where, key), "is missing")
        return obj[key]

    def obj(self, v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be an object {{...}}, not {show(v)}")
        return v

    def list(self, v: Any, where: str, n: int | None = None) -> list[Any]:
        if not isinstance(v, list) or (n is not None and len(v) != n):
            raise self.fail(where, f"must be a list{'' if n is None else f' of {n}'}, not {show(v)}")
        return v

    def whole(self, v: Any, where: str, lo: int = 0, hi: int = MAX_SIZE) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(where, f"must be a whole number from {lo:,} to {hi:,}, not {show(v)}")
        return v

    def name(self, v: Any, where: str) -> str:
        if not isinstance(v, str) or not 0 < len(v) <= NAME_CHARS or not v.isprintable():
            raise self.fail(where, f"must be a name (printable text of 1 to {NAME_CHARS} characters), not {show(v)}")
        return v

    def file_name(self, v: Any, where: str) -> str:
        """A plain file name inside the checkpoint's folder: never a path that leaves it."""
        self.name(v, where)
        if v in (".", "..") or "/" in v or "\\" in v:
            raise self.fail(where, f"is not a plain file name inside the checkpoint's folder: {show(v)}")
        return v

    def one_of(self, v: Any, where: str, options: Sequence[Any]) -> Any:
        if not any(type(v) is type(o) and v == o for o in options):  # 1.0 and true are not 1
            raise self.fail(where, f"must be {' or '.join(show(o) for o in options)}, not {show(v)}")
        return v

    def sizes(self, files: Any, where: str = "files") -> dict[str, dict[str, Any]]:
        """files: {name: {"bytes", "sha256", ...}}, names plain, sizes within SHARD_BYTES."""
        for name, entry in self.obj(files, where).items():
            spot = item(where, name)
            self.file_name(name, spot)
            self.obj(entry, spot)
            self.whole(self.get(entry, "bytes", spot), at(spot, "bytes"), 0, SHARD_BYTES)
            digest = self.get(entry, "sha256", spot)
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise self.fail(at(spot, "sha256"), f"must be 64 hexadecimal digits, not {show(digest)}")
        return files


def at(where: str, key: str) -> str:
    return key if where in ("", "the top level") else f"{where}.{key}"


def item(where: str, key: Any) -> str:
    return f"{where}[{key if isinstance(key, int) else show(key)}]"


def show(v: Any) -> str:
    """A value read from a file, as a short line that is safe to print (JSON, ASCII only)."""
    if isinstance(v, dict):
        return f"an object of {len(v)} field{'' if len(v) == 1 else 's'}"
    if isinstance(v, list) and len(v) > 8:
        return f"a list of {len(v)}"
    text = json.dumps(v, ensure_ascii=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def read_listing(path: Path, fields: Fields, limit: int = METADATA_BYTES) -> Any:
    """A listing file as strict JSON (limits.read_json: no NaN or Infinity, no number out of range, no field
    twice), of at most `limit` bytes, UTF-8; `_validate` then admits only the depth the format has."""
    data = read_bounded(str(path), "checkpoint file", limit)
    return parse_json(data, f"checkpoint {fields.root}: {fields.listing}", "a checkpoint's listing")


def validate(meta: Any, f: Fields, folder: Path) -> dict[str, Any]:
    """Every field of metadata.json, by type and range, before any is used; then each shard file's size on
    disk (in `folder`). Returns {file: {array: (tensor name, values)}}: what each array must hold. The
    values a tensor's chunks hold (`held`) are compared with its shape when it is read, after the shape
    the caller needs."""
    top = f.obj(meta, "the top level")
    f.one_of(f.get(top, "format", ""), "format", [FORMAT])
    f.one_of(f.get(top, "version", ""), "version", [VERSION])
    f.whole(f.get(top, "step", ""), "step")
    world = f.whole(f.get(top, "world", ""), "world", 1, VIRTUAL_WORLD)
    for k, v in f.obj(f.get(top, "optimizer", ""), "optimizer").items():  # for people reading it: shallow
        if isinstance(v, (dict, list)) and not (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            raise f.fail(item("optimizer", k), f"must be a number, text, null or a list of numbers, not {show(v)}")
    files = f.sizes(f.get(top, "files", ""))
    if len(files) != world:
        raise f.fail("files", f"lists {len(files)} files for a world of {world} ranks (one file per rank)")
    for name, entry in files.items():
        rank = f.whole(f.get(entry, "rank", item("files", name)), at(item("files", name), "rank"), 0, world - 1)
        if name != shard_file(rank):
            raise f.fail(item("files", name), f"is the file of rank {rank}, so it must be named {shard_file(rank)}")
    arrays: dict[str, dict[str, tuple[str, int]]] = {name: {} for name in files}
    placed = {name: 0 for name in files}  # bytes of values the chunks place in each file
    for name, t in f.obj(f.get(top, "tensors", ""), "tensors").items():
        spot = item("tensors", name)
        f.name(name, spot)
        f.obj(t, spot)
        shape = f.list(f.get(t, "shape", spot), at(spot, "shape"))
        if len(shape) > MAX_DIMS:
            raise f.fail(at(spot, "shape"), f"has {len(shape)} dims, more than {MAX_DIMS}")
        for i, d in enumerate(shape):
            f.whole(d, item(at(spot, "shape"), i))
        size = numpy_dtype(f.one_of(f.get(t, "dtype", spot), at(spot, "dtype"), DTYPES)).itemsize
        for k, v in f.obj(f.get(t, "placement", spot), at(spot, "placement")).items():
            f.name(k, at(spot, "placement"))
            f.name(v, item(at(spot, "placement"), k))
        for i, c in enumerate(f.list(f.get(t, "chunks", spot), at(spot, "chunks"))):
            piece = item(at(spot, "chunks"), i)
            f.obj(c, piece)
            file = f.get(c, "file", piece)
            if not isinstance(file, str) or file not in files:
                raise f.fail(at(piece, "file"), f"names {show(file)}, which files does not list")
            array = f.name(f.get(c, "array", piece), at(piece, "array"))
            if array in arrays[file]:
                raise f.fail(at(piece, "array"), f"names array {show(array)} of {file}, which another chunk names too")
            index = f.list(f.get(c, "index", piece), at(piece, "index"), len(shape))
            box = 1
            for dim, (runs, d) in enumerate(zip(index, shape)):
                spot_dim, start, covered = item(at(piece, "index"), dim), 0, 0
                for j, run in enumerate(f.list(runs, spot_dim)):
                    lo, hi = (f.whole(x, item(spot_dim, j)) for x in f.list(run, item(spot_dim, j), 2))
                    if not start <= lo <= hi:
                        raise f.fail(
                            item(spot_dim, j),
                            f"is [{lo}, {hi}]: the runs of a dim go up, each "
                            f"starting where the one before ends ({start}) or later",
                        )
                    if hi > d:
                        raise UsageError(
                            f"checkpoint {f.root}: {METADATA}: a chunk of {name} in {file} lies "
                            f"outside its shape {tuple(shape)}: {item(spot_dim, j)} is [{lo}, {hi}]"
                        )
                    start, covered = hi, covered + hi - lo
                box *= covered
            lo, hi = (f.whole(x, at(piece, "flat")) for x in f.list(f.get(c, "flat", piece), at(piece, "flat"), 2))
            if not lo <= hi <= box:
                raise f.fail(
                    at(piece, "flat"), f"is [{lo}, {hi}], outside the {box:,} values of the piece its index cuts"
                )
            arrays[file][array] = (name, hi - lo)
            placed[file] += (hi - lo) * size
    for name, need in placed.items():
        if need > files[name]["bytes"]:
            raise f.fail(
                at(item("files", name), "bytes"),
                f"is {files[name]['bytes']:,}, fewer than the {need:,} bytes of values the chunks place in that file",
            )
    for name, entry in files.items():
        check_size(f, folder, name, entry["bytes"])
    return arrays


def held(meta: dict[str, Any], name: str) -> int:
    """How many values the chunks of tensor `name` hold (overlaps counted twice): at least its size, or
    they cannot cover it."""
    return sum(hi - lo for c in meta["tensors"][name]["chunks"] for lo, hi in [c["flat"]])


def check_size(f: Fields, root: Path, name: str, want: int) -> None:
    """Refuse, in one line naming it, a file of checkpoint `root` that is gone, is not a regular file, or
    whose size differs from what `f.listing` (the file that recorded it) says."""
    try:
        st = os.stat(root / name)
    except OSError:
        raise UsageError(f"checkpoint {f.root}: shard {name} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"checkpoint {f.root}: shard {name} is not a regular file")
    if st.st_size != want:
        word = "truncated" if st.st_size < want else "longer than saved"
        raise UsageError(f"checkpoint {f.root}: shard {name} is {word}: {st.st_size} bytes, {f.listing} says {want}")


def check_sum(f: Fields, root: Path, name: str, want: str) -> None:
    """Refuse a file whose SHA-256 differs from the listing's (read in pieces: a shard may be large)."""
    digest = hashlib.sha256()
    try:
        with open(root / name, "rb") as fh:
            while piece := fh.read(1 << 20):
                digest.update(piece)
    except OSError as exc:
        raise UsageError(f"checkpoint {f.root}: shard {name} cannot be read: {exc.strerror}") from None
    if digest.hexdigest() != want:
        raise UsageError(f"checkpoint {f.root}: shard {name} is corrupt: its SHA-256 differs from {f.listing}'s")


def check_file(f: Fields, root: Path, name: str, want: dict[str, Any]) -> None:
    """A listed file's size, then its checksum (`want`: its checked entry of the listing)."""
    check_size(f, root, name, want["bytes"])
    check_sum(f, root, name, want["sha256"])


def fingerprint(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256, as the listing of a checkpoint keeps them."""
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

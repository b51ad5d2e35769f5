"""Checkpoints under faults: a save killed part way (SIGKILL, in another process) leaves a temporary that
the next save or resume removes, while a save still running, in another process or this one, keeps its
own; and every field of a checkpoint's metadata is checked for type and range before anything is
allocated, each refusal one line naming the file and the field (virtual format and DCP's listing)."""
import fcntl
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest

import parasim
from parasim.dp import checkpoint_format as cf
from parasim.dp import checkpoint_meta
from parasim.dp.checkpoint import restore, save_checkpoint, shard_state, verify_checkpoint
from parasim.dp.sharded import ShardedAdam
from parasim.errors import UsageError
from parasim.layout import ModelSpec
from parasim.nn import ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights

DEAD = 2**31 - 1  # no process has this number (Linux's pid_max is at most 2**22)
SUFFIX = "abcd_123"  # eight characters as tempfile names its directories


# -- a small checkpoint written by hand --------------------------------------------------------------------
def _shards(step=3):
    """Two ranks: w (4 x 3, float64) split by rows, b (3, float32) on rank 0, h (3, bfloat16) on rank 1."""
    import ml_dtypes
    w = np.arange(12.0).reshape(4, 3)
    tensors = {"w": {"shape": [4, 3], "dtype": "float64", "placement": {"tp": "Shard(dim=0)"}},
               "b": {"shape": [3], "dtype": "float32", "placement": {}},
               "h": {"shape": [3], "dtype": "bfloat16", "placement": {}}}
    return [cf.RankShard(0, step, tensors, [cf.Chunk("w", [[(0, 2)], [(0, 3)]], (0, 6), w[:2].reshape(-1)),
                                            cf.Chunk("b", [[(0, 3)]], (0, 3), np.array([1, 2, 3], np.float32))]),
            cf.RankShard(1, step, tensors, [cf.Chunk("w", [[(2, 4)], [(0, 3)]], (0, 6), w[2:].reshape(-1)),
                                            cf.Chunk("h", [[(0, 3)]], (0, 3),
                                                     np.array([0.5, 1.0, 3.0], ml_dtypes.bfloat16))])]


def _folder(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_a_hand_written_checkpoint_reads_back_bit_for_bit(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    reader = cf.CheckpointReader(path)
    assert reader.step == 3 and verify_checkpoint(path) == {"step": 3, "tensors": 3, "files": 2}
    assert reader.tensor("w").tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert reader.tensor("b").dtype == np.float32 and reader.tensor("b").tolist() == [1, 2, 3]
    h = reader.tensor("h")
    assert str(h.dtype) == "bfloat16" and h.view(np.uint16).tolist() == [0x3F00, 0x3F80, 0x4040]
    assert _folder(tmp_path) == ["ckpt"]


# -- saves killed part way ----------------------------------------------------------------------------------
# A save in a child process that stops after its first shard file: "hang" sleeps until killed, "wait"
# goes on once the file argv[3] exists. It prints the name of its temporary directory when it stops.
CHILD = r"""
import os, sys, time
import numpy as np
from parasim.dp import checkpoint_format as cf
target, mode, go = sys.argv[1:4]
real = cf._write_shard
def stop(where, arrays):
    real(where, arrays)
    print(where.parent.name, flush=True)
    while mode == "hang" or not os.path.exists(go):
        time.sleep(0.05)
cf._write_shard = stop
tensors = {"w": {"shape": [2], "dtype": "float64", "placement": {}}}
cf.write_checkpoint(target, [cf.RankShard(r, 7, tensors, [cf.Chunk("w", [[(r, r + 1)]], (0, 1), np.array([7.0 + r]))])
                             for r in range(2)])
"""


class _Child:
    """The child save, stopped in its first shard; killed and reaped on leaving, whatever happened."""

    def __init__(self, target, mode, go):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(target), mode, str(go)],
                                     stdout=subprocess.PIPE, text=True)
        self.guard = threading.Timer(60, self.proc.kill)  # a child that never reaches its stop ends the test
        self.guard.start()
        self.tmp = target.parent / self.proc.stdout.readline().strip()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.guard.cancel()
        self.proc.kill()
        self.proc.wait()


SHAPE = ModelSpec(hidden=8, heads=2, ffn=16)


def _model(ctx):
    return TransformerLayer(ParallelContext(ctx), SHAPE, layer_weights(ctx, SHAPE, "L0"), key="L0")


def _model_save(path):
    def program(ctx):
        layer = _model(ctx)
        opt = ShardedAdam(ctx, ctx.new_group(range(ctx.world), "dp"), layer.params(), 1, lr=0.01)
        opt.t = 5
        return shard_state(ctx, layer, opt)
    return save_checkpoint(path, parasim.run(program, 2).values)


def _model_resume(path):
    def program(ctx):
        layer = _model(ctx)
        return restore(ctx, path, layer, ShardedAdam(ctx, ctx.new_group(range(ctx.world), "dp"), layer.params(), 1))
    return parasim.run(program, 2).values


AFTER_A_KILL = {  # what runs next -> the step the checkpoint at the path then has
    "save": (lambda path: (save_checkpoint(path, _shards(step=9)), verify_checkpoint(path)["step"])[1], 9),
    "resume": (lambda path: _model_resume(path)[0], 5),
}


@pytest.mark.parametrize("then", sorted(AFTER_A_KILL))
def test_a_save_killed_part_way_leaves_a_temporary_that_the_next_save_or_resume_removes(tmp_path, then):
    target = tmp_path / "ckpt"
    _model_save(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    with _Child(target, "hang", tmp_path / "never") as child:
        assert child.tmp.name.startswith(f".ckpt.tmp-{child.proc.pid}-") and (child.tmp / "rank0.npz").is_file()
        child.proc.send_signal(signal.SIGKILL)
        assert child.proc.wait(timeout=30) == -signal.SIGKILL
    assert _folder(tmp_path) == [child.tmp.name, "ckpt"]  # what the kill left behind
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the previous checkpoint, whole
    act, step = AFTER_A_KILL[then]
    assert act(target) == step
    assert _folder(tmp_path) == ["ckpt"]


def test_a_save_still_running_in_another_process_keeps_its_temporary(tmp_path):
    """Two saves into one folder at once: each sweep leaves the other's temporary alone, both finish, and the
    one that finished last is the checkpoint."""
    target = tmp_path / "ckpt"
    go = tmp_path.parent / f"{tmp_path.name}.go"
    with _Child(target, "wait", go) as child:
        save_checkpoint(target, _shards(step=3))
        assert verify_checkpoint(target)["step"] == 3
        assert _folder(tmp_path) == [child.tmp.name, "ckpt"]  # still being written: left alone
        go.touch()
        assert child.proc.wait(timeout=60) == 0
    go.unlink()
    assert verify_checkpoint(target)["step"] == 7 and _folder(tmp_path) == ["ckpt"]


def test_two_saves_at_once_in_one_process_keep_each_others_temporaries(tmp_path, monkeypatch):
    """The lock belongs to each save's own open directory, so one pid is no reason to take another's."""
    target, real = tmp_path / "ckpt", cf._write_shard
    inside, go, errors = threading.Event(), threading.Event(), []

    def stops_in_the_thread(where, arrays):
        real(where, arrays)
        if threading.current_thread().name == "first":
            inside.set()
            assert go.wait(30)
    monkeypatch.setattr(cf, "_write_shard", stops_in_the_thread)

    def first():
        try:
            save_checkpoint(target, _shards(step=1))
        except BaseException as exc:  # reported below, in the test's own thread
            errors.append(exc)
    thread = threading.Thread(target=first, name="first")
    thread.start()
    try:
        assert inside.wait(30)
        (mine,) = [n for n in _folder(tmp_path) if n.startswith(f".ckpt.tmp-{os.getpid()}-")]
        save_checkpoint(target, _shards(step=2))
        assert _folder(tmp_path) == [mine, "ckpt"] and verify_checkpoint(target)["step"] == 2
    finally:
        go.set()
        thread.join(30)
    assert not errors and verify_checkpoint(target)["step"] == 1 and _folder(tmp_path) == ["ckpt"]


# What a sweep of ckpt's folder does with each thing it finds: (name, how it is made) -> removed or kept.
# "locked": this process holds its lock, as a save writing it does.
SWEEP = {
    "tmp-dead-pid": (f".ckpt.tmp-{DEAD}-{SUFFIX}", "dir", True),
    "tmp-locked": (f".ckpt.tmp-{os.getpid()}-{SUFFIX}", "locked", False),
    "tmp-live-pid-unlocked": (f".ckpt.tmp-{os.getpid()}-{SUFFIX}", "dir", True),  # a pid reused: the lock decides
    "tmp-no-pid": (f".ckpt.tmp-{SUFFIX}", "dir", True),  # from before temporaries carried a pid
    "tmp-no-pid-locked": (f".ckpt.tmp-{SUFFIX}", "locked", False),
    "old-target-whole": (f".ckpt.old-{DEAD}-{SUFFIX}", "old", True),
    "old-target-gone": (f".ckpt.old-{DEAD}-{SUFFIX}", "old, no target", False),  # the only whole copy left
    "new-dead-pid": (f".ckpt.new-{DEAD}-{SUFFIX}", "dir", True),
    "new-live-pid": (f".ckpt.new-{os.getpid()}-{SUFFIX}", "dir", False),  # about to be locked and renamed
    "other-checkpoint": (f".ckpt2.tmp-{DEAD}-{SUFFIX}", "dir", False),
    "a-file": (f".ckpt.tmp-{DEAD}-{SUFFIX}", "file", False),
    "not-tempfile-name": (f".ckpt.tmp-{DEAD}-ABC", "dir", False),
    "longer-name": (f".ckpt.tmp-{DEAD}-{SUFFIX}.tmp-{DEAD}-{SUFFIX}", "dir", False),
}


@pytest.mark.parametrize("case", sorted(SWEEP))
def test_a_sweep_removes_only_what_a_gone_writer_left(tmp_path, case):
    name, how, removed = SWEEP[case]
    if how != "old, no target":
        save_checkpoint(tmp_path / "ckpt", _shards())
    thing, fd = tmp_path / name, None
    if how == "file":
        thing.write_text("not a directory")
    else:
        thing.mkdir()
        (thing / "rank0.npz").write_bytes(b"half written")
        if how.startswith("old"):
            (thing / "ckpt").mkdir()
    if how == "locked":
        fd = os.open(thing, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        gone = cf.sweep(tmp_path / "ckpt", cf.METADATA)
    finally:
        if fd is not None:
            os.close(fd)
    assert (gone == [thing]) is removed and thing.exists() is not removed
    if how != "old, no target":
        assert verify_checkpoint(tmp_path / "ckpt")["step"] == 3


# -- hostile metadata ----------------------------------------------------------------------------------------
def _at(meta, path):
    """The object holding the last key of `path`, and that key."""
    *head, last = path
    for k in head:
        meta = meta[k]
    return meta, last


def _set(*path_value):
    *path, value = path_value

    def edit(meta):
        obj, k = _at(meta, path)
        obj[k] = value
    return edit


def _drop(*path):
    def edit(meta):
        obj, k = _at(meta, path)
        del obj[k]
    return edit


def _rename_file(name):
    def edit(meta):
        meta["files"][name] = meta["files"].pop("rank0.npz")
    return edit


W0 = ("tensors", "w", "chunks", 0)
R0 = ("files", "rank0.npz")
# (metadata.json edited) -> words the one-line refusal holds: the field, and what is wrong with it
METADATA_CASES = {
    "not-an-object": (lambda m: [m], ["the top level must be an object", "not [{"]),
    "format-missing": (_drop("format"), ["format is missing"]),
    "format-wrong": (_set("format", "zip"), ['format must be "parasim-checkpoint", not "zip"']),
    "version-missing": (_drop("version"), ["version is missing"]),
    "version-text": (_set("version", "1"), ['version must be 1, not "1"']),
    "version-2": (_set("version", 2), ["version must be 1, not 2"]),
    "version-float": (_set("version", 1.0), ["version must be 1, not 1.0"]),
    "step-missing": (_drop("step"), ["step is missing"]),
    "step-negative": (_set("step", -1), ["step must be a whole number from 0 to 1,000,000,000,000, not -1"]),
    "step-fraction": (_set("step", 2.5), ["step must be a whole number", "not 2.5"]),
    "step-float": (_set("step", 3.0), ["step must be a whole number", "not 3.0"]),
    "step-text": (_set("step", "3"), ["step must be a whole number", 'not "3"']),
    "step-bool": (_set("step", True), ["step must be a whole number", "not true"]),
    "step-huge": (_set("step", 10**13), ["step must be a whole number", "not 10000000000000"]),
    "world-missing": (_drop("world"), ["world is missing"]),
    "world-zero": (_set("world", 0), ["world must be a whole number from 1 to 16,384, not 0"]),
    "world-other": (_set("world", 3), ["files lists 2 files for a world of 3 ranks"]),
    "optimizer-missing": (_drop("optimizer"), ["optimizer is missing"]),
    "optimizer-list": (_set("optimizer", []), ["optimizer must be an object", "not []"]),
    "optimizer-nested": (_set("optimizer", "lr", {"deeper": [1]}), ['optimizer["lr"] must be a number, text, null']),
    "files-missing": (_drop("files"), ["files is missing"]),
    "files-list": (_set("files", []), ["files must be an object"]),
    "bytes-missing": (_drop(*R0, "bytes"), ['files["rank0.npz"].bytes is missing']),
    "bytes-text": (_set(*R0, "bytes", "600"), ['files["rank0.npz"].bytes must be a whole number', 'not "600"']),
    "bytes-negative": (_set(*R0, "bytes", -1), ['files["rank0.npz"].bytes must be a whole number', "not -1"]),
    "bytes-huge": (_set(*R0, "bytes", 2**40), ["bytes must be a whole number from 0 to 1,073,741,824"]),
    "bytes-too-few": (_set(*R0, "bytes", 10), ['files["rank0.npz"].bytes is 10, fewer than the 60 bytes']),
    "sha-missing": (_drop(*R0, "sha256"), ['files["rank0.npz"].sha256 is missing']),
    "sha-short": (_set(*R0, "sha256", "abc"), ["sha256 must be 64 hexadecimal digits, not \"abc\""]),
    "rank-missing": (_drop(*R0, "rank"), ['files["rank0.npz"].rank is missing']),
    "rank-out": (_set(*R0, "rank", 2), ['files["rank0.npz"].rank must be a whole number from 0 to 1, not 2']),
    "rank-other": (_set(*R0, "rank", 1), ['files["rank0.npz"] is the file of rank 1, so it must be named rank1.npz']),
    "file-escapes": (_rename_file("../../etc/passwd"), ['files["../../etc/passwd"] is not a plain file name']),
    "file-in-folder": (_rename_file("sub/rank0.npz"), ["is not a plain file name inside the checkpoint's folder"]),
    "file-dotdot": (_rename_file(".."), ['files[".."] is not a plain file name']),
    "tensors-missing": (_drop("tensors"), ["tensors is missing"]),
    "tensors-list": (_set("tensors", [1]), ["tensors must be an object", "not [1]"]),
    "tensor-escape-name": (lambda m: m["tensors"].update({"\x1b[2Jw": m["tensors"].pop("w")}),
                           [r'tensors["\u001b[2Jw"] must be a name (printable text']),
    "tensor-surrogate": (lambda m: m["tensors"].update({"\ud800": m["tensors"].pop("w")}),
                         [r'tensors["\ud800"] must be a name']),
    "shape-missing": (_drop("tensors", "w", "shape"), ['tensors["w"].shape is missing']),
    "shape-text": (_set("tensors", "w", "shape", "4x3"), ['tensors["w"].shape must be a list, not "4x3"']),
    "shape-negative": (_set("tensors", "w", "shape", [4, -3]), ['tensors["w"].shape[1] must be a whole', "not -3"]),
    "shape-fraction": (_set("tensors", "w", "shape", [4, 3.5]), ['tensors["w"].shape[1] must be', "not 3.5"]),
    "shape-dims": (_set("tensors", "w", "shape", [1] * 33), ['tensors["w"].shape has 33 dims, more than 32']),
    "dtype-missing": (_drop("tensors", "w", "dtype"), ['tensors["w"].dtype is missing']),
    "dtype-object": (_set("tensors", "w", "dtype", "object"),
                     ['tensors["w"].dtype must be "float64" or "float32" or "float16" or "bfloat16", not "object"']),
    "dtype-number": (_set("tensors", "w", "dtype", 8), ['tensors["w"].dtype must be', "not 8"]),
    "placement-missing": (_drop("tensors", "w", "placement"), ['tensors["w"].placement is missing']),
    "placement-number": (_set("tensors", "w", "placement", "tp", 3), ['tensors["w"].placement["tp"] must be a name']),
    "chunks-missing": (_drop("tensors", "w", "chunks"), ['tensors["w"].chunks is missing']),
    "chunks-object": (_set("tensors", "w", "chunks", {}), ['tensors["w"].chunks must be a list']),
    "chunk-number": (_set("tensors", "w", "chunks", [5]), ['tensors["w"].chunks[0] must be an object', "not 5"]),
    "chunk-file-missing": (_drop(*W0, "file"), ['tensors["w"].chunks[0].file is missing']),
    "chunk-file-unlisted": (_set(*W0, "file", "rank9.npz"), ['chunks[0].file names "rank9.npz", which files does not']),
    "chunk-file-escapes": (_set(*W0, "file", "../../etc/passwd"), ['names "../../etc/passwd", which files does not']),
    "array-missing": (_drop(*W0, "array"), ['tensors["w"].chunks[0].array is missing']),
    "array-number": (_set(*W0, "array", 0), ['tensors["w"].chunks[0].array must be a name', "not 0"]),
    "array-twice": (_set("tensors", "b", "chunks", 0, "array", "c0"),
                    ['tensors["b"].chunks[0].array names array "c0" of rank0.npz, which another chunk names too']),
    "index-missing": (_drop(*W0, "index"), ['tensors["w"].chunks[0].index is missing']),
    "index-dims": (_set(*W0, "index", [[[0, 2]]]), ['tensors["w"].chunks[0].index must be a list of 2']),
    "run-reversed": (_set(*W0, "index", 0, [[2, 0]]), ["index[0][0] is [2, 0]: the runs of a dim go up"]),
    "runs-overlap": (_set(*W0, "index", 1, [[0, 2], [1, 3]]), ["index[1][1] is [1, 3]: the runs of a dim go up",
                                                                "where the one before ends (2)"]),
    "run-outside": (_set(*W0, "index", 1, [[0, 99]]), ["a chunk of w in rank0.npz lies outside its shape (4, 3)",
                                                       "index[1][0] is [0, 99]"]),
    "run-negative": (_set(*W0, "index", 0, [[-1, 2]]), ["index[0][0] must be a whole number", "not -1"]),
    "run-three": (_set(*W0, "index", 0, [[0, 1, 2]]), ["index[0][0] must be a list of 2, not [0, 1, 2]"]),
    "flat-missing": (_drop(*W0, "flat"), ['tensors["w"].chunks[0].flat is missing']),
    "flat-outside": (_set(*W0, "flat", [0, 10**9]), ["flat is [0, 1000000000], outside the 6 values of the piece"]),
    "flat-reversed": (_set(*W0, "flat", [4, 2]), ["flat is [4, 2], outside the 6 values"]),
    "flat-one": (_set(*W0, "flat", [6]), ["flat must be a list of 2, not [6]"]),
}


def _hostile(tmp_path, edit):
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    where = tmp_path / "ckpt" / cf.METADATA
    meta = json.loads(where.read_text())
    out = edit(meta)
    where.write_text(json.dumps(meta if out is None else out))
    return path


def _refusal(path, *, call=verify_checkpoint):
    with pytest.raises(UsageError) as info:
        call(path)
    text = str(info.value)
    assert "\n" not in text and text.isascii() and text.isprintable()  # one line, safe on any terminal
    return text


@pytest.mark.parametrize("case", sorted(METADATA_CASES))
def test_each_field_of_the_metadata_is_checked_before_use(tmp_path, case):
    edit, words = METADATA_CASES[case]
    path = _hostile(tmp_path, edit)
    text = _refusal(path)
    assert text.startswith(f"checkpoint {path}: ")
    for w in words:
        assert w in text


# (metadata.json's bytes) -> words: what strict JSON refuses
RAW_CASES = {
    "nan": (lambda t: t.replace(b'"step": 3', b'"step": NaN'),
            ["metadata.json is not a checkpoint's listing: step: NaN is not a JSON number"]),
    "infinity": (lambda t: t.replace(b'"step": 3', b'"step": -Infinity'), ["step: -Infinity is not a JSON number"]),
    "float-overflow": (lambda t: t.replace(b'"step": 3', b'"step": 1e999'), ["step: 1e999 is past the range of a float"]),
    "long-integer": (lambda t: t.replace(b'"step": 3', b'"step": ' + b"9" * 5000), ["step: an integer of 5,000 digits"]),
    "key-twice": (lambda t: t.replace(b'"step": 3', b'"step": 3, "step": -1'), ["the field 'step' appears twice"]),
    "deep": (lambda t: t.replace(b'"step": 3', b'"step": ' + b"[" * 100_000 + b"]" * 100_000),
             ["metadata.json is not a checkpoint's listing: step[0][0]", "nested more than 100 levels deep"]),
    "truncated": (lambda t: t[:len(t) // 2], ["metadata.json is not JSON: ", "was it cut short?"]),
    "empty": (lambda t: b"", ["metadata.json is empty, not a checkpoint's listing"]),
    "not-utf8": (lambda t: t.replace(b'"w"', b'"\xff"', 1), ["metadata.json is not UTF-8 text (byte 0xff at offset"]),
    "utf16": (lambda t: t.decode().encode("utf-16"), ["metadata.json is UTF-16 text; a checkpoint's listing is UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_the_metadata_is_strict_json(tmp_path, case):
    edit, words = RAW_CASES[case]
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    where = tmp_path / "ckpt" / cf.METADATA
    where.write_bytes(edit(json.dumps(json.loads(where.read_text())).encode()))
    text = _refusal(path)
    for w in words:
        assert w in text


def test_metadata_that_is_too_large_or_not_a_file_is_refused_unread(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    where = tmp_path / "ckpt" / cf.METADATA
    with open(where, "r+b") as f:
        f.truncate(checkpoint_meta.METADATA_BYTES + 1)  # sparse: nothing is written
    assert "bytes: 67,108,865 is more than the limit of 67,108,864" in _refusal(path)
    where.unlink()
    where.mkdir()
    assert f"{where} is not a regular file" in _refusal(path)


def test_a_huge_stated_shape_is_refused_before_it_is_allocated(tmp_path):
    """The old reader allocated the whole tensor (here 8 TB) from its stated shape before any check."""
    path = _hostile(tmp_path, _set("tensors", "w", "shape", [10**6, 10**6]))
    tracemalloc.start()
    try:
        text = _refusal(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "metadata.json: the chunks of w hold 12 values, fewer than the 1,000,000,000,000 of its shape" in text
    assert peak < 20 << 20


def _npz(path, arrays, compress=False):
    (np.savez_compressed if compress else np.savez)(path, **arrays)


def _huge_header(path, arrays):
    """An .npz whose c0 states 10**12 float64 values (8 TB) and holds 48 bytes."""
    with zipfile.ZipFile(path, "w") as z:
        with z.open("c0.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
            f.write(np.zeros(6).tobytes())
        for k, v in arrays.items():
            if k != "c0":
                with z.open(f"{k}.npy", "w") as f:
                    np.lib.format.write_array(f, v)


# (rank0.npz rewritten, its size and SHA-256 listed again: a shard made to pass the checksum) -> words
SHARD_CASES = {
    "huge-header": (_huge_header, ["shard rank0.npz holds array c0 as (1000000000000,) float64, where metadata.json "
                                   "places 6 values of float64"]),
    "compressed": (lambda p, a: _npz(p, a, compress=True), ["shard rank0.npz: array c0 is compressed"]),
    "array-gone": (lambda p, a: _npz(p, {"c1": a["c1"]}), ["shard rank0.npz has no array c0, which metadata.json"]),
    "other-dtype": (lambda p, a: _npz(p, {**a, "c0": a["c0"].astype(np.float32)}), ["holds array c0 as (6,) float32"]),
    "other-length": (lambda p, a: _npz(p, {**a, "c0": a["c0"][:5]}), ["holds array c0 as (5,) float64"]),
    "two-dims": (lambda p, a: _npz(p, {**a, "c0": a["c0"].reshape(2, 3)}), ["holds array c0 as (2, 3) float64"]),
    "objects": (lambda p, a: np.savez(p, c0=np.array([{}, None] * 3, dtype=object), c1=a["c1"]),
                ["holds array c0 as (6,) object"]),
    "not-a-zip": (lambda p, a: p.write_bytes(b"\x00" * 700), ["shard rank0.npz cannot be read: BadZipFile"]),
}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_a_shard_made_to_match_its_checksum_is_still_read_only_as_stated(tmp_path, case):
    make, words = SHARD_CASES[case]
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    shard, where = tmp_path / "ckpt" / "rank0.npz", tmp_path / "ckpt" / cf.METADATA
    with np.load(shard) as z:
        arrays = dict(z)
    make(shard, arrays)
    meta = json.loads(where.read_text())
    meta["files"]["rank0.npz"].update(cf.fingerprint(shard))
    where.write_text(json.dumps(meta))
    tracemalloc.start()
    try:
        text = _refusal(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for w in words:
        assert w in text
    assert peak < 20 << 20


SIZE_CASES = {  # rank0.npz changed on disk after the save -> words
    "shorter": (lambda p: p.write_bytes(p.read_bytes()[:-10]), "shard rank0.npz is truncated"),
    "longer": (lambda p: p.write_bytes(p.read_bytes() + b"\0"), "shard rank0.npz is longer than saved"),
    "a-folder": (lambda p: (p.unlink(), p.mkdir()), "shard rank0.npz is not a regular file"),
    "gone": (lambda p: p.unlink(), "shard rank0.npz is missing"),
}


@pytest.mark.parametrize("case", sorted(SIZE_CASES))
def test_a_shard_of_another_size_than_listed_is_refused_on_opening(tmp_path, case):
    change, words = SIZE_CASES[case]
    path = save_checkpoint(tmp_path / "ckpt", _shards())
    change(tmp_path / "ckpt" / "rank0.npz")
    assert words in _refusal(path, call=cf.CheckpointReader)


def test_a_hostile_checkpoint_is_refused_the_same_way_in_a_run(tmp_path):
    path = _model_save(tmp_path / "ckpt")
    where = tmp_path / "ckpt" / cf.METADATA
    meta = json.loads(where.read_text())
    meta["step"] = -4
    where.write_text(json.dumps(meta))
    assert "metadata.json: step must be a whole number" in _refusal(path, call=_model_resume)


# -- what a save is handed ------------------------------------------------------------------------------------
def _edit_shards(edit):
    shards = _shards()
    edit(shards)
    return shards


def _chunk_data(value):
    def edit(shards):
        shards[0].chunks[0].data = value
    return edit


def _step(value):
    def edit(shards):
        for s in shards:
            s.step = value
    return edit


# (the ranks' parts changed) -> words of the refusal; nothing is written
SAVE_CASES = {
    "step-negative": (_step(-1), "the step must be a whole number from 0, got -1"),
    "step-fraction": (_step(2.5), "the step must be a whole number from 0, got 2.5"),
    "step-bool": (_step(True), "the step must be a whole number from 0, got True"),
    "dtype-object": (lambda s: [x.tensors["w"].update(dtype="object") for x in s],
                     "tensor w of rank 0 has dtype 'object'"),
    "data-objects": (_chunk_data(np.array([None] * 6, dtype=object)), "rank 0's chunk of w holds dtype object, not"),
    "data-list": (_chunk_data([0.0] * 6), "rank 0's chunk of w holds list, not the tensor's float64"),
    "data-short": (_chunk_data(np.zeros(5)), "rank 0's chunk of w holds (5,) values, not the 6 of its flat range"),
    "unknown-tensor": (lambda s: setattr(s[0].chunks[0], "tensor", "x"), "rank 0 holds a chunk of x, which no rank"),
    "rank-twice": (lambda s: setattr(s[1], "rank", 0), "must be those of ranks 0 to 1, each once; got ranks [0, 0]"),
    "rank-gap": (lambda s: setattr(s[1], "rank", 2), "got ranks [0, 2]"),
    "runs-reversed": (lambda s: setattr(s[0].chunks[0], "index", [[(2, 0)], [(0, 3)]]),
                      "was not saved, as reading it would refuse it"),
}


@pytest.mark.parametrize("case", sorted(SAVE_CASES))
def test_a_save_refuses_what_a_reader_would_refuse_and_writes_nothing(tmp_path, case):
    edit, words = SAVE_CASES[case]
    target = save_checkpoint(tmp_path / "ckpt", _shards())
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    text = _refusal(_edit_shards(edit), call=lambda shards: save_checkpoint(target, shards))
    assert words in text
    assert _folder(tmp_path) == ["ckpt"] and {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before


# -- DCP's listing and metadata (checked without running ranks: DCP saves in one process too) ------------------
class _Buf:
    total, keys = 5, ["w"]


class _Opt:
    t, buf = 4, _Buf()


def _dcp(tmp_path):
    torch = pytest.importorskip("torch")
    import warnings

    import torch.distributed.checkpoint as dcp
    from parasim.dp import checkpoint_dcp as cd
    tmp, target = tmp_path / ".dcp.tmp-1-abcdefgh", tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that no process group is running
        dcp.save({"model.w": torch.ones(3, dtype=torch.float64), "optim.m": torch.zeros(5), "step": 4},
                 checkpoint_id=str(tmp))
    assert cd.commit_dcp(tmp, target, _Opt()) is None
    return target


def _listing(edit):
    def change(target):
        where = target / "parasim.json"
        meta = json.loads(where.read_text())
        edit(meta)
        where.write_text(json.dumps(meta))
    return change


def _metadata_pickle(edit):
    """DCP's .metadata unpickled (by the test, trusting it), changed, pickled again and listed again."""
    def change(target):
        md = pickle.loads((target / ".metadata").read_bytes())
        new = edit(md)
        (target / ".metadata").write_bytes(pickle.dumps(md if new is None else new))
        where = target / "parasim.json"
        meta = json.loads(where.read_text())
        meta["files"][".metadata"] = cf.fingerprint(target / ".metadata")
        where.write_text(json.dumps(meta))
    return change


class _Runs:
    """A pickle that runs a command when it is loaded, as a hostile .metadata would (it makes $RAN_FLAG)."""

    def __reduce__(self):
        return (os.system, ('touch "$RAN_FLAG"',))


def _storage(**change):
    def edit(md):
        import dataclasses
        key = next(iter(md.storage_data))
        md.storage_data[key] = dataclasses.replace(md.storage_data[key], **change)
    return edit


def _storage_set(value):
    def edit(md):
        md.storage_data[next(iter(md.storage_data))] = value
    return edit


FILES = ("files", ".metadata")
# (the DCP checkpoint changed) -> words of the refusal
DCP_CASES = {
    "listing-missing": (lambda t: (t / "parasim.json").unlink(), "parasim.json is missing"),
    "listing-nan": (lambda t: (t / "parasim.json").write_text('{"step": NaN}'), "NaN is not a JSON number"),
    "format": (_listing(_set("format", "parasim-checkpoint")), 'format must be "parasim-dcp"'),
    "step-missing": (_listing(_drop("step")), "parasim.json: step is missing"),
    "step-negative": (_listing(_set("step", -4)), "parasim.json: step must be a whole number from 0"),
    "total-text": (_listing(_set("total", "5")), "parasim.json: total must be a whole number"),
    "keys-object": (_listing(_set("keys", {})), "parasim.json: keys must be a list"),
    "keys-twice": (_listing(_set("keys", ["w", "w"])), "parasim.json: keys names a weight twice"),
    "bytes-missing": (_listing(_drop(*FILES, "bytes")), 'parasim.json: files[".metadata"].bytes is missing'),
    "bytes-negative": (_listing(_set(*FILES, "bytes", -1)), 'files[".metadata"].bytes must be a whole number'),
    "sha-missing": (_listing(_drop(*FILES, "sha256")), 'files[".metadata"].sha256 is missing'),
    "file-escapes": (_listing(lambda m: m["files"].update({"../../etc/passwd": m["files"]["__0_0.distcp"]})),
                     'files["../../etc/passwd"] is not a plain file name inside the checkpoint\'s folder'),
    "no-metadata": (_listing(lambda m: m["files"].pop(".metadata")), "files does not list .metadata"),
    "pickle-runs-code": (_metadata_pickle(lambda md: _Runs()),
                         ".metadata cannot be read safely: UnpicklingError: it names posix.system"),
    "pickle-not-metadata": (_metadata_pickle(lambda md: {"a": 1}), ".metadata is not DCP's metadata"),
    "storage-escapes": (_metadata_pickle(_storage(relative_path="../../etc/passwd")),
                        '.metadata reads from "../../etc/passwd", which parasim.json does not list'),
    "storage-past-end": (_metadata_pickle(_storage(offset=10**9)), ".metadata reads "),
    "storage-overhangs": (_metadata_pickle(_storage(length=10**9)), ".metadata reads 1000000000 bytes at 0 of"),
    "storage-bool": (_metadata_pickle(_storage(offset=True)), ".metadata reads "),
    "storage-not-dcp": (_metadata_pickle(_storage_set(7)), ".metadata has a storage entry that is not DCP's (int)"),
    "storage-path-int": (_metadata_pickle(_storage(relative_path=5)),
                         ".metadata has a storage entry that is not DCP's (_StorageInfo)"),
    "metadata-list": (_metadata_pickle(lambda md: setattr(md, "state_dict_metadata", [])),
                      ".metadata is not DCP's metadata"),
    "storage-negative": (_metadata_pickle(_storage(length=-5)), ".metadata reads -5 bytes"),
    "shard-missing": (lambda t: (t / "__0_0.distcp").unlink(), "shard __0_0.distcp is missing"),
    "shard-truncated": (lambda t: (t / "__0_0.distcp").write_bytes((t / "__0_0.distcp").read_bytes()[:-1]),
                        "shard __0_0.distcp is truncated"),
    "shard-corrupt": (lambda t: (t / "__0_0.distcp").write_bytes(bytes(b ^ 1 for b in (t / "__0_0.distcp")
                                                                        .read_bytes())),
                      "shard __0_0.distcp is corrupt: its SHA-256 differs from parasim.json's"),
}


@pytest.mark.parametrize("case", sorted(DCP_CASES))
def test_a_dcp_checkpoint_is_checked_before_dcp_reads_it(tmp_path, monkeypatch, case):
    from parasim.dp.checkpoint_dcp import verify_dcp
    change, words = DCP_CASES[case]
    target, flag = _dcp(tmp_path), tmp_path / "ran"
    monkeypatch.setenv("RAN_FLAG", str(flag))
    assert verify_dcp(target)["step"] == 4
    change(target)
    text = _refusal(target, call=verify_dcp)
    assert text.startswith(f"checkpoint {target}: ") and words in text
    assert not flag.exists()  # nothing in the pickle ran


def test_dcp_shapes_other_than_the_models_are_refused_before_dcp_allocates(tmp_path):
    from parasim.dp.checkpoint_dcp import check_dcp_shapes, verified_dcp
    target = _dcp(tmp_path)
    _, md = verified_dcp(target)
    check_dcp_shapes(target, md, {"model.w": (3,), "optim.m": (5,)})
    with pytest.raises(UsageError, match=r"\.metadata gives model\.w the shape \(3,\), the model here needs \(4,\)"):
        check_dcp_shapes(target, md, {"model.w": (4,)})
    with pytest.raises(UsageError, match=r"\.metadata gives optim\.v no tensor, the model here needs \(5,\)"):
        check_dcp_shapes(target, md, {"optim.v": (5,)})


def test_a_dcp_save_replaces_a_dcp_checkpoint_and_nothing_else(tmp_path):
    """commit_dcp puts the new directory where an older DCP checkpoint was; a folder that is not one is
    left as it is, and what went wrong comes back as one line."""
    torch = pytest.importorskip("torch")
    import warnings

    import torch.distributed.checkpoint as dcp
    from parasim.dp import checkpoint_dcp as cd
    target = _dcp(tmp_path)

    class Later(_Opt):
        t = 9
    again = tmp_path / ".dcp.tmp-2-abcdefgh"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model.w": torch.ones(3, dtype=torch.float64), "step": 9}, checkpoint_id=str(again))
    assert cd.commit_dcp(again, target, Later()) is None
    assert cd.verify_dcp(target)["step"] == 9 and not again.exists()
    other, plain = tmp_path / ".dcp.tmp-3-abcdefgh", tmp_path / "mine"
    other.mkdir()
    plain.mkdir()
    (plain / "notes.txt").write_text("keep me")
    got = cd.commit_dcp(other, plain, Later())
    assert got == f"UsageError: {plain} exists and is not a parasim DCP checkpoint; it is not replaced"
    assert (plain / "notes.txt").read_text() == "keep me" and other.exists()

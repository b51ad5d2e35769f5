"""Sharded checkpoints: saved after step K on one layout and resumed on two others, training goes on to
the weights uninterrupted training reaches (computed apart, with no checkpoint); a damaged checkpoint is
refused in one line naming the file, and a save that dies leaves the previous checkpoint whole. On real
ranks (gloo) the same through torch.distributed.checkpoint, read back by torch's own converter."""
import json
import os
from functools import partial

import numpy as np
import pytest

import parasim
from parasim.dp import checkpoint_format
from parasim.dp.checkpoint import restore, save_checkpoint, shard_state, verify_checkpoint
from parasim.dp.sharded import ShardedAdam
from parasim.errors import UsageError
from parasim.layout import Layout, ModelSpec
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import Stack, TransformerLayer, layer_weights

SHAPE = ModelSpec(hidden=8, heads=2, ffn=16)
LR, BATCH, K, MORE = 0.01, 4, 2, 2  # 4 sequences a step; save after step 2, then 2 more
# The key bias's gradient is zero in exact arithmetic (softmax ignores a shift all keys share): what is left
# is rounding, which differs with the layout's summation order. Adam divides it by sqrt(v) + eps, so a
# tiny eps would turn that rounding into updates of 1e-10; 1e-4 keeps them far below the tolerance.
EPS = 1e-4


def _model(ctx):
    tp = ParallelContext.from_layout(ctx) if ctx.layout is not None else ParallelContext(ctx)
    return Stack([TransformerLayer(tp, SHAPE, layer_weights(ctx, SHAPE, f"L{i}"), key=f"L{i}") for i in range(2)])


def _grads(ctx, params, step, dp):
    """The gradient of the mean loss over this rank's sequences of the step's batch (a fresh model holding
    `params`, so nothing accumulates from the step before)."""
    stack = _model(ctx)
    stack.load(params)
    n, r = dp.size, dp.group_rank(ctx.rank)
    assert BATCH % n == 0  # equal parts, or the group's average of means is not the batch's mean
    mine = range(r * BATCH // n, (r + 1) * BATCH // n)
    for s in mine:
        y, cache = stack.forward(ctx.shared_rng(f"x{step}.{s}").normal((4, 1, SHAPE.hidden)), Saved())
        stack.backward(cache, ctx.shared_rng(f"t{step}.{s}").normal((4, 1, SHAPE.hidden)))
    return {k: g / len(mine) for k, g in stack.grads.items()}


def _train(ctx, params, opt, dp, first, steps):
    for step in range(first, first + steps):
        params = opt.step(_grads(ctx, params, step, dp))
    return params


def _uninterrupted(steps):
    """One device, every sequence, no checkpoint: the weights after `steps` steps."""
    def program(ctx):
        one = ctx.new_group([0], "dp")
        stack = _model(ctx)
        return _train(ctx, stack.params(), ShardedAdam(ctx, one, stack.params(), 0, lr=LR, eps=EPS), one, 0, steps)
    return parasim.run(program, 1).values[0]


def _save(path, layout, stage, bucket=None, steps=K):
    def program(ctx):
        dp, stack = ctx.groups["dp-cp"], _model(ctx)
        opt = ShardedAdam(ctx, dp, stack.params(), stage, lr=LR, bucket=bucket, eps=EPS)
        stack.load(_train(ctx, stack.params(), opt, dp, 0, steps))
        return shard_state(ctx, stack, opt)
    return save_checkpoint(path, parasim.run(program, layout=layout).values)


def _resume(path, layout, stage, bucket=None):
    def program(ctx):
        dp, stack = ctx.groups["dp-cp"], _model(ctx)
        opt = ShardedAdam(ctx, dp, stack.params(), stage, lr=LR, bucket=bucket, eps=EPS)
        step = restore(ctx, path, stack, opt)
        return step, _train(ctx, stack.params(), opt, dp, step, MORE)
    return parasim.run(program, layout=layout).values


def _same(got, want):
    assert set(got) == set(want)
    for k in want:
        assert np.max(np.abs(np.asarray(got[k]) - want[k])) < 1e-12, k


# (save layout, stage, bucket) -> two (resume layout, stage, bucket)
RESHARD = {
    "zero1 dp 4": ((Layout(dp=4), 1, 100), [(Layout(dp=2), 1, 64), (Layout(dp=1), 0, None)]),
    "tp 2 x dp 2": ((Layout(tp=2, dp=2), 1, 50), [(Layout(dp=1), 0, None), (Layout(dp=2), 2, 30)]),
}


@pytest.mark.parametrize("case", sorted(RESHARD))
def test_resumed_on_other_layouts_matches_uninterrupted_training(tmp_path, case):
    want = _uninterrupted(K + MORE)
    (layout, stage, bucket), others = RESHARD[case]
    path = _save(tmp_path / "ckpt", layout, stage, bucket)
    assert verify_checkpoint(path)["step"] == K
    for layout2, stage2, bucket2 in others:
        for step, got in _resume(path, layout2, stage2, bucket2):
            assert step == K
            _same(got, want)


def test_the_metadata_describes_the_whole_tensors(tmp_path):
    """Global shapes (the fused QKV whole: 8 x 24), placements, each chunk's place, a checksum per file."""
    path = _save(tmp_path / "ckpt", Layout(tp=2, dp=2), 1, 50)
    meta = json.loads((tmp_path / "ckpt" / "metadata.json").read_text())
    qkv = meta["tensors"]["model/L0.attn.qkv.weight"]
    assert qkv["shape"] == [8, 24] and qkv["placement"] == {"tp": "Shard(dim=1)"}
    # TP rank 1 holds q head 1, k head 1, v head 1: three runs of 4 columns
    assert sorted(c["index"][1] for c in qkv["chunks"]) == [[[0, 4], [8, 12], [16, 20]], [[4, 8], [12, 16], [20, 24]]]
    assert meta["step"] == K and sorted(meta["files"]) == [f"rank{r}.npz" for r in range(4)]
    for name, f in meta["files"].items():
        assert f["bytes"] == os.path.getsize(path + "/" + name) and len(f["sha256"]) == 64


def _refused(path, match):
    with pytest.raises(UsageError, match=match) as info:
        verify_checkpoint(path)
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match=match):  # and in a run, the same error (no traceback of a rank)
        _resume(path, Layout(dp=2), 1)
    return str(info.value)


def test_a_truncated_missing_or_corrupt_shard_is_refused_naming_it(tmp_path):
    path = _save(tmp_path / "ckpt", Layout(dp=4), 1, 100)
    shard = tmp_path / "ckpt" / "rank2.npz"
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    assert "rank2.npz is truncated" in _refused(path, "rank2.npz is truncated")
    shard.write_bytes(data[:500] + bytes([data[500] ^ 1]) + data[501:])
    _refused(path, "rank2.npz is corrupt")
    shard.unlink()
    _refused(path, "rank2.npz is missing")


def test_a_metadata_file_naming_a_wrong_shape_is_refused(tmp_path):
    path = _save(tmp_path / "ckpt", Layout(dp=2), 1)
    where = tmp_path / "ckpt" / "metadata.json"
    meta = json.loads(where.read_text())
    meta["tensors"]["optim/m/L1.mlp.fc1.weight"]["shape"] = [8, 99]
    where.write_text(json.dumps(meta))
    with pytest.raises(UsageError, match=r"metadata.json gives optim/m/L1.mlp.fc1.weight the shape \(8, 99\), "
                                         r"the model here needs \(8, 16\)"):
        _resume(path, Layout(dp=2), 1)
    meta["tensors"]["optim/m/L1.mlp.fc1.weight"]["shape"] = [8, 3]
    where.write_text(json.dumps(meta))
    _refused(path, "metadata.json: a chunk of optim/m/L1.mlp.fc1.weight in rank\\d.npz lies outside its shape")


def test_a_save_that_dies_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = _save(tmp_path / "ckpt", Layout(dp=4), 1, 100)
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    real, written = checkpoint_format._write_shard, []

    def dies_after_two(where, arrays):
        if len(written) == 2:
            raise OSError("disk full (simulated)")
        real(where, arrays)
        written.append(where)
    monkeypatch.setattr(checkpoint_format, "_write_shard", dies_after_two)
    with pytest.raises(OSError, match="simulated"):
        _save(tmp_path / "ckpt", Layout(dp=4), 1, 100, steps=K + 1)
    assert len(written) == 2 and not any(p.exists() for p in written)  # the half-written copy is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before
    assert verify_checkpoint(path)["step"] == K
    monkeypatch.undo()
    _save(tmp_path / "ckpt", Layout(dp=4), 1, 100, steps=K + 1)  # a save that completes replaces it
    assert verify_checkpoint(path)["step"] == K + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_save_that_dies_between_its_two_renames_still_leaves_the_old_checkpoint_readable(tmp_path, monkeypatch):
    """The old checkpoint is moved aside before the new one is moved in: a crash in between leaves nothing
    at the path, and the reader takes the old one from where it waits."""
    path = _save(tmp_path / "ckpt", Layout(dp=4), 1, 100)
    real, calls = checkpoint_format.os.rename, []

    def dies_on_the_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("power cut (simulated)")
        real(src, dst)
    monkeypatch.setattr(checkpoint_format.os, "rename", dies_on_the_second)
    with pytest.raises(OSError, match="simulated"):
        _save(tmp_path / "ckpt", Layout(dp=4), 1, 100, steps=K + 1)
    monkeypatch.undo()
    assert not (tmp_path / "ckpt").exists()
    assert verify_checkpoint(path)["step"] == K


# -- real ranks: torch.distributed.checkpoint -------------------------------------------------------------
def _dcp_save(path, stage, bucket, ctx):
    from parasim.dp.checkpoint_dcp import save_dcp
    dp, stack = ctx.new_group(range(ctx.world), "dp"), _model(ctx)
    opt = ShardedAdam(ctx, dp, stack.params(), stage, lr=LR, bucket=bucket, eps=EPS)
    stack.load(_train(ctx, stack.params(), opt, dp, 0, K))
    save_dcp(ctx, path, stack, opt)


def _dcp_resume(path, stage, bucket, ctx):
    from parasim.dp.checkpoint_dcp import restore_dcp
    dp, stack = ctx.new_group(range(ctx.world), "dp"), _model(ctx)
    opt = ShardedAdam(ctx, dp, stack.params(), stage, lr=LR, bucket=bucket, eps=EPS)
    step = restore_dcp(ctx, path, stack, opt)
    return step, _train(ctx, stack.params(), opt, dp, step, MORE)


@pytest.mark.slow
def test_real_ranks_save_with_dcp_and_resume_on_other_layouts(tmp_path):
    """ZeRO-1 over 4 gloo ranks with buckets, saved by DCP; torch's own converter reads it whole; resumed
    as ZeRO-1 over 2 ranks and as DP on 1, training ends where uninterrupted training does."""
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    path = str(tmp_path / "dcp")
    (tmp_path / f".dcp.tmp-{2**31 - 1}-abcdefgh").mkdir()  # what a save killed part way left (no such pid)
    parasim.run(partial(_dcp_save, path, 1, 100), 4, backend="gloo", timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp"]  # the save removed it
    dcp_to_torch_save(path, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    at_k = _uninterrupted(K)
    assert whole["step"] == K and tuple(whole["optim.m"].shape) == (sum(v.size for v in at_k.values()),)
    _same({k: whole[f"model.{k}"].numpy() for k in at_k}, at_k)
    want = _uninterrupted(K + MORE)
    for n, stage, bucket in ((2, 1, 64), (1, 0, None)):
        for step, got in parasim.run(partial(_dcp_resume, path, stage, bucket), n, backend="gloo", timeout=60).values:
            assert step == K
            _same(got, want)
    shard = tmp_path / "dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-8])
    from parasim.dp.checkpoint_dcp import verify_dcp
    with pytest.raises(UsageError, match=r"shard __1_0.distcp is truncated") as info:
        verify_dcp(path)
    assert "\n" not in str(info.value)


class _Layer:
    """A layer as the checkpoint reads it: a key, a parallel context (or none), nothing else."""

    def __init__(self, par):
        self.key, self.par = "L0", par


class _Model:
    def __init__(self, tp, **placed):
        self.layers = [_Layer(tp)] if tp != "no attribute" else [type("Bare", (), {"key": "L0"})()]
        self.placements = placed
        self.shapes = {k: (4, 6) for k in placed}

    def params(self):
        return {k: np.zeros(s) for k, s in self.shapes.items()}


def test_a_piece_lies_where_its_tp_and_etp_places_say():
    """A weight cut over etp on dim 1 at expert-TP rank 1 of 2 is columns 6-11 of a (4, 12) whole; one cut
    over tp on dim 0 at TP rank 2 of 3 is rows 8-11 of a (12, 6) whole. A model without a parallel context
    (no `par`, or one that is not a ParallelContext) holds whole weights."""
    from types import SimpleNamespace

    from parasim.dp.checkpoint import Region, regions
    from parasim.layout.placement import Replicate, Shard
    tp = SimpleNamespace(tp_world_size=3, tp_rank=2, etp_world_size=2, etp_rank=1)
    got = regions(_Model(tp, w1={"etp": Shard(1)}, w2={"tp": Shard(0)}, b={"tp": Replicate()}))
    assert got == {"w1": Region((4, 12), [[(0, 4)], [(6, 12)]]), "w2": Region((12, 6), [[(8, 12)], [(0, 6)]]),
                   "b": Region((4, 6), [[(0, 4)], [(0, 6)]])}
    for bare in ("no attribute", None, 7):
        assert regions(_Model(bare, w1={"etp": Shard(1)})) == {"w1": Region((4, 6), [[(0, 4)], [(0, 6)]])}

"""A checkpoint saved on one layout and resumed on another: both data-parallel groups must be right.

A small MoE model (layer 1 dense, layer 2 with four experts) trains two Adam steps on layout A: the
dense weights TP2 x DP2 with SP, the experts EP4 (one per GPU, so expert-DP has one rank). ZeRO-1 splits
each weight's Adam state over that weight's own data-parallel group: dp-cp for dense weights, expert-dp
for experts. Each rank then describes what it holds against the whole tensors (dp/checkpoint.py), and
the checks write the checkpoint into a temporary folder, resume it on layout B (no TP, dense DP4, experts
EP2 x EDP2) and train two more steps: loss and weights equal one device's that ran all four steps with
its own Adam. Resuming with the experts' Adam state sliced over dp-cp, as an optimizer that knows one
group would, gives no error and wrong weights: the checks compute those too.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from parasim.dp.checkpoint import (
    regions,
    restore,
    save_checkpoint,
    shard_state,
    verify_checkpoint,
)
from parasim.dp.checkpoint_format import CheckpointReader, Chunk, RankShard
from parasim.dp.zero import Zero1Adam
from parasim.engine import run
from parasim.errors import UsageError
from parasim.layout import Layout, ModelSpec
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import Stack, TransformerLayer, layer_weights
from parasim.layout.placement import is_expert

# No biases: the attention's key bias has a zero gradient in exact arithmetic, and Adam would turn the
# rounding left in its place (which differs from layout to layout) into whole steps.
MODEL = ModelSpec(name="tiny-moe", hidden=8, heads=2, ffn=16, experts=4, top_k=2, expert_ffn=8, layers=2,
                  dense_layers=1, bias=False, seq=8)
A = Layout(tp=2, dp=2, ep=4, etp=1, sp=True, model=MODEL)  # dense TP2 x DP2 (+SP); experts EP4 x EDP1
B = Layout(tp=1, dp=4, ep=2, etp=1, model=MODEL)  # dense DP4; experts EP2 x EDP2
SEQUENCES = 4  # per step, split over the dense data-parallel ranks
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
SAVED_AT, MORE = 2, 2  # steps on A before the save, steps on B after the resume
SHOWN = ("L0.attn.qkv.weight", "L0.mlp.fc2.weight", "L0.ln1.weight", "L1.moe.router", "L1.moe.expert1.w1",
         "L1.moe.expert4.w2")  # the table's rows: a weight of every kind


def _shape(i: int) -> ModelSpec:
    """Layer i's shape: a dense MLP for the leading dense layers, the experts after."""
    return replace(MODEL, experts=0, top_k=None, dense_layers=0) if i < MODEL.dense_layers else MODEL


def build(ctx: Any, tp: ParallelContext) -> Stack:
    """The model on this rank: its pieces under `tp` (its TP shards, its experts), drawn whole alike everywhere."""
    return Stack([TransformerLayer(tp, _shape(i), layer_weights(ctx, _shape(i), f"L{i}"), key=f"L{i}",
                                   name=f"layer {i + 1}") for i in range(MODEL.layers)])


def data_group(placed: dict) -> str:
    """The group a weight's copies see different data over, so where its gradient is summed and its Adam
    state split: an expert is held only by the ranks of its expert-dp group, a dense weight by dp-cp."""
    return "expert-dp" if is_expert(placed) else "dp-cp"


def optimizers(ctx: Any, model: Stack, expert_group: str | None = None) -> dict[str, Zero1Adam]:
    """One ZeRO-1 Adam per data-parallel group, keyed by the group its weights belong to; `expert_group`
    overrides the experts' group (the silent bug: "dp-cp")."""
    params, placed, keys = model.params(), model.placements, {}
    for k in params:
        keys.setdefault(data_group(placed[k]), []).append(k)
    over = {g: expert_group if g == "expert-dp" and expert_group else g for g in keys}
    return {g: Zero1Adam(ctx, ctx.groups[over[g]], {k: params[k] for k in ks}, lr=LR, betas=BETAS, eps=EPS,
                         name=f"ZeRO-1 over {over[g]}") for g, ks in keys.items()}


def _batch(ctx: Any, what: str, step: int, ids: range) -> Any:
    """Sequences `ids` of a step side by side, [seq, len(ids), hidden], drawn alike on every rank."""
    return ctx.xp.concat([ctx.shared_rng(f"{what}{step}.{i}").normal((MODEL.seq, 1, MODEL.hidden)) for i in ids],
                         axis=1)


def train_step(ctx: Any, tp: ParallelContext, model: Stack, opts: dict[str, Zero1Adam], step: int) -> float:
    """One Adam step on this rank's share of the step's sequences (its DP share, then its SP rows); the loss
    is sum(y * target) / SEQUENCES, so summing gradients over each group gives the whole batch's. Returns
    this rank's part of the loss."""
    xp, per = ctx.xp, SEQUENCES // ctx.layout.dp
    mine = range(ctx.coords.dp * per, (ctx.coords.dp + 1) * per)
    rows = xp.asarray(tp.token_positions(), dtype=xp.int64)
    x = xp.take(_batch(ctx, "x", step, mine), rows, axis=0)
    target = xp.take(_batch(ctx, "t", step, mine), rows, axis=0) / SEQUENCES
    for layer in model.layers:
        layer.zero_grad()
    y, caches = model.forward(x, Saved())
    model.backward(caches, target)
    grads, new = model.grads, {}
    for opt in opts.values():
        new.update(opt.step({k: grads[k] for k in opt.keys})[0])
    model.load(new)
    return float(xp.sum(y * target))


# -- what a rank holds, said against the whole tensors ----------------------------------------------------
def _runs(index: list) -> str:
    """[[(0, 8)], [(0, 4), (8, 12)]] -> "[0:8, 0:4+8:12]": per dim the runs of the whole a piece covers."""
    return "[" + ", ".join("+".join(f"{lo}:{hi}" for lo, hi in runs) for runs in index) + "]"


def holdings(model: Stack, shards: list[RankShard], saving: bool) -> list[dict]:
    """The table's rows this rank holds: the whole tensor's shape, the piece of it held (`regions`), the
    stretch of that piece (flat) whose master copy, m and v this rank's ZeRO share keeps, and when
    `saving`, whether this rank writes the piece (a copy held over a DP group is written by its first rank)."""
    where, rows = regions(model), []
    written = {c.tensor[len("model/"):] for s in shards for c in s.chunks if c.tensor.startswith("model/")}
    state = {c.tensor[len("optim/master/"):]: c.flat for s in shards for c in s.chunks
             if c.tensor.startswith("optim/master/")}
    for k in SHOWN:
        if k in where:
            size = int(np.prod([sum(hi - lo for lo, hi in runs) for runs in where[k].index]))
            lo, hi = state.get(k, (0, 0))
            rows.append({"tensor": k, "whole": list(where[k].shape), "weights": _runs(where[k].index),
                         **({"writes them": k in written} if saving else {}),
                         "adam state": f"{lo}:{hi} of {size}" if hi > lo else "none"})
    return rows


def _experts(model: Stack) -> str:
    """The experts this rank holds, by number: "1", "1 and 2"."""
    held = sorted({int(k.split(".")[2][len("expert"):]) for k in model.params() if ".moe.expert" in k})
    return " and ".join(map(str, held))


def _shares(opts: dict[str, Zero1Adam]) -> str:
    """What this rank's optimizers keep, in words: per group, its slice of the group's flat buffer."""
    parts = []
    for opt in opts.values():
        lo, hi = opt.ranges()[0]
        parts.append(f"values {lo}:{hi} of the {opt.buf.total} over {opt.group.name} "
                     f"({opt.group.size} rank{'s' if opt.group.size > 1 else ''})")
    return "; ".join(parts)


def _file(shards: dict[str, RankShard]) -> dict:
    """Both optimizers' parts of one rank (by group) as the one file it writes, in plain values (JSON shows
    them): every tensor it describes, every chunk, and each optimizer's settings under its group's name."""
    parts = list(shards.values())
    return {"rank": parts[0].rank, "step": parts[0].step,
            "tensors": {k: v for s in parts for k, v in s.tensors.items()},
            "chunks": [{"tensor": c.tensor, "index": c.index, "flat": list(c.flat), "data": c.data}
                       for s in parts for c in s.chunks],
            "info": {f"{g} {k}": v for g, s in shards.items() for k, v in s.info.items()}}


def program(ctx: Any) -> dict:
    """Train on A, describe this rank's part of the checkpoint, and work out what it will read on B."""
    ctx.use_layout(A)
    tp = ParallelContext.from_layout(ctx, A)
    model = build(ctx, tp)
    opts = optimizers(ctx, model)
    ctx.phase("train on layout A", layout=str(A))
    losses = [train_step(ctx, tp, model, opts, s) for s in range(SAVED_AT)]
    ctx.phase("save")
    shards = {g: shard_state(ctx, model, opt) for g, opt in opts.items()}
    ctx.compute("describe this rank's file: its pieces of the whole tensors")
    dense = "its TP pieces of the dense weights" if ctx.groups["dp-cp"].group_rank(ctx.rank) == 0 else \
        "no dense weight (its DP peer writes the copy)"
    ctx.note(f"writes rank{ctx.rank}.npz: {dense}, expert {_experts(model)}; Adam's {_shares(opts)}")
    wrote = holdings(model, list(shards.values()), saving=True)
    ctx.phase("plan the resume on layout B")
    ctx.use_layout(B)  # nothing of A is needed: B's pieces and shares follow from B alone
    tp_b = ParallelContext.from_layout(ctx, B)
    model_b = build(ctx, tp_b)
    opts_b = optimizers(ctx, model_b)
    ctx.compute("work out which pieces of the whole tensors this rank reads")
    ctx.note(f"reads the whole dense weights, experts {_experts(model_b)}; Adam's {_shares(opts_b)}")
    shards_b = [shard_state(ctx, model_b, opt) for opt in opts_b.values()]
    reads = holdings(model_b, shards_b, saving=False)
    return {"losses": losses, "adam values": {g: opt.state_elements for g, opt in opts.items()}, "wrote": wrote,
            "reads on B": reads, "file": _file(shards), "A": _layout_part(model, opts, list(shards.values())),
            "B": _layout_part(model_b, opts_b, shards_b)}


def _layout_part(model: Stack, opts: dict[str, Zero1Adam], shards: list[RankShard]) -> dict:
    """What this rank holds on one layout, for the tables: its experts, its share of each optimizer's flat
    buffer ([lo, hi), the buffer's size), each dense weight's piece against the whole (sizes), and the pieces
    whose values it keeps (the weights it holds; its Adam share, as master-copy chunks)."""
    params, placed, where = model.params(), model.placements, regions(model)
    return {
        "experts": _experts(model),
        "shares": {g: [*opt.ranges()[0], opt.buf.total] for g, opt in opts.items()},
        "dense pieces": {k: [int(np.prod(x.shape)), int(np.prod(where[k].shape))] for k, x in params.items()
                         if not is_expert(placed[k])},
        "keeps": [{"tensor": f"model/{k}", "index": where[k].index, "flat": [0, int(np.prod(x.shape))]}
                  for k, x in params.items()]
        + [{"tensor": c.tensor, "index": c.index, "flat": list(c.flat)} for sh in shards for c in sh.chunks
           if c.tensor.startswith("optim/master/")],
    }


# -- the checks: write, resume on B, and one device -------------------------------------------------------
def rank_shard(file: dict) -> RankShard:
    """A rank's part back from the plain values the program returned (`_file`), for the writer."""
    tensors = file["tensors"]
    chunks = [Chunk(c["tensor"], c["index"], tuple(c["flat"]),
                    np.asarray(c["data"], dtype=tensors[c["tensor"]]["dtype"])) for c in file["chunks"]]
    return RankShard(file["rank"], file["step"], tensors, chunks, file["info"])


def save(values: list[dict], folder: Path) -> str:
    """The ranks' parts written as one checkpoint in `folder` (virtual ranks share this process, so one
    writer takes every rank's part: save_checkpoint writes rank<r>.npz for each, and metadata.json)."""
    return save_checkpoint(folder / "checkpoint", [rank_shard(v["file"]) for v in values])


def resume(path: str, expert_group: str | None = None) -> Callable[[Any], dict]:
    """The program that resumes `path` on layout B and trains MORE steps; `expert_group`: the experts'
    optimizer over another group (the silent bug)."""
    def resumed(ctx: Any) -> dict:
        ctx.use_layout(B)
        tp = ParallelContext.from_layout(ctx, B)
        model = build(ctx, tp)
        opts = optimizers(ctx, model, expert_group)
        (step,) = {restore(ctx, path, model, opt) for opt in opts.values()}  # both saved after one step
        restored = {g: {"keys": opt.keys, "range": opt.ranges()[0], "master": opt.master, "m": opt.m, "v": opt.v}
                    for g, opt in opts.items()}  # before training on: what restore put in place
        losses = [train_step(ctx, tp, model, opts, s) for s in range(step, step + MORE)]
        return {"step": step, "restored": restored, "losses": losses, "weights": model.params(),
                "adam values": {g: opt.state_elements for g, opt in opts.items()}}
    return resumed


def reference(steps: int) -> dict:
    """One device, every sequence, every expert, and Adam written out here (not the optimizers under test):
    the loss of each step, the weights and Adam's moments after step SAVED_AT, the weights at the end."""
    def one(ctx: Any) -> dict:
        xp, (b1, b2) = ctx.xp, BETAS
        model = build(ctx, ParallelContext(ctx))
        w = model.params()
        m, v = {k: xp.zeros_like(x) for k, x in w.items()}, {k: xp.zeros_like(x) for k, x in w.items()}
        losses, at_save = [], {}
        for t in range(1, steps + 1):
            for layer in model.layers:
                layer.zero_grad()
            target = _batch(ctx, "t", t - 1, range(SEQUENCES)) / SEQUENCES
            y, caches = model.forward(_batch(ctx, "x", t - 1, range(SEQUENCES)), Saved())
            model.backward(caches, target)
            losses.append(float(xp.sum(y * target)))
            for k, g in model.grads.items():
                m[k], v[k] = b1 * m[k] + (1 - b1) * g, b2 * v[k] + (1 - b2) * g * g
                w[k] = w[k] - LR * (m[k] / (1 - b1 ** t)) / (xp.sqrt(v[k] / (1 - b2 ** t)) + EPS)
            model.load(w)
            if t == SAVED_AT:
                at_save = {"master": dict(w), "m": dict(m), "v": dict(v)}
        return {"losses": losses, "at save": at_save, "weights": w}
    return run(one, 1).values[0]


@contextmanager
def scratch_folder() -> Iterator[Path]:
    """A fresh temporary folder for the checkpoint, removed afterwards. Never the current folder, where
    tempfile goes when no temporary folder is writable: the lesson stops in one line instead."""
    asked = [os.environ.get(n) for n in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp", "/usr/tmp"]
    try:
        base = Path(tempfile.gettempdir()).resolve()
        if base == Path.cwd().resolve() and not any(p and Path(p).resolve() == base for p in asked):
            raise OSError("no writable temporary folder (tempfile would use the current one)")
        folder = Path(tempfile.mkdtemp(prefix="parasim-checkpoint-", dir=base))
    except OSError as exc:
        raise UsageError(f"the checkpoint lesson saves into a temporary folder and cannot make one: "
                         f"{exc.strerror or exc}; set TMPDIR to a writable folder") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _off(got: dict, want: dict) -> float:
    """The largest difference between two sets of named tensors, over the names `got` holds."""
    return max(float(np.max(np.abs(np.asarray(got[k], dtype=float) - np.asarray(want[k], dtype=float)))) for k in got)


def _restored_off(ranks: list[dict], at_save: dict) -> float:
    """How far the Adam state each rank of B restored lies from one device's after the save, cut as its
    share: the group's weights flat in name order, zero padded, values [lo, hi)."""
    worst = 0.0
    for x in ranks:
        for share in x["restored"].values():
            lo, hi = share["range"]
            for s in ("master", "m", "v"):
                flat = np.concatenate([np.ravel(at_save[s][k]) for k in share["keys"]])
                flat = np.concatenate([flat, np.zeros(max(0, hi - flat.size))])
                worst = max(worst, float(np.max(np.abs(np.asarray(share[s]) - flat[lo:hi]))))
    return worst


def checks(result: Any) -> list[Check]:
    v = result.values
    ref = reference(SAVED_AT + MORE)
    experts = sorted(k for k in ref["weights"] if ".moe.expert" in k)
    dense = sum(np.size(w) for k, w in ref["weights"].items() if k not in experts)
    # on A a rank holds half of each attention and MLP matrix (TP2), the norms and the router whole
    dense_a = sum(np.size(w) // (2 if ".attn." in k or ".mlp." in k else 1) for k, w in ref["weights"].items()
                  if k not in experts)
    one_expert = sum(np.size(ref["weights"][k]) for k in experts if ".expert1." in k)
    try:
        with scratch_folder() as folder:
            path = save(v, folder)
            listed = verify_checkpoint(path)
            reader = CheckpointReader(path)
            saved = {s: {k: reader.tensor(f"{'model' if s == 'weights' else 'optim/' + s}/{k}") for k in ref["weights"]}
                     for s in ("weights", "master", "m", "v")}
            right = run(resume(path), B.world).values
            wrong = run(resume(path, "dp-cp"), B.world).values
    except OSError as exc:  # the folder was made, but writing into it failed (a full or read-only disk)
        raise UsageError(f"the checkpoint lesson could not write its checkpoint: {exc.strerror or exc}") from None
    want_saved = {"weights": ref["at save"]["master"], **ref["at save"]}
    wrong_experts = max(_off({k: w for k, w in x["weights"].items() if k in experts}, ref["weights"]) for x in wrong)
    return [
        check("loss of steps 1-2 on A (the 4 ranks' parts added) = one device's",
              [sum(x["losses"][s] for x in v) for s in range(SAVED_AT)], ref["losses"][:SAVED_AT], rtol=1e-12),
        check("the checkpoint: its step and its files (one per rank of A)", [listed["step"], listed["files"]],
              [SAVED_AT, A.world]),
        check("weights, master copy, m and v, put together from the 4 files = one device's after step 2",
              max(_off(saved[s], want_saved[s]) for s in saved), 0.0, atol=1e-12),
        check("Adam values each rank keeps, dense then experts: on A over DP2 and EDP1, on B over DP4 and EDP2",
              [[x["adam values"]["dp-cp"], x["adam values"]["expert-dp"]] for x in v + right],
              [[3 * -(-dense_a // 2), 3 * one_expert]] * A.world + [[3 * -(-dense // 4), 3 * one_expert]] * B.world),
        check("the state each rank of B restored = one device's after step 2, cut to its shares",
              _restored_off(right, ref["at save"]), 0.0, atol=1e-12),
        check("loss of steps 3-4 on B = one device's", [sum(x["losses"][s] for x in right) for s in range(MORE)],
              ref["losses"][SAVED_AT:], rtol=1e-12),
        check("every weight on every rank of B after step 4 = one device's",
              max(_off(x["weights"], ref["weights"]) for x in right), 0.0, atol=1e-12),
        check(f"resumed with the experts' Adam state sliced over dp-cp: no error, expert weights off by "
              f"{wrong_experts:.3g} after step 4", wrong_experts > 1e-6, True),
    ]


# -- the tables: the training's calls by group; what A wrote and B reads, rank by rank -------------------------
def _elements(shape: list[int], index: list, flat: list[int]) -> set[int]:
    """The whole tensor's elements (flat, row-major) a chunk holds: the piece `index` cuts, flattened, [flat)."""
    whole = np.arange(int(np.prod(shape))).reshape(shape)
    rows = [np.concatenate([np.arange(lo, hi) for lo, hi in runs]) for runs in index]
    return set(whole[np.ix_(*rows)].ravel()[flat[0]:flat[1]].tolist())


def found_in(values: list[dict], rank: int, prefix: str) -> list[int]:
    """The ranks of A whose files hold some of the values rank `rank` of B keeps, of the tensors named
    `prefix`...: chunk against chunk, element by element."""
    written: dict[str, list[tuple[int, set[int]]]] = {}
    for v in values:
        tensors = v["file"]["tensors"]
        for c in v["file"]["chunks"]:
            if c["tensor"].startswith(prefix):
                written.setdefault(c["tensor"], []).append(
                    (v["file"]["rank"], _elements(tensors[c["tensor"]]["shape"], c["index"], c["flat"])))
    shapes = {k: t["shape"] for v in values for k, t in v["file"]["tensors"].items()}
    out = set()
    for c in values[rank]["B"]["keeps"]:
        if c["tensor"].startswith(prefix):
            want = _elements(shapes[c["tensor"]], c["index"], c["flat"])
            out |= {r for r, held in written.get(c["tensor"], []) if held & want}
    return sorted(out)


def _share(part: dict, group: str, experts: bool = False) -> str:
    """A rank's share of a group's flat buffer, "lo:hi of size", and for the experts' whose state it covers."""
    lo, hi, total = part["shares"][group]
    said = f"{lo}:{hi} of {total}"
    if experts:
        held = sorted({int(c["tensor"].split(".moe.expert")[1].split(".")[0]) for c in part["keeps"]
                       if c["tensor"].startswith("optim/master/") and ".moe.expert" in c["tensor"]})
        said += f", expert{'s' * (len(held) != 1)} {', '.join(map(str, held))}"
    return said


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _words(keys: list[str]) -> str:
    """The dense weights TP leaves whole, in words: the norms (weights and biases) and the rest by name."""
    norms = [k for k in keys if ".ln" in k]
    rest = sorted({k.split(".")[-1] for k in keys if k not in norms})
    return " and ".join(([f"the norms' {len(norms)} weights and biases"] if norms else [])
                        + [f"the {name}" for name in rest])


def tables(result: Any) -> list[Table]:
    v, trace = result.values, result.trace
    # the training on A: its calls by group, from the trace (one call a step makes on every group of a name)
    calls: dict[str, dict] = {}
    for e in trace.events:
        if e.phase == "train on layout A" and e.group is not None:
            g = calls.setdefault(e.group.name, {"groups": set(), "ops": {}, "sent": 0})
            g["groups"].add(tuple(e.group.ranks))
            g["ops"][e.op] = g["ops"].get(e.op, 0) + 1
            g["sent"] += sum(m.sent for m in e.members)
    train = [(f"{name} {' '.join(str(list(r)) for r in sorted(g['groups']))}",
              [", ".join(f"{n // len(g['groups']) // SAVED_AT} {op}" for op, n in sorted(g["ops"].items())),
               g["sent"] // SAVED_AT]) for name, g in calls.items()]
    rows = []
    for r, x in enumerate(v):
        a, b = x["A"], x["B"]
        cut = any(piece < whole for piece, whole in a["dense pieces"].values())
        dense_written = any(c["tensor"].startswith("model/") and ".moe.expert" not in c["tensor"]
                            for c in x["file"]["chunks"])
        wrote = ("its TP piece" if cut else "all") if dense_written else "none (its DP peer's)"
        rows.append((f"rank {r}: A wrote", [wrote, a["experts"].replace(" and ", ", "), _share(a, "dp-cp"),
                                            _share(a, "expert-dp", True), "-", "-"]))
        rows.append((f"rank {r}: B reads", ["all", b["experts"].replace(" and ", ", "), _share(b, "dp-cp"),
                                            _share(b, "expert-dp", True), _ranks(found_in(v, r, "model/")),
                                            _ranks(found_in(v, r, "optim/master/"))]))
    pieces = v[0]["A"]["dense pieces"]
    split = {k: p for k, p in pieces.items() if p[0] < p[1]}
    whole = {k: p for k, p in pieces.items() if p[0] == p[1]}
    a_total, b_total = v[0]["A"]["shares"]["dp-cp"][2], v[0]["B"]["shares"]["dp-cp"][2]
    half, cut_whole = sum(p[0] for p in split.values()), sum(p[1] for p in split.values())
    kept = sum(p[0] for p in whole.values())
    tp = cut_whole // half
    a_dp, b_dp = len(v) // tp, len(v)
    return [
        Table(f"Training on layout A: each step's collectives by group ({SAVED_AT} steps, from the trace)",
              ["group", "calls a step, on each group", "bytes sent a step (all ranks)"], train,
              notes=["ZeRO-1 sums each weight's gradient over its own data-parallel group: dp-cp pairs the ranks "
                     "that hold the same dense pieces; expert-dp has one rank per expert on A, so its calls move "
                     "nothing."]),
        Table("What each rank of A wrote, and what the same rank of B reads and where it finds it (the run)",
              ["rank", "dense weights", "experts", "Adam: dense share", "Adam: experts' share",
               "B's weights: in A's files of ranks", "B's Adam share: in A's files of ranks"], rows,
              notes=[f"Adam's share: values lo:hi of the flat buffer of a data-parallel group's weights, of its "
                     f"size. The dense buffers differ: {a_total} on A, {b_total} on B, and two of A's are not one "
                     f"of B's. On A a rank holds its 1/{tp} of the TP-split matrices ({half} of their {cut_whole} "
                     f"values) and, whole, what TP does not split, {_words(list(whole))} ({kept} values, a copy on "
                     f"each TP rank): {half} + {kept} = {half + kept}. On B (no TP) a rank holds every dense weight "
                     f"whole: {cut_whole} + {kept} = {cut_whole + kept}. So A's {tp} TP ranks together keep "
                     f"{tp} x {a_total} = {tp * a_total} = {b_total} + {(tp - 1) * kept}: the replicated {kept} "
                     f"once more. ZeRO-1 then splits each buffer over the dense DP group: {a_total} / {a_dp} = "
                     f"{a_total // a_dp} on A, {b_total} / {b_dp} = {b_total // b_dp} on B.",
                     "A's files: the ranks of A whose file holds some of the values this rank of B keeps, chunk "
                     "against chunk, element by element. B's reader puts each whole tensor together from every "
                     "file with a chunk of it, then cuts its own piece."]),
    ]


NARRATIVE = {
    "train on layout A": """
        Four GPUs, two ways of cutting the same model. The dense part (attention, norms, the router, layer
        1's MLP) is TP2 x DP2 with SP: each TP pair splits the fused QKV weight by heads and the MLP matrices
        by columns and rows, and the two pairs see different sequences. The four experts of layer 2 sit one
        per GPU (EP4), so no two GPUs hold the same expert and expert-DP has a single rank. ZeRO-1 follows
        each weight's own data-parallel group: the dense gradients are reduce-scattered over the DP pair and
        each GPU keeps Adam's state for half of them; an expert's gradient has no one to be summed with, and
        its GPU keeps all of that expert's state.""",
    "save": """
        No collective: each rank says what it holds in terms of the whole tensors. For a weight, the rows and
        columns of the whole its piece covers (QKV as three runs of columns, its Q, K and V heads); for
        Adam's master copy, m and v, the stretch of that piece its ZeRO share covers. A dense weight held in
        copies by a DP pair is written once, by the first of the pair; every optimizer share is written by
        the rank that keeps it, so the dense state arrives in halves and each expert's whole. The checkpoint
        is one file per rank plus metadata.json naming every whole tensor and where each chunk of it lies.
        Virtual ranks live in one process, so they hand their parts back and one writer puts the folder
        together, in a temporary folder the checks remove.""",
    "plan the resume on layout B": """
        Layout B drops TP and spreads the dense part over four data-parallel ranks; the experts go two per
        GPU (EP2: experts 1-2 on GPUs 0 and 2, 3-4 on GPUs 1 and 3), so expert-DP now has two ranks. Nothing
        about A is needed: each rank of B builds its model, asks which pieces it holds (the whole dense
        weights, its two experts) and which share ZeRO-1 gives it (a quarter of the dense state, half of its
        experts' state), and cuts those from the whole tensors of the checkpoint. The experts' state is split
        over expert-DP because only those ranks hold the expert and receive its summed gradient: slice it
        over the four dense DP ranks instead and the reduce-scatter that feeds it adds up gradients of other
        experts. The checks resume on B, train two more steps and hold every figure against one device.""",
}

LESSON = Lesson(
    fold_alike=True,
    # the training's first calls (SP's all-gather and reduce-scatter), the rest counted: its table says each
    # step's calls by group, and the save and the resume show their one step each
    events_shown=2,
    tables=tables,
    no_picture='its run is files on disk and their shards, which its lines list one by one',
    name="checkpoint",
    section="Beyond the post: saving on one layout, resuming on another",
    order=270,
    title="A checkpoint saved on TP2 x DP2 / EP4 and resumed on DP4 / EP2: both data-parallel groups",
    world=4,
    worlds=(4,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="train 2 steps on one layout, save, resume on another: weights and Adam state exact against one device",
    keep_values=0,
)

"""Tensor parallelism in attention: whole heads per rank, one all-reduce after the output projection,
two all-reduces forward and two backward per layer, and grouped-query attention with fewer kv heads
than ranks (each kv head then lives on several ranks)."""
from __future__ import annotations

import numpy as np

import parasim
from parasim.lesson import Check, Knob, Lesson, Picture, check
from parasim.render.plot_lessons import plot_head_split
from parasim.nn import Saved, ParallelContext
from parasim.nn.attention import AttentionWeights, HeadCounts, ParallelAttention
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec

S, B = 4, 1
WORLDS = (1, 2, 4, 8, 16)


def heads_of(world: int) -> int:
    """The model's heads: 4, or one a rank where there are more ranks (the post's GQA case, TP 16, needs 16)."""
    return max(4, world)


def hidden_of(world: int) -> int:
    return 2 * heads_of(world)  # two dimensions a head


def gqa_kv(world: int) -> int:
    """Fewer kv heads than ranks (when there is more than one rank), so kv heads are replicated: at TP 16,
    the post's 8 KV heads, each on two GPUs."""
    return max(1, world // 2)


def _attention(ctx, tp: ParallelContext, kv: int, key: str, world: int):
    H, HEADS = hidden_of(world), heads_of(world)
    shape = ModelSpec(hidden=H, heads=HEADS, kv_heads=kv)
    w = layer_weights(ctx, shape, key)
    attn = ParallelAttention(tp, AttentionWeights.of(w), HeadCounts(HEADS, kv), key=f"{key}.attn")
    x = ctx.shared_rng("x").normal((S, B, H))
    # tagged (its output projection marks what it makes, for parasim check) unless the model depends on the
    # world size: GQA's kv heads do
    y, cache = attn.forward(x, Saved(tag=key if kv == HEADS else None))
    dx = attn.backward(cache, ctx.shared_rng("dy").normal((S, B, H)))
    return attn, y, dx, _held(ctx, attn, w, kv, world)


def _held(ctx, attn, w: dict, kv: int, world: int) -> dict[str, list[int]]:
    """The heads whose weights this rank holds, found from the weights themselves: each head-wide block of
    columns of its fused QKV weight, matched against every head of the whole Q, K and V weights."""
    H, HEADS = hidden_of(world), heads_of(world)
    xp, d = ctx.xp, H // HEADS
    local, out = attn.qkv.weight, {"q": [], "k": [], "v": []}
    for j in range(local.shape[1] // d):
        block = local[:, j * d:(j + 1) * d]
        for part, n in (("q", HEADS), ("k", kv), ("v", kv)):
            whole = w[f"w{part}"]
            out[part] += [h for h in range(n) if bool(xp.all(block == whole[:, h * d:(h + 1) * d]))]
    return out


def program(ctx):
    group = ctx.new_group(range(ctx.world), "tp") if ctx.world > 1 else None
    tp, out = ParallelContext(ctx, group), {}
    H, HEADS = hidden_of(ctx.world), heads_of(ctx.world)

    ctx.phase("heads split across ranks")
    attn, y, dx, held = _attention(ctx, tp, HEADS, "mha", ctx.world)
    ctx.note(f"computes heads {attn.q_heads} alone: scores, softmax and weighted sums need no communication")
    out["mha"] = {"y": y, "dx": dx, "held": held}

    shape = ModelSpec(hidden=H, heads=HEADS, dropout=0.1)
    layer = TransformerLayer(tp, shape, layer_weights(ctx, shape, "layer"), key="layer")
    x = ctx.shared_rng("x").normal((S, B, H))
    ctx.phase("one layer forward")
    y, cache = layer.forward(x, Saved(tag="layer"))
    ctx.phase("one layer backward")
    layer.backward(cache, ctx.shared_rng("dy").normal((S, B, H)))

    ctx.phase("grouped-query attention")
    kv = gqa_kv(ctx.world)
    # the ranks holding a copy of each kv head (rank r's q heads are the r-th block, q head h reads kv head
    # h // (HEADS / kv)); every rank makes every group, in the same order
    per_rank, per_kv = HEADS // ctx.world, HEADS // kv
    sharing = [ctx.new_group([r for r in range(ctx.world) if r * per_rank // per_kv == j], f"kv{j} copies")
               for j in range(kv)] if ctx.world > 1 else []
    attn, y, dx, held = _attention(ctx, tp, kv, "gqa", ctx.world)
    ctx.note(f"q heads {attn.q_heads} read kv head {attn.kv_local} ({HEADS // kv} q heads share each kv head)")
    d = H // HEADS
    nq = len(attn.q_heads) * d
    kv_grad = attn.qkv.grads["weight"][:, nq:nq + 2 * d]  # this copy's K and V columns: a partial sum
    mine = next((g for g in sharing if ctx.rank in g.ranks), None)
    if mine is not None and len(mine.ranks) > 1:
        kv_grad = ctx.comm.all_reduce(kv_grad, group=mine, label="add the K and V weight gradients of the shared head")
    out["gqa"] = {"y": y, "dx": dx, "held": held, "dwk": kv_grad[:, :d], "copies": len(mine.ranks) if mine else 1}
    return out


def _unsplit(world: int):
    """The same attention on one rank, with the GQA shape the split run of `world` ranks used."""
    H, HEADS = hidden_of(world), heads_of(world)

    def program(ctx):
        tp, res, d = ParallelContext(ctx, None), {}, H // HEADS
        for name, kv in (("mha", HEADS), ("gqa", gqa_kv(world))):
            attn, y, dx, _ = _attention(ctx, tp, kv, name, world)
            res[name] = {"y": y, "dx": dx, "wk": attn.qkv.grads["weight"][:, HEADS * d:HEADS * d + kv * d]}
        return res
    return program


def checks(result) -> list[Check]:
    t, v = result.world, result.values
    H, HEADS = hidden_of(t), heads_of(t)
    ref = parasim.run(_unsplit(t), 1).values[0]  # the same layers on one rank: the unsplit computation
    out = []
    for name in ("mha", "gqa"):
        diff = max(float(np.max(np.abs(np.asarray(x[name][k]) - np.asarray(ref[name][k])))) for x in v
                   for k in ("y", "dx"))
        out.append(check(f"{name}: output and input gradient on every rank equal the unsplit attention "
                         "(largest difference)", diff, 0.0, atol=1e-12))
    for phase in ("one layer forward", "one layer backward"):
        n = sum(1 for e in result.trace.events if e.phase == phase and e.op == "all_reduce")
        out.append(check(f"{phase}: all-reduces on the TP group", n, 2 if t > 1 else 0))
    ar = next((e for e in result.trace.events if e.phase == "one layer forward" and e.op == "all_reduce"), None)
    if ar is not None:
        out.append(check("each moves 2(t-1)/t of an s·b·h activation per rank",
                         sorted({m.sent for m in ar.members}), [2 * (t - 1) * S * B * H * 8 // t]))
    # the heads each rank should hold, built directly: the q heads dealt out in t equal blocks in rank
    # order; under MHA each q head has its own k and v head, under GQA q head h reads kv head h // (heads/kv)
    blocks = np.arange(HEADS).reshape(t, HEADS // t).tolist()
    out.append(check(f"MHA on {t} rank(s): rank r holds the r-th block of {HEADS // t} q heads and the k and v "
                     "heads of the same numbers (found from the weights it holds)", [x["mha"]["held"] for x in v],
                     [{"q": q, "k": q, "v": q} for q in blocks]))
    kv = gqa_kv(t)
    need = [sorted({h // (HEADS // kv) for h in q}) for q in blocks]
    out.append(check(f"GQA, {kv} kv head(s) on {t} rank(s): rank r holds the same q heads and the kv heads they "
                     f"read, q head h reading kv head h // {HEADS // kv} (found from the weights it holds)",
                     [x["gqa"]["held"] for x in v], [{"q": q, "k": n, "v": n} for q, n in zip(blocks, need)]))
    d = H // HEADS
    wk = np.asarray(ref["gqa"]["wk"])
    # each copy's K-weight gradient was a partial sum; the all-reduce over the copies made each the whole one
    diff = max(float(np.max(np.abs(np.asarray(x["gqa"]["dwk"]) - wk[:, h * d:(h + 1) * d]))) for x in v
               for h in x["gqa"]["held"]["k"])
    out.append(check(f"after the all-reduce over each kv head's {t // kv if t > 1 else 1} copies, every rank holds "
                     "that head's unsplit K-weight gradient (largest difference)", diff, 0.0, atol=1e-12))
    sums = [e for e in result.trace.events if e.phase == "grouped-query attention" and e.op == "all_reduce"
            and e.group is not None and e.group.name.endswith(" copies")]
    out.append(check("... one all-reduce a kv head held by more than one rank", len(sums), kv if t > 1 else 0))
    return out


NARRATIVE = {
    "heads split across ranks": """
        Each rank gets the query, key and value columns of some heads, never part of one. The reason is
        the softmax: it normalises a row of complete scores, and each score needs every dimension of its
        head, so a rank holding a slice of a head's dimensions could only offer pieces of scores that
        must be added first. Owning whole heads, a rank goes from its heads' scores through softmax to
        their weighted values with nothing to send. The output projection takes its rows in the same
        head order, and one all-reduce (g) adds up what the heads contribute.""",
    "one layer forward": """
        A whole layer has two such blocks, attention and the MLP, so two all-reduces going forward (g)...""",
    "one layer backward": """
        ... and two going backward (f), one for each block's input. Nothing can start until each one
        has finished, in every layer, which is why TP stays on a node's fast links.""",
    "grouped-query attention": """
        With grouped-query attention several query heads share one key/value head. When there are fewer
        kv heads than TP ranks, a kv head cannot be split: each rank keeps a copy of the one its query
        heads read. Each copy's weight gradient is then a partial sum, from its own query heads only: one
        all-reduce over the ranks sharing the head adds them up, after which every copy holds the whole
        gradient and takes the same step. With --tp 16 this is the post's own case: 16 query heads, 8
        key/value heads, each held by two GPUs.""",
}

LESSON = Lesson(
    picture=Picture(plot_head_split, "which Q, K and V heads each TP rank holds, with and without GQA"),
    name="tp-attention",
    section="Tensor parallelism: attention",
    order=60,
    title="Tensor parallelism in attention: whole heads per rank, and GQA",
    world=4,
    worlds=WORLDS,
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="heads split over TP ranks, 2 all-reduces forward and 2 backward per layer, kv heads replicated",
    keep_values=0,
    knobs={"tp": Knob(4, choices=WORLDS, world=True, post=16,
                    limits="each rank takes whole heads: the model has 4 heads, or one a rank past 4, so TP must "
                           "divide them",
                    why="the post's GQA case, 8 KV heads on 16 GPUs, two GPUs each, runs with --tp 16 (the model "
                    "then has a head a rank, 16)")},
)

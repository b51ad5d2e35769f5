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
from parasim.nn.moe import softmax  # a row softmax shifted by its maximum
from parasim.examples.quiz import Question
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
    if ctx.rank == ctx.world - 1:  # the run's rule, said once, after every rank's heads (the app lists by rank)
        ctx.note(divides_note(ctx.world), run=True, heads=HEADS, kv_heads=HEADS, tp=ctx.world)
    out["mha"] = {"y": y, "dx": dx, "held": held}

    if ctx.world >= 2:  # the split that does not work: one head's dimensions halved over a pair of ranks
        pair = ctx.new_group([0, 1], "head halves")
        ctx.phase("a head split in half: why not")
        if ctx.rank in pair.ranks:
            out["half"] = _half_head(ctx, pair)

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
    if ctx.rank == ctx.world - 1:
        ctx.note(gqa_note(ctx.world), run=True, heads=HEADS, kv_heads=kv, tp=ctx.world)
    d = H // HEADS
    nq = len(attn.q_heads) * d
    kv_grad = attn.qkv.grads["weight"][:, nq:nq + 2 * d]  # this copy's K and V columns: a partial sum
    mine = next((g for g in sharing if ctx.rank in g.ranks), None)
    if mine is not None and len(mine.ranks) > 1:
        kv_grad = ctx.comm.all_reduce(kv_grad, group=mine, label="add the K and V weight gradients of the shared head")
    out["gqa"] = {"y": y, "dx": dx, "held": held, "dwk": kv_grad[:, :d], "copies": len(mine.ranks) if mine else 1}
    return out


POST_TP = 16  # the post's GQA case runs at this TP size (its heads and kv heads from heads_of, gqa_kv)


def divides_note(t: int) -> str:
    """The heads phase's rule, worked for the run's model: whole heads a rank, so the counts divide by t."""
    heads = heads_of(t)
    cut = next(n for n in range(2, heads + 2) if heads % n)  # the smallest TP size that would cut a head
    return (f"this model: {heads} query heads and {heads} kv heads (one each) over t = {t}, {heads // t} of each "
            f"a rank; t = {cut} would leave {heads} / {cut} heads a rank, so --tp {cut} is refused")


def gqa_note(t: int) -> str:
    """The GQA phase's sizes for the run: heads, kv heads, copies, and how they stand to the post's case."""
    heads, kv = heads_of(t), gqa_kv(t)
    said = f"this run: {heads} query heads, {kv} kv head{'s' * (kv != 1)} on t = {t}"
    if kv >= t:
        return f"{said}: no kv head needs a copy on more than one rank"
    said += f": fewer kv heads than ranks, so the count must divide t, and each kv head sits on {t // kv} ranks"
    if t == POST_TP:
        return said + " (the post's own case)"
    return (said + f"; the post's case, --tp {POST_TP}: {heads_of(POST_TP)} query heads, {gqa_kv(POST_TP)} kv "
            f"heads, {POST_TP // gqa_kv(POST_TP)} ranks each, of which this run is a smaller copy")


HALF_D = 4  # one head's dimensions, two a rank


def _half_head(ctx, pair) -> dict:
    """One head's Q and K columns split in half over two ranks: each can only make a part of every score.
    Softmax each part and add them (what a rank could do alone): not the softmax. Add the parts first (an
    all-reduce of every s x s score) and the softmax is right, at the cost of moving all the scores."""
    xp = ctx.xp
    q, k = ctx.shared_rng("half q").normal((S, HALF_D)), ctx.shared_rng("half k").normal((S, HALF_D))
    mine = slice(ctx.rank * HALF_D // 2, (ctx.rank + 1) * HALF_D // 2)
    part = xp.matmul(q[:, mine], xp.permute_dims(k[:, mine], (1, 0)))  # this rank's half of each score
    wrong = ctx.comm.all_reduce(softmax(xp, part), group=pair, label="each half's softmax, added: not a softmax")
    scores = ctx.comm.all_reduce(part, group=pair, label="the halves of the scores added first")
    return {"q": q, "k": k, "wrong": wrong, "right": softmax(xp, scores)}


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


def quiz(result) -> list[Question]:
    """Grouped-query attention over TP: how many GPUs hold a copy of each K/V head, asked before the run shows
    it, answered by the group of copies the run's ranks made (the post's case: 8 KV heads at TP 16, two each)."""
    t, v = result.world, result.values
    heads, kv = heads_of(t), gqa_kv(t)
    copies = v[0]["gqa"]["copies"]
    return [Question(
        f"{heads} query heads and {kv} key/value head{'s' * (kv != 1)} (grouped-query attention) split over TP {t}: each GPU "
        "keeps whole query heads and the K/V head they read. How many GPUs hold a copy of each K/V head?",
        copies, "GPUs",
        how_many_copies(heads, kv, t, copies))]


def how_many_copies(heads: int, kv: int, t: int, copies: int) -> str:
    """The quiz's answer worked in words: the query heads a GPU keeps, the query heads reading one K/V head,
    and so the GPUs those readers are spread over (`copies`, as the run made them)."""
    per, share = heads // t, heads // kv
    spread = (f"each GPU keeps {'one' if per == 1 else per} of the {heads} query heads, and {share} query heads "
              "read each K/V head")
    if copies == 1:
        return f"{spread}, so one GPU holds all the query heads of a K/V head, and that K/V head once"
    where = f" are on {copies} GPUs, one each" if per == 1 else f", at {per} a GPU, fill {copies} GPUs"
    return (f"{spread}, so the {share} query heads of one K/V head{where}; each of those GPUs keeps its own "
            "copy of that K/V head (and, backward, the copies' weight gradients are added up)")


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
    if t >= 2:
        half = v[0]["half"]
        q, k = np.asarray(half["q"]), np.asarray(half["k"])
        scores = q @ k.T
        direct = np.exp(scores - scores.max(-1, keepdims=True))
        direct /= direct.sum(-1, keepdims=True)
        wrong = np.asarray(half["wrong"])
        out.append(check("a head split in half: the parts' softmaxes added are no softmax (each row sums to 2, "
                         "not 1)", np.round(wrong.sum(-1), 12).tolist(), [2.0] * S))
        out.append(check("... and even halved they differ from one device's softmax",
                         bool(np.abs(wrong / 2 - direct).max() > 1e-3), True))
        out.append(check("adding the halves of the scores first gives one device's softmax (largest difference)",
                         float(np.abs(np.asarray(half["right"]) - direct).max()), 0.0, atol=1e-12))
    return out


NARRATIVE = {
    "heads split across ranks": """
        Each rank gets the query, key and value columns of some heads, never part of one. The reason is
        the softmax: it normalises a row of complete scores, and each score needs every dimension of its
        head, so a rank holding a slice of a head's dimensions could only offer pieces of scores that
        must be added first. Owning whole heads, a rank goes from its heads' scores through softmax to
        their weighted values with nothing to send. The output projection takes its rows in the same
        head order, and one all-reduce (g) adds up what the heads contribute. Whole heads also set a
        limit: every rank needs the same whole number of heads, so t has to be a divisor of the number of
        heads (a line below works it for this run's model).""",
    "a head split in half: why not": """
        Why not split a head's dimensions instead? Take one head and give each of two ranks half of its Q and
        K columns: each can only make half of every score, since a score adds up over all of the head's
        dimensions. A rank that applies softmax to its half and hands the result on gets a wrong answer: the
        two softmaxes added up do not even sum to 1 in a row. To be right the ranks must first add their
        halves of every score, an s x s exchange per head in every layer, before the softmax can start.""",
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
        gradient and takes the same step. The default run is the post's case scaled down, with half as
        many kv heads as ranks; --tp 16 runs the post's own (a line below gives this run's
        sizes).""",
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
    quiz=quiz,
    knobs={"tp": Knob(4, choices=WORLDS, world=True, post=16,
                    limits="each rank takes whole heads: the model has 4 heads, or one a rank past 4, so TP must "
                           "divide them",
                    why="the default is the post's GQA case scaled down (half as many KV heads as GPUs); the "
                    "post's own, 8 KV heads on 16 GPUs, runs with --tp 16")},
)

"""Ring attention on 4 CP ranks: each keeps its queries, K/V chunks go around the ring, and the output and
gradients equal attention computed on one device."""
from __future__ import annotations

import math

import numpy as np

from parasim.lesson import Check, Knob, Lesson, Picture, Table, check
from parasim.render.plot_ring import plot_ring_lesson
from parasim.nn.ring_attention import RingAttention

SEQ, B, HEADS, D = 8, 1, 2, 4


def _full(ctx, name):
    return ctx.shared_rng(name).normal((B, HEADS, SEQ, D))


def program(ctx):
    group = ctx.new_group(range(ctx.world), "cp") if ctx.world > 1 else None
    ring = RingAttention(ctx, group, SEQ, split="contiguous", causal=False)
    pos = ctx.xp.asarray(ring.pos[ring.r])
    q, k, v, do = (ctx.xp.take(_full(ctx, n), pos, axis=2) for n in ("q", "k", "v", "do"))
    ctx.phase("forward: K/V around the ring")
    ctx.note(f"holds the queries, keys and values of tokens {[p + 1 for p in ring.pos[ring.r]]}")
    out, cache = ring.forward(q, k, v)
    ctx.note(f"held the K/V of ranks {ring.work.held}, one step each")
    ctx.phase("backward: dK/dV travel home")
    dq, dk, dv = ring.backward(cache, do)
    return {"pos": ring.pos[ring.r], "held": ring.work.held, "out": out, "dq": dq, "dk": dk, "dv": dv}


def _reference(ctx_like):
    """Attention on one device, forward and backward, in numpy."""
    rng = {n: ctx_like(n) for n in ("q", "k", "v", "do")}
    q, k, v, do = rng["q"], rng["k"], rng["v"], rng["do"]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(D)
    return {"out": out, "dq": ds @ k, "dk": np.swapaxes(ds, -1, -2) @ q, "dv": dv}


def checks(result) -> list[Check]:
    from parasim.engine.context import Rng
    v, t = result.values, result.world
    ref = _reference(lambda n: Rng(0, (1, *n.encode()), lambda a: a).normal((B, HEADS, SEQ, D)))
    out = [check("step j: rank i holds the K/V of rank i - j (the table)", [x["held"] for x in v],
                 [[(i - j) % t for j in range(t)] for i in range(t)])]
    for key in ("out", "dq", "dk", "dv"):
        got = np.zeros_like(ref[key])
        for x in v:
            got[:, :, x["pos"]] = x[key]
        out.append(check(f"{key} equals single-device attention (largest difference)",
                         float(np.max(np.abs(got - ref[key]))), 0.0, atol=1e-12))
    moved = [e for e in result.trace.events if e.op == "p2p" and e.phase == "forward: K/V around the ring"]
    out.append(check("forward: each rank sends K and V t-1 times", len(moved), 2 * t * (t - 1)))
    return out


def tables(result) -> list[Table]:
    """The post's rotation table, from the run: at each step, whose K/V chunk each GPU holds (K1,V1 are GPU
    1's tokens' keys and values), with the tokens it stands for."""
    v, t = result.values, result.world
    rows = [(f"step {j}" + (" (own chunk)" if j == 0 else ""),
             [f"K{v[i]['held'][j] + 1},V{v[i]['held'][j] + 1}" for i in range(t)]) for j in range(t)]
    tokens = "; ".join(f"chunk {i + 1} = tokens {v[i]['pos'][0] + 1}-{v[i]['pos'][-1] + 1}" for i in range(t))
    return [Table(f"Whose keys and values each GPU holds, step by step ({t} CP ranks)",
                  ["step"] + [f"GPU {i + 1}" for i in range(t)], rows,
                  notes=[f"{tokens}. Each step a GPU attends its own queries to the chunk it holds, then passes "
                         "that chunk to the next GPU and takes the previous one's."])]


NARRATIVE = {
    "forward: K/V around the ring": """
        The sequence is split over the CP ranks; every rank keeps the queries of its tokens and the full
        weights. At each step a rank attends its queries to the key/value chunk it holds, folding it
        into its running softmax, and passes that chunk to the next rank while taking one from the
        previous: after t steps every query has seen every key, and nothing but keys and values crossed
        between ranks.""",
    "backward: dK/dV travel home": """
        Backward rotates K and V again; each chunk carries the gradient its visits have added up. One
        last hop brings every dK and dV back to the rank that owns those tokens.""",
}

LESSON = Lesson(
    name="ring-attention",
    section="Context parallelism: split the sequence through the whole layer",
    order=90,
    picture=Picture(plot_ring_lesson, "which K/V chunk each CP rank holds at each step"),
    title="Ring attention: K/V chunks around a ring of CP ranks",
    world=4,
    worlds=(1, 2, 4, 8),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="4 CP ranks: the K/V chunk table from the run; output and gradients equal single-device attention",
    keep_values=0,
    fold_alike=True,
    knobs={"cp": Knob(4, choices=(1, 2, 4, 8), world=True,
                    limits="the 8-token sequence cut into equal chunks, one a rank")},
    tables=tables,
)

"""Ring attention on 4 CP ranks: each keeps its queries, K/V chunks go around the ring, and the output and
gradients equal attention computed on one device."""
from __future__ import annotations

import math
import re

import numpy as np

from parasim.lesson import Check, Knob, Lesson, Picture, Table, check
from parasim.render.plot_ring import plot_ring_lesson
from parasim.nn.ring_attention import RingAttention

SEQ, B, HEADS, D = 8, 1, 2, 4
CAUSAL_SEQ, CAUSAL_CP = 4, 2  # the post's causal example: 4 tokens on 2 GPUs, run beside the lesson's ring


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


def _causal_program(ctx):
    """The post's causal example: CAUSAL_SEQ tokens over CAUSAL_CP ranks, forward only. Each rank returns whose
    K/V it held at each step and the mask it applied to that block (True: the key comes after the query)."""
    group = ctx.new_group(range(ctx.world), "cp")
    ring = RingAttention(ctx, group, CAUSAL_SEQ, split="contiguous", causal=True)
    pos = ctx.xp.asarray(ring.pos[ring.r])
    q, k, v = (ctx.xp.take(ctx.shared_rng(f"causal {n}").normal((B, HEADS, CAUSAL_SEQ, D)), pos, axis=2)
               for n in ("q", "k", "v"))
    out, _ = ring.forward(q, k, v)
    masks = [ring._mask(src) for src in ring.work.held]  # the masks forward applied, block by block
    return {"pos": ring.pos[ring.r], "held": ring.work.held, "masks": [np.asarray(m).tolist() for m in masks],
            "blocks": ring.work.blocks, "fine": ring.fine, "out": out}


def causal_example(result=None) -> dict:
    """Run the post's causal example and read off, cell by cell of the score matrix, which GPU computed the
    score and at which ring step: a block the GPU skipped (its compute event says so) leaves its cells
    "skipped", a masked key in a block it computed "masked"."""
    import parasim

    run = parasim.run(_causal_program, CAUSAL_CP)
    values = run.values
    cells: dict[tuple[int, int], tuple] = {}
    skipped = []
    for r, x in enumerate(values):
        done = [e for e in sorted(run.trace.events, key=lambda e: e.step) if e.kind == "compute" and r in e.ranks]
        skipped.append(sum(" skip " in e.op for e in done))  # a compute event is named by its op
        for step, (src, event, mask) in enumerate(zip(x["held"], done, x["masks"])):
            skip = " skip " in event.op
            for i, q in enumerate(x["pos"]):
                for j, k in enumerate(values[src]["pos"]):
                    cells[(q, k)] = ("skipped", r, step) if skip else ("masked", r, step) if mask[i][j] else (
                        "computed", r, step)
    return {"cells": cells, "pos": [x["pos"] for x in values], "skipped": skipped,
            "blocks": [x["blocks"] for x in values], "fine": values[0]["fine"],
            "out": [x["out"] for x in values]}


def causal_table(causal: dict) -> Table:
    """The post's causal grid, from its run: the score matrix of 4 tokens on 2 GPUs, each cell the GPU and ring
    step that computed it, or why none did."""
    cells, pos = causal["cells"], causal["pos"]
    n, t = len(cells) ** 0.5, len(pos)
    owner = {p: r for r, ps in enumerate(pos) for p in ps}
    rows = []
    for q in range(int(n)):
        said = []
        for k in range(int(n)):
            what, r, step = cells[(q, k)]
            said.append(f"GPU {r + 1}, step {step}" if what == "computed" else f"{what}, step {step}")
        rows.append((f"t{q + 1} (GPU {owner[q] + 1})", said))
    chunk = len(pos[0]) // causal["fine"]  # fine blocks a chunk has on a side
    work = ", ".join(f"GPU {r + 1} {b / chunk ** 2:g}" for r, b in enumerate(causal["blocks"]))
    skips = ", ".join(f"{s} by GPU {r + 1}" for r, s in enumerate(causal["skipped"]))
    holds = "; ".join(f"GPU {r + 1} holds t{ps[0] + 1}-t{ps[-1] + 1}" for r, ps in enumerate(pos))
    return Table(f"The post's causal example, run on its own: {int(n)} tokens on {t} GPUs, who computes each "
                 "query-key score and at which ring step",
                 ["query"] + [f"key t{k + 1}" for k in range(int(n))], rows,
                 notes=[f"{holds}. A cell names the GPU whose queries meet that key and the ring step it does "
                        "so at. masked: the key comes after the query inside a block the GPU computes (its score "
                        "is set to -inf before the softmax); skipped: every key of the chunk the GPU holds at that "
                        "step comes after all its queries, so it computes nothing then (the run's compute event "
                        f"says skip). Blocks skipped: {skips}. Work in chunk-by-chunk blocks, a diagonal block "
                        f"counting half: {work}."])


def _backward_hops(result) -> str:
    """Backward's hand-offs from the trace, steps that pass the same tensors folded into one span: which
    tensors each step passes on, and which go home."""
    said: dict[int, tuple[tuple[str, ...], str]] = {}
    for e in result.trace.events:
        found = e.kind == "p2p" and re.match(r"ring backward: (?:pass )?(\w+) of CP rank \d+ (on|home)$", e.label or "")
        if found:
            names, where = said.get(e.step, ((), found.group(2)))
            said[e.step] = (names if found.group(1) in names else (*names, found.group(1)), where)
    spans: list[list] = []
    for step in sorted(said):
        if spans and spans[-1][2] == said[step] and spans[-1][1] == step - 1:
            spans[-1][1] = step
        else:
            spans.append([step, step, said[step]])
    parts = []
    for first, last, (names, where) in spans:
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        parts.append(f"{steps}: {', '.join(names)} {'passed on' if where == 'on' else 'sent home'}")
    return "; ".join(parts)


def _reference(ctx_like, causal=False):
    """Attention on one device, forward and backward, in numpy (`causal`: a key after its query is masked)."""
    rng = {n: ctx_like(n) for n in ("q", "k", "v", "do")}
    q, k, v, do = rng["q"], rng["k"], rng["v"], rng["do"]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    if causal:
        n = s.shape[-1]
        s = np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(D)
    return {"out": out, "dq": ds @ k, "dk": np.swapaxes(ds, -1, -2) @ q, "dv": dv}


def checks(result, causal) -> list[Check]:
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
    # the post's causal example, 4 tokens on 2 GPUs: only the causal triangle computed, and exactly
    n, cp = CAUSAL_SEQ, CAUSAL_CP
    done = sorted(cell for cell, (what, _, _) in causal["cells"].items() if what == "computed")
    out.append(check("causal example: query t_i gets the scores of keys t_1 .. t_i, no more", done,
                     [(q, k) for q in range(n) for k in range(q + 1)]))
    out.append(check("causal example: GPU i skips the chunks of the GPUs after it", causal["skipped"],
                     [cp - 1 - r for r in range(cp)]))
    cref = _reference(lambda n: Rng(0, (1, *f"causal {n}".encode()), lambda a: a).normal((B, HEADS, CAUSAL_SEQ, D)),
                      causal=True)
    got = np.zeros_like(cref["out"])
    for pos, o in zip(causal["pos"], causal["out"]):
        got[:, :, pos] = o
    out.append(check("causal example: output equals single-device causal attention (largest difference)",
                     float(np.max(np.abs(got - cref["out"]))), 0.0, atol=1e-12))
    return out


def tables(result, causal) -> list[Table]:
    """The post's rotation table, from the run: at each step, whose K/V chunk each GPU holds (K1,V1 are GPU
    1's tokens' keys and values), with the tokens it stands for; then the post's causal example, run."""
    v, t = result.values, result.world
    rows = [(f"step {j}" + (" (own chunk)" if j == 0 else ""),
             [f"K{v[i]['held'][j] + 1},V{v[i]['held'][j] + 1}" for i in range(t)]) for j in range(t)]
    tokens = "; ".join(f"chunk {i + 1} = tokens {v[i]['pos'][0] + 1}-{v[i]['pos'][-1] + 1}" for i in range(t))
    return [Table(f"Whose keys and values each GPU holds, step by step ({t} CP ranks)",
                  ["step"] + [f"GPU {i + 1}" for i in range(t)], rows,
                  notes=[f"{tokens}. Each step a GPU attends its own queries to the chunk it holds, then passes "
                         "that chunk to the next GPU and takes the previous one's."]
                  + ([f"Backward's hand-offs, read from the trace: {hops}."]
                     if (hops := _backward_hops(result)) else [])),
            causal_table(causal)]


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
    # one ring step of each phase in full (forward: attend, pass K and V, attend; backward: K, V, dK and dV
    # passed on), the rest counted by op: the rotation table and its notes give every step
    events_shown=4,
    study=causal_example,
    knobs={"cp": Knob(4, choices=(1, 2, 4, 8), world=True,
                    limits="the 8-token sequence cut into equal chunks, one a rank")},
    tables=tables,
)

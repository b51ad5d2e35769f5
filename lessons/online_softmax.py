"""The online softmax: a softmax over scores that arrive in chunks, exact at every step.

Two ranks hold one key each. The query's rank sees its own key first (score 1), then the other rank's
key arrives around the ring (score 3). It keeps a running max m, a running sum l of e^(score - m) and a
running output o; when the max grows, l and o are first multiplied by e^(m_old - m_new).
"""
from __future__ import annotations

import numpy as np

from parasim.comm.interface import Recv, Send
from parasim.lesson import Check, Lesson, check
from parasim.nn.ring_attention import online_softmax_step

QUERY = [[1.0]]  # one query, one dim: a score is the key itself
KEYS = [[[1.0]], [[3.0]]]  # rank i holds key i
VALUES = [[[1.0, 0.0]], [[0.0, 1.0]]]  # one-hot values, so the output is the softmax weights themselves


def _fmt(a) -> str:
    return " ".join(f"{x:.4g}" for x in np.asarray(a.tolist(), dtype=float).reshape(-1))


def program(ctx):
    xp, comm = ctx.xp, ctx.comm
    ring = ctx.new_group(range(2), "cp")
    q = ctx.asarray(QUERY)
    k, v = ctx.asarray(KEYS[ctx.rank]), ctx.asarray(VALUES[ctx.rank])
    m = xp.full((1,), -np.inf, dtype=xp.float64)
    l = xp.zeros((1,), dtype=xp.float64)
    o = xp.zeros((1, 2), dtype=xp.float64)
    out, steps = {}, []
    for step in range(2):
        ctx.phase(f"chunk {step + 1}")
        scores = xp.matmul(q, xp.permute_dims(k, (1, 0)))
        m, l, o, rescale = online_softmax_step(xp, m, l, o, scores, v)
        steps.append({"score": scores, "m": m, "l": l, "o": o, "rescale": rescale})
        ctx.note(f"score {_fmt(scores)}: m = {_fmt(m)}, old terms rescaled by e^(m_old - m) = {_fmt(rescale)}, "
                 f"l = {_fmt(l)}, o = [{_fmt(o)}]")
        if step == 0:  # pass my key and value on; take the other rank's
            nxt = (ctx.rank + 1) % 2
            k, v = comm.exchange([Send(k, nxt), Send(v, nxt), Recv(nxt, (1, 1), k.dtype), Recv(nxt, (1, 2), v.dtype)],
                                 group=ring, label="pass K/V on")
    ctx.phase("result")
    out["steps"], out["weights"] = steps, o / l[..., None]
    ctx.note(f"output o / l = [{_fmt(out['weights'])}]: the softmax weights, since the values are one-hot")
    return out


def checks(result) -> list[Check]:
    s = result.values[0]["steps"]
    scores = np.array([KEYS[0][0][0], KEYS[1][0][0]]) * QUERY[0][0]
    direct = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    return [
        check("after chunk 1: m is the first score, l = 1", [float(s[0]["m"][0]), float(s[0]["l"][0])],
              [scores[0], 1.0]),
        check("chunk 2 raises the max: old terms scale by e^(1 - 3)", float(s[1]["rescale"][0]),
              float(np.exp(scores[0] - scores[1])), rtol=1e-12),
        check("running sum l = e^(1-3) + 1", float(s[1]["l"][0]), float(np.exp(scores[0] - scores[1]) + 1),
              rtol=1e-12),
        check("o / l equals a direct softmax of [1, 3]", result.values[0]["weights"][0], direct, rtol=1e-12),
        check("the other rank, which saw the chunks in the other order, gets the same weights",
              result.values[1]["weights"][0], direct, rtol=1e-12),
    ]


NARRATIVE = {
    "chunk 1": """
        A softmax needs the largest score and the sum over all scores, but in ring attention the keys
        arrive in pieces. Keep three running values instead: the largest score so far m, the sum l of
        e^(score - m), and the output o, the sum of e^(score - m) times the value. After the first chunk
        they describe the softmax over that chunk alone.""",
    "chunk 2": """
        The second chunk has a larger score, so the maximum moves. Every old term was computed against the
        old maximum: a factor of e^(m_old - m_new) on l and on o moves them onto the new one, and the new
        chunk's terms are added. Nothing is recomputed and no old score is needed.""",
    "result": """
        Dividing o by l gives exactly the softmax-weighted sum. The values here are one-hot, so the output
        shows the weights themselves, equal to a direct softmax of the two scores.""",
}

LESSON = Lesson(
    name="online-softmax",
    title="The online softmax: exact attention from chunks that arrive one at a time",
    world=2,
    worlds=(2,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="scores 1 then 3: the rescale factor, the running sum, the final weights against a direct softmax",
    keep_values=8,
)

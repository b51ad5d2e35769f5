"""The online softmax: a softmax over scores that arrive in chunks, exact at every step.

Two ranks hold one key each. The query's rank sees its own key first (score 1), then the other rank's
key arrives around the ring (score 3). It keeps a running max m, a running sum l of e^(score - m) and a
running output o; when the max grows, l and o are first multiplied by e^(m_old - m_new).
--cp 3 or 4 puts the keys on a longer ring (keys 1, 3, 2, 4: the max moves, holds, moves again), each rank
checked against a direct softmax of them all.
"""
from __future__ import annotations

import numpy as np

from parasim.comm.interface import Recv, Send
from parasim.engine.tolerance import gamma, roundoff as tolerance_of
from parasim.lesson import Check, Knob, Lesson, check
from parasim.nn.ring_attention import online_softmax_step

QUERY = [[1.0]]  # one query, one dim: a score is the key itself
# below float32's smallest normal number a weight is flushed toward 0: only the absolute difference means anything
ATOL32 = float(np.finfo(np.float32).tiny)
BIG = 40.0  # how much larger the scores are made to show the naive softmax overflowing (e^120 > float32's max)
# rank i holds key i: the post's two, then ours for a longer ring (2 does not raise the max, 4 does)
KEYS = [[[1.0]], [[3.0]], [[2.0]], [[4.0]]]


def _value(i: int, n: int) -> list:
    """Rank i's value: one-hot of length n, so the output is the softmax weights themselves."""
    return [[1.0 if j == i else 0.0 for j in range(n)]]


def _fmt(a) -> str:
    return " ".join(f"{x:.4g}" for x in np.asarray(a.tolist(), dtype=float).reshape(-1))


def program(ctx):
    xp, comm = ctx.xp, ctx.comm
    n = ctx.world
    ring = ctx.new_group(range(n), "cp")
    q = ctx.asarray(QUERY)
    k, v = ctx.asarray(KEYS[ctx.rank]), ctx.asarray(_value(ctx.rank, n))
    m = xp.full((1,), -np.inf, dtype=xp.float64)
    l = xp.zeros((1,), dtype=xp.float64)
    o = xp.zeros((1, n), dtype=xp.float64)
    out, steps = {}, []
    for step in range(n):
        ctx.phase(f"chunk {step + 1}")
        scores = xp.matmul(q, xp.permute_dims(k, (1, 0)))
        m, l, o, rescale = online_softmax_step(xp, m, l, o, scores, v)
        steps.append({"score": scores, "m": m, "l": l, "o": o, "rescale": rescale})
        # the first chunk has no old terms to rescale (m_old is -inf, l and o are 0): say so, not "by 0"
        kept = (f"old terms rescaled by e^(m_old - m) = {_fmt(rescale)}" if step else
                "no old terms yet (m starts at -inf, l and o at 0)")
        ctx.note(f"score {_fmt(scores)}: m = {_fmt(m)}, {kept}, new term e^(score - m) = {_fmt(xp.exp(scores - m))}, "
                 f"l = {_fmt(l)}, o = [{_fmt(o)}]")
        if step < n - 1:  # pass the key and value I hold back along the ring; take the next rank's
            nxt, prev = (ctx.rank + 1) % n, (ctx.rank - 1) % n  # so rank r sees keys r, r + 1, ... in turn
            k, v = comm.exchange([Send(k, prev, "pass K on"), Send(v, prev, "pass V on"),
                                  Recv(nxt, (1, 1), k.dtype, "pass K on"), Recv(nxt, (1, n), v.dtype, "pass V on")],
                                 group=ring, label="pass K/V on")
    ctx.phase("result")
    out["steps"], out["weights"] = steps, o / l[..., None]
    ctx.note(f"output o / l = [{_fmt(out['weights'])}]: the softmax weights, since the values are one-hot")
    ctx.phase("why the max")
    # the same scores 40 times larger (as a long head's dot products can be), in float32 as a GPU keeps them:
    # e^score alone passes float32's largest number (about e^88.7) and the naive softmax turns into nan
    big = np.array([KEYS[i][0][0] for i in range(n)], dtype=np.float32) * np.float32(BIG)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(big) / np.exp(big).sum()
    shifted = np.exp(big - big.max()) / np.exp(big - big.max()).sum()
    out["naive"], out["shifted"] = naive.tolist(), shifted.tolist()
    if ctx.rank == 0:
        ctx.note(f"scores x{BIG:g} = [{_fmt(big)}] in float32: e^score / sum = [{_fmt(naive)}]; "
                 f"e^(score - max) / sum = [{_fmt(shifted)}]")
    return out


def checks(result) -> list[Check]:
    s, n = result.values[0]["steps"], result.world
    rtol32 = gamma(n + 3, tolerance_of("float32").u)  # engine/tolerance.py's bound for n + 3 roundings
    scores = np.array([KEYS[i][0][0] for i in range(n)]) * QUERY[0][0]
    direct = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    # rank 0 sees the scores in key order: each chunk's factor is e^(old max - new max), 1 when it holds
    running = np.maximum.accumulate(scores)
    later = [check(f"chunk {c + 1} ({'raises' if running[c] > running[c - 1] else 'keeps'} the max): old terms "
                   f"scale by e^({running[c - 1]:g} - {running[c]:g})", float(s[c]["rescale"][0]),
                   float(np.exp(running[c - 1] - running[c])), rtol=1e-12) for c in range(2, n)]
    return [
        check("after chunk 1: m is the first score, l = 1", [float(s[0]["m"][0]), float(s[0]["l"][0])],
              [scores[0], 1.0]),
        check("chunk 2 raises the max: old terms scale by e^(1 - 3)", float(s[1]["rescale"][0]),
              float(np.exp(scores[0] - scores[1])), rtol=1e-12),
        check("running sum l = e^(1-3) + 1", float(s[1]["l"][0]), float(np.exp(scores[0] - scores[1]) + 1),
              rtol=1e-12),
        *later,
        check(f"o / l equals a direct softmax of [{', '.join(f'{x:g}' for x in scores)}]",
              result.values[0]["weights"][0], direct, rtol=1e-12),
        check("the other rank, which saw the chunks in the other order, gets the same weights",
              result.values[1]["weights"][0], direct, rtol=1e-12) if n == 2 else
        check("every other rank, which saw the chunks in another order, gets the same weights",
              [x["weights"][0] for x in result.values[1:]], [direct] * (n - 1), rtol=1e-12),
        # float32's largest number is about 3.4e38 = e^88.7: a score past that overflows e^score to inf
        check(f"scores x{BIG:g} in float32: the naive softmax is not a number (e^{BIG * scores.max():g} overflows)",
              bool(np.isnan(result.values[0]["naive"]).any()), bool(BIG * scores.max() > np.log(np.finfo(np.float32).max))),
        check(f"... while subtracting the max first gives the softmax of the x{BIG:g} scores, to float32's "
              f"precision: within a relative {rtol32:.2g}, the most that {n + 3} float32 roundings can add up to "
              f"(the sum's {n - 1} addition{'s' if n != 2 else ''}, two in the exp, one in the divide, and one "
              f"to spare), or an absolute {ATOL32:.2g}, float32's smallest normal number",
              result.values[0]["shifted"], np.exp(BIG * (scores - scores.max())) / np.exp(BIG * (scores - scores.max())).sum(),
              rtol=rtol32, atol=ATOL32),
    ]


NARRATIVE = {
    "chunk 1": """
        To normalise a row of scores a softmax wants two things over the whole row: its largest score
        and the total of the exponentials. Ring attention never has the whole row at once; its keys come
        a chunk at a time. So each query carries three numbers forward: m, the biggest score met so far;
        l, the running total of e^(score - m); and o, the running total of e^(score - m) times each
        value. Once the first chunk is in, the three are exactly that chunk's own softmax.""",
    "chunk 2": """
        Each rank meets the keys in its own order. For rank 0 the second chunk (key 3) holds a larger score,
        so its maximum moves: every old term was computed against the old maximum, and a factor of
        e^(m_old - m_new) on l and on o moves them onto the new one before the new chunk's terms are added.
        A rank whose new chunk scores below its maximum keeps it: the factor is 1, and the new term,
        e^(score - m), comes in below 1. Nothing is recomputed and no old score is needed.""",
    "chunk 3": """
        On a ring of three or four ranks the third chunk (key 2 for rank 0) is below rank 0's maximum: the
        factor is e^0 = 1, and its term is simply added. The other ranks' lines show their own order.""",
    "chunk 4": """
        The fourth (key 4) raises the maximum again, and the old terms are scaled once more.""",
    "result": """
        Dividing o by l gives exactly the softmax-weighted sum. The values here are one-hot, so the output
        shows the weights themselves, equal to a direct softmax of every score on the ring (at --cp 2, the
        post's two); each rank saw them in its own order and got the same weights.""",
    "why the max": """
        Why carry m at all? Make the scores 40 times larger, as long heads' dot products can be, and keep
        them in float32 as a GPU does: e^score of the largest passes float32's biggest number (about e^88.7),
        becomes inf, and inf / inf makes the naive softmax not a number. Subtracting the max first keeps
        every exponent at 0 or below, so nothing overflows; the online softmax's running max does that for
        scores it has not all seen.""",
}

LESSON = Lesson(
    no_picture='two chunks of scores: its lines print every running maximum, sum and weight',
    name="online-softmax",
    section="Context parallelism: how the softmax stays exact",
    order=100,
    title="The online softmax: exact attention from chunks that arrive one at a time",
    world=2,
    worlds=(2, 3, 4),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="scores 1 then 3: the rescale factor, the running sum, the final weights against a direct softmax",
    keep_values=8,
    knobs={"cp": Knob(2, choices=(2, 3, 4), world=True,
                    limits="one key a rank, of the 4 keys the lesson holds; a ring needs 2 ranks at least")},  # ranks on the ring, one key each
)

"""Causal attention under context parallelism: the contiguous split gives the last rank the most work;
the zigzag split (rank i takes chunks i and 2cp-1-i) evens it out. Work is counted by the run."""
from __future__ import annotations

from fractions import Fraction

from parasim.examples.quiz import Question
from parasim.lesson import Check, Knob, Lesson, Picture, Table, check
from parasim.render.plot_lessons import plot_cp_causal
from parasim.nn.ring_attention import RingAttention, positions

B, HEADS, D = 1, 1, 2
CPS = tuple(range(1, 9))  # every CP size up to a node


def seq_of(cp: int) -> int:
    """16 tokens, or the next multiple of 2cp where 16 is not one (18 at CP 3): the zigzag split cuts the
    sequence into 2cp equal pieces."""
    return 2 * cp * -(-16 // (2 * cp))
TOKENS = "the court ruled that the contract was void".split()


def program(ctx):
    group = ctx.new_group(range(ctx.world), "cp") if ctx.world > 1 else None
    out = {}
    for split in ("contiguous", "zigzag"):
        ctx.phase(f"{split} split")
        seq = seq_of(ctx.world)
        ring = RingAttention(ctx, group, seq, split=split, causal=True)
        pos = ctx.xp.asarray(ring.pos[ring.r])
        q, k, v = (ctx.xp.take(ctx.shared_rng(n).normal((B, HEADS, seq, D)), pos, axis=2) for n in "qkv")
        ring.forward(q, k, v)
        w = ring.work
        steps = " + ".join(f"{x:g}" for x in w.steps)
        held = ring.pos[ring.r]
        pieces = [held] if split == "contiguous" else [held[: len(held) // 2], held[len(held) // 2:]]
        ctx.note(f"tokens {' + '.join(_spans(p) for p in pieces)}: work {w.blocks:g} blocks ({steps}, one term per ring step), "
                 f"{w.skipped} chunk{'s' * (w.skipped != 1)} skipped")
        out[split] = {"blocks": w.blocks, "skipped": w.skipped, "flops": w.flops,
                      "pieces": list(ring.chunks[ring.r])}  # which of the 2cp pieces it holds: its picture
    if ctx.world == 2:  # the post's sentence, split zigzag over two ranks
        words = [TOKENS[p] for p in positions("zigzag", len(TOKENS), 2, ctx.rank)]
        ctx.note(f"zigzag on the example sentence: {' '.join(words)}")
    return out


def _spans(pos: list[int]) -> str:
    """Token numbers as runs: 1-4 (a zigzag rank's two chunks are said one by one, 1-2 + 15-16: the middle rank's
    meet, 7-8 + 9-10, and are still two)."""
    runs, start = [], pos[0]
    for a, b in zip(pos, pos[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start + 1}-{a + 1}" if a > start else f"{a + 1}")
            start = b
    return " ".join(runs)


def checks(result) -> list[Check]:
    t, v = result.world, result.values
    fine = 2 * t  # blocks of the 2t-way split; the causal total is the lower triangle with half diagonals
    total = fine * (fine - 1) / 2 + fine * 0.5
    cont = [x["contiguous"]["blocks"] for x in v]
    zig = [x["zigzag"]["blocks"] for x in v]
    return [
        check("contiguous: rank i does 4i + 2 blocks (it sees every earlier token)", cont,
              [4 * i + 2.0 for i in range(t)]),
        check("zigzag: every rank does the same work", zig, [total / t] * t),
        check("both splits do the same total work", [sum(cont), sum(zig)], [total, total]),
        check("the slowest rank gets faster by", round(max(cont) / max(zig), 4), round((4 * (t - 1) + 2) / (total / t),
                                                                                     4)),
    ]


def tables(result) -> list[Table]:
    """Each rank's causal work under both splits: in this run's blocks, in the post's units (a whole CP
    chunk against a whole CP chunk: 4 of our blocks), and as a share of the total."""
    v, t = result.values, result.world
    total = sum(x["contiguous"]["blocks"] for x in v)
    rows = [(f"rank {r} (GPU {r + 1})", [x["contiguous"]["blocks"], x["contiguous"]["blocks"] / 4,
                                        round(100 * x["contiguous"]["blocks"] / total),
                                        x["zigzag"]["blocks"], round(100 * x["zigzag"]["blocks"] / total)])
            for r, x in enumerate(v)]
    chunk = seq_of(t) // (2 * t)
    faster = max(x["contiguous"]["blocks"] for x in v) / max(x["zigzag"]["blocks"] for x in v)
    return [Table(f"Causal work per CP rank, {seq_of(t)} tokens over {t} ranks",
                  ["CP rank", "contiguous: blocks", "in chunk-pairs", "contiguous share %", "zigzag: blocks", "zigzag share %"], rows,
                  notes=[f"a block is {chunk} queries against {chunk} keys (the sequence cut in 2cp = {2 * t} "
                         f"pieces); the post counts a contiguous rank's work in pairs of whole CP chunks "
                         f"({2 * chunk} x {2 * chunk} tokens: 4 blocks), so the run's {v[0]['contiguous']['blocks']:g}, "
                         f"{v[-1]['contiguous']['blocks']:g} blocks are the post's "
                         f"{v[0]['contiguous']['blocks'] / 4:g}, {v[-1]['contiguous']['blocks'] / 4:g}; "
                         "a block on the diagonal counts half (its upper triangle is masked).",
                         f"zigzag: rank i holds pieces c(i+1) and c({2 * t}-i); piece cj sees j - 1 whole pieces "
                         f"before it and half of itself, j - 0.5 blocks, so rank 0's c1 + c{2 * t} = 0.5 + "
                         f"{2 * t - 0.5:g} = {2 * t:g}: the {v[0]['zigzag']['blocks']:g} blocks the run counts on "
                         "every rank.",
                         f"zigzag can even out this mask (the busiest rank {faster:.2f}x faster here) "
                         "because the causal triangle is known before the run, so the pieces can be dealt out "
                         "ahead of time; a mask of another shape (image tokens that see each other both ways, "
                         "documents packed into one sequence and kept apart) makes the work uneven again: see "
                         "the note at CP's row under `parasim cheatsheet`."])]


def figures(result) -> dict:
    """The slowest rank's work under each split, in blocks of the 2cp-way split (what `compare` lines up)."""
    v = result.values
    cont, zig = max(x["contiguous"]["blocks"] for x in v), max(x["zigzag"]["blocks"] for x in v)
    return {"slowest rank's blocks, contiguous": cont, "slowest rank's blocks, zigzag": zig,
            "zigzag's speed-up of the slowest rank": round(cont / zig, 3)}


def quiz(result) -> list[Question]:
    """The last rank's share of the causal work under the contiguous split, and each rank's under zigzag:
    asked before the run shows them, answered by the blocks the ranks counted."""
    v, t = result.values, result.world
    total = sum(x["contiguous"]["blocks"] for x in v)
    last, zig = v[-1]["contiguous"]["blocks"], v[0]["zigzag"]["blocks"]
    share = Fraction(last).limit_denominator(1000) / Fraction(total).limit_denominator(1000)
    pieces = 2 * t
    return [
        Question(f"A causal sequence split contiguously over {t} CP ranks: what share of the attention work "
                 "does the last rank do? (a fraction or a percentage)", share, "",
                 f"cut the sequence into {t} pieces: piece i attends to i - 1 whole pieces before it and half of "
                 f"itself, i - 0.5 pieces' worth; the last does {t} - 0.5 = {t - 0.5:g} of the {t * t / 2:g} in all "
                 f"({t}^2/2): {share.numerator}/{share.denominator}, {float(share):.0%}"),
        Question(f"The zigzag split instead ({pieces} pieces, rank i taking piece i + 1 and piece {pieces} - i): "
                 f"how many blocks does each rank do, a block being one piece against one piece?", zig, "blocks",
                 f"piece j does j - 0.5 blocks; rank 0 holds pieces 1 and {pieces}: 0.5 + {pieces - 0.5:g} = "
                 f"{pieces:g}, and every rank's pair adds up the same"),
    ]


NARRATIVE = {
    "contiguous split": """
        With a causal mask a token only looks at the tokens before it. Split the sequence into contiguous
        pieces and the first rank's queries need only its own keys, while the last rank's need everyone's:
        the first rank idles while the last one works, and a step lasts as long as its slowest rank.
        Work is counted in blocks: the sequence is cut into 2t pieces and a block is one piece's queries
        against one piece's keys. Blocks entirely in the future are skipped; a diagonal block costs half.
        The table at the end gives each rank's blocks, the same in the post's units (whole CP chunks
        against whole CP chunks, 4 blocks each) and each rank's share of the work.""",
    "zigzag split": """
        Cut the sequence into 2t chunks and give rank i one early chunk (i) and one late chunk (2t-1-i).
        Every rank now holds a short-history and a long-history piece, and all do the same amount of work.""",
}

LESSON = Lesson(
    name="cp-causal",
    section="Context parallelism: the causal load-balancing problem",
    order=110,
    picture=Picture(plot_cp_causal, "the causal blocks each CP rank computes, contiguous and zigzag"),
    title="Causal attention over CP ranks: the imbalance and the zigzag split",
    world=4,
    worlds=CPS,
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="work per rank measured with the contiguous split, then the zigzag split's equal shares",
    keep_values=0,
    # the same step on every rank said once; each split's first ring steps in full (every rank attends its own
    # chunk, K and V passed on, then rank 0 skips a future chunk), the rest counted: the notes give each step
    fold_alike=True,
    events_shown=5,
    knobs={"cp": Knob(4, choices=CPS, world=True,
                      why="the zigzag split cuts the sequence into 2cp equal pieces: 16 tokens, or the next "
                      "multiple of 2cp (18 at --cp 3)")},
    figures=figures,
    tables=tables,
    quiz=quiz,
)

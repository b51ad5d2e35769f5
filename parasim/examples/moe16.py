"""The post's 16-GPU MoE example, run: 4 layers (attention, then 8 experts with top-2 routing) on the moe16
layout (attention TP2 x CP2 x DP2, experts ETP1 x EP4 x EDP2, PP2, SP on), 4 sequences of 8 tokens, one
training step. One token can be watched: every rank holding it notes where it is and what happens to it.

Data: DP replica 0 gets sequences A and B, replica 1 gets C and D; each replica feeds its two sequences
as two micro-batches through the two pipeline stages (1F1B). CP splits a sequence into contiguous halves
(the example's drawing) and SP splits each half between the two TP ranks. After the pipeline, gradients
are summed where copies saw different tokens (attention, norms and router over dp-cp, experts over
expert-dp) by ZeRO-1's reduce-scatter, each rank updates its share with Adam, and the weights are
all-gathered: the one step program (train/step.py), given this example's data.

This module holds the example's data (its sequences, the post's routes, the replicas, finding a token) and
its program; its stage watches a token (examples/watch.py), which examples/moe16_path.py follows in the
trace; examples/moe16_unsplit.py is its step on one device and examples/moe16_exact.py holds a run to it.
"""

from __future__ import annotations

from typing import Any

from ..dp.clip import check_max_norm
from ..errors import LayoutError, UsageError
from ..layout import Layout, preset
from ..nn.routing import POLICIES, Routing, spellings
from ..train.keeps import stores, vars_of
from ..train.whole import dot_loss
from ..train.step import MicroBatches, Phases, StepOptions, train_step
from .watch import WatchStage, note_holder
from ..engine.context import Context

# the post's sentence is sequence A; B, C and D are ours
LAYOUT = "moe16"
# the layers' shapes are the preset model's (no biases: a key bias gets a zero gradient, as softmax ignores
# it, whose rounding noise Adam would scale up)
MOE16 = SHAPE = preset(LAYOUT).model
SEQUENCES = {
    "A": MOE16.tokens,
    "B": ("a", "judge", "read", "the", "new", "law", "out", "loud"),
    "C": ("the", "jury", "found", "the", "claim", "to", "be", "false"),
    "D": ("an", "appeal", "came", "before", "the", "high", "court", "today"),
}
LR = 0.01
MICRO_BATCHES = 2
# The post's step 4, for its sentence (sequence A): contract -> E3 (gate 0.6) and E8 (0.4), "the" -> E1 and
# E2 (the post gives no gates for "the": 0.5 each is ours). Experts 0-based here.
POST_ROUTES = {"contract": ((2, 7), (0.6, 0.4)), "the": ((0, 1), (0.5, 0.5))}
ROUTINGS = ("learned", "post")  # and the policies of nn/routing.py (uniform, balanced, skewed:F)


def scripted(seq: str, positions: Any, routing: str) -> dict[int, tuple]:
    """Rows (a rank's local tokens, in order) the post's routing fixes, with their experts and gates."""
    if routing != "post" or seq != "A":
        return {}
    words = words_of(seq)
    return {row: POST_ROUTES[words[p]] for row, p in enumerate(positions) if words[p] in POST_ROUTES}


def words_of(seq: str) -> tuple[str, ...]:
    """A sequence's words: the post's sentence (A) and ours (B, C, D); on a layout with more DP replicas,
    made-up ones (E, F, ...: 'e1' .. 'e8') of the same length."""
    return SEQUENCES.get(seq) or tuple(f"{seq.lower()}{j + 1}" for j in range(len(SEQUENCES["A"])))


def replicas(dp: int, m: int = MICRO_BATCHES) -> tuple[tuple[str, ...], ...]:
    """DP replica -> its sequences, one micro-batch each: A, B, C, D, then E, F, ..."""
    names = [chr(ord("A") + i) if i < 26 else f"S{i + 1}" for i in range(dp * m)]
    return tuple(tuple(names[d * m : (d + 1) * m]) for d in range(dp))


REPLICAS = replicas(2)  # the example's: replica 0 gets A and B, replica 1 gets C and D


def find_token(word: str, names: Any = None) -> tuple[str, int]:
    """'contract' (first occurrence in sequence A), or 't6', or 'C:t3' -> (sequence, 0-based position);
    `names`: the sequences a layout's replicas hold (default A-D)."""
    names = list(SEQUENCES) if names is None else list(names)
    seq, _, tok = word.rpartition(":")
    seq = seq or "A"
    if seq not in names:
        raise UsageError(f"unknown sequence {seq!r}; sequences: {', '.join(names)}")
    words = words_of(seq)
    if tok[:1] == "t" and tok[1:].isdigit() and 1 <= int(tok[1:]) <= len(words):
        return seq, int(tok[1:]) - 1
    if tok in words:
        return seq, words.index(tok)
    raise UsageError(f"no token {tok!r} in sequence {seq} ({' '.join(words)}); name a word or t1..t{len(words)}")


def embed(ctx: Context, seq: str, hidden: int = SHAPE.hidden) -> Any:
    """A sequence's input: each word's vector plus a position vector, the same on every rank."""
    rows = [
        ctx.shared_rng(f"embed.{w}").normal((hidden,)) + ctx.shared_rng(f"pos.{i}").normal((hidden,), std=0.5)
        for i, w in enumerate(words_of(seq))
    ]
    return ctx.xp.reshape(ctx.xp.stack(rows), (len(rows), 1, hidden))


def target_of(ctx: Context, seq: str, hidden: int = SHAPE.hidden) -> Any:
    """A sequence's target (the loss is sum(y * target)), the same on every rank."""
    return ctx.shared_rng(f"target.{seq}").normal((len(words_of(seq)), 1, hidden))


def check_runnable(layout: Any, m: int = MICRO_BATCHES, routing: str = "learned") -> None:
    """The example runs a layout whose model is small (virtual ranks hold every value): one line otherwise.
    Its layers sit on the stages by the model's rule, which the layout checked (layout/stages.py)."""
    model = layout.model
    if model is None or model.seq != len(SEQUENCES["A"]) or model.hidden > 64 or model.layers > 32:
        raise LayoutError(
            "the token trace runs the example's small model (8-token sequences, hidden 8): give "
            "layout sizes (--tp, --cp, ...) or the moe16 preset, not a preset of a full-size model"
        )
    if m < 1:
        raise LayoutError(f"micro-batches must be at least 1, got {m}")
    if routing not in ROUTINGS and routing.partition(":")[0] not in POLICIES:
        raise LayoutError(f"unknown routing {routing!r}; use {', '.join(ROUTINGS)}, or a policy: {spellings()}")
    if routing not in ROUTINGS:
        Routing.parse(routing)  # a bad F gets its one line here
    if routing == "post" and (model.experts < 8 or model.top_k != 2):
        raise LayoutError("the post's routing picks 2 of experts E1-E8: it needs 8 or more experts, top-2")


def make_program(
    watch: tuple[str, int] | None = ("A", 5),
    layout: Any = None,
    m: int = MICRO_BATCHES,
    routing: str = "learned",
    max_norm: float | None = None,
    residual: bool = False,
):
    """The SPMD program of the example on `layout` (default: the moe16 preset) with `m` micro-batches per
    DP replica, watching token `watch` = (sequence, position); `routing`: the run's own router ("learned"),
    the post's drawn choices for its sentence ("post"), or a policy ("uniform", "balanced", "skewed:F":
    nn/routing.py; symbolic ranks need one); `max_norm`: clip the gradients by their global
    norm over both groups before Adam (None: no clipping, as the lesson runs); `residual`: the token's
    holder also notes, after each MoE layer, the two terms its output is the sum of (`ResidualWatch`)."""
    layout = preset(LAYOUT) if layout is None else layout
    check_runnable(layout, m, routing)
    check_max_norm(max_norm)
    hidden, reps = layout.model.hidden, replicas(layout.dp, m)
    # the step's phases are the stage's own (one per micro-batch and layer), around a data phase; nothing
    # is held in the trace (the lesson is about where values go, not bytes)
    opts = StepOptions(
        micro_batches=m,
        routing=None if routing in ROUTINGS else Routing.parse(routing),
        held=False,
        lr=LR,
        max_norm=max_norm,
        phases=Phases(schedule=None, sync="gradient sync", after="optimizer step"),
    )

    def data(ctx: Context, rows: list[int]) -> MicroBatches:
        """DP replica d's sequences, one a micro-batch; this rank's rows of each (its CP half, its SP share)."""
        replica, xp = reps[ctx.coords.dp], ctx.xp
        ctx.phase("data")
        note_holder(ctx, watch, replica, rows, words_of(watch[0]) if watch else ())
        idx = xp.asarray(rows, dtype=xp.int64)
        return MicroBatches(
            inputs=lambda mb: xp.take(embed(ctx, replica[mb], hidden), idx, axis=0),
            loss=lambda mb, y: dot_loss(xp, y, xp.take(target_of(ctx, replica[mb], hidden), idx, axis=0)),
        )

    def stage(ctx: Context, layers: list, first: int, rows: list[int]) -> WatchStage:
        kind = ResidualWatch if residual else WatchStage
        return kind(ctx, layers, first, watch, reps[ctx.coords.dp], rows, lambda seq: scripted(seq, rows, routing))

    def program(ctx: Context) -> dict:
        # the norms' and router's gradients summed over TP once (each TP rank saw its SP share), then ZeRO-1:
        # gradients reduce-scattered where copies saw different tokens (attention, norms and router over
        # dp-cp, each expert over expert-dp: their placements say which), Adam on each rank's share, the new
        # weights all-gathered; with max_norm, the summed gradients are clipped by the global norm first
        run = train_step(ctx, layout, opts, data, stage)
        c, xp = ctx.coords, ctx.xp
        return {
            "loss": run.loss,
            "last": c.pp == layout.pp - 1,
            "grad_sq": run.share_sq,
            "coords": vars_of(c),
            "weight_sq": {k: float(xp.sum(w * w)) for k, w in run.new.items()},
            "state": run.state,
            "experts": run.experts,
            "positions": run.rows,
            "stores": stores(run.stage, run.state, run.par),
        }

    return program


class ResidualWatch(WatchStage):
    """A watching stage that also notes, on the rank holding the token, after each MoE layer, the two terms of
    the token's output as the layer computed them: the token itself as attention left it (the residual, which
    the layer adds back) and the experts' gate-weighted outputs the combine brought home; their norms, and
    how far the output is from their sum. The note's data (`residual`) is what pictures and checks read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.moe_out: dict[int, Any] = {}  # id(MoE block) -> its output in the last forward
        for layer in self.layers:
            if layer.shape.experts:
                layer.mlp.forward = self._keeping(layer.mlp, layer.mlp.forward)

    def _keeping(self, block: Any, forward: Any) -> Any:
        def kept(x: Any, saved: Any) -> tuple[Any, Any]:
            y, cache = forward(x, saved)
            self.moe_out[id(block)] = y
            return y, cache

        return kept

    def _note_route(self, layer: Any, number: int, row: int) -> None:
        super()._note_route(layer, number, row)
        xp, marked = self.ctx.xp, self.ctx.marked
        # the layer's own marks (nn/layer.py): its input plus attention ("after-attn"), and its output ("out")
        after, out = (
            next(x for name, x in reversed(marked) if name.endswith(f".{layer.key}.{what}"))
            for what in ("after-attn", "out")
        )
        rows = [xp.reshape(t, (t.shape[0], -1))[row] for t in (after, self.moe_out[id(layer.mlp)], out)]
        mine, share, total = rows
        norms = [float(xp.sqrt(xp.sum(t * t))) for t in rows]
        gap = float(xp.max(xp.abs(total - (mine + share))))  # the layer adds them so: exactly 0
        word = words_of(self.watch[0])[self.watch[1]]
        picks = [(e + 1, round(float(g), 4)) for e, g in layer.mlp.last_routing[row]]
        terms = " + ".join(f"{g:.2f} x E{e}({word})" for e, g in picks)
        self.ctx.note(
            f"layer {number}: output = {word} + {terms}: {word} itself as attention left it (the residual, "
            f"norm {norms[0]:.3g}) plus the experts' share the combine brought back (norm {norms[1]:.3g}), "
            f"each expert run on the normed token; the output (norm {norms[2]:.3g}) is their sum"
            + (" exactly" if gap == 0 else f" to {gap:.1e}"),
            residual=word,
            layer=number,
            experts=[e for e, _ in picks],
            gates=[g for _, g in picks],
            norms={"residual": norms[0], "experts": norms[1], "output": norms[2]},
            gap=gap,
        )


def program_on(sizes: dict, max_norm: float | None = None, routing: str = "post") -> tuple[Any, int]:
    """The example's step on other layout sizes ({"tp": 1, "pp": 2, "ep": 2, "sp": True, ...}), the same
    sequences spread over its DP replicas and routed as the lessons route them (the post's drawing by default),
    so that its layers mark the same tensors as on the preset (a reference for `parasim check
    --reference-layout`): (program, world)."""
    base = preset(LAYOUT)
    layout = Layout(**{"etp": 1, "zigzag": base.zigzag, **sizes}, model=base.model)
    seqs = sum(len(rep) for rep in REPLICAS)
    if seqs % layout.dp:
        raise LayoutError(f"the example's {seqs} sequences do not split evenly over dp {layout.dp}")
    return make_program(None, layout, seqs // layout.dp, routing=routing, max_norm=max_norm), layout.world

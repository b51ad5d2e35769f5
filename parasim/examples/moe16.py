"""The post's 16-GPU MoE example, run: 4 layers (attention, then 8 experts with top-2 routing) on the moe16
layout (attention TP2 x CP2 x DP2, experts ETP1 x EP4 x EDP2, PP2, SP on), 4 sequences of 8 tokens, one
training step. One token can be watched: every rank holding it notes where it is and what happens to it.

Data: DP replica 0 gets sequences A and B, replica 1 gets C and D; each replica feeds its two sequences
as two micro-batches through the two pipeline stages (1F1B). CP splits a sequence into contiguous halves
(the example's drawing) and SP splits each half between the two TP ranks. After the pipeline, gradients
are summed where copies saw different tokens (attention, norms and router over dp-cp, experts over
expert-dp) by ZeRO-1's reduce-scatter, each rank updates its share with Adam, and the weights are
all-gathered.
"""
from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..nn import Saved, ParallelContext
from ..nn.layer import Stack, StackWeights, TransformerLayer, expert_weights, layer_weights
from ..layout import preset
from ..dp.zero import Zero1Adam, zero1_step
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import generate

# the post's sentence is sequence A; B, C and D are ours
LAYOUT = "moe16"
# the layers' shapes are the preset model's (no biases: a key bias gets a zero gradient, as softmax ignores
# it, whose rounding noise Adam would scale up)
MOE16 = SHAPE = preset(LAYOUT).model
SEQUENCES = {"A": MOE16.tokens,
             "B": ("a", "judge", "read", "the", "new", "law", "out", "loud"),
             "C": ("the", "jury", "found", "the", "claim", "to", "be", "false"),
             "D": ("an", "appeal", "came", "before", "the", "high", "court", "today")}
REPLICAS = (("A", "B"), ("C", "D"))  # DP replica -> its sequences, one micro-batch each
LR = 0.01


def find_token(word: str) -> tuple[str, int]:
    """'contract' (first occurrence in sequence A), or 't6', or 'C:t3' -> (sequence, 0-based position)."""
    seq, _, tok = word.rpartition(":")
    seq = seq or "A"
    if seq not in SEQUENCES:
        raise UsageError(f"unknown sequence {seq!r}; sequences: {', '.join(SEQUENCES)}")
    words = SEQUENCES[seq]
    if tok[:1] == "t" and tok[1:].isdigit() and 1 <= int(tok[1:]) <= len(words):
        return seq, int(tok[1:]) - 1
    if tok in words:
        return seq, words.index(tok)
    raise UsageError(f"no token {tok!r} in sequence {seq} ({' '.join(words)}); name a word or t1..t{len(words)}")


def _embed(ctx: Any, seq: str) -> Any:
    """A sequence's input: each word's vector plus a position vector, the same on every rank."""
    rows = [ctx.shared_rng(f"embed.{w}").normal((SHAPE.hidden,)) + ctx.shared_rng(f"pos.{i}").normal(
        (SHAPE.hidden,), std=0.5) for i, w in enumerate(SEQUENCES[seq])]
    return ctx.xp.reshape(ctx.xp.stack(rows), (len(rows), 1, SHAPE.hidden))


def _target(ctx: Any, seq: str) -> Any:
    return ctx.shared_rng(f"target.{seq}").normal((len(SEQUENCES[seq]), 1, SHAPE.hidden))


class WatchStage(StackWeights):
    """A pipeline stage of layers that marks phases per (micro-batch, layer) and, on the rank holding the
    watched token, notes where the MoE routed it."""

    def __init__(self, ctx: Any, layers: list, first: int, watch: tuple[str, int] | None, replica: tuple,
                 positions: list[int]) -> None:
        self.ctx, self.layers, self.first, self.watch, self.replica = ctx, layers, first, watch, replica
        self.positions = positions  # the sequence positions this rank holds between matmuls
        self.stack = Stack(layers)
        self.f_calls = self.b_calls = 0

    def _mine(self, mb: int) -> int | None:
        """The watched token's row in this rank's slice of micro-batch mb, or None."""
        if self.watch is None or self.replica[mb] != self.watch[0]:
            return None
        pos = self.positions
        return pos.index(self.watch[1]) if self.watch[1] in pos else None

    def forward(self, x: Any) -> tuple[Any, Any]:
        mb, self.f_calls = self.f_calls, self.f_calls + 1
        caches = []
        for i, layer in enumerate(self.layers):
            self.ctx.phase(f"forward mb{mb + 1} layer {self.first + i + 1}", direction="forward", micro_batch=mb + 1,
                           layer=self.first + i + 1)
            x, c = layer.forward(x, Saved())
            caches.append(c)
            row = self._mine(mb)
            if row is not None:
                me = self.ctx.rank
                picks = [(e, g, self._owner(layer, e)) for e, g in layer.mlp.last_routing[row]]
                routes = ", ".join(f"E{e + 1} (gate {g:.2f}) on " + ("this GPU" if r == me else f"g{r}")
                                   for e, g, r in picks)
                away = sorted({r for _, _, r in picks if r != me})
                trip = (f"dispatch sends it to {', '.join(f'g{r}' for r in away)} (once per GPU) and combine brings "
                        "the gate-weighted outputs back") if away else "both experts are here: it stays put"
                self.ctx.note(f"layer {self.first + i + 1}: the router picks {routes}; {trip}",
                              watch="route", layer=self.first + i + 1, experts=[e + 1 for e, _, _ in picks],
                              gpus=[r for _, _, r in picks])
        return x, caches

    def _owner(self, layer: Any, e: int) -> int:
        return self.ctx.groups["ep"].ranks[layer.mlp.owner(e)]

    def backward(self, caches: Any, dy: Any) -> Any:
        mb, self.b_calls = self.b_calls, self.b_calls + 1
        for i in reversed(range(len(self.layers))):
            self.ctx.phase(f"backward mb{mb + 1} layer {self.first + i + 1}", direction="backward",
                           micro_batch=mb + 1, layer=self.first + i + 1)
            dy = self.layers[i].backward(caches[i], dy)
        return dy


def make_program(watch: tuple[str, int] | None = ("A", 5)):
    """The SPMD program of the example, watching token `watch` = (sequence, position)."""
    layout = preset(LAYOUT)

    def program(ctx: Any) -> dict:
        ctx.use_layout(layout)
        g, c = ctx.groups, ctx.coords
        replica = REPLICAS[c.dp]
        tp = ParallelContext.from_layout(ctx, layout)  # the layout's groups, SP, CP split and sequence length
        mine = tp.token_positions()  # the layers' own split: this rank's CP half, then its SP share of that
        ctx.phase("data")
        if watch is not None and watch[0] in replica and watch[1] in mine:
            words = SEQUENCES[watch[0]]
            ctx.note(f"holds {words[watch[1]]!r} (t{watch[1] + 1} of {watch[0]}): DP replica {c.dp}, "
                     f"micro-batch {replica.index(watch[0]) + 1}; CP rank {c.cp}; SP share "
                     + " ".join(f"t{p + 1}" for p in mine) + f"; pipeline stage {c.pp + 1}",
                     watch="holds", token=f"{words[watch[1]]!r} (t{watch[1] + 1} of {watch[0]})",
                     positions=[p + 1 for p in mine], stage=c.pp + 1)
        per = MOE16.layers // layout.pp
        first = c.pp * per
        weights = {i: layer_weights(ctx, SHAPE, f"L{i}") for i in range(first, first + per)}
        layers = [TransformerLayer(tp, SHAPE, w, key=f"L{i}", name=f"layer {i + 1}") for i, w in weights.items()]
        experts = [held_experts(ctx, layer, w) for layer, w in zip(layers, weights.values())]
        stage = WatchStage(ctx, layers, first, watch, replica, mine)
        xp = ctx.xp
        idx = xp.asarray(mine, dtype=xp.int64)

        def inputs(mb: int) -> Any:
            return xp.take(_embed(ctx, replica[mb]), idx, axis=0)

        def loss(mb: int, y: Any) -> tuple[Any, Any]:
            target = xp.take(_target(ctx, replica[mb]), idx, axis=0)
            return float(xp.sum(y * target)), target
        plan = generate("1f1b", layout.pp, len(replica))
        total = run_schedule(ctx, g["pp"], plan, {c.pp: stage}, (len(mine), 1, SHAPE.hidden), xp.float64, inputs, loss)
        # ZeRO-1: gradients reduce-scattered where copies saw different tokens (attention, norms and router
        # over dp-cp, each expert over expert-dp: their placements say which), Adam on each rank's share,
        # the new weights all-gathered
        ctx.phase("gradient sync")
        new, share_sq, state = zero1_step(ctx, stage, LR)
        stage.load(new)
        ctx.phase("optimizer step")
        return {"loss": total, "last": c.pp == layout.pp - 1, "grad_sq": share_sq, "coords": vars_of(c),
                "weight_sq": {k: float(xp.sum(w * w)) for k, w in new.items()}, "state": state,
                "experts": experts, "positions": mine}
    return program


def held_experts(ctx: Any, layer: Any, weights: dict) -> list[int]:
    """The experts (0-based) whose weights this rank holds in `layer`, found from the weights themselves:
    each local expert's first matrix matched against every expert's in the whole layer's `weights`."""
    whole = expert_weights(weights, SHAPE)
    return [e for local in layer.mlp.experts for e, w in enumerate(whole) if bool(ctx.xp.all(local["w1"] == w["w1"]))]


def vars_of(coords: Any) -> dict[str, int]:
    return {k: getattr(coords, k) for k in ("tp", "cp", "dp", "pp", "ep", "edp")}


def unsplit_program(ctx: Any) -> dict:
    """The same model on one device: all 4 sequences, all 4 layers, every expert; loss, gradients, and the
    weights after the same Adam step."""
    tp = ParallelContext(ctx)
    layers = [TransformerLayer(tp, SHAPE, layer_weights(ctx, SHAPE, f"L{i}"), key=f"L{i}", name=f"layer {i + 1}")
              for i in range(MOE16.layers)]
    stack = Stack(layers)
    total = 0.0
    for seq in SEQUENCES:
        y, cache = stack.forward(_embed(ctx, seq), Saved())
        target = _target(ctx, seq)
        total += float(ctx.xp.sum(y * target))
        stack.backward(cache, target)
    grads = stack.grads
    one = ctx.new_group([0], "dp")
    new, _ = Zero1Adam(ctx, one, stack.params(), lr=LR).step(grads)  # a group of one: plain Adam
    sq = lambda d: {k: float(ctx.xp.sum(w * w)) for k, w in d.items()}  # noqa: E731
    return {"loss": total, "grad_sq": sq(grads), "weight_sq": sq(new)}


def token_path(trace: Any, watch: tuple[str, int]) -> dict:
    """Where the watched token went, from the run's own trace: the notes its holders left and every event
    they took part in while working on its micro-batch, in order; then the gradient sums they joined."""
    seq, pos = watch
    mb = next(i for rep in REPLICAS for i, s in enumerate(rep) if s == seq) + 1
    notes = trace.notes("watch")  # (phase, rank, text, data) left by the ranks holding the token
    # each phase's fields: which direction, micro-batch and layer it is (read, never parsed from its name)
    fields = {m.text: m.data for m in trace.marks if m.kind == "phase" and m.data}
    at = {(d["direction"], d["micro_batch"], d["layer"]): name for name, d in fields.items()}
    holders = {fields[ph]["layer"]: r for ph, r, _, _ in notes if ph in fields}  # layer -> holder (forward)
    steps: list[dict] = [{"phase": "data", "ranks": [r], "text": f"g{r}: {t}"} for ph, r, t, d in notes
                         if d["watch"] == "holds"]
    layers = sorted({d["layer"] for _, _, _, d in notes if d["watch"] == "route"})
    for direction, order in (("forward", layers), ("backward", layers[::-1])):
        for layer in order:
            phase, rank = at[(direction, mb, layer)], holders.get(layer)
            said = [{"phase": phase, "direction": direction, "ranks": [r], "text": f"g{r}: {t}"}
                    for ph, r, t, _ in notes if ph == phase]
            for e in trace.events:
                if e.phase == phase and rank in e.ranks and e.kind != "compute":
                    if e.op == "all_to_all" and said:  # the routing, just before the dispatch it decides
                        steps += said
                        said = []
                    steps.append({"phase": phase, "direction": direction, "ranks": e.ranks, "event": e.seq,
                                  "op": e.op, "group": e.group.name, "text": _say(e, rank)})
            steps += said
    final = set(holders.values())
    for e in trace.events:  # ZeRO-1: the holders' gradient sums and weight gathers
        if e.phase == "gradient sync" and final & set(e.ranks):
            rank = min(final & set(e.ranks))
            steps.append({"phase": "gradient sync", "ranks": e.ranks, "event": e.seq, "op": e.op,
                          "group": e.group.name, "text": _say(e, rank)})
    return {"token": SEQUENCES[seq][pos], "sequence": seq, "position": pos + 1, "micro_batch": mb,
            "layout": LAYOUT, "steps": steps}


def _say(e: Any, rank: int) -> str:
    """One line for an event the token's holder took part in."""
    if e.kind == "p2p":
        src, dst = e.params["src"], e.params["dst"]
        way = f"g{src} -> g{dst}"
    else:
        way = f"{e.op.replace('_', '-')} over {e.group.name} " + "{" + ", ".join(f"g{r}" for r in e.ranks) + "}"
    m = e.member(rank)
    return f"{way}: {e.label or e.op}  (g{rank} sent {m.sent:,} B, received {m.recv:,} B)"

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

import math
from typing import Any

from ..errors import LayoutError, UsageError
from ..nn import ParallelContext, Saved, Shard
from ..nn.layer import Stack, StackWeights, TransformerLayer, layer_weights
from ..nn.routing import KINDS as POLICIES, Routing
from ..layout import Layout, preset
from ..dp.clip import check_max_norm, clip_coefficient
from ..dp.zero import Zero1Adam, zero1_step
from ..engine.virtual import run_virtual
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import generate
from .keeps import held_experts, stores, vars_of  # noqa: F401  (what a GPU keeps: shared with examples/step.py)

# the post's sentence is sequence A; B, C and D are ours
LAYOUT = "moe16"
# the layers' shapes are the preset model's (no biases: a key bias gets a zero gradient, as softmax ignores
# it, whose rounding noise Adam would scale up)
MOE16 = SHAPE = preset(LAYOUT).model
SEQUENCES = {"A": MOE16.tokens,
             "B": ("a", "judge", "read", "the", "new", "law", "out", "loud"),
             "C": ("the", "jury", "found", "the", "claim", "to", "be", "false"),
             "D": ("an", "appeal", "came", "before", "the", "high", "court", "today")}
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
    return tuple(tuple(names[d * m:(d + 1) * m]) for d in range(dp))


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


def _embed(ctx: Any, seq: str, hidden: int = SHAPE.hidden) -> Any:
    """A sequence's input: each word's vector plus a position vector, the same on every rank."""
    rows = [ctx.shared_rng(f"embed.{w}").normal((hidden,)) + ctx.shared_rng(f"pos.{i}").normal(
        (hidden,), std=0.5) for i, w in enumerate(words_of(seq))]
    return ctx.xp.reshape(ctx.xp.stack(rows), (len(rows), 1, hidden))


def _target(ctx: Any, seq: str, hidden: int = SHAPE.hidden) -> Any:
    return ctx.shared_rng(f"target.{seq}").normal((len(words_of(seq)), 1, hidden))


class WatchStage(StackWeights):
    """A pipeline stage of layers that marks phases per (micro-batch, layer) and, on the rank holding the
    watched token, notes where the MoE routed it."""

    def __init__(self, ctx: Any, layers: list, first: int, watch: tuple[str, int] | None, replica: tuple,
                 positions: list[int], routing: str = "learned") -> None:
        self.ctx, self.layers, self.first, self.watch, self.replica = ctx, layers, first, watch, replica
        self.routing = routing
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
            if layer.shape.experts:
                layer.mlp.scripted = scripted(self.replica[mb], self.positions, self.routing)
            x, c = layer.forward(x, Saved(tag=self.replica[mb]))  # the layers mark their outputs
            caches.append(c)
            row = self._mine(mb)
            if row is not None and not layer.shape.experts:
                self.ctx.note(f"layer {self.first + i + 1}: attention and the MLP work on it here",
                              watch="layer", layer=self.first + i + 1)
            elif row is not None:
                me = self.ctx.rank
                picks = [(e, g, self._owner(layer, e)) for e, g in layer.mlp.last_routing[row]]
                routes = ", ".join(f"E{e + 1} (gate {g:.2f}) on " + ("this GPU" if r == me else f"g{r}")
                                   for e, g, r in picks)
                away = sorted({r for _, _, r in picks if r != me})
                trip = (f"dispatch sends it to {', '.join(f'g{r}' for r in away)} (once per GPU) and combine brings "
                        "the gate-weighted outputs back") if away else "both experts are here: it stays put"
                who = "the post's routing (scripted) picks" if row in layer.mlp.scripted else "the router picks"
                self.ctx.note(f"layer {self.first + i + 1}: {who} {routes}; {trip}",
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


def check_runnable(layout: Any, m: int = MICRO_BATCHES, routing: str = "learned") -> None:
    """The example runs a layout whose model is small (virtual ranks hold every value) and whose layers
    split evenly over its stages: one line otherwise."""
    model = layout.model
    if model is None or model.seq != len(SEQUENCES["A"]) or model.hidden > 64 or model.layers > 32:
        raise LayoutError("the token trace runs the example's small model (8-token sequences, hidden 8): give "
                          "layout sizes (--tp, --cp, ...) or the moe16 preset, not a preset of a full-size model")
    if model.layers % layout.pp:
        raise LayoutError(f"layers {model.layers} do not divide by pp {layout.pp} (the example's stages are even)")
    if m < 1:
        raise LayoutError(f"micro-batches must be at least 1, got {m}")
    if routing not in ROUTINGS and routing.partition(":")[0] not in POLICIES:
        raise LayoutError(f"unknown routing {routing!r}; use {', '.join(ROUTINGS)}, or a policy: uniform, "
                          "balanced, skewed:F")
    if routing not in ROUTINGS:
        Routing.parse(routing)  # a bad F gets its one line here
    if routing == "post" and (model.experts < 8 or model.top_k != 2):
        raise LayoutError("the post's routing picks 2 of experts E1-E8: it needs 8 or more experts, top-2")


def make_program(watch: tuple[str, int] | None = ("A", 5), layout: Any = None, m: int = MICRO_BATCHES,
                 routing: str = "learned", max_norm: float | None = None):
    """The SPMD program of the example on `layout` (default: the moe16 preset) with `m` micro-batches per
    DP replica, watching token `watch` = (sequence, position); `routing`: the run's own router ("learned"),
    the post's drawn choices for its sentence ("post"), or a policy ("uniform", "balanced", "skewed:F":
    nn/routing.py; symbolic ranks need one); `max_norm`: clip the gradients by their global
    norm over both groups before Adam (None: no clipping, as the lesson runs)."""
    layout = preset(LAYOUT) if layout is None else layout
    check_runnable(layout, m, routing)
    check_max_norm(max_norm)
    model, reps = layout.model, replicas(layout.dp, m)
    policy = None if routing in ROUTINGS else Routing.parse(routing)

    def program(ctx: Any) -> dict:
        ctx.use_layout(layout)
        g, c = ctx.groups, ctx.coords
        replica = reps[c.dp]
        # the layout's groups, SP, CP split and sequence length; SP's partial gradients summed once per step
        tp = ParallelContext.from_layout(ctx, layout, partial_sums="step", routing=policy)
        mine = tp.token_positions()  # the layers' own split: this rank's CP half, then its SP share of that
        ctx.phase("data")
        if watch is not None and watch[0] in replica and watch[1] in mine:
            words = words_of(watch[0])
            ctx.note(f"holds {words[watch[1]]!r} (t{watch[1] + 1} of {watch[0]}): DP replica {c.dp}, "
                     f"micro-batch {replica.index(watch[0]) + 1}; CP rank {c.cp}; SP share "
                     + " ".join(f"t{p + 1}" for p in mine) + f"; pipeline stage {c.pp + 1}",
                     watch="holds", token=f"{words[watch[1]]!r} (t{watch[1] + 1} of {watch[0]})",
                     positions=[p + 1 for p in mine], stage=c.pp + 1)
        per = model.layers // layout.pp
        first = c.pp * per
        weights = {i: layer_weights(ctx, model, f"L{i}") for i in range(first, first + per)}
        layers = [TransformerLayer(tp, model, w, key=f"L{i}", name=f"layer {i + 1}") for i, w in weights.items()]
        experts = [held_experts(ctx, layer, w) for layer, w in zip(layers, weights.values())]
        stage = WatchStage(ctx, layers, first, watch, replica, mine, routing)
        xp = ctx.xp
        idx = xp.asarray(mine, dtype=xp.int64)

        def inputs(mb: int) -> Any:
            return xp.take(_embed(ctx, replica[mb], model.hidden), idx, axis=0)

        def loss(mb: int, y: Any) -> tuple[Any, Any]:
            target = xp.take(_target(ctx, replica[mb], model.hidden), idx, axis=0)
            return float(xp.sum(y * target)), target
        plan = generate("1f1b", layout.pp, len(replica))
        total = run_schedule(ctx, g["pp"], plan, {c.pp: stage}, (len(mine), 1, model.hidden), xp.float64, inputs,
                             loss)
        # the norms' and router's gradients summed over TP once (each TP rank saw its SP share), then ZeRO-1:
        # gradients reduce-scattered where copies saw different tokens (attention, norms and router over
        # dp-cp, each expert over expert-dp: their placements say which), Adam on each rank's share, the new
        # weights all-gathered; with max_norm, the summed gradients are clipped by the global norm first
        ctx.phase("gradient sync")
        new, share_sq, state = zero1_step(ctx, stage, LR, partials=True, max_norm=max_norm)
        stage.load(new)
        ctx.phase("optimizer step")
        return {"loss": total, "last": c.pp == layout.pp - 1, "grad_sq": share_sq, "coords": vars_of(c),
                "weight_sq": {k: float(xp.sum(w * w)) for k, w in new.items()}, "state": state,
                "experts": experts, "positions": mine, "stores": stores(stage, state, tp)}
    return program


def program_on(sizes: dict, max_norm: float | None = None) -> tuple[Any, int]:
    """The example's step on other layout sizes ({"tp": 1, "pp": 2, "ep": 2, "sp": True, ...}), the same
    sequences spread over its DP replicas, so that its layers mark the same tensors as on the preset (a
    reference for `parasim check --reference-layout`): (program, world)."""
    base = preset(LAYOUT)
    layout = Layout(**{"etp": 1, "zigzag": base.zigzag, **sizes}, model=base.model)
    seqs = sum(len(rep) for rep in REPLICAS)
    if seqs % layout.dp:
        raise LayoutError(f"the example's {seqs} sequences do not split evenly over dp {layout.dp}")
    return make_program(None, layout, seqs // layout.dp, max_norm=max_norm), layout.world


def unsplit_run(ctx: Any, model: Any, seqs: list[str], routing: str = "learned",
                max_norm: float | None = None) -> dict:
    """`model` on one device over sequences `seqs`: the reference every split run is checked against; with
    `max_norm`, the whole gradient clipped by its norm before Adam, as on one device."""
    tp = ParallelContext(ctx)
    layers = [TransformerLayer(tp, model, layer_weights(ctx, model, f"L{i}"), key=f"L{i}", name=f"layer {i + 1}")
              for i in range(model.layers)]
    stack = Stack(layers)
    total = 0.0
    for seq in seqs:
        for layer in layers if model.experts else []:  # the same scripted routes as the split run
            layer.mlp.scripted = scripted(seq, range(len(words_of(seq))), routing)
        y, cache = stack.forward(_embed(ctx, seq, model.hidden), Saved(tag=seq))  # marked as the split run's
        target = _target(ctx, seq, model.hidden)
        total += float(ctx.xp.sum(y * target))
        stack.backward(cache, target)
    grads = stack.grads
    norm = math.sqrt(sum(float(ctx.xp.sum(g * g)) for g in grads.values()))  # one device: nothing to count twice
    if max_norm is not None:
        coef = clip_coefficient(norm, max_norm)
        grads = {k: g * coef for k, g in grads.items()}
    one = ctx.new_group([0], "dp")
    new, _ = Zero1Adam(ctx, one, stack.params(), lr=LR).step(grads)  # a group of one: plain Adam
    sq = lambda d: {k: float(ctx.xp.sum(w * w)) for k, w in d.items()}  # noqa: E731
    return {"loss": total, "grad_sq": sq(stack.grads), "weight_sq": sq(new), "grad_norm": norm}


def whole_over_tp(model: Any) -> set[str]:
    """The weights every TP rank holds whole (their gradients summed in-layer under SP), as the layers'
    placements declare them: one layer of the example built on a TP pair."""
    def program(ctx):
        pair = ctx.new_group([0, 1], "tp")
        # no EP group: the experts' placements name no tp, and a pair would refuse a model of one expert
        layer = TransformerLayer(ParallelContext(ctx, pair, sp=True), model, layer_weights(ctx, model, "L0"))
        return {k for k, p in layer.placements.items() if "tp" in p and not isinstance(p["tp"], Shard)}
    return run_virtual(program, 2).values[0]


def _take(c: dict, key: str, whole: bool, replicated_names: set[str]) -> bool:
    """Which ranks' numbers add up to one copy of a weight: attention shards from both TP ranks, replicated
    weights from TP rank 0, experts from their owner; `whole`: each rank has the whole (gathered) weight,
    so one DP/CP copy is enough; else each rank has its ZeRO share, and a copy's shares are summed."""
    replicated = key.split(".", 1)[1] in replicated_names  # 'L3.ln1.weight' -> 'ln1.weight'
    if ".expert" in key:
        return c["edp"] == 0 if whole else True
    return (c["tp"] == 0 or not replicated) and (not whole or (c["dp"] == 0 and c["cp"] == 0))


def fingerprint(values: list[dict], field: str, whole: bool, model: Any) -> dict[str, float]:
    """One copy of every weight's sum of squares, added up from the ranks that hold its pieces."""
    out: dict[str, float] = {}
    replicated = whole_over_tp(model)
    for v in values:
        for k, g in v[field].items():
            if _take(v["coords"], k, whole, replicated):
                out[k] = out.get(k, 0.0) + g
    return out


def agree(got: dict, ref: dict, rtol: float) -> str:
    n = sum(abs(got[k] - g) <= rtol * max(1.0, abs(g)) for k, g in ref.items())
    return f"{n} of {len(ref)} weights"


def exactness(values: list[dict], layout: Any, m: int = MICRO_BATCHES, routing: str = "learned",
              max_norm: float | None = None) -> dict:
    """A run of `make_program(.., layout, m, max_norm=..)` against the unsplit model over the same sequences:
    the loss, and every gradient and every weight after Adam (sums of squares, relative 1e-9)."""
    model, seqs = layout.model, [s for rep in replicas(layout.dp, m) for s in rep]
    ref = run_virtual(lambda ctx: unsplit_run(ctx, model, seqs, routing, max_norm), 1).values[0]
    # each token's loss once: on the last stage, from one TP rank unless SP split the tokens between them
    loss = sum(v["loss"] for v in values if v["last"] and (layout.sp or v["coords"]["tp"] == 0))
    grads = agree(fingerprint(values, "grad_sq", False, model), ref["grad_sq"], 1e-9)
    weights = agree(fingerprint(values, "weight_sq", True, model), ref["weight_sq"], 1e-9)
    every = f"{len(ref['grad_sq'])} of {len(ref['grad_sq'])} weights"
    return {"loss": loss, "unsplit_loss": ref["loss"], "gradients": grads, "weights_after_adam": weights,
            "exact": abs(loss - ref["loss"]) <= 1e-12 * max(1.0, abs(ref["loss"])) and grads == every
            and weights == every}


def token_path(trace: Any, watch: tuple[str, int], reps: Any = REPLICAS, layout: str = LAYOUT) -> dict:
    """Where the watched token went, from the run's own trace: the notes its holders left and every event
    they took part in while working on its micro-batch, in order; then the gradient sums they joined."""
    seq, pos = watch
    mb = next(i for rep in reps for i, s in enumerate(rep) if s == seq) + 1
    notes = trace.notes("watch")  # (phase, rank, text, data) left by the ranks holding the token
    # each phase's fields: which direction, micro-batch and layer it is (read, never parsed from its name)
    fields = {m.text: m.data for m in trace.marks if m.kind == "phase" and m.data}
    at = {(d["direction"], d["micro_batch"], d["layer"]): name for name, d in fields.items()}
    holders = {fields[ph]["layer"]: r for ph, r, _, _ in notes if ph in fields}  # layer -> holder (forward)
    steps: list[dict] = [{"phase": "data", "ranks": [r], "text": f"g{r}: {t}"} for ph, r, t, d in notes
                         if d["watch"] == "holds"]
    layers = sorted({d["layer"] for _, _, _, d in notes if d["watch"] in ("route", "layer")})
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
    return {"token": words_of(seq)[pos], "sequence": seq, "position": pos + 1, "micro_batch": mb,
            "layout": layout, "steps": steps}


def _say(e: Any, rank: int) -> str:
    """One line for an event the token's holder took part in."""
    if e.kind == "p2p":
        src, dst = e.params["src"], e.params["dst"]
        way = f"g{src} -> g{dst}"
    else:
        way = f"{e.op.replace('_', '-')} over {e.group.name} " + "{" + ", ".join(f"g{r}" for r in e.ranks) + "}"
    m = e.member(rank)
    return f"{way}: {e.label or e.op}  (g{rank} sent {m.sent:,} B, received {m.recv:,} B)"

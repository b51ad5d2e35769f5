"""Data parallelism and ZeRO-1/2/3 on 8 ranks: what each rank holds and what moves, measured.

One small model (two transformer layers without biases, 1,088 weights) on 8 data-parallel ranks, each with its own
sequence, takes one Adam step four times over: plain DP, ZeRO-1, ZeRO-2 and ZeRO-3. Every buffer a rank
keeps is told to the trace as it appears and goes (in the training dtypes: 2-byte weights, gradients and
activations, 12 bytes of fp32 master weights and Adam moments), so the bytes per parameter, each rank's
peak and where it falls are counted by the engine. The checks compare them with the estimator's formulas
and every step with one device that saw all eight sequences.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from parasim.dp.held import HeldActivations
from parasim.dp.sharded import ShardedAdam
from parasim.dp.zero3 import Zero3
from parasim.engine import run
from parasim.estimate import Plan, breakdown, get_model
from parasim.estimate.memory import items, layer_bytes_per_token, scores_bytes_per_token_key
from parasim.estimate.traffic import dp_traffic
from parasim.layout import ModelSpec
from parasim.examples.quiz import Question
from parasim.lesson import Check, Knob, Lesson, Picture, Table, check
from parasim.render.plot_lessons import plot_zero_stages
from parasim.train.whole import forward_backward, sequences, whole_layers
from parasim.nn.layer import Stack

# No biases: the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by every
# key), and Adam, dividing by |g| + eps, would turn its rounding noise into a step of lr * noise / eps: the
# real ranks, which sum in another order, would then differ from the virtual ones in the 11th digit.
SHAPE = ModelSpec(hidden=8, heads=2, ffn=16, layers=2, bias=False)
S = 4  # tokens per sequence; one sequence per rank
LR = 0.01
BUCKET = 400  # values per gradient bucket (three buckets for the 1,088 weights)
STAGES = {"DP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}
KINDS = ("weights", "gradients", "optimizer")
POST_27B_AT_8 = {"DP": 432, "ZeRO-1": 148.5, "ZeRO-2": 101, "ZeRO-3": 54}  # the post's per-GPU column, GB


def model_state_27b(dp: int) -> dict[str, float]:
    """The post's 27B model's weights, gradients and Adam state per GPU, in GB, under each technique over `dp`
    DP ranks: the estimator's model state, as the memory lesson's ZeRO table computes it."""
    model = get_model("27b")
    return {name: breakdown(model, Plan(dp=dp, zero=z), 1).model_state / 1e9 for name, z in STAGES.items()}


def _stack(ctx, wrap=None) -> Stack:
    """The model, whole, each layer's activations told to the trace (and, with `wrap`, wrapped first)."""
    layers = whole_layers(ctx, SHAPE, 0, SHAPE.layers)
    return Stack([HeldActivations(ctx, wrap(lay) if wrap else lay) for lay in layers])


def _forward_backward(ctx, stack: Stack, seqs) -> float:
    """Each sequence's loss is sum(y * target); gradients add up over the sequences."""
    return forward_backward(ctx, stack, ((sequences(ctx, "x", [s], S, SHAPE.hidden),
                                          sequences(ctx, "t", [s], S, SHAPE.hidden)) for s in seqs))


def program(ctx):
    dp = ctx.new_group(range(ctx.world), "dp")
    out, held = {}, []
    for name, stage in STAGES.items():
        ctx.phase(name, zero=stage)
        for h in held:  # the previous technique's buffers go: each starts from an empty rank
            h.release()
        if stage < 3:
            stack = _stack(ctx)
            opt = ShardedAdam(ctx, dp, stack.params(), stage, lr=LR, bucket=BUCKET, name=name)
            loss = _forward_backward(ctx, stack, [ctx.rank])
            opt.step(stack.grads)
            if stage == 0 and ctx.rank == 0:  # the wire carries this run's values, not a training run's
                t, item = ctx.world, 8  # float64: every sum compares exactly with one device's
                ctx.note(f"the buckets travel as float64 ({item} bytes a value): an all-reduce of {BUCKET} values "
                         f"sends 2({t}-1)/{t} x {BUCKET} x {item} = {2 * (t - 1) * BUCKET * item // t:,} B per rank; in "
                         f"bf16 it would send a quarter of that. Memory is counted in a training run's dtypes.", run=True)
            got = {"weights": opt.weights, "grad": opt.share_grad, "ranges": opt.ranges()}
            held = [opt.holdings]
        else:
            shards = []
            stack = _stack(ctx, lambda lay: shards.append(Zero3(ctx, lay, dp, lr=LR)) or shards[-1])
            loss = _forward_backward(ctx, stack, [ctx.rank])
            for z in shards:
                z.step()
            got = {"shards": [z.shard for z in shards], "grad": [z.last_grad for z in shards]}
            held = [z.holdings for z in shards]
        out[name] = {"loss": loss, **got}
    return out


def _one_device(world: int) -> dict:
    """All the ranks' sequences on one device: the mean of their losses, its gradient, one Adam step."""
    def one(ctx):
        stack = _stack(ctx)
        layers = [lay.params() for lay in stack.layers]
        loss = _forward_backward(ctx, stack, range(world)) / world
        grads = {k: g / world for k, g in stack.grads.items()}
        # Adam's first step written out, not the optimizers under test: m and v start at zero, so after bias
        # correction the step is lr * g / (|g| + eps)
        new = {k: w - LR * grads[k] / (ctx.xp.abs(grads[k]) + 1e-8) for k, w in stack.params().items()}
        return {"loss": loss, "grads": grads, "new": new, "layers": layers}
    return run(one, 1).values[0]


def _flat(d: dict) -> np.ndarray:
    return np.concatenate([np.asarray(d[k], dtype=float).ravel() for k in sorted(d)])


def _assemble(parts, n: int) -> np.ndarray:
    """A flat vector from each rank's (ranges, values): the pieces put back where they came from."""
    out = np.zeros(n)
    for ranges, values in parts:
        start = 0
        for lo, hi in ranges:
            out[lo:hi] = values[start:start + hi - lo]
            start += hi - lo
    return out


def _at_rest(trace, rank: int, name: str) -> dict[str, int]:
    """What `rank` held after technique `name`'s step: just before the next technique began, or at the end."""
    after = list(STAGES)[list(STAGES).index(name) + 1:]
    i = next((i for i, mk in enumerate(trace.marks) if mk.rank == rank and mk.kind == "phase" and mk.text in after),
             None)
    return trace.held(rank, before=i)


def measured(result) -> dict:
    """What the run's trace counted, per technique: bytes held at rest (by kind; every rank alike), each
    rank's peak and where it fell, and bytes sent per rank."""
    trace, n = result.trace, result.world
    out = {}
    for name in STAGES:
        rest = [_at_rest(trace, r, name) for r in range(n)]
        peaks = [trace.peak(r, phase=name) for r in range(n)]
        sent = [sum(m.sent for e in trace.events if e.phase == name for m in e.members if m.rank == r) for r in range(n)]
        out[name] = {"rest": rest, "peak": peaks, "sent": sent}
    return out


def figures(result) -> dict:
    """What `parasim compare` lines up across DP sizes: per technique, the bytes a rank holds at rest, its
    peak, and the bytes it sends in one step."""
    out = {}
    for name, m in measured(result).items():
        out[f"{name}: bytes a rank holds at rest"] = sum(m["rest"][0].values())
        out[f"{name}: a rank's peak bytes"] = max(p["bytes"] for p in m["peak"])
        out[f"{name}: bytes a rank sends"] = max(m["sent"])
    return out


def tables(result) -> list[Table]:
    """What a rank holds and sends under each technique, measured by the run (every rank alike)."""
    m, n = measured(result), result.world
    params = sum(np.asarray(w).size for w in _one_device(n)["new"].values())
    dp_sent = max(m["DP"]["sent"])
    big = model_state_27b(n)
    rows = []
    for name in STAGES:
        rest = m[name]["rest"][0]
        rows.append((name, [rest["weights"], rest["gradients"], rest["optimizer"], round(sum(rest[k] for k in KINDS)
                     / params, 4), max(p["bytes"] for p in m[name]["peak"]), max(m[name]["sent"]),
                     round(max(m[name]["sent"]) / dp_sent, 4), round(big[name], 2)]))
    post = " / ".join(f"{POST_27B_AT_8[name]:g}" for name in STAGES)
    ours = " / ".join(f"{big[name]:g}" for name in STAGES)
    return [Table(
        f"What each of the {n} ranks holds at rest and sends in one step ({params:,} parameters; bytes at the "
        "post's precision: bf16 weights and gradients, fp32 Adam state)",
        ["technique", "weights (B)", "gradients (B)", "Adam (B)", "bytes a parameter", "peak (B)", "sent (B)",
         "sent / DP's", f"27B model over {n} (GB)"], rows,
        notes=["peak: the most a rank held at once during the step, activations and whole gradients in flight "
               "included (ZeRO-2 and ZeRO-3 drop each bucket's gradients as it is reduced); sent: what each rank "
               "put on the wire, in float64 (the run's exact values: a bf16 run sends a quarter of it).",
               f"27B model: the post's 27B parameters at these bytes a parameter, each GPU's share over {n} DP "
               f"ranks (the estimator; GB = 1e9 B). post, over 8: {post} GB; here, over {n}: {ours} GB"
               + (" (the post rounds ZeRO-2's 101.25)." if n == 8 else ".")])]


def quiz(result) -> list[Question]:
    """ZeRO-1's and ZeRO-3's bytes a parameter on each rank at rest, and what DP's step sends: asked first,
    answered by what the run's ranks told the trace they hold and sent."""
    n, m = result.world, measured(result)
    params = sum(np.asarray(w).size for w in _one_device(n)["new"].values())
    out = []
    for name, words in (("ZeRO-1", f"Adam's 12 split {n} ways: 2 + 2 + 12/{n}"),
                        ("ZeRO-3", f"all three split {n} ways: (2 + 2 + 12)/{n}")):
        held = sum(m[name]["rest"][0][k] for k in KINDS) / params
        out.append(Question(
            f"{name} over {n} ranks: how many bytes a parameter does each rank hold at rest (weights, "
            f"gradients and Adam's state, bf16 weights and gradients, fp32 state)?",
            held, "bytes a parameter",
            f"2 B of weights, 2 B of gradients and 12 B of fp32 state (master weights, momentum, variance); "
            f"{words} = {held:g}"))
    return out


def checks(result) -> list[Check]:
    n, v = result.world, result.values
    ref = _one_device(n)
    params = sum(np.asarray(w).size for w in ref["new"].values())
    m = measured(result)
    plan_model = replace(SHAPE, vocab=1, params=params)  # no embeddings here
    out: list[Check] = []
    for name, stage in STAGES.items():
        rest = m[name]["rest"]
        per_param = sum(rest[0][k] for k in KINDS) / params
        out.append(check(f"{name}: bytes each rank holds at rest (all alike)", [sum(r.values()) for r in rest],
                         [sum(rest[0].values())] * n))
        # the post's rule: 2 + 2 bytes of weights and gradients, 12 of fp32 state, each split n ways from its stage on
        want = sum(b / (n if stage >= s else 1) for b, s in ((2, 3), (2, 2), (12, 1)))
        out.append(check(f"{name}: bytes per parameter held at rest, measured", per_param, want, rtol=1e-12))
        est = items(plan_model, Plan(dp=n, zero=stage), 0)
        out.append(check(f"{name}: weights, gradients, optimizer bytes = the estimator's",
                         [rest[0][k] for k in KINDS], [est[k][0] for k in KINDS], rtol=1e-12))
        traffic = sum(dp_traffic(params, n, stage, itemsize=8).values())
        out.append(check(f"{name}: bytes sent per rank = the estimator's", m[name]["sent"], [traffic] * n, rtol=1e-12))
        out.append(check(f"{name}: mean loss = one device's", np.mean([x[name]["loss"] for x in v]), ref["loss"],
                         rtol=1e-12))
        if stage < 3:
            grad = _assemble([(x[name]["ranges"], np.asarray(x[name]["grad"])) for x in v], params)
            new = [np.asarray(x[name]["weights"])[:params] for x in v]
        else:  # each layer's shards end to end, in rank order, are its flat weights (zero padded)
            grad = np.concatenate([np.concatenate([np.asarray(x[name]["grad"][i]) for x in v])[:np.asarray(
                _flat(ref["layers"][i])).size] for i in range(SHAPE.layers)])
            new = [np.concatenate([np.concatenate([np.asarray(x[name]["shards"][i]) for x in v])[:_flat(
                ref["layers"][i]).size] for i in range(SHAPE.layers)])]
        want_grad = _flat(ref["grads"]) if stage < 3 else np.concatenate(
            [_flat({k[len(f"L{i}."):]: g for k, g in ref["grads"].items() if k.startswith(f"L{i}.")})
             for i in range(SHAPE.layers)])
        want_new = _flat(ref["new"]) if stage < 3 else np.concatenate(
            [_flat({k[len(f"L{i}."):]: w for k, w in ref["new"].items() if k.startswith(f"L{i}.")})
             for i in range(SHAPE.layers)])
        out.append(check(f"{name}: averaged gradient = one device's (largest difference)",
                         float(np.max(np.abs(grad - want_grad))), 0.0,
                         atol=1e-12))
        out.append(check(f"{name}: weights after Adam = one device's (largest difference)",
                         max(float(np.max(np.abs(w - want_new))) for w in new), 0.0, atol=1e-12))
    big, size = model_state_27b(n), get_model("27b").total_params()
    out.append(check(f"the 27B model over {n} DP ranks, GB per GPU (DP, ZeRO-1, -2, -3): the bytes a parameter "
                     "measured above, times its 27e9 parameters", [big[name] for name in STAGES],
                     [sum(m[name]["rest"][0][k] for k in KINDS) / params * size / 1e9 for name in STAGES],
                     rtol=1e-12))
    dp_sent = m["DP"]["sent"][0]
    for name in ("ZeRO-1", "ZeRO-2"):
        out.append(check(f"{name} sends what DP sends", m[name]["sent"][0] / dp_sent, 1.0, rtol=1e-12))
    out.append(check("ZeRO-3 sends 1.5x DP", m["ZeRO-3"]["sent"][0] / dp_sent, 1.5, rtol=1e-12))
    # the peaks: what a rank keeps at rest plus both layers' activations, and for ZeRO-3 the last layer's
    # backward, where its gathered weights and its whole gradient (not yet reduce-scattered) meet
    acts = SHAPE.layers * S * (layer_bytes_per_token(h=8, heads=2, kv=2, ffn=16, tp=1, sp=False, dropout=False)
                               + S * scores_bytes_per_token_key(2, 1, False, 1, False))  # the estimator's count
    layer = params // SHAPE.layers
    for name, stage in STAGES.items():
        rest = sum(b / (n if stage >= s else 1) for b, s in ((2, 3), (2, 2), (12, 1))) * params
        extra = {3: 2 * layer + 2 * layer}.get(stage, 0)
        out.append(check(f"{name}: peak = at rest + activations" + (" + a gathered layer + its whole gradient"
                                                                     if stage == 3 else ""),
                         m[name]["peak"][0]["bytes"], rest + acts + extra, rtol=1e-12))
    z3 = m["ZeRO-3"]["peak"][0]
    out.append(check("ZeRO-3's peak comes while a layer is gathered (gathered bytes at the peak)",
                     z3["by_kind"]["gathered"], 2 * layer))
    return out


NARRATIVE = {
    "DP": """
        Eight copies of the model, eight different sequences. After backward each rank all-reduces its
        gradients (averaged, in three buckets of 400 values, as DDP fills buckets) and runs the same Adam
        step on every weight. Each rank keeps everything: 2 bytes of weight and 2 of gradient per parameter,
        and 12 bytes of fp32 state (master copy, first and second moment). Those are a bf16 training run's
        bytes; the values this run sends are float64, so that every sum can be compared exactly with one
        device's, and its bytes on the wire are four times bf16's (the note below works one bucket out).""",
    "ZeRO-1": """
        The optimizer state is split: each bucket is reduce-scattered, so a rank receives the averaged
        gradient of its own eighth only, updates that eighth with Adam, and all-gathers the new weights
        back. A reduce-scatter plus an all-gather move exactly the bytes of one all-reduce; the 12 bytes
        of state shrink to 12/8 per parameter.""",
    "ZeRO-2": """
        The same collectives, but a rank also drops the gradients it does not own: each bucket's whole
        gradients live only until that bucket is reduced (the app's memory panel shows the held bytes rise
        and fall at each reduce-scatter; the table at the end gives each rank's peak), and what stays is the
        rank's eighth.""",
    "ZeRO-3": """
        Now the weights are split too: at rest a rank holds an eighth of everything, 2 bytes per
        parameter. Each layer's weights are all-gathered just before its forward and again before its
        backward, and dropped right after; its gradients are reduce-scattered as soon as backward made them.
        The price is a third pass over the weights: 1.5 times DP's traffic, and a peak while a layer is
        gathered.""",
}

LESSON = Lesson(
    name="zero",
    section="Data parallelism and ZeRO",
    order=30,
    title="DP, ZeRO-1, ZeRO-2, ZeRO-3: what 8 ranks hold and send, measured",
    world=8,
    worlds=(2, 4, 8, 16),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="one Adam step four ways over 8 data-parallel ranks: bytes per parameter, traffic and peaks from the run",
    keep_values=0,
    knobs={"dp": Knob(8, choices=(2, 4, 8, 16), world=True,
                    limits="ZeRO's flat buffer of the 1,088 weights (17 x 64) cuts into equal shards over these "
                           "without padding, so each rank's bytes a parameter come out exactly")},
    figures=figures,
    tables=tables,
    quiz=quiz,
    picture=Picture(plot_zero_stages, "what a rank holds by kind and what it sends, stage by stage"),
)

"""One small model trained two ways on 4 GPUs, for the pp-vs-zero3 lesson: split by layers into a 4-stage
pipeline (1F1B, micro-batches handed stage to stage), and kept whole per GPU with ZeRO-3 sharding its
weights over 4 data-parallel ranks. One program runs both, each in phases tagged with its technique, so
the bytes of each can be read from the trace. A one-device program computes the same step on all the data
for the exactness checks, and `comparison` builds the post's table from measured runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from ..dp.zero3 import Zero3
from ..engine.runner import run
from ..layout import ModelSpec
from ..nn import Saved
from ..nn.layer import Stack, TransformerLayer
from ..pipeline.action import Action
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import generate
from ..pipeline.timing import time_schedule
from ..comm.trace import Trace
from ..pipeline.stage import LayersStage
from ..train.whole import dot_loss, forward_backward, sequences, whole_layers
from ..engine.context import Context

SCHEDULE = "1f1b"
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
TOL = 1e-12  # how far (relative) a float64 run's loss and fingerprints may be from one device's
PP_PHASES = (
    "PP 4: the 1F1B schedule",
    "PP 4: activations forward, their gradients back",
    "PP 4: each stage steps its own layers",
)
Z3_PHASES = (
    "ZeRO-3 over 4: forward, each layer gathered then freed",
    "ZeRO-3 over 4: backward, gather again and reduce-scatter the gradients",
)


@dataclass(frozen=True)
class Config:
    """One size of the experiment: the model (hidden width, layers) and the batch (micro-batches of
    `mb_size` sequences of `seq` tokens). ZeRO-3 splits the same sequences evenly over the GPUs."""

    hidden: int = 8
    layers: int = 4
    mb_size: int = 2
    microbatches: int = 4
    world: int = 4
    seq: int = 4
    heads: int = 2

    @property
    def spec(self) -> ModelSpec:
        # no biases: a key bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by
        # every key), and Adam, dividing by the gradient's size, would turn its rounding noise into a step
        return ModelSpec(hidden=self.hidden, heads=self.heads, dropout=0.0, bias=False)

    @property
    def sequences(self) -> int:
        return self.microbatches * self.mb_size

    @property
    def per_rank(self) -> int:
        return self.sequences // self.world

    @property
    def activation(self) -> tuple[int, int, int]:
        """The shape of one micro-batch's activation at a stage boundary: [s, b, h]."""
        return (self.seq, self.mb_size, self.hidden)

    def describe(self) -> str:
        return f"hidden {self.hidden}, {self.layers} layers, {self.sequences} sequences"


def _layers(ctx: Context, cfg: Config, first: int, count: int) -> list[TransformerLayer]:
    return whole_layers(ctx, cfg.spec, first, count, "L{i}")  # no tensor parallelism: every layer is whole


def _batch(ctx: Context, cfg: Config, first: int, count: int, what: str) -> Any:
    """Sequences first .. first+count-1 side by side on the batch dimension."""
    return sequences(ctx, what, range(first, first + count), cfg.seq, cfg.hidden)


def adam_first_step(xp: Any, w: Any, g: Any) -> Any:
    """Adam's first update from zero moments, written out on its own for the pipeline stages and the
    one-device reference (ZeRO-3 uses its own optimizer, which this must agree with)."""
    b1, b2 = BETAS
    m, v = (1 - b1) * g, (1 - b2) * g * g
    return w - LR * (m / (1 - b1)) / (xp.sqrt(v / (1 - b2)) + EPS)


def pipeline_part(ctx: Context, cfg: Config) -> dict:
    """PP over all ranks: rank r holds layers [r*L/p, (r+1)*L/p) and runs its row of 1F1B; the loss is the
    mean over all sequences of sum(y * target)."""
    xp, r, p = ctx.xp, ctx.rank, cfg.world
    group = ctx.new_group(range(p), "pp")
    plan = generate(SCHEDULE, p, cfg.microbatches)
    timing = time_schedule(plan)
    ctx.phase(PP_PHASES[0], technique="pp")
    cells = [x or "." for x in timing.slots[r]]
    ctx.note("GPU %d: %s" % (r + 1, " ".join(cells)), table_row=r + 1, cells=cells)
    ctx.phase(PP_PHASES[1], technique="pp")
    per = cfg.layers // p
    stage = LayersStage(_layers(ctx, cfg, r * per, per))

    def inputs(mb: int) -> Any:
        return _batch(ctx, cfg, mb * cfg.mb_size, cfg.mb_size, "x")

    def loss(mb: int, y: Any) -> tuple[float, Any]:
        return dot_loss(xp, y, _batch(ctx, cfg, mb * cfg.mb_size, cfg.mb_size, "t"), cfg.sequences)

    total = run_schedule(ctx, group, plan, {r: stage}, cfg.activation, xp.float64, inputs, loss)
    ctx.phase(PP_PHASES[2], technique="pp")
    grads = stage.grads
    new = {k: adam_first_step(xp, w, grads[k]) for k, w in stage.params().items()}
    count = sum(int(np.prod(w.shape)) for w in new.values())
    span = f"layer {r + 1}" if per == 1 else f"layers {r * per + 1}-{(r + 1) * per}"
    ctx.note(f"GPU {r + 1}: {span}, {count} weights, all its own: Adam runs here and nothing is sent", weights=count)
    return {
        "loss": total,
        "has_loss": r == p - 1,
        "grads": grads,
        "weights": new,
        "held": count,
        "bubble": timing.bubble,
    }


def data_parallel_schedule(world: int) -> list[list[Action]]:
    """Data parallelism in the pipeline's terms: one stage, the whole model, and each rank runs the forward
    and the backward of its own share of the batch. Nothing waits on another rank's compute."""
    return [[Action("F", r, 0), Action("B", r, 0)] for r in range(world)]


def zero3_part(ctx: Context, cfg: Config) -> dict:
    """ZeRO-3 over all ranks: each rank runs every layer on its own sequences; a layer's weights are
    gathered before its forward and its backward, and its gradients reduce-scattered right after its
    backward; at the step Adam updates each rank's shard where it lies."""
    xp, n, b = ctx.xp, cfg.world, cfg.per_rank
    group = ctx.new_group(range(n), "dp")
    ctx.phase(Z3_PHASES[0], technique="zero3")
    layers = [Zero3(ctx, layer, group, lr=LR, betas=BETAS, eps=EPS) for layer in _layers(ctx, cfg, 0, cfg.layers)]
    first = ctx.rank * b
    x, target = _batch(ctx, cfg, first, b, "x"), _batch(ctx, cfg, first, b, "t")
    shard = sum(int(z.shard.shape[0]) for z in layers)
    ctx.note(
        f"GPU {ctx.rank + 1}: sequences {first + 1}-{first + b}, and 1/{n} of every layer's weights "
        f"({shard} values) at rest",
        weights=shard,
    )
    saved, caches = Saved(), []
    for z in layers:
        x, c = z.forward(x, saved)
        caches.append(c)
    local, dy = dot_loss(xp, x, target, b)  # this rank's mean; averaging over ranks gives the global mean
    ctx.phase(Z3_PHASES[1], technique="zero3")
    for z, c in zip(reversed(layers), reversed(caches)):
        dy = z.backward(c, dy)  # gathers, runs the layer's backward, frees, reduce-scatters its gradients
    grads = {z.key: xp.asarray(z.grad, copy=True) for z in layers}  # this rank's share, averaged
    for z in layers:
        z.step()  # Adam on this rank's shard only: nothing moves
    return {
        "loss": local,
        "keys": {z.key: list(z.keys) for z in layers},
        "grad_shards": grads,
        "weight_shards": {z.key: z.shard for z in layers},
        "held": shard,
        "layer_values": layers[0].padded,
        "bubble": time_schedule(data_parallel_schedule(n)).bubble,
    }


def both(cfg: Config, whole: bool = False) -> Callable[[Any], dict]:
    """The program: the pipeline run, then the ZeRO-3 run, on the same weights and sequences. It returns
    each gradient and updated weight as its sum of squares (a fingerprint that rounding barely moves, so
    real ranks can be held to the virtual run), or with `whole` the arrays themselves."""

    def program(ctx: Context) -> dict:
        out = {"pp": pipeline_part(ctx, cfg), "zero3": zero3_part(ctx, cfg)}
        return out if whole else fingerprints(ctx.xp, out)

    return program


def _sq(xp: Any, x: Any) -> float:
    return float(xp.sum(x * x))


def fingerprints(xp: Any, out: dict) -> dict:
    """Replace every array by its sum of squares: per weight for PP, per layer's shard for ZeRO-3."""
    pp, z3 = dict(out["pp"]), dict(out["zero3"])
    for part, fields in ((pp, ("grads", "weights")), (z3, ("grad_shards", "weight_shards"))):
        for f in fields:
            part[f] = {k: _sq(xp, x) for k, x in part[f].items()}
    return {"pp": pp, "zero3": z3}


def one_device(cfg: Config) -> Callable[[Any], dict]:
    """The reference, for parasim.run(..., 1): every layer and every sequence on one rank, one forward and
    one backward of the mean loss, and Adam's first step on every weight."""

    def program(ctx: Context) -> dict:
        stack = Stack(_layers(ctx, cfg, 0, cfg.layers))
        x, target = _batch(ctx, cfg, 0, cfg.sequences, "x"), _batch(ctx, cfg, 0, cfg.sequences, "t")
        loss = forward_backward(ctx, stack, [(x, target)], cfg.sequences)
        grads = stack.grads
        return {
            "loss": loss,
            "grads": grads,
            "weights": {k: adam_first_step(ctx.xp, w, grads[k]) for k, w in stack.params().items()},
        }

    return program


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.tolist() if hasattr(x, "tolist") and not isinstance(x, np.ndarray) else x, dtype=float)


def _rel(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-300)


def _worst(got: dict[str, float], want: dict[str, float]) -> float:
    """The largest relative difference over named fingerprints (infinite if the names differ)."""
    if set(got) != set(want):
        return float("inf")
    return max(_rel(got[k], want[k]) for k in want)


def errors(values: list[dict], ref: dict) -> dict[str, dict[str, float]]:
    """How far each technique's loss, gradients and weights after Adam are from the one-device run, as
    relative differences of the fingerprints (sums of squares) the program returned."""
    sq = {f: {k: float(np.sum(_np(x) ** 2)) for k, x in ref[f].items()} for f in ("grads", "weights")}
    pp = [v["pp"] for v in values]
    pp_loss = next(x["loss"] for x in pp if x["has_loss"])
    out = {
        "pp": {
            "loss": _rel(pp_loss, ref["loss"]),
            **{
                name: _worst({k: g for x in pp for k, g in x[f].items()}, sq[f])
                for name, f in (("gradients", "grads"), ("weights after Adam", "weights"))
            },
        }
    }
    z3 = [v["zero3"] for v in values]
    out["zero3"] = {
        "loss": _rel(sum(x["loss"] for x in z3) / len(z3), ref["loss"]),
        "gradients": _shard_worst(z3, "grad_shards", ref["grads"]),
        "weights after Adam": _shard_worst(z3, "weight_shards", ref["weights"]),
    }
    return out


def _shard_worst(z3: list[dict], field: str, want: dict[str, Any]) -> float:
    """Lay each layer's reference tensors end to end in the order the ranks reported, pad with zeros to
    equal shares, cut it into one share per rank, and compare each share's sum of squares with the one
    that rank returned."""
    worst, n = 0.0, len(z3)
    for key, names in z3[0]["keys"].items():
        flat = np.concatenate([_np(want[f"{key}.{k}"]).reshape(-1) for k in names])
        flat = np.concatenate([flat, np.zeros(-flat.size % n)])
        for r, share in enumerate(np.split(flat, n)):
            worst = max(worst, _rel(z3[r][field][key], float(np.sum(share**2))))
    return worst


def moved(trace: Trace, technique: str) -> dict:
    """What the phases of one technique put on the wire, read from the trace: bytes sent (each transfer
    counted once, by its sender), how many calls of each op, and the sizes of the tensors involved (the
    whole buffer of a collective: its larger side)."""
    tagged = {m.text: (m.data or {}).get("technique") for m in trace.marks if m.kind == "phase"}
    events = [e for e in trace.events if tagged.get(e.phase) == technique]
    shapes = set()
    for e in events:
        for m in e.members:
            sizes = [t.shape for t in (*m.ins, *m.outs)]
            shapes.add(max(sizes, key=lambda s: int(np.prod(s))) if sizes else ())
    return {
        "bytes": sum(m.sent for e in events for m in e.members),
        "ops": dict(Counter(e.op for e in events)),
        "shapes": sorted(shapes),
    }


def measure(result: Any, cfg: Config) -> dict:
    """One run of `both(cfg)`, measured: each technique's traffic and bubble, the weights a GPU keeps,
    and its distance from the one-device step."""
    ref = run(one_device(cfg), 1).values[0]
    v = result.values
    return {
        "config": cfg,
        "pp": moved(result.trace, "pp"),
        "zero3": moved(result.trace, "zero3"),
        "bubble": {"pp": v[0]["pp"]["bubble"], "zero3": v[0]["zero3"]["bubble"]},
        "held": {"pp": [x["pp"]["held"] for x in v], "zero3": [x["zero3"]["held"] for x in v]},
        "layer_values": v[0]["zero3"]["layer_values"],
        "errors": errors(v, ref),
    }


def run_config(cfg: Config) -> dict:
    """Run both techniques at this size on virtual ranks and measure them."""
    return measure(run(both(cfg), cfg.world), cfg)


def _what_moves(m: dict, technique: str, cfg: Config, layer_values: int) -> str:
    """Name what a technique sends from the sizes seen on the wire: a micro-batch's activation, or a
    layer's worth of weights (for the whole-buffer side of each collective)."""
    calls = " + ".join(f"{n} {op}" for op, n in sorted(m["ops"].items()))
    if technique == "pp" and m["shapes"] == [cfg.activation]:
        return f"activations and their gradients: {calls} of {list(cfg.activation)}"
    if technique == "zero3" and m["shapes"] == [(layer_values,)]:
        return f"weights and their gradients: {calls} of {layer_values} values (one layer)"
    return f"something else: {calls} of {m['shapes']}"


def comparison(runs: dict[str, dict]) -> dict[str, list]:
    """The post's table, [PP, ZeRO-3] per row, from measured runs (`runs`: "base", "batch x2", "hidden x2"
    and "layers x2", each from `measure`)."""
    base = runs["base"]
    cfg = base["config"]
    ratio = lambda name, t: Fraction(runs[name][t]["bytes"], base[t]["bytes"])  # noqa: E731
    return {
        "what moves": [_what_moves(base[t], t, cfg, base["layer_values"]) for t in ("pp", "zero3")],
        f"bytes sent per step, all GPUs ({cfg.describe()})": [base[t]["bytes"] for t in ("pp", "zero3")],
        **{
            f"bytes x when {name[:-3]} doubles": [ratio(name, t) for t in ("pp", "zero3")]
            for name in ("batch x2", "hidden x2", "layers x2")
        },
        "bubble (idle share of the step)": [base["bubble"][t] for t in ("pp", "zero3")],
        "weights a GPU keeps between steps": [max(base["held"][t]) for t in ("pp", "zero3")],
    }

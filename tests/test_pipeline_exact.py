"""Every schedule, run for real over PP ranks (with TP inside the stages too), gives the unsplit model's
loss and gradients (torch autograd, float64)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from layer_check import SEED, layer_grads, torch_layer, torch_weights  # noqa: E402
from parasim.layout import Layout  # noqa: E402
from parasim.nn import ParallelContext  # noqa: E402
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec
from parasim.examples.pipeline import LayersStage  # noqa: E402
from parasim.pipeline.executor import run_schedule  # noqa: E402
from parasim.pipeline.schedules import check_layers, generate  # noqa: E402

SHAPE = ModelSpec(hidden=8, heads=2, dropout=0.0)
S, B = 4, 1


def run(schedule: str, pp: int, tp: int, m: int, layers: int, chunks=None, sp=False):
    plan = generate(schedule, pp, m, chunks)
    per = check_layers(layers, plan)

    def program(ctx):
        t = ParallelContext(ctx, ctx.groups["tp"] if tp > 1 else None, sp=sp and tp > 1)
        rank = ctx.coords.pp
        stages, mine = {}, []
        for stage in sorted({a.stage for a in plan[rank]}):
            block = [TransformerLayer(t, SHAPE, layer_weights(ctx, SHAPE, f"L{i}"), key=f"L{i}", name=f"L{i}")
                     for i in range(stage * per, (stage + 1) * per)]
            stages[stage] = LayersStage(block)
            mine += [(i, layer) for i, layer in zip(range(stage * per, (stage + 1) * per), block)]

        def inputs(mb):
            x = ctx.shared_rng(f"x{mb}").normal((S, B, SHAPE.hidden))
            return x[t.r * S // t.t:(t.r + 1) * S // t.t] if t.sp else x

        def loss(mb, y):
            target = ctx.shared_rng(f"r{mb}").normal((S, B, SHAPE.hidden))
            target = target[t.r * S // t.t:(t.r + 1) * S // t.t] if t.sp else target
            return float(ctx.xp.sum(y * target)), target
        shape = (S // t.t if t.sp else S, B, SHAPE.hidden)
        total = run_schedule(ctx, ctx.groups["pp"], plan, stages, shape, ctx.xp.float64, inputs, loss)
        return {"loss": total, "grads": {i: layer.grads for i, layer in mine}, "pp": rank, "tp": ctx.coords.tp}
    return parasim.run(program, layout=Layout(tp=tp, pp=pp), seed=SEED)


def reference(m: int, layers: int):
    from layer_check import _SharedCtx
    ctx = _SharedCtx()
    Ws = [torch_weights(SHAPE, f"L{i}") for i in range(layers)]
    total = 0
    for mb in range(m):
        x = torch.tensor(ctx.shared_rng(f"x{mb}").normal((S, B, SHAPE.hidden)))
        for i, W in enumerate(Ws):
            x = torch_layer(x, W, SHAPE, f"L{i}")
        total = total + (x * torch.tensor(ctx.shared_rng(f"r{mb}").normal((S, B, SHAPE.hidden)))).sum()
    total.backward()
    return float(total.detach()), [{k: v.grad.numpy() for k, v in W.items() if v is not None} for W in Ws]


CASES = [("gpipe", 2, 1, 3, None), ("1f1b", 4, 1, 4, None), ("1f1b", 2, 2, 4, None), ("zb-h1", 4, 1, 6, None),
         ("zb-h1", 2, 2, 3, None), ("interleaved", 2, 1, 4, 2), ("interleaved", 4, 1, 4, 2), ("interleaved", 2, 1, 6, 3),
         ("interleaved-zb", 2, 1, 4, 2), ("interleaved-zb", 2, 2, 4, 2), ("zbv", 2, 1, 3, 2), ("zbv", 4, 1, 8, 2),
         ("dualpipev", 2, 1, 4, 2), ("dualpipev", 2, 2, 5, 2), ("dualpipev", 4, 1, 8, 2)]


@pytest.mark.parametrize("schedule, pp, tp, m, chunks", CASES)
def test_schedule_equals_unsplit_model(schedule, pp, tp, m, chunks):
    v = chunks or 1
    layers = pp * v * (2 if pp * v < 4 else 1)
    sp = tp > 1 and schedule != "1f1b"  # SP puts collectives into the deferred weight passes
    res = run(schedule, pp, tp, m, layers, chunks, sp=sp)
    loss, ref = reference(m, layers)
    holders = [x for x in res.values if x["loss"] != 0]
    assert len(holders) == tp  # under SP each TP rank holds the loss of its share of the sequence
    assert abs(sum(x["loss"] for x in holders) / (1 if sp else tp) - loss) < 1e-10
    for i in range(layers):
        ranks = sorted((x for x in res.values if i in x["grads"]), key=lambda x: x["tp"])
        got = layer_grads([x["grads"][i] for x in ranks], SHAPE, tp)
        assert all(np.max(np.abs(got[k] - ref[i][k])) < 1e-10 for k in ref[i]), (schedule, i)
    sends = [e for e in res.trace.events if e.op == "p2p"]
    crossings = pp * v - 1 - (schedule in ("zbv", "dualpipev"))  # stage boundaries; a V turns on one rank
    assert len(sends) == 2 * m * crossings * tp  # each micro-batch: activations forward, gradients back

"""Every schedule, run for real over PP ranks (with TP inside the stages too), gives the unsplit model's
loss and gradients (torch autograd, float64)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from layer_check import SEED, layer_grads, torch_layer, torch_weights  # noqa: E402
from parasim.layout import Layout  # noqa: E402
from parasim.nn import TPContext  # noqa: E402
from parasim.nn.layer import LayerShape, TransformerLayer, layer_weights  # noqa: E402
from parasim.pipeline.demo import LayersStage  # noqa: E402
from parasim.pipeline.executor import run_stage  # noqa: E402
from parasim.pipeline.schedules import generate  # noqa: E402

SHAPE = LayerShape(hidden=8, heads=2, dropout=0.0)
S, B = 4, 1


def run(schedule: str, pp: int, tp: int, m: int, layers: int):
    def program(ctx):
        t = TPContext(ctx, ctx.groups["tp"] if tp > 1 else None)
        stage_no = ctx.coords.pp
        per = layers // pp
        mine = [TransformerLayer(t, SHAPE, layer_weights(ctx, SHAPE, f"L{i}"), key=f"L{i}", name=f"L{i}")
                for i in range(stage_no * per, (stage_no + 1) * per)]
        actions = generate(schedule, pp, m)[stage_no]

        def inputs(mb):
            return ctx.shared_rng(f"x{mb}").normal((S, B, SHAPE.hidden))

        def loss(mb, y):
            target = ctx.shared_rng(f"r{mb}").normal((S, B, SHAPE.hidden))
            return float(ctx.xp.sum(y * target)), target
        total = run_stage(ctx, ctx.groups["pp"], actions, LayersStage(mine), (S, B, SHAPE.hidden), ctx.xp.float64,
                          inputs, loss)
        return {"loss": total, "grads": [layer.grads for layer in mine], "pp": stage_no, "tp": ctx.coords.tp}
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


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("pp, tp, m", [(2, 1, 3), (4, 1, 4), (2, 2, 4), (4, 1, 6)])
def test_schedule_equals_unsplit_model(schedule, pp, tp, m):
    layers = pp * 2 if pp < 4 else pp
    res = run(schedule, pp, tp, m, layers)
    loss, ref = reference(m, layers)
    last = [v for v in res.values if v["pp"] == pp - 1]
    assert all(abs(v["loss"] - loss) < 1e-10 for v in last)
    per = layers // pp
    for stage in range(pp):
        ranks = sorted((v for v in res.values if v["pp"] == stage), key=lambda v: v["tp"])
        for j in range(per):
            got = layer_grads([v["grads"][j] for v in ranks], SHAPE, tp)
            want = ref[stage * per + j]
            assert all(np.max(np.abs(got[k] - want[k])) < 1e-10 for k in want), (stage, j)
    sends = [e for e in res.trace.events if e.op == "p2p"]
    assert len(sends) == 2 * m * (pp - 1) * tp  # each micro-batch: pp-1 activations forward, pp-1 grads back

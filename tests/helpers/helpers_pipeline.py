"""A pipeline schedule run for real over PP ranks (TP inside the stages) and the unsplit model in torch
autograd (float64), on the same draws: what test_pipeline_exact and test_edge_sizes hold against each other."""
from __future__ import annotations

from typing import Any

from layer_check import SEED, SharedCtx, torch_layer, torch_weights

import parasim
from parasim.pipeline.stage import LayersStage
from parasim.layout import Layout, ModelSpec
from parasim.nn import ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.pipeline.executor import run_schedule
from parasim.pipeline.schedules import check_layers, generate

SHAPE = ModelSpec(hidden=8, heads=2, dropout=0.0)
S, B = 4, 1


def run_pipeline(schedule: str, pp: int, tp: int, m: int, layers: int, chunks: int | None = None,
                 sp: bool = False) -> Any:
    """`schedule` with m micro-batches over PP x TP ranks: each rank's loss, its layers' gradients, pp, tp."""
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
            return x[t.tp_rank * S // t.tp_world_size:(t.tp_rank + 1) * S // t.tp_world_size] if t.sp else x

        def loss(mb, y):
            target = ctx.shared_rng(f"r{mb}").normal((S, B, SHAPE.hidden))
            target = target[t.tp_rank * S // t.tp_world_size:(t.tp_rank + 1) * S // t.tp_world_size] if t.sp else target
            return float(ctx.xp.sum(y * target)), target
        shape = (S // t.tp_world_size if t.sp else S, B, SHAPE.hidden)
        total = run_schedule(ctx, ctx.groups["pp"], plan, stages, shape, ctx.xp.float64, inputs, loss)
        return {"loss": total, "grads": {i: layer.grads for i, layer in mine}, "pp": rank, "tp": ctx.coords.tp}
    return parasim.run(program, layout=Layout(tp=tp, pp=pp), seed=SEED)


def pipeline_reference(m: int, layers: int) -> tuple[float, list[dict]]:
    """The unsplit model's summed loss and each layer's gradients, by torch autograd on the same draws."""
    import torch
    ctx = SharedCtx()
    Ws = [torch_weights(SHAPE, f"L{i}") for i in range(layers)]
    total = 0
    for mb in range(m):
        x = torch.tensor(ctx.shared_rng(f"x{mb}").normal((S, B, SHAPE.hidden)))
        for i, W in enumerate(Ws):
            x = torch_layer(x, W, SHAPE, f"L{i}")
        total = total + (x * torch.tensor(ctx.shared_rng(f"r{mb}").normal((S, B, SHAPE.hidden)))).sum()
    total.backward()
    return float(total.detach()), [{k: v.grad.numpy() for k, v in W.items() if v is not None} for W in Ws]

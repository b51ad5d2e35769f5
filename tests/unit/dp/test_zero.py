"""ZeRO-1 Adam over a data-parallel group equals torch's Adam on the summed gradients (float64), and each
rank keeps 1/n of the optimizer state."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from parasim.dp.zero import Zero1Adam  # noqa: E402

SHAPES = {"a.weight": (3, 5), "a.bias": (5,), "b.weight": (5, 2), "norm": (7,)}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_zero1_adam_equals_adam(n):
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "dp")
        params = {k: ctx.shared_rng(f"p.{k}").normal(s) for k, s in SHAPES.items()}
        opt = Zero1Adam(ctx, group, params, lr=0.1)
        for step in range(2):
            grads = {k: ctx.rng.normal(s) for k, s in SHAPES.items()} if step == 0 else \
                {k: ctx.shared_rng(f"g{step}.{k}.{ctx.rank}").normal(s) for k, s in SHAPES.items()}
            params, sq = opt.step(grads)
            if step == 0:
                first = grads
        return {"params": params, "first": first, "state": opt.state_elements, "sq": sq}
    res = parasim.run(program, n)
    from layer_check import SharedCtx
    ctx = SharedCtx()
    P = {k: torch.tensor(ctx.shared_rng(f"p.{k}").normal(s), requires_grad=True) for k, s in SHAPES.items()}
    opt = torch.optim.Adam(P.values(), lr=0.1)
    for step in range(2):
        for k, p in P.items():
            if step == 0:
                p.grad = torch.tensor(sum(v["first"][k] for v in res.values))
            else:
                p.grad = torch.tensor(sum(ctx.shared_rng(f"g{step}.{k}.{r}").normal(SHAPES[k]) for r in range(n)))
        opt.step()
    for v in res.values:
        for k, p in P.items():
            assert np.max(np.abs(v["params"][k] - p.detach().numpy())) < 1e-12, k
    total = sum(int(np.prod(s)) for s in SHAPES.values())
    assert all(v["state"] == 3 * -(-total // n) for v in res.values)  # master, m, v for 1/n (padded)
    ops = [e.op for e in res.trace.events]
    assert ops == ["reduce_scatter", "all_gather"] * 2

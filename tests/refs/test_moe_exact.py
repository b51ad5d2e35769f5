"""The MoE block with expert parallelism gives the unsplit block's output and gradients (torch autograd,
float64), for any EP size, top-k and expert count; dispatch sends a token once per rank that needs it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from parasim.layout import LayoutError  # noqa: E402
from parasim.nn import LayerOptions, ParallelContext, Saved  # noqa: E402
from parasim.nn.moe import MoE  # noqa: E402


def weights(ctx, h, f, n_exp):
    router = ctx.shared_rng("router").normal((h, n_exp))
    experts = [{"w1": ctx.shared_rng(f"e{e}.w1").normal((h, f), std=h ** -0.5),
                "b1": ctx.shared_rng(f"e{e}.b1").normal((f,), std=0.1),
                "w2": ctx.shared_rng(f"e{e}.w2").normal((f, h), std=f ** -0.5),
                "b2": ctx.shared_rng(f"e{e}.b2").normal((h,), std=0.1)} for e in range(n_exp)]
    return router, experts


def run(p, n, h, f, n_exp, k, routing=None):
    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep") if ctx.world > 1 else None
        router, experts = weights(ctx, h, f, n_exp)
        moe = MoE(ParallelContext(ctx, options=LayerOptions(routing=routing)), ep, router, experts, k)
        x = ctx.shared_rng("x").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        target = ctx.shared_rng("target").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        y, cache = moe.forward(x, Saved())
        dx = moe.backward(cache, target)
        return {"y": y, "dx": dx, "grads": dict(moe.grads), "routing": moe.last_routing}
    return parasim.run(program, p)


def reference(p, n, h, f, n_exp, k, picks=None):
    """The unsplit block in torch autograd; `picks`: each token's k experts (default: the router's top k)."""
    from layer_check import SharedCtx
    ctx = SharedCtx()
    router, experts = weights(ctx, h, f, n_exp)
    R = torch.tensor(router, requires_grad=True)
    E = [{key: torch.tensor(v, requires_grad=True) for key, v in e.items()} for e in experts]
    x = torch.tensor(ctx.shared_rng("x").normal((p * n, 1, h)), requires_grad=True)
    target = torch.tensor(ctx.shared_rng("target").normal((p * n, 1, h)))
    tokens = x.reshape(-1, h)
    logits = tokens @ R
    top = torch.tensor([sorted(range(n_exp), key=lambda e: (-float(row[e]), e))[:k] for row in logits.detach()]
                       if picks is None else picks)
    gates = torch.softmax(torch.gather(logits, 1, top), dim=1)
    y = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for j in range(k):
            e = E[int(top[t, j])]
            hid = torch.nn.functional.gelu(tokens[t] @ e["w1"] + e["b1"], approximate="tanh")
            y[t] = y[t] + gates[t, j] * (hid @ e["w2"] + e["b2"])
    (y.reshape(x.shape) * target).sum().backward()
    return y.detach().numpy(), x.grad.numpy().reshape(-1, h), R.grad.numpy(), [{k2: (v.grad.numpy() if v.grad is not None else np.zeros(v.shape)) for k2, v in e.items()} for e in E]


def check(p, n, h, f, n_exp, k, routing=None):
    res = run(p, n, h, f, n_exp, k, routing)
    picks = None if routing is None else np.concatenate([routing.choose("moe#0", r, r * n, n, n_exp, k)
                                                         for r in range(p)])
    y, dx, dR, dE = reference(p, n, h, f, n_exp, k, picks)
    got_y = np.concatenate([v["y"].reshape(-1, h) for v in res.values])
    got_dx = np.concatenate([v["dx"].reshape(-1, h) for v in res.values])
    assert np.max(np.abs(got_y - y)) < 1e-10 and np.max(np.abs(got_dx - dx)) < 1e-10
    got_dR = sum(v["grads"]["router"] for v in res.values)  # each rank routed its own tokens
    assert np.max(np.abs(got_dR - dR)) < 1e-10
    for e in range(n_exp):
        for key in ("w1", "b1", "w2", "b2"):
            held = [v["grads"][f"expert{e + 1}.{key}"] for v in res.values if f"expert{e + 1}.{key}" in v["grads"]]
            want = dE[e][key]
            assert len(held) <= 1  # an expert lives on one rank (ETP = 1)
            got = held[0] if held else np.zeros_like(want)  # an expert nobody chose has no gradient
            assert np.max(np.abs(got - want)) < 1e-10, (e, key)
    return res


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.integers(1, 5), st.sampled_from([4, 8]), st.integers(1, 3), st.data())
def test_moe_equals_unsplit(p, n, n_exp_per, k, data):
    n_exp = n_exp_per if n_exp_per % p == 0 else p * 2
    k = min(k, n_exp)
    check(p, n, 6, 8, n_exp, k)


@pytest.mark.parametrize("kind", ["uniform", "skewed:0.5", "balanced"])
def test_routing_by_policy_equals_unsplit(kind):
    """With a routing policy each EP rank works out which received rows chose its experts from the senders'
    draws, not from the gates that came with them: the output and gradients are still the unsplit block's
    with the policy's picks (gated by the softmax of the picked scores), as with the router's own."""
    from parasim.nn.routing import Routing
    res = check(4, 5, 6, 8, 8, 2, Routing.parse(kind, seed=1))
    assert any(len({e // 2 for e, _ in r}) == 2 for v in res.values for r in v["routing"])  # some cross ranks


def test_dispatch_sends_a_token_once_per_rank():
    """A token whose two experts sit on the same rank crosses the all-to-all once, and comes back once."""
    res = check(4, 4, 6, 8, 8, 2)
    events = [e for e in res.trace.events if e.op == "all_to_all"]
    assert [e.label.split(": ")[0] for e in events] == ["moe dispatch", "moe combine", "moe combine backward",
                                                           "moe dispatch backward"]
    for v, m in zip(res.values, events[0].members):
        dests = sum(len({e // 2 for e, _ in r}) for r in v["routing"])  # ranks needed, counted per token
        local = sum(1 for r in v["routing"] if m.rank in {e // 2 for e, _ in r})
        assert m.sent == (dests - local) * (6 + 2) * 8  # rows of h values + 2 gates, float64, none to itself


def test_bad_split():
    with pytest.raises(LayoutError, match="do not split evenly"):
        run(4, 2, 6, 8, 6, 2)


@pytest.mark.parametrize("tp, n_exp, k", [(1, 4, 2), (2, 4, 2), (2, 6, 3), (4, 8, 2)])
def test_moe_transformer_layer(tp, n_exp, k):
    """A whole layer, attention then MoE, TP + SP with the experts over the same ranks (EP = TP)."""
    from layer_check import gather, reference, run_parallel
    from parasim.layout import ModelSpec
    shape = ModelSpec(hidden=8, heads=4, ffn=12, experts=n_exp, top_k=k)
    res = run_parallel(shape, tp, tp > 1, 8, 2)
    y, dx, grads = gather(res, shape, tp, tp > 1)
    ry, rdx, rgrads = reference(shape, 8, 2)
    assert np.max(np.abs(y - ry)) < 1e-10 and np.max(np.abs(dx - rdx)) < 1e-10
    for key, want in rgrads.items():
        assert np.max(np.abs(grads[key] - want)) < 1e-10, key
    if tp > 1:
        ops = [e.op for e in res.trace.events]
        assert ops.count("all_to_all") == 4  # dispatch and combine, forward and backward


def test_moe_backward_under_tp_needs_sp_and_one_rank_sends_nothing():
    """Without SP every TP rank holds every token: the experts would see each one t times, and their
    gradients come out t times too large while the output still looks right (the moe-sp lesson shows that
    forward). Backward refuses."""
    from layer_check import run_parallel
    from parasim.layout import LayoutError
    from parasim.layout import ModelSpec
    shape = ModelSpec(hidden=8, heads=4, ffn=12, experts=4, top_k=2)
    with pytest.raises(LayoutError, match="needs sequence parallelism"):
        run_parallel(shape, 2, False, 8, 2)
    assert run_parallel(shape, 1, True, 8, 2).trace.events == []  # SP on one rank: nothing to split or sum


def test_scripted_routes_are_exact_against_autograd_with_constant_gates():
    """A scripted token goes to the given experts with the given gates, which are constants: the router's
    gradient comes only from the tokens it routed itself (torch autograd, float64)."""
    p, n, h, f, n_exp, k = 2, 3, 4, 5, 4, 2
    script = {0: ((1, 3), (0.6, 0.4))}  # each rank's first token

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        router, experts = weights(ctx, h, f, n_exp)
        moe = MoE(ParallelContext(ctx), ep, router, experts, k)
        moe.scripted = script
        x = ctx.shared_rng("x").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        target = ctx.shared_rng("target").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        y, cache = moe.forward(x, Saved())
        moe.backward(cache, target)
        return {"y": y, "router": moe.grads["router"]}
    res = parasim.run(program, p)

    from layer_check import SharedCtx
    ctx = SharedCtx()
    router, experts = weights(ctx, h, f, n_exp)
    R = torch.tensor(router, requires_grad=True)
    E = [{key: torch.tensor(v) for key, v in e.items()} for e in experts]
    tokens = torch.tensor(ctx.shared_rng("x").normal((p * n, 1, h))).reshape(-1, h)
    target = torch.tensor(ctx.shared_rng("target").normal((p * n, 1, h))).reshape(-1, h)
    logits = tokens @ R
    y = torch.zeros_like(tokens)
    for t in range(p * n):
        if t % n == 0:  # scripted: fixed experts, constant gates
            picks, gates = script[0][0], torch.tensor(script[0][1], dtype=torch.float64)
        else:
            picks = sorted(range(n_exp), key=lambda e: (-float(logits[t, e]), e))[:k]
            gates = torch.softmax(logits[t, list(picks)], dim=0)
        for j, e in enumerate(picks):
            hid = torch.nn.functional.gelu(tokens[t] @ E[e]["w1"] + E[e]["b1"], approximate="tanh")
            y[t] = y[t] + gates[j] * (hid @ E[e]["w2"] + E[e]["b2"])
    (y * target).sum().backward()
    got_y = np.concatenate([v["y"].reshape(-1, h) for v in res.values])
    assert np.max(np.abs(got_y - y.detach().numpy())) < 1e-12
    # the router is replicated and each EP rank routed its own tokens: its gradient sums over the ranks
    assert np.max(np.abs(sum(v["router"] for v in res.values) - R.grad.numpy())) < 1e-12


@pytest.mark.parametrize("ep, etp, n_exp, k, n, policy", [
    (2, 2, 4, 2, 3, None), (1, 2, 2, 1, 4, None), (2, 2, 4, 1, 0 + 2, None), (1, 4, 3, 2, 2, None),
    (2, 2, 4, 2, 3, "uniform"), (4, 2, 8, 3, 4, "uniform"), (2, 4, 4, 2, 2, "balanced"), (1, 2, 2, 1, 4, "uniform"),
])
def test_experts_split_by_tensor_parallelism_equal_autograd(ep, etp, n_exp, k, n, policy):
    """ETP: each expert's w1 split by columns (and b1), w2 by rows over the expert-TP group, b2 added once.
    Ranks (etp fastest, as Megatron orders them) each route their own n tokens; outputs, input gradients
    and every weight gradient equal torch autograd on the unsplit block; a rank's w1/w2 gradients are its
    slices of the whole ones, and b2's (summed over expert-TP) is whole. With a routing `policy` each rank
    works out which gathered rows chose its experts from every expert-TP peer's senders' draws (what lets a
    symbolic run, with no gates to read, split experts by TP): the reference routes by the same draws."""
    from parasim.nn.routing import Routing
    h, f, p = 6, 8, ep * etp
    routing = None if policy is None else Routing.parse(policy, seed=4)

    def program(ctx):
        # every rank creates every group, in one order (as torch.distributed wants); each keeps its own
        etps = [ctx.new_group([d * etp + r for r in range(etp)], "expert-tp") for d in range(ep)]
        eps = [ctx.new_group([d * etp + r for d in range(ep)], "ep") for r in range(etp)]
        etp_g, ep_g = etps[ctx.rank // etp], eps[ctx.rank % etp]
        router, experts = weights(ctx, h, f, n_exp)
        par = ParallelContext(ctx, etp_group=etp_g, options=LayerOptions(routing=routing))
        moe = MoE(par, ep_g, router, experts, k, etp=etp_g)
        x = ctx.shared_rng("x").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        target = ctx.shared_rng("target").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        y, cache = moe.forward(x, Saved())
        dx = moe.backward(cache, target)
        return {"y": y, "dx": dx, "grads": dict(moe.grads)}
    res = parasim.run(program, p)
    # a rank's tokens are counted from its place in its EP group (rank // etp), as its router numbers them
    picks = None if routing is None else np.concatenate(
        [routing.choose("moe#0", r, (r // etp) * n, n, n_exp, k) for r in range(p)])
    y, dx, dR, dE = reference(p, n, h, f, n_exp, k, picks)
    assert np.max(np.abs(np.concatenate([v["y"].reshape(-1, h) for v in res.values]) - y)) < 1e-10
    assert np.max(np.abs(np.concatenate([v["dx"].reshape(-1, h) for v in res.values]) - dx)) < 1e-10
    assert np.max(np.abs(sum(v["grads"]["router"] for v in res.values) - dR)) < 1e-10
    # the expert-TP collectives, in the order the layer runs them (each named, as a learner reads the trace)
    etp_labels = [e.label for e in res.trace.events if e.group.name == "expert-tp" and "b2 grad" not in e.label]
    assert list(dict.fromkeys(etp_labels)) == [
        "moe dispatched tokens to every expert-TP rank", "moe sum the experts' partial outputs over expert-TP",
        "moe combine backward: output gradients to every expert-TP rank",
        "moe backward: sum input and gate gradients over expert-TP"]
    per = n_exp // ep
    for e in range(n_exp):
        d = e // per  # the EP index holding expert e; its ranks are d*etp .. d*etp + etp - 1
        ranks = [d * etp + r for r in range(etp)]
        grads = [res.values[r]["grads"] for r in ranks]
        key = f"expert{e + 1}"
        assert np.max(np.abs(np.concatenate([g[f"{key}.w1"] for g in grads], axis=1) - dE[e]["w1"])) < 1e-10
        assert np.max(np.abs(np.concatenate([g[f"{key}.b1"] for g in grads]) - dE[e]["b1"])) < 1e-10
        assert np.max(np.abs(np.concatenate([g[f"{key}.w2"] for g in grads], axis=0) - dE[e]["w2"])) < 1e-10
        for g in grads:
            assert np.max(np.abs(g[f"{key}.b2"] - dE[e]["b2"])) < 1e-10


@pytest.mark.parametrize("kind", ["uniform", "balanced"])
def test_a_second_call_routes_by_its_own_draws(kind):
    """The block works out rows, plans and each expert's rows from the policy's draws and keeps them while
    the draws are the very same arrays (balanced routing draws alike every call). A second forward (call 1)
    with other draws (uniform) must route by them, not by what call 0 worked out: its output and input
    gradient are the unsplit block's with call 1's picks."""
    from parasim.nn.routing import Routing
    p, n, h, f, n_exp, k = 2, 5, 6, 8, 4, 1

    def draws(routing, call):
        return np.concatenate([routing.choose(f"moe#{call}", r, r * n, n, n_exp, k) for r in range(p)])

    def sent(picks):  # rows each rank sends to each EP rank (two experts each)
        return [[int(np.sum(picks[r * n:(r + 1) * n, 0] // 2 == d)) for d in range(p)] for r in range(p)]
    # a seed whose two calls send the same number of rows between every pair of ranks, to other experts: only
    # the draws themselves tell the calls apart
    routing = next(r for r in (Routing.parse(kind, seed=s) for s in range(500))
                   if sent(draws(r, 0)) == sent(draws(r, 1)) and not np.array_equal(draws(r, 0), draws(r, 1))) \
        if kind == "uniform" else Routing.parse(kind, seed=3)

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        router, experts = weights(ctx, h, f, n_exp)
        moe = MoE(ParallelContext(ctx, options=LayerOptions(routing=routing)), ep, router, experts, k)
        x = ctx.shared_rng("x").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        target = ctx.shared_rng("target").normal((p * n, 1, h))[ctx.rank * n:(ctx.rank + 1) * n]
        moe.forward(x * 0.5, Saved())  # call 0
        y, cache = moe.forward(x, Saved())  # call 1
        dx = moe.backward(cache, target)
        moe.forward(x, Saved())  # call 2: its own draws again
        return {"y": y, "dx": dx, "third": [[e for e, _ in r] for r in moe.last_routing]}
    res = parasim.run(program, p)
    picks, first = draws(routing, 1), draws(routing, 0)
    assert np.concatenate([v["third"] for v in res.values]).tolist() == draws(routing, 2).tolist()
    assert (kind == "balanced") == np.array_equal(picks, first)  # uniform: call 1 draws other experts
    y, dx, _, _ = reference(p, n, h, f, n_exp, k, picks)
    assert np.max(np.abs(np.concatenate([v["y"].reshape(-1, h) for v in res.values]) - y)) < 1e-10
    assert np.max(np.abs(np.concatenate([v["dx"].reshape(-1, h) for v in res.values]) - dx)) < 1e-10


def test_ranks_with_no_tokens():
    """EP ranks with no token to route (an empty micro-batch share) still meet in every all-to-all, send
    nothing and give empty outputs and input gradients; the experts' gradients are zero."""
    h, f, n_exp = 6, 8, 4

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        router, experts = weights(ctx, h, f, n_exp)
        moe = MoE(ParallelContext(ctx), ep, router, experts, 2)
        y, cache = moe.forward(np.zeros((0, 1, h)), Saved())
        return {"y": y, "dx": moe.backward(cache, np.zeros((0, 1, h))), "grads": dict(moe.grads)}
    res = parasim.run(program, 2)
    for v in res.values:
        assert v["y"].shape == (0, 1, h) and v["dx"].shape == (0, 1, h)
        assert all(not np.any(g) for g in v["grads"].values())
    events = [e for e in res.trace.events if e.op == "all_to_all"]
    assert len(events) == 4 and all(m.sent == 0 for e in events for m in e.members)


def test_routing_by_policy_without_an_ep_group():
    """One rank and no EP group: every expert is local, and the policy's draws still say which rows each
    expert takes."""
    from parasim.nn.routing import Routing
    check(1, 5, 6, 8, 4, 2, Routing.parse("uniform", seed=2))


def test_scripted_routes_keep_the_layers_dtype():
    """Scripted gates are constants of the layer's dtype: a float32 block with a scripted token stays float32,
    and the scripted token's output is its gate times its expert's."""
    def program(ctx):
        router, experts = weights(ctx, 6, 8, 4)
        experts = [{k: v.astype(np.float32) for k, v in e.items()} for e in experts]
        moe = MoE(ParallelContext(ctx), None, router.astype(np.float32), experts, 1)
        moe.scripted = {0: ((3,), (0.25,))}
        x = ctx.shared_rng("x").normal((2, 1, 6)).astype(np.float32)
        y, _ = moe.forward(x, Saved())
        e = experts[3]
        hid = x[0, 0] @ e["w1"] + e["b1"]
        want = 0.25 * (0.5 * hid * (1 + np.tanh(np.sqrt(2 / np.pi) * (hid + 0.044715 * hid ** 3))) @ e["w2"] + e["b2"])
        return y.dtype, float(np.max(np.abs(y[0, 0] - want)))
    (dtype, err), = parasim.run(program, 1).values
    assert dtype == np.float32 and err < 1e-5

"""DeepSeek-V3's node-limited routing (nn/routing.py's GroupLimit): each token's k experts come from the M
groups of experts it ranks best (a group scores its two best experts), ties to the lower index.

The learned router under a limit is exact against a one-device torch float64 reference that makes the same
choice its own way (plain Python sorts below, not the package's); a policy under a limit draws each token's
M groups, then its experts inside them, alike on every rank and every run; and the node-limited lesson's
bytes across nodes are counted again here from the trace's own chunks and the policy's draws."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import parasim
from parasim.errors import LayoutError, UsageError
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import GroupLimit, Routing

H, F = 6, 8  # the small block's hidden size and expert width


# -- the choice, by hand -----------------------------------------------------------------------------------
def limited_by_hand(row: list[float], groups: int, kept: int, k: int) -> list[int]:
    """One token's k experts under the limit, written out with Python's sorts: a group's score is its best
    expert's plus its second best's; the `kept` best groups, lower group first on a tie; then the k best
    experts of those groups, lower expert first on a tie."""
    per = len(row) // groups

    def score(g: int) -> float:
        best = sorted(row[g * per:(g + 1) * per], reverse=True)
        return best[0] + best[1] if per > 1 else best[0]
    keep = sorted(range(groups), key=lambda g: (-score(g), g))[:kept]
    return sorted((e for e in range(len(row)) if e // per in keep), key=lambda e: (-row[e], e))[:k]


@pytest.mark.parametrize("row, groups, kept, k, want", [
    # group 1 (5 + 5) beats group 0 (9 + 0) though expert 0 scores best: a group is its two best, not its best
    ([9, 0, 5, 5, 4, 4, 0, 0], 4, 1, 1, [2]),
    ([9, 0, 5, 5, 4, 4, 0, 0], 4, 1, 2, [2, 3]),  # experts 2 and 3 tie: the lower first
    ([9, 0, 5, 5, 4, 4, 0, 0], 4, 2, 3, [0, 2, 3]),
    # groups 0, 1 and 2 all score 4: the lower groups are kept, and expert 4 (the best, in group 2) is not
    ([3, 1, 2, 2, 4, 0, 0, 0], 4, 1, 2, [0, 1]),
    ([3, 1, 2, 2, 4, 0, 0, 0], 4, 2, 3, [0, 2, 3]),
    ([3, 1, 2, 2, 4, 0, 0, 0], 4, 3, 2, [4, 0]),
    ([1, 3, 2, 3], 4, 2, 2, [1, 3]),  # groups of one expert: a group scores its one expert; 1 and 3 tie
    ([0, 0, 0, 0, 0, 0], 3, 2, 4, [0, 1, 2, 3]),  # everything ties: the first groups, the first experts
    ([1, 2, 3, 4, 5, 6, 7, 8], 2, 2, 3, [7, 6, 5]),  # every group kept: the plain top k
])
def test_group_limited_top_k_worked_by_hand(row, groups, kept, k, want):
    got = GroupLimit(groups, kept).top(np.asarray([row], dtype=np.float64), k)
    assert got.tolist() == [want]
    assert limited_by_hand([float(v) for v in row], groups, kept, k) == want  # the test's own rule agrees


@pytest.mark.parametrize("n_exp, groups, kept, k", [(64, 64, 10, 5), (64, 32, 7, 9), (96, 24, 5, 6), (8, 4, 2, 3)])
def test_group_limited_top_k_on_many_ties(n_exp, groups, kept, k):
    """Scores of 0, 1 or 2 over many groups: nearly every group and expert ties with others, and the lower
    index must win every time (sorts of many ties that are not stable get this wrong)."""
    scores = np.random.default_rng(n_exp + groups).integers(0, 3, (200, n_exp)).astype(np.float64)
    got = GroupLimit(groups, kept).top(scores, k).tolist()
    assert got == [limited_by_hand(row, groups, kept, k) for row in scores.tolist()]


# -- the learned router, exact against torch ----------------------------------------------------------------
def run_block(p: int, n: int, n_exp: int, k: int, limit: GroupLimit | None, routing: Routing | None = None,
              halves: bool = True):
    """n tokens per EP rank through an MoE block of n_exp experts at EP p. `halves`: router and tokens rounded
    to halves, so scores are exact quarters that tie often (and equal in numpy and torch)."""
    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep") if ctx.world > 1 else None
        router, experts, x, target = inputs(ctx, p, n, n_exp, halves)
        moe = MoE(ParallelContext(ctx, options=LayerOptions(routing=routing)), ep, router, experts, k, limit=limit)
        mine = slice(ctx.rank * n, (ctx.rank + 1) * n)
        y, cache = moe.forward(x[mine], Saved())
        dx = moe.backward(cache, target[mine])
        return {"y": y, "dx": dx, "grads": dict(moe.grads), "picks": moe.last_picks,
                "routing": [[e for e, _ in r] for r in moe.last_routing]}
    return parasim.run(program, p)


def inputs(ctx, p: int, n: int, n_exp: int, halves: bool):
    def draw(name, shape, std=1.0):
        a = ctx.shared_rng(name).normal(shape, std=std)
        return np.round(a * 2) / 2 if halves else a
    router = draw("router", (H, n_exp))
    experts = [{"w1": ctx.shared_rng(f"e{e}.w1").normal((H, F), std=H ** -0.5),
                "b1": ctx.shared_rng(f"e{e}.b1").normal((F,), std=0.1),
                "w2": ctx.shared_rng(f"e{e}.w2").normal((F, H), std=F ** -0.5),
                "b2": ctx.shared_rng(f"e{e}.b2").normal((H,), std=0.1)} for e in range(n_exp)]
    return router, experts, draw("x", (p * n, 1, H)), ctx.shared_rng("target").normal((p * n, 1, H))


def reference(p: int, n: int, n_exp: int, k: int, choose, halves: bool):
    """The unsplit block in torch float64 autograd; `choose(logits row as floats)` gives a token's k experts.
    Returns y, dx, the router's gradient, each expert's gradients and the picks."""
    torch = pytest.importorskip("torch")
    from layer_check import SharedCtx
    from torch_ref import activation, tensor
    ctx = SharedCtx()
    router, experts, x, target = inputs(ctx, p, n, n_exp, halves)
    R = tensor(router, requires_grad=True)
    E = [{key: tensor(v, requires_grad=True) for key, v in e.items()} for e in experts]
    X = tensor(x, requires_grad=True)
    tokens = X.reshape(-1, H)
    logits = tokens @ R
    picks = [choose([float(v) for v in row]) for row in logits.detach()]
    gates = torch.softmax(torch.gather(logits, 1, torch.tensor(picks)), dim=1)
    y = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for j, e in enumerate(picks[t]):
            w = E[e]
            y[t] = y[t] + gates[t, j] * (activation(tokens[t] @ w["w1"] + w["b1"], "gelu") @ w["w2"] + w["b2"])
    (y.reshape(X.shape) * tensor(target)).sum().backward()
    grads = [{key: v.grad.numpy() if v.grad is not None else np.zeros(v.shape) for key, v in e.items()} for e in E]
    return y.detach().numpy(), X.grad.numpy().reshape(-1, H), R.grad.numpy(), grads, picks


def assert_exact(res, p: int, n: int, n_exp: int, k: int, choose, halves: bool = True) -> list[list[int]]:
    y, dx, dR, dE, picks = reference(p, n, n_exp, k, choose, halves)
    got = [r for v in res.values for r in v["routing"]]
    assert got == picks
    assert np.max(np.abs(np.concatenate([v["y"].reshape(-1, H) for v in res.values]) - y)) < 1e-10
    assert np.max(np.abs(np.concatenate([v["dx"].reshape(-1, H) for v in res.values]) - dx)) < 1e-10
    assert np.max(np.abs(sum(v["grads"]["router"] for v in res.values) - dR)) < 1e-10  # each rank routed its own
    for e in range(n_exp):
        for key in ("w1", "b1", "w2", "b2"):
            held = [v["grads"][f"expert{e + 1}.{key}"] for v in res.values if f"expert{e + 1}.{key}" in v["grads"]]
            assert len(held) == 1 and np.max(np.abs(held[0] - dE[e][key])) < 1e-10, (e, key)
    return picks


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("groups, kept, k", [(4, 1, 2), (4, 2, 3), (2, 1, 2), (8, 3, 3), (8, 1, 1)])
def test_the_limited_router_equals_the_unsplit_block(p, groups, kept, k):
    """Scores in quarters tie often, between experts and between groups: the choices, the output and every
    gradient are those of one device making the same choice (gates: softmax over the k chosen scores)."""
    n, n_exp = 6, 8
    res = run_block(p, n, n_exp, k, GroupLimit(groups, kept))
    picks = assert_exact(res, p, n, n_exp, k, lambda row: limited_by_hand(row, groups, kept, k))
    per = n_exp // groups
    assert all(len({e // per for e in r}) <= kept for r in picks)


def test_the_limit_changes_picks_and_is_exact_on_untied_scores():
    """Random scores (no ties), EP 4, 2 of 4 groups: some token's best k experts lie in more than 2 groups,
    so the limit changes its picks (the test above would pass on a block that ignored the limit only if none
    did); the block still equals the unsplit one."""
    p, n, n_exp, k = 4, 6, 8, 3
    res = run_block(p, n, n_exp, k, GroupLimit(4, 2), halves=False)
    picks = assert_exact(res, p, n, n_exp, k, lambda row: limited_by_hand(row, 4, 2, k), halves=False)
    free = run_block(p, n, n_exp, k, None, halves=False)
    assert [r for v in free.values for r in v["routing"]] != picks


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("halves", [True, False])
def test_keeping_every_group_is_todays_routing(p, halves):
    """M = G rules nothing out: the very same picks, outputs and gradients, bit for bit, as no limit."""
    n, n_exp, k = 5, 8, 3
    a = run_block(p, n, n_exp, k, GroupLimit(4, 4), halves=halves)
    b = run_block(p, n, n_exp, k, None, halves=halves)
    for va, vb in zip(a.values, b.values):
        assert va["routing"] == vb["routing"] and np.array_equal(va["picks"], vb["picks"])
        assert np.array_equal(va["y"], vb["y"]) and np.array_equal(va["dx"], vb["dx"])
        assert all(np.array_equal(va["grads"][key], vb["grads"][key]) for key in vb["grads"])


def test_two_groups_that_tie_for_every_token_keep_the_lower():
    """Experts 0, 1 (group 0, EP rank 0) score like columns 0, 1 of a random matrix and experts 2, 3 (group 1,
    EP rank 1) like columns 1, 0: the two groups tie for every token. Where they are the best groups, a token
    keeps group 0 and picks 0 and 1; the expected picks come from where the columns were copied."""
    p, n, k = 4, 8, 2
    cols = [0, 1, 1, 0, 2, 3, 4, 5]

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        base = ctx.shared_rng("base").normal((H, 6))
        experts = [{"w1": ctx.shared_rng(f"e{e}.w1").normal((H, F)), "w2": ctx.shared_rng(f"e{e}.w2").normal((F, H))}
                   for e in range(8)]
        moe = MoE(ParallelContext(ctx), ep, base[:, cols], experts, k, limit=GroupLimit(4, 1))
        x = ctx.shared_rng("x").normal((p * n, 1, H))[ctx.rank * n:(ctx.rank + 1) * n]
        moe.forward(x, Saved())
        return {"picks": moe.last_picks.tolist(), "scores": x.reshape(-1, H) @ base}
    res = parasim.run(program, p)
    got = [r for v in res.values for r in v["picks"]]
    scores = np.concatenate([v["scores"] for v in res.values])
    want, tied = [], 0
    for s in scores:
        pairs = [(s[0] + s[1], [0, 1] if s[0] > s[1] else [1, 0]), (s[2] + s[3], [4, 5] if s[2] > s[3] else [5, 4]),
                 (s[4] + s[5], [6, 7] if s[4] > s[5] else [7, 6])]  # group 1 ties group 0: never kept over it
        best = max(range(3), key=lambda i: pairs[i][0])
        tied += best == 0
        want.append(pairs[best][1])
    assert tied >= 3 and got == want


@pytest.mark.parametrize("make, message", [
    (lambda: GroupLimit(0, 1), "groups must be a positive integer, got 0"),
    (lambda: GroupLimit(4, 0), "groups kept must be a positive integer, got 0"),
    (lambda: GroupLimit(True, 1), "groups must be a positive integer, got True"),
    (lambda: GroupLimit(4, 2.0), "groups kept must be a positive integer, got 2.0"),
    (lambda: GroupLimit(4, 5), "keeps 1 to 4 of its 4 groups, not 5"),
    (lambda: GroupLimit(3, 1).check(8, 2), "8 experts do not split evenly into 3 groups"),
    (lambda: GroupLimit(4, 1).check(8, 3), "top_k 3 is more than the 2 experts of the 1 of 4 groups"),
    (lambda: Routing.parse("uniform").choose("moe#0", 0, 0, 5, 8, 3, GroupLimit(4, 1)), "top_k 3 is more than"),
    (lambda: Routing.parse("uniform").choose("moe#0", 0, 0, 5, 9, 3, GroupLimit(2, 1)), "9 experts do not split"),
])
def test_bad_limits_get_one_line(make, message):
    with pytest.raises(LayoutError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def test_the_block_refuses_a_limit_that_does_not_fit_its_experts():
    def program(ctx):
        router, experts, _, _ = inputs(ctx, 1, 1, 8, True)
        MoE(ParallelContext(ctx), None, router, experts, 2, limit=GroupLimit(3, 1))
    with pytest.raises(LayoutError, match="8 experts do not split evenly into 3 groups"):
        parasim.run(program, 1)


# -- the policy under a limit --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["uniform", "skewed:0.5"])
@pytest.mark.parametrize("n_exp, groups, kept, k", [(8, 4, 1, 2), (256, 8, 4, 8), (16, 8, 3, 5), (12, 6, 2, 4),
                                                    (8, 2, 1, 4)])
def test_no_token_picks_from_more_groups_than_kept(kind, n_exp, groups, kept, k):
    picks = Routing.parse(kind, seed=4).choose("moe#0", 3, 0, 2000, n_exp, k, GroupLimit(groups, kept))
    spans = [len(set(row)) for row in (picks // (n_exp // groups)).tolist()]
    assert max(spans) == kept and picks.shape == (2000, k)  # the bound, and met
    assert all(len(set(row)) == k for row in picks.tolist()) and 0 <= picks.min() and picks.max() < n_exp
    free = Routing.parse(kind, seed=4).choose("moe#0", 3, 0, 2000, n_exp, k)
    assert max(len(set(row)) for row in (free // (n_exp // groups)).tolist()) > kept  # the limit is what bounds it


def test_each_token_draws_its_groups_uniformly_then_its_experts_inside():
    """8 experts in 4 groups of 2, 2 groups kept, k = 4: a token's picks fill its two groups exactly, so its
    groups can be read off; each of the 6 pairs of groups comes about 6000 / 6 times. With k = 1 every expert
    is picked about 6000 / 8 times."""
    n = 6000
    picks = Routing.parse("uniform", seed=1).choose("moe#0", 0, 0, n, 8, 4, GroupLimit(4, 2))
    pairs = [tuple(sorted(set(row))) for row in (picks // 2).tolist()]
    counts = {pair: pairs.count(pair) for pair in set(pairs)}
    assert len(counts) == 6 and all(abs(c - n / 6) < 120 for c in counts.values())  # 4 standard deviations
    one = Routing.parse("uniform", seed=1).choose("moe#0", 0, 0, n, 8, 1, GroupLimit(4, 2))
    assert all(abs(c - n / 8) < 110 for c in np.bincount(one.ravel(), minlength=8))


def test_a_hot_token_keeps_the_hot_experts_group():
    picks = Routing.parse("skewed:1").choose("moe#0", 0, 0, 500, 16, 3, GroupLimit(4, 2))
    assert (picks[:, 0] == 0).all() and (picks[:, 1:] != 0).all()
    assert max(len(set(row)) for row in (picks // 4).tolist()) == 2


@pytest.mark.parametrize("kind", ["uniform", "skewed:0.3", "balanced"])
def test_a_limit_keeping_every_group_draws_as_today(kind):
    r = Routing.parse(kind, seed=2)
    assert np.array_equal(r.choose("moe#0", 1, 5, 300, 16, 4, GroupLimit(4, 4)), r.choose("moe#0", 1, 5, 300, 16, 4))
    if kind != "balanced":  # a limit that rules groups out draws otherwise
        assert not np.array_equal(r.choose("moe#0", 1, 5, 300, 16, 4, GroupLimit(4, 2)),
                                  r.choose("moe#0", 1, 5, 300, 16, 4))


def test_skewed_with_no_hot_tokens_draws_as_uniform_under_a_limit():
    limit = GroupLimit(8, 3)
    assert np.array_equal(Routing.parse("skewed:0", seed=6).choose("moe#1", 2, 0, 400, 64, 6, limit),
                          Routing.parse("uniform", seed=6).choose("moe#1", 2, 0, 400, 64, 6, limit))


def test_balanced_routing_refuses_a_limit_in_one_line():
    with pytest.raises(UsageError, match="balanced routing spreads a token's picks over 2 groups") as err:
        Routing.parse("balanced").choose("moe#0", 0, 0, 8, 8, 2, GroupLimit(4, 2))
    assert "\n" not in str(err.value)


def test_the_draws_are_the_same_on_every_rank():
    """Every rank asks a policy of its own for every sender's draws under the limit: all answer alike, and
    a policy made afresh (another run) gives them again."""
    limit, n = GroupLimit(4, 2), 50

    def program(ctx):
        mine = Routing.parse("uniform", seed=7)
        return np.stack([mine.choose("moe#0", s, s * n, n, 16, 3, limit) for s in range(ctx.world)])
    values = parasim.run(program, 4).values
    assert all(np.array_equal(v, values[0]) for v in values)
    again = Routing.parse("uniform", seed=7)
    assert np.array_equal(np.stack([again.choose("moe#0", s, s * n, n, 16, 3, limit) for s in range(4)]), values[0])


def test_the_draws_are_the_same_in_another_process():
    """Nothing of a process (its hash seed) enters the draws: a fresh interpreter with another hash seed draws
    the very same picks."""
    code = ("import hashlib; from parasim.nn.routing import Routing, GroupLimit; "
            "a = Routing.parse('skewed:0.25', seed=5).choose('layer 3.moe#2', 9, 40, 200, 256, 8, GroupLimit(8, 4)); "
            "print(hashlib.sha256(a.tobytes()).hexdigest())")
    here = Routing.parse("skewed:0.25", seed=5).choose("layer 3.moe#2", 9, 40, 200, 256, 8, GroupLimit(8, 4))
    import hashlib
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hashlib.sha256(here.tobytes()).hexdigest()


@pytest.mark.parametrize("p", [2, 4])
def test_receivers_work_out_the_limited_picks(p):
    """Routed by a policy under a limit, each EP rank finds which received rows chose its experts from the
    senders' limited draws: the block equals the unsplit one with those picks."""
    n, n_exp, k, limit = 5, 8, 3, GroupLimit(4, 2)
    policy = Routing.parse("uniform", seed=3)
    res = run_block(p, n, n_exp, k, limit, routing=policy)
    drawn = np.concatenate([policy.choose("moe#0", r, r * n, n, n_exp, k, limit) for r in range(p)]).tolist()
    rows = iter(drawn)
    assert_exact(res, p, n, n_exp, k, lambda row: next(rows))


def test_virtual_and_symbolic_ranks_send_the_same_bytes_under_a_limit():
    from conftest import trace_key
    limit = GroupLimit(4, 1)

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        draw = ctx.shared_rng
        experts = [{"w1": draw(f"e{e}.w1").normal((H, F)), "w2": draw(f"e{e}.w2").normal((F, H))} for e in range(16)]
        tp = ParallelContext(ctx, options=LayerOptions(routing=Routing.parse("uniform", seed=2)))
        moe = MoE(tp, ep, draw("router").normal((H, 16)), experts, 3, limit=limit)
        y, cache = moe.forward(draw(f"x{ctx.rank}").normal((20, H)), Saved())
        moe.backward(cache, y)
    # at FP64 a symbolic run computes in the virtual run's float64: the same trace, byte for byte
    real, sym = parasim.run(program, 4, precision="fp64"), parasim.run(program, 4, backend="symbolic", precision="fp64")
    assert trace_key(sym.trace) == trace_key(real.trace)
    assert any(m.sent for e in real.trace.events if e.op == "all_to_all" for m in e.members)


# -- the lesson -------------------------------------------------------------------------------------------------
_RUN: list = []


def lesson_run():
    if not _RUN:
        from parasim.lesson import get_lesson, run_lesson
        _RUN.append(run_lesson(get_lesson("node-limited")))
    return _RUN[0]


def test_the_lesson_holds_every_check():
    lr = lesson_run()
    assert lr.checks and all(c.ok for c in lr.checks), [c.name for c in lr.checks if not c.ok]
    assert len(lr.tables) == 3 and len(lr.tables[0].rows) == 2 and len(lr.tables[2].rows) == 2  # BF16, FP8


def test_the_lessons_bytes_across_nodes_counted_from_its_chunks():
    """Each GPU's dispatch rows to GPUs of other nodes, read from the chunks it handed the all-to-all (not
    the package's link rules), against the uniform policy's draws counted here; with the 4-node cap every
    GPU sends fewer, and no capped token's picks lie on more than 4 nodes."""
    lr = lesson_run()
    world, t, e, k, d = 64, 4096, 256, 8, 7168
    policy = Routing.parse("uniform")
    across = {}
    for name, limit in (("moe.free", None), ("moe.capped", GroupLimit(8, 4))):
        (event,) = [ev for ev in lr.result.trace.events if ev.op == "all_to_all" and ev.label.startswith(
            f"{name} dispatch")]
        sent = {m.rank: [c.shape for c in m.ins] for m in event.members}
        across[name] = []
        for g in range(world):
            picks = policy.choose(f"{name}#0", g, g * t, t, e, k, limit)
            gpus = [set(row) for row in (picks // 4).tolist()]  # 4 experts a GPU
            rows = sum(1 for s in gpus for dest in s if dest // 8 != g // 8)
            assert [sent[g][dest] for dest in range(world) if dest // 8 != g // 8] == \
                   [(sum(dest in s for s in gpus), d + 4) for dest in range(world) if dest // 8 != g // 8]
            across[name].append(rows * (d + 4) * 2)  # BF16 values and gates (the post's precision)
            if limit is not None:
                assert max(len(set(row)) for row in (picks // 32).tolist()) <= 4
    assert all(c < f for c, f in zip(across["moe.capped"], across["moe.free"]))
    free, capped = lr.tables[0].rows
    assert free[1][0] == round(np.mean(across["moe.free"]) / 1e6, 1)
    assert capped[1][0] == round(np.mean(across["moe.capped"]) / 1e6, 1)
    assert capped[1][3] < free[1][3]  # the total across nodes, in GB

"""Gradient clipping by global norm over both gradient groups: the 16-GPU MoE run clips exactly as one device
does (torch's clip_grad_norm_ and Adam on the unsplit model's gradients), the wrong ways of counting give
other numbers, and a small dense ZeRO-1 case over dp 2 x tp 2 matches a norm and an Adam step worked by hand."""
import math

import numpy as np
import pytest

import parasim
import parasim.examples.moe16 as moe16
import parasim.train.step as step
from parasim.examples.moe16_exact import exactness
from parasim.dp import clip
from parasim.dp.zero import sum_partials, zero1_step
from parasim.errors import UsageError
from parasim.layout import Layout
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import Stack, TransformerLayer, layer_weights
from parasim.layout.placement import Partial, Replicate, Shard

MAX_NORM = 1.0  # moe16's gradient norm is about 193: this clips hard (coefficient about 0.005)


# -- the references: one device, numbers never taken from the code under test --------------------------------

def _unsplit(ctx):
    """The example's model on one device over all 4 sequences: its weights and summed gradients."""
    model = moe16.SHAPE
    layers = [TransformerLayer(ParallelContext(ctx), model, layer_weights(ctx, model, f"L{i}"), key=f"L{i}")
              for i in range(model.layers)]
    stack = Stack(layers)
    for seq in [s for rep in moe16.REPLICAS for s in rep]:
        y, cache = stack.forward(moe16.embed(ctx, seq, model.hidden), Saved())
        stack.backward(cache, moe16.target_of(ctx, seq, model.hidden))
    return ({k: np.array(v) for k, v in stack.params().items()}, {k: np.array(g) for k, g in stack.grads.items()})


def _torch_step(params, grads, max_norm, groups=None):
    """torch: clip_grad_norm_ over every weight at once (or over each of `groups` on its own: the wrong way),
    then one Adam step. Returns (the norm clip_grad_norm_ measured, the new weights)."""
    torch = pytest.importorskip("torch")
    ps = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    for k, p in ps.items():
        p.grad = torch.tensor(grads[k], dtype=torch.float64)
    norm = None
    for keys in groups or [list(ps)]:
        norm = torch.nn.utils.clip_grad_norm_([ps[k] for k in keys], max_norm)
    torch.optim.Adam(list(ps.values()), lr=moe16.LR).step()  # betas and eps as Zero1Adam's defaults
    return float(norm), {k: p.detach().numpy() for k, p in ps.items()}


@pytest.fixture(scope="module")
def reference():
    return parasim.run(_unsplit, 1).values[0]


def _run_moe16(monkeypatch, max_norm):
    """moe16 on 16 virtual ranks; beside its trace, what each rank's ZeRO-1 step returned (its whole new
    weights), with their placements and the rank's coordinates."""
    seen = {}
    real = step.zero1_step  # the one step program's call of ZeRO-1

    def spy(ctx, model, lr, **kw):
        new, sq, state = real(ctx, model, lr, **kw)
        seen[ctx.rank] = ({k: np.array(v) for k, v in new.items()}, dict(model.placements), vars(ctx.coords))
        return new, sq, state
    monkeypatch.setattr(step, "zero1_step", spy)
    return parasim.run(moe16.make_program(None, max_norm=max_norm), 16), seen


def _piece(key, whole, placed, coords, sizes):
    """A rank's piece of a whole weight: sliced over tp (dense) or etp (experts) where sharded. The fused
    qkv weight is [q | k | v] (kv heads = heads here): each of the three is split over tp, as Megatron
    does. Over ep the key names one expert, so the whole key is the piece."""
    for axis in ("tp", "etp"):
        p = placed.get(axis)
        if isinstance(p, Shard) and sizes[axis] > 1:
            blocks = np.split(whole, 3, axis=p.dim) if "qkv" in key else [whole]
            whole = np.concatenate([np.split(b, sizes[axis], axis=p.dim)[coords[axis]] for b in blocks], axis=p.dim)
    return whole


def _worst(seen, ref_weights):
    """The largest difference, over every rank and weight it holds, from the reference's matching piece."""
    sizes = {"tp": moe16.preset(moe16.LAYOUT).tp, "etp": moe16.preset(moe16.LAYOUT).etp}
    worst = 0.0
    for new, placed, coords in seen.values():
        for k, w in new.items():
            worst = max(worst, float(np.max(np.abs(w - _piece(k, ref_weights[k], placed[k], coords, sizes)))))
    return worst


def _norm_note(trace):
    (note,) = trace.notes("grad_norm")  # rank 0 notes it once
    return note[3]


# -- (1) moe16 clips as one device does ----------------------------------------------------------------------

def test_moe16_clips_as_one_device_does(monkeypatch, reference):
    assert moe16.SHAPE.kv_heads in (None, moe16.SHAPE.heads)  # _piece's reading of the fused qkv weight
    params, grads = reference
    want_norm, want = _torch_step(params, grads, MAX_NORM)
    result, seen = _run_moe16(monkeypatch, MAX_NORM)
    note = _norm_note(result.trace)
    # the norm the 16 GPUs computed is the unsplit model's, to rounding (measured: 193.26066929276817 vs ...814)
    assert note["grad_norm"] == pytest.approx(want_norm, rel=1e-12)
    assert note["clip_coef"] == pytest.approx(MAX_NORM / (want_norm + 1e-6), rel=1e-12) and note["clip_coef"] < 0.01
    experts = {k for new, placed, _ in seen.values() for k in new if "ep" in placed[k]}
    assert experts and len(experts) < len(grads)  # both groups are in the model
    for part, keys in (("dense_norm", set(grads) - experts), ("expert_norm", experts)):
        assert note[part] == pytest.approx(math.sqrt(sum(float(np.sum(grads[k] ** 2)) for k in keys)), rel=1e-12)
    # every rank's weights after the clipped Adam step: torch's, piece by piece
    assert {k for new, _, _ in seen.values() for k in new} == set(want)
    assert _worst(seen, want) < 1e-10
    # the example's own check clips its unsplit reference the same way
    assert exactness(result.values, moe16.preset(moe16.LAYOUT), max_norm=MAX_NORM)["exact"]
    # and clipping is visible at this tolerance: unclipped Adam lands elsewhere
    _, unclipped = _torch_step(params, grads, math.inf)
    assert _worst(seen, unclipped) > 1e-7


def test_a_max_norm_above_the_norm_changes_nothing(monkeypatch):
    """Coefficient 1: the same weights as the unclipped run, bit for bit; one more collective (the norm)."""
    clipped, seen = _run_moe16(monkeypatch, 1e6)
    plain, seen0 = _run_moe16(monkeypatch, None)
    assert _norm_note(clipped.trace)["clip_coef"] == 1.0 and not plain.trace.notes("grad_norm")
    for r in seen:
        assert all(np.array_equal(seen[r][0][k], seen0[r][0][k]) for k in seen[r][0])
    extra = [e for e in clipped.trace.events if e.op == "all_reduce" and e.group.name == "world"]
    assert len(clipped.trace.events) == len(plain.trace.events) + 1 and len(extra) == 1
    assert extra[0].ranks == list(range(16)) and extra[0].phase == "gradient sync"


# -- (2) the wrong ways of counting give other numbers: the checks above can fail ----------------------------

def test_counting_tp_copies_twice_gives_another_norm(monkeypatch, reference):
    """Every rank counts its pieces, copies included: the norms' and routers' gradients (whole on both TP
    ranks) enter twice. The note then shows exactly that wrong number, and the weights miss torch's."""
    params, grads = reference
    want_norm, want = _torch_step(params, grads, MAX_NORM)
    monkeypatch.setattr(clip, "counts_here", lambda ctx, placed: True)
    result, seen = _run_moe16(monkeypatch, MAX_NORM)
    got = _norm_note(result.trace)["grad_norm"]
    placed = {k: pl[k] for _, pl, _ in seen.values() for k in pl}
    copies = [k for k, p in placed.items() if "ep" not in p and not isinstance(p.get("tp"), Shard)]
    assert copies  # norms and routers
    assert got ** 2 == pytest.approx(want_norm ** 2 + sum(float(np.sum(grads[k] ** 2)) for k in copies), rel=1e-12)
    assert abs(got - want_norm) > 1.0
    assert _worst(seen, want) > 1e-10


def test_a_norm_per_gradient_group_differs_from_the_global_one(monkeypatch, reference):
    """Clipping dense weights and experts each by its own group's norm (one all-reduce per group) scales them
    by other coefficients than one device would: torch clipping per group lands away from the run."""
    params, grads = reference
    want_norm, _ = _torch_step(params, grads, MAX_NORM)
    result, seen = _run_moe16(monkeypatch, MAX_NORM)
    note = _norm_note(result.trace)
    assert min(abs(note["dense_norm"] - want_norm), abs(note["expert_norm"] - want_norm)) > 10.0
    experts = sorted({k for new, placed, _ in seen.values() for k in new if "ep" in placed[k]})
    _, per_group = _torch_step(params, grads, MAX_NORM, [sorted(set(grads) - set(experts)), experts])
    assert _worst(seen, per_group) > 1e-7


# -- (3) a small dense model: ZeRO-1 over dp 2, tp 2, worked by hand ------------------------------------------

_RNG = np.random.default_rng(7)
W0, B0, N0 = _RNG.normal(size=(4, 6)), _RNG.normal(size=6), _RNG.normal(size=3)
GW = _RNG.normal(size=(2, 4, 6))  # [dp replica]: each replica's gradient of the whole w
GB = _RNG.normal(size=(2, 6))  # [dp replica]: b's gradient, whole on both TP ranks
GN = _RNG.normal(size=(2, 2, 3))  # [dp replica, tp rank]: n's gradient, partial over tp (SP)
PLACED = {"w": {"tp": Shard(1)}, "b": {"tp": Replicate()}, "n": {"tp": Partial()}}


class Dense:
    """w split over tp by columns, b whole on both TP ranks, n whole with a gradient partial over tp."""
    placements = PLACED

    def __init__(self, ctx):
        dp, t = ctx.coords.dp, ctx.coords.tp
        cols = slice(3 * t, 3 * t + 3)
        self.p = {"w": ctx.asarray(W0[:, cols]), "b": ctx.asarray(B0), "n": ctx.asarray(N0)}
        self.grads = {"w": ctx.asarray(GW[dp][:, cols]), "b": ctx.asarray(GB[dp]), "n": ctx.asarray(GN[dp, t])}

    def params(self):
        return self.p


def _dense_run(max_norm):
    def program(ctx):
        new, _, _ = zero1_step(ctx, Dense(ctx), 0.1, partials=True, max_norm=max_norm)
        return {k: np.array(v) for k, v in new.items()}, ctx.coords.tp
    return parasim.run(program, layout=Layout(tp=2, dp=2))


def test_dense_zero1_clips_as_worked_by_hand():
    g = {"w": GW.sum(0), "b": GB.sum(0), "n": GN.sum((0, 1))}  # the gradients one device would get
    norm = math.sqrt(sum(float(np.sum(x ** 2)) for x in g.values()))
    coef = 0.5 / (norm + 1e-6)
    assert coef < 1
    # Adam's first step: m_hat = g and v_hat = g * g, so each weight moves by lr * g / (|g| + eps)
    want = {k: p - 0.1 * coef * g[k] / (np.abs(coef * g[k]) + 1e-8) for k, p in (("w", W0), ("b", B0), ("n", N0))}
    res = _dense_run(0.5)
    note = _norm_note(res.trace)
    assert note["grad_norm"] == pytest.approx(norm, rel=1e-13) and note["expert_norm"] == 0.0
    for new, t in res.values:
        assert np.allclose(new["w"], want["w"][:, 3 * t:3 * t + 3], rtol=0, atol=1e-13)
        assert np.allclose(new["b"], want["b"], rtol=0, atol=1e-13)
        assert np.allclose(new["n"], want["n"], rtol=0, atol=1e-13)
    # counting b and n on both TP ranks would give another norm
    twice = math.sqrt(norm ** 2 + float(np.sum(g["b"] ** 2) + np.sum(g["n"] ** 2)))
    assert abs(twice - note["grad_norm"]) > 0.1
    # n's partial gradient summed over tp, the reduce-scatter, the norm, then the all-gather
    ops = [(e.op, e.group.name) for e in res.trace.events]  # two events of each: one per TP rank's group
    assert ops == [("all_reduce", "tp")] * 2 + [("reduce_scatter", "dp-cp")] * 2 + [("all_reduce", "world")] + [
        ("all_gather", "dp-cp")] * 2


def test_who_counts_a_piece():
    """On dp 2 x tp 2: a TP-sharded weight counts on every rank (the ZeRO shares and TP pieces differ), a
    whole copy on TP rank 0 only, on both DP replicas (their ZeRO shares differ)."""
    whole = {"d": {"dp": Replicate()}}  # declares no tp at all: whole on each TP rank all the same

    def program(ctx):
        return {k: clip.counts_here(ctx, p) for k, p in {**PLACED, **whole}.items()}, vars(ctx.coords)
    for counts, c in parasim.run(program, layout=Layout(tp=2, dp=2)).values:
        assert counts == {"w": True, "b": c["tp"] == 0, "n": c["tp"] == 0, "d": c["tp"] == 0}


def test_an_expert_bias_whole_over_etp_counts_on_etp_rank_0_of_each_ep_rank():
    """Sharded over ep (each EP rank its own experts) but whole over etp: each EP rank counts it once."""
    def program(ctx):
        return clip.counts_here(ctx, {"ep": Shard(0), "etp": Replicate()}), ctx.coords.etp
    for counts, etp in parasim.run(program, layout=Layout(tp=2, dp=2, ep=2, etp=2)).values:
        assert counts == (etp == 0)


def test_the_norm_is_one_labelled_world_all_reduce_noted_once_by_rank_0():
    res = _dense_run(0.5)
    (e,) = [e for e in res.trace.events if e.group.name == "world"]
    assert e.op == "all_reduce" and e.label == ("gradient clipping: add up the squares of the gradient pieces "
                                                "each rank alone holds (copies counted once)")
    (note,) = res.trace.notes("grad_norm")
    assert note[1] == 0 and note[3]["max_norm"] == 0.5 and "every gradient scaled by" in note[2]
    loose = _dense_run(float("inf"))  # measure, never clip: JSON has no infinity, so no max_norm is noted
    (note,) = loose.trace.notes("grad_norm")
    assert note[3]["max_norm"] is None and note[3]["clip_coef"] == 1.0 and "gradients unchanged" in note[2]
    edge = _dense_run(note[3]["grad_norm"] * 1.5)  # a coefficient between 1 and 2 means no clipping either
    assert "gradients unchanged" in edge.trace.notes("grad_norm")[0][2]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1"])
def test_a_bad_max_norm_is_refused(bad):
    with pytest.raises(UsageError, match="max_norm must be a positive number"):
        moe16.make_program(None, max_norm=bad)


def test_clipping_unsummed_partial_gradients_is_refused():
    """Without partials=True (the default), n's gradient is still partial over tp: a norm of its pieces is wrong,
    so the step refuses it in one line instead of clipping silently. A bad max_norm is named before that."""
    def program(ctx):
        with pytest.raises(UsageError, match="n is left partial over a model axis"):
            zero1_step(ctx, Dense(ctx), 0.1, max_norm=0.5)
        with pytest.raises(UsageError, match="max_norm must be a positive number"):
            zero1_step(ctx, Dense(ctx), 0.1, max_norm=0)
    parasim.run(program, layout=Layout(tp=2, dp=2))


def test_clip_shares_refuses_a_bad_max_norm_itself():
    def program(ctx):
        with pytest.raises(UsageError, match="max_norm must be a positive number"):
            clip.clip_shares(ctx, {}, {}, {}, 0)
    parasim.run(program, 1)


def test_one_table_names_the_model_axes_for_zero_clipping_and_checkpoints():
    """placement.WEIGHT_AXES, read by ZeRO-1's partial sums, the clipping rules and the checkpoint's cuts: tp and etp
    cut a weight (and carry SP's partial sums, over the layout's groups 'tp' and 'expert-tp'), ep spreads
    whole experts, dp, cp and edp are where copies see different data."""
    from parasim.dp import checkpoint, zero
    from parasim.layout import placement
    assert placement.CUT_AXES == ("tp", "etp") and set(placement.DATA_AXES) == {"dp", "cp", "edp"}
    assert {a: placement.axis_group(a) for a in placement.WEIGHT_AXES} == {
        "tp": "tp", "dp": "dp", "cp": "cp", "etp": "expert-tp", "ep": "ep", "edp": "expert-dp"}
    assert set(placement.model_axes({"ep": Shard(0)})) == {"etp", "ep"} and placement.model_axes({}) == ("tp",)
    assert checkpoint.CUT_AXES is zero.CUT_AXES is placement.CUT_AXES  # one list, not copies of it


def test_sum_partials_sums_every_model_axis_that_is_cut():
    """TP 1 and ETP 2: nothing to sum over tp (one rank), but the expert gradient left partial over etp is summed
    over its expert-TP pair; the dense one stays as it was. Each rank's part is rank + 1."""
    def program(ctx):
        grads = {"d": ctx.asarray([1.0 + ctx.rank]), "e": ctx.asarray([1.0 + ctx.rank, 10.0])}
        placed = {"d": {"tp": Partial()}, "e": {"etp": Partial()}}
        out = sum_partials(ctx, grads, placed)
        return {k: v.tolist() for k, v in out.items()}, ctx.groups["expert-tp"].ranks

    res = parasim.run(program, layout=Layout(tp=1, dp=4, ep=2, etp=2, model=None))
    for r in range(4):
        got, pair = res.values[r]
        assert len(pair) == 2 and r in pair
        assert got == {"d": [1.0 + r], "e": [sum(1.0 + q for q in pair), 20.0]}

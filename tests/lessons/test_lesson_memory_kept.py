"""The post's 34 sbh broken into its parts (issue 53, the walk's activations section): the memory lesson's table
of what one layer keeps, item by item, held against Korthikanti et al.'s count worked here by hand."""
import pytest

import parasim

# bytes a token per unit of h: (item, one GPU, split by TP alone, split by SP)
HAND = [("ln1: input", 2, False), ("attn.qkv: input", 2, False), ("attn: q", 2, True), ("attn: k", 2, True),
        ("attn: v", 2, True), ("attn.out: input", 2, True), ("attn dropout: mask", 1, False),
        ("ln2: input", 2, False), ("mlp.fc1: input", 2, False), ("mlp: activation input", 8, True),
        ("mlp.fc2: input", 8, True), ("mlp dropout: mask", 1, False)]


@pytest.mark.parametrize("t", [2, 4])
def test_the_34_item_by_item(t):
    lr = parasim.lesson("memory", tp=t)
    table = next(x for x in lr.tables if x.title.startswith("What one layer keeps for backward, item by item"))
    rows = dict(table.rows)
    for name, whole, tp_splits in HAND:
        assert rows[name] == [whole, whole / t if tp_splits else whole, whole / t], name
    assert rows["all of it"] == [34, 10 + 24 / t, 34 / t]
    note = " ".join(table.notes)
    assert "attention 11" in note and "norms' inputs 4" in note and "the MLP 19" in note


def test_full_recomputation_costs_one_more_forward():
    """longest-sequence's recompute run computes the TP + SP run's FLOPs plus one forward of the layer: the
    forward counted here by a run of its own (the same small layer on the same 4 ranks, forward alone)."""
    import importlib.util
    from pathlib import Path

    from parasim.lesson import lessons_dir
    from parasim.nn import ParallelContext, Saved
    from parasim.nn.layer import TransformerLayer, layer_weights
    from parasim.layout import ModelSpec

    spec = importlib.util.spec_from_file_location("ls", Path(lessons_dir()) / "longest_sequence.py")
    ls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ls)

    def forward(ctx):
        par = ParallelContext(ctx, ctx.new_group(range(ctx.world), "tp"), sp=True)
        shape = ModelSpec(hidden=ls.H, heads=ls.HEADS, dropout=0.1, flash=True)
        layer = TransformerLayer(par, shape, layer_weights(ctx, shape, "layer"), key="layer")
        layer.forward(par.shard(ctx.shared_rng("x").normal((ls.S, ls.B, ls.H)), 0), Saved())

    one = ls.phase_flops(parasim.run(forward, 4))
    lr = parasim.lesson("longest-sequence")
    f = ls.phase_flops(lr.result)
    assert f["TP + SP + full recompute"] - f["TP + SP"] == sum(one.values()) > 0
    (table,) = [t for t in lr.tables if t.title.startswith("What each run computed on GPU 0")]
    assert dict(table.rows)["TP + SP + full recompute"][1] == round(f["TP + SP + full recompute"] / f["TP + SP"], 3)


def test_a_run_that_counted_no_flops_has_no_compute_table(monkeypatch):
    """Real ranks time their work and do not meter it: longest-sequence then leaves the FLOPs table out (a
    `parasim run` of it once ended in a KeyError)."""
    import importlib.util
    from pathlib import Path

    from parasim.lesson import lessons_dir

    spec = importlib.util.spec_from_file_location("ls2", Path(lessons_dir()) / "longest_sequence.py")
    ls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ls)
    monkeypatch.setattr(ls, "phase_flops", lambda result, rank=0: {})
    assert ls.recompute_table(object()) == []


def test_full_recomputation_figures_of_the_27b_model():
    """The post's activation-recomputation figures for its 27B-class model (60 layers, h = 6144) on one 4,096-token
    sequence: s·b·h about 25.2M, 12·L·h² about 27.2B parameters, a layer keeping only its 16-bit input (2 sbh
    in place of 34), and one forward more on top of forward + backward: a third more compute. Worked here by
    hand from the config and held against the lesson's table of the estimator's figures."""
    from parasim.estimate import get_model

    model = get_model("27b")
    L, h, s, b = model.layers, model.hidden, 4096, 1
    assert (L, h) == (60, 6144)  # the post's config, which the lesson's model must be
    sbh = s * b * h
    params = 12 * L * h * h
    assert sbh == pytest.approx(25.2e6, abs=0.05e6) and params == pytest.approx(27.2e9, abs=0.05e9)

    lr = parasim.lesson("memory")
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    table = next(x for x in lr.tables if x.title.startswith("Full activation recomputation"))
    assert table.columns[1:] == ["no recomputation", "full recomputation"]
    rows = dict(table.rows)
    assert rows["kept a layer, in sbh"] == [34, 2]
    assert rows["kept a layer (GB)"] == [round(34 * sbh / 1e9, 4), round(2 * sbh / 1e9, 4)]
    assert rows[f"kept, all {L} layers (GB)"] == [round(L * 34 * sbh / 1e9, 2), round(L * 2 * sbh / 1e9, 2)]
    assert rows["working set of layers redone (GB)"] == [0, round(2 * 34 * sbh / 1e9, 2)]  # two layers at 34 sbh
    none, full = rows["FLOPs, forward + backward (TFLOP)"]
    assert full / none == pytest.approx((1 + 2 + 1) / (1 + 2), rel=1e-3)  # forward, backward (2x), forward again
    note = " ".join(table.notes)
    assert f"12 x L x h^2 = {params / 1e9:.2f} B" in note and f"s x b x h = {s} x {b} x {h} = {sbh:,}" in note
    assert f"{1 / 3:.1%} more compute" in note
    assert f"L = {L} layers, h = {h}, a = 48 heads" in note

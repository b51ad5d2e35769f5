"""One training step of any model on any layout (train/step.py): the layers each stage holds, and the same
step virtually and symbolically, event for event and byte for byte."""
import numpy as np
import pytest
from conftest import trace_key

import parasim
from parasim.errors import LayoutError, UsageError
from parasim.pipeline.stage import LayersStage
from parasim.train.whole import dot_loss, forward_backward, sequences, whole_layers
from parasim.train.step import (MicroBatches, Phases, StepOptions, layer_shape, make_step, stage_range,
                                   train_step)
from parasim.layout import SPREAD, Layout, ModelSpec, preset
from parasim.nn import Saved
from parasim.nn.layer import Stack

SMALL = ModelSpec(name="small", layers=5, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, dense_layers=1,
                  seq=8, bias=False, stages=SPREAD)


def test_stages_take_the_layers_as_evenly_as_they_can():
    assert [list(stage_range(SMALL, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    ds = preset("deepseek-v3").model
    sizes = [len(stage_range(ds, 16, s)) for s in range(16)]
    assert sizes == [4] * 13 + [3] * 3 and sum(sizes) == 61
    assert stage_range(ds, 16, 15) == range(58, 61)


def test_the_leading_layers_are_dense():
    ds = preset("deepseek-v3").model
    assert [layer_shape(ds, i).experts for i in (0, 2, 3, 60)] == [0, 0, 256, 256]
    assert layer_shape(ds, 0).top_k is None and layer_shape(SMALL, 1) is SMALL


@pytest.mark.parametrize("layout", [Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL),
                                    Layout(pp=2, dp=4, ep=4, model=SMALL)], ids=["tp-cp-pp-ep", "pp-ep"])
def test_the_step_is_the_same_virtually_and_symbolically(layout):
    program = make_step(layout, m=2)
    # at FP64 a symbolic run computes in the virtual run's float64: the same trace, byte for byte
    real = parasim.run(program, layout.world, precision="fp64")
    sym = parasim.run(program, layout.world, backend="symbolic", precision="fp64")
    assert trace_key(sym.trace) == trace_key(real.trace)
    assert {tuple(v["layers"]) for v in real.values} == {("L0", "L1", "L2"), ("L3", "L4")}
    ops = {e.op for e in real.trace.events}
    assert {"all_to_all", "p2p", "reduce_scatter", "all_gather"} <= ops


def test_bad_steps_get_one_line():
    with pytest.raises(LayoutError, match="needs at least 2 micro-batches"):
        make_step(Layout(pp=2, dp=4, ep=4, model=SMALL), m=1)
    with pytest.raises(UsageError, match="needs a layout with a model and its sequence length"):
        make_step(Layout(tp=2))


# -- the one step program: what its users pass in, and the examples' small-model pieces ----------------------
DENSE = ModelSpec(name="dense", layers=2, hidden=8, heads=2, ffn=16, seq=4, bias=False)


def _ones(ctx, rows):
    """Every micro-batch all ones; the loss sum(y), so backward starts from ones."""
    xp = ctx.xp
    return MicroBatches(inputs=lambda mb: xp.ones((len(rows), 1, DENSE.hidden)),
                        loss=lambda mb, y: (float(xp.sum(y)), xp.ones_like(y)))


def _run_step(opts, stage=None):
    layout = Layout(pp=2, dp=2, model=DENSE)

    def program(ctx):
        run = train_step(ctx, layout, opts, _ones, *([stage] if stage else []))
        return {"layers": [layer.key for layer in run.layers], "rows": run.rows, "state": run.state,
                "loaded": all(bool((run.stage.params()[k] == w).all()) for k, w in run.new.items())}
    return parasim.run(program, layout.world)


def test_the_step_program_tells_the_trace_the_phases_and_holdings_it_is_given():
    default = _run_step(StepOptions(micro_batches=2))
    phases = {m.text for m in default.trace.marks if m.kind == "phase"}
    assert phases == {"forward and backward", "gradient sync and optimizer"}
    held = {m.text for m in default.trace.marks if m.kind == "held" and m.rank == 0}
    assert {"step: weights", "step: gradients", "step: optimizer share (master, m, v)"} <= held
    assert {"L0: activations", "L0: activations (2)"} <= held  # both micro-batches' activations, each its own
    quiet = _run_step(StepOptions(micro_batches=2, held=False, phases=Phases(schedule=None, sync="sync", after="done")))
    assert [m.text for m in quiet.trace.marks if m.kind == "phase" and m.rank == 0] == ["sync", "done"]
    assert not [m for m in quiet.trace.marks if m.kind == "held"]
    # stage 1 holds L0, stage 2 L1; no SP or CP: every rank holds all 4 positions; the new weights are loaded
    assert [v["layers"] for v in quiet.values] == [["L0"], ["L0"], ["L1"], ["L1"]]
    assert all(v["rows"] == [0, 1, 2, 3] and v["loaded"] for v in quiet.values)


def test_a_zero_bubble_step_with_its_holdings_told_trains_as_1f1b_does():
    """Zero-bubble stages defer each layer's weight gradients to a queue on its ParallelContext, which they find
    through the layer they drive; with the GPU's holdings told, that layer is wrapped (HeldActivations), and the
    wrapper passes its layer's context through. The step's new weights are 1F1B's, to the bit (the same sums,
    run later), and each micro-batch's activations are held and freed."""
    layout = Layout(pp=2, dp=2, model=DENSE)

    def program(opts):
        def run(ctx):
            got = train_step(ctx, layout, opts, _ones)
            return {k: np.asarray(w).tolist() for k, w in got.new.items()}, got.loss
        return run

    base = parasim.run(program(StepOptions(micro_batches=4)), layout.world)
    zb = parasim.run(program(StepOptions(micro_batches=4, schedule="zb-h1")), layout.world)
    assert zb.values == base.values
    assert {e.op for e in zb.trace.events} == {e.op for e in base.trace.events}
    acts = [(m.text, m.data["bytes"]) for m in zb.trace.marks if m.kind == "held" and m.rank == 0 and "L0: act" in m.text]
    sizes = {n for _, n in acts}
    assert len(acts) == 8 and len(sizes) == 2 and 0 in sizes and max(sizes) > 0
    for name in {t for t, _ in acts}:  # each micro-batch's activations held, then freed
        assert [n > 0 for t, n in acts if t == name] == [True, False], name


@pytest.mark.parametrize("schedule", ["interleaved", "interleaved-zb", "zbv", "dualpipev"])
def test_a_schedule_of_several_chunks_a_rank_is_refused_in_one_line(schedule):
    with pytest.raises(UsageError, match=f"one stage of layers on each rank; schedule {schedule} runs .* chunks a "
                                         "rank: use one of gpipe, 1f1b, zb-h1$"):
        StepOptions(micro_batches=4, schedule=schedule)
    with pytest.raises(UsageError, match="unknown schedule"):
        StepOptions(micro_batches=4, schedule="zb")


def test_the_step_program_drives_the_stage_its_user_builds():
    seen = []

    class Counting(LayersStage):
        def forward(self, x):
            seen.append(("F", self.first))
            return super().forward(x)

    def stage(ctx, layers, first, rows):
        s = Counting(layers)
        s.first = first
        return s
    _run_step(StepOptions(micro_batches=3, held=False), stage)
    assert sorted(seen) == [("F", 0)] * 6 + [("F", 1)] * 6  # 3 micro-batches on each of 2 ranks per stage


def test_the_examples_loss_and_small_model_by_hand():
    y, t = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    assert dot_loss(np, y, t) == (11.0, t)
    value, grad = dot_loss(np, y, t, 2)
    assert value == 5.5 and grad.tolist() == [1.5, 2.0]

    def program(ctx):
        named = whole_layers(ctx, DENSE, 1, 2, "layer {n}")
        plain = whole_layers(ctx, DENSE, 0, 1)
        stack = Stack(whole_layers(ctx, DENSE, 0, 2))
        x = sequences(ctx, "x", [0, 1], DENSE.seq, DENSE.hidden)
        loss = forward_backward(ctx, stack, [(x[:, :1], x[:, :1]), (x[:, 1:], x[:, 1:])], n=2)
        y, _ = Stack(whole_layers(ctx, DENSE, 0, 2)).forward(x, Saved())
        return ([(layer.key, layer.name) for layer in named + plain], x.shape, loss,
                float(np.sum(y * x)) / 2, ctx.shared_rng("x1").normal((DENSE.seq, 1, DENSE.hidden)), x)
    names, shape, loss, want, second, x = parasim.run(program, 1).values[0]
    assert names == [("L1", "layer 2"), ("L2", "layer 3"), ("L0", "layer")]
    assert shape == (4, 2, 8) and np.array_equal(x[:, 1:], second)  # sequence 1 is its own stream, side by side
    assert loss == pytest.approx(want, rel=1e-12)  # two batches' halves add up to the whole batch's loss


def test_partial_gradients_are_summed_over_both_cut_axes_groups():
    """Under SP the norms and router are partial over tp, and with ETP 2 an expert's output bias b2 over etp
    (placement.WEIGHT_AXES: both cut weights): ZeRO-1's step sums each once, over the layout's 'tp' and 'expert-tp'."""
    model = ModelSpec(name="biased", layers=1, hidden=8, heads=2, ffn=16, experts=2, top_k=1, seq=8)
    layout = Layout(tp=2, dp=2, ep=2, etp=2, sp=True, model=model)
    trace = parasim.run(make_step(layout, m=1), layout.world).trace
    sums = {(e.group.name, e.label) for e in trace.events if e.op == "all_reduce"}
    assert sums == {("tp", "sum the gradients partial over tp (SP-split weights), once per step"),
                    ("expert-tp", "sum the gradients partial over etp (SP-split weights), once per step")}

"""The pipeline lessons' shared program, piece by piece: the optimizer step and gradient fingerprint by
hand (the lessons compare a split run with an unsplit one through these same functions, so a slip in
them would cancel out there), and what pipeline_run records."""
from types import SimpleNamespace

import numpy as np
import pytest

import parasim
from parasim.examples.pipeline import _grad_sq, pipeline_run, sgd_step


class _Layer:
    def __init__(self):
        self.weights = {"a": np.array([1.0, 2.0]), "b": np.array([[3.0]])}
        self.grads = {"a": np.array([10.0, -20.0]), "b": np.array([[5.0]])}

    def params(self):
        return self.weights

    def load(self, new):
        self.weights = new


def test_sgd_step_and_grad_fingerprint_by_hand():
    ctx, layer = SimpleNamespace(xp=np), _Layer()
    assert _grad_sq(ctx, layer) == 100 + 400 + 25
    # w - lr * g with lr = 0.01: a -> [0.9, 2.2], b -> [[2.95]]; the fingerprint is their sum of squares
    assert sgd_step(ctx, layer) == pytest.approx(0.81 + 4.84 + 2.95 ** 2)
    assert layer.weights["a"].tolist() == pytest.approx([0.9, 2.2]) and layer.weights["b"][0, 0] == pytest.approx(2.95)
    assert sgd_step(ctx, _Layer(), lr=1.0) == pytest.approx(81 + 484 + 4)


def test_pipeline_run_records_slots_phases_and_its_group():
    res = parasim.run(lambda ctx: pipeline_run(ctx, "gpipe", 2), 2)
    assert [v["slots"] for v in res.values] == [["F1", "F2", None, None, "B2", "B1"],
                                                [None, "F1", "F2", "B2", "B1", None]]
    assert {e.group.name for e in res.trace.events} == {"pp"} and len(res.trace.events) == 4  # 2 acts + 2 grads
    assert [(m.rank, m.text) for m in res.trace.marks if m.kind == "phase"] == [
        (0, "the schedule"), (0, "running it"), (1, "the schedule"), (1, "running it")]
    assert [v["has_loss"] for v in res.values] == [False, True]


def test_pipeline_run_passes_chunks_and_costs_on():
    three = parasim.run(lambda ctx: pipeline_run(ctx, "interleaved", 4, 3), 2).values[0]["slots"]
    assert "F1:3" in three and len(three) == 26  # a third chunk per rank, named chunk 3
    slow_b = parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", 2, costs={"B": 2}), 2).values[0]
    assert slow_b["slots"] == ["F1", "F2", None, None, "B1", "B1", None, "B2", "B2"] and slow_b["makespan"] == 9


def test_pipeline_run_times_its_transfers_with_the_costs_given():
    """1F1B, 2 stages, 2 micro-batches, a forward costing 2 and a backward 4. Rank 0: F1 [0, 2), F2 [2, 4);
    rank 1: F1 [2, 4), B1 [4, 8), F2 [8, 10), B2 [10, 14); rank 0 then B1 [8, 12), B2 [14, 18). Each result
    leaves when its pass ends: activations at 2 and 4, gradients at 8 and 14 (unit costs would give other
    slots). What is received is float64, like the data."""
    costs = {"F": 2, "B": 4, "I": 2, "W": 2}
    res = parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", 2, costs=costs), 2)
    assert res.values[0]["slots"] == ["F1", "F1", "F2", "F2", None, None, None, None, "B1", "B1", "B1", "B1",
                                      None, None, "B2", "B2", "B2", "B2"]
    labels = sorted({e.label for e in res.trace.events})  # an event carries its sender's words
    assert labels == ["slot 14: send gradient 2 (stage 2 -> 1)", "slot 2: send activation 1 (stage 1 -> 2)",
                      "slot 4: send activation 2 (stage 1 -> 2)", "slot 8: send gradient 1 (stage 2 -> 1)"]
    assert {t.dtype for e in res.trace.events for m in e.members for t in m.outs} == {"float64"}


def test_each_stage_layer_is_its_own():
    """Stage i's layer is named L{i} and drawn from its own seed: two stages never share weights, which
    the split-against-unsplit comparisons could not notice (both sides build layers the same way)."""
    from parasim.examples.pipeline import _layers
    (layers,) = parasim.run(lambda ctx: _layers(ctx, 1, 2), 1).values
    assert [layer.name for layer in layers] == ["L1", "L2"]
    a, b = (layer.params() for layer in layers)
    assert a.keys() == b.keys() and not any(np.array_equal(a[k], b[k]) for k in a if "ln" not in k)


def test_a_rank_that_sends_and_receives_in_one_slot_names_each_transfer_alone():
    """GPipe on 3 ranks: at slot 2 rank 1 passes activation 1 on to rank 2 while taking activation 2 from
    rank 0. Each of the two transfers is an event of its own, and each says only what it carries: the
    rank 1 -> rank 2 event once read 'receive activation 2 (stage 1 -> 2), send activation 1 (stage 2 -> 3)'."""
    res = parasim.run(lambda ctx: pipeline_run(ctx, "gpipe", 2), 3)
    slot2 = {(e.params["src"], e.params["dst"]): e.label for e in res.trace.events if e.tags == {"slot": 2}}
    assert slot2 == {(0, 1): "slot 2: send activation 2 (stage 1 -> 2)",
                     (1, 2): "slot 2: send activation 1 (stage 2 -> 3)"}
    for e in res.trace.events:  # one transfer, one name: the stages it names are the ranks it joins
        src, dst = e.params["src"], e.params["dst"]
        assert e.label.count("->") == 1 and e.label.endswith(f"(stage {src + 1} -> {dst + 1})"), e.label


def test_the_w_queue_defers_weight_work_only_while_deferring_and_gives_each_context_its_sink_back():
    """Outside `deferring` a layer's weight work runs at once; inside it the work is queued (the W action
    runs it later) and the context hands it to the queue; after it, each context has the sink it had (a
    context named twice, as layers share one, included)."""
    from parasim.nn import ParallelContext
    from parasim.pipeline.executor import WeightGradQueue
    ran, queue, earlier = [], WeightGradQueue(), SimpleNamespace(run_or_queue=lambda work: ran.append("earlier"))
    tp, other = ParallelContext(None), ParallelContext(None, weight_grads=earlier)
    tp.weight_grad(lambda: ran.append("now"))
    with queue.deferring([tp, other, tp]) as work:
        tp.weight_grad(lambda: ran.append("tp later"))
        other.weight_grad(lambda: ran.append("other later"))
        assert ran == ["now"] and len(work) == 2
    assert tp.weight_grads is None and other.weight_grads is earlier
    for job in work:
        job()
    queue.run_or_queue(lambda: ran.append("after"))
    other.weight_grad(lambda: ran.append("not this"))
    assert ran == ["now", "tp later", "other later", "after", "earlier"]


def three_stage_1f1b(ctx):
    return pipeline_run(ctx, "1f1b", 3)


@pytest.mark.slow
def test_real_ranks_name_each_transfer_as_the_virtual_run_does():
    """A real run's trace replays each batch of transfers under one label; the pipeline puts a rank's send
    first in its batch, so the merged trace names every transfer as the virtual one does (3 stages: the
    middle rank sends and receives in the same slots)."""
    real = parasim.run(three_stage_1f1b, 3, backend="gloo", timeout=60).trace
    virtual = parasim.run(three_stage_1f1b, 3).trace
    names = lambda t: [(e.params["src"], e.params["dst"], e.label) for e in t.events]  # noqa: E731
    assert names(real) == names(virtual)
    assert "slot 2: send activation 1 (stage 2 -> 3)" in [label for *_, label in names(real)]

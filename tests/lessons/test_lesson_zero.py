"""What ranks hold, counted by the engine: `ctx.hold`/`ctx.free` marks, `Trace.held` at an event and
`Trace.peak`, on virtual and real ranks; the `zero` lesson's figures against the post's (16, 5.5, 3.75 and 2
bytes per parameter at dp = 8; ZeRO-3 sends 1.5x DP) and every stage's step against one device's."""
import json

import numpy as np
import pytest

import parasim
from parasim.engine.compare import Allowance, values_close
from parasim.errors import UsageError
from parasim.lesson import get_lesson, run_lesson
from parasim.comm.trace import Trace
from tests.conftest import cli_process


def _holder(ctx):
    g = ctx.new_group(range(ctx.world), "dp")
    ctx.phase("one")
    ctx.hold("w", 100, "weights")
    ctx.comm.barrier(group=g)                      # step 1: 100 held
    ctx.hold("buffer", 40, "gathered")            # held before the collective that fills it
    ctx.comm.all_reduce(ctx.asarray([1.0]), group=g)  # step 2: 140 held
    ctx.free("buffer")
    ctx.hold("w", 30 + 10 * ctx.rank, "weights")  # holding a name again replaces its size
    ctx.hold("moment", 500, "activations")
    ctx.free("moment")                            # a moment's peak, between two events
    ctx.phase("two")
    ctx.comm.barrier(group=g)                      # step 3


def test_held_at_each_event_and_the_peak_between_events():
    res = parasim.run(_holder, 2)
    t = res.trace
    steps = [e.step for e in t.events]
    assert steps == [1, 2, 3]
    assert t.held(0, 1)["weights"] == 100 and sum(t.held(0, 1).values()) == 100
    assert t.held(1, 2) == {"weights": 100, "gradients": 0, "optimizer": 0, "activations": 0, "gathered": 40}
    assert t.held(1, 3)["weights"] == 40 and sum(t.held(1, 3).values()) == 40
    assert t.held(0) == {"weights": 30, "gradients": 0, "optimizer": 0, "activations": 0, "gathered": 0}
    peak = t.peak(1)
    assert (peak["bytes"], peak["name"], peak["phase"], peak["step"]) == (540, "moment", "one", 2)
    assert t.peak(1, phase="two")["bytes"] == 40  # nothing new held in phase two: what it held coming in
    assert t.peak(1, phase="two")["name"] is None
    assert [n for n in t.notes()] == []  # held marks are not notes


def test_held_marks_survive_json_and_bad_ones_are_refused():
    t = parasim.run(_holder, 2).trace
    again = Trace.from_dict(json.loads(t.to_json()))
    assert again.peak(1) == t.peak(1)
    d = json.loads(t.to_json())
    held = next(m for m in d["marks"] if m["kind"] == "held")
    held["data"]["kind"] = "snacks"
    with pytest.raises(UsageError, match=r"marks\[\d+\]\.data\.kind"):
        Trace.from_dict(d)
    with pytest.raises(UsageError, match="held bytes"):
        parasim.run(lambda ctx: ctx.hold("x", 1, "snacks"), 1)
    with pytest.raises(UsageError, match="negative"):
        parasim.run(lambda ctx: ctx.hold("x", -1, "weights"), 1)


def test_chrome_trace_draws_held_bytes_as_a_counter():
    from parasim.render.chrome import to_chrome
    t = parasim.run(_holder, 2).trace
    counters = [e for e in to_chrome(t)["traceEvents"] if e.get("ph") == "C" and e["pid"] == 1]
    assert max(sum(e["args"].values()) for e in counters) == 540
    assert sum(counters[-1]["args"].values()) == 40


@pytest.fixture(scope="module")
def zero():
    return run_lesson(get_lesson("zero"))


def _got(lr, name):
    return next(c.got for c in lr.checks if c.name == name)


def test_zero_lesson_measures_the_posts_table(zero):
    assert zero.ok, [c for c in zero.checks if not c.ok]
    assert zero.result.world == 8
    for name, want in (("DP", 16), ("ZeRO-1", 5.5), ("ZeRO-2", 3.75), ("ZeRO-3", 2)):
        assert _got(zero, f"{name}: bytes per parameter held at rest, measured") == want
    sent = {p: sum(m.sent for e in zero.result.trace.events if e.phase == p for m in e.members)
            for p in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")}
    assert sent["ZeRO-1"] == sent["ZeRO-2"] == sent["DP"] and sent["ZeRO-3"] == 1.5 * sent["DP"]
    # DP's all-reduce in float64 by hand: 1,088 values, each rank sends 2 (n - 1) / n of them
    assert sent["DP"] == 8 * 2 * 7 / 8 * 1088 * 8


def test_zero2_holds_a_whole_bucket_only_while_it_is_reduced(zero):
    t = zero.result.trace
    rs = [e for e in t.events if e.phase == "ZeRO-2" and e.op == "reduce_scatter"]
    assert [e.members[0].ins[0].shape for e in rs] == [(400,), (400,), (288,)]
    during = [t.held(0, e.step)["gradients"] for e in rs]
    share = 2 * 1088 // 8
    assert during == [share + 2 * 400, share + 2 * 400, share + 2 * 288]
    after = [e for e in t.events if e.phase == "ZeRO-2" and e.op == "all_gather"][0]
    assert t.held(0, after.step)["gradients"] == share


def test_zero3_peak_is_a_gathered_layer_beside_its_gradient_and_the_activations(zero):
    peak = zero.result.trace.peak(0, phase="ZeRO-3")
    assert peak["name"] == "ZeRO-3 over dp: L1: whole gradient"
    assert peak["by_kind"]["gathered"] == 2 * 544 and peak["by_kind"]["gradients"] == 2 * 544 + 2 * 1088 // 8
    assert peak["bytes"] == 2 * 1088 + 2 * 544 + 2 * 544 + 2 * 832  # at rest, gathered, gradient, 2 layers' activations


def test_a_phase_peak_is_what_that_phase_holds(zero):
    """Each technique frees the one before it as it starts: a free is never a phase's peak, and ZeRO-1's
    peak is its own state (5.5 B per parameter) plus the activations of both layers (832 B each)."""
    t = zero.result.trace
    for name in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        assert t.peak(0, phase=name)["name"].split(":")[0] in (name, "L0", "L1", f"{name} over dp"), name
    assert t.peak(0, phase="ZeRO-1")["bytes"] == 5.5 * 1088 + 2 * 832
    assert zero.to_dict()["held"]["at_end"][0]["weights"] == 2 * 1088 // 8


def test_a_wrong_stage_fails_the_lessons_checks(monkeypatch):
    """If ZeRO-2 kept whole gradients like ZeRO-1 the measured table would be wrong, and a check says so."""
    import parasim.dp.sharded as sharded
    real_init = sharded.ShardedAdam.__init__

    def keeps_everything(self, ctx, group, params, stage, **kw):
        real_init(self, ctx, group, params, stage, **kw)
        if stage == 2:
            self.holdings.hold("gradients", self.total * ctx.precision.grad_bytes, "gradients")
    monkeypatch.setattr(sharded.ShardedAdam, "__init__", keeps_everything)
    lr = run_lesson(get_lesson("zero"))
    bad = [c.name for c in lr.checks if not c.ok]
    assert "ZeRO-2: bytes per parameter held at rest, measured" in bad


def test_sums_in_another_order_are_judged_against_the_arrays_scale():
    one = Allowance(1, "their array's largest value")  # a rounding of 1.5 in float64: 2 * 2^-53 * 1.5 = 3.3e-16
    ok, close = values_close(np.array([1.5, 1e-17]), np.array([1.5, 0.0]), "float64", one)
    assert ok and close.gap == 1e-17
    assert values_close(np.array([1.5, 1e-9]), np.array([1.5, 0.0]), "float64", one)[0] is False
    assert values_close(np.array([1.5 + 1e-9, 0.5]), np.array([1.5, 0.5]), "float64", one)[0] is False
    big, off = np.array([1000.0, 10.0], dtype=np.float32), np.array([1000.0, 10.1], dtype=np.float32)
    assert values_close(off, big, "float32", one)[0] is False  # 1% beside a large value is not rounding


@pytest.mark.slow
def test_zero_on_eight_gloo_ranks_matches_the_virtual_run():
    out = cli_process("run", "zero", "--backend", "gloo", "--nproc", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["match"] is True and data["differences"] == [] and data["world"] == 8
    assert all(c["ok"] for c in data["checks"])
    got = {c["name"]: c["got"] for c in data["checks"]}
    assert got["ZeRO-3: bytes per parameter held at rest, measured"] == 2


def test_activations_of_micro_batches_in_flight_are_held_side_by_side():
    """Two forwards before either backward (two micro-batches in flight, as 1F1B keeps them): both sets of
    activations are held at once, each freed by its own backward; a layer without a key is named 'layer'."""
    from parasim.dp.held import HeldActivations
    from parasim.layout import ModelSpec
    from parasim.nn import ParallelContext, Saved
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=8, heads=2, ffn=16)

    def program(ctx):
        layer = TransformerLayer(ParallelContext(ctx), shape, layer_weights(ctx, shape, "L0"))
        del layer.key
        held = HeldActivations(ctx, layer)
        assert held.placements == layer.placements and held.grads == layer.grads == {}
        before = {k: w.copy() for k, w in layer.params().items()}
        held.load({k: w + 1 for k, w in held.params().items()})  # reaches the layer it wraps
        assert all(np.array_equal(layer.params()[k], before[k] + 1) for k in before)
        held.load(before)
        caches = [held.forward(ctx.shared_rng(f"x{i}").normal((4, 1, 8)), Saved())[1] for i in range(2)]
        ctx.comm.barrier()
        held.backward(caches[0], ctx.shared_rng("d").normal((4, 1, 8)))
        ctx.comm.barrier()
        held.holdings.release()
    t = parasim.run(program, 1).trace
    first, second = (e.step for e in t.events)
    assert t.held(0, first)["activations"] == 2 * 832  # the layer keeps 832 B per sequence of 4 tokens
    assert t.held(0, second)["activations"] == 832
    assert t.held(0) == {k: 0 for k in t.held(0)}
    names = [m.text for m in t.marks if m.kind == "held"]
    assert names == ["layer: activations", "layer: activations (2)", "layer: activations", "layer: activations (2)"]


def test_memory_lesson_gathers_zero3_weights_before_reducing_gradients():
    """ZeRO-3 gathers a layer's weights for forward and again for backward, and only then reduce-scatters
    the gradients backward made (the memory lesson had the reduce-scatter first); ZeRO-1 reduce-scatters,
    steps, and gathers the updated weights."""
    from parasim.lesson import get_lesson, run_lesson
    trace = run_lesson(get_lesson("memory")).result.trace
    zero = [(e.op, e.label) for e in trace.events if e.phase == "model state under ZeRO" and 0 in e.ranks]
    assert [op for op, _ in zero] == ["reduce_scatter", "all_gather", "all_gather", "all_gather", "reduce_scatter"]
    assert "for forward" in zero[2][1] and "again for backward" in zero[3][1] and "updated" in zero[1][1]


def test_zero_says_its_wire_is_float64_with_the_run_s_own_bytes():
    from parasim.lesson import get_lesson, run_lesson
    lr = run_lesson(get_lesson("zero"))
    trace = lr.result.trace
    first = next(e for e in trace.events if e.phase == "DP" and e.op == "all_reduce")
    sent = first.member(0).sent
    assert first.members[0].ins[0].dtype == "float64"
    t, n = trace.world, 400  # a ring all-reduce sends 2(t-1)/t of its buffer; 8 bytes a float64
    assert sent == 2 * (t - 1) * n * 8 // t
    notes = [text for phase, r, text, _ in trace.notes() if phase == "DP"]
    assert any("float64" in text and f"{sent:,} B per rank" in text for text in notes)
    names = [c.name for c in lr.checks]
    assert all("largest difference" in n for n in names if "= one device's" in n and ("gradient" in n or "Adam" in n))
    assert not any("peak falls" in n for n in names)


def test_compare_lines_up_what_each_stage_holds_and_sends_at_another_dp():
    """`parasim compare zero --dp 2,8` sets each stage's bytes side by side: at DP 2, ZeRO-3 splits all 16 bytes
    a parameter costs two ways, and DP's all-reduce sends 2(n-1)/n of the 1,088 float64 gradients."""
    from parasim.figures import run_figures
    fig = run_figures(run_lesson(get_lesson("zero"), knobs={"dp": 2}))
    assert fig["DP: bytes a rank holds at rest"] == 16 * 1088
    assert fig["ZeRO-3: bytes a rank holds at rest"] == 16 * 1088 // 2
    assert fig["ZeRO-1: bytes a rank holds at rest"] == (2 + 2 + 12 / 2) * 1088
    assert fig["DP: bytes a rank sends"] == 2 * (2 - 1) / 2 * 1088 * 8


def test_the_table_of_holds_and_sends_by_technique():
    """By hand, for 1,088 weights on 8 ranks: 2 + 2 + 12 bytes a parameter, each split 8 ways from its stage
    on (16, 5.5, 3.75, 2); ZeRO-1 and 2 send what DP sends, ZeRO-3 1.5 times it."""
    lr = run_lesson(get_lesson("zero"))
    (table,) = lr.tables
    rows = dict(table.rows)
    col = table.columns.index
    per = [rows[t][col("bytes a parameter") - 1] for t in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    assert per == [16, 5.5, 3.75, 2]
    assert [rows[t][col("sent / DP's") - 1] for t in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")] == [1, 1, 1, 1.5]
    assert rows["ZeRO-1"][col("Adam (B)") - 1] == 1088 * 12 // 8 and rows["DP"][col("weights (B)") - 1] == 1088 * 2


@pytest.mark.parametrize("dp", [8, 2])
def test_the_table_sets_the_27b_model_s_gb_per_gpu_beside_the_small_model(dp):
    """The post's per-GPU column for its 27B model: 16, 4 + 12/d, 2 + 14/d and 16/d bytes a parameter times 27e9,
    worked out here (432 / 148.5 / 101.25 / 54 GB at d = 8, the post's 432 / 148.5 / 101 / 54), in the zero
    lesson's own table beside what its small model measured; the post's figures are quoted in a note."""
    lr = run_lesson(get_lesson("zero"), knobs={"dp": dp})
    (table,) = lr.tables
    col = table.columns.index(f"27B model over {dp} (GB)") - 1
    want = [16 * 27, (4 + 12 / dp) * 27, (2 + 14 / dp) * 27, 16 / dp * 27]
    assert [dict(table.rows)[t][col] for t in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")] == pytest.approx(want)
    if dp == 8:
        assert want == [432, 148.5, 101.25, 54]
    note = " ".join(" ".join(table.notes).split())
    assert "post, over 8: 432 / 148.5 / 101 / 54 GB" in note
    assert f"here, over {dp}: {' / '.join(f'{x:g}' for x in want)} GB" in note

"""train/against.py's small pieces, fast: the progress line's words, the bytes sent per axis read off a trace,
and one symbolic step of a small plan run as the step and the engine run it."""
import dataclasses

import parasim
from parasim.engine.runner import run as run_program
from parasim.engine.symbolic.fold import fold_of
from parasim.estimate import Plan
from parasim.layout import Layout, ModelSpec
from parasim.train.against import run_plan, running_note, sent_by_axis, step_layout
from parasim.train.step import make_step

SMALL = ModelSpec("small", layers=2, hidden=16, heads=2, ffn=32, vocab=32)
SMALL_MOE = ModelSpec("small-moe", layers=2, hidden=16, heads=2, ffn=32, vocab=32, experts=4, top_k=1, expert_ffn=16)


def test_the_progress_line_says_the_ranks_and_the_length():
    plan = Plan(tp=2, dp=512, zero=1)
    assert running_note(plan, 4096) == "running one training step on 1,024 symbolic ranks (folded) at 4,096 tokens ..."
    assert running_note(plan, None) == ("running one training step on 1,024 symbolic ranks (folded) at the "
                                        "estimator's longest sequence and one step longer ...")


def test_bytes_sent_are_summed_per_axis_and_collective_and_scaled_by_the_wire():
    """Two all-reduces over a group named dp-cp (the estimator's "dp"), one over tp, a barrier (sends nothing):
    each rank's bytes per (axis, op), times `wire` (0.25 here: float64 counted, a 2-byte dtype meant)."""
    def prog(ctx):
        dpcp, tp = ctx.new_group([0, 1], "dp-cp"), ctx.new_group([0, 1], "tp")
        for _ in range(2):
            ctx.comm.all_reduce(ctx.asarray([1.0, 2.0, 3.0, 4.0]), group=dpcp)
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), group=tp)
        ctx.comm.barrier(group=tp)

    trace = parasim.run(prog, 2).trace
    dp_call, tp_call = trace.events[0].members[0].sent, trace.events[2].members[0].sent  # rank 0's, one call each
    assert dp_call == 32 and tp_call == 16  # 4 and 2 float64 values, all-reduced over 2: 2 x (1/2) x the buffer
    assert sent_by_axis(trace, wire=0.25)[0] == {("dp", "all_reduce"): 2 * 32 * 0.25, ("tp", "all_reduce"): 16 * 0.25,
                                                 ("tp", "barrier"): 0.0}
    assert sent_by_axis(trace)[1][("dp", "all_reduce")] == 2 * trace.events[0].members[1].sent
    trace.events.insert(0, dataclasses.replace(trace.events[2], kind="compute"))  # a real run's timed work: no bytes
    assert sent_by_axis(trace)[0][("tp", "all_reduce")] == 16


def test_a_group_the_estimator_has_no_axis_for_keeps_its_own_name():
    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), group=ctx.new_group([0, 1], "mine"))

    assert sent_by_axis(parasim.run(prog, 2).trace)[0] == {("mine", "all_reduce"): 16}


def test_a_plans_step_runs_folded_around_the_gpu_asked_for():
    plan = Plan(tp=2, dp=2, zero=1, microbatches=2).check(SMALL, 8)
    layout = step_layout(SMALL, plan, 8)
    assert isinstance(layout, Layout) and (layout.tp, layout.dp, layout.world) == (2, 2, 4)
    assert layout.model.seq == 8
    for gpu in (0, 3):
        got = run_plan(SMALL, plan, 8, gpu)
        want = run_program(make_step(layout, m=2, routing="balanced", recompute=plan.recompute), 4,
                           backend="symbolic", fold=fold_of(layout, around=gpu), precision=plan.precision).trace
        assert got.to_json() == want.to_json()


def test_an_moe_plans_step_runs_its_recomputation_and_precision():
    """An MoE plan (EP 2 under TP 2 with SP) with full recomputation in BF16: the step run_plan runs is the one
    make_step and the engine give for those choices (balanced routing, the only one a folded step takes), and
    the choices show in the trace: BF16 tensors, and each layer's forward run again in backward."""
    plan = Plan(tp=2, sp=True, ep=2, dp=2, zero=1, microbatches=2, recompute="full",
                precision="megatron-bf16").check(SMALL_MOE, 8)
    layout = step_layout(SMALL_MOE, plan, 8)
    got = run_plan(SMALL_MOE, plan, 8, 0)
    want = run_program(make_step(layout, m=2, routing="balanced", recompute="full"), 4, backend="symbolic",
                       fold=fold_of(layout, around=0), precision="megatron-bf16").trace
    assert got.to_json() == want.to_json()
    plain = run_program(make_step(layout, m=2), 4, backend="symbolic", fold=fold_of(layout, around=0)).trace
    assert len(got.events) > len(plain.events)  # the recomputed forwards' collectives
    assert "bfloat16" in {t.dtype for e in got.events for m in e.members for t in m.ins}


def test_the_symbolic_step_names_each_choice_it_cannot_run():
    import pytest

    from parasim.errors import UsageError
    from parasim.estimate.memory import Plan
    from parasim.layout import preset
    from parasim.train.against import check_runs

    dense, moe = preset("27b-tp8").model, preset("deepseek-v3").model
    for model, plan, words in (
        (dense, Plan(tp=8, zero=0), "ZeRO-0 (the step shards the optimizer state: ZeRO-1)"),
        (dense, Plan(tp=8, recompute="selective"), "selective recomputation (the step has none or full)"),
        (dense, Plan(tp=8, micro_batch=2), "micro-batches of several sequences (the step's hold one)"),
        (moe, Plan(tp=2, ep=8, etp=2, pp=16, world=2048), "expert TP on symbolic ranks"),
    ):
        with pytest.raises(UsageError) as info:
            check_runs(model, plan)
        assert str(info.value) == f"the symbolic step cannot run {words}"
    check_runs(dense, Plan(tp=8, etp=2))  # a dense model has no experts to split: its ETP refuses nothing


def test_the_steps_layout_checks_the_sequence_and_keeps_the_plans_dropout():
    import pytest

    from parasim.errors import UsageError
    from parasim.estimate.memory import Plan
    from parasim.layout import preset
    from parasim.train.against import step_layout

    model = preset("27b-tp8").model
    with pytest.raises(UsageError, match=r"multiple of 32 \(2 x cp x tp\)"):  # 2 x CP 2 x TP 8
        step_layout(model, Plan(tp=8, cp=2, sp=True), 4080)
    got = step_layout(model, Plan(tp=8, cp=2, sp=True), 4096)
    assert (got.tp, got.cp, got.sp, got.model.seq, got.model.dropout) == (8, 2, True, 4096, 0.0)  # none under CP
    assert step_layout(model, Plan(tp=8), 4096).model.dropout == 0.1  # Megatron's default
    assert step_layout(model, Plan(tp=8, dropout=False), 4096).model.dropout == 0.0

"""One registry of overlap switches (clock/overlaps.py): each says where parasim models it, a run's trace or a
plan's step, and a switch asked for where it is not modelled is refused with the reason, by every command
alike; `all` means every switch modelled there."""
from __future__ import annotations

import pytest

from parasim.clock.overlaps import OVERLAPS, PLAN, TRACE, names, parse
from parasim.errors import UsageError
from tests.conftest import cli


def test_each_switch_is_modelled_where_it_says():
    assert names(TRACE) == ("grad-reduce", "prefetch", "dualpipe")
    assert names(PLAN) == ("grad-reduce", "prefetch", "dualpipe", "tp", "p2p", "cp")
    for o in OVERLAPS.values():  # where a switch is not modelled, its entry says why
        assert (TRACE in o.applies) == (o.picks is not None) and (TRACE in o.applies or o.not_on_trace)
        assert PLAN in o.applies or o.not_in_plan


@pytest.mark.parametrize("text, where, got", [("all", TRACE, ("grad-reduce", "prefetch", "dualpipe")),
                                              ("none", PLAN, ()), ("tp, grad-reduce", PLAN, ("tp", "grad-reduce"))])
def test_a_list_all_and_none(text, where, got):
    assert parse(text, where) == got


@pytest.mark.parametrize("argv, words", [
    (["lesson", "tp-mlp", "--plain", "--overlap", "tp"],
     "--overlap tp: not modelled here: a run's layer waits for each TP collective"),
    (["lesson", "pp-1f1b", "--plain", "--overlap", "p2p"],
     "--overlap p2p: not modelled here: a run's schedule sends each stage's activations"),
    (["memory", "--model", "27b", "--overlap", "bogus"], "--overlap: 'bogus' is not one of"),
])
def test_a_switch_where_it_is_not_modelled_is_refused_with_the_reason(argv, words):
    r = cli(*argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_a_library_caller_gets_the_same_refusal():
    from parasim.clock.costs import machine
    from parasim.clock.timeline import simulate
    import parasim
    trace = parasim.run(lambda ctx: ctx.comm.barrier(), 2).trace
    with pytest.raises(ValueError, match="'tp' here"):
        simulate(trace, machine("h200"), ("tp",))
    with pytest.raises(UsageError):
        parse("p2p", TRACE)


def test_dualpipe_in_a_plan_hides_the_ep_all_to_alls_and_the_sends_behind_compute():
    """DeepSeek-V3 on 2,048 H800s (PP 16, EP 64): paired, a micro-batch's all-to-alls run beside the other chunk's
    compute, so what stays of them is the slowdown they cause (overlap_cost) and whatever outlasts the compute;
    the pipeline's sends likewise."""
    from parasim.clock.costs import machine
    from parasim.clock.plan import overlap_cost, step_time
    from parasim.estimate.memory import Plan
    from parasim.layout import preset
    ds = preset("deepseek-v3").model
    plan = Plan(pp=16, ep=64, world=2048).check(ds)
    m = machine("h800")
    off, on = step_time(ds, plan, 4096, m), step_time(ds, plan, 4096, m, ("dualpipe",))
    parts = off["parts_per_microbatch_s"]
    compute = parts["matmul"] + parts["attention"] + parts["elementwise"]
    hidden = min(parts["ep"], compute)
    slow = overlap_cost(m)
    assert 0 < slow < 1 and parts["ep"] > 0
    assert on["per_microbatch_s"] == pytest.approx(off["per_microbatch_s"] - hidden * (1 - slow))
    assert on["exposed_p2p_s"] == pytest.approx(slow * off["p2p_s"]) and off["exposed_p2p_s"] == off["p2p_s"]
    assert on["step_s"] < off["step_s"]

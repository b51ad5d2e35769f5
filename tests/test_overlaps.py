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
    assert names(PLAN) == ("grad-reduce", "prefetch", "tp", "p2p", "cp")
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
    (["memory", "--model", "27b", "--tp", "8", "--overlap", "dualpipe"],
     "--overlap dualpipe: not modelled here: a plan's step has no chunks paired"),
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

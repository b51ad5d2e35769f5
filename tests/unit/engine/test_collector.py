"""The cyclic collector is paused only while a run builds its trace, and left as it was found."""
import gc

import pytest

import parasim
from parasim.engine.collector import collector_paused


def test_paused_inside_and_restored_after_even_on_an_error():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before, off after: never switched on behind the caller's back
    finally:
        gc.enable()


def test_a_symbolic_run_leaves_the_collector_on_and_pauses_it_while_it_runs():
    seen = []

    def program(ctx):
        seen.append(gc.isenabled())
        ctx.comm.all_reduce(ctx.xp.zeros((4,)))

    parasim.run(program, 4, backend="symbolic")
    assert seen == [False] * 4 and gc.isenabled()


def test_a_hold_pauses_until_released_once_and_leaves_a_paused_collector_paused():
    from parasim.engine.collector import CollectorHold

    hold = CollectorHold()
    assert not gc.isenabled()
    with collector_paused():  # a pause inside the hold leaves the switch to it
        pass
    assert not gc.isenabled()
    hold.release()
    assert gc.isenabled()
    gc.disable()
    try:
        hold.release()  # released already: it does not switch the collector on again
        assert not gc.isenabled()
        CollectorHold().release()  # held while off: left off
        assert not gc.isenabled()
    finally:
        gc.enable()

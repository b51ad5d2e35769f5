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


def test_a_pause_that_made_many_records_ends_with_one_collection():
    """A pause past LARGE objects ends with a full collection: they are not left in the youngest generation for
    whatever runs next to walk (DeepSeek-V3's step whose layers repeat makes about 230,000)."""
    from parasim.engine.collector import LARGE

    assert LARGE <= 200_000
    with collector_paused():
        kept = [[i] for i in range(LARGE + 1000)]  # tracked objects, alive after the pause
    assert gc.get_count()[0] < 1000 and len(kept) > LARGE

"""The meter hands each rank's work out once, to the first event it is in (engine/work.py `take`, `take_all`,
`put`), however ranks' work and their collectives interleave: `take_all` skips its members when no rank computed
since (a loop of collectives), and that shortcut must never drop work."""

from __future__ import annotations

from parasim.comm.trace import Work
from parasim.engine.work import Meter


def _meter(world: int) -> tuple[Meter, list[int]]:
    turn = [0]
    return Meter(world, lambda: turn[0]), turn


def test_nothing_computed_nothing_taken():
    m, _ = _meter(4)
    assert m.take_all((0, 1, 2, 3)) == [None] * 4
    assert [m.take(r) for r in range(4)] == [None] * 4


def test_a_ranks_work_goes_to_its_next_event_alone():
    m, turn = _meter(3)
    turn[0] = 1
    m.add("matmul", 60)
    assert [dict(w) if w else w for w in m.take_all((0, 1, 2))] == [None, {"matmul": 60}, None]
    assert m.take_all((0, 1, 2)) == [None] * 3  # taken once


def test_work_outside_the_group_waits_for_its_own_rank():
    """Ranks 0 and 2 computed; a collective of 0 and 1 takes rank 0's alone, and rank 2's is still there for the
    next collective it is in (a shortcut that forgot rank 2 computed would hand that one nothing)."""
    m, turn = _meter(3)
    for r, flops in ((0, 10), (2, 7)):
        turn[0] = r
        m.add("matmul", flops)
    assert [dict(w) if w else w for w in m.take_all((0, 1))] == [{"matmul": 10}, None]
    assert [dict(w) if w else w for w in m.take_all((1, 2))] == [None, {"matmul": 7}]
    assert m.take_all((0, 1, 2)) == [None] * 3


def test_work_put_back_is_taken_by_the_next_event():
    """A repeated call's tail (engine/symbolic/repeat.py) is put on the rank; a collective then takes it, as it
    takes work the meter counted, and one taken by `take` first is not taken again."""
    m, _ = _meter(2)
    m.put(1, Work({"attention": 5}))
    assert [dict(w) if w else w for w in m.take_all((0, 1))] == [None, {"attention": 5}]
    m.put(0, Work({"matmul": 3}))
    assert dict(m.take(0) or {}) == {"matmul": 3}
    assert m.take_all((0, 1)) == [None, None]


def test_an_event_of_a_rank_that_computed_after_a_take_gets_the_new_work():
    m, turn = _meter(2)
    m.add("matmul", 4)
    assert m.take(0) is not None
    m.add("matmul", 6)  # rank 0 again, after its work was taken
    assert [dict(w) if w else w for w in m.take_all((0, 1))] == [{"matmul": 6}, None]

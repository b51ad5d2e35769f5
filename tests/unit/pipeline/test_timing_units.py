"""pipeline/timing.py's time_schedule on schedules small enough to time by hand: each action starts once what it
needs has ended, a rank done early does not stop the others, a deadlock names each waiting rank's next action,
the slot limit is refused just past its boundary, and an empty schedule takes no time."""
import pytest

from parasim.errors import UsageError
from parasim.pipeline.action import Action
from parasim.pipeline.timing import time_schedule


def F(stage, mb=0):
    return Action("F", mb, stage)


def B(stage, mb=0):
    return Action("B", mb, stage)


def test_a_rank_that_is_done_does_not_hold_back_the_next():
    """Rank 0: F of stage 0 at slot 0. Rank 1: F of stage 1 once it has ended (slot 1), then its B (slot 2)."""
    t = time_schedule([[F(0)], [F(1), B(1)]])
    assert t.makespan == 3 and t.slots == [["F1", None, None], [None, "F1", "B1"]]
    assert t.idle == [2, 1]


def test_a_deadlock_names_the_action_each_waiting_rank_is_stuck_on():
    with pytest.raises(UsageError) as err:
        time_schedule([[F(0)], [B(1)]])  # stage 1's B needs stage 1's F, which no rank runs
    assert str(err.value) == "the schedule deadlocks: every rank waits ({1: 'B1'})"


def test_the_slot_limit_is_refused_just_past_it():
    """Two ranks, a step of 4 slots: 8 slots is within a limit of 8 and past one of 7."""
    schedule = [[F(0), B(0)], [F(1), B(1)]]
    assert time_schedule(schedule, max_slots=8).makespan == 4
    with pytest.raises(UsageError) as err:
        time_schedule(schedule, max_slots=7)
    assert str(err.value) == ("the slot table, 2 ranks x 4 or more time slots: 8 slots is more than the limit of 7 "
                              "(the timing fills every slot of every rank)")
    with pytest.raises(UsageError, match=r"\(a reason\)$"):
        time_schedule(schedule, max_slots=7, why="a reason")


def test_no_action_takes_no_time():
    assert (time_schedule([]).makespan, time_schedule([]).slots) == (0, [])
    assert (time_schedule([[]]).makespan, time_schedule([[]]).slots, time_schedule([[]]).idle) == (0, [[]], [0])

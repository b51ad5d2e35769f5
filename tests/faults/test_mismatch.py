"""Members of a group that disagree in any one parameter of a call are stopped before the call runs, on
virtual and real (gloo) ranks alike, with an error naming both ranks and both calls.

One table drives every test: (call, kwargs of rank 0, kwargs of rank 1), the two differing in exactly one
parameter (shape and dtype choose the input array). Without the parameter in the compared signature the
run would go on with rank 0's parameters (virtual) or whatever gloo makes of it (real), so each row fails
when its parameter is dropped from the signature (`interface.signature`, or the call's params).
"""
from __future__ import annotations

import math
import re
from functools import partial

import numpy as np
import pytest

import parasim
from parasim import CollectiveMismatch, Deadlock
from parasim.comm.interface import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE, REDUCE_SCATTER, SCATTER

P2P = "p2p"  # rank 0 sends to kwargs["dst"], rank 1 receives from kwargs["src"] (shape and dtype its own)
DEFAULTS = {"shape": (2, 2), "dtype": "float64"}
CALL_DEFAULTS = {BROADCAST: {"src": 0}, REDUCE: {"dst": 0}, SCATTER: {"src": 0}, P2P: {"dst": 1, "src": 0}}

# Every row raises CollectiveMismatch. (call, rank 0's kwargs, rank 1's kwargs)
MISMATCHES = [
    (ALL_REDUCE, {"op": "sum"}, {"op": "max"}),
    (ALL_REDUCE, {"op": "avg"}, {"op": "min"}),
    (ALL_REDUCE, {"dtype": "float64"}, {"dtype": "float32"}),
    (ALL_REDUCE, {"shape": (2, 2)}, {"shape": (4,)}),  # the same number of bytes
    (ALL_REDUCE, {"algo": "direct"}, {"algo": "ring"}),
    (REDUCE_SCATTER, {"dim": 0}, {"dim": 1}),
    (REDUCE_SCATTER, {"op": "sum"}, {"op": "avg"}),
    (REDUCE_SCATTER, {"dtype": "float64"}, {"dtype": "int64"}),
    (REDUCE_SCATTER, {"algo": "ring"}, {"algo": "direct"}),
    (ALL_GATHER, {"dim": 0}, {"dim": 1}),
    (ALL_GATHER, {"shape": (2, 2)}, {"shape": (2, 3)}),
    (ALL_GATHER, {"dtype": "float32"}, {"dtype": "float64"}),
    (ALL_GATHER, {"algo": "direct"}, {"algo": "ring"}),
    (BROADCAST, {"src": 0}, {"src": 1}),
    (BROADCAST, {"shape": (2, 2)}, {"shape": (2,)}),
    (BROADCAST, {"dtype": "float64"}, {"dtype": "int64"}),
    (ALL_TO_ALL, {"dtype": "float64"}, {"dtype": "float32"}),
    (ALL_TO_ALL, {"dim": 0}, {"dim": 1}),
    (ALL_TO_ALL, {"shape": (2, 2)}, {"shape": (2, 3)}),  # chunks differ in a dim other than `dim`
    (REDUCE, {"dst": 0}, {"dst": 1}),
    (REDUCE, {"op": "sum"}, {"op": "max"}),
    (REDUCE, {"shape": (2, 2)}, {"shape": (4,)}),
    (REDUCE, {"dtype": "float64"}, {"dtype": "int64"}),
    (SCATTER, {"src": 0}, {"src": 1}),
    (SCATTER, {"dim": 0}, {"dim": 1}),
    (SCATTER, {"shape": (2, 2)}, {"shape": (4, 2)}),
    (SCATTER, {"dtype": "float32"}, {"dtype": "float64"}),
    (P2P, {"shape": (2,)}, {"shape": (3,)}),
    (P2P, {"dtype": "float64"}, {"dtype": "float32"}),
]

# Rows no signature can catch: the two calls never meet, so each rank waits for the other (a Deadlock
# naming what each waits in). (call, rank 0's kwargs, rank 1's kwargs, world)
HANGS = [
    (ALL_REDUCE, {"group": "a"}, {"group": "b"}, 2),  # two groups of the same ranks [0, 1]
    (ALL_GATHER, {"group": "a"}, {"group": "b"}, 2),
    (P2P, {"dst": 1}, {"src": 2}, 3),  # rank 0 sends to 1, which waits for rank 2 (which sends nothing)
    (P2P, {"dst": 2}, {"src": 0}, 3),
]

# On real ranks one run per row (a few seconds each): one row per kind of parameter.
GLOO = [
    (ALL_REDUCE, {"op": "sum"}, {"op": "max"}),
    (ALL_REDUCE, {"dtype": "float64"}, {"dtype": "float32"}),
    (ALL_REDUCE, {"shape": (2, 2)}, {"shape": (4,)}),
    (REDUCE_SCATTER, {"dim": 0}, {"dim": 1}),
    (BROADCAST, {"src": 0}, {"src": 1}),
    (ALL_GATHER, {"algo": "direct"}, {"algo": "ring"}),
    (REDUCE, {"dst": 0}, {"dst": 1}),
    (SCATTER, {"src": 0}, {"src": 1}),
    (P2P, {"shape": (2,)}, {"shape": (3,)}),
]
assert all(row in MISMATCHES for row in GLOO)


def _id(row: tuple) -> str:
    call, kw0, kw1 = row[:3]
    keys = sorted(k for k in kw0.keys() | kw1.keys() if kw0.get(k) != kw1.get(k))
    return "-".join([call] + [f"{k}={kw0.get(k)}-vs-{kw1.get(k)}" for k in keys]).replace(" ", "")


def clash(row: tuple, ctx) -> None:
    """Rank 0 calls `row`'s call with its kwargs, rank 1 with its own; other ranks do nothing. Module-level
    (picklable through functools.partial) so that real ranks can run it."""
    call, kw0, kw1 = row[:3]
    if ctx.rank > 1:
        return
    kw = {**DEFAULTS, **CALL_DEFAULTS.get(call, {}), **(kw0 if ctx.rank == 0 else kw1)}
    shape, dtype = tuple(kw.pop("shape")), kw.pop("dtype")
    x = ctx.asarray(np.arange(math.prod(shape)).reshape(shape), dtype)
    comm = ctx.comm
    if "group" in kw:  # every rank creates both groups, in the same order
        groups = {name: ctx.new_group([0, 1], name) for name in ("a", "b")}
        kw["group"] = groups[kw["group"]]
    if call == P2P:
        if ctx.rank == 0:
            comm.send(x, kw["dst"])
        else:
            comm.recv(kw["src"], shape, dtype)
    elif call == ALL_TO_ALL:
        comm.all_to_all([x, x], **kw)
    else:
        getattr(comm, call)(x, **kw)


def _fragment(call: str, key: str, value) -> str:
    """How `describe` (or describe_p2p, or a deadlock's "waits in") names one parameter."""
    if key == "shape":
        return f"chunks={[tuple(value)] * 2}" if call == ALL_TO_ALL else f"shape={tuple(value)}"
    if call == P2P and key in ("src", "dst"):
        return f"{'to' if key == 'dst' else 'from'} rank {value}"
    if key == "group":
        return f"on group {value}[0, 1]"
    return f"{key}={value}"


def _expected(row: tuple, rank: int) -> list[str]:
    """What rank `rank`'s line must say: its call, its shape and dtype, and every parameter the row sets."""
    call, kw0, kw1 = row[:3]
    kw = {**DEFAULTS, **CALL_DEFAULTS.get(call, {}), **(kw0 if rank == 0 else kw1)}
    if call == P2P:
        return ["send(" if rank == 0 else "recv("] + [_fragment(call, k, kw[k])
                                                     for k in ("shape", "dtype", "dst" if rank == 0 else "src")]
    keys = ["shape", "dtype"] + sorted((kw0.keys() | kw1.keys()) - {"shape", "dtype"})
    return [f"{call}("] + [_fragment(call, k, kw[k]) for k in keys]


def _line(msg: str, rank: int) -> str:
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip().startswith(f"rank {rank}: ")]
    assert len(lines) == 1, msg
    return lines[0]


def _assert_names_both(row: tuple, msg: str) -> None:
    """Each rank's line names its own call with its own value of the differing parameter (not the other's)
    and the program's line."""
    mine = [_expected(row, 0), _expected(row, 1)]
    assert mine[0] != mine[1]
    for rank in (0, 1):
        line = _line(msg, rank)
        for frag, theirs in zip(mine[rank], mine[1 - rank]):
            assert frag in line, (rank, frag, msg)
            assert frag == theirs or theirs not in line, (rank, theirs, msg)
        assert "test_mismatch.py:" in line, msg


# ---------------------------------------------------------------------------------------------
# Virtual ranks

@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
@pytest.mark.parametrize("row", MISMATCHES, ids=_id)
def test_ranks_differing_in_one_parameter_are_a_mismatch_naming_both_calls(row):
    with pytest.raises(CollectiveMismatch) as info:
        parasim.run(partial(clash, row), 2)
    _assert_names_both(row, str(info.value))
    assert info.value.ranks == [0, 1] and len(info.value.calls) == 2


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
@pytest.mark.parametrize("row", MISMATCHES, ids=_id)
def test_the_same_call_on_both_ranks_runs(row):
    """The table's programs are otherwise valid: rank 0's call on both ranks runs (and so does rank 1's)."""
    call, kw0, kw1 = row
    for kw in (kw0, kw1):
        parasim.run(partial(clash, (call, kw, kw)), 2)


@pytest.mark.timeout(60)  # a hang guard, not a duration: the machine may be loaded
@pytest.mark.parametrize("row", HANGS, ids=_id)
def test_calls_that_never_meet_are_a_deadlock_naming_both(row):
    """Different groups (or p2p peers) cannot be compared: each call waits on a group (or peer) the other
    rank never joins. Virtual ranks see that no rank can go on and name what each one waits in."""
    with pytest.raises(Deadlock) as info:
        parasim.run(partial(clash, row), row[3])
    _assert_names_both(row, str(info.value))
    assert sorted(info.value.waiting) == list(range(row[3]))


# ---------------------------------------------------------------------------------------------
# Real ranks (gloo): the same error, the same text

@pytest.mark.slow
@pytest.mark.parametrize("row", GLOO, ids=_id)
def test_a_mismatch_on_gloo_ranks_has_the_virtual_text(row):
    pytest.importorskip("torch")
    with pytest.raises(CollectiveMismatch) as virtual:
        parasim.run(partial(clash, row), 2)
    with pytest.raises(CollectiveMismatch) as real:  # the same type, the same text
        parasim.run(partial(clash, row), 2, backend="gloo", timeout=20)
    assert str(real.value) == str(virtual.value)
    _assert_names_both(row, str(real.value))


@pytest.mark.slow
@pytest.mark.timeout(100)  # torch's default for a new group is 30 minutes: without the run's time-out it hangs
def test_ranks_in_different_groups_on_gloo_stop_at_the_run_timeout():
    """No exchange can compare calls on two groups either: each rank's signature exchange waits on a group
    the other never joins. The run's `timeout` ends it with a Deadlock naming a waiting rank, its call and
    its group (only the rank that timed out first is reported)."""
    pytest.importorskip("torch")
    row = HANGS[0]
    with pytest.raises(Deadlock) as real:  # the message names the time-out that ended it
        parasim.run(partial(clash, row), 2, backend="gloo", timeout=10)
    msg = str(real.value)
    assert re.search(r"rank (0 timed out in all_reduce\(.*\) on group a|1 timed out in all_reduce\(.*\) on "
                     r"group b)\[0, 1\] at tests/faults/test_mismatch.py:\d+", msg), msg

"""The order in which the interface asks a backend's hooks (comm/interface.py `Comm`): a call that sends one array
has the array checked, then the group resolved (`_checked`, which a backend may answer in one go: the virtual
one does), then the backend's `_collective`. Seen from a backend that records what it is asked."""

from __future__ import annotations

import numpy as np
import pytest

import parasim
from parasim.comm.interface import Comm, Group
from parasim.errors import CollectiveError

WORLD = Group((0, 1), "world", 0)


class Recording(Comm):
    """A backend of two ranks that says what it was asked, refusing arrays that are not lists."""

    rank, world, algo = 0, 2, "direct"

    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def _check_array(self, x, op):
        self.asked.append(("check", op))
        if not isinstance(x, list):
            raise CollectiveError(f"{op}: not an array of this backend")

    def _group(self, group, op):
        self.asked.append(("group", op))
        return WORLD if group is None else group

    def _collective(self, op, x, params, group, label, site, sig=None):
        self.asked.append(("run", op, params, group))
        return x

    def exchange(self, ops, *, group=None, label=None, tags=None):
        raise NotImplementedError

    def new_group(self, ranks, name):
        raise NotImplementedError


class Shape(list):
    shape, ndim, dtype = (2,), 1, "float32"


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter"])
def test_the_array_is_checked_then_the_group_resolved_then_the_call_run(call):
    comm, x = Recording(), Shape([1.0, 2.0])
    args = {"broadcast": {"src": 0}, "reduce": {"dst": 0}, "scatter": {"src": 0}}.get(call, {})
    if call in ("reduce", "reduce_scatter"):
        args["op"] = "max"  # the reduce ops any dtype takes (no check of a sum's dtype)
    getattr(comm, call)(x, **args)
    assert [a[:2] for a in comm.asked] == [("check", call), ("group", call), ("run", call)]
    assert comm.asked[-1][3] == WORLD


def test_an_array_the_backend_refuses_stops_the_call_before_its_group_is_asked():
    comm = Recording()
    with pytest.raises(CollectiveError, match="all_reduce: not an array of this backend"):
        comm.all_reduce((1.0, 2.0))
    assert comm.asked == [("check", "all_reduce")]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda c, x: c.reduce(x, dst=5), "reduce: dst rank 5 is not a member of group world[0, 1]"),
        (lambda c, x: c.scatter(x, src=5), "scatter: src rank 5 is not a member of group world[0, 1]"),
        (lambda c, x: c.broadcast(x, src=5), "broadcast: src rank 5 is not a member of group world[0, 1]"),
        (lambda c, x: c.scatter(x, src=0, dim=1), "scatter: dim 1 is out of range for an array with 1 dims"),
        (lambda c, x: c.scatter(x[:3], src=0), "scatter: size 3 of dim 0 does not divide by the group size 2"),
        (lambda c, x: c.reduce(x.astype(np.int32), dst=0, op="avg"), "op='avg' needs a floating dtype, got int32"),
        (lambda c, x: c.all_reduce(x.astype(np.int32), op="avg"), "op='avg' needs a floating dtype, got int32"),
    ],
    ids=["reduce-dst", "scatter-src", "broadcast-src", "scatter-dim", "scatter-size", "reduce-avg", "all-reduce-avg"],
)
def test_a_bad_argument_is_named_with_its_call(call, words):
    """Each refusal says which call and which argument, in one line with the program's line after it."""

    def program(ctx):
        return call(ctx.comm, np.ones(4, np.float32))

    with pytest.raises(CollectiveError) as info:
        parasim.run(program, 2)
    assert str(info.value).startswith(words + " (called at ")


def test_the_group_a_call_names_is_the_group_it_runs_on():
    comm, pair = Recording(), Group((1, 0), "pair", 1)
    comm.all_gather(Shape([1.0]), group=pair)
    assert comm.asked[-1][3] is pair


@pytest.mark.parametrize(
    "x, words",
    [
        ([1.0, 2.0], "all_reduce expects a numpy array on virtual ranks, got list"),
        (np.array(["a", "b"]), "all_reduce expects numbers, got an array of dtype <U1"),
        (np.array([None, 1]), "all_reduce expects numbers, got an array of dtype object"),
    ],
    ids=["list", "strings", "objects"],
)
def test_a_virtual_rank_sends_numbers_in_a_numpy_array(x, words):
    def program(ctx):
        return ctx.comm.all_reduce(x)

    with pytest.raises(CollectiveError) as info:
        parasim.run(program, 2)
    assert str(info.value).startswith(words + " (called at ")


def test_a_group_of_another_run_is_named_with_the_call():
    other = parasim.run(lambda ctx: ctx.comm.new_group([0, 1], "pair"), 2).values[0]

    def program(ctx):
        return ctx.comm.all_reduce(np.ones(2), group=other)

    with pytest.raises(CollectiveError, match=r"^all_reduce: group pair\[0, 1\] was not created in this run"):
        parasim.run(program, 2)

"""A run names each call's site from a memo of the code objects it has met (comm/sites.py `call_site`): the memo
must give every call its own line, call after call, and never remember a helper whose locals decide."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import site_at

import parasim
from parasim.comm import sites

HERE = str(Path(__file__).resolve())


def _sites(program, world: int = 2) -> list[tuple[str | None, set[str]]]:
    return [
        (e.label, {m.site for m in e.members})
        for e in parasim.run(program, world).trace.events
        if e.kind == "collective"
    ]


def test_two_calls_of_one_function_keep_their_own_lines_call_after_call():
    def program(ctx):
        x = np.ones(2, np.float32)
        for _ in range(3):
            ctx.comm.all_reduce(x, label="a")  # first line
            ctx.comm.all_reduce(x, label="b")  # second line

    first, second = site_at(HERE, "first line"), site_at(HERE, "second line")
    assert _sites(program) == [("a", {first}), ("b", {second})] * 3


def _helper(ctx, x, hide: bool):
    __site_hide__ = hide  # noqa: F841 (a helper whose locals say, call by call, whether it names its caller)
    return ctx.comm.all_reduce(x, label=str(hide))  # helper's line


def test_a_helper_whose_locals_decide_is_asked_again_on_every_call():
    def program(ctx):
        x = np.ones(2, np.float32)
        for hide in (False, True, False, True):
            _helper(ctx, x, hide)  # caller's line

    helper, caller = site_at(HERE, "helper's line"), site_at(HERE, "caller's line")
    assert _sites(program) == [("False", {helper}), ("True", {caller})] * 2


def test_the_memo_is_bounded_and_a_full_memo_still_names_the_site():
    full = sites.SiteMemo()
    full.sites = {full.hold(compile(str(i), "x", "eval")): {} for i in range(sites.PLAIN_CODES - 1)}
    full.passed = {full.hold(compile("y", "y", "eval"))}
    here = sys._getframe()
    assert sites.call_site(1, full) == (here.f_code.co_filename, here.f_lineno)
    assert len(full.held) == sites.PLAIN_CODES and id(here.f_code) not in full.sites
    room = sites.SiteMemo()
    assert sites.call_site(1, room) == (HERE, site_line("with room"))  # with room
    # a plain function's code is kept with the site of its instruction (and any wrapper met on the way passed
    # over: under mutmut, its trampolines)
    assert list(room.sites) == [id(here.f_code)] and room.held[id(here.f_code)] is here.f_code
    assert list(room.sites[id(here.f_code)].values()) == [(HERE, site_line("with room"))]


def _wrapper(memo):
    return sites.call_site(1, memo)  # the test makes this function a wrapper (its file is not one)


def _hidden(memo):
    __site_hide__ = True  # noqa: F841 (a helper whose locals say it calls for its caller)
    return sites.call_site(1, memo)


def test_a_wrapper_met_once_is_passed_over_from_the_memo(monkeypatch):
    plain = sites.is_wrapper
    monkeypatch.setattr(sites, "is_wrapper", lambda f: f.f_code is _wrapper.__code__ or plain(f))
    memo = sites.SiteMemo()
    first = _wrapper(memo)  # wrapped once
    assert id(_wrapper.__code__) in memo.passed and first == (HERE, site_line("wrapped once"))

    def never(frame):
        raise AssertionError("is_wrapper asked of a frame the memo knows")

    monkeypatch.setattr(sites, "is_wrapper", never)
    assert _wrapper(memo) == (HERE, site_line("wrapped again"))  # wrapped again


def test_a_helper_whose_locals_decide_is_never_kept():
    memo = sites.SiteMemo()
    assert _hidden(memo) == (HERE, site_line("hidden caller"))  # hidden caller
    assert id(_hidden.__code__) not in memo.held and id(_hidden.__code__) not in memo.passed


def test_a_label_brought_by_a_later_member_names_the_event():
    def program(ctx):
        x = np.ones(2, np.float32)
        ctx.comm.all_reduce(x, label="from rank 2" if ctx.rank == 2 else None)
        ctx.comm.all_reduce(x, label=f"rank {ctx.rank}" if ctx.rank else None)
        ctx.comm.all_reduce(x)

    assert [label for label, _ in _sites(program, 3)] == ["from rank 2", "rank 1", None]


def test_members_that_label_a_call_differently_name_it_by_the_first_in_the_groups_order():
    """Ranks arrive 0, 1, 2 at the run's first call and 2, 0, 1 at the next (the last to arrive goes on first);
    either way the label is the first member's, in the group's order, that brought one."""
    def program(ctx):
        x = np.ones(2, np.float32)
        for _ in range(2):
            ctx.comm.all_reduce(x, label=[None, "one", "two"][ctx.rank])
            ctx.comm.all_reduce(x, label=["zero", "one", None][ctx.rank])

    assert [label for label, _ in _sites(program, 3)] == ["one", "zero"] * 2


def test_a_site_in_the_memo_is_the_answer_without_a_walk():
    """The memo is read first: once a call's site is kept for its code object and instruction, that kept site is
    what call_site answers for the instruction (the fast path every rank's call takes)."""
    memo = sites.SiteMemo()
    here = sys._getframe()
    got = []
    for i in range(3):
        got.append(sites.call_site(1, memo))  # the memo's instruction
        if i == 0:
            (lasti,) = memo.sites[id(here.f_code)]
            memo.sites[id(here.f_code)][lasti] = ("planted.py", 7)
    assert got[0] == (here.f_code.co_filename, site_line("the memo's instruction"))
    assert got[1:] == [("planted.py", 7)] * 2


def site_line(marker: str) -> int:
    return int(site_at(HERE, marker).rsplit(":", 1)[1])


def test_a_transfer_and_a_group_are_named_by_the_programs_lines():
    from parasim.comm.interface import Recv, Send

    def exchanging(ctx):
        peer = 1 - ctx.rank
        ctx.comm.exchange([Send(np.ones(2, np.float32), peer), Recv(peer, (2,), np.float32)])  # the exchange

    sites_seen = {m.site for e in parasim.run(exchanging, 2).trace.events for m in e.members}
    assert sites_seen == {site_at(HERE, "the exchange")}

    def grouping(ctx):
        ctx.comm.new_group([0, 1], "a" if ctx.rank == 0 else "b")  # the group

    with pytest.raises(parasim.ParasimError) as err:
        parasim.run(grouping, 2)
    assert str(err.value).count(site_at(HERE, "the group")) == 2  # where each rank made it


@pytest.mark.parametrize("how", ["all_to_all", "ring", "values kept"])
def test_each_member_of_a_call_recorded_member_by_member_keeps_its_own_line(how):
    """Chunks, a ring's hops and kept values make each member's record from what it brought (virtual.py
    `_own_records`): rank 0 calls from one line, rank 1 from another, and each record names its own."""
    def call(ctx):  # makes the call for its caller: the site is the program's line
        __site_hide__ = True  # noqa: F841
        x = np.ones(4, np.float32)
        if how == "all_to_all":
            return ctx.comm.all_to_all([x[:2], x[2:]])
        return ctx.comm.all_reduce(x, algo="ring" if how == "ring" else None)

    def program(ctx):
        if ctx.rank == 0:
            call(ctx)  # rank 0's line
        else:
            call(ctx)  # rank 1's line

    run = parasim.run(program, 2, keep_values=16 if how == "values kept" else 0)
    (event,) = [e for e in run.trace.events if e.kind == "collective"]
    assert [m.site for m in event.members] == [site_at(HERE, "rank 0's line"), site_at(HERE, "rank 1's line")]

"""The whole text of a failed virtual run, letter for letter: what a user reads to find the rank, the call
and the line. Key-word checks elsewhere would let a wrong rank list or a lost line through."""
from conftest import site_at

import numpy as np
import pytest

import parasim
from parasim import CollectiveMismatch, Deadlock, RankFailed
from parasim.comm.interface import ALL_TO_ALL, BARRIER, describe, describe_p2p


def _at(marker: str) -> str:
    return site_at(__file__, marker)


def _ragged(ctx):
    if ctx.rank == 0:
        ctx.comm.exchange([parasim.Send(ctx.asarray([1.0], "float32"), 3), parasim.Recv(3, (2,), "float32")])  # p2p
    elif ctx.rank == 1:
        ctx.comm.all_reduce(ctx.asarray([1.0]))  # reduce
    elif ctx.rank == 2:
        raise ValueError("boom")  # boom
    # rank 3 is never scheduled: rank 2 fails first


@pytest.mark.timeout(60)
def test_a_failed_rank_names_what_every_other_rank_waits_in():
    with pytest.raises(RankFailed) as info:
        parasim.run(_ragged, world=4)
    head, tb_and_rest = str(info.value).split("\n", 1)
    assert head == f"rank 2 raised ValueError: boom at {_at('boom')} (in _ragged)"
    tb, waiting = tb_and_rest.split("ranks left waiting:\n")
    assert tb.startswith("Traceback (most recent call last):\n  File ")
    assert '\n    raise ValueError("boom")  # boom\n' in tb and tb.endswith("\nValueError: boom\n")
    assert waiting.splitlines() == [
        f"  rank 0: waits in point-to-point at {_at('p2p')}: unmatched send(shape=(1,), dtype=float32) to rank 3, "
        "recv(shape=(2,), dtype=float32) from rank 3",
        "  rank 1: waits in all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct) on group world[0, 1, 2, 3] "
        f"(call #0 on it) at {_at('reduce')}; arrived [1], missing [0, 2, 3]",
        "  rank 3: had not reached a collective yet"]
    assert info.value.rank == 2 and set(info.value.waiting) == {0, 1, 2, 3}


@pytest.mark.timeout(60)
def test_a_lone_failed_rank_leaves_no_one_waiting():
    def prog(ctx):
        raise KeyError("k")

    with pytest.raises(RankFailed) as info:
        parasim.run(prog, world=1)
    assert str(info.value).endswith("KeyError: 'k'\nranks left waiting:\n  none")


@pytest.mark.timeout(60)
def test_a_mismatch_names_the_rank_not_arrived_yet():
    def prog(ctx):
        x = ctx.asarray([1.0])
        if ctx.rank == 0:
            ctx.comm.all_reduce(x)  # sum
        elif ctx.rank == 1:
            ctx.comm.all_reduce(x, op="max")  # max

    with pytest.raises(CollectiveMismatch) as info:
        parasim.run(prog, world=3)
    assert str(info.value).splitlines() == [
        "collective call #0 on group world[0, 1, 2] does not match across ranks:",
        f"  rank 0: all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct) at {_at('sum')}",
        f"  rank 1: all_reduce(shape=(1,), dtype=float64, op=max, algo=direct) at {_at('max')}",
        "  rank 2: not arrived yet"]
    assert info.value.ranks == [0, 1]


def test_describe_names_every_parameter():
    assert describe(BARRIER) == "barrier()"
    assert describe(ALL_TO_ALL, [np.zeros(2, np.float32)], dim=0) == "all_to_all(chunks=[(2,)], dtype=float32, dim=0)"
    assert describe("all_gather", np.zeros((2, 3)), dim=1, algo="ring") == \
        "all_gather(shape=(2, 3), dtype=float64, dim=1, algo=ring)"
    assert describe_p2p(True, 3, [4], np.float16) == "send(shape=(4,), dtype=float16) to rank 3"
    assert describe_p2p(False, 0, (), np.float64) == "recv(shape=(), dtype=float64) from rank 0"


@pytest.mark.timeout(60)
def test_a_deadlock_names_every_rank_once_grouped_by_what_it_waits_in():
    def prog(ctx):
        if ctx.rank != 1:
            ctx.comm.all_reduce(ctx.asarray([1.0]))  # skipped by rank 1

    with pytest.raises(Deadlock) as info:
        parasim.run(prog, world=3)
    waits = ("waits in all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct) on group world[0, 1, 2] "
             f"(call #0 on it) at {_at('skipped by rank 1')}; arrived [0, 2], missing [1]")
    assert str(info.value).splitlines() == ["every unfinished rank is waiting and none can go on:",
                                            f"  ranks 0, 2: {waits}", "  rank 1: finished"]
    assert info.value.waiting == {0: waits, 1: "finished", 2: waits}


def test_rank_lists_are_written_as_ranges():
    from parasim.comm.interface import Group, by_text, rank_list
    assert rank_list([0, 1, 2, 5, 7, 8, 10, 11, 12, 13]) == "[0-2, 5, 7, 8, 10-13]"
    assert rank_list([]) == "[]" and rank_list([4]) == "[4]"
    assert str(Group(tuple(range(16)), "dp")) == f"dp{list(range(16))}"  # small groups in full
    assert str(Group(tuple(range(17)), "dp")) == "dp[0-16]"
    assert by_text({3: "b", 0: "a", 1: "a", 2: "a", 5: "a"}) == ["  ranks 0-2, 5: a", "  rank 3: b"]


W = 2048


def _skip_last(ctx):
    if ctx.rank != W - 1:
        ctx.comm.all_reduce(ctx.asarray([1.0]))  # all but the last


def _max_last(ctx):
    ctx.comm.all_reduce(ctx.asarray([1.0]), op="max" if ctx.rank == W - 1 else "sum")  # sum or max


def _raise_last(ctx):
    if ctx.rank == W - 1:
        raise ValueError("last")
    ctx.comm.barrier()  # everyone else


@pytest.mark.timeout(60)
def test_faults_among_2048_ranks_read_as_a_few_lines():
    """A deadlock, a mismatch and a failed rank among 2,048 ranks: one line per kind of rank, with rank
    ranges, not one per rank (benchmarks/faults.py times them)."""
    with pytest.raises(Deadlock) as info:
        parasim.run(_skip_last, W)
    assert str(info.value).splitlines()[1:] == [
        "  ranks 0-2046: waits in all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct) on group "
        f"world[0-2047] (call #0 on it) at {_at('all but the last')}; arrived [0-2046], missing [2047]",
        "  rank 2047: finished"]
    assert len(info.value.waiting) == W
    with pytest.raises(CollectiveMismatch) as info:
        parasim.run(_max_last, W)
    assert str(info.value).splitlines() == [
        "collective call #0 on group world[0-2047] does not match across ranks:",
        f"  ranks 0-2046: all_reduce(shape=(1,), dtype=float64, op=sum, algo=direct) at {_at('sum or max')}",
        f"  rank 2047: all_reduce(shape=(1,), dtype=float64, op=max, algo=direct) at {_at('sum or max')}"]
    with pytest.raises(RankFailed) as info:
        parasim.run(_raise_last, W)
    assert str(info.value).split("ranks left waiting:\n")[1] == (
        f"  ranks 0-2046: waits in barrier() on group world[0-2047] (call #0 on it) at {_at('everyone else')}; "
        "arrived [0-2046], missing [2047]")

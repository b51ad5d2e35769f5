"""Programs that fail, leave or hang on real ranks, run by tests/faults/test_faults_real.py as
`tests/faults/real_fault_programs.py:function` (a file of its own: each rank loads it by path, without the test's
imports). The comments at line ends mark the lines the errors must name."""
import collections
import itertools
import os
import time


def leaves_early(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        os._exit(0)
    return ctx.comm.all_reduce(ctx.asarray([1.0]))


def all_leave(ctx):
    ctx.comm.barrier()
    os._exit(0)


def sends_a_list(ctx):
    if ctx.rank == 0:
        ctx.comm.send([1.0, 2.0], 1)  # send list
    else:
        ctx.comm.recv(0, (2,), "float64")


def spins(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        while True: pass  # spin
    return ctx.comm.all_reduce(ctx.asarray([1.0]))  # after spin


def sleeps(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        time.sleep(1000)  # sleep
    return ctx.comm.all_reduce(ctx.asarray([1.0]))  # after sleep


def busy_in_c(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        collections.deque(itertools.count(), maxlen=0)  # a loop in C: no signal handler runs until it ends
    return ctx.comm.all_reduce(ctx.asarray([1.0]))


def all_spin(ctx):
    ctx.comm.barrier()
    while True: pass  # all spin


def spins_on_virtual_ranks(ctx):
    """Runs on real ranks; loops on rank 1 of the virtual run `parasim run` compares it with."""
    ctx.comm.barrier()
    if ctx.rank == 1 and ctx.xp.__name__.endswith("numpy"):
        while True: pass  # virtual spin
    return ctx.comm.all_reduce(ctx.asarray([1.0]))


def talks(ctx):
    print("rank", ctx.rank, "says hi")  # a program that prints
    return ctx.comm.all_reduce(ctx.xp.ones(2, dtype="bfloat16"))  # a dtype named as numpy names it


def exits(ctx):
    import sys
    ctx.comm.barrier()
    if ctx.rank == 1:
        sys.exit(3)  # exits 3
    return ctx.comm.all_reduce(ctx.asarray([1.0]))

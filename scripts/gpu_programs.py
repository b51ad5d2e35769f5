"""Small SPMD programs that scripts/gpu_check.py runs on real ranks (`parasim run scripts/gpu_programs.py:NAME`):
one per kind of call, all of them in one program, and a bf16 gradient all-reduce beside its float32 one.

`parasim run` compares each with virtual ranks call by call. When gpu_check.py sets PARASIM_GPU_CHECK_DEVICE
(to "cuda"), every real rank also refuses to run unless its tensors are on that kind of device, so a row that
says "tensors on the GPU" was checked, not assumed. Each works on any number of ranks (1 included).
"""
from __future__ import annotations

import os
from typing import Any

import parasim

EXPECT = "PARASIM_GPU_CHECK_DEVICE"


def _data(ctx: Any, n: int = 8) -> Any:
    """n integer-valued numbers (exact sums in any order), different on every rank, on the rank's device."""
    x = ctx.asarray([float(i + 1) for i in range(n)]) * (10 ** ctx.rank)
    want = os.environ.get(EXPECT)
    kind = getattr(getattr(x, "device", None), "type", None)  # numpy (virtual ranks): no device type
    if want and kind is not None and kind != want:
        raise RuntimeError(f"rank {ctx.rank}: tensors are on {x.device}, not on {want}")
    return x


def all_reduce(ctx: Any) -> Any:
    x = _data(ctx)
    return [ctx.comm.all_reduce(x), ctx.comm.all_reduce(x, op="max"), ctx.comm.all_reduce(x, algo="ring")]


def reduce_scatter(ctx: Any) -> Any:
    return ctx.comm.reduce_scatter(_data(ctx, 2 * ctx.world))


def all_gather(ctx: Any) -> Any:
    return ctx.comm.all_gather(_data(ctx))


def all_to_all(ctx: Any) -> Any:
    x = _data(ctx, ctx.world)
    return ctx.comm.all_to_all([x[: j + 1] for j in range(ctx.world)])  # chunks of unequal sizes


def broadcast(ctx: Any) -> Any:
    return ctx.comm.broadcast(_data(ctx), src=ctx.world - 1)


def reduce(ctx: Any) -> Any:
    return ctx.comm.reduce(_data(ctx), ctx.world - 1)


def scatter(ctx: Any) -> Any:
    return ctx.comm.scatter(_data(ctx, 2 * ctx.world), ctx.world - 1)


def send_recv(ctx: Any) -> Any:
    """A ring exchange (each rank sends to the next, receives from the previous); one rank has no peer."""
    x = _data(ctx)
    if ctx.world == 1:
        return x
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    (got,) = ctx.comm.exchange([parasim.Send(x, nxt), parasim.Recv(prv, tuple(x.shape), x.dtype)])
    return got


def barrier(ctx: Any) -> Any:
    _data(ctx)
    ctx.comm.barrier()
    return ctx.rank


# every kind above, in the order a check tries them one by one when all of them together fail
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "scatter", "send_recv",
         "barrier")


def every_call(ctx: Any) -> Any:
    return {name: globals()[name](ctx) for name in KINDS}


def bf16_sum(ctx: Any) -> Any:
    """A gradient all-reduce in bf16 beside the same values in float32. Each rank's values are exact in bf16
    (8 significant bits); their sums are not, so bf16 rounds where float32 does not."""
    values = [1.0 + ctx.rank / 64, 256.0 + ctx.rank, 0.333984375, -3.0 * (ctx.rank + 1)]
    return {"bf16": ctx.comm.all_reduce(ctx.asarray(values, dtype="bfloat16"), label="bf16 gradient all-reduce"),
            "fp32": ctx.comm.all_reduce(ctx.asarray(values, dtype="float32"), label="float32 gradient all-reduce")}

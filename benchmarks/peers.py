"""parasim's virtual ranks beside torch's own in-process ranks, measured in one run, in CPU seconds of this process
(every thread's: the machine's other load does not move them), printed as each peer's time over parasim's.

1. An all-reduce of 4 float32 over 8 ranks, per call: the engine's own cost (scheduling, checks, the trace).
2. An all-to-all of 16M float32 a rank over 8 ranks (torch: all_to_all_single), per call.
3. DeepSeek-V3's MoE layer forward at 4,096 tokens a GPU on EP 64, a rank's share: parasim's 64 symbolic ranks
   (benchmarks/symbolic.py item 2, balanced routing) against torch's FakeTensorMode running rank 0's forward on shapes
   alone, its all-to-alls through the fake process group (issue 55: parasim's whole step 5-6x less CPU than
   FakeTensorMode for the same layer-micro-batches).

The peers (torch 2.13, ../shared/notes/torch-distributed.md): LocalTensorMode (torch.distributed._local_tensor, a
private module: one tensor holds every rank's shard, and each collective runs once for all of them, under the "fake"
process group) and the threaded process group (torch.testing._internal.distributed.multi_threaded_pg: a thread a
rank, rank 0's thread moving every rank's data). Issue 55's figures for them: 105-111 us and 303-335 us a tiny
all-reduce. A peer this torch lacks, or one that fails, is said in one line; without torch, parasim alone.

    python benchmarks/peers.py [--json] [--tiny]

--tiny (for tests/e2e/test_benchmarks.py): 50 calls, 64K float32 for the all-to-all, the MoE layer at 256 tokens
on EP 8.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Callable

import numpy as np

import parasim

WORLD = 8
TINY_GOAL_US = 25  # issue 55: a tiny 8-rank all-reduce


def parasim_all_reduce(calls: int) -> float:
    def prog(ctx):
        x = np.ones(4, np.float32)
        for _ in range(calls):
            ctx.comm.all_reduce(x)

    parasim.run(prog, world=WORLD)  # warm: imports and first-call caches
    t = time.process_time()
    parasim.run(prog, world=WORLD)
    return (time.process_time() - t) / calls


def parasim_all_to_all(n: int, calls: int) -> float:
    xs = [np.ones(n, np.float32) for _ in range(WORLD)]

    def prog(ctx):
        for _ in range(calls):
            ctx.comm.all_to_all(np.split(xs[ctx.rank], WORLD))

    parasim.run(prog, world=WORLD)
    t = time.process_time()
    parasim.run(prog, world=WORLD)
    return (time.process_time() - t) / calls


def local_tensor(n: int | None, calls: int) -> float:
    """LocalTensorMode: a 4-element all-reduce (n None) or an all-to-all of n floats a rank, per call."""
    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers backend "fake"

    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    try:
        with LocalTensorMode(WORLD) as lm:
            x = lm.rank_map(lambda r: torch.ones(4 if n is None else n))
            out = lm.rank_map(lambda r: torch.empty(0 if n is None else n))

            def call() -> None:
                dist.all_reduce(x) if n is None else dist.all_to_all_single(out, x)

            call()
            t = time.process_time()
            for _ in range(calls):
                call()
            return (time.process_time() - t) / calls
    finally:
        dist.destroy_process_group()


def threaded(n: int | None, calls: int) -> float:
    """The threaded process group: the same calls, a thread a rank; this process's CPU seconds over all of them."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import (
        ProcessLocalGroup,
        _install_threaded_pg,
        _uninstall_threaded_pg,
    )

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store, failed = dist.HashStore(), []

    def worker(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=WORLD, store=store)
        try:
            x = torch.ones(4 if n is None else n)
            out = torch.empty(0 if n is None else n)
            for _ in range(calls):
                dist.all_reduce(x) if n is None else dist.all_to_all_single(out, x)
        except BaseException as exc:  # noqa: BLE001 (the group's own rule: else the other ranks wait forever)
            failed.append(exc)
            ProcessLocalGroup.exception_handle(exc)
        finally:
            dist.destroy_process_group()

    try:
        threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(WORLD)]
        t = time.process_time()
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=600)
        took = (time.process_time() - t) / calls
    finally:
        ProcessLocalGroup.reset()
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if failed:
        raise RuntimeError(f"a rank failed: {failed[0]!r:.120}")
    return took


def parasim_moe(tokens: int, gpus: int) -> float:
    """DeepSeek-V3's MoE layer forward on `gpus` symbolic ranks (benchmarks/symbolic.py item 2), CPU seconds a rank."""
    from symbolic import moe_program  # benchmarks/symbolic.py, beside this file

    program = moe_program(tokens, "balanced")
    parasim.run(program, gpus, backend="symbolic")  # warm: imports and first-call caches
    t = time.process_time()
    parasim.run(program, gpus, backend="symbolic")
    return (time.process_time() - t) / gpus


def fake_moe(tokens: int, gpus: int) -> float:
    """The same layer's forward as torch runs it on shapes alone: FakeTensorMode on rank 0 of `gpus`, its two
    all-to-alls through the fake process group, routing balanced so every split is known (each rank sends each
    other tokens x top-k / gpus rows: a data-dependent split would need torch's unbacked sizes). CPU seconds."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers backend "fake"

    from parasim.layout import preset

    ds = preset("deepseek-v3").model
    h, e, f, k = ds.hidden, ds.experts, ds.expert_size, ds.top_k
    local = e // gpus
    dist.init_process_group("fake", rank=0, world_size=gpus, store=FakeStore())
    try:
        with FakeTensorMode():
            half = torch.float16
            x, router = torch.empty(tokens, h, dtype=half), torch.empty(h, e, dtype=half)
            w1 = [torch.empty(h, f, dtype=half) for _ in range(local)]
            w2 = [torch.empty(f, h, dtype=half) for _ in range(local)]

            def forward() -> torch.Tensor:
                gates, chosen = torch.topk(torch.softmax((x @ router).float(), -1), k)
                order = torch.argsort(chosen.reshape(-1))  # each token's copies, grouped by expert
                rows = x.repeat_interleave(k, dim=0)[order]
                arrived = torch.empty_like(rows)
                dist.all_to_all_single(arrived, rows)
                per = rows.shape[0] // local
                done = torch.cat([torch.nn.functional.silu(arrived[i * per:(i + 1) * per] @ w1[i]) @ w2[i]
                                  for i in range(local)])
                back = torch.empty_like(done)
                dist.all_to_all_single(back, done)
                placed = torch.empty_like(back).index_copy(0, order, back)
                return (placed.view(tokens, k, h) * gates.unsqueeze(-1).to(half)).sum(1)

            forward()  # warm
            t = time.process_time()
            forward()
            return time.process_time() - t
    finally:
        dist.destroy_process_group()


def peer(fn: Callable[[], float]) -> float | str:
    """A peer's seconds a call, or one line saying why it did not run."""
    try:
        return fn()
    except ImportError as exc:
        return f"not in this torch ({exc.name or exc})"
    except Exception as exc:  # noqa: BLE001 (a private API: whatever it raises is said, not a traceback)
        return f"failed: {type(exc).__name__}: {str(exc)[:100]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--tiny", action="store_true", help="50 calls and a 64K all-to-all: seconds, for tests")
    args = ap.parse_args()
    calls, big, big_calls = (50, 64 * 1024, 3) if args.tiny else (2000, 16 * 1024 * 1024, 3)
    tokens, gpus = (256, 8) if args.tiny else (4096, 64)
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    rows = {
        "all_reduce_4_float32_8_ranks": {
            "parasim": parasim_all_reduce(calls),
            **({"LocalTensorMode": peer(lambda: local_tensor(None, calls)),
                "threaded process group": peer(lambda: threaded(None, calls))} if have_torch else {}),
        },
        f"all_to_all_{big // 1024}K_float32_8_ranks": {
            "parasim": parasim_all_to_all(big, big_calls),
            **({"LocalTensorMode": peer(lambda: local_tensor(big, big_calls)),
                "threaded process group": peer(lambda: threaded(big, big_calls))} if have_torch else {}),
        },
        f"moe_layer_forward_{tokens}_tokens_ep{gpus}_per_rank": {
            "parasim": parasim_moe(tokens, gpus),
            **({"FakeTensorMode": peer(lambda: fake_moe(tokens, gpus))} if have_torch else {}),
        },
    }
    if args.json:
        print(json.dumps({"cpu_s_per_call": rows, "torch": have_torch}, indent=1))
        return
    if not have_torch:
        print("torch is not installed: parasim alone (pip install torch==2.13.0 for the peers)")
    for name, row in rows.items():
        ours = row["parasim"]
        goal = f" ({ours * 1e6 / TINY_GOAL_US:.2f}x issue 55's {TINY_GOAL_US} us goal)" if name.startswith("all_reduce") else ""
        unit = "a rank's forward" if name.startswith("moe") else "a call"
        print(f"{name}: parasim {ours * 1e6:,.1f} us CPU {unit}{goal}")
        for who, got in row.items():
            if who == "parasim":
                continue
            if isinstance(got, str):
                print(f"  {who}: {got}")
            else:
                print(f"  {who}: {got * 1e6:,.1f} us = {got / ours:.2f}x parasim's")


if __name__ == "__main__":
    main()

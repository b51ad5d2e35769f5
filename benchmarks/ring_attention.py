"""Ring attention (forward + backward) on cp = 2, 4, 8 virtual ranks against the same attention computed
on one device, in one run: the ratio is what splitting the sequence over a ring costs here.

    python benchmarks/ring_attention.py [--json] [--seq N] [--heads N] [--dim N] [--causal] [--tiny]

--tiny: 64 positions, 2 heads of 8 (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import time

import parasim
from parasim.nn.ring_attention import RingAttention


def timed(cp: int, seq: int, b: int, heads: int, d: int, causal: bool, split: str) -> float:
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "cp") if ctx.world > 1 else None
        ring = RingAttention(ctx, group, seq, split=split, causal=causal)
        pos = ctx.xp.asarray(ring.pos[ring.r])
        q, k, v, do = (ctx.xp.take(ctx.shared_rng(n).normal((b, heads, seq, d)), pos, axis=2) for n in "qkvo")
        ctx.comm.barrier()
        start = time.perf_counter()
        out, cache = ring.forward(q, k, v)
        ring.backward(cache, do)
        ctx.comm.barrier()
        return time.perf_counter() - start
    # no time limit: one rank computes its whole share between two barriers, longer than 30 s on a loaded machine
    return parasim.run(program, cp, timeout=None).values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="--seq 64 --heads 2 --dim 8: for tests")
    args = ap.parse_args()
    if args.tiny:
        args.seq, args.heads, args.dim = 64, 2, 8
    split = "zigzag" if args.causal else "contiguous"
    base = timed(1, args.seq, 1, args.heads, args.dim, args.causal, split)
    rows = {cp: timed(cp, args.seq, 1, args.heads, args.dim, args.causal, split) for cp in (2, 4, 8)}
    result = {"seq": args.seq, "heads": args.heads, "dim": args.dim, "causal": args.causal,
              "single_device_s": round(base, 4),
              "cp": {str(cp): {"s": round(t, 4), "ratio": round(t / base, 3)} for cp, t in rows.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"attention forward+backward, seq {args.seq}, {args.heads} heads of {args.dim}"
          f"{', causal (zigzag)' if args.causal else ''}: one device {base * 1e3:.1f} ms")
    for cp, r in result["cp"].items():
        print(f"  cp={cp}: {r['s'] * 1e3:.1f} ms over all ranks, {r['ratio']:.2f}x one device")


if __name__ == "__main__":
    main()

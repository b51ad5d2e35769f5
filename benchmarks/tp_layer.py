"""One transformer layer's forward + backward split over tp = 1, 2, 4, 8 virtual ranks, against the same
layer computed unsplit on one rank: the ratio is the engine's overhead (communication copies, scheduling,
trace). Measured in one run; goal <= 1.5x at sizes where the arithmetic dominates.

    python benchmarks/tp_layer.py [--json] [--seq N] [--batch N] [--hidden N] [--heads N] [--sp] [--repeat N]
                                  [--tiny]

--tiny: s = 16, b = 1, h = 64, 8 heads, one sample (for tests/e2e/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import parasim
from parasim.nn import Saved, ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec


def timed_layer(t: int, shape: ModelSpec, s: int, b: int, sp: bool, repeat: int) -> float:
    """Median seconds of forward + backward over all ranks (weights and inputs made outside the timing)."""
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "tp") if ctx.world > 1 else None
        tp = ParallelContext(ctx, group, sp=sp and t > 1)
        layer = TransformerLayer(tp, shape, layer_weights(ctx, shape, "L"), key="L")
        x, dy = ctx.shared_rng("x").normal((s, b, shape.hidden)), ctx.shared_rng("dy").normal((s, b, shape.hidden))
        if tp.sp:
            x, dy = tp.shard(x, 0), tp.shard(dy, 0)
        times = []
        for _ in range(repeat):
            ctx.comm.barrier()
            start = time.perf_counter()
            y, cache = layer.forward(x, Saved())
            layer.backward(cache, dy)
            ctx.comm.barrier()  # the step ends when the last rank is done
            times.append(time.perf_counter() - start)
        return times
    # no time limit: the unsplit layer computes between two barriers, longer than 30 s on a loaded machine
    res = parasim.run(program, t, timeout=None)
    return statistics.median(res.values[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism too")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="s 16, b 1, h 64, one sample: for tests")
    args = ap.parse_args()
    if args.tiny:
        args.seq, args.batch, args.hidden, args.repeat = 16, 1, 64, 1
    shape = ModelSpec(hidden=args.hidden, heads=args.heads)
    # ranks run one after another in one process, so tp = t does the same arithmetic as tp = 1 in total
    base = timed_layer(1, shape, args.seq, args.batch, False, args.repeat)
    rows = {t: timed_layer(t, shape, args.seq, args.batch, args.sp, args.repeat) for t in (2, 4, 8)}
    result = {"shape": {"seq": args.seq, "batch": args.batch, "hidden": args.hidden, "heads": args.heads,
                        "sp": args.sp}, "unsplit_s": round(base, 4),
              "tp": {str(t): {"s": round(v, 4), "ratio": round(v / base, 3)} for t, v in rows.items()},
              "goal_ratio": 1.5}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"layer forward+backward, s={args.seq} b={args.batch} h={args.hidden} heads={args.heads}"
          f"{' +SP' if args.sp else ''}: unsplit {base * 1e3:.1f} ms")
    for t, r in result["tp"].items():
        print(f"  tp={t}: {r['s'] * 1e3:.1f} ms over all ranks, {r['ratio']:.2f}x the unsplit layer "
              f"(goal <= {result['goal_ratio']}x)")


if __name__ == "__main__":
    main()

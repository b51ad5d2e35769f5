"""Every layout that fits, ranked by the clock's step time (`parasim fit --search --by time`): the memory
model's search (estimate/fit.py) says which layouts hold the sequence; the clock's plan (clock/plan.py) times
each, and the held-out runs like it (clock/uncertainty.py) give its range."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..estimate.fit import enumerate_plans, longest
from ..layout import ModelSpec
from .plan import plan_time
from .uncertainty import held_out, step_range

# What a step's time goes to, as clock/plan.step_time reports it, in words a learner reads for the part that
# costs a losing layout most against the winner.
TIME_PARTS = {
    "compute": "compute on its slowest stage (products, attention, elementwise passes; recomputed ones and, on "
    "the last stage, the output layer included)",
    "bubble": "the pipeline's bubble (stages idle while it fills and drains)",
    "tp": "TP collectives not hidden",
    "cp": "CP's K/V ring not hidden",
    "ep": "the EP all-to-alls not hidden",
    "p2p": "pipeline sends not hidden",
    "dp": "the data-parallel gradient reduction not hidden",
    "gathers": "a sharded optimizer's weight gathers (ZeRO-3's, every micro-batch) not hidden",
    "optimizer": "the optimizer's pass over its state",
}


def time_parts(t: dict[str, Any]) -> dict[str, float]:
    """A step's time (clock/plan.step_time's answer) by TIME_PARTS, in seconds: they add up to the step."""
    mb, per = t["microbatches"], t["parts_per_microbatch_s"]
    compute = (per["matmul"] + per["attention"] + per["elementwise"] + per["logits"]) * mb
    return {
        "compute": compute,
        "bubble": t["bubble_s"],
        "tp": (per["tp"] - t["tp_hidden_s"]) * mb,
        "cp": (per["cp"] - t["cp_hidden_s"]) * mb,
        "ep": (per["ep"] - t["ep_hidden_s"]) * mb,
        "p2p": t["exposed_p2p_s"] * mb,
        "dp": t["exposed_grads_s"],
        "gathers": t["exposed_params_s"],
        "optimizer": t["optimizer_s"],
    }


def search_by_time(
    model: ModelSpec,
    nodes: range,
    usable: float,
    seq: int,
    global_batch: int,
    gpu: str,
    gpus_per_node: int = 8,
    top: int = 5,
    overlap: tuple[str, ...] = (),
    **choices: Any,
) -> dict[str, Any]:
    """Rank every layout on each node count that fits `seq` tokens (the memory model's longest sequence) and
    splits `global_batch` sequences evenly over its data-parallel replicas by the clock's step time on GPU type
    `gpu` (clock/plan.py): tokens per second per GPU, best first, ties to less sharding. For every layout
    after the first, what costs it most against the winner: the part of the step (TIME_PARTS) it spends the
    most seconds more on. Each step time carries the range the held-out runs like it measured
    (clock/uncertainty.py)."""
    table = held_out()
    plans = enumerate_plans(model, nodes, gpus_per_node, **choices)
    fits = np.floor(longest(model, plans, usable)) >= seq
    divides = global_batch % (plans.dp * plans.micro_batch) == 0
    out = []
    for n in nodes:
        rows = np.flatnonzero((plans.nodes == n) & fits & divides)
        timed = []
        for i in rows:
            plan = replace(
                plans.plan(int(i)),
                microbatches=global_batch // (int(plans.dp[i]) * plans.micro_batch),
                gpus_per_node=gpus_per_node,
            )
            t = plan_time(model, plan, seq, gpu, overlap)
            timed.append((t["tokens_per_s_per_gpu"], plan, t))
        timed.sort(key=lambda x: (-x[0], x[1].zero, x[1].rc, x[1].pp, x[1].cp, x[1].tp))
        ranked: list[dict[str, Any]] = []
        for k, (speed, plan, t) in enumerate(timed[:top]):
            row = {
                **plan.to_dict(),
                "step_s": t["step_s"],
                "tokens_per_s_per_gpu": speed,
                "mfu": t["mfu"],
                "parts_s": time_parts(t),
                "range": step_range(model, plan, gpu, table).to_dict(t["step_s"]),
            }
            if k:
                best = ranked[0]
                extra = {part: row["parts_s"][part] - best["parts_s"][part] for part in TIME_PARTS}
                worst = max(extra, key=lambda part: extra[part])
                row["loses"] = {
                    "slower": row["step_s"] / best["step_s"] - 1,
                    "most": worst,
                    "most_s": extra[worst],
                    "words": TIME_PARTS[worst],
                }
            ranked.append(row)
        out.append(
            {
                "nodes": n,
                "gpus": n * gpus_per_node,
                "layouts": int(len(rows)),
                "not_fitting": int(np.sum((plans.nodes == n) & ~fits)),
                "batch_not_dividing": int(np.sum((plans.nodes == n) & fits & ~divides)),
                "best": ranked[0] if ranked else None,
                "top": ranked,
            }
        )
    return {
        "model": model.name,
        "by": "time",
        "seq": seq,
        "global_batch": global_batch,
        "gpu": gpu,
        "usable": usable,
        "overlap": list(overlap),
        "layouts_tried": int(len(plans)),
        "nodes": out,
    }

"""The estimator's plan run as a training step on symbolic ranks, and the two held side by side item by item.

`parasim memory --symbolic` and `parasim fit --symbolic` print this; tests/unit/train/test_against.py holds it for the
post's nine longest-sequence rows. The step (train/step.py) keeps what its layers keep; the estimator
also counts parts the step has no code for (embeddings and the output layer, the logits, shared experts, a
gated MLP's third matrix) and spreads the model state evenly over the pipeline stages. Every difference
is named, and its size is worked out from the model's shapes, never typed in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..engine.runner import run as run_program
from ..errors import UsageError
from ..estimate.memory import Breakdown, Plan, breakdown, items
from ..estimate.fit import fit
from ..estimate.traffic import step_traffic
from ..layout import AXES, Layout, ModelSpec
from ..limits import check_symbolic_step
from ..nn.routing import Routing
from ..engine.symbolic.fold import cp_running, fold_of
from .differences import ACTIVATION_ITEMS, activation_parts, as_run, state_parts, traffic_parts
from .step import make_step
from ..comm.trace import Trace


def granule(plan: Plan) -> int:
    """Sequence lengths the step takes: whole zigzag halves of every CP slice, then whole SP shares."""
    return 2 * plan.cp * plan.tp


def running_note(plan: Plan, seq: int | None) -> str:
    """What a caller's progress line says before a symbolic step at real size runs (it takes seconds)."""
    at = f" at {seq:,} tokens" if seq else " at the estimator's longest sequence and one step longer"
    return f"running one training step on {plan.world:,} symbolic ranks (folded){at} ..."


def check_runs(model: ModelSpec, plan: Plan, routing: str = "balanced", seq: int | None = None) -> None:
    """One line of reason (UsageError) for a plan the step cannot carry out, a routing it cannot take, or a
    sequence length (when given) it cannot split."""
    if Routing.parse(routing).kind != "balanced" and model.experts:
        raise UsageError(
            f"routing {routing}: the step folds the ranks that do the same work, which needs "
            "balanced routing (every GPU routes alike)"
        )
    why = [
        w
        for bad, w in (
            (plan.zero != 1, f"ZeRO-{plan.zero} (the step shards the optimizer state: ZeRO-1)"),
            (plan.recompute == "selective", "selective recomputation (the step has none or full)"),
            (plan.micro_batch != 1, "micro-batches of several sequences (the step's hold one)"),
            (bool(model.experts) and plan.etp != 1, "expert TP on symbolic ranks"),
        )
        if bad
    ]
    if why:
        raise UsageError(f"the symbolic step cannot run {why[0]}")
    # what a step on symbolic ranks holds and does in seconds: a stage's micro-batches once per CP rank that runs
    check_symbolic_step(seq, plan.m, plan.pp, cp_running(plan))
    if seq is not None and seq % granule(plan):
        raise UsageError(f"the step needs a sequence length that is a multiple of {granule(plan)} (2 x cp x tp)")


def step_layout(model: ModelSpec, plan: Plan, seq: int) -> Layout:
    """The layout the step runs for `plan` at `seq` tokens."""
    check_runs(model, plan, seq=seq)
    dropout = 0.1 if as_run(plan).dropout else 0.0
    return Layout(
        tp=plan.tp,
        cp=plan.cp,
        pp=plan.pp,
        dp=plan.dp,
        ep=plan.ep,
        etp=plan.etp,
        sp=plan.sp,
        cp_comm=plan.cp_comm,
        model=replace(model, seq=seq, flash=plan.flash, dropout=dropout),
    )


def first_gpu(layout: Layout, stage: int) -> int:
    """The lowest rank of pipeline stage `stage`."""
    return min(c["rank"] for c in layout.coords() if c["pp"] == stage)


def run_plan(model: ModelSpec, plan: Plan, seq: int, gpu: int, routing: str = "balanced") -> Any:
    """One step of `plan` at `seq` tokens on symbolic ranks, folded around `gpu`: the run's trace."""
    layout = step_layout(model, plan, seq)
    program = make_step(layout, m=plan.m, routing=routing, recompute=plan.recompute)
    return run_program(
        program, layout.world, backend="symbolic", fold=fold_of(layout, around=gpu), precision=plan.precision
    ).trace


def compare(
    model: ModelSpec, plan: Plan, seq: int, routing: str = "balanced", stage: int | None = None, trace: Trace = None
) -> dict[str, Any]:
    """The estimate at `seq` and one symbolic step's GPU on `stage` (default: the one the estimate says
    binds, whose items `breakdown` gives), item by item:
    {"gpu", "stage", "rows": [{"item", "estimate", "run", "parts": {part: bytes}}], "traffic", "run_total",
    "estimate_total", "missing"} in bytes. Each row's parts (train/differences.py) are estimate minus run
    by cause; "missing": what the estimator counts in the model state and logits that the step has no code
    for (the sum of those rows' differences). `trace`: the step already run (`run_plan`, folded so that this
    stage's first GPU runs itself), when a caller compares several stages of one run."""
    est = breakdown(model, plan, seq)
    if stage is not None and stage != est.stage:  # the estimator's items of another stage
        got = {k: float(a + b * seq + c * seq * seq) for k, (a, b, c) in items(model, plan, stage).items()}
        est = Breakdown(model, plan, seq, stage, got)
    layout = step_layout(model, plan, seq)
    gpu = first_gpu(layout, est.stage)
    if trace is None:
        trace = run_plan(model, plan, seq, gpu, routing)
    held = trace.peak(gpu)["by_kind"]
    state = state_parts(model, plan, est.stage)
    rows = [
        {"item": k, "estimate": est.items[k], "run": held[k], "parts": state[k]}
        for k in ("weights", "gradients", "optimizer")
    ]
    ep_rank = layout.coords()[gpu]["ep"]
    rows.append(
        {
            "item": "activations (kept, in flight, recompute working set)",
            "estimate": sum(est.items[k] for k in ACTIVATION_ITEMS),
            "run": held["activations"],
            "parts": activation_parts(model, plan, seq, est.stage, routing, ep_rank),
        }
    )
    rows.append(
        {
            "item": "logits",
            "estimate": est.items["logits"],
            "run": 0,
            "parts": {"the step has no output layer": est.items["logits"]} if est.items["logits"] else {},
        }
    )
    missing = est.items["logits"] + sum(r["estimate"] - r["run"] for r in rows[:3])
    return {
        "gpu": gpu,
        "stage": est.stage,
        "seq": seq,
        "rows": rows,
        "traffic": _traffic(model, plan, seq, trace, layout, routing),
        "run_total": sum(held.values()),
        "estimate_total": est.total,
        "missing": missing,
    }


def _traffic(model: ModelSpec, plan: Plan, seq: int, trace: Trace, layout: Layout, routing: str) -> list[dict]:
    """Per (axis, collective): what the busiest GPU sent, at the plan's precision, against the estimator's
    `step_traffic` (its busiest stage), with the parts of the difference on the run's busiest GPU's stage
    (train/differences.py)."""
    sent = sent_by_axis(trace)
    est = step_traffic(model, plan, seq)
    coords = layout.coords()
    out = []
    for k in sorted({k for per in sent for k in per} | set(est)):
        rank, run = max(((r, per.get(k, 0.0)) for r, per in enumerate(sent)), key=lambda rv: (rv[1], -rv[0]))
        if not est.get(k) and not run:
            continue
        where = coords[rank]
        out.append(
            {
                "axis": k[0],
                "op": k[1],
                "estimate": est.get(k, 0.0),
                "run": run,
                "gpu": rank,
                "parts": traffic_parts(model, plan, seq, k, where["pp"], where["ep"], routing),
            }
        )
    return out


def sent_by_axis(trace: Trace, wire: float = 1.0) -> list[dict[tuple[str, str], float]]:
    """Per rank: bytes sent per (axis, collective), the estimator's axis names (dp for dp-cp, edp for
    expert-dp; other groups by their own name), times `wire` (1: the step at real size sends its values in
    the plan's precision)."""
    axis_of = {a.traffic: name for name, a in AXES.items() if a.traffic}  # layout/axes.py: dp-cp is "dp"
    sent: list[dict] = [{} for _ in range(trace.world)]
    for e in trace.events:
        if e.kind == "compute":
            continue
        key = (axis_of.get(e.group.name, e.group.name), e.op)
        for m in e.members:
            sent[m.rank][key] = sent[m.rank].get(key, 0.0) + m.sent * wire
    return sent


def fit_against_run(model: ModelSpec, plan: Plan, usable: float, routing: str = "balanced") -> dict[str, Any]:
    """The estimator's longest sequence for what the step runs (`as_run`), cut to a length the step takes,
    and the step run there and one granule longer: the run's GPU, plus what the estimator counts that the
    step has no code for, fits at the first and not at the second."""
    plan = as_run(plan)
    g = granule(plan)
    seq = int(fit(model, plan, usable).seq) // g * g
    if seq < g:
        raise UsageError("nothing fits: the model state alone exceeds the usable memory")
    out = {"plan": plan.label(), "usable": usable, "seq": seq, "granule": g, "lengths": []}
    for s in (seq, seq + g):
        c = compare(model, plan, s, routing)
        total = c["run_total"] + c["missing"]
        out["lengths"].append(
            {
                "seq": s,
                "run_total": c["run_total"],
                "missing": c["missing"],
                "total": total,
                "fits": total <= usable,
                "estimate_total": c["estimate_total"],
            }
        )
    return out

"""What the estimator counts and a step's GPU holds differ by, part by part, each part worked out from the
model's shapes (and, for MoE, the routing policy's own draws): train/against.py lays them beside the
run, and tests/unit/train/test_against.py holds that the parts add up to the difference exactly.

Model state. The estimator counts the model's shapes (attention, MLPs with all their matrices, shared
experts, the router, norm weights, embeddings; no biases), scales them to a stated total, and spreads them
evenly over the pipeline stages. A GPU of the step holds its stage's own layers: biases, whole norms
(weight and bias) and the router whole on every TP rank, two MLP matrices, no shared experts, no
embeddings. Activations. Per layer and local token, the estimator keeps each of a token's K routed copies
with K x (h + mats x expert width) values, plus shared experts and the gated MLPs' third matrix; the step's
GPU keeps the rows it received (a token once per GPU holding one of its picks) and two matrices' worth per
(token, expert) pair it works on.
"""

from __future__ import annotations

from dataclasses import replace

from ..estimate.memory import Plan, breakdown
from ..layout import ModelSpec
from ..nn.routing import Routing
from .step import layer_shape, stage_range

ACTIVATION_ITEMS = ("activations", "in-flight micro-batches", "recompute working set")


def as_run(plan: Plan) -> Plan:
    """The plan the step carries out: no dropout masks under CP (the engine models none there), and full
    recomputation re-runs one layer at a time (the estimator's default leaves room for two)."""
    return replace(plan, dropout=plan.dropout and plan.cp == 1, working_layers=1)


def state_values(model: ModelSpec, plan: Plan, stage: int) -> dict[str, tuple[float, float]]:
    """Estimator minus a GPU of `stage`, in parameter values, by part: (dense, expert) for each."""
    h, tp, ep, f, fe = model.hidden, plan.tp, plan.ep, model.ffn_size, model.expert_size
    counted = model.counted()
    shapes, routed = sum(counted.values()), counted["routed experts"]
    scale = model.total_params() / shapes
    d = h // model.heads
    kv_local = (model.kv // tp if model.kv >= tp else 1) * d  # kv heads split over TP, or copied when fewer
    bare = h * (h // tp + 2 * kv_local) + (h // tp) * h  # a TP rank's Q, K, V and output matrices
    biases = h // tp + 2 * kv_local + h if model.bias else 0  # theirs (the output's whole on every rank)
    out: dict[str, list[float]] = {}

    def add(part: str, dense: float, experts: float = 0.0) -> None:
        was = out.setdefault(part, [0.0, 0.0])
        was[0] += dense
        was[1] += experts

    add(
        "even spread over stages",
        (shapes - routed - counted["embeddings"]) / (tp * plan.pp),
        routed / (plan.etp * ep * plan.pp),
    )
    add("embeddings and output layer", counted["embeddings"] / (tp * plan.pp))
    add(
        "stated count against the shapes",
        (scale - 1) * (shapes - routed) / (tp * plan.pp),
        (scale - 1) * routed / (plan.etp * ep * plan.pp),
    )
    for i in stage_range(model, plan.pp, stage):
        moe = bool(layer_shape(model, i).experts)
        # the estimator's own count of this layer comes off its even spread: what is left is the spread's
        mlp = (
            model.experts * h + model.shared_experts * model.mlp_params(model.shared_size)
            if moe
            else model.mlp_params(f)
        )
        add(
            "even spread over stages",
            -(model.attention_params() + 2 * h + mlp) / tp,
            -model.experts * model.mlp_params(fe) / (plan.etp * ep) if moe else 0.0,
        )
        add("kv heads copied over TP", -(bare - model.attention_params() / tp))
        add("norms: whole on every TP rank, with biases", 2 * h / tp - 2 * h * (2 if model.norm == "layernorm" else 1))
        add("biases (the estimator counts none)", -biases)
        if moe:
            add("biases (the estimator counts none)", 0.0, -(model.experts // ep) * (fe + h if model.bias else 0))
            add("router: whole on every TP rank", model.experts * h / tp - model.experts * h)
            add("shared experts (the step has none)", model.shared_experts * model.mlp_params(model.shared_size) / tp)
        else:
            add("biases (the estimator counts none)", -((f // tp + h) if model.bias else 0))
        if model.gated:
            add(
                "gated MLPs' third matrix (the step's MLPs have two)",
                0.0 if moe else h * f / tp,
                model.experts * h * fe / (plan.etp * ep) if moe else 0.0,
            )
    return {k: (v[0], v[1]) for k, v in out.items() if v[0] or v[1]}


def held_values(model: ModelSpec, plan: Plan, values: dict[str, tuple[float, float]]) -> tuple[int, int]:
    """The run's GPU's (dense, expert) values: the estimator's even share (its `items`: the model's stated
    total, experts over etp x ep x pp, the rest over tp x pp) less the parts `state_values` found."""
    experts = model.expert_params()
    even = ((model.total_params() - experts) / (plan.tp * plan.pp), experts / (plan.etp * plan.ep * plan.pp))
    return round(even[0] - sum(d for d, _ in values.values())), round(even[1] - sum(e for _, e in values.values()))


def state_parts(model: ModelSpec, plan: Plan, stage: int) -> dict[str, dict]:
    """Bytes by part for weights, gradients and the optimizer (ZeRO-1: dense values over dp x cp, expert
    values over expert-dp, each share padded to equal size)."""
    values = state_values(model, plan, stage)
    shard_d, shard_e = plan.dp * plan.cp, plan.edp
    dt = plan.dtypes
    out = {
        "weights": {k: dt.weight_bytes * (d + e) for k, (d, e) in values.items()},
        "gradients": {k: dt.grad_bytes * (d + e) for k, (d, e) in values.items()},
        "optimizer": {k: dt.optimizer_bytes * (d / shard_d + e / shard_e) for k, (d, e) in values.items()},
    }
    # ZeRO-1 pads each flat buffer (one per gradient group) to a multiple of its group
    pad = sum(-n % g / g for n, g in zip(held_values(model, plan, values), (shard_d, shard_e)) if n)
    if pad:
        out["optimizer"]["ZeRO-1 pads each share to equal size"] = -dt.optimizer_bytes * pad
    return out


def received(model: ModelSpec, plan: Plan, routing: str, tokens: int, ep_rank: int) -> tuple[int, int]:
    """(rows, pairs) EP rank `ep_rank` receives in one MoE layer's dispatch when every EP rank routes
    `tokens` by `routing` (the policy's own draws, as the run's receivers work them out)."""
    policy, per = Routing.parse(routing), model.experts // plan.ep
    rows = pairs = 0
    for src in range(plan.ep):  # a balanced policy draws alike for every sender; the others by their rank
        picks = policy.choose("moe#0", src, src * tokens, tokens, model.experts, model.top_k)
        mine = (picks // per) == ep_rank
        rows += int(mine.any(axis=1).sum())
        pairs += int(mine.sum())
    return rows, pairs


def activation_parts(
    model: ModelSpec, plan: Plan, seq: int, stage: int, routing: str = "balanced", ep_rank: int = 0
) -> dict[str, float]:
    """Estimator minus a GPU of `stage`, in activation bytes at its peak, by part (the plan as given: parts
    for dropout under CP and the recompute room are the estimator's own items at the plan the run does)."""
    h, tp, fe, k = model.hidden, plan.tp, model.expert_size, model.top_k
    v = plan.dtypes.bytes("activations")  # an activation value's bytes
    x = tp if plan.sp else 1
    tokens = seq * plan.micro_batch // plan.cp  # a GPU's tokens of one micro-batch (before SP)
    full = plan.recompute == "full"
    held = 1 if full else min(plan.pp - stage, plan.m)  # micro-batches whose layers' activations count
    layers = list(stage_range(model, plan.pp, stage))
    kinds = sorted({bool(layer_shape(model, i).experts) for i in layers})
    if full:  # only one layer's working set differs: the kind the estimator sizes it by (the larger)
        layers = [next(i for i in layers if bool(layer_shape(model, i).experts) == kinds[-1])]
    out: dict[str, float] = {}

    def add(part: str, nbytes: float) -> None:
        if nbytes:
            out[part] = out.get(part, 0.0) + nbytes

    for i in layers:
        if layer_shape(model, i).experts:
            rows, pairs = received(model, plan, routing, tokens // x, ep_rank)
            add(
                "dispatched rows: K copies a token in the estimate, once per GPU in the run",
                held * v * h * (k * tokens / x - rows),
            )
            add(
                "expert pairs: K per token in the estimate, the pairs received in the run",
                held * v * 2 * fe / plan.etp * (k * tokens / x - pairs),
            )
            if model.gated:
                add("gated MLPs' third matrix (the step's MLPs have two)", held * v * k * tokens / x * fe / plan.etp)
            add(
                "shared experts (the step has none)",
                held * v * model.mlp_mats * model.shared_experts * model.shared_size * tokens / tp,
            )
        elif model.gated:
            add("gated MLPs' third matrix (the step's MLPs have two)", held * v * model.ffn_size * tokens / tp)
    as_given, as_ran = (sum(breakdown(model, p, seq).items[i] for i in ACTIVATION_ITEMS) for p in (plan, as_run(plan)))
    if plan.dropout and plan.cp > 1:
        no_masks = sum(breakdown(model, replace(plan, dropout=False), seq).items[i] for i in ACTIVATION_ITEMS)
        add("dropout masks under CP (the engine models none)", as_given - no_masks)
        as_given = no_masks
    add(f"room to re-run {plan.working_layers} layers at once (the step re-runs one)", as_given - as_ran)
    return out


def traffic_parts(
    model: ModelSpec, plan: Plan, seq: int, key: tuple[str, str], stage: int, ep_rank: int, routing: str = "balanced"
) -> dict[str, float]:
    """Estimator minus the run, in bytes at the plan's precision one GPU of `stage` sends per step over (axis,
    collective), by part: the data-parallel sums move the model state (so its parts), the EP all-to-alls
    move rows."""
    from ..estimate.traffic import ring

    axis, op = key
    dt = plan.dtypes
    if axis in ("dp", "edp") and op in ("reduce_scatter", "all_gather"):
        i, group = (0, plan.dp * plan.cp) if axis == "dp" else (1, plan.edp)
        each = dt.bytes("grad_reduce" if op == "reduce_scatter" else "compute")  # gradients reduced, weights gathered
        values = state_values(model, plan, stage)
        out = {k: ring(op, each * v[i], group) for k, v in values.items() if v[i]}
        pad = -held_values(model, plan, values)[i] % group  # ZeRO-1's padding moves too
        if pad:
            out["ZeRO-1 pads each share to equal size"] = -ring(op, each * pad, group)
        return out
    if key != ("ep", "all_to_all") or not model.experts or plan.ep == 1:
        return {}
    x = plan.tp if plan.sp else 1
    tokens = seq * plan.micro_batch // plan.cp // x  # a GPU's routed tokens per micro-batch
    policy, per = Routing.parse(routing), model.experts // plan.ep
    picks = policy.choose("moe#0", ep_rank, ep_rank * tokens, tokens, model.experts, model.top_k) // per
    away = int(sum(len(set(row) - {ep_rank}) for row in picks.tolist()))  # rows sent to other GPUs
    layers = [i for i in stage_range(model, plan.pp, stage) if layer_shape(model, i).experts]
    times = len(layers) * plan.m
    forwards = 2 if plan.recompute == "full" else 1  # a recomputed forward dispatches and combines again
    copies = tokens * model.top_k * (plan.ep - 1) / plan.ep  # the estimate's rows away: every pick, uniformly
    # toward the experts (the dispatch, and backward its outputs' gradients) in the dispatch's dtype, home (the
    # combine, and backward the tokens' and gates' gradients) in the combine's
    out, home = dt.bytes("dispatch"), dt.bytes("combine")
    return {
        "a token goes once per GPU holding its picks (the estimate sends each of its K copies)": times
        * (forwards + 1)
        * (out + home)
        * model.hidden
        * (copies - away),
        "the gates ride with the dispatched rows and their gradients (E/ep values a row)": -times
        * (forwards * out + home)
        * per
        * away,
    }

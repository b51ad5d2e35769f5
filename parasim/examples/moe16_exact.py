"""A split run of the moe16 example held to its one-device step (examples/moe16_unsplit.py): the loss, and
every gradient and every weight after Adam as sums of squares, one copy of each weight added up from the
ranks that hold its pieces (a fingerprint that rounding barely moves)."""

from __future__ import annotations

from typing import Any

from ..engine.virtual import run_virtual
from ..nn import ParallelContext, Shard
from ..nn.layer import TransformerLayer, layer_weights
from .moe16 import MICRO_BATCHES, replicas
from .moe16_unsplit import unsplit_run


def whole_over_tp(model: Any) -> set[str]:
    """The weights every TP rank holds whole (their gradients summed in-layer under SP), as the layers'
    placements declare them: one layer of the example built on a TP pair."""

    def program(ctx):
        pair = ctx.new_group([0, 1], "tp")
        # no EP group: the experts' placements name no tp, and a pair would refuse a model of one expert
        layer = TransformerLayer(ParallelContext(ctx, pair, sp=True), model, layer_weights(ctx, model, "L0"))
        return {k for k, p in layer.placements.items() if "tp" in p and not isinstance(p["tp"], Shard)}

    return run_virtual(program, 2).values[0]


def _take(c: dict, key: str, whole: bool, replicated_names: set[str]) -> bool:
    """Which ranks' numbers add up to one copy of a weight: attention shards from both TP ranks, replicated
    weights from TP rank 0, experts from their owner; `whole`: each rank has the whole (gathered) weight,
    so one DP/CP copy is enough; else each rank has its ZeRO share, and a copy's shares are summed."""
    replicated = key.split(".", 1)[1] in replicated_names  # 'L3.ln1.weight' -> 'ln1.weight'
    if ".expert" in key:
        return c["edp"] == 0 if whole else True
    return (c["tp"] == 0 or not replicated) and (not whole or (c["dp"] == 0 and c["cp"] == 0))


def fingerprint(values: list[dict], field: str, whole: bool, model: Any) -> dict[str, float]:
    """One copy of every weight's sum of squares, added up from the ranks that hold its pieces."""
    out: dict[str, float] = {}
    replicated = whole_over_tp(model)
    for v in values:
        for k, g in v[field].items():
            if _take(v["coords"], k, whole, replicated):
                out[k] = out.get(k, 0.0) + g
    return out


def agree(got: dict, ref: dict, rtol: float) -> str:
    """How many of the reference's fingerprints `got` matches (relative `rtol`), in the words checks show."""
    n = sum(abs(got[k] - g) <= rtol * max(1.0, abs(g)) for k, g in ref.items())
    return f"{n} of {len(ref)} weights"


def exactness(
    values: list[dict], layout: Any, m: int = MICRO_BATCHES, routing: str = "learned", max_norm: float | None = None
) -> dict:
    """A run of `make_program(.., layout, m, max_norm=..)` against the unsplit model over the same sequences:
    the loss, and every gradient and every weight after Adam (sums of squares, relative 1e-9)."""
    model, seqs = layout.model, [s for rep in replicas(layout.dp, m) for s in rep]
    ref = run_virtual(lambda ctx: unsplit_run(ctx, model, seqs, routing, max_norm), 1).values[0]
    # each token's loss once: on the last stage, from one TP rank unless SP split the tokens between them
    loss = sum(v["loss"] for v in values if v["last"] and (layout.sp or v["coords"]["tp"] == 0))
    grads = agree(fingerprint(values, "grad_sq", False, model), ref["grad_sq"], 1e-9)
    weights = agree(fingerprint(values, "weight_sq", True, model), ref["weight_sq"], 1e-9)
    every = f"{len(ref['grad_sq'])} of {len(ref['grad_sq'])} weights"
    return {
        "loss": loss,
        "unsplit_loss": ref["loss"],
        "gradients": grads,
        "weights_after_adam": weights,
        "exact": abs(loss - ref["loss"]) <= 1e-12 * max(1.0, abs(ref["loss"])) and grads == every and weights == every,
    }

"""How a model's layers sit on its pipeline stages: one rule, and one function (`stage_span`) that every
reader asks "which layers does stage i hold": the layout's check, the estimator's memory and its search, the
clock's step time, the bytes a step sends and the engine's training step.

The rules (`Stages`), as Megatron-Core builds its stages (megatron/core/transformer/transformer_block.py,
`get_num_layers_to_build`, and the checks in transformer_config.py's `__post_init__`, read from its
source; this is our own code):
- even (the default): the layers divide by pp, every stage the same; Megatron refuses anything else
  ("Number of layers should be divisible by the pipeline-model-parallel size").
- first and/or last (`--decoder-first-pipeline-num-layers N`, `--decoder-last-pipeline-num-layers M`): the
  first (last) stage holds N (M) layers, each more than 0; the rest split evenly over the middle stages,
  which must divide them, and middle layers need middle stages and the other way round.
- embedding and/or loss (`--account-for-embedding-in-pipeline-split`, `--account-for-loss-in-pipeline-split`):
  the embedding (the loss) counts as one more layer in an even split, so the first (last) stage holds one
  layer fewer; layers plus those must divide by pp. Megatron takes these or first/last, never both.
- counts: each stage's layers listed (Megatron's `--pipeline-model-parallel-layout`, summed over a rank's
  virtual stages, or parasim's `--stage-layers`): pp entries summing to the layers.
- spread: as even as can be, the first L mod pp stages one layer more (61 over 16: thirteen stages of 4,
  three of 3). Not a Megatron rule: the DeepSeek-V3 preset's split, and a Hugging Face config's when its
  layers do not divide by pp.
parasim also needs a layer on every stage, so pp is at most the layers (Megatron lets a stage of the
embedding alone hold none).

Every function takes `pp` and `stage` as numbers or numpy arrays alike: the search (estimate/fit.py) asks
for a column of layouts at once.
"""

from __future__ import annotations

import numpy as np

from ..errors import LayoutError
from .model import SPREAD, STAGE_LIST_MAX, ModelSpec, Stages

Ints = int | np.ndarray  # a whole number, or a numpy array of them (a column of layouts)


def check_stages(model: ModelSpec, pp: int) -> None:
    """Raise LayoutError, in words that name the rule, when `model`'s layers cannot sit on `pp` stages by
    its rule; every stage must hold at least one layer."""
    rule, layers = model.stages, model.size("layers")
    if pp > layers:
        raise LayoutError(f"pp {pp} exceeds layers {layers}: every stage needs a layer")
    rule.check_layers(layers)
    if rule.counts is not None:
        if len(rule.counts) != pp:
            raise LayoutError(
                f"the stage list has {len(rule.counts)} entries ({_listed(rule.counts)}), pp is {pp}: "
                "give one per stage"
            )
        return
    if rule.first is not None or rule.last is not None:
        ends = int(rule.first is not None) + int(rule.last is not None)
        middle, mid_layers = pp - ends, layers - (rule.first or 0) - (rule.last or 0)
        if middle < 0:
            raise LayoutError(f"layers on the first and on the last stage need 2 stages or more, pp is {pp}")
        if bool(middle) != bool(mid_layers):  # Megatron: "Mismatch: N middle layers remaining but M middle PP stages"
            raise LayoutError(
                f"{mid_layers} layers are left for {middle} middle stages (pp {pp} less the first/last "
                f"stage's): Megatron needs middle layers and middle stages together, or neither"
            )
        if middle and mid_layers % middle:
            raise LayoutError(
                f"the {mid_layers} middle layers do not divide by the {middle} middle stages "
                "(Megatron splits the layers between the first and last stage evenly)"
            )
        return
    if rule.embedding or rule.loss:
        counted = layers + int(rule.embedding) + int(rule.loss)
        what = " and ".join(w for w, on in (("the embedding", rule.embedding), ("the loss", rule.loss)) if on)
        if counted % pp:  # (with pp at most the layers, each stage keeps a layer: (L + 1) / pp is 2 or more)
            raise LayoutError(f"layers {layers} plus {what} ({counted}) do not divide by pp {pp}")
        return
    if not rule.spread and layers % pp:
        raise LayoutError(
            f"layers {layers} do not divide by pp {pp} (say how they sit on the stages: "
            "--first-stage-layers/--last-stage-layers, or --stage-layers)"
        )


def _listed(counts: tuple[int, ...]) -> str:
    shown = ",".join(str(c) for c in counts[:8])
    return shown + (",..." if len(counts) > 8 else "")


def _ends(rule: Stages, layers: int, pp: Ints) -> tuple[Ints, Ints, Ints, Ints]:
    """(first stage's layers, a middle stage's, the last stage's, the middle stages that take one more) under
    a rule other than a list: a middle stage i holds `per + (i < extra)`."""
    pp = np.asarray(pp)
    if rule.first is not None or rule.last is not None:
        ends = int(rule.first is not None) + int(rule.last is not None)
        per = (layers - (rule.first or 0) - (rule.last or 0)) // np.maximum(pp - ends, 1)
        head = per if rule.first is None else rule.first + 0 * pp
        tail = per if rule.last is None else rule.last + 0 * pp
        return head, per, tail, 0 * pp
    if rule.embedding or rule.loss:
        per = (layers + int(rule.embedding) + int(rule.loss)) // pp
        return per - int(rule.embedding), per, per - int(rule.loss), 0 * pp
    per, extra = layers // pp, layers % pp  # even, or spread (the first `extra` stages take one more)
    return per + (extra > 0), per, per, extra


def stage_span(model: ModelSpec, pp: Ints, stage: Ints) -> tuple[Ints, Ints]:
    """(index of the first layer, number of layers) of pipeline stage `stage` (0-based) of `pp`: the one
    answer to "which layers does stage i hold". `pp` and `stage` may be numpy arrays (a column of layouts)."""
    rule, layers = model.stages, model.size("layers")
    s, p = np.asarray(stage), np.asarray(pp)
    if rule.counts is not None:
        cuts = np.concatenate([[0], np.cumsum(rule.counts)])
        i = np.clip(s, 0, len(rule.counts) - 1)
        return cuts[i], cuts[i + 1] - cuts[i]
    head, per, tail, extra = _ends(rule, layers, p)
    if rule.embedding or rule.loss:  # a single stage gives up a layer for each
        n = per - int(rule.embedding) * (s == 0) - int(rule.loss) * (s == p - 1)
        return np.where(s == 0, 0, s * per - int(rule.embedding)), n
    n = per + (s < extra)
    if rule.first is not None:
        n = np.where(s == 0, head, n)
    if rule.last is not None:  # Megatron's order: a single stage that is first and last takes the last's count
        n = np.where(s == p - 1, tail, n)
    start = np.where(s == 0, 0, head + (s - 1) * per + np.maximum(np.minimum(s, extra) - 1, 0))
    return start, n


def stage_counts(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """Every stage's layers, first to last, after the rule's check."""
    check_stages(model, pp)
    _, n = stage_span(model, pp, np.arange(pp))
    return tuple(int(x) for x in np.asarray(n))


def stage_layers(model: ModelSpec, pp: Ints, stage: Ints) -> tuple[Ints, Ints]:
    """(dense layers, MoE layers) on `stage`: the model's dense layers come first (its `dense_layers`, or
    every layer of a dense model)."""
    start, n = stage_span(model, pp, stage)
    dense_n = model.size("layers") - model.moe_layers
    dense_here = np.clip(dense_n - start, 0, n)
    return dense_here, n - dense_here


def stage_of_layer(model: ModelSpec, pp: Ints, layer: Ints) -> Ints:
    """The stage (0-based) that holds layer `layer` (a layer past the last: the last stage)."""
    rule, p, d = model.stages, np.asarray(pp), np.asarray(layer)
    if rule.counts is not None:
        return np.minimum(np.searchsorted(np.cumsum(rule.counts), d, side="right"), len(rule.counts) - 1)
    head, per, _, extra = _ends(rule, model.size("layers"), p)
    wide = np.maximum(extra - 1, 0)  # middle stages before the spread's boundary hold per + 1
    past = np.maximum(d - head, 0)
    in_wide = past < wide * (per + 1)
    mid = np.where(in_wide, past // (per + 1), wide + (past - wide * (per + 1)) // np.maximum(per, 1))
    return np.minimum(np.where(d < head, 0, 1 + mid), p - 1)


def alike_starts(model: ModelSpec, pp: Ints) -> list[Ints]:
    """Stages to look at for whatever differs between stages: the first stage of every run of stages that
    hold alike layers (as many, with the same mix of dense and MoE), and the last (with the logits). Later
    stages of a run hold fewer micro-batches in flight under 1F1B, so they never need more. A list of stage
    indices (arrays for a column of layouts; some may repeat)."""
    rule, p = model.stages, np.asarray(pp)
    if rule.counts is not None:
        return [np.minimum(i, p - 1) for i in range(len(rule.counts))]
    _, _, _, extra = _ends(rule, model.size("layers"), p)
    first_moe = model.size("layers") - model.moe_layers
    boundary = stage_of_layer(model, p, first_moe)  # the stage of the first MoE layer: mixed, or all MoE
    after = np.where(stage_span(model, p, boundary)[0] < first_moe, np.minimum(boundary + 1, p - 1), boundary)
    starts = [0 * p, boundary, after, p - 1]
    if rule.first is not None or rule.embedding:  # the second stage starts the even middle
        starts.append(np.minimum(1, p - 1))
    if rule.spread:  # the first stage of the ones that take no extra layer
        starts.append(np.minimum(extra, p - 1))
    return starts


def most_layers(model: ModelSpec, pp: int) -> int:
    """The stage (0-based) holding the most layers, of those the most MoE layers, the earliest of equals:
    the stage whose layers send the most (estimate/traffic.py's step)."""

    def size(stage: int) -> tuple[int, int, int]:
        dense_n, moe_n = (int(x) for x in stage_layers(model, pp, stage))
        return dense_n + moe_n, moe_n, -stage

    return max({int(s) for s in alike_starts(model, pp)}, key=size)


def describe(counts: tuple[int, ...]) -> str:
    """Stage counts in words, runs in stage order: "61 layers over 16 stages: 13 stages of 4, 3 of 3"."""
    runs: list[list[int]] = []
    for c in counts:
        if runs and runs[-1][1] == c:
            runs[-1][0] += 1
        else:
            runs.append([1, c])
    parts = [
        f"{k} {'stage' if k == 1 else 'stages'} of {c}" if i == 0 else f"{k} of {c}" for i, (k, c) in enumerate(runs)
    ]
    head = f"{sum(counts):,} layers over {len(counts)} stage{'s' if len(counts) != 1 else ''}"
    return head + (": " + ", ".join(parts) if len(runs) > 1 else f": {counts[0]} each")


def is_uneven(counts: tuple[int, ...]) -> bool:
    return len(set(counts)) > 1


__all__ = [
    "Stages",
    "SPREAD",
    "STAGE_LIST_MAX",
    "check_stages",
    "stage_span",
    "stage_counts",
    "stage_layers",
    "stage_of_layer",
    "alike_starts",
    "most_layers",
    "describe",
    "is_uneven",
]

"""`parasim fit --search`'s answer as a value: every layout on each node count ranked, by the longest sequence
it holds (`search_report`) or by the step's time at a given sequence and batch (`time_search_report`), with the
unit and what was read to make the model. `SearchReport.to_dict` is the command's --json."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..clock.fastest import search_by_time
from ..estimate.fit import search
from ..estimate.memory import Plan
from ..layout import ModelSpec
from ..layout.stages import is_uneven, stage_counts
from ..megatron.args import as_dict
from .fit import fit_seq
from .query import Sources, Units


@dataclass(frozen=True)
class SearchQuery:
    """Which layouts to rank: `model` on each count of `nodes` (nodes of `gpus_per_node` GPUs, `usable` bytes a
    GPU), the `top` best of each kept, the training choices held fixed while every layout is tried (`choices`:
    zero, recompute, flash, dropout, micro_batch, chunked_loss, precision and the framework's kernels; a choice
    left out is tried each way), the unit to report in and what was read to make the model."""

    model: ModelSpec
    nodes: range
    usable: float
    choices: dict[str, Any] = field(default_factory=dict)
    gpus_per_node: int = 8
    top: int = 5
    units: Units = Units()
    sources: Sources = Sources()


@dataclass(frozen=True)
class SearchReport:
    """The ranked layouts of `query`, as --json writes them (`to_dict`): per node count, the best and the rest."""

    query: SearchQuery
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.data


def _stages_said(result: dict[str, Any], model: ModelSpec) -> None:
    """Each ranked row whose stages hold unlike numbers of layers says how many each holds."""
    for row in result["nodes"]:
        for r in row["top"]:
            counts = stage_counts(model, r["pp"])
            if is_uneven(counts):
                r["stage_layers"] = list(counts)


def searched_plan(best: dict[str, Any], q: SearchQuery) -> Plan:
    """A layout the search ranked, as the plan it was, on its node count; its sequence for a job (`seq_length`:
    the longest it holds, rounded down to what its layout splits evenly) set in `best`."""
    # a ranked row holds the Plan's own fields (Plan.to_dict's) beside its label and length: those make it a plan
    # again; what the search held fixed for every row comes from the query
    given = {f.name for f in fields(Plan) if f.init} & best.keys() - {"dropout", "gpus_per_node"}
    plan = Plan(
        **{k: best[k] for k in sorted(given)}, dropout=q.choices.get("dropout", True), gpus_per_node=q.gpus_per_node
    ).check(q.model)
    best["seq_length"] = fit_seq(best["max_seq_tokens"], plan)
    return plan


def _with_query(result: dict[str, Any], q: SearchQuery) -> dict[str, Any]:
    result["usable"] = q.usable / q.units.size
    result["unit"] = q.units.name
    result.update(q.sources.to_dict())
    return result


def search_report(q: SearchQuery, written: bool = False) -> SearchReport:
    """Every layout ranked by the longest sequence it holds; with `written`, each node count's best as the
    Megatron-LM job that runs it (at its `seq_length`)."""
    model = q.model
    result = _with_query(search(model, q.nodes, q.usable, q.gpus_per_node, q.top, **q.choices), q)
    _stages_said(result, model)
    if written:
        for row in result["nodes"]:
            best = row["best"]
            if best is not None and best["max_seq_tokens"]:
                plan = searched_plan(best, q)
                best["megatron_args"] = as_dict(model, plan, best["seq_length"], (), q.sources.megatron)
    return SearchReport(q, result)


def time_search_report(
    q: SearchQuery, seq: int, global_batch: int, gpu: str, overlap: tuple[str, ...] = ()
) -> SearchReport:
    """The layouts that hold `seq` tokens and split `global_batch` sequences evenly, ranked by the step's time on
    GPU type `gpu` (a key of the hardware table) with the `overlap` switches on, and what costs each most."""
    model = q.model
    result = search_by_time(
        model, q.nodes, q.usable, seq, global_batch, gpu, q.gpus_per_node, q.top, overlap, **q.choices
    )
    _stages_said(result, model)
    return SearchReport(q, _with_query(result, q))

"""The clock's MoE layer (clock/plan.moe_block: router, experts, shared experts, activation, permutation, the EP
all-to-alls) against a measured one: Megatron-Core's MoE-layer performance test, one MoELayer timed alone on an
H100 of an EP 8 group. A layer measured by itself is a kernel-level measurement, not a training run, so it
checks the MoE items the plan adds up without any run of clock/runs.py shaping them.

The test's cases (moe_layer.json, read as the source prints them) differ in the model (a Mixtral-like layer
and a DeepSeek-like one with group-limited routing), the precision (BF16, FP8 with blockwise scaling) and the
token dispatcher (estimate/dispatch.py): NCCL's all-to-all ("alltoall", every top-k copy of a token sent on its
own), and DeepEP and HybridEP, which send a token once to each GPU that holds one of its experts. Each case is
timed with its own dispatcher, and what a dispatcher saves over "alltoall" is given both measured and timed.

The EP all-to-all is also held alone against a second measurement, across nodes as well as inside one: Table 7 of
NVIDIA's Megatron Core MoE report (moe_layer.json "all_to_all", A2A_SOURCE), NCCL's all-to-all dispatch and
combine at EP 8 to 64 on H100s, timed by the same function a step's EP time comes from (plan.ep_seconds).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..estimate.kernels import Source
from ..estimate.memory import Plan
from ..layout import ModelSpec
from ..limits import read_json
from .costs import machine
from .plan import ep_seconds, moe_block
from .runs import UNITS

DATA = Path(__file__).resolve().parent / "moe_layer.json"
GPUS_PER_NODE = 8  # an H100 node of the report's: EP 16-64 spans 2-8 of them
SOURCE = Source(
    "NVIDIA Megatron-LM, MoE-layer performance test (tests/functional_tests/test_cases/common/moe_perf)",
    "https://github.com/NVIDIA/Megatron-LM/tree/main/tests/functional_tests/test_cases/common/moe_perf",
    "baseline.json (forward_ms, backward_ms) and test_cases.py, added in commit cf39a4dd (2025-12-16, 'Add moe "
    "layer perf UT. (#2673)'), unchanged at d98e8a64; read 2026-12-05",
    "one H100 (the device name matched; SXM or PCIe not recorded) of an EP 8 group, TP 1, 4,096 tokens a rank, "
    "routing forced to balance, fused router and permutation, TransformerEngine grouped GEMM; the mean of 20 "
    "CUDA-event timed iterations after 5 warm-ups",
)
A2A_SOURCE = Source(
    "NVIDIA, Scalable Training of Mixture-of-Experts Models with Megatron Core (technical report, arXiv 2603.07685)",
    "https://arxiv.org/abs/2603.07685",
    "section 4.2.2, Table 7 'EP Scaling Performance for HybridEP and all-to-all (in µs)', the H100 columns; read "
    "2026-12-05 in the report's 88-page text",
    "H100s, EP 8 (one node) to 64, hidden size 7168, sequence length 4096, 256 experts; 'communication latency "
    "only'; top-k, dtype and tokens a GPU not stated (taken as 8, BF16 and 4,096)",
)
BASE = "alltoall"  # the dispatcher the others are held against
PRECISION_OF_FP8 = {None: "megatron-bf16", "blockwise": "megatron-bf16-fp8-blockwise"}  # the case's fp8 -> the entry


@dataclass(frozen=True)
class LayerCase:
    """One measured case: the layer, the dispatcher, the FP8 recipe (None: BF16) and the milliseconds."""

    case: str
    model: str
    dispatcher: str
    fp8: str | None
    forward_ms: float
    backward_ms: float


def _data() -> dict[str, Any]:
    return read_json(DATA.read_bytes(), DATA.name, "the MoE-layer measurements")


def cases() -> list[LayerCase]:
    """Every measured case, in the file's order."""
    return [
        LayerCase(t["case"], t["model"], t["dispatcher"], t["fp8"], t["forward_ms"], t["backward_ms"])
        for t in _data()["tables"]
    ]


def proxy(name: str) -> ModelSpec:
    """The test's layer `name` as a model of one MoE layer (attention's shapes do not enter the MoE block)."""
    c = _data()["models"][name]
    h, shared = c["hidden_size"], c["moe_shared_expert_intermediate_size"]
    return ModelSpec(
        name=f"{name}-proxy",
        layers=1,
        hidden=h,
        heads=8,
        vocab=32000,
        ffn=c["moe_ffn_hidden_size"],
        experts=c["num_experts"],
        top_k=c["router_topk"],
        expert_ffn=c["moe_ffn_hidden_size"],
        shared_experts=1 if shared else 0,
        shared_expert_ffn=shared,
        gated=True,
        act="swiglu",
        norm="rmsnorm",
        bias=False,
        expert_groups=c["moe_router_num_groups"],
        groups_kept=c["moe_router_group_topk"],
    )


def plan_of(case: LayerCase) -> Plan:
    """The case's layout: one EP group of the test's size, TP 1, the test's tokens as one sequence, its
    dispatcher."""
    d = _data()
    return Plan(
        tp=d["tp"],
        ep=d["ep"],
        dp=d["ep"],
        micro_batch=1,
        dropout=False,
        precision=PRECISION_OF_FP8[case.fp8],
        dispatcher=case.dispatcher,
    )


def _error(measured: float, predicted: float) -> float:
    """+ means parasim's layer is faster than the measured one: a time's error as `validate step-time` reads it."""
    return UNITS["s per step"].error(measured, predicted)


def rows() -> list[dict[str, Any]]:
    """Every case with parasim's forward and backward milliseconds and their items, and for a dispatcher other
    than "alltoall" what it saves over "alltoall" of the same layer and precision, measured and timed."""
    d = _data()
    m = machine(d["gpu"], d["ep"])
    out: list[dict[str, Any]] = []
    for c in cases():
        items = moe_block(proxy(c.model), plan_of(c), d["tokens"], m)
        fwd = sum(f for f, _ in items.values()) * 1e3
        bwd = sum(b for _, b in items.values()) * 1e3
        out.append(
            {
                "case": c.case,
                "model": c.model,
                "dispatcher": c.dispatcher,
                "precision": PRECISION_OF_FP8[c.fp8],
                "forward_ms": c.forward_ms,
                "backward_ms": c.backward_ms,
                "parasim_forward_ms": fwd,
                "parasim_backward_ms": bwd,
                "forward_error": _error(c.forward_ms, fwd),
                "backward_error": _error(c.backward_ms, bwd),
                "items_ms": {k: [f * 1e3, b * 1e3] for k, (f, b) in items.items()},
            }
        )
    base = {(r["model"], r["precision"]): r for r in out if r["dispatcher"] == BASE}
    for r in out:
        if r["dispatcher"] != BASE:
            a2a = base[(r["model"], r["precision"])]
            r["saved_vs_alltoall_ms"] = [a2a["forward_ms"] - r["forward_ms"], a2a["backward_ms"] - r["backward_ms"]]
            r["parasim_saved_vs_alltoall_ms"] = [
                a2a["parasim_forward_ms"] - r["parasim_forward_ms"],
                a2a["parasim_backward_ms"] - r["parasim_backward_ms"],
            ]
    return out


def score(table: list[dict[str, Any]]) -> dict[str, Any]:
    """The timed cases' forward and backward errors together: how many, median |error|, the largest, bias."""
    errors = [r[k] for r in table for k in ("forward_error", "backward_error") if r[k] is not None]
    return {
        "cases": sum(r["forward_error"] is not None for r in table),
        "timings": len(errors),
        "median_abs_error": statistics.median(abs(e) for e in errors),
        "max_abs_error": max(abs(e) for e in errors),
        "bias": statistics.fmean(errors),
    }


def all_to_all_rows() -> list[dict[str, Any]]:
    """Each EP size of Table 7 with NCCL's measured dispatch and combine (microseconds) and the clock's
    (`plan.ep_seconds`, the all-to-all of every top-k copy: what a step is charged), and the errors; HybridEP's
    measured figures beside them, untimed (its sends depend on routing the table does not state)."""
    d = _data()["all_to_all"]
    # only the hidden size, the experts and the top-k enter the all-to-all; heads, vocabulary and FFN sizes fill in
    model = ModelSpec(
        name="table-7-proxy",
        layers=1,
        hidden=d["hidden_size"],
        heads=8,
        vocab=32000,
        ffn=2048,
        experts=d["num_experts"],
        top_k=d["router_topk"],
        expert_ffn=2048,
        gated=True,
        act="swiglu",
        norm="rmsnorm",
        bias=False,
    )
    m = machine(d["gpu"], GPUS_PER_NODE)
    out = []
    for ep, dispatch, combine, hybrid_dispatch, hybrid_combine in d["rows"]:
        plan = Plan(
            tp=1, ep=ep, dp=ep, micro_batch=1, dropout=False, precision=PRECISION_OF_FP8[None], dispatcher=BASE
        ).check(model)
        timed = ep_seconds(model, plan, d["tokens"], m)
        row: dict[str, Any] = {"ep": ep, "nodes": -(-ep // GPUS_PER_NODE)}
        for kind, measured in (("dispatch", dispatch), ("combine", combine)):
            row[f"{kind}_us"], row[f"parasim_{kind}_us"] = measured, timed[kind] * 1e6
            row[f"{kind}_error"] = _error(measured, timed[kind] * 1e6)
        row["hybridep_us"] = [hybrid_dispatch, hybrid_combine]
        out.append(row)
    return out

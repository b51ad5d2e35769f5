"""How an MoE layer's tokens reach their experts and come back, as the clock times it: one entry per token
dispatcher a framework offers. `Plan.dispatcher` names one; clock/plan.ep_seconds reads what it sends. Nothing
here imports the rest of parasim, so the plan (estimate/memory.py) can check the name where it is made.

Two ways exist. NCCL's all-to-all (Megatron-Core's `alltoall` dispatcher) sends each of a token's top-k copies
on its own, so a token whose two experts sit on one GPU crosses twice. DeepEP and NVIDIA's HybridEP (Megatron's
`flex` dispatcher) send a token once to each GPU that holds one of its experts, and across nodes once to each
node, where NVLink forwards it to the GPUs that need it: with DeepSeek's group-limited routing (a token's
experts from a few groups, each group on one node) that is a few copies where the all-to-all sends k.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dispatcher:
    """A dispatcher: whether it sends a token once per GPU (and node) it needs, its framework's flags, and
    where its behaviour is read."""

    once_per_gpu: bool
    flag: str
    what: str
    source: str


DISPATCHERS: dict[str, Dispatcher] = {
    "alltoall": Dispatcher(
        False,
        "--moe-token-dispatcher-type alltoall (Megatron-Core)",
        "NCCL's all-to-all: each of a token's top-k copies sent on its own, the pairs in other nodes over the network",
        "Megatron-LM megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher: permute by "
        "the routing map (a row per (token, expert)), then all_to_all over the EP group",
    ),
    "deepep": Dispatcher(
        True,
        "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep (Megatron-Core)",
        "DeepEP's normal kernels: a token sent once to each GPU holding one of its experts; across nodes once "
        "to each node over RDMA, then forwarded over NVLink",
        "deepseek-ai/DeepEP README (V1, commit 2be0d4f8): 'kernels optimized for asymmetric-domain bandwidth "
        "forwarding, such as forwarding data from NVLink domain to RDMA domain', to align with the group-limited "
        "gating of DeepSeek-V3 (arXiv 2412.19437, section 2.1.2: each token to at most M nodes)",
    ),
    "hybridep": Dispatcher(
        True,
        "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep (Megatron-Core)",
        "NVIDIA's HybridEP: as DeepEP, a token once to each GPU (and node) that needs it",
        "Megatron-LM megatron/core/transformer/moe/fused_a2a.py (HybridEPBuffer), timed like DeepEP",
    ),
}

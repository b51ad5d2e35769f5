"""Megatron-Core's own groups for a layout, as the reference the layout tests compare with.

Runs megatron.core.parallel_state.initialize_model_parallel on a fake process group (rank 0 of N; every
rank creates every group, so one rank sees them all) and records each group it creates, in order."""
from __future__ import annotations

import warnings

NAMES = {
    "DATA_PARALLEL_GROUP_WITH_CP": "dp-cp", "DATA_PARALLEL_GROUP": "dp", "CONTEXT_PARALLEL_GROUP": "cp",
    "MODEL_PARALLEL_GROUP": "tp-pp", "TENSOR_MODEL_PARALLEL_GROUP": "tp", "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "embedding", "POSITION_EMBEDDING_GROUP": "position-embedding",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp-dp-cp", "TENSOR_AND_DATA_PARALLEL_GROUP": "tp-dp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp-cp", "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "expert-tp", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "expert-tp-ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "expert-tp-ep-pp", "EXPERT_DATA_PARALLEL_GROUP": "expert-dp",
}


def megatron_groups(tp: int, cp: int, pp: int, ep: int, etp: int, world: int, order: str) -> list[tuple[str, list]]:
    """Every group kind Megatron-Core creates, as (kind, groups) in the order it first creates each kind;
    each kind's groups in creation order. An ordered list, so a test also sees the creation order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        from torch.testing._internal.distributed.fake_pg import FakeStore

    made: dict[str, list] = {}
    original = ps.create_group

    def record(ranks=None, *args, group_desc=None, **kwargs):
        name = NAMES.get(group_desc)
        if name is not None and kwargs.get("backend") != "gloo":
            made.setdefault(name, []).append(sorted(int(r) for r in ranks))
        return original(ranks, *args, group_desc=group_desc, **kwargs)

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    ps.create_group = record
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     context_parallel_size=cp, expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=etp, order=order, create_gloo_process_groups=False)
    finally:
        ps.create_group = original
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    return list(made.items())

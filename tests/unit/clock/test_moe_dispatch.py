"""The token dispatchers (estimate/dispatch.py): how many GPUs and nodes a token is sent to when a dispatcher sends it
once to each (estimate/traffic.ep_destinations), held against counting every choice of experts; what the clock
and the traffic estimate send under each; the plan, the model and the command refusing what is not one."""
from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from parasim.clock.costs import machine, pairs_seconds
from parasim.estimate.dispatch import DISPATCHERS
from parasim.clock.plan import ep_seconds
from parasim.errors import UsageError
from parasim.estimate.memory import Plan
from parasim.estimate.traffic import ep_destinations, step_traffic
from parasim.layout import LayoutError, ModelSpec
from tests.conftest import cli


def _enumerated(k: int, experts: int, ep: int, per_node: int, groups: int | None = None,
                kept: int | None = None) -> tuple[Fraction, Fraction]:
    """Every home GPU and every choice of k experts from every choice of kept groups, each equally likely: the
    mean number of other GPUs holding a picked expert, and of nodes (the home's included) holding one."""
    per_gpu = experts // ep
    group_sets = [range(experts)] if groups is None else [
        [e for g in gs for e in range(g * experts // groups, (g + 1) * experts // groups)]
        for gs in itertools.combinations(range(groups), kept)]
    gpus = nodes = Fraction(0)
    n = 0
    for home in range(ep):
        for pool in group_sets:
            for picks in itertools.combinations(pool, k):
                hit = {e // per_gpu for e in picks}
                gpus += len(hit - {home})
                nodes += len({g // per_node for g in hit})
                n += 1
    return gpus / n, nodes / n


@pytest.mark.parametrize("k, experts, ep, per_node, groups, kept", [
    (2, 8, 8, 8, None, None),  # Mixtral-like: 2 experts are 2 GPUs
    (3, 16, 8, 4, None, None),  # two nodes of 4 GPUs, 2 experts a GPU
    (4, 16, 4, 2, None, None),
    (4, 16, 8, 4, 4, 2),  # 4 groups of 4 experts (2 GPUs each), a token keeps 2: the groups lie on half-nodes
    (3, 12, 6, 3, 2, 1),  # 2 groups, one node each: a token's experts all on one node
    (2, 8, 2, 1, 4, 2),  # a GPU holds 2 groups of 2 experts, a node is a GPU
    (2, 16, 8, 2, 2, 1),  # a group of 8 experts spans 4 GPUs on 2 nodes
])
def test_destinations_are_the_enumerated_means(k, experts, ep, per_node, groups, kept):
    gpus, nodes = ep_destinations(k, experts, ep, per_node, groups, kept)
    want_gpus, want_nodes = _enumerated(k, experts, ep, per_node, groups, kept)
    assert gpus == pytest.approx(float(want_gpus), rel=1e-12)
    assert nodes == pytest.approx(float(want_nodes) if per_node < ep else 0.0, rel=1e-12)


def test_destinations_of_deepseek_v3_by_hand():
    """256 experts, 4 to a GPU over EP 64 on 8 nodes of 8; 8 groups of 32 (one node each), 4 kept: the pool is 128
    experts on 32 GPUs and 4 nodes. GPUs: 32 x (1 - C(124,8)/C(128,8)) x 63/64; nodes: 4 x (1 - C(96,8)/C(128,8))."""
    import math
    gpus, nodes = ep_destinations(8, 256, 64, 8, 8, 4)
    assert gpus == pytest.approx(32 * (1 - math.comb(124, 8) / math.comb(128, 8)) * 63 / 64, rel=1e-12)
    assert nodes == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)), rel=1e-12)
    assert 3.5 < nodes <= 4  # at most 4 nodes a token: DeepSeek-V3's limit


MOE = ModelSpec(layers=2, hidden=64, heads=4, vocab=100, ffn=128, experts=16, top_k=4, expert_ffn=32, gated=True,
                expert_groups=4, groups_kept=2)


def test_the_clock_sends_what_each_dispatcher_sends():
    """EP 8 over two nodes of 4 GPUs (gpus_per_node 4), 512 tokens, hidden 64, BF16. NCCL's all-to-all: 4 copies
    a token, 7/8 to others, of which 4 of 7 peers are in the other node; DeepEP: ep_destinations' GPUs over NVLink
    and its nodes over the network."""
    m = machine("h100", 4)
    base = Plan(ep=8, dp=8, gpus_per_node=4, precision="megatron-bf16")
    seq, h = 512, 64
    a2a = ep_seconds(MOE, base, seq, m)
    values = seq * 4 * h * 7 / 8
    want = pairs_seconds(values * 2 * 3 / 7, values * 2 * 4 / 7, m, 8)
    assert a2a["dispatch"] == pytest.approx(want, rel=1e-12) and a2a["combine"] == a2a["dispatch"]
    from dataclasses import replace
    once = ep_seconds(MOE, replace(base, dispatcher="deepep"), seq, m)
    gpus, nodes = ep_destinations(4, 16, 8, 4, 4, 2)
    assert once["dispatch"] == pytest.approx(pairs_seconds(seq * gpus * h * 2, seq * nodes * h * 2, m, 8), rel=1e-12)
    assert ep_seconds(MOE, replace(base, dispatcher="hybridep"), seq, m) == once


def test_the_traffic_estimate_counts_the_dispatchers_copies():
    from dataclasses import replace
    plan = Plan(ep=8, dp=8, gpus_per_node=4, precision="megatron-bf16")
    a2a = step_traffic(MOE, plan, 512)[("ep", "all_to_all")]
    once = step_traffic(MOE, replace(plan, dispatcher="deepep"), 512)[("ep", "all_to_all")]
    assert once / a2a == pytest.approx(ep_destinations(4, 16, 8, 4, 4, 2)[0] / (4 * 7 / 8), rel=1e-12)


def test_what_is_not_a_dispatcher_or_a_grouping_is_refused():
    assert set(DISPATCHERS) == {"alltoall", "deepep", "hybridep"}
    assert [d.once_per_gpu for d in DISPATCHERS.values()] == [False, True, True]
    with pytest.raises(UsageError, match="dispatcher must be one of alltoall, deepep, hybridep"):
        Plan(dispatcher="nccl")
    for bad, said in ((dict(expert_groups=4), "needs both"), (dict(expert_groups=3, groups_kept=1), "do not fall"),
                      (dict(expert_groups=4, groups_kept=5), "do not fall"),
                      (dict(expert_groups=16, groups_kept=1), "fewer than top-k")):
        with pytest.raises(LayoutError, match=said):
            ModelSpec(hidden=64, heads=4, experts=16, top_k=4, **bad)
    from dataclasses import replace
    assert replace(MOE, experts=0).expert_groups == 4  # a dense copy of the model (its dense layers) keeps them


def test_the_command_times_a_dispatcher_and_refuses_another():
    args = ("memory", "--model", "deepseek-v3", "--gpus", "1024", "--pp", "16", "--ep", "64", "--gpu", "h100")
    plain, once = cli(*args), cli(*args, "--dispatcher", "deepep")
    assert plain.returncode == once.returncode == 0, plain.stderr + once.stderr

    def ep_seconds_said(text: str) -> float:
        import re
        return float(re.search(r"EP ([0-9.]+) s", text).group(1))
    assert ep_seconds_said(once.stdout) < ep_seconds_said(plain.stdout)
    said = " ".join(once.stdout.split()), " ".join(plain.stdout.split())
    assert " s (deepep);" in said[0] and " s (alltoall);" in said[1]  # the step names how its tokens travel
    dense = " ".join(cli("memory", "--model", "27b", "--gpus", "8", "--tp", "8", "--gpu", "h100").stdout.split())
    assert "(alltoall)" not in dense and "step:" in dense
    bad = cli(*args, "--dispatcher", "nccl")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr


MEGATRON = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 128 --num-experts 16 "
            "--moe-router-topk 4 --moe-ffn-hidden-size 32 --expert-model-parallel-size 8 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 256 --max-position-embeddings 256 --bf16 "
            "--position-embedding-type rope")


def _job(extra: str):
    from parasim.megatron.job import plan_of, read_job
    job = read_job("flags.txt", f"{MEGATRON} {extra}")
    model = job.model_spec()
    return job, model, plan_of(job, model, world=8)


@pytest.mark.parametrize("flags, dispatcher", [
    ("--moe-token-dispatcher-type alltoall", "alltoall"),
    ("--moe-token-dispatcher-type flex", "deepep"),  # Megatron-Core's default backend
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "hybridep"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep"),
])
def test_the_megatron_reader_reads_the_dispatcher_and_writes_it_back(flags, dispatcher):
    from parasim.megatron.args import megatron_args
    from parasim.megatron.job import plan_of, read_job
    job, model, plan = _job(f"{flags} --moe-router-num-groups 4 --moe-router-group-topk 2")
    assert plan.dispatcher == dispatcher and (model.expert_groups, model.groups_kept) == (4, 2)
    assert not job.unmodelled
    words = megatron_args(model, plan, 256)
    at = words.index("--moe-token-dispatcher-type")
    assert words[at + 1] == ("alltoall" if dispatcher == "alltoall" else "flex")
    if dispatcher != "alltoall":
        assert words[at + 2:at + 4] == ["--moe-flex-dispatcher-backend", dispatcher]
    assert words.count("--moe-token-dispatcher-type") == 1
    back = read_job("written.txt", " ".join(words))
    again = back.model_spec()
    assert plan_of(back, again, world=8).dispatcher == dispatcher and again.expert_groups == 4


def test_the_megatron_reader_leaves_out_what_it_does_not_time():
    job, model, plan = _job("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep "
                            "--moe-router-num-groups 4")
    assert plan.dispatcher == "alltoall" and model.expert_groups is None
    said = " ".join(job.unmodelled)
    assert "ncclep" in said and "needs both --moe-router-num-groups and --moe-router-group-topk" in said


def test_deepep_beside_another_dispatcher_or_backend_is_a_contradiction():
    """Megatron-Core refuses --moe-enable-deepep without the flex dispatcher or with HybridEP
    (transformer_config.py: "DeepEP backend is only supported with flex token dispatcher", "Only one backend is
    supported for flex token dispatcher"); parasim says so and takes DeepEP."""
    for flags in ("--moe-token-dispatcher-type alltoall --moe-enable-deepep",
                  "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-enable-deepep"):
        job, _, plan = _job(flags)
        assert plan.dispatcher == "deepep" and any("--moe-enable-deepep needs" in c for c in job.contradictions)
    job, _, plan = _job("--moe-token-dispatcher-type flex --moe-enable-deepep")
    assert plan.dispatcher == "deepep" and not job.contradictions

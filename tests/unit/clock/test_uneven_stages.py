"""Layers on pipeline stages (issue 49): one rule (layout/stages.py) that the layout's check, the estimator's
memory and search, the clock, the bytes a step sends, the engine's step, the Megatron reader and writer and
the command line all use.

The references here are independent of the code under test: stage lists written out by hand, Megatron-Core's
own `get_num_layers_to_build` and the checks of its TransformerConfig transcribed below (as its source reads,
megatron/core/transformer/transformer_block.py and transformer_config.py), and brute force over every stage
where the code looks at a few."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from parasim.clock.costs import machine
from parasim.clock.plan import stage_parts, step_time
from parasim.clock.runs import training_plan
from parasim.errors import LayoutError, UsageError
from parasim.estimate.fit import enumerate_plans, fit, longest, solve
from parasim.estimate.memory import Plan, breakdown, items, totals
from parasim.estimate.traffic import step_traffic
from parasim.train.step import stage_range
from parasim.layout import SPREAD, Layout, ModelSpec, Stages, preset, stage_counts, stage_layers, stage_span
from parasim.layout.stages import alike_starts, describe, most_layers, stage_of_layer
from parasim.megatron.args import megatron_args
from parasim.megatron.job import plan_of, read_job
from parasim.megatron.pipeline import layout_text, parse_layout
from tests.conftest import cli

DS = preset("deepseek-v3").model  # 61 layers, the first 3 dense, spread


def model(layers: int, stages: Stages = Stages(), dense: int = 0, experts: int = 4) -> ModelSpec:
    return ModelSpec("m", layers=layers, hidden=8, heads=2, vocab=16, experts=experts, top_k=2 if experts else None,
                     dense_layers=dense, stages=stages)


# -- Megatron-Core's rule, transcribed (the reference) ------------------------------------------------------
def megatron_layers(layers, pp, first=None, last=None, embedding=False, loss=False):
    """Each pipeline rank's layers as get_num_layers_to_build gives them without virtual stages."""
    out = []
    for rank in range(pp):
        if first is not None or last is not None:
            left, stages = layers, pp
            if first is not None:
                left, stages = left - first, stages - 1
            if last is not None:
                left, stages = left - last, stages - 1
            n = left // stages if stages > 0 else 0
            if rank == 0 and first is not None:
                n = first
            if rank == pp - 1 and last is not None:
                n = last
        else:
            n = (layers + embedding + loss) // pp
            n -= (embedding and rank == 0) + (loss and rank == pp - 1)
        out.append(n)
    return out


def megatron_accepts(layers, pp, first=None, last=None, embedding=False, loss=False):
    """TransformerConfig.__post_init__'s checks and arguments.py's divisibility, as Megatron runs them."""
    if first is not None or last is not None:
        mid, stages = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if bool(mid) != bool(stages):
            return False
        return not (stages and mid % stages)
    return (layers + embedding + loss) % pp == 0


# -- the rule: every stage's layers -------------------------------------------------------------------------
@pytest.mark.parametrize("layers, pp, rule, want", [
    (60, 4, Stages(), (15, 15, 15, 15)),
    (61, 16, SPREAD, (4,) * 13 + (3,) * 3),  # DeepSeek-V3's 61 over 16
    (5, 4, SPREAD, (2, 1, 1, 1)),
    (61, 16, Stages(first=1), (1,) + (4,) * 15),  # Megatron: the 60 others over 15 middle stages
    (61, 16, Stages(first=1, last=4), (1,) + (4,) * 15),
    (61, 16, Stages(last=1), (4,) * 15 + (1,)),
    (10, 2, Stages(first=8, last=2), (8, 2)),  # no middle stage
    (126, 16, Stages(embedding=True, loss=True), (7,) + (8,) * 14 + (7,)),  # Llama 3 405B, section 3.3.2
    (63, 16, Stages(embedding=True), (3,) + (4,) * 15),
    (61, 16, Stages(counts=(5,) + (4,) * 13 + (2, 2)), (5,) + (4,) * 13 + (2, 2)),
    (7, 1, Stages(first=7), (7,)),  # one stage, first and last at once
    (7, 1, Stages(embedding=True, loss=True), (7,)),
])
def test_stage_counts_written_out(layers, pp, rule, want):
    assert stage_counts(model(layers, rule), pp) == want
    starts = np.cumsum((0,) + want[:-1])
    assert [tuple(int(x) for x in stage_span(model(layers, rule), pp, s)) for s in range(pp)] == \
        list(zip(starts.tolist(), want))


@pytest.mark.parametrize("layers, pp, rule, words", [
    (61, 16, Stages(first=2), "the 59 middle layers do not divide by the 15 middle stages"),
    (61, 2, Stages(first=1, last=4), "56 layers are left for 0 middle stages"),  # Megatron's "Mismatch"
    (8, 3, Stages(first=4, last=4), "0 layers are left for 1 middle stages"),
    (8, 1, Stages(first=4, last=4), "need 2 stages or more"),
    (8, 1, Stages(first=4), "4 layers are left for 0 middle stages"),
    (61, 16, Stages(embedding=True), "layers 61 plus the embedding \\(62\\) do not divide by pp 16"),
    (3, 4, Stages(embedding=True), "pp 4 exceeds layers 3: every stage needs a layer"),  # Megatron: E alone
    (61, 16, Stages(), "layers 61 do not divide by pp 16 \\(say how they sit on the stages: --first-stage-layers"),
    (61, 8, Stages(counts=(5,) + (4,) * 13 + (2, 2)), "the stage list has 16 entries .*, pp is 8"),
    (4, 5, SPREAD, "pp 5 exceeds layers 4"),
])
def test_layouts_megatron_refuses_are_refused_naming_the_rule(layers, pp, rule, words):
    with pytest.raises(LayoutError, match=words):
        Layout(pp=pp, model=model(layers, rule))


@pytest.mark.parametrize("make, words", [
    (lambda: Stages(last=0), "layers on the last stage must be a whole number larger than 0"),  # Megatron's rule
    (lambda: Stages(first=True), "larger than 0, got True"),
    (lambda: Stages(first=1, spread=True), "give one rule for the layers on stages"),
    (lambda: Stages(first=1, loss=True), "not first/last stage layers and the embedding or loss"),
    (lambda: Stages(counts=(4, 0, 4)), "at least 1, got 0"),
    (lambda: Stages(counts=()), "one layer count per stage"),
    (lambda: model(61, Stages(counts=(4,) * 15)), "the stage list holds 60 layers, the model has 61"),
    (lambda: model(6, Stages(first=4, last=3)), "first and last stage layers \\(7\\) exceed the model's 6"),
    (lambda: Stages(counts=(1,) * 65_537), "65,537 stages is more than the limit of 65,536"),
    (lambda: ModelSpec("m", layers=4, stages=True), "model stages must be a Stages rule, got True"),
])
def test_rules_that_cannot_hold_are_refused(make, words):
    with pytest.raises(LayoutError, match=words):
        make()


def test_every_rule_agrees_with_megatrons_own_split_and_checks():
    """A grid of layers, pp and Megatron's four flags: parasim accepts exactly what Megatron accepts (and has
    a layer on every stage), and gives each stage Megatron's layers."""
    checked = 0
    for layers in range(1, 13):
        for pp in range(2, layers + 1):
            rules = [dict(), dict(embedding=True), dict(loss=True), dict(embedding=True, loss=True)]
            rules += [dict(first=f) for f in range(1, layers + 1)] + [dict(last=a) for a in range(1, layers + 1)]
            rules += [dict(first=f, last=a) for f in range(1, layers) for a in range(1, layers - f + 1)]
            for rule in rules:
                m = model(layers, Stages(**rule))
                want = megatron_layers(layers, pp, **rule)
                if megatron_accepts(layers, pp, **rule) and min(want) >= 1:
                    assert list(stage_counts(m, pp)) == want, (layers, pp, rule)
                    checked += 1
                else:
                    with pytest.raises(LayoutError):
                        stage_counts(m, pp)
    assert checked > 500


def test_a_column_of_layouts_gets_what_each_gets_alone():
    """stage_span on arrays (the search's columns) is stage_span on each row."""
    for rule in (SPREAD, Stages(first=2), Stages(last=3), Stages(embedding=True, loss=True)):
        m = model(24, rule)
        pps = np.array([p for p in range(2, 13) if _ok(m, p)])
        for s in range(int(pps.max())):
            stage = np.minimum(s, pps - 1)
            start, n = stage_span(m, pps, stage)
            alone = [tuple(int(x) for x in stage_span(m, int(p), int(t))) for p, t in zip(pps, stage)]
            assert list(zip(start.tolist(), n.tolist())) == alone


def _ok(m: ModelSpec, pp: int) -> bool:
    try:
        stage_counts(m, pp)
    except LayoutError:
        return False
    return True


def grid():
    """Valid (model, pp) pairs with dense layers anywhere, under every kind of rule."""
    for layers in (5, 7, 12):
        for dense in sorted({0, 1, 2, layers // 2, layers - 1, layers}):
            rules = [SPREAD, Stages(), Stages(first=1), Stages(last=2), Stages(first=2, last=1),
                     Stages(embedding=True), Stages(loss=True), Stages(embedding=True, loss=True)]
            for pp in range(1, layers + 1):
                counts = [Stages(counts=tuple(len(a) for a in np.array_split(np.arange(layers), pp))[::-1])]
                for rule in rules + counts:
                    m = model(layers, rule, dense=dense)
                    if _ok(m, pp):
                        yield m, pp


def test_the_stage_of_each_layer_is_the_stage_that_holds_it():
    for m, pp in grid():
        for layer in range(m.layers):
            s = int(stage_of_layer(m, pp, layer))
            start, n = (int(x) for x in stage_span(m, pp, s))
            assert start <= layer < start + n, (m.stages, pp, layer)


def test_the_stages_looked_at_include_every_stage_that_differs_from_the_one_before():
    """Each stage whose layers (count, dense and MoE) differ from the previous stage's starts a run: it is
    looked at, with the last; a stage like the one before it holds fewer micro-batches and never needs more."""
    for m, pp in grid():
        mixes = [tuple(int(x) for x in stage_layers(m, pp, s)) for s in range(pp)]
        starts = {0, pp - 1} | {s for s in range(1, pp) if mixes[s] != mixes[s - 1]}
        assert starts <= {int(s) for s in alike_starts(m, pp)}, (m.stages, m.dense_layers, pp, mixes)


@pytest.mark.parametrize("m, pp, want", [
    (model(8, dense=2), 4, [0, 1, 1, 3]),        # stage 1 starts at the first MoE layer: all MoE, no mixed stage
    (model(8, dense=7), 4, [0, 3, 3, 3]),        # the first MoE layer is on the last stage, mixed with a dense one
    (model(7, Stages(embedding=True), dense=2), 2, [0, 0, 1, 1, 1]),  # the second stage starts the even middle
    (model(7, Stages(embedding=True), dense=2), 1, [0, 0, 0, 0, 0]),  # one stage: every start is stage 0
    (model(7, Stages(spread=True), dense=0), 4, [0, 0, 0, 3, 3]),     # 7 over 4: stage 3 is the first of 1 layer
])
def test_the_stages_looked_at_written_out(m, pp, want):
    """alike_starts' list, worked by hand: the first stage, the stage of the first MoE layer, the one after it
    when that stage is mixed (never past the last), the last, then the rule's own; whole numbers, as indices."""
    got = alike_starts(m, pp)
    assert [int(s) for s in got] == want
    assert all(np.issubdtype(np.asarray(s).dtype, np.integer) for s in got)


def test_a_column_of_layouts_looks_only_at_stages_each_layout_has():
    """A stage list of 4 in a column that also holds a pipeline of 2 (the search asks before the rule's check
    drops it): each stage looked at, and each span read, stays within its own pipeline and the list."""
    m = model(8, Stages(counts=(1, 3, 2, 2)))
    p = np.array([4, 2])
    for s in alike_starts(m, p):
        assert (np.asarray(s) < p).all() and (np.asarray(s) >= 0).all()
    start, n = stage_span(m, np.array([4, 8]), np.array([3, 7]))  # a stage past the list reads as its last
    assert start.tolist() == [6, 6] and n.tolist() == [2, 2]


def test_a_layer_past_the_last_is_on_the_last_stage():
    assert int(stage_of_layer(model(8, Stages(counts=(1, 3, 2, 2))), 4, 8)) == 3
    assert int(stage_of_layer(model(8), 4, 8)) == 3 and int(stage_of_layer(model(8), 4, 100)) == 3


def test_dense_and_moe_layers_of_each_stage_written_out():
    """The dense layers come first: 2 dense of 8 on pp 4 fill stage 0; 3 dense leave stage 1 mixed."""
    assert [tuple(int(x) for x in stage_layers(model(8, dense=2), 4, s)) for s in range(4)] == [
        (2, 0), (0, 2), (0, 2), (0, 2)]
    assert [tuple(int(x) for x in stage_layers(model(8, dense=3), 4, s)) for s in range(4)] == [
        (2, 0), (1, 1), (0, 2), (0, 2)]


@pytest.mark.parametrize("m, pp, words", [
    (model(7, Stages(embedding=True, loss=True)), 4, "layers 7 plus the embedding and the loss (9) do not divide by pp 4"),
    (model(8, Stages(loss=True)), 2, "layers 8 plus the loss (9) do not divide by pp 2"),
])
def test_what_the_embedding_and_loss_add_is_named(m, pp, words):
    with pytest.raises(LayoutError) as err:
        stage_counts(m, pp)
    assert str(err.value) == words


# -- memory: the stage that needs the most, over every stage ----------------------------------------------
def every_stage_total(m, plan, seq):
    return [sum(float(a + b * seq + c * seq * seq) for a, b, c in items(m, plan, s).values()) for s in range(plan.pp)]


def test_deepseek_v3s_second_stage_needs_the_most_not_its_first():
    """61 layers over 16: stage 1 holds the 3 dense layers and 1 MoE layer with 16 micro-batches in flight,
    stage 2 four MoE layers with 15. The MoE layers keep more, so the second stage binds; before this issue
    only the first and last were looked at."""
    plan = Plan(pp=16, ep=64, world=2048).check(DS)
    totals_ = every_stage_total(DS, plan, 4096)
    bd = breakdown(DS, plan, 4096)
    assert bd.stage == int(np.argmax(totals_)) == 1 and bd.total == pytest.approx(max(totals_))
    assert totals_[1] > totals_[0]


@pytest.mark.parametrize("rule, pp, want", [
    (Stages(first=1), 16, 2),  # the first stage holds 1 dense layer, the second 2 dense + 2 MoE, the third 4 MoE
    (Stages(counts=(1, 1, 5, 1)), 4, 2),  # a middle stage with most layers
    (Stages(last=7), 4, 3),  # the last stage, with most layers and the logits
])
def test_breakdown_finds_the_stage_that_binds_anywhere(rule, pp, want):
    m = replace(DS, stages=rule) if pp == 16 else model(8 if rule.counts else 10, rule, dense=1)
    plan = Plan(pp=pp, ep=64 if pp == 16 else 1, world=2048 if pp == 16 else pp).check(m)
    totals_ = every_stage_total(m, plan, 4096)
    assert int(np.argmax(totals_)) == want
    assert breakdown(m, plan, 4096).stage == want


def test_the_longest_sequence_is_the_smallest_over_every_stage_for_a_whole_search():
    """fit.longest over the stages stages_of picks, on a column of layouts at once, against each plan's
    brute force over all its stages."""
    m = replace(model(61, Stages(first=1), dense=3), hidden=64)  # small enough to fit: lengths to compare
    plans = enumerate_plans(m, range(2, 5), recompute="none", zero=1, chunked_loss=True)  # no logits to bind
    assert len(plans) > 20
    got = longest(m, plans, 1e9)
    middles = 0
    for i in range(len(plans)):
        plan = plans.plan(i)
        each = [float(solve(*totals(m, plan, s), 1e9)) for s in range(plan.pp)]
        assert float(got[i]) == pytest.approx(min(each)), plan.label()
        middles += 0 < int(np.argmin(each)) < plan.pp - 1
    assert middles  # some bind on a middle stage, which the first and last alone would miss


def test_the_search_takes_only_the_pipelines_the_rule_allows():
    """First stage 1 of 61: Megatron spreads the other 60 over the middle stages, so pp - 1 divides 60 (and pp 1,
    where the first stage is the only one, would need all 61 on it)."""
    m = replace(DS, stages=Stages(first=1))
    got = set(enumerate_plans(m, range(1, 3), recompute="none", zero=1).pp.tolist())
    assert got == {2, 4, 16}  # of the pp 8 or 16 GPUs allow (1, 2, 4, 8, 16), 1 and 8 (60 over 7) are refused
    spread = set(enumerate_plans(DS, range(1, 3), recompute="none", zero=1).pp.tolist())
    assert spread == {1, 2, 4, 8, 16}  # as even as can be: any pp the GPUs allow


def test_fit_of_one_plan_binds_on_the_stage_breakdown_names():
    m = model(8, Stages(counts=(1, 1, 5, 1)), dense=1)
    f = fit(m, Plan(pp=4), 1e6)
    assert f.at_max.stage == 2


# -- the clock: the slowest stage paces the step ---------------------------------------------------------------
def test_the_slowest_stage_paces_the_step():
    """Stage 1 holds 3 layers, stage 2 one layer and the logits (a small vocabulary): stage 1 is slower, and
    the step's micro-batch time is its own."""
    m = model(4, Stages(counts=(3, 1)), experts=0)
    plan, gpu = training_plan(4, pp=2), machine("h200")
    t = step_time(m, plan, 512, gpu)
    first, _ = stage_parts(m, plan, 512, gpu, 3, 0, False)
    last, _ = stage_parts(m, plan, 512, gpu, 1, 0, True)
    assert t["slowest_stage"] == 1 and t["per_microbatch_s"] == pytest.approx(sum(first.values()))
    assert sum(last.values()) < sum(first.values())
    flipped = step_time(replace(m, stages=Stages(counts=(1, 3))), plan, 512, gpu)
    assert flipped["slowest_stage"] == 2 and flipped["per_microbatch_s"] > t["per_microbatch_s"]


def test_stages_that_tie_name_the_earliest():
    m = model(8, Stages(counts=(3, 3, 2)), experts=0)
    t = step_time(m, training_plan(3, pp=3), 512, machine("h200"))
    assert t["slowest_stage"] == 1


def test_an_even_split_times_as_before_the_last_stage_with_the_logits():
    """Every stage alike but the last, which adds the logits: the last is the slowest, by the logits."""
    m = model(8, experts=0)
    plan, gpu = training_plan(8, pp=4), machine("h200")
    t = step_time(m, plan, 512, gpu)
    plain, _ = stage_parts(m, plan, 512, gpu, 2, 0, False)
    assert t["slowest_stage"] == 4
    assert t["per_microbatch_s"] - sum(plain.values()) == pytest.approx(t["parts_per_microbatch_s"]["logits"])
    assert t["parts_per_microbatch_s"]["logits"] > 0


def test_llama_3s_published_run_takes_its_papers_stages():
    """Llama 3 (section 3.3.2): one layer fewer on the first and on the last of 16 stages, for the embedding
    and for the output and loss."""
    from parasim.clock.runs import RUNS
    llama = next(r for r in RUNS if r.key == "llama3-405b-8k")
    assert stage_counts(llama.model, llama.plan.pp) == (7,) + (8,) * 14 + (7,)


def test_deepseek_v3s_slowest_stage_is_one_of_four_moe_layers():
    t = step_time(DS, Plan(pp=16, ep=64, world=2048).check(DS), 4096, machine("h200"))
    assert t["slowest_stage"] == 2  # four MoE layers; stage 1 has three dense ones, stage 16 three MoE and the logits


# -- what a step sends: the stage with the most layers ---------------------------------------------------------
def test_the_busiest_stage_sends_for_its_own_layers():
    """10 layers as 8 and 2 send what 8 layers send: the same as 16 layers split evenly over 2 stages."""
    uneven = ModelSpec("u", layers=10, hidden=8, heads=2, vocab=16, stages=Stages(first=8, last=2))
    even = ModelSpec("e", layers=16, hidden=8, heads=2, vocab=16)
    plan = Plan(tp=2, pp=2)
    got, want = step_traffic(uneven, plan, 8), step_traffic(even, plan, 8)
    assert got[("tp", "all_reduce")] == want[("tp", "all_reduce")] > 0
    flipped = replace(uneven, stages=Stages(first=2, last=8))
    assert step_traffic(flipped, plan, 8)[("tp", "all_reduce")] == want[("tp", "all_reduce")]
    assert most_layers(uneven, 2) == 0 and most_layers(flipped, 2) == 1


def test_the_busiest_stage_is_the_one_with_most_layers_then_most_moe_layers():
    assert most_layers(DS, 16) == 1  # stages 1 and 2 hold 4 layers; the first has 3 dense ones
    mixed = model(8, Stages(counts=(5, 3)), dense=3)  # 3 dense + 2 MoE, then 3 MoE: the first holds more
    assert most_layers(mixed, 2) == 0


# -- the engine's step -------------------------------------------------------------------------------------
def test_the_engines_stages_take_the_rule():
    m = model(61, Stages(first=1))
    assert [len(stage_range(m, 16, s)) for s in range(16)] == [1] + [4] * 15
    assert stage_range(m, 16, 0) == range(0, 1) and stage_range(m, 16, 15) == range(57, 61)


def test_a_real_size_step_on_symbolic_ranks_builds_each_stages_own_layers():
    """DeepSeek-V3 with 1 layer on the first stage: GPU 0 (stage 1) builds one layer, its peak beside the
    estimator's for its stage."""
    got = cli("trace", "--symbolic", "--layout", "deepseek-v3", "--gpu", "0", "--first-stage-layers", "1", "--json")
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["coords"]["pp"] == 0 and len(out["experts_per_layer"]) == 1
    assert out["experts_per_layer"][0] == []  # layer 1 is dense: no experts


def test_the_example_runs_exact_on_uneven_stages():
    """The token trace on 5 layers as 3 and 2, held to the unsplit model."""
    got = cli("trace", "--pp", "2", "--layers", "5", "--world", "2", "--first-stage-layers", "3")
    assert got.returncode == 0, got.stderr
    assert "exact" in got.stdout


# -- Megatron's flags, read and written -----------------------------------------------------------------------
FLAGS = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --vocab-size 129280 --seq-length 4096 "
         "--pipeline-model-parallel-size 16 --expert-model-parallel-size 64 --num-experts 256 "
         "--moe-token-dispatcher-type alltoall --bf16 --use-distributed-optimizer ")


def job(extra: str, tmp_path=None):
    return read_job("job.txt", FLAGS + extra)


@pytest.mark.parametrize("extra, want", [
    ("--decoder-first-pipeline-num-layers 1", (1,) + (4,) * 15),
    ("--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 4", (1,) + (4,) * 15),
    ("--decoder-last-pipeline-num-layers 1", (4,) * 15 + (1,)),
    # Megatron's documented DeepSeek-V3 layout (docs/user-guide/features/pipeline_parallel_layout.md): 32
    # virtual stages, rank r holding stages r and r + 16: E+3, then 2+2 on ranks 1-13, 2 and m on rank 14,
    # 2 and L on rank 15
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'", (5,) + (4,) * 13 + (2, 2)),
])
def test_a_jobs_pipeline_flags_give_its_stages(extra, want):
    j = job(extra)
    m = j.model_spec()
    assert stage_counts(m, 16) == want
    assert plan_of(j, m).pp == 16
    used = {f.split()[0] for f, _ in j.used}
    assert {w for w in extra.split() if w.startswith("--")} <= used


def test_a_layout_says_its_virtual_stages():
    j = job("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'")
    assert j.step["chunks"] == 2
    assert parse_layout("Et*2|(tt|)*5t|tmL", 4, 14) == ((4, 4, 3, 3), 2)  # Megatron's own test case, by hand


@pytest.mark.parametrize("extra, words", [
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L' --decoder-first-pipeline-num-layers 1",
     "Megatron takes the layout alone"),
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L' --num-virtual-stages-per-pipeline-rank 2",
     "Megatron takes the layout alone"),
    ("--decoder-first-pipeline-num-layers 1 --account-for-loss-in-pipeline-split", "one or the other"),
    ("--decoder-first-pipeline-num-layers 1 --num-layers-per-virtual-pipeline-stage 2",
     "asks for --num-virtual-stages-per-pipeline-rank"),
    ("--decoder-first-pipeline-num-layers 1 --num-virtual-stages-per-pipeline-rank 2",
     "--decoder-first-pipeline-num-layers 1 does not divide by 2 virtual stages"),
    ("--decoder-first-pipeline-num-layers 5 --num-virtual-stages-per-pipeline-rank 2",
     "--decoder-first-pipeline-num-layers 5 does not divide by 2 virtual stages"),
    ("--pipeline-model-parallel-layout 'Et*2|(tt|)*28,t|m|L'", "holds 59 decoder layers \\(t\\), --num-layers is 61"),
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|'", "the embedding \\(E\\) first and the loss \\(L\\) last"),
    ("--pipeline-model-parallel-layout 'Et*3|(tt|)*29L'", "has 31 stages, which do not divide by PP 16"),
    ("--pipeline-model-parallel-layout 'Ex*3|(tt|)*29,m|L'", "'x' is not a layer"),
    ("--pipeline-model-parallel-layout '(t*999999|)*999999'", "unrolls to more than 100,000 characters"),
])
def test_what_megatron_refuses_is_one_line(extra, words):
    with pytest.raises(UsageError, match=words):
        job(extra)


def test_a_layout_longer_than_the_limit_is_refused_before_it_is_read():
    with pytest.raises(UsageError, match="1,001 characters long"):
        parse_layout("t" * 1001, 1, None)
    for text in ("E(t|)*40000(t|)*40000L", "Et*90000t*90000L"):  # each repeat under the limit, the two over it
        with pytest.raises(UsageError, match="unrolls to more than 100,000 characters"):
            parse_layout(text, 1, None)


def test_a_huge_repeat_is_refused_before_it_is_written_out():
    """900 characters 999,999 times would be 900 MB: refused with little memory used."""
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match="unrolls to more than"):
            parse_layout("(" + "t" * 900 + "|)*999999", 1, None)
        assert tracemalloc.get_traced_memory()[1] < 10_000_000
    finally:
        tracemalloc.stop()


def test_the_embedding_comes_first_and_the_loss_last():
    with pytest.raises(UsageError, match="the embedding \\(E\\) first and the loss \\(L\\) last"):
        parse_layout("Lt*4|t*4E", 2, 8)


def test_virtual_stages_must_divide_each_stages_layers_as_megatron_needs():
    counted = "--num-layers 62 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
    assert job(counted + "--num-virtual-stages-per-pipeline-rank 2").step["chunks"] == 2  # 64 / 16 = 4 a stage
    with pytest.raises(UsageError, match="4 layers a stage .* do not divide by 3 virtual stages"):
        job(counted + "--num-virtual-stages-per-pipeline-rank 3")
    # 46 layers, 2 on the first and last: 42 over 14 middle stages, 3 each, which 2 virtual stages cannot split
    with pytest.raises(UsageError, match="3 layers on each middle stage do not divide by 2 virtual stages"):
        job("--num-layers 46 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 "
            "--num-virtual-stages-per-pipeline-rank 2")


def test_the_middle_stages_of_an_uneven_split_must_divide_into_virtual_stages():
    j = job("--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 3")  # 56 over 14: 4 each
    assert stage_counts(j.model_spec(), 16) == (2,) + (4,) * 14 + (3,)
    with pytest.raises(UsageError, match="--decoder-last-pipeline-num-layers 3 does not divide by 2"):
        job("--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 3 "
            "--num-virtual-stages-per-pipeline-rank 2")


@pytest.mark.parametrize("rule, chunks, flags", [
    (Stages(first=1, last=4), 1, ["--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers",
                                  "4"]),
    (Stages(first=2, last=3), 1, ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers",
                                  "3"]),
    (SPREAD, 1, ["--pipeline-model-parallel-layout", "Et*4|(t*4|)*12(t*3|)*2t*3L"]),
    (SPREAD, 2, None),  # a layout with 32 virtual stages
    (Stages(counts=(5,) + (4,) * 13 + (2, 2)), 1, None),
])
def test_megatron_args_round_trip_keeps_every_stages_layers(rule, chunks, flags):
    """The plan written as Megatron flags and read back (`--megatron` of `--megatron-args`) gives the same
    layers on every stage and the same model chunks."""
    m = replace(DS, stages=rule)
    plan = Plan(pp=16, ep=64, world=2048, chunks=chunks).check(m)
    words = megatron_args(m, plan, 4096)
    if flags is not None:
        at = words.index(flags[0])
        assert words[at:at + len(flags)] == flags
    back = read_job("back.txt", " ".join(f"'{w}'" for w in words))
    again = back.model_spec()
    assert stage_counts(again, 16) == stage_counts(m, 16)
    assert back.step["chunks"] == chunks
    assert not back.unmodelled or all("pipeline" not in line for line in back.unmodelled)


def test_an_even_split_writes_no_layout_and_embedding_and_loss_write_their_flags():
    even = replace(DS, layers=64, dense_layers=3)  # 64 over 16 spreads evenly: Megatron's default, no flag
    words = megatron_args(even, Plan(pp=16, ep=64, world=2048).check(even), 4096)
    assert "--pipeline-model-parallel-layout" not in words
    llama = replace(DS, layers=62, stages=Stages(embedding=True, loss=True))  # (62 + 2) / 16 = 4 a stage
    words = megatron_args(llama, Plan(pp=16, ep=64, world=2048).check(llama), 4096)
    assert "--account-for-embedding-in-pipeline-split" in words and "--account-for-loss-in-pipeline-split" in words
    back = read_job("back.txt", " ".join(f"'{w}'" for w in words)).model_spec()
    assert stage_counts(back, 16) == (3,) + (4,) * 14 + (3,)


def test_a_layout_of_a_model_without_layers_writes_no_stages():
    got = cli("layout", "--pp", "2", "--heads", "4", "--megatron-args", "--json")
    assert got.returncode == 0, got.stderr
    words = json.loads(got.stdout)["megatron_args"]["args"]
    assert not any("-pipeline-num-layers" in w or "layout" in w for w in words)


def test_a_layout_written_by_hand():
    """Layers 3 and 2 over 2 virtual stages each, the first virtual stage one more: rank 0 holds 2 then 1,
    rank 1 holds 1 then 1; the virtual stages in Megatron's order (all ranks' first, then all ranks' second)."""
    assert layout_text((3, 2), 2) == "Et*2|(t|)*2tL"
    assert layout_text((4,) * 13 + (3,) * 3) == "Et*4|(t*4|)*12(t*3|)*2t*3L"


def test_a_written_layout_reads_back_as_megatron_reads_it():
    for counts in ((4,) * 13 + (3,) * 3, (1, 5, 5, 1), (7,), (2, 1), (3, 3, 3, 2)):
        for chunks in (1, 2, 3):
            text = layout_text(counts, chunks)
            assert parse_layout(text, len(counts), sum(counts)) == (counts, chunks if chunks > 1 else None), text


def test_the_flags_that_are_not_megatrons_are_not_in_the_table():
    """TransformerConfig's num_layers_in_first_pipeline_stage has no flag: Megatron's parser leaves it out."""
    j = job("--num-layers-in-first-pipeline-stage 1")
    assert "--num-layers-in-first-pipeline-stage" in j.unknown


# -- the command line ----------------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ds_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "config.json"
    path.write_text(transformers.DeepseekV3Config().to_json_string())
    return str(path)


LAYOUT = ("--pp", "16", "--ep", "64", "--gpus", "2048")


def test_deepseek_v3s_config_runs_as_the_preset_does(ds_config):
    """The acceptance line: DeepSeek-V3's config.json on PP16 x EP64 runs, its 61 layers as even as can be,
    and agrees with the deepseek-v3 preset on the same layout wherever the two models agree. Where they differ:
    the config gives multi-head latent attention, whose parameters it counts exactly, where the preset has
    plain multi-head attention (so the model state differs, by the attention's and its latents' norms' weights),
    and a multi-token prediction layer, which neither counts."""
    text = cli("memory", "--config", ds_config, *LAYOUT)
    assert text.returncode == 0, text.stderr
    assert "61 layers over 16 stages: 13 stages of 4, 3 of 3 (the most memory on stage 2, the slowest stage 2)" \
        in text.stdout
    got = cli("memory", "--config", ds_config, *LAYOUT, "--json")
    want = cli("memory", "--model", "deepseek-v3", *LAYOUT, "--json")
    cfg, pre = json.loads(got.stdout), json.loads(want.stdout)
    assert cfg["stages"]["layers"] == pre["stages"]["layers"] == [4] * 13 + [3] * 3
    assert cfg["stages"]["rule"] == pre["stages"]["rule"] == {"rule": "spread"}
    assert cfg["stage"] == pre["stage"] == 2 and cfg["stages"]["most_memory"] == 2
    assert cfg["time"]["slowest_stage"] == pre["time"]["slowest_stage"] == cfg["stages"]["slowest"]
    assert list(cfg["items"]) == list(pre["items"])
    for item in ("activations", "in-flight micro-batches", "recompute working set", "logits"):
        assert cfg["items"][item] == pytest.approx(pre["items"][item], rel=1e-12), item
    # the named difference: MLA's projections and its two latents' norms against 4 h^2 a layer, 61 layers
    h, n = 7168, 128
    mla = h * 1536 + 1536 * n * (128 + 64) + h * (512 + 64) + 512 * n * (128 + 128) + n * 128 * h
    assert cfg["params"] - pre["params"] == 61 * (mla - 4 * h * h + 1536 + 512)
    assert cfg["model_state"] != pre["model_state"]


def test_first_and_last_counts_on_the_command_line(ds_config):
    got = json.loads(cli("memory", "--config", ds_config, *LAYOUT, "--first-stage-layers", "1", "--json").stdout)
    assert got["stages"]["layers"] == [1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]
    assert got["stages"]["rule"] == {"rule": "first/last", "first": 1, "last": None}
    assert got["stage"] == got["stages"]["most_memory"] == 3  # 4 MoE layers with 14 micro-batches in flight
    assert got["time"]["slowest_stage"] == 16  # 4 MoE layers and the logits
    # Megatron's rule: a last stage of 0 layers is refused (it must be larger than 0), as is a middle that
    # does not divide
    zero = cli("memory", "--config", ds_config, *LAYOUT, "--first-stage-layers", "1", "--last-stage-layers", "0")
    assert zero.returncode == 2 and "positive integer" in zero.stderr and zero.stderr.count("\n") == 1
    odd = cli("memory", "--config", ds_config, *LAYOUT, "--last-stage-layers", "5")
    assert odd.returncode == 2 and "the 56 middle layers do not divide by the 15 middle stages" in odd.stderr


def test_a_stage_list_on_the_command_line():
    got = json.loads(cli("memory", "--model", "deepseek-v3", *LAYOUT, "--stage-layers",
                         "5,4,4,4,4,4,4,4,4,4,4,4,4,4,2,2", "--json").stdout)
    assert got["stages"]["layers"] == [5] + [4] * 13 + [2, 2]
    assert got["stages"]["rule"] == {"rule": "list", "counts": [5] + [4] * 13 + [2, 2]}
    assert got["stage"] == 1  # 3 dense and 2 MoE layers, 16 micro-batches in flight
    for bad, words in (("4,4", "the stage list holds 8 layers, the model has 61"),
                       ("4,x", "layer counts separated by commas"), ("4,0,57", "layer counts separated by commas"),
                       ("30,31", "the stage list has 2 entries (30,31), pp is 16")):
        out = cli("memory", "--model", "deepseek-v3", *LAYOUT, "--stage-layers", bad)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out.stderr
    many = cli("memory", "--model", "deepseek-v3", *LAYOUT, "--stage-layers", ",".join(["1"] * 65_537))
    assert many.returncode == 2 and "at most 65,536 stages in a stage list" in many.stderr
    both = cli("memory", "--model", "deepseek-v3", *LAYOUT, "--stage-layers", "61", "--first-stage-layers", "1")
    assert both.returncode == 2 and "not both" in both.stderr


def test_a_preset_layout_takes_the_stage_flags():
    got = cli("layout", "--layout", "deepseek-v3", "--first-stage-layers", "1", "--nodes", "1")
    assert got.returncode == 0 and "61 layers over 16 stages: 1 stage of 1, 15 of 4" in got.stdout, got.stderr


def test_layout_fit_and_trace_take_the_stage_flags():
    lay = cli("layout", "--pp", "4", "--layers", "10", "--first-stage-layers", "1", "--last-stage-layers", "3")
    assert lay.returncode == 0, lay.stderr
    assert "10 layers over 4 stages: 1 stage of 1, 3 of 3\n" in lay.stdout
    refused = cli("layout", "--pp", "4", "--layers", "10")
    assert refused.returncode == 2 and "--first-stage-layers" in refused.stderr
    no_layers = cli("layout", "--pp", "4", "--first-stage-layers", "1")
    assert no_layers.returncode == 2 and "need the model's layers" in no_layers.stderr
    f = json.loads(cli("fit", "--model", "deepseek-v3", *LAYOUT, "--first-stage-layers", "1", "--json").stdout)
    assert f["stages"]["layers"][0] == 1 and f["binding_stage"] == f["stages"]["most_memory"] == 3
    for command in ("memory", "fit", "layout", "trace"):
        assert "--first-stage-layers" in cli(command, "--help").stdout


def test_the_layout_picture_names_each_stages_layers():
    got = cli("layout", "--pp", "4", "--dp", "8", "--layers", "10", "--first-stage-layers", "1", "--last-stage-layers",
              "3", "--nodes", "2")
    assert got.returncode == 0, got.stderr
    assert "pipeline stage 1 (pp rank 0) (layer 1)" in got.stdout
    assert "pipeline stage 2 (pp rank 1) (layers 2-4)" in got.stdout


def test_trace_of_a_megatron_job_takes_the_stage_flags(tmp_path):
    path = tmp_path / "job.txt"
    path.write_text("--num-layers 5 --hidden-size 64 --num-attention-heads 4 --vocab-size 128 --seq-length 64 "
                    "--pipeline-model-parallel-size 2 --use-distributed-optimizer --bf16\n")
    refused = cli("trace", "--megatron", str(path), "--gpu", "0")
    assert refused.returncode == 2 and "layers 5 do not divide by pp 2" in refused.stderr
    got = cli("trace", "--megatron", str(path), "--gpu", "0", "--first-stage-layers", "3", "--json")
    assert got.returncode == 0, got.stderr
    assert len(json.loads(got.stdout)["experts_per_layer"]) == 3


def test_megatron_job_with_first_and_last_on_the_command_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("torchrun --nproc_per_node 8 --nnodes 256 pretrain_gpt.py " + FLAGS +
                    "--decoder-first-pipeline-num-layers 1\n")
    got = json.loads(cli("memory", "--megatron", str(path), "--json").stdout)
    assert got["stages"]["layers"] == [1] + [4] * 15
    lay = cli("layout", "--megatron", str(path), "--nodes", "1")  # the layout's check takes the job's rule
    assert lay.returncode == 0 and "61 layers over 16 stages: 1 stage of 1, 15 of 4" in lay.stdout, lay.stderr
    other = cli("layout", "--megatron", str(path), "--nodes", "1", "--last-stage-layers", "1")
    assert "61 layers over 16 stages: 15 stages of 4, 1 of 1" in other.stdout, other.stderr
    over = json.loads(cli("memory", "--megatron", str(path), "--last-stage-layers", "1", "--json").stdout)
    assert over["stages"]["layers"] == [4] * 15 + [1]  # the command's flags in place of the job's


def test_each_rule_says_itself_in_json():
    assert Stages(embedding=True, loss=True).to_dict() == {"rule": "embedding/loss", "embedding": True, "loss": True}
    assert Stages().to_dict() == {"rule": "even"} and not Stages().given and SPREAD.given


def test_describe_says_the_runs_in_order():
    assert describe((4,) * 13 + (3,) * 3) == "61 layers over 16 stages: 13 stages of 4, 3 of 3"
    assert describe((1,) + (4,) * 15) == "61 layers over 16 stages: 1 stage of 1, 15 of 4"
    assert describe((15,) * 4) == "60 layers over 4 stages: 15 each"

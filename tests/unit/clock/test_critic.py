"""`parasim check-layout` and `parasim memory --critic` (issue 53, the post's rules of thumb as runs): each rule a
layout breaks, found at its boundary, with the same GPUs following it, timed and sized by the clock's plan and the
estimator."""
import json

import pytest

from conftest import cli

from parasim.clock.plan import plan_time
from parasim.clock.critic import RULES, check_layout, critique
from parasim.estimate.memory import Plan, breakdown
from parasim.estimate.models import get_model

SEQ = 4096


def _names(plan: Plan, model: str = "27b") -> list[str]:
    m = get_model(model)
    return [f.rule.name for f in critique(m, plan.check(m, SEQ), SEQ, "h100")]


def test_each_rule_is_broken_just_past_its_boundary():
    """TP 8 on 8-GPU nodes is inside a node, TP 16 is not; TP without SP breaks the SP rule; DP 1 needs no ZeRO;
    EP 8 of an MoE model is inside a node, EP 16 is not."""
    assert _names(Plan(tp=8, sp=True, dp=2, zero=1)) == []
    assert _names(Plan(tp=16, sp=True, dp=2, zero=1)) == ["tp-inside-a-node", "pp-across-nodes"]
    assert _names(Plan(tp=8, dp=2, zero=1)) == ["sp-with-tp"]
    assert _names(Plan(tp=8, sp=True, dp=1, zero=0)) == []
    assert _names(Plan(tp=8, sp=True, dp=2, zero=0)) == ["zero-1"]
    inside = _names(Plan(tp=2, sp=True, pp=16, dp=32, ep=8, zero=1), "deepseek-v3")
    assert inside == ["cp-for-long-sequences"]  # its activations do not fit an H100's 68 GB: CP is asked for
    assert _names(Plan(tp=2, sp=True, pp=16, dp=32, ep=16, zero=1), "deepseek-v3") == ["ep-inside-a-node"]


def test_tp_inside_a_node_keeps_the_gpus_and_the_batch_and_is_faster_over_two_nodes():
    """TP 16 over two nodes -> TP 8 with twice the DP (the same 32 GPUs and global batch): its TP collectives
    leave the network for NVLink, so the step is shorter; each GPU holds twice the weights, so more memory."""
    m = get_model("27b")
    plan = Plan(tp=16, sp=True, dp=2, zero=1, microbatches=8).check(m, SEQ)
    f, _ = critique(m, plan, SEQ, "h100")
    assert (f.followed.tp, f.followed.dp, f.followed.world) == (8, 4, plan.world)
    assert f.followed.dp * f.followed.m * f.followed.micro_batch == plan.dp * plan.m * plan.micro_batch
    assert f.step_s == plan_time(m, plan, SEQ, "h100")["step_s"]
    assert f.followed_step_s == plan_time(m, f.followed, SEQ, "h100")["step_s"] < f.step_s
    assert f.followed_memory == breakdown(m, f.followed, SEQ).total > f.memory


def test_a_rule_no_layout_here_can_follow_says_why_and_the_overlap_is_timed():
    """TP 8 without SP over 4,100 tokens: SP would need the sequence to divide by 8, so the rule is named with the
    reason and no plan; the step is still this plan's own. The overlap asked for times both plans."""
    m = get_model("27b")
    plan = Plan(tp=8, dp=2, zero=1).check(m, 4100)
    (f,) = critique(m, plan, 4100, "h100")
    assert (f.rule.name, f.followed, f.followed_step_s, f.followed_memory) == ("sp-with-tp", None, None, None)
    assert f.why_not.startswith("sequence 4100 does not divide by cp x tp = 8")
    assert (f.step_s, f.memory) == (plan_time(m, plan, 4100, "h100")["step_s"], breakdown(m, plan, 4100).total)
    wide = Plan(tp=16, sp=True, dp=2, zero=1, microbatches=8).check(m, SEQ)
    g, _ = critique(m, wide, SEQ, "h100", ("tp",))
    assert g.step_s == plan_time(m, wide, SEQ, "h100", ("tp",))["step_s"] != plan_time(m, wide, SEQ, "h100")["step_s"]
    assert g.followed_step_s == plan_time(m, g.followed, SEQ, "h100", ("tp",))["step_s"]


def test_the_command_names_each_broken_rule_with_both_figures_and_json_is_strict():
    out = cli("memory", "--model", "27b", "--tp", "16", "--dp", "2", "--zero", "0", "--critic")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for rule in ("keep TP inside a node", "turn SP on wherever TP is", "(ZeRO-1)"):
        assert rule in text
    assert "Following it, TP8 + DP4" in text and " s -> " in text and " GB" in text
    data = json.loads(cli("memory", "--model", "27b", "--tp", "16", "--dp", "2", "--critic", "--json").stdout,
                      parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert [f["rule"] for f in data["critic"]] == ["tp-inside-a-node", "sp-with-tp", "pp-across-nodes"]
    calm = cli("memory", "--model", "27b", "--tp", "8", "--sp", "--dp", "2", "--zero", "1", "--critic").stdout
    assert "breaks none of those parasim holds a layout to" in " ".join(calm.split())
    assert len(RULES) == 8 and "--critic" in cli("memory", "--help").stdout


def test_cp_is_asked_for_only_where_the_sequence_is_what_does_not_fit():
    """27B at TP 8 + SP holds 54 GB of model state and 66.8 GB of a 40,960-token sequence's activations
    (120.86 GB > 120): broken; at 36,864 it fits (114.2 GB): kept. At TP 1 the model state alone is 432 GB, far
    past a GPU, and CP could not help: kept. CP 2 comes from DP where DP halves (the global batch kept: the
    micro-batches double); from TP it would leave TP x CP, each GPU's share of the tokens, where it was."""
    assert _names(Plan(tp=8, sp=True).check(get_model("27b"), 36864)) == []
    m = get_model("27b")
    assert [f.rule.name for f in critique(m, Plan(tp=8, sp=True).check(m, 40960), 40960, "h200")] == [
        "cp-for-long-sequences"
    ]
    assert "cp-for-long-sequences" not in [f.rule.name for f in critique(m, Plan().check(m, SEQ), SEQ, "h200")]
    (f,) = critique(m, Plan(tp=8, sp=True).check(m, 40960), 40960, "h200")
    assert f.followed is None and f.why_not.startswith("CP needs GPUs of its own, and DP 1 does not halve")
    (g,) = critique(m, Plan(tp=8, sp=True, dp=2, zero=1).check(m, 61440), 61440, "h200")
    assert (g.followed.tp, g.followed.cp, g.followed.dp, g.followed.m) == (8, 2, 1, 2) and g.followed_memory < g.memory
    assert dict((k, (a, b)) for k, a, b in g.changes) == {"cp": (1, 2), "dp": (2, 1), "m": (1, 2)}
    # a plan that has CP already is not asked for it again, however long its sequence
    assert "cp-for-long-sequences" not in [f.rule.name for f in critique(m, Plan(tp=8, sp=True, cp=2).check(m, 131072),
                                                                         131072, "h200")]
    # the room a GPU has is the caller's where it gives one: with 130 GB the 120.86 GB plan fits
    assert critique(m, Plan(tp=8, sp=True).check(m, 40960), 40960, "h200", usable=130e9) == []


def test_pp_spans_the_nodes_where_tp_or_cp_did_and_wants_as_many_microbatches_as_stages():
    """TP 16 over two 8-GPU nodes -> TP 8 with 2 stages (DP and each replica's 8 micro-batches kept); TP 8 x CP 2
    is 16 too, and halves TP first. Micro-batches: 1F1B with m = p - 1 is broken, m = p kept; a replica's 2 x 4
    sequences cut into 4 micro-batches of 2 for 4 stages; 2 sequences of one cannot make 4 micro-batches."""
    m = get_model("27b")
    wide = Plan(tp=16, sp=True, dp=2, zero=1, microbatches=8).check(m, SEQ)
    pp = {f.rule.name: f for f in critique(m, wide, SEQ, "h100")}["pp-across-nodes"]
    assert (pp.followed.tp, pp.followed.pp, pp.followed.dp, pp.followed.m) == (8, 2, 2, 8)
    assert pp.followed_step_s < pp.step_s
    ring = {f.rule.name: f for f in critique(m, Plan(tp=8, cp=2, sp=True, zero=1).check(m, SEQ), SEQ, "h100")}
    assert (ring["pp-across-nodes"].followed.tp, ring["pp-across-nodes"].followed.cp) == (4, 2)
    assert _names(Plan(tp=8, sp=True, pp=4, microbatches=3)) == ["pp-enough-microbatches"]
    assert _names(Plan(tp=8, sp=True, pp=4, microbatches=4)) == []
    (f,) = critique(m, Plan(tp=8, sp=True, pp=4, micro_batch=4, microbatches=2).check(m, SEQ), SEQ, "h100")
    assert (f.followed.m, f.followed.micro_batch) == (4, 2) and f.followed_step_s < f.step_s
    (g,) = critique(m, Plan(tp=8, sp=True, pp=4, microbatches=2).check(m, SEQ), SEQ, "h100")
    assert g.followed is None and "2 sequences a step make fewer micro-batches than its 4 stages" in g.why_not


def test_check_layout_holds_every_rule_once_kept_or_broken_with_the_plans_own_figures():
    m = get_model("27b")
    plan = Plan(tp=16, dp=2, zero=0).check(m, SEQ)
    found = check_layout(m, plan, SEQ, "h200")
    broken = [f.rule.name for f in found.findings]
    assert broken == ["tp-inside-a-node", "sp-with-tp", "pp-across-nodes", "zero-1"]
    assert [r.name for r in found.kept] == [
        "cp-for-long-sequences", "pp-enough-microbatches", "ep-inside-a-node", "etp-1"
    ]
    assert found.step_s == plan_time(m, plan, SEQ, "h200")["step_s"]
    assert found.memory == breakdown(m, plan, SEQ).total and found.usable == 120e9
    d = json.loads(json.dumps(found.to_dict()))
    assert (d["layout"], len(d["broken"]), len(d["kept"])) == ("TP16 + DP2 + ZeRO-0", 4, 4)


def test_the_check_layout_command_says_each_rule_and_what_it_moved():
    out = cli("check-layout", "--model", "27b", "--tp", "16", "--dp", "2", "--zero", "0")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "Broken: 4 of the 8 rules of thumb:" in text and "Kept, or not in play here: 4 of 8:" in text
    assert "TP8 + PP2 + DP2 + ZeRO-0 (TP 16 -> 8, PP 1 -> 2): step" in text
    assert "(SP off -> on)" in text and "(ZeRO 0 -> 1)" in text and "fits in its 120 GB usable" in text
    long = " ".join(cli("check-layout", "--model", "27b", "--tp", "8", "--seq", "131072").stdout.split())
    assert "GB on the busiest GPU (does not fit in its 120 GB usable)" in long
    few = " ".join(cli("check-layout", "--model", "27b", "--tp", "8", "--sp", "--pp", "4", "--micro-batch", "4",
                       "--microbatches", "2").stdout.split())
    assert "(micro-batch 4 -> 2, micro-batches 2 -> 4)" in few
    none = " ".join(cli("check-layout", "--model", "27b", "--tp", "2", "--sp", "--pp", "4",
                        "--microbatches", "2").stdout.split())
    assert "No layout of these GPUs follows it: a replica's 2 sequences" in none and "follows it (" not in none
    data = json.loads(cli("check-layout", "--model", "27b", "--tp", "8", "--sp", "--json").stdout,
                      parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["broken"] == [] and len(data["kept"]) == 8 and data["unit"] == "GB"
    bad = cli("check-layout", "--model", "27b", "--symbolic")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--emit" not in cli("check-layout", "--help").stdout


def test_the_micro_batch_search_is_bounded():
    """A replica's sequences a prime number too large to try every count: the rule says no layout follows it,
    at once, naming the counts it tried."""
    m = get_model("27b")
    big = Plan(tp=8, sp=True, pp=4, micro_batch=1_000_000_007, microbatches=1).check(m, SEQ)
    (f,) = [f for f in critique(m, big, SEQ, "h100") if f.rule.name == "pp-enough-microbatches"]
    assert f.followed is None and "split evenly into no count of micro-batches from its 4 stages to 1,032" in f.why_not

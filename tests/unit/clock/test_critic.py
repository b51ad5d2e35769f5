"""`parasim memory --critic` (issue 53, the post's rules of thumb as runs): each rule a layout breaks, found at
its boundary, with the same GPUs following it, timed and sized by the clock's plan and the estimator."""
import json

import pytest

from conftest import cli

from parasim.clock.plan import plan_time
from parasim.clock.critic import RULES, critique
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
    assert _names(Plan(tp=16, sp=True, dp=2, zero=1)) == ["tp-inside-a-node"]
    assert _names(Plan(tp=8, dp=2, zero=1)) == ["sp-with-tp"]
    assert _names(Plan(tp=8, sp=True, dp=1, zero=0)) == []
    assert _names(Plan(tp=8, sp=True, dp=2, zero=0)) == ["zero-1"]
    assert _names(Plan(tp=2, sp=True, pp=16, dp=32, ep=8, zero=1), "deepseek-v3") == []
    assert _names(Plan(tp=2, sp=True, pp=16, dp=32, ep=16, zero=1), "deepseek-v3") == ["ep-inside-a-node"]


def test_tp_inside_a_node_keeps_the_gpus_and_the_batch_and_is_faster_over_two_nodes():
    """TP 16 over two nodes -> TP 8 with twice the DP (the same 32 GPUs and global batch): its TP collectives
    leave the network for NVLink, so the step is shorter; each GPU holds twice the weights, so more memory."""
    m = get_model("27b")
    plan = Plan(tp=16, sp=True, dp=2, zero=1, microbatches=8).check(m, SEQ)
    (f,) = critique(m, plan, SEQ, "h100")
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
    (g,) = critique(m, wide, SEQ, "h100", ("tp",))
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
    assert [f["rule"] for f in data["critic"]] == ["tp-inside-a-node", "sp-with-tp"]
    calm = cli("memory", "--model", "27b", "--tp", "8", "--sp", "--dp", "2", "--zero", "1", "--critic").stdout
    assert "breaks none of those parasim holds a layout to" in " ".join(calm.split())
    assert len(RULES) == 4 and "--critic" in cli("memory", "--help").stdout

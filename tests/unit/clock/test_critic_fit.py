"""`parasim check-layout`'s fixes that fit, the ETP 1 rule, and an MoE layout without SP scored, not refused.

Every expected figure is computed here from the hand-built plan (breakdown, plan_time) or by hand from the model's
shapes, never read from the finding under test."""

import json

import pytest

from conftest import cli

from parasim.clock.critic import RULES, critique
from parasim.clock.plan import plan_time
from parasim.estimate.memory import Plan, breakdown
from parasim.estimate.models import get_model

SEQ = 4096
USABLE = 120e9  # an H200's usable bytes, the default of check-layout
DEEPSEEK = ("--model", "deepseek-v3", "--tp", "2", "--etp", "2", "--ep", "16", "--pp", "8", "--gpus", "256")


def _strict(text: str) -> dict:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))


def _rule(found: list, name: str):
    (f,) = [f for f in found if f.rule.name == name]
    return f


def _ds(**given) -> Plan:
    """DeepSeek-V3 at TP 2 + SP, PP 8 on 256 GPUs with `given` in place, checked."""
    m = get_model("deepseek-v3")
    return Plan(**{"tp": 2, "sp": True, "pp": 8, "world": 256, **given}).check(m, SEQ)


def test_a_fix_that_does_not_fit_is_said_and_the_nearest_that_fits_is_shown():
    """EP 16 -> 8 at ZeRO-0 holds twice the experts a GPU (EDP 1 -> 2): more than the 120 GB usable. The same EP 8
    with ZeRO-1 fits, and is the one shown, with both plans' figures."""
    m = get_model("deepseek-v3")
    plan = _ds(etp=2, ep=16, zero=0)
    f = _rule(critique(m, plan, SEQ, "h200"), "ep-inside-a-node")
    alone, fitting = _ds(etp=2, ep=8, zero=0), _ds(etp=2, ep=8, zero=1)
    assert breakdown(m, plan, SEQ).total <= USABLE < breakdown(m, alone, SEQ).total  # the layout fits, EP 8 not
    assert f.nearest == alone and f.nearest_memory == breakdown(m, alone, SEQ).total
    assert f.followed == fitting and f.fits is True
    assert f.followed_memory == breakdown(m, fitting, SEQ).total <= USABLE
    assert f.followed_step_s == plan_time(m, fitting, SEQ, "h200")["step_s"]
    assert dict((k, (a, b)) for k, a, b in f.changes) == {"ep": (16, 8), "zero": (0, 1), "edp": (1, 2)}
    assert dict((k, (a, b)) for k, a, b in f.nearest_changes) == {"ep": (16, 8), "edp": (1, 2)}
    out = cli("check-layout", *DEEPSEEK, "--sp", "--zero", "0")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    alone_gb = f"{breakdown(m, alone, SEQ).total / 1e9:.1f}"
    assert f"does not fit: {alone_gb} GB > 120 GB usable" in text and "The nearest that follows it and fits" in text
    got = _rule_dict(
        _strict(cli("check-layout", *DEEPSEEK, "--sp", "--zero", "0", "--json").stdout), "ep-inside-a-node"
    )
    assert (got["followed_fits"], got["nearest"], got["nearest_memory_bytes"]) == (
        True,
        alone.label(),
        breakdown(m, alone, SEQ).total,
    )
    assert got["usable_bytes"] == USABLE and got["changes"]["zero"] == [0, 1]


def _rule_dict(data: dict, name: str) -> dict:
    (f,) = [f for f in data["broken"] if f["rule"] == name]
    return f


def test_where_nothing_nearby_fits_the_rule_cannot_be_followed_here():
    """27B at TP 16 + SP on 16 GPUs (ZeRO-1 already): TP 8 doubles DP and each GPU's weights; the roomier try, TP 8
    on two stages, holds more than TP 16 too. With room between the layout's memory and theirs, the layout fits
    and the rule cannot be followed without running out of memory: said, with the nearest's figures."""
    m = get_model("27b")
    plan = Plan(tp=16, sp=True, world=16).check(m, SEQ)
    nearest = Plan(tp=8, sp=True, world=16, microbatches=1).check(m, SEQ)
    deeper = Plan(tp=8, sp=True, pp=2, world=16, microbatches=2).check(m, SEQ)
    mine, near, deep = (breakdown(m, p, SEQ).total for p in (plan, nearest, deeper))
    assert mine < min(near, deep)
    room = (mine + min(near, deep)) / 2
    f = _rule(critique(m, plan, SEQ, "h100", usable=room), "tp-inside-a-node")
    assert (f.followed, f.fits, f.followed_memory, f.nearest) == (nearest, False, near, None)
    assert f.tried == (deeper.label(),)
    gb = room / 1e9
    out = cli(
        "check-layout", "--model", "27b", "--tp", "16", "--sp", "--gpus", "16", "--gpu", "h100", "--usable", f"{gb}"
    )
    text = " ".join(out.stdout.split())
    assert f"does not fit, {near / 1e9:.1f} GB > {gb:.0f} GB usable" in text
    assert "here it cannot be followed without running out of memory" in text
    assert f"nor does any roomier layout tried that follows it ({deeper.label()})" in text


def test_the_fit_test_is_every_rules_and_prefers_the_roomier_plan_to_the_nearest():
    """27B at TP 8 on 32 GPUs, 65,536 tokens, ZeRO-0: SP alone leaves 161 GB; SP with ZeRO-1 and twice the stages
    from half the DP fits. Every finding's `fits` is its followed plan's memory against the room."""
    m, s = get_model("27b"), 65536
    plan = Plan(tp=8, dp=4, zero=0).check(m, s)
    found = critique(m, plan, s, "h200")
    f = _rule(found, "sp-with-tp")
    sp_only = Plan(tp=8, sp=True, dp=4, zero=0).check(m, s)
    both = Plan(tp=8, sp=True, pp=2, dp=2, zero=1, microbatches=2).check(m, s)
    tried = [
        Plan(tp=8, sp=True, dp=4, zero=1).check(m, s),
        Plan(tp=8, sp=True, pp=2, dp=2, zero=0, microbatches=2).check(m, s),
    ]
    assert breakdown(m, sp_only, s).total > USABLE and all(breakdown(m, p, s).total > USABLE for p in tried)
    assert (f.nearest, f.followed, f.fits) == (sp_only, both, True)
    assert f.followed_memory == breakdown(m, both, s).total <= USABLE
    for g in found:
        assert g.fits == (g.followed_memory <= USABLE) and g.usable == USABLE


def test_etp_1_is_broken_by_an_expert_split_and_its_bytes_are_counted_from_the_shapes():
    """DeepSeek-V3 at ETP 2: broken (a dense model, or ETP 1, keeps it). EP 32 would span more nodes, so ETP's GPUs
    go to EDP (EP kept at 16, EDP 1 -> 2: each GPU its 16 experts whole, twice the expert weights). The ETP collectives, by hand: each GPU routes
    s/TP = 2,048 tokens (SP), 8 copies each of 7,168 values in 2 bytes; the ETP group all-gathers the copies
    (etp x that buffer, each rank sending (etp - 1)/etp of it) and reduce-scatters the outputs, forward and again
    backward: 4 x (etp - 1) x 2,048 x 8 x 7,168 x 2 bytes a layer and micro-batch. 61 layers on 8 stages are 8 on
    each of the first five (the first with the 3 dense ones), so the busiest stage runs 8 MoE layers, 8 times
    each (8 micro-batches: PP's default)."""
    m = get_model("deepseek-v3")
    plan = _ds(etp=2, ep=16, zero=1)
    f = _rule(critique(m, plan, SEQ, "h200"), "etp-1")
    wide = _ds(etp=1, ep=16, zero=1)
    assert f.followed == wide and f.fits is True
    assert (f.followed_memory, f.followed_step_s) == (
        breakdown(m, wide, SEQ).total,
        plan_time(m, wide, SEQ, "h200")["step_s"],
    )
    assert (f.memory, f.step_s) == (breakdown(m, plan, SEQ).total, plan_time(m, plan, SEQ, "h200")["step_s"])
    assert dict((k, (a, b)) for k, a, b in f.changes) == {"etp": (2, 1), "edp": (1, 2)}
    layer = 4 * (2 - 1) * 2048 * 8 * 7168 * 2
    assert dict(f.figures) == {
        "a GPU each MoE layer and micro-batch": layer,
        "a step on the busiest stage": layer * 8 * 8,
    }
    assert "leaves out its own collectives" in f.note  # the step shown does not time them: said
    assert "etp-1" not in [g.rule.name for g in critique(m, _ds(etp=1, ep=16), SEQ, "h200")]
    dense = get_model("27b")
    assert "etp-1" not in [
        g.rule.name for g in critique(dense, Plan(tp=8, sp=True, etp=2).check(dense, SEQ), SEQ, "h200")
    ]
    assert [r.name for r in RULES][-1] == "etp-1"


def test_etp_gives_its_gpus_to_edp_where_ep_would_leave_its_node():
    """EP 8 inside a node at ETP 2: EP 16 would cross nodes, so ETP's GPUs go to the experts' data parallelism
    (EDP 2 -> 4), each GPU then holding its 32 experts whole."""
    m = get_model("deepseek-v3")
    plan = _ds(etp=2, ep=8, zero=1)
    f = _rule(critique(m, plan, SEQ, "h200"), "etp-1")
    by_edp = _ds(etp=1, ep=8, zero=1)
    assert (by_edp.ep, by_edp.edp, plan.edp) == (8, 4, 2)
    assert f.followed == by_edp and f.followed_memory == breakdown(m, by_edp, SEQ).total <= USABLE
    assert dict((k, (a, b)) for k, a, b in f.changes) == {"etp": (2, 1), "edp": (2, 4)}


def test_an_moe_layout_without_sp_is_scored_as_the_sp_rule_broken():
    """DeepSeek-V3 at TP 2 without SP: Megatron-Core refuses it, and `memory` still does; check-layout and
    memory --critic score it: the SP rule broken, its cost the plan with SP on. The layout's own figures are the
    estimator's for it as written (the plan built without its model attached, which is what refuses it)."""
    m = get_model("deepseek-v3")
    out = cli("check-layout", *DEEPSEEK)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "Megatron-Core refuses an MoE model under TP without SP" in text
    data = _strict(cli("check-layout", *DEEPSEEK, "--json").stdout)
    raw = Plan(tp=2, etp=2, ep=16, pp=8, world=256)  # no model attached: nothing refuses it
    assert data["memory_bytes"] == breakdown(m, raw, SEQ).total
    assert data["step_s"] == plan_time(m, raw, SEQ, "h200")["step_s"]
    sp = _rule_dict(data, "sp-with-tp")
    on = _ds(etp=2, ep=16)
    assert sp["followed"] == on.label() and sp["changes"] == {"sp": [False, True]}
    assert (sp["followed_memory_bytes"], sp["followed_step_s"]) == (
        breakdown(m, on, SEQ).total,
        plan_time(m, on, SEQ, "h200")["step_s"],
    )
    # other rules' plans keep SP off (the SP rule is its own finding), so they are scored too
    assert _rule_dict(data, "ep-inside-a-node")["changes"]["ep"] == [16, 8]
    critic = cli("memory", *DEEPSEEK, "--critic", "--json")
    assert critic.returncode == 0 and "sp-with-tp" in [f["rule"] for f in _strict(critic.stdout)["critic"]]
    refused = cli("memory", *DEEPSEEK)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "needs sequence parallelism" in refused.stderr


def test_etp_falls_back_to_edp_where_ep_cannot_take_the_gpus():
    """moe16's 8 experts on 4-GPU nodes at EP 8 (already across nodes) x ETP 2: EP would come first, but EP 16
    is more than its experts, so the layout rules refuse it and EDP takes ETP's GPUs (1 -> 2)."""
    m = get_model("moe16")
    plan = Plan(tp=2, sp=True, ep=8, etp=2, world=16, gpus_per_node=4).check(m, SEQ)
    f = _rule(critique(m, plan, SEQ, "h200"), "etp-1")
    by_edp = Plan(tp=2, sp=True, ep=8, etp=1, world=16, gpus_per_node=4).check(m, SEQ)
    assert m.experts == 8 and f.followed == by_edp and by_edp.edp == 2
    assert f.followed_memory == breakdown(m, by_edp, SEQ).total


def test_following_etp_1_never_breaks_ep_inside_a_node_again():
    """EP 16 over two nodes at ETP 2: EP 32 would take the freed GPUs across more nodes, so EDP takes them
    (EP kept at 16); applied, the layout breaks no rule it did not break before, and following the EP rule
    then brings EP inside a node: no fix sends a learner back to another."""
    m = get_model("deepseek-v3")
    plan = _ds(etp=2, ep=16, zero=1)
    f = _rule(critique(m, plan, SEQ, "h200"), "etp-1")
    assert (f.followed.etp, f.followed.ep) == (1, 16)
    before = {x.rule.name for x in critique(m, plan, SEQ, "h200")}
    after = {x.rule.name for x in critique(m, f.followed, SEQ, "h200")}
    assert after <= before - {"etp-1"}


def test_a_finding_names_the_rules_its_layout_still_breaks():
    """DeepSeek-V3 at TP 2 without SP, ETP 2, EP 16: following ETP 1 leads to a layout that still breaks the SP
    and EP rules (each held to that layout here, rule by rule); the text says which, by their words."""
    from parasim.clock.critic import RULES, Case

    m = get_model("deepseek-v3")
    out = cli("check-layout", *DEEPSEEK, "--json")
    data = _strict(out.stdout)
    etp = next(f for f in data["broken"] if f["rule"] == "etp-1")
    assert etp["still_broken"] and "etp-1" not in etp["still_broken"]
    assert set(etp["still_broken"]) <= {r.name for r in RULES}
    text = " ".join(cli("check-layout", *DEEPSEEK).stdout.split())
    says = {r.name: r.says for r in RULES}
    assert "The layout it leads to still breaks: " + "; ".join(says[n] for n in etp["still_broken"]) in text
    # the same, held rule by rule to the layout the ETP finding leads to, in the library
    from parasim.clock.critic import scored

    no_sp = scored(Plan(tp=2, sp=False, pp=8, world=256, etp=2, ep=16, zero=1)).check(m, SEQ)
    f = _rule(critique(m, no_sp, SEQ, "h200"), "etp-1")
    assert f.still_broken == tuple(r.name for r in RULES if r.name != "etp-1"
                                   and r.broken(Case(m, f.followed, SEQ, USABLE)))
    assert "sp-with-tp" in f.still_broken

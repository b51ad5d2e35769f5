"""The critic's edges (parasim/clock/critic.py): each rule's follow at the sizes where its branches part, the
roomier tries, the ETP note's figures, the SP note, and the fit test's ties and refusals.

Every expected plan is built here by hand from the plan's sizes, and every expected figure worked out by hand
(memory thresholds from the estimator's breakdown, which is not under test here), never read from the critic."""

from types import SimpleNamespace

import pytest

from parasim.clock.critic import (
    RULES,
    Case,
    Finding,
    _enough_microbatches,
    _etp_note,
    _etp_one,
    _made,
    _moe_without_sp,
    _pp_across,
    _roomier,
    _routed,
    _sp_note,
    _tp_inside,
    critique,
    scored,
)
from parasim.errors import UsageError
from parasim.estimate.memory import Plan, breakdown
from parasim.estimate.models import get_model

SEQ = 4096
USABLE = 120e9


def _bare(plan: Plan) -> Case:
    """A case for the follows that read only the plan's sizes (no model attached)."""
    return Case(None, plan, SEQ, USABLE)


def _rule(found: list, name: str):
    (f,) = [f for f in found if f.rule.name == name]
    return f


def _ds(**given) -> Plan:
    """DeepSeek-V3 at TP 2 + SP, PP 8 on 256 GPUs with `given` in place, checked."""
    return Plan(**{"tp": 2, "sp": True, "pp": 8, "world": 256, **given}).check(get_model("deepseek-v3"), SEQ)


# -- _made ------------------------------------------------------------------------------------------------
def test_made_keeps_the_allowed_plans_in_order_and_raises_the_first_refusal_where_none_is():
    def first():
        raise UsageError("the first refusal")

    def second():
        raise UsageError("the second refusal")

    a, b = Plan(tp=2), Plan(dp=2)
    assert _made(first, lambda: a, second, lambda: b) == (a, b)
    with pytest.raises(UsageError, match="^the first refusal$"):
        _made(first, second)


# -- TP inside a node -------------------------------------------------------------------------------------
def test_tp_inside_keeps_the_micro_batches_a_whole_number():
    """TP 16 x DP 2 with 3 micro-batches -> TP 8 x DP 4: the 2 x 3 = 6 micro-batches of the global batch over
    4 replicas floor to 1 each (an int, never 1.5)."""
    (got,) = _tp_inside(_bare(Plan(tp=16, dp=2, microbatches=3)))
    assert got == Plan(tp=8, dp=4, microbatches=1)
    assert type(got.microbatches) is int


# -- PP across nodes --------------------------------------------------------------------------------------
def test_pp_across_halves_cp_where_tp_is_odd_or_one():
    """TP 3 x CP 4 = 12 on 8-GPU nodes: TP 3 does not halve, so CP does (4 -> 2, PP 1 -> 2: 3 x 2 = 6 fits)."""
    assert _pp_across(_bare(Plan(tp=3, cp=4))) == (Plan(tp=3, cp=2, pp=2, microbatches=1),)
    # TP 1 x CP 16: CP halves once (16 -> 8), the factor to PP
    assert _pp_across(_bare(Plan(cp=16))) == (Plan(cp=8, pp=2, microbatches=1),)
    # TP 2 x CP 8: TP halves first, to 1 (CP kept at 8)
    assert _pp_across(_bare(Plan(tp=2, cp=8))) == (Plan(cp=8, pp=2, microbatches=1),)


def test_pp_across_doubles_the_stages_at_each_halving():
    """TP 32 on 8-GPU nodes: halved twice (32 -> 16 -> 8), so PP 1 -> 2 -> 4; DP and the micro-batches kept."""
    assert _pp_across(_bare(Plan(tp=32, microbatches=5))) == (Plan(tp=8, pp=4, microbatches=5),)


def test_pp_across_says_so_where_nothing_halves_to_a_node():
    with pytest.raises(UsageError, match="TP 3 x CP 3 halves to no size that fits a node of 8"):
        _pp_across(_bare(Plan(tp=3, cp=3)))


# -- enough micro-batches ---------------------------------------------------------------------------------
def test_enough_microbatches_at_exactly_as_many_sequences_as_stages():
    """4 stages, a replica's 2 x 2 = 4 sequences: 4 micro-batches of 1."""
    assert _enough_microbatches(_bare(Plan(pp=4, micro_batch=2, microbatches=2))) == (
        Plan(pp=4, micro_batch=1, microbatches=4),
    )


def test_enough_microbatches_takes_the_first_count_that_divides_above_the_stages():
    """4 stages, 2 x 5 = 10 sequences: 4 does not divide 10, 5 does: 5 micro-batches of 2 (not PP's default 4)."""
    assert _enough_microbatches(_bare(Plan(pp=4, micro_batch=5, microbatches=2))) == (
        Plan(pp=4, micro_batch=2, microbatches=5),
    )


def test_enough_microbatches_stops_at_twice_the_stages_and_1024():
    """1,033 sequences (a prime) on 4 stages: the counts tried run 4 .. 2 x 4 + 1,024 = 1,032; the one count that
    divides, 1,033 itself, is past that, so none is found."""
    with pytest.raises(UsageError, match="from its 4 stages to 1,032"):
        _enough_microbatches(_bare(Plan(pp=4, micro_batch=1033, microbatches=1)))


# -- ETP 1 ------------------------------------------------------------------------------------------------
def test_etp_one_gives_the_gpus_to_ep_first_while_ep_x_etp_fits_a_node():
    """EP 4 x ETP 2 = 8 GPUs, a whole 8-GPU node: EP 8 first (EDP kept at 4), then EDP (EP 4, EDP 4 -> 8)."""
    m = get_model("deepseek-v3")
    plan = _ds(etp=2, ep=4)
    by_ep, by_edp = _ds(etp=1, ep=8), _ds(etp=1, ep=4)
    assert (plan.edp, by_ep.edp, by_edp.edp) == (4, 4, 8)
    assert _etp_one(Case(m, plan, SEQ, USABLE)) == (by_ep, by_edp)


def test_etp_one_takes_ep_past_a_node_where_edp_is_refused():
    """TP 16 + SP, EP 8 x ETP 2 = 16 on 8-GPU nodes, rank order tp-cp-ep-pp-dp: EDP is tried first, but with PP
    > 1 that order needs EDP = DP (2), and ETP 1 would make EDP 4; EP 16 keeps EDP at 2, so it is the plan."""
    m = get_model("deepseek-v3")
    order = "tp-cp-ep-pp-dp"
    plan = Plan(tp=16, sp=True, pp=8, world=256, etp=2, ep=8, order=order).check(m, SEQ)
    assert (plan.dp, plan.edp) == (2, 2)
    want = Plan(tp=16, sp=True, pp=8, world=256, etp=1, ep=16, order=order).check(m, SEQ)
    assert _etp_one(Case(m, plan, SEQ, USABLE)) == (want,)


def test_etp_one_falls_back_to_edp_inside_a_node_where_ep_is_refused():
    """moe16's 8 experts on 16-GPU nodes at EP 8 x ETP 2 = 16: inside the node, so EP first, but EP 16 is more
    than its experts: EDP takes ETP's GPUs (EP 8, EDP 1 -> 2)."""
    m = get_model("moe16")
    plan = Plan(tp=2, sp=True, ep=8, etp=2, world=16, gpus_per_node=16).check(m, SEQ)
    want = Plan(tp=2, sp=True, ep=8, etp=1, world=16, gpus_per_node=16).check(m, SEQ)
    assert _etp_one(Case(m, plan, SEQ, USABLE)) == (want,)
    f = _rule(critique(m, plan, SEQ, "h200"), "etp-1")
    assert f.followed == want and f.why_not == ""


# -- the tokens routed and ETP's bytes --------------------------------------------------------------------
def test_routed_tokens_are_the_cp_share_and_under_sp_the_tp_share():
    """3 sequences of 4,096 tokens at CP 2: 6,144 tokens a GPU; SP at TP 2 halves that to 3,072; without SP TP
    leaves it whole."""
    m = get_model("27b")
    assert _routed(Case(m, Plan(tp=2, cp=2, micro_batch=3), SEQ, USABLE)) == 3 * 4096 / 2
    assert _routed(Case(m, Plan(tp=2, cp=2, sp=True, micro_batch=3), SEQ, USABLE)) == 3 * 4096 / 2 / 2
    assert _routed(Case(m, Plan(micro_batch=3), SEQ, USABLE)) == 3 * 4096


def test_etp_note_counts_the_forward_again_under_full_recomputation():
    """DeepSeek-V3 at TP 2 + SP, ETP 2, full recomputation: the forward and its collectives run twice, so each
    of the all-gather and the reduce-scatter is sent 3 times (2 forward, 1 backward), not 2: 2 x 3 x (etp - 1)
    x 2,048 routed tokens x 8 copies x 7,168 values x 2 bytes a layer; the busiest stage runs 8 MoE layers, 8
    micro-batches each."""
    m = get_model("deepseek-v3")
    text, figures = _etp_note(Case(m, _ds(etp=2, ep=16, recompute="full"), SEQ, USABLE))
    layer = 2 * 3 * (2 - 1) * 2048 * 8 * 7168 * 2
    assert figures == (("a GPU each MoE layer and micro-batch", layer), ("a step on the busiest stage", layer * 8 * 8))
    assert text.startswith("The step shown for ETP 2 leaves out its own collectives")
    assert "(the clock runs every expert whole on its GPU); what its all-gather" in text
    assert text.endswith("the routed tokens over the ETP group send, forward and again backward")


# -- SP with TP: an MoE layout Megatron-Core refuses ------------------------------------------------------
def test_moe_without_sp_is_an_moe_model_of_two_or_more_experts_under_tp_without_sp():
    def case(experts, tp, sp=False):
        return Case(SimpleNamespace(experts=experts), Plan(tp=tp, sp=sp), SEQ, USABLE)

    assert _moe_without_sp(case(2, 2)) is True
    assert _moe_without_sp(case(8, 2, sp=True)) is False
    assert _moe_without_sp(case(8, 1)) is False  # no TP
    assert _moe_without_sp(case(1, 2)) is False  # one expert is a dense MLP
    assert _moe_without_sp(case(0, 2)) is False  # a dense model
    assert _moe_without_sp(case(None, 2)) is False


def test_the_sp_note_speaks_only_for_an_moe_model_and_in_full():
    dense = get_model("27b")
    assert _sp_note(Case(dense, Plan(tp=8), SEQ, USABLE)) == ("", ())
    m = get_model("deepseek-v3")
    raw = scored(Plan(tp=2, pp=8, world=256, etp=2, ep=16)).check(m, SEQ)
    text, figures = _sp_note(Case(m, raw, SEQ, USABLE))
    assert figures == ()
    assert text.startswith("Megatron-Core refuses an MoE model under TP without SP, so no run trains this layout")
    assert text.endswith(
        "step and memory are the estimator's for it as written, each TP rank routing all of its tokens"
    )


# -- the roomier tries ------------------------------------------------------------------------------------
def _made_all(plan: Plan) -> list[Plan]:
    return [make() for make in _roomier(plan)]


def test_roomier_offers_zero_1_only_where_some_group_shards_it():
    """One GPU: nothing to shard, no DP to halve. TP 2 (ETP 1): DP 1 but EDP 2, the experts' state shards. CP 2
    with EP 2: DP x CP = 2, EDP 1. DP 1 and CP 1 with EP 2: EDP 1, nothing shards."""
    assert _roomier(Plan(zero=0)) == ()
    assert Plan(tp=2).edp == 2 and _made_all(Plan(tp=2, zero=0)) == [Plan(tp=2, zero=1)]
    assert Plan(cp=2, ep=2).edp == 1 and _made_all(Plan(cp=2, ep=2, zero=0)) == [Plan(cp=2, ep=2, zero=1)]
    assert _roomier(Plan(tp=2, ep=2, zero=0)) == ()  # EDP = 2 / (ETP 1 x EP 2) = 1, DP 1
    assert _roomier(Plan(tp=2, zero=1)) == ()  # ZeRO-1 already, DP odd


def test_roomier_doubles_the_stages_from_half_the_dp_and_the_micro_batches_with_them():
    """DP 2 with 3 micro-batches at ZeRO-0: ZeRO-1; PP 2 from DP 1 with 6 micro-batches (the global batch kept);
    then both."""
    assert _made_all(Plan(dp=2, zero=0, microbatches=3)) == [
        Plan(dp=2, zero=1, microbatches=3),
        Plan(pp=2, dp=1, zero=0, microbatches=6),
        Plan(pp=2, dp=1, zero=1, microbatches=6),
    ]


# -- critique: notes, ties, refusals ----------------------------------------------------------------------
def test_a_rule_without_a_note_and_a_dense_model_without_sp_have_no_note():
    m = get_model("27b")
    found = critique(m, Plan(tp=8, dp=2, zero=0).check(m, SEQ), SEQ, "h200")
    assert [f.rule.name for f in found] == ["sp-with-tp", "zero-1"]
    for f in found:
        assert (f.note, f.figures) == ("", ())
        assert f.to_dict()["note"] is None and f.to_dict()["figures"] == []


def test_finding_to_dict_lists_the_figures():
    f = Finding(RULES[-1], None, None, None, 1.0, None, figures=(("a layer", 3.0), ("a step", 24.0)))
    assert f.to_dict()["figures"] == [{"what": "a layer", "bytes": 3.0}, {"what": "a step", "bytes": 24.0}]


def test_a_plan_that_fills_the_room_exactly_fits_and_is_the_nearest():
    """27B at TP 8 without SP, DP 4, ZeRO-0, the room exactly SP's plan's bytes: that plan fits (at most the room,
    not less than it), no roomier one is tried, and nothing moved."""
    m = get_model("27b")
    sp_on = Plan(tp=8, sp=True, dp=4, zero=0).check(m, SEQ)
    room = breakdown(m, sp_on, SEQ).total
    f = _rule(critique(m, Plan(tp=8, dp=4, zero=0).check(m, SEQ), SEQ, "h200", usable=room), "sp-with-tp")
    assert (f.followed, f.fits, f.followed_memory) == (sp_on, True, room)
    assert (f.nearest, f.nearest_memory, f.nearest_changes, f.tried) == (None, None, (), ())


def test_a_roomier_plan_that_fits_lists_no_others_tried():
    """The room exactly SP's plan with ZeRO-1: SP alone holds more, so the roomier plan is shown, the nearest
    beside it, and nothing under `tried` (that is for plans none of which fit)."""
    m = get_model("27b")
    sp_on = Plan(tp=8, sp=True, dp=4, zero=0).check(m, SEQ)
    sharded = Plan(tp=8, sp=True, dp=4, zero=1).check(m, SEQ)
    room = breakdown(m, sharded, SEQ).total
    assert breakdown(m, sp_on, SEQ).total > room
    f = _rule(critique(m, Plan(tp=8, dp=4, zero=0).check(m, SEQ), SEQ, "h200", usable=room), "sp-with-tp")
    assert (f.followed, f.fits, f.nearest, f.tried) == (sharded, True, sp_on, ())


def test_a_refused_roomier_plan_does_not_stop_the_next_plan_being_tried():
    """moe16 at TP 2 + SP, DP 2, EP 2 x ETP 2 on 4 GPUs, with no room: ETP's GPUs go to EP 4 first (EDP 1), whose
    roomier try, PP 2 from DP 1, is refused (4 GPUs do not divide by EP 4 x PP 2); EDP's plan (EP 2, EDP 2)
    and its own PP 2 are tried after it, and listed as tried."""
    m = get_model("moe16")
    plan = Plan(tp=2, sp=True, dp=2, ep=2, etp=2).check(m, SEQ)
    by_ep = Plan(tp=2, sp=True, dp=2, ep=4, etp=1).check(m, SEQ)
    by_edp = Plan(tp=2, sp=True, dp=2, ep=2, etp=1).check(m, SEQ)
    deeper = Plan(tp=2, sp=True, pp=2, dp=1, ep=2, etp=1, microbatches=2).check(m, SEQ)
    f = _rule(critique(m, plan, SEQ, "h200", usable=1.0), "etp-1")
    assert (f.followed, f.fits) == (by_ep, False)
    assert f.tried == (by_edp.label(), deeper.label())


def test_a_rule_no_layout_follows_names_the_only_refusal_and_the_next_rule_is_still_held():
    """27B at TP 8 without SP over 4,100 tokens: SP's plan is refused (4,100 does not divide by 8). At DP 1 and
    ZeRO-1 it is the only plan tried, and its refusal is the reason given; at DP 2 and ZeRO-0 the ZeRO-1 rule
    after it is still found."""
    m = get_model("27b")
    (f,) = critique(m, Plan(tp=8, dp=1).check(m, 4100), 4100, "h200")
    assert f.followed is None and f.why_not.startswith("sequence 4100 does not divide by cp x tp = 8")
    found = critique(m, Plan(tp=8, dp=2, zero=0).check(m, 4100), 4100, "h200")
    assert [g.rule.name for g in found] == ["sp-with-tp", "zero-1"]
    assert found[0].followed is None and found[1].followed == Plan(tp=8, dp=2, zero=1).check(m, 4100)

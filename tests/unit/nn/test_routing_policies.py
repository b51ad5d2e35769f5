"""Issue 52: a routing policy is one entry of nn/routing.POLICIES. A scratch policy added as its entry and
nothing else is spelled on the command line, listed in the help and the errors, and routes a run's tokens."""
import re

import numpy as np
import pytest

from parasim.errors import UsageError
from parasim.nn import routing
from parasim.nn.routing import Policy, Routing

from conftest import cli


def _first(r, key, source, first, n, experts, k, limit):
    """Every token picks experts 1 to k, the first best."""
    return np.tile(np.arange(k), (n, 1))


@pytest.fixture
def scratch(monkeypatch):
    monkeypatch.setitem(routing.POLICIES, "first", Policy("first", "every token picks experts 1 to k", False, False,
                                                          _first))


def test_a_new_policy_is_its_one_entry_and_routes_a_run(scratch):
    out = cli("trace", "--routing", "first")
    assert out.returncode == 0, out.stderr
    routes = re.findall(r"layer \d: the first policy picks (E\d+) \(gate [\d.]+\) [^,]+, (E\d+) ", out.stdout)
    assert routes and set(routes) == {("E1", "E2")}  # moe16 routes each token to 2 of its 8 experts
    assert "routing: the first policy, seeded, in place of the router" in out.stdout
    helped = " ".join(cli("trace", "--help").stdout.split())
    assert "first: every token picks experts 1 to k" in helped
    bad = cli("trace", "--routing", "firsts")
    assert bad.returncode == 2 and "biased:F or first" in bad.stderr


def test_a_policy_takes_a_share_only_where_its_entry_says(scratch):
    assert str(Routing.parse("first")) == "first" and str(Routing.parse("skewed:0.25")) == "skewed:0.25"
    for text in ("first:0.5", "skewed", "uniform:0.1", "skewed:2"):
        with pytest.raises(UsageError):
            Routing.parse(text)


def test_the_policies_are_spelled_from_the_table():
    assert routing.spellings() == "uniform, balanced, skewed:F or biased:F"
    assert [p.spelling for p in routing.POLICIES.values()] == ["uniform", "balanced", "skewed:F", "biased:F"]
    assert [name for name, p in routing.POLICIES.items() if p.alike] == ["balanced"]  # what a folded run needs


def test_a_policy_is_parsed_with_its_share_and_the_runs_seed():
    assert (Routing.parse("uniform", seed=7).hot, Routing.parse("uniform", seed=7).seed) == (0.0, 7)
    assert Routing.parse("skewed:0.25").hot == 0.25 and Routing.parse("skewed:1").hot == 1.0
    assert str(Routing.parse("skewed:0.25")) == "skewed:0.25" and str(Routing.parse("balanced")) == "balanced"
    for bad in ("x", "1.5", "-0.5", "nan"):
        with pytest.raises(UsageError, match=f"^skewed:F needs F from 0 to 1, got '{bad}'$"):
            Routing.parse(f"skewed:{bad}")


def test_balanced_draws_are_spaced_experts_over_k_apart():
    # token t picks t, t + E/k, t + 2E/k, ... mod E, written out for E = 8, k = 4 (a gap of 2)
    got = Routing("balanced").choose("L0", 0, 0, 4, 8, 4)
    assert got.dtype.kind == "i"
    assert got.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7], [2, 4, 6, 0], [3, 5, 7, 1]]


def test_top_k_may_be_every_expert_and_no_more():
    got = Routing("uniform").choose("L0", 0, 0, 3, 4, 4)
    assert [sorted(row) for row in got.tolist()] == [[0, 1, 2, 3]] * 3
    for k in (0, 5):
        with pytest.raises(UsageError, match=rf"^top_k must be between 1 and the number of experts \(4\), got {k}$"):
            Routing("uniform").choose("L0", 0, 0, 3, 4, k)


def test_a_policy_that_draws_alike_refuses_a_limit_and_names_the_ones_that_take_it():
    with pytest.raises(UsageError) as info:
        Routing("balanced").choose("L0", 0, 0, 3, 8, 2, routing.GroupLimit(4, 1))
    assert str(info.value) == ("balanced routing spreads a token's picks over 2 groups of experts, so it cannot keep "
                               "them within 1 of 4 groups: route uniform, skewed:F, biased:F under a group limit")


def test_draws_are_read_only_shared_and_their_memo_is_bounded():
    r = Routing("uniform")
    got = r.choose("L0", 0, 0, 2, 4, 2)
    with pytest.raises(ValueError):
        got[0, 0] = 3  # every rank that asks gets this very array: nobody may change it
    # a policy that draws alike draws once for every call and rank of that size
    b = Routing("balanced")
    assert b.choose("L0", 0, 0, 4, 8, 2) is b.choose("L7", 3, 12, 4, 8, 2)
    # a long run keeps at most 1,025 draws, forgetting the oldest first
    for i in range(1100):
        r.choose(f"L{i}", 0, 0, 1, 4, 1)
    assert len(r._made) == 1025
    assert ("L1099", 0, 0, 1, 4, 1, None) in r._made and ("L0", 0, 0, 2, 4, 2, None) not in r._made


def test_a_hot_token_keeps_the_hot_experts_group_under_a_limit_of_one():
    # skewed:1 makes every token hot; a limit of 1 of 4 groups (of 2 experts) leaves it only group 1, experts 1-2
    got = Routing("skewed", 1.0).choose("L0", 0, 0, 16, 8, 2, routing.GroupLimit(4, 1))
    assert got.tolist() == [[0, 1]] * 16


def test_uniform_routing_under_a_limit_keeps_each_group_as_often():
    # 400 tokens each keep 1 of 4 groups: about 100 a group (a binomial's sd is 8.7; the draw is seeded, so the
    # counts are the same every run), and all of a token's picks lie in the group it kept
    got = Routing("uniform").choose("L0", 0, 0, 400, 8, 2, routing.GroupLimit(4, 1))
    groups = got // 2
    assert (groups[:, 0] == groups[:, 1]).all()
    counts = np.bincount(groups[:, 0], minlength=4)
    assert all(60 <= c <= 140 for c in counts), counts


def test_the_spellings_read_as_a_list_whatever_the_number_of_policies(monkeypatch):
    assert routing.spellings() == "uniform, balanced, skewed:F or biased:F"
    every = dict(routing.POLICIES)
    monkeypatch.setattr(routing, "POLICIES", {k: every[k] for k in ("uniform", "balanced")})
    assert routing.spellings() == "uniform or balanced"
    monkeypatch.setattr(routing, "POLICIES", {"uniform": every["uniform"]})
    assert routing.spellings() == "uniform"
    assert routing.policy_help() == f"uniform: {every['uniform'].what}"
    monkeypatch.setattr(routing, "POLICIES", every)
    parts = routing.policy_help().split("; ")
    assert [p.split(": ", 1)[0] for p in parts] == ["uniform", "balanced", "skewed:F", "biased:F"]


# -- biased:F: DeepSeek-V3's auxiliary-loss-free balancing on skewed:F's tokens ------------------------------------


def _loads(policy: str, senders: int = 4, n: int = 2048, experts: int = 16, k: int = 2, limit=None) -> np.ndarray:
    """Each expert's picks over `senders` ranks' tokens, counted here with numpy's bincount."""
    r = Routing.parse(policy)
    return sum(np.bincount(r.choose("L0", s, 0, n, experts, k, limit).ravel(), minlength=experts)
               for s in range(senders))


@pytest.fixture
def no_bias(monkeypatch):
    """The balancing bias held at zero: biased:F's choices are then skewed:F's."""
    monkeypatch.setattr(routing, "learned_bias", lambda *a, **kw: np.zeros(a[2]))


def test_biased_with_its_bias_zeroed_picks_what_skewed_picks(no_bias):
    for share in (0.0, 0.5, 1.0):
        want = Routing.parse(f"skewed:{share}").choose("L3", 2, 64, 300, 16, 3)
        got = Routing.parse(f"biased:{share}").choose("L3", 2, 64, 300, 16, 3)
        assert np.array_equal(got, want), share


def test_biased_evens_the_hot_experts_load():
    # skewed:0.5: half of the tokens pick expert 1 first, so it gets about 0.5 + 0.5 * k/E = 0.5625 of the tokens
    # (k = 2 of E = 16) where the mean expert gets k/E = 0.125: 4.5x; the bias brings it near the mean
    tokens = 4 * 2048
    skewed, biased = _loads("skewed:0.5"), _loads("biased:0.5")
    mean = tokens * 2 / 16
    assert skewed.sum() == biased.sum() == tokens * 2
    assert skewed[0] / mean == pytest.approx(0.5625 / 0.125, rel=0.05)
    assert biased[0] / mean == pytest.approx(1, abs=0.08)
    assert biased.max() / mean < 1.12 < skewed.max() / mean


def test_biased_lowers_the_hot_experts_bias_and_raises_the_others():
    bias = routing.learned_bias(0, 0.5, 16, 2)
    assert bias[0] < 0 < bias[1:].min()  # expert 1 was over the mean from the first step, every other under
    assert np.array_equal(routing.learned_bias(0, 0.5, 16, 2), bias)  # a pure function: the same on every rank
    policy = Routing.parse("biased:0.5")
    policy.choose("L0", 0, 0, 4, 16, 2)
    policy.choose("L0", 1, 0, 4, 16, 2)  # another rank's draws: the bias trained once, kept with the policy
    assert [k for k in policy._made if k[0] == "bias"] == [("bias", 16, 2, None)]
    assert np.array_equal(policy._made[("bias", 16, 2, None)], bias)
    with pytest.raises(ValueError):
        bias[0] = 0.0
    assert not np.array_equal(routing.learned_bias(1, 0.5, 16, 2), bias)  # the run's seed draws its batches


def test_two_steps_of_the_bias_move_each_expert_by_the_step_sizes(monkeypatch):
    # skewed:1 with k = 1: every token picks expert 1, so at each step it alone is over the mean (by DeepSeek-V3's
    # rule lowered by the step size) and every other expert under (raised by it); of 2 steps the first takes
    # the first half's 1/32, the second half's first 1/64 (1/32 halved). 1/32 + 1/64 = 3/64 is far from undoing
    # expert 1's lead (a key of -1 against the others' 0 to 1), so it wins both steps
    monkeypatch.setattr(routing, "BIAS_STEPS", 2)
    bias = routing.learned_bias(0, 1.0, 8, 1)
    assert bias.tolist() == [-3 / 64] + [3 / 64] * 7


def test_biased_under_a_group_limit_keeps_each_tokens_picks_in_its_groups():
    limit = routing.GroupLimit(4, 1)  # 4 groups of 4 experts, a token keeps 1
    got = Routing.parse("biased:0.5").choose("L0", 0, 0, 500, 16, 2, limit)
    assert (got[:, 0] // 4 == got[:, 1] // 4).all()
    loads = _loads("biased:0.5", limit=limit)
    skewed = _loads("skewed:0.5", limit=limit)
    # evened under the limit too: the groups ranked by the biased keys; skewed:0.5's expert 1 gets ~4.5x the mean
    assert loads.max() / loads.mean() < 1.15 < 4 < skewed[0] / skewed.mean()


def test_biased_is_parsed_with_its_share():
    assert str(Routing.parse("biased:0.25")) == "biased:0.25" and Routing.parse("biased:0.25").hot == 0.25
    for bad in ("biased", "biased:2"):
        with pytest.raises(UsageError):
            Routing.parse(bad)


def test_the_biased_picks_are_each_rows_smallest_keys_best_first():
    """biased:F's picks are ranked, best (smallest key less bias) first, as every policy's are; with k equal to
    the experts, every expert in order; under a limit, k of them (worked out by hand)."""
    keys = np.array([[0.5, 0.1, 0.9, 0.3], [0.2, 0.8, 0.1, 0.4]])
    zero = np.zeros(4)
    assert routing._biased_picks(keys, zero, 2, None).tolist() == [[1, 3], [2, 0]]
    assert routing._biased_picks(keys, zero, 1, None).tolist() == [[1], [2]]
    assert routing._biased_picks(keys, zero, 4, None).tolist() == [[1, 3, 0, 2], [2, 0, 3, 1]]
    # a bias of -0.5 on expert 3 raises its key by 0.5: row 0's third best (0.8 against 0.9), row 1's worst (0.9)
    assert routing._biased_picks(keys, np.array([0, 0, 0, -0.5]), 3, None).tolist() == [[1, 0, 3], [2, 0, 1]]
    # two groups of two; row 0 keeps group {0, 1} (its best two, 0.1 and 0.5, against 0.3 and 0.9), row 1 group
    # {2, 3} (0.1 + 0.4 against 0.2 + 0.8): k = 2 picks inside it, best first
    limited = routing._biased_picks(keys, zero, 2, routing.GroupLimit(2, 1))
    assert limited.tolist() == [[1, 0], [2, 3]]

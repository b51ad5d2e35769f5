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
    assert bad.returncode == 2 and "skewed:F or first" in bad.stderr


def test_a_policy_takes_a_share_only_where_its_entry_says(scratch):
    assert str(Routing.parse("first")) == "first" and str(Routing.parse("skewed:0.25")) == "skewed:0.25"
    for text in ("first:0.5", "skewed", "uniform:0.1", "skewed:2"):
        with pytest.raises(UsageError):
            Routing.parse(text)


def test_the_policies_are_spelled_from_the_table():
    assert routing.spellings() == "uniform, balanced or skewed:F"
    assert [p.spelling for p in routing.POLICIES.values()] == ["uniform", "balanced", "skewed:F"]
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
                               "them within 1 of 4 groups: route uniform, skewed:F under a group limit")


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
    assert routing.spellings() == "uniform, balanced or skewed:F"
    every = dict(routing.POLICIES)
    monkeypatch.setattr(routing, "POLICIES", {k: every[k] for k in ("uniform", "balanced")})
    assert routing.spellings() == "uniform or balanced"
    monkeypatch.setattr(routing, "POLICIES", {"uniform": every["uniform"]})
    assert routing.spellings() == "uniform"
    assert routing.policy_help() == f"uniform: {every['uniform'].what}"
    monkeypatch.setattr(routing, "POLICIES", every)
    parts = routing.policy_help().split("; ")
    assert [p.split(": ", 1)[0] for p in parts] == ["uniform", "balanced", "skewed:F"]

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

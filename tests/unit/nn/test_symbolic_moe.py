"""MoE routing by a stated policy (uniform, balanced, skewed:F): the choices it makes, counted here by hand,
and the 16-GPU example run virtually and symbolically with it: the same events, bytes and held memory."""
import numpy as np
import pytest
from conftest import trace_key

import parasim
from parasim.errors import UsageError
from parasim.examples.moe16 import make_program
from parasim.layout import Layout, preset
from parasim.nn.routing import Routing


@pytest.mark.parametrize("text, kind, hot", [("uniform", "uniform", 0.0), ("balanced", "balanced", 0.0),
                                             ("skewed:0.25", "skewed", 0.25), ("skewed:1", "skewed", 1.0)])
def test_policies_are_read_from_their_names(text, kind, hot):
    r = Routing.parse(text, seed=3)
    assert (r.kind, r.hot, r.seed) == (kind, hot, 3) and Routing.parse(str(r), 3) == r


@pytest.mark.parametrize("text", ["", "learned", "skewed", "skewed:", "skewed:x", "skewed:1.5", "skewed:-0.1",
                                  "uniform:0.5", "balanced:1"])
def test_bad_policies_get_one_line(text):
    with pytest.raises(UsageError, match="routing must be|skewed:F needs F"):
        Routing.parse(text)


def test_uniform_picks_k_distinct_experts_the_same_way_each_time():
    r = Routing.parse("uniform", seed=0)
    picks = r.choose("moe#0", 5, 0, 1000, 8, 2)
    assert picks.shape == (1000, 2) and (picks[:, 0] != picks[:, 1]).all() and picks.min() >= 0 and picks.max() < 8
    assert np.array_equal(picks, r.choose("moe#0", 5, 0, 1000, 8, 2))
    assert not np.array_equal(picks, r.choose("moe#1", 5, 0, 1000, 8, 2))  # another call draws again
    assert not np.array_equal(picks, r.choose("moe#0", 6, 0, 1000, 8, 2))  # and another rank
    counts = np.bincount(picks.ravel(), minlength=8)
    assert counts.sum() == 2000 and counts.min() > 200 and counts.max() < 300  # about 250 each


def test_balanced_gives_every_expert_the_same_count():
    picks = Routing.parse("balanced").choose("moe#0", 0, 8, 8, 4, 2)
    assert picks.tolist()[:3] == [[0, 2], [1, 3], [2, 0]] and np.bincount(picks.ravel(), minlength=4).tolist() == [4] * 4
    assert np.array_equal(picks, Routing.parse("balanced").choose("moe#3", 5, 0, 8, 4, 2))  # alike on every rank
    odd = Routing.parse("balanced").choose("moe#0", 0, 0, 7, 7, 3)  # E / k = 2 (rounded down): picks 2 apart
    assert odd.tolist()[:2] == [[0, 2, 4], [1, 3, 5]] and np.bincount(odd.ravel(), minlength=7).tolist() == [3] * 7


def test_balanced_spreads_a_tokens_picks_over_k_gpus():
    """DeepSeek-V3's 256 experts top-8 over EP 64 (4 experts a GPU): every token's 8 picks on 8 GPUs, so the
    dispatch sends what the (token, expert) pair count says, as a router's spread-out picks nearly do."""
    picks = Routing.parse("balanced").choose("moe#0", 0, 0, 4096, 256, 8)
    gpus = picks // 4
    assert all(len(set(row)) == 8 for row in gpus.tolist())
    assert np.bincount(picks.ravel(), minlength=256).tolist() == [4096 * 8 // 256] * 256


def test_skewed_sends_a_share_of_first_picks_to_the_hot_expert():
    picks = Routing.parse("skewed:1").choose("moe#0", 0, 0, 500, 8, 3)
    assert (picks[:, 0] == 0).all() and (picks[:, 1:] != 0).all()
    some = Routing.parse("skewed:0.5").choose("moe#0", 0, 0, 4000, 8, 2)
    assert 0.5 < np.mean(some[:, 0] == 0) < 0.6  # half, plus uniform's 1/8 of the other half
    same = Routing.parse("skewed:0").choose("moe#0", 0, 0, 50, 8, 2)
    assert np.array_equal(same, Routing.parse("uniform").choose("moe#0", 0, 0, 50, 8, 2))


@pytest.mark.parametrize("routing", ["uniform", "balanced", "skewed:0.5"])
def test_the_moe_example_runs_the_same_virtually_and_symbolically(routing):
    program = make_program(("A", 5), None, 2, routing)
    # at FP64 a symbolic run computes in the virtual run's float64: the same trace, byte for byte
    real = parasim.run(program, 16, precision="fp64")
    sym = parasim.run(program, 16, backend="symbolic", precision="fp64")
    assert trace_key(sym.trace) == trace_key(real.trace)
    assert any(e.op == "all_to_all" for e in sym.trace.events)
    assert [sym.trace.peak(r) for r in range(16)] == [real.trace.peak(r) for r in range(16)]


def test_each_expert_gets_the_rows_its_policy_drew():
    """Rows dispatched to each EP rank in layer 1's first forward, counted from the policy by hand."""
    layout = preset("moe16")
    result = parasim.run(make_program(None, layout, 2, "balanced"), 16, backend="symbolic")
    first = [e for e in result.trace.events if e.op == "all_to_all" and e.label.startswith("layer 1.moe dispatch")]
    ep = layout.groups()["ep"][0]
    (event,) = [e for e in first if list(e.group.ranks) == ep][:1]
    k, experts, per = layout.model.top_k, layout.model.experts, layout.model.experts // layout.ep
    n = 2  # tokens per rank: 8 positions over CP 2 and SP 2
    for i, member in enumerate(event.members):
        picks = Routing.parse("balanced").choose("layer 1.moe#0", ep[i], i * n, n, experts, k)
        sent = [int(((picks // per) == d).any(axis=1).sum()) for d in range(layout.ep)]
        assert [t.shape[0] for t in member.ins] == sent


def test_symbolic_moe_needs_a_policy():
    with pytest.raises(UsageError, match="routing policy"):
        parasim.run(make_program(None, None, 2, "learned"), 16, backend="symbolic")


@pytest.mark.parametrize("routing", ["uniform", "balanced"])
@pytest.mark.parametrize("ep, etp", [(2, 2), (4, 2), (2, 4)])
def test_symbolic_moe_with_expert_tp_runs_as_the_virtual_one(routing, ep, etp):
    """Expert TP on symbolic ranks (the rules of thumb's ETP 2 at real size): each expert-TP peer's received
    rows are worked out from its own EP group's draws, so the run needs no gate values. The virtual run, whose
    rows come from the same draws and whose values check them, makes the very same trace and peaks."""
    layout = Layout(tp=2, cp=2, pp=2, dp=2, ep=ep, etp=etp, sp=True, zigzag=False, model=preset("moe16").model)
    program = make_program(("A", 5), layout, 2, routing)
    real = parasim.run(program, 16, precision="fp64")
    sym = parasim.run(program, 16, backend="symbolic", precision="fp64")
    assert trace_key(sym.trace) == trace_key(real.trace)
    assert any(e.group is not None and e.group.name == "expert-tp" for e in sym.trace.events)
    assert [sym.trace.peak(r) for r in range(16)] == [real.trace.peak(r) for r in range(16)]


def test_trace_runs_symbolically_with_the_same_bytes():
    import json
    from tests.conftest import cli
    sym = cli("trace", "--symbolic", "--routing", "uniform", "--json")
    real = cli("trace", "--routing", "uniform", "--json")
    assert sym.returncode == 0 and real.returncode == 0, sym.stderr + real.stderr
    s, r = json.loads(sym.stdout), json.loads(real.stdout)
    assert (s["backend"], r["backend"], s["exactness"], r["exactness"]) == ("symbolic", "virtual", None, None)
    # the same values move: the virtual run's in float64 (exact), the symbolic run's in the post's BF16
    quarter = {k: {w: n * 2 // 8 for w, n in v.items()} for k, v in r["bytes_by_link"]["by_group"].items()}
    assert s["bytes_by_link"]["by_group"] == quarter and s["bytes_by_link"]["by_group"]["ep"]["inside"] > 0
    assert [x["event"] for x in s["steps"] if "event" in x] == [x["event"] for x in r["steps"] if "event" in x]
    gpu = cli("trace", "--symbolic", "--routing", "balanced", "--gpu", "3")
    assert gpu.returncode == 0 and "not checked against the unsplit model (routing by the balanced policy)" in gpu.stdout


@pytest.mark.parametrize("args, message", [
    (["--symbolic"], "--symbolic has no router scores to route by"),
    (["--routing", "bogus"], "unknown routing 'bogus'"), (["--routing", "skewed:2"], "skewed:F needs F from 0 to 1"),
], ids=["no-policy", "bogus", "skew"])
def test_bad_routing_gets_one_line(args, message):
    from tests.conftest import cli
    out = cli("trace", *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1

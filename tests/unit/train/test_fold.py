"""Folding ranks on symbolic runs: ranks that do the same work run once, and the unfolded trace equals a full
run's, event for event (as a multiset: within a logical step a full run orders events by arrival), byte
for byte, with every rank's held memory."""
import pytest

import parasim
from parasim.errors import CollectiveError, UsageError
from parasim.train.step import make_step
from parasim.layout import Layout, ModelSpec
from parasim.comm.trace import Event, Trace
from parasim.engine.symbolic.fold import fold_of, unfold

SMALL = ModelSpec(name="small", layers=4, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, dense_layers=1,
                  seq=16, bias=False)


def _counted(trace):
    events = sorted((e.step, e.kind, e.op, e.group.name, tuple(e.group.ranks), e.label,
                     tuple((m.rank, m.ins, m.outs, m.sent, m.recv, m.site) for m in e.members)) for e in trace.events)
    marks = sorted((m.rank, m.step, m.kind, m.text, str(m.data)) for m in trace.marks if m.kind in ("held", "phase"))
    return events, marks


@pytest.mark.parametrize("layout, runs", [
    (Layout(pp=2, dp=4, ep=4, model=SMALL), 2),
    (Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL), 2),
    (Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL), 4),  # a ring's CP ranks each run
    # CP by all-gather under zigzag: one rank a stage runs, its CP peers folded onto it like its TP peers
    (Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, cp_comm="all_gather", model=SMALL), 2),
    # ... but not under the contiguous split: the causal mask gives each CP slice its own work
    (Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, cp_comm="all_gather", zigzag=False, model=SMALL), 4),
], ids=["pp-dp-ep", "tp-sp-pp-ep", "tp-cp-pp-ep", "tp-cp-gather-pp-ep", "tp-cp-gather-contiguous"])
def test_a_folded_run_counts_what_a_full_run_does(layout, runs):
    program = make_step(layout, m=2, routing="balanced")
    full = parasim.run(program, layout.world, backend="symbolic")
    fold = fold_of(layout)
    assert len(set(fold)) == runs < layout.world  # one rank per stage (and CP slice, where it must) runs
    folded = parasim.run(program, layout.world, backend="symbolic", fold=fold)
    assert folded.trace.meta["folded"] is True
    assert _counted(folded.trace) == _counted(full.trace)
    assert [folded.trace.peak(r) for r in range(layout.world)] == [full.trace.peak(r) for r in range(layout.world)]
    assert [v["layers"] for v in folded.values] == [v["layers"] for v in full.values]
    last = layout.world - 1  # folded around another rank: it runs itself, and the count is the same
    around = parasim.run(program, layout.world, backend="symbolic", fold=fold_of(layout, around=last))
    assert fold_of(layout, around=last)[last] == last and _counted(around.trace) == _counted(full.trace)
    assert around.values[last]["coords"] == full.values[last]["coords"]


def test_representatives_are_the_lowest_rank_of_each_stage():
    layout = Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL)
    fold = fold_of(layout)
    stages = [c["pp"] for c in layout.coords()]
    assert fold == [min(r for r in range(8) if stages[r] == stages[x]) for x in range(8)]
    assert fold_of(layout, keep=("pp", "tp")) != fold  # another class per TP rank when asked
    with pytest.raises(UsageError, match="fold around rank 8: the layout has ranks 0-7"):
        fold_of(layout, around=8)


def test_uniform_routing_cannot_be_folded_and_says_so():
    layout = Layout(pp=2, dp=4, ep=4, model=SMALL)
    with pytest.raises(UsageError, match="same number of tokens on every EP rank"):
        parasim.run(make_step(layout, m=2, routing="uniform"), layout.world, backend="symbolic",
                    fold=fold_of(layout))


def test_bad_folds_get_one_line():
    def ring(ctx):
        ctx.comm.send(ctx.xp.zeros((2,)), (ctx.rank + 1) % ctx.world) if ctx.rank == 0 else None
    with pytest.raises(CollectiveError, match="rank 0 exchanges with rank 1, which is folded onto rank 0"):
        parasim.run(ring, 2, backend="symbolic", fold=[0, 0])

    def hears(ctx):
        ctx.comm.recv(1, shape=(2,), dtype="float64") if ctx.rank == 0 else None
    with pytest.raises(CollectiveError, match="rank 0 exchanges with rank 1, which is folded onto rank 0"):
        parasim.run(hears, 2, backend="symbolic", fold=[0, 0])

    def pairs(ctx):
        g = [ctx.new_group([0, 1], "a"), ctx.new_group([2, 3], "a")][ctx.rank // 2]
        ctx.comm.all_reduce(ctx.xp.zeros((2,)), group=g)
    with pytest.raises(CollectiveError, match="rank 1 is folded onto rank 2, which is not in the group"):
        parasim.run(pairs, 4, backend="symbolic", fold=[0, 2, 2, 2])
    with pytest.raises(UsageError, match="folding ranks needs symbolic ranks"):
        parasim.run(pairs, 4, fold=[0, 0, 2, 2])
    for fold in ([1, 0, 2], [0, 0, 3], [0, 0]):  # rank 1 stands for rank 0 but not for itself; out of range; short
        with pytest.raises(UsageError, match="a fold maps every rank to a rank that runs for itself"):
            parasim.run(ring, 3, backend="symbolic", fold=fold)
    with pytest.raises(UsageError, match="a fold names 2 ranks for a run of 4"):
        unfold(parasim.run(pairs, 4, backend="symbolic").trace, [0, 0])


def test_trace_shows_one_gpu_of_a_real_size_run():
    import json
    from tests.conftest import cli
    out = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "5", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["backend"] == "symbolic" and d["exactness"] is None and d["coords"]["tp"] == 5
    tp = next(x for x in d["does"] if x["op"] == "all_reduce" and x["group"] == "tp")
    assert tp["calls"] == 72 * 4  # 72 layers: attention and MLP each all-reduce once forward, once backward
    assert d["stores"]["tokens between matmuls"] == list(range(1, 4097))
    text = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "0")
    assert "t1-t4096 between matmuls" in text.stdout and "512 symbolic GPUs (1 run" in text.stderr


@pytest.mark.parametrize("args, message", [
    (["--layout", "megatron-8.3b"], "give --gpu N"),
    (["--layout", "megatron-8.3b", "--gpu", "512"], "the layout has GPUs 0-511"),
    (["--layout", "deepseek-v3", "--gpu", "0", "--routing", "uniform"], "needs --routing balanced"),
], ids=["no-gpu", "gpu-range", "uniform"])
def test_real_size_trace_input_is_checked(args, message):
    from tests.conftest import cli
    out = cli("trace", "--symbolic", *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_every_field_of_every_event_is_a_full_runs():
    """Beyond shapes and bytes: phases, params (point-to-point ends renamed), tags, sites; numbered in step
    order; the trace's world, backend and groups kept; ranks alone in their class keep their own events."""
    import json
    layout = Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL)
    program = make_step(layout, m=2, routing="balanced")
    full = parasim.run(program, layout.world, backend="symbolic").trace
    folded = parasim.run(program, layout.world, backend="symbolic", fold=fold_of(layout)).trace
    alone = parasim.run(program, layout.world, backend="symbolic", fold=fold_of(layout, ("pp", "tp", "dp"))).trace

    def fields(trace):
        out = []
        for e in trace.events:
            d = e.to_dict()
            del d["seq"]
            out.append(json.dumps(d, sort_keys=True))
        return sorted(out)
    assert fields(folded) == fields(full) == fields(alone)  # alone: every rank its own class, nothing folded
    assert [e.seq for e in folded.events] == list(range(len(folded.events)))
    assert [e.step for e in folded.events] == sorted(e.step for e in folded.events)
    assert (folded.world, folded.backend, folded.groups) == (full.world, full.backend, full.groups)
    p2p = [e for e in folded.events if e.kind == "p2p"]
    assert p2p and all(e.params["src"] == e.members[0].rank and e.params["dst"] == e.members[1].rank for e in p2p)
    assert sorted((m.rank, m.step, m.kind, m.text, str(m.data)) for m in folded.marks) == \
        sorted((m.rank, m.step, m.kind, m.text, str(m.data)) for m in full.marks if m.kind != "tensor")


def test_compute_steps_and_marks_are_copied_to_each_folded_rank():
    def program(ctx):
        ctx.phase("work")
        ctx.compute("a matmul", 100)
        ctx.comm.all_reduce(ctx.xp.zeros((4,)), label="sum")
    full = parasim.run(program, 3, backend="symbolic").trace
    folded = parasim.run(program, 3, backend="symbolic", fold=[0, 0, 2]).trace  # rank 2 runs for itself alone
    assert sorted((e.kind, e.ranks) for e in folded.events) == sorted((e.kind, e.ranks) for e in full.events) == [
        ("collective", [0, 1, 2]), ("compute", [0]), ("compute", [1]), ("compute", [2])]
    assert sorted((m.rank, m.text) for m in folded.marks) == [(0, "work"), (1, "work"), (2, "work")]


def test_a_real_size_gpu_holds_what_the_estimator_says():
    """Megatron-LM 8.3B on its 512 GPUs (TP 8, 4,096 tokens, one micro-batch): the activations GPU 0 holds at
    its peak are the estimator's bytes of one layer times 72 layers, under the estimator's assumptions (no
    attention scores kept: FlashAttention; dropout masks kept); its weights and gradients are 2 bytes
    for each parameter the estimator counts on one TP rank of a layer, times 72."""
    import json
    from parasim.estimate.memory import layer_saved_bytes
    from parasim.estimate.models import layer_param_count
    from parasim.layout import preset
    from tests.conftest import cli
    m = preset("megatron-8.3b").model
    out = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "0", "--json")
    peak = json.loads(out.stdout)["peak"]
    act = layer_saved_bytes(m.hidden, m.heads, m.kv, m.ffn_size, 4096, 1, 8, False, 1, flash=True, dropout=True)
    params = layer_param_count(m.hidden, m.heads, m.kv, m.ffn_size, 8, m.bias)
    assert peak["by_kind"]["activations"] == act * m.layers
    assert peak["by_kind"]["weights"] == peak["by_kind"]["gradients"] == 2 * params * m.layers


def test_a_real_size_cp_layout_folds_per_slice():
    """The 27B model on TP8 + SP + CP2 at 4,096 tokens: one rank per CP slice runs; GPU 3 (TP rank 3, CP rank
    0) holds the zigzag halves t1-t1024 and t3073-t4096 inside attention and its SP share of them between
    matmuls; its ZeRO-1 optimizer share over dp-cp (2 GPUs) is 3 fp32 values for every 2 weights' 2 bytes."""
    import json
    from tests.conftest import cli
    out = cli("trace", "--symbolic", "--layout", "27b-tp8-sp-cp2", "--gpu", "3", "--json")
    assert out.returncode == 0 and "16 symbolic GPUs (2 run" in out.stderr
    d = json.loads(out.stdout)
    assert d["stores"]["tokens in attention"] == list(range(1, 1025)) + list(range(3073, 4097))
    assert d["stores"]["tokens between matmuls"] == list(range(769, 1025))  # the 4th eighth of its 2,048
    kinds = d["peak"]["by_kind"]
    assert abs(kinds["optimizer"] / kinds["weights"] - 3 * 4 / 2 / 2) < 1e-6  # 12 B per value over 2 GPUs, 2 B each


def test_seq_sets_a_real_size_steps_length_and_only_that():
    import json
    from tests.conftest import cli
    out = cli("trace", "--symbolic", "--layout", "27b-tp8-sp-cp2", "--gpu", "0", "--seq", "8192", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["stores"]["tokens in attention"][-1] == 8192  # the zigzag's last chunk
    bad = cli("trace", "--seq", "100")
    assert bad.returncode == 2 and "--seq sets a real-size step's sequence" in bad.stderr


def test_unfold_copies_no_event_onto_a_group_that_ran_itself():
    """Rank 2 folded onto 0 and rank 1 onto 3: the pairs (0, 1) and (2, 3) fold onto the same
    representatives, but each has a rank that ran, so each already has its own events."""
    def pairs(ctx):
        g = [ctx.new_group([0, 1], "a"), ctx.new_group([2, 3], "a")][ctx.rank // 2]
        ctx.comm.all_reduce(ctx.xp.zeros((2,)), group=g)
    trace = parasim.run(pairs, 4, backend="symbolic").trace
    whole = unfold(trace, [0, 3, 0, 3])
    assert (whole.world, whole.backend, whole.groups) == (4, "symbolic", trace.groups)
    assert whole.marks == trace.marks and whole.meta["fold"] == [0, 3, 0, 3] and whole.meta["folded"] is True
    assert len(whole.events) == len(trace.events) == 2
    copied = unfold(trace, [0, 1, 0, 1]).events  # under this fold (2, 3) has no rank that runs: it gets (0, 1)'s
    assert [e.group.ranks for e in copied].count((2, 3)) == 2  # its own (this trace's run was full) and the copy


def test_an_all_to_all_of_the_very_same_chunks_gives_a_full_runs_records_and_results():
    """Ranks 1-3 folded onto 0: every member brings rank 0's very chunks and the folded world takes its short
    path (`FoldedWorld._alike`). Two ranks running, with one list all ranks share, from different lines:
    each brings a list of its own (the kernel's path). Either way every member's record and site is a full
    run's, and each running rank gets one chunk from every member and goes on."""
    shared = {}

    def program(ctx):
        g = ctx.new_group([0, 1, 2, 3], "ep")
        chunks = shared.setdefault("chunks", [ctx.xp.zeros((2, 3)), ctx.xp.zeros((1, 3))] * 2)
        if ctx.rank % 2 == 0:
            got = ctx.comm.all_to_all(chunks, group=g)
        else:
            got = ctx.comm.all_to_all(chunks, group=g)
        ctx.comm.all_reduce(ctx.xp.zeros((2,)), group=g)  # every member is woken and goes on
        return [x.shape for x in got]

    def records(trace):
        return [[(m.rank, m.ins, m.outs, m.sent, m.recv, m.site) for m in e.members] for e in trace.events]
    full = parasim.run(program, 4, backend="symbolic")
    sites = [m.site for m in full.trace.events[0].members]
    assert sites[0] == sites[2] != sites[1] == sites[3]
    for fold in ([0, 0, 0, 0], [0, 1, 0, 1]):
        shared.clear()
        folded = parasim.run(program, 4, backend="symbolic", fold=fold)
        if fold == [0, 0, 0, 0]:  # every member is rank 0 here
            want = [[m._replace(site=sites[0]) for m in full.trace.events[0].members],
                    list(full.trace.events[1].members)]
            assert [list(e.members) for e in folded.trace.events] == want
        else:
            assert records(folded.trace) == records(full.trace)
        assert folded.values == [[(2, 3)] * 4 if fold[r] == 0 else [(1, 3)] * 4 for r in range(4)]
    assert full.values == [[(2, 3)] * 4, [(1, 3)] * 4] * 2


def _said(events):
    return [(e.seq, e.step, e.kind, e.op, e.group.name, e.group.ranks, e.label, e.phase, e.params,
             None if e.source is None else e.source.seq,
             tuple((m.rank, m.ins, m.outs, m.sent, m.recv, m.site, m.work) for m in e.members)) for e in events]


@pytest.mark.parametrize("layout", [
    Layout(pp=2, dp=4, ep=4, model=SMALL),
    Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL),
], ids=["pp-dp-ep", "tp-cp-pp-ep"])
def test_one_rank_of_a_folded_trace_is_that_rank_of_the_trace_written_out(layout):
    """A folded trace stays folded until all of it is asked for (engine/symbolic/fold.FoldedTrace): one rank's
    events and marks, worked out alone, are that rank's in the whole trace, numbered as it numbers them."""
    from parasim.engine.symbolic.fold import FoldedTrace

    trace = parasim.run(make_step(layout, m=2, routing="balanced"), layout.world, backend="symbolic",
                        fold=fold_of(layout)).trace
    assert isinstance(trace, FoldedTrace) and trace._events is None and trace._marks is None
    alone = {r: (_said(trace.events_of(r)), trace.marks_of(r), trace.peak(r), trace.joins(r))
             for r in range(layout.world)}
    assert trace._events is None and trace._marks is None  # nothing written out for them
    assert len(trace.ran_events) < len(trace.events)  # now it is
    assert [e.seq for e in trace.events] == list(range(len(trace.events)))
    assert [e.step for e in trace.events] == sorted(e.step for e in trace.events)
    plain = Trace(trace.world, trace.backend, trace.groups, trace.events, trace.marks, trace.meta)
    for r in range(layout.world):
        mine = [e for e in trace.events if r in e.ranks]
        assert alone[r][0] == _said(mine)
        assert alone[r][1] == [m for m in trace.marks if m.rank == r]
        assert alone[r][2:] == (plain.peak(r), plain.joins(r))
    assert _said(trace.events) == _said(_written_out(trace))


def _written_out(folded):
    """The whole trace as the first unfold wrote it (session 13): the run's events, then each one's copies
    (a compute event onto each rank folded onto its rank; any other onto each folded image of its group, in
    the order the groups were made), sorted by step, stably, and numbered in that order."""
    rep, run = folded.rep, sorted(folded.ran_events, key=lambda e: e.seq)
    out = []
    for e in run:
        out.append((e, None))
    for e in run:
        if e.kind == "compute":
            r = e.members[0].rank
            out += [(e, {r: x}) for x in range(len(rep)) if rep[x] == r and x != r]
            continue
        key = tuple(rep[r] for r in e.group.ranks)
        for g in folded.groups:
            if g.name == e.group.name and g.ranks != e.group.ranks and tuple(rep[r] for r in g.ranks) == key \
                    and all(rep[r] != r for r in g.ranks):
                out.append((e, dict(zip(e.group.ranks, g.ranks)), g))
    out.sort(key=lambda t: t[0].step)
    events = []
    for i, t in enumerate(out):
        e = t[0]
        if t[1] is None:
            events.append(e)
            continue
        to = t[1]
        g = t[2] if len(t) > 2 else e.group
        members = [m._replace(rank=to.get(m.rank, m.rank)) for m in e.members]
        params = {k: (to.get(v, v) if k in ("src", "dst") else v) for k, v in e.params.items()}
        events.append(Event(i, e.step, e.kind, e.op, g, members, e.label, e.phase, params, e.algo, None, e.tags,
                            None, e))
    return events


def test_a_folded_all_to_all_gives_the_rank_that_runs_the_chunks_meant_for_its_place():
    """Every member of a folded all-to-all brings the representative's chunks (engine/symbolic/folded.py): the
    rank that runs, second in its group here, gets chunk 1 from each member, whatever the chunks' sizes."""
    def program(ctx):
        g = ctx.new_group([1, 0, 2, 3], "ep")
        got = ctx.comm.all_to_all([ctx.xp.zeros((n, 2)) for n in (1, 2, 3, 4)], group=g)
        return [x.shape for x in got]

    out = parasim.run(program, 4, backend="symbolic", fold=[0, 0, 0, 0])
    assert out.values[0] == [(2, 2)] * 4
    (e,) = [e for e in out.trace.events if e.op == "all_to_all"]
    assert [m.outs[0].shape for m in e.members] == [(1, 2), (2, 2), (3, 2), (4, 2)]  # member j gets chunk j


@pytest.mark.parametrize("layout", [
    Layout(pp=2, dp=4, ep=4, model=SMALL),
    Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL),
], ids=["pp-dp-ep", "tp-cp-pp-ep"])
def test_events_asked_for_one_by_one_are_the_trace_written_out(layout):
    """The app reads a folded trace's events one at a time (FoldedTrace.on_demand) and indexes its grid from the
    rule (grid_places): each is what the whole trace written out holds, and nothing is written out for them."""
    import numpy as np

    trace = parasim.run(make_step(layout, m=2, routing="balanced"), layout.world, backend="symbolic",
                        fold=fold_of(layout)).trace
    lazy = trace.on_demand()
    n = len(lazy)
    picked = [lazy[i] for i in [n - 1, 0, *range(n - 2, 0, -7), -1]]  # out of order, a copy's block mid-way
    ranks, at, steps = trace.grid_places()
    assert trace._events is None and len(trace.ran_events) < n
    whole = _written_out(trace)
    assert _said(picked) == _said([whole[i] for i in [n - 1, 0, *range(n - 2, 0, -7), n - 1]])
    assert _said([lazy[i] for i in range(n)]) == _said(whole) and trace._events is None
    assert _said(lazy[3:9:2]) == _said(whole[3:9:2])
    with pytest.raises(IndexError):
        lazy[n]
    assert steps.tolist() == [e.step for e in whole]
    mine = sorted(zip(at.tolist(), ranks.tolist()))
    assert mine == sorted((i, m.rank) for i, e in enumerate(whole) for m in e.members)
    plain = Trace(trace.world, trace.backend, trace.groups, whole, [], trace.meta)
    p_ranks, p_at, p_steps = plain.grid_places()
    assert sorted(zip(p_at.tolist(), p_ranks.tolist())) == mine and np.array_equal(p_steps, steps)
    assert _said(list(lazy)) == _said(whole) and trace._events is not None  # going through all writes it out
    assert trace._made == {}  # the copies made one by one are the written-out trace's now, not kept twice
    # the copies made one by one are the ones written out (what the app holds stays the trace's)
    assert all(e is trace.events[e.seq] for e in picked) and lazy[5] is trace.events[5]

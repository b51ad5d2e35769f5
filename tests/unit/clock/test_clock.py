"""The clock (issue 34): the work each rank does between its events is counted by kind, every event gets a
start and an end on a GPU type, collectives last their algorithm's steps over the links their hops really
use, a step's time is the sum along its critical path, and an overlap switch shortens a step by what it
hides. Expected values are worked out here by hand from the hardware table's constants and the measured
kernel tables' figures (estimate/kernels.py: the data, read here point by point)."""
from __future__ import annotations

import json

import pytest

from parasim import run
from parasim.clock import machine, simulate
from parasim.clock.report import ClockChoice, clock_report
from parasim.estimate.hardware import GPUS, LATENCY
from parasim.estimate.kernels import attention_efficiency, collective_bandwidth, gemm_efficiency
from parasim.lesson import load_lessons, run_lesson
from parasim.comm.trace import Trace
from tests.conftest import cli

H200 = GPUS["h200"]
CALL, INSIDE, ACROSS = (LATENCY[k].value for k in ("call", "inside", "across"))


def product(m: int, n: int, k: int, gpu: str = "h200") -> float:
    """Seconds of one (m x k) @ (k x n) product at the share of peak the kernel table measures for its shape."""
    return 2 * m * n * k / (GPUS[gpu].peak_flops.value * gemm_efficiency(gpu, m, n, k).value)


def busbw(op: str, buffer: int, where: str, t: int, gpu: str = "h200") -> float:
    return collective_bandwidth(gpu, op, buffer, where, t).value


SLOW = 0.189  # the measured mean slowdown of compute beside communication (estimate/kernels.py's 'overlap-2507')


def _all_reduce(ctx):
    x = ctx.xp.ones((1024,), dtype=ctx.xp.float64)  # 8,192 bytes recorded, 2,048 on the wire (BF16)
    ctx.comm.all_reduce(x)


def test_a_ring_all_reduce_moves_its_buffer_at_the_bus_bandwidth_measured_for_its_size():
    """A 2,048-byte all-reduce (1,024 values timed at BF16's 2 bytes) over 4 GPUs: inside a node each member
    moves 2(t-1)/t of the buffer at the busbw measured for that size; across nodes (two GPUs a node: two of the
    ring's hops cross, so it goes at the network's pace) NCCL's call and step latencies come on top of the
    large-message busbw measured there."""
    trace = run(_all_reduce, 4).trace
    (e,) = trace.events
    buffer, moved = 2048, 2048 * 2 * 3 / 4
    inside = moved / collective_bandwidth("h200", "all_reduce", buffer, "inside", 4).value
    assert simulate(trace, machine("h200")).events[e.seq][1] == pytest.approx(inside, rel=1e-12)
    across = CALL + 2 * 3 * ACROSS + moved / collective_bandwidth("h200", "all_reduce", buffer, "across", 4).value
    assert simulate(trace, machine("h200", gpus_per_node=2)).events[e.seq][1] == pytest.approx(across, rel=1e-12)


def _work(ctx):
    xp = ctx.xp
    w = xp.ones((3, 5), dtype=xp.float64)
    x = xp.ones((2, 3), dtype=xp.float64)
    y = xp.matmul(x, w)  # a weight product: 2 * (2*5) * 3 = 60 FLOPs
    q = xp.ones((1, 2, 4, 8), dtype=xp.float64)
    s = xp.matmul(q, xp.permute_dims(q, (0, 1, 3, 2)))  # two activations: 2 * (1*2*4*4) * 8 = 512
    xp.matmul(xp.ones((4, 1, 3), dtype=xp.float64), w)  # [s, b, h] by a weight: a weight's product, 2*(4*5)*3 = 120
    ctx.comm.all_reduce(y)
    g = xp.tensordot(x, y, axes=([0], [0]))  # a weight gradient: 2 * (3*5) * 2 = 60
    ctx.comm.all_reduce(g + s.sum())
    xp.matmul(x, w)  # after the last event: the tail


@pytest.mark.parametrize("backend", ["virtual", "symbolic"])
def test_each_member_carries_the_work_it_did_since_its_last_event(backend):
    trace = run(_work, 2, backend).trace
    first, second = trace.events
    assert [m.work for m in first.members] == [{"matmul": 180, "attention": 512}] * 2
    assert [m.work for m in second.members] == [{"matmul": 60}] * 2
    assert trace.meta["tail_work"] == [{"matmul": 60}] * 2


def test_compute_times_each_product_at_the_share_its_shape_measures():
    """A (2048 x 1024) @ (1024 x 4096) weight product on an A100 at the share its shape measures, and a QK^T of
    4,096 tokens and 128-wide heads at FlashAttention's share; FLOPs a trace file kept without shapes at the
    tables' large square product."""
    from parasim.comm.trace import Work
    m = machine("a100")
    w = Work({"matmul": 2 * 2048 * 4096 * 1024, "attention": 2 * 4096 * 4096 * 128 * 8})
    w.gemms = {("matmul", 2048, 4096, 1024): 1, ("attention", 4096, 4096, 128): 8}
    product = 2 * 2048 * 4096 * 1024 / (312e12 * gemm_efficiency("a100", 2048, 4096, 1024).value)
    scores = 8 * 2 * 4096 * 4096 * 128 / (312e12 * attention_efficiency("a100", 4096, 128, True, None).value)
    assert m.compute(w) == pytest.approx(product + scores, rel=1e-12)
    assert m.compute({"matmul": 312e12}) == pytest.approx(1 / gemm_efficiency("a100", 4096, 4096, 4096).value)


def _layerish(ctx):
    """Real-size shapes on symbolic ranks: a forward matmul, a TP all-reduce, a backward, then the DP
    gradient reduce-scatter, with a last matmul after it (the next bucket's backward)."""
    xp = ctx.xp
    tps = [ctx.new_group([0, 1], "tp"), ctx.new_group([2, 3], "tp")]
    dps = [ctx.new_group([0, 2], "dp"), ctx.new_group([1, 3], "dp")]
    tp, dp = tps[ctx.rank // 2], dps[ctx.rank % 2]
    x = ctx.rng.normal((8192, 8192))  # the run's float: the post's BF16 at real size
    w = ctx.rng.normal((8192, 8192))
    y = xp.matmul(x, w)
    ctx.comm.all_reduce(y, group=tp)
    gw = xp.tensordot(x, y, axes=([0], [0]))
    ctx.comm.reduce_scatter(gw, group=dp)
    xp.matmul(x, w)


def test_the_critical_path_adds_up_to_the_step_and_grad_reduce_overlap_hides_the_reduce_scatter():
    trace = run(_layerish, 4, "symbolic").trace
    m = machine("h200", gpus_per_node=2)  # tp inside a node, dp across
    off = simulate(trace, m)
    assert sum(s.seconds for s in off.critical) == pytest.approx(off.step, rel=1e-12)
    assert [s.kind for s in off.critical] == ["compute", "comm", "compute", "comm", "compute"]
    mm = product(8192, 8192, 8192)  # x @ w, and the weight gradient x^T y: both 8192 cubed
    nbytes = 8192 * 8192 * 2  # BF16 arrays: 2 bytes a value, as sent
    ar = nbytes * 2 * 1 / 2 / busbw("all_reduce", nbytes, "inside", 2)  # t = 2: each moves 2(t-1)/t of it
    rs = CALL + 1 * ACROSS + nbytes / 2 / busbw("all_gather", nbytes, "across", 2)  # across: latencies on top
    assert off.step == pytest.approx(mm + ar + mm + rs + mm, rel=1e-9)
    on = simulate(trace, m, ("grad-reduce",))
    # the reduce-scatter now runs beside the last matmul, which slows by SLOW of their overlap: the step ends
    # with the longer of the two
    assert on.step == pytest.approx(mm + ar + mm + max(rs, mm + SLOW * min(mm, rs)), rel=1e-9)
    assert sum(s.seconds for s in on.critical) == pytest.approx(on.step, rel=1e-12)
    assert on.step < off.step


@pytest.mark.parametrize("name", ["tp-mlp", "zero", "pp-1f1b", "moe16", "cp-causal"])
def test_every_lesson_step_is_the_sum_along_its_critical_path(name):
    lr = run_lesson(load_lessons()[name])
    for overlap in ((), ("grad-reduce", "prefetch")):
        tl = simulate(lr.result.trace, machine("h100"), overlap)
        assert tl.step > 0
        assert sum(s.seconds for s in tl.critical) == pytest.approx(tl.step, rel=1e-9)
        starts = [s.start for s in tl.critical]
        assert starts == sorted(starts) and tl.critical[0].start == 0.0


def test_timed_events_round_trip_through_the_trace_format_and_the_clock_leaves_the_trace_alone():
    """The clock lays a run out beside its trace (a Timeline), never writing on it; the lesson's JSON carries
    each event's times, and a trace file with them reads back."""
    lr = run_lesson(load_lessons()["tp-mlp"])
    lr.timing = ClockChoice("a100")
    report = lr.clock()
    assert all(e.time is None for e in lr.result.trace.events)  # the run's own record is untouched
    timed = {**lr.result.trace.to_dict(), "events": lr.to_dict()["events"]}
    back = Trace.from_dict(json.loads(json.dumps(timed)))
    times = [e.time for e in back.events]
    assert all(t is not None and t["end_us"] >= t["start_us"] for t in times)
    assert max(t["end_us"] for t in times) == pytest.approx(report["step_us"])
    bad = json.loads(json.dumps(timed))
    bad["events"][0]["time"] = {"start_us": 5.0, "end_us": 1.0}
    with pytest.raises(Exception, match="before it starts"):
        Trace.from_dict(bad)


def test_lesson_json_carries_times_and_what_each_switch_would_save():
    out = cli("lesson", "tp-attention", "--json", "--gpu-model", "a100")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["clock"]["gpu"] == "A100 80GB"
    assert all("start_us" in e["time"] and "end_us" in e["time"] for e in data["events"])
    assert set(data["clock"]["switches"]) == {"grad-reduce", "prefetch", "dualpipe"}
    bad = cli("lesson", "tp-attention", "--overlap", "sometimes")
    assert bad.returncode == 2 and "--overlap" in bad.stderr and bad.stderr.count("\n") == 1


def test_the_chrome_export_puts_slices_at_the_clocks_times(tmp_path):
    from parasim.clock.timeline import export_times
    from parasim.render.chrome import validate
    path = tmp_path / "t.json"
    out = cli("lesson", "tp-mlp", "--plain", "--chrome", str(path), "--gpu-model", "h100")
    assert out.returncode == 0, out.stderr
    data = json.loads(path.read_text())
    assert validate(data) == []
    lr = run_lesson(load_lessons()["tp-mlp"])
    lr.timing = ClockChoice("h100")
    times, work = export_times(lr.result.trace, lr.timeline())
    slices = [e for e in data["traceEvents"] if e.get("ph") == "X" and e["name"] == "all_reduce"]
    for s in slices:
        start, dur = times[(s["args"]["seq"], s["pid"])]
        assert s["ts"] == pytest.approx(start) and s["dur"] <= dur
    assert sum(e.get("name") == "compute" for e in data["traceEvents"]) == len(work)


def test_an_all_to_all_costs_its_slowest_member_pair_by_pair():
    """moe16's all-to-alls over EP 4, on nodes of 2: each member's transfers (comm/hops.py, pair by pair)
    added up inside its node and across, its two links side by side, the call as long as its slowest
    member: worked out here transfer by transfer, against the clock's matrix."""
    from parasim.clock.costs import event_seconds
    from parasim.comm.hops import event_transfers
    lr = run_lesson(load_lessons()["moe16"])
    m = machine("h100", gpus_per_node=2)
    a2a = [e for e in lr.result.trace.events if e.op == "all_to_all"]
    assert a2a
    for e in a2a:
        t = len(e.group.ranks)
        rows: dict = {}
        for a, b, n in event_transfers(e):
            row = rows.setdefault(a, [0.0, 0.0])
            row[a // 2 != b // 2] += n * 2 / 8  # float64 values timed at BF16's 2 bytes
        most_in = max([i for i, _ in rows.values()] or [0.0])
        most_x = max([x for _, x in rows.values()] or [0.0])
        # each link's rate: the all-to-all measured for the busiest member's bytes, its whole buffer (t-1)/t of
        # which leaves a member; inside a node for the node's members, across for the group
        inside = min(t, 2)
        rate_in = busbw("all_to_all", int(most_in * inside / (inside - 1)), "inside", inside, "h100") if most_in else 1
        rate_x = busbw("all_to_all", int(most_x * t / (t - 1)), "across", t, "h100") if most_x else 1
        worst = max([max(i / rate_in if i else 0.0, (ACROSS + x / rate_x) if x else 0.0)
                     for i, x in rows.values()] or [0.0])
        assert event_seconds(e, m) == pytest.approx(CALL + worst, rel=1e-12)


def test_all_to_alls_alike_in_chunks_are_timed_by_their_own_placement_and_bytes():
    """The clock times an all-to-all once for each kind it meets in a run (clock/costs.py: the same chunk records,
    bytes and placement on nodes): calls with the very same chunks on a group inside one node, on one across two,
    and with other chunks each take the time they take alone."""
    from parasim.clock.costs import event_seconds

    def program(ctx):
        inside = ctx.new_group([0, 1, 2, 3], "ep")
        across = ctx.new_group([4, 5, 8, 9], "ep")
        g = inside if ctx.rank < 4 else across if ctx.rank in (4, 5, 8, 9) else None
        for rows in (64, 64, 256, 64):
            if g is not None:
                ctx.comm.all_to_all([ctx.xp.ones((rows, 32), dtype=ctx.xp.float32) for _ in range(4)], group=g)

    trace = run(program, 16).trace
    m = machine("h100", gpus_per_node=8)
    tl = simulate(trace, m)
    a2a = [e for e in trace.events if e.op == "all_to_all"]
    assert len(a2a) == 8
    alone = {e.seq: event_seconds(e, m) for e in a2a}
    took = {e.seq: tl.times(e)[1] - tl.times(e)[0] for e in a2a}
    assert took == pytest.approx(alone, rel=1e-12)
    by_group = {}
    for e in a2a:
        by_group.setdefault((e.group.ranks, e.members[0].sent), set()).add(round(took[e.seq], 15))
    assert len(by_group) == 4 and all(len(v) == 1 for v in by_group.values())
    assert len({v.pop() for v in by_group.values()}) == 4  # across nodes is slower; bigger chunks are slower
    # one tuple of chunk records for each kind of chunks, across calls (comm/virtual.py): what the clock keys on
    assert len({id(m.ins) for e in a2a for m in e.members}) == 2


def test_a_folded_run_is_timed_as_the_full_run():
    """A folded symbolic step (engine/symbolic/fold.py) laid out on the clock gives every event the times the full
    run's trace gives it, and every rank the same busy time: the fold is only a shortcut."""
    from parasim.layout import Layout
    from parasim.engine.symbolic.fold import fold_of
    from tests.unit.train.test_fold import SMALL, make_step
    layout = Layout(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL)
    program = make_step(layout, m=2, routing="balanced")
    full = run(program, layout.world, "symbolic").trace
    folded = run(program, layout.world, "symbolic", fold=fold_of(layout)).trace
    m = machine("h100", gpus_per_node=4)
    a, b = simulate(full, m), simulate(folded, m)
    assert b.step == pytest.approx(a.step, rel=1e-12) and b.busy == pytest.approx(a.busy, rel=1e-12)

    def timed(trace, tl):
        return sorted((e.step, e.op, e.group.name, tuple(e.ranks), round(tl.times(e)[0], 15),
                       round(tl.times(e)[1], 15)) for e in trace.events)
    assert not any(e.source is None for e in folded.events if e.seq not in b.events)  # copies: their source's
    assert timed(folded, b) == timed(full, a)
    assert len(b.spans) < len(a.spans)  # the folded ranks' spans are their representatives'



def _paired(ctx):
    """A phase marked as a pair (DualPipe's two chunks) ends with an all-reduce; the next phase computes
    first: with the switch on, that compute must still wait for the pair's all-reduce."""
    xp = ctx.xp
    x = ctx.rng.normal((4096, 4096))  # the run's float: BF16
    ctx.phase("a pair", pair=1)
    y = xp.matmul(x, x)
    ctx.comm.all_reduce(y)
    ctx.phase("after the pair")
    z = xp.matmul(x, x)
    ctx.comm.all_reduce(z)


def test_a_paired_phase_runs_its_calls_beside_compute_and_waits_for_them_at_its_end():
    trace = run(_paired, 2, "symbolic").trace
    m = machine("h200")
    mm = product(4096, 4096, 4096)
    ar = 4096 * 4096 * 2 / busbw("all_reduce", 4096 * 4096 * 2, "inside", 2)  # BF16: 2 bytes a value
    assert simulate(trace, m).step == pytest.approx(2 * (mm + ar), rel=1e-9)
    # paired: the rank does not wait for the all-reduce inside the pair, but the next phase's product starts
    # only once it is done (the pair's end); the step is the same chain here, as nothing else could run
    on = simulate(trace, m, ("dualpipe",))
    assert on.step == pytest.approx(2 * (mm + ar), rel=1e-9)
    after = next(s for s in on.spans if s.kind == "compute" and s.phase == "after the pair")
    first = next(s for s in on.spans if s.kind == "comm" and s.phase == "a pair")
    assert after.start == pytest.approx(first.end, rel=1e-12)


def test_the_report_says_what_each_switch_saves_on_this_run():
    """On the layer-like step: grad-reduce hides the reduce-scatter behind the last product (saves the
    shorter of the two), prefetch and dualpipe move nothing there (no parameter all-gather, no pair)."""
    trace = run(_layerish, 4, "symbolic").trace
    got = clock_report(trace, ClockChoice("h200", gpus_per_node=2))["switches"]
    mm = product(8192, 8192, 8192)
    rs = CALL + ACROSS + 8192 * 8192 * 2 / 2 / busbw("all_gather", 8192 * 8192 * 2, "across", 2)
    # off: the reduce-scatter, then the last product; on: side by side, the product slowed by SLOW of the overlap
    assert got["grad-reduce"]["saves_us"] == pytest.approx((rs + mm - max(rs, mm + SLOW * min(mm, rs))) * 1e6,
                                                           rel=1e-6)
    assert got["prefetch"]["saves_us"] == 0 and got["dualpipe"]["saves_us"] == 0
    assert not any(v["on"] for v in got.values())


def test_the_walk_through_says_the_step_and_what_pairing_saves():
    from parasim.render.walkthrough import walkthrough
    text = " ".join(walkthrough(run_lesson(load_lessons()["all-to-all-hidden"])).split())
    assert "On the clock (H200s, 8 a node, no overlap" in text and "dualpipe would save" in text
    assert "grad-reduce would save" not in text  # nothing of it here: no data-parallel group


def test_an_moe_layers_forward_prices_its_router_its_experts_and_its_permutation():
    """One MoE layer (hidden 64, 8 heads, 16 experts of width 32, top 2) on one GPU at 128 tokens: its products
    forward, each at the share its shape measures: Q, K and V (128 x 64 @ 64 x 192) and the output (128 x 64 @
    64 x 64), the router (128 x 64 @ 64 x 16), and each of the 16 experts on its 128 x 2 / 16 = 16 rows (16 x 64
    @ 64 x 32, then 16 x 32 @ 32 x 64); the MLP's elementwise passes over the 2 copies' 32 hidden values; the
    permutation reading and writing the tokens and their 2 copies twice (into expert order and back), 2 bytes
    a value, at the HBM rate an elementwise pass measures."""
    from parasim.estimate.fusion import ELEMENTWISE
    from parasim.clock.plan import layer_forward
    from parasim.clock.runs import training_plan
    from parasim.estimate.kernels import memory_efficiency
    from parasim.layout import ModelSpec
    h, t, e, k, f = 64, 128, 16, 2, 32
    model = ModelSpec(layers=1, hidden=h, heads=8, vocab=100, experts=e, top_k=k, expert_ffn=f, bias=False)
    got = layer_forward(model, training_plan(1, flash=True, dropout=False), t, machine("h200"), moe=True)
    rows = t * k // e
    forward = (product(t, 3 * h, h) + product(t, h, h) + product(t, e, h)
               + e * (product(rows, f, h) + product(rows, h, f)))
    assert got["matmul"] == pytest.approx(forward, rel=1e-12)
    per_value = {"act": sum(w for _, over, _, w in ELEMENTWISE if over == "act"),
                 "ffn": sum(w for _, over, _, w in ELEMENTWISE if over == "ffn")}
    passes = t * h * per_value["act"] + t * k * f * per_value["ffn"] + 2 * t * h * (1 + k) * 2
    assert got["elementwise"] == pytest.approx(passes / (H200.hbm.value * memory_efficiency("h200").value))


def test_a_timeline_of_the_same_trace_reuses_another_s_costs_and_a_report_on_another_machine_does_not(monkeypatch):
    """A report's timeline per switch lays the run's events out again with the first timeline's costs (no event
    timed twice), and lays out the same times as a timeline made alone; a timeline on another GPU type is not
    reused (its costs are another machine's)."""
    import parasim.clock.timeline as timeline

    trace = run(_layerish, 4, "symbolic").trace
    m = machine("h200", gpus_per_node=2)
    first = simulate(trace, m)
    timed = []
    real = timeline.event_seconds
    monkeypatch.setattr(timeline, "event_seconds", lambda e, mm, memo=None: timed.append(e.seq) or real(e, mm, memo))
    again = simulate(trace, m, ("grad-reduce",), first.costs)
    assert timed == []  # every event's seconds came from the first timeline
    alone = simulate(trace, m, ("grad-reduce",))
    assert timed != [] and again.step == alone.step and again.events == alone.events
    choice = ClockChoice("h100", gpus_per_node=2)
    on_h100 = clock_report(trace, choice, tl=simulate(trace, machine("h100", gpus_per_node=2)))["switches"]
    mixed = clock_report(trace, choice, tl=simulate(trace, m))["switches"]  # a timeline of another GPU type
    assert mixed["grad-reduce"]["step_on_us"] == on_h100["grad-reduce"]["step_on_us"]

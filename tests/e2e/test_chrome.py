"""The Chrome trace and HTA exports, and our own validator of the Chrome Trace Event Format."""
import copy
import json
import re

import pytest

import parasim
from parasim.render.chrome import COLL, COMPUTE, RECV, SEND, to_chrome, to_hta, validate
from parasim.comm.trace import Trace


def _all_reduce(ctx):
    ctx.phase("sum")
    x = ctx.asarray([1, 2, 3, 4]) * (ctx.rank + 1)
    return ctx.comm.all_reduce(x, label="demo")


def _tp_reduce_scatter(ctx):
    tp = ctx.new_group([0, 1], "tp")  # every rank creates every group
    x = ctx.asarray([1, 2, 3, 4])
    if ctx.rank in tp:
        return ctx.comm.reduce_scatter(x, group=tp, label="rs")
    return x


def _ring(ctx):
    ctx.phase("ring")
    x = ctx.asarray([1.0, 2.0, 3.0]) * ctx.rank
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    (got,) = ctx.comm.exchange([parasim.Send(x, nxt), parasim.Recv(prv, x.shape, x.dtype)])
    ctx.compute("matmul", flops=10)
    ctx.note("after matmul")
    return got


def _fan_out(ctx):
    """Rank 0 sends two arrays in one batch: both transfers land on the same step of its send track."""
    x = ctx.asarray([ctx.rank, 1])
    if ctx.rank == 0:
        ctx.comm.exchange([parasim.Send(x, 1), parasim.Send(x, 2)])
    else:
        return ctx.comm.recv(0, x.shape, x.dtype)


def _xs(chrome, **match):
    return [e for e in chrome["traceEvents"] if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


def _export(program, world, **kw):
    res = parasim.run(program, world=world, keep_values=16, **kw)
    chrome = to_chrome(res.trace)
    assert validate(chrome) == []
    return res.trace, chrome


@pytest.mark.parametrize("world", [2, 4])
def test_all_reduce_one_slice_per_member(world):
    trace, chrome = _export(_all_reduce, world)
    xs = _xs(chrome, cat="collective")
    assert len(xs) == world
    assert sorted(e["pid"] for e in xs) == list(range(world))
    for e in xs:
        a = e["args"]
        assert e["name"] == "all_reduce" and e["tid"] == COLL and e["dur"] > 0
        assert a["label"] == "demo" and a["phase"] == "sum" and a["group"] == "world"
        assert a["ranks"] == list(range(world)) and a["step"] == 1 and a["algo"] == "direct"
        assert a["ins"] == [{"shape": [4], "dtype": "float64"}] and a["outs"] == a["ins"]
        assert (a["sent_bytes"], a["recv_bytes"]) == trace.bytes_by_rank()[e["pid"]]
        assert re.fullmatch(r".*test_chrome\.py:\d+", a["site"])
    marks = [e for e in chrome["traceEvents"] if e["ph"] == "i"]
    assert [(e["name"], e["cat"], e["s"]) for e in marks] == [("sum", "phase", "t")] * world
    assert chrome["otherData"] == {"format": "parasim-trace", "version": 1, "world": world, "backend": "virtual",
                                   "step_us": 1000.0, "steps": 1, "meta": trace.meta}


def test_metadata_names_and_orders_every_rank_and_track():
    _, chrome = _export(_all_reduce, 2)
    meta = {(e["pid"], e["tid"], e["name"]): e["args"] for e in chrome["traceEvents"] if e["ph"] == "M"}
    assert meta[(1, 0, "process_name")] == {"name": "rank 1"}
    assert meta[(1, 0, "process_sort_index")] == {"sort_index": 1}
    tracks = {tid: meta[(0, tid, "thread_name")]["name"] for tid in range(4)}
    assert tracks == {COLL: "collectives", SEND: "send", RECV: "recv", COMPUTE: "compute"}
    assert meta[(0, RECV, "thread_sort_index")] == {"sort_index": RECV}


def test_sub_group_collective_only_on_its_members():
    _, chrome = _export(_tp_reduce_scatter, 4)
    xs = _xs(chrome, cat="collective")
    assert [e["pid"] for e in xs] == [0, 1]
    assert all(e["name"] == "reduce_scatter" and e["args"]["group"] == "tp" for e in xs)
    assert all(e["args"]["ranks"] == [0, 1] and e["args"]["outs"] == [{"shape": [2], "dtype": "float64"}]
               for e in xs)


def test_ring_of_transfers_has_send_recv_slices_and_one_flow_each():
    trace, chrome = _export(_ring, 4)
    p2p = [e for e in trace.events if e.kind == "p2p"]
    assert len(p2p) == 4
    sends, recvs = _xs(chrome, tid=SEND), _xs(chrome, tid=RECV)
    assert len(sends) == len(recvs) == 4 and all(e["cat"] == "p2p" for e in sends + recvs)
    for e in sends + recvs:
        a = e["args"]
        assert a["bytes"] == 24 and a["shape"] == [3] and a["dtype"] == "float64" and "test_chrome.py:" in a["site"]
        assert e["pid"] == (a["src"] if e["tid"] == SEND else a["dst"])
    starts = {e["id"]: e for e in chrome["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in chrome["traceEvents"] if e["ph"] == "f"}
    assert set(starts) == set(ends) == {e.seq for e in p2p}
    for fid, s in starts.items():
        f = ends[fid]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) == ("p2p", "p2p") and f["bp"] == "e"
        ev = trace.events[fid]
        assert (s["pid"], s["tid"], f["pid"], f["tid"]) == (ev.params["src"], SEND, ev.params["dst"], RECV)
    computes = _xs(chrome, cat="compute")
    assert len(computes) == 4 and all(e["name"] == "matmul" and e["args"]["flops"] == 10 for e in computes)
    assert all(e["tid"] == COMPUTE for e in computes)
    notes = [e for e in chrome["traceEvents"] if e["ph"] == "i" and e["cat"] == "note"]
    assert len(notes) == 4 and all(e["ts"] == 2000.0 for e in notes)  # after step 2 (transfer, then matmul)


def test_batched_sends_on_one_step_share_it_without_overlap():
    _, chrome = _export(_fan_out, 3)
    sends = sorted(_xs(chrome, pid=0, tid=SEND), key=lambda e: e["ts"])
    assert len(sends) == 2 and sends[0]["args"]["step"] == sends[1]["args"]["step"] == 1
    assert sends[0]["ts"] + sends[0]["dur"] < sends[1]["ts"] and sends[1]["ts"] + sends[1]["dur"] < 1000.0


def test_step_us_scales_the_clock():
    trace = parasim.run(_ring, world=2).trace
    ts = sorted({e["ts"] for e in _xs(to_chrome(trace, step_us=10.0))})
    assert ts == [0.0, 10.0]
    with pytest.raises(ValueError):
        to_chrome(trace, step_us=0)


def test_export_is_json_and_deterministic():
    def both(program):
        return parasim.run(program, world=4, keep_values=16, algo="ring").trace

    a, b = to_chrome(both(_ring)), to_chrome(both(_ring))
    assert json.dumps(a, allow_nan=False) == json.dumps(b, allow_nan=False)
    trace = both(_all_reduce)
    assert to_chrome(trace) == to_chrome(Trace.from_dict(json.loads(trace.to_json())))
    assert all(e["args"]["hops"] > 0 and e["args"]["algo"] == "ring" for e in _xs(to_chrome(trace)))


def _broken(mutate):
    _, chrome = _export(_ring, 2)
    chrome = copy.deepcopy(chrome)
    mutate(chrome["traceEvents"])
    return validate(chrome)


def _first(events, **match):
    return next(e for e in events if all(e.get(k) == v for k, v in match.items()))


def test_validate_catches_partial_overlap():
    def overlap(evs):
        s = _first(evs, ph="X", tid=SEND)
        evs.append({**s, "ts": s["ts"] + s["dur"] / 2})
    assert any("partially overlaps" in p for p in _broken(overlap))


def test_validate_catches_dangling_and_misbound_flows():
    assert any("one s and one f" in p for p in _broken(lambda evs: evs.remove(_first(evs, ph="f"))))
    assert any("bp" in p for p in _broken(lambda evs: _first(evs, ph="f").pop("bp")))
    assert any("inside no slice" in p for p in _broken(lambda evs: _first(evs, ph="s").update(ts=-5.0)))
    assert any("one s and one f" in p for p in _broken(lambda evs: _first(evs, ph="f").update(cat="other")))


def test_validate_catches_bad_events():
    assert any("dur" in p for p in _broken(lambda evs: _first(evs, ph="X").pop("dur")))
    assert any("dur" in p for p in _broken(lambda evs: _first(evs, ph="X").update(dur=-1)))
    assert any("ts" in p for p in _broken(lambda evs: _first(evs, ph="X").update(ts="12.5")))
    assert any("missing pid" in p for p in _broken(lambda evs: _first(evs, ph="i").pop("pid")))
    assert any("args.name" in p for p in _broken(lambda evs: _first(evs, ph="M").update(args={})))
    assert any("sort_index" in p for p in _broken(
        lambda evs: _first(evs, name="thread_sort_index")["args"].update(sort_index="1")))
    assert any("unknown phase" in p for p in _broken(lambda evs: _first(evs, ph="i").update(ph="?")))
    assert validate([]) and validate({"traceEvents": {}})


def test_hta_one_kineto_like_trace_per_rank():
    trace = parasim.run(_ring, world=4).trace
    files = to_hta(trace)
    assert sorted(files) == [0, 1, 2, 3]
    for r, f in files.items():
        assert f["distributedInfo"] == {"rank": r, "world_size": 4, "backend": "virtual"}
        assert f["schemaVersion"] == 1 and validate(f) == []
        evs = f["traceEvents"]
        assert all("cat" in e and e["dur"] > 0 for e in evs)
        assert [e["name"] for e in evs if e["cat"] == "user_annotation"] == ["ProfilerStep#0"]
        kernels = [e for e in evs if e["cat"] == "kernel"]
        assert all(e["args"]["device"] == r and e["args"]["stream"] > 0 for e in kernels)
        # HTA counts a kernel as communication when its name matches ^nccl.*Kernel
        comm = sorted(e["name"] for e in kernels if re.match(r"^nccl.*Kernel", e["name"]))
        assert comm == ["ncclKernel_recv", "ncclKernel_send"]
        assert [e["name"] for e in kernels if not e["name"].startswith("nccl")] == ["matmul"]
    json.dumps(files, allow_nan=False)


def test_hta_places_kernels_at_measured_times_in_whole_microseconds():
    """Real ranks: each kernel where the run measured it (inside its measured span, whole microseconds);
    the one ProfilerStep covers them all."""
    trace = parasim.run(_ring, world=4).trace
    times = {(e.seq, m.rank): (100.0 + 10 * e.seq + 0.4, 7.5) for e in trace.events for m in e.members}
    files = to_hta(trace, times=times)
    for r, f in files.items():
        step, *kernels = f["traceEvents"]
        for k in kernels:
            start, dur = times[(k["args"]["seq"], r)]
            assert isinstance(k["ts"], int) and isinstance(k["dur"], int)
            assert start <= k["ts"] and k["ts"] + k["dur"] <= start + dur
        assert step["ts"] <= min(k["ts"] for k in kernels)
        assert step["ts"] + step["dur"] >= max(k["ts"] + k["dur"] for k in kernels)

"""comm/trace.py's readings of a trace, piece by piece on traces written here: a rank's peak of held bytes (in
a phase, at a moment between events, ties, a rank or phase that holds nothing), the calls a rank joins, the work
read back with its products, and the trace's JSON written and read (indent, the names in its errors). The
expected values are counted by hand from the marks."""
import dataclasses
import math

import pytest

import parasim
from parasim.comm.trace import HELD_KINDS, Mark, Trace, Work, work_of
from parasim.errors import UsageError


def _kinds(**held: int) -> dict[str, int]:
    return {k: held.get(k, 0) for k in HELD_KINDS}


def _held(rank: int, step: int, name: str, kind: str, n: int) -> Mark:
    return Mark(rank, step, "held", name, {"kind": kind, "bytes": n})


def _freed(rank: int, step: int, name: str) -> Mark:
    return Mark(rank, step, "held", name, {"bytes": 0})


def _trace() -> Trace:
    """Rank 1 in phase "a": weights 100, then gathered 50 (150), freed (100); in phase "b": activations 30 (130),
    then weights 20 in place of 100 (50), activations freed (20), then gathered 130 (150, a tie with phase a's
    peak). Rank 0 holds 7 in phase "a" only; its marks sit between rank 1's and must not count for rank 1."""
    return Trace(2, marks=[
        Mark(1, 0, "phase", "a"),
        _held(1, 1, "w", "weights", 100),
        _held(0, 1, "other", "optimizer", 7),
        _held(1, 2, "g", "gathered", 50),
        Mark(1, 2, "note", "not a hold"),
        _freed(1, 3, "g"),
        Mark(1, 3, "phase", "b"),
        Mark(0, 3, "phase", "b"),
        _held(1, 4, "act", "activations", 30),
        _held(1, 5, "w", "weights", 20),
        _freed(1, 6, "act"),
        _held(1, 7, "g2", "gathered", 130),
        Mark(1, 8, "phase", "c"),
    ])


def test_the_peak_is_the_first_hold_that_reached_the_most():
    t = _trace()
    # 150 is reached twice (phase a's gathered, phase b's g2): the first one is the peak
    assert t.peak(1) == {"bytes": 150, "step": 2, "phase": "a", "name": "g",
                         "by_kind": _kinds(weights=100, gathered=50)}
    assert t.peak(0) == {"bytes": 7, "step": 1, "phase": "", "name": "other", "by_kind": _kinds(optimizer=7)}


def test_the_peak_within_a_phase_counts_what_was_held_coming_in():
    t = _trace()
    assert t.peak(1, phase="a") == {"bytes": 150, "step": 2, "phase": "a", "name": "g",
                                    "by_kind": _kinds(weights=100, gathered=50)}
    # in b: 100 came in, 30 more reached 130, then g2 reached 150 (weights 20 + gathered 130)
    assert t.peak(1, phase="b") == {"bytes": 150, "step": 7, "phase": "b", "name": "g2",
                                    "by_kind": _kinds(weights=20, gathered=130)}
    # c holds nothing new: what rank 1 held coming into it, at the phase mark's step, named by no hold
    assert t.peak(1, phase="c") == {"bytes": 150, "step": 8, "phase": "c", "name": None,
                                    "by_kind": _kinds(weights=20, gathered=130)}
    # rank 0's phase b holds nothing new either: its 7 bytes coming in
    assert t.peak(0, phase="b") == {"bytes": 7, "step": 3, "phase": "b", "name": None, "by_kind": _kinds(optimizer=7)}


def test_a_phase_entered_twice_keeps_what_was_held_the_first_time():
    t = Trace(1, marks=[Mark(0, 0, "phase", "x"), Mark(0, 1, "phase", "y"), _held(0, 2, "w", "weights", 5),
                        Mark(0, 3, "phase", "x")])
    assert t.peak(0, phase="x") == {"bytes": 0, "step": 0, "phase": "x", "name": None, "by_kind": _kinds()}


def test_a_rank_or_phase_with_no_marks_peaks_at_nothing():
    t = _trace()
    assert t.peak(1, phase="never") == {"bytes": 0, "step": 0, "phase": "never", "name": None, "by_kind": _kinds()}
    assert t.peak(5) == {"bytes": 0, "step": 0, "phase": "", "name": None, "by_kind": _kinds()}
    # a rank whose only marks free what it never held
    freed = Trace(1, marks=[_freed(0, 1, "w"), Mark(0, 2, "held", "v")])
    assert freed.peak(0) == {"bytes": 0, "step": 0, "phase": "", "name": None, "by_kind": _kinds()}


def _calls(ctx):
    g = ctx.new_group(range(ctx.world), "dp")
    ctx.hold("w", 100 + ctx.rank, "weights")
    ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), group=g)
    ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), group=g)
    ctx.comm.barrier(group=g)


def test_the_calls_a_rank_joins_leave_compute_out():
    t = parasim.run(_calls, 2).trace
    joined = t.joins(0)
    assert [(j["op"], j["group"], j["calls"]) for j in joined] == [("all_reduce", "dp", 2), ("barrier", "dp", 1)]
    sent = sum(e.member(0).sent for e in t.events if e.op == "all_reduce")
    assert joined[0]["sent"] == sent > 0 and joined[0]["received"] == sum(e.member(0).recv for e in t.events[:2])
    assert t.joins(3) == []
    # an event of compute (a real run's timed work) is no call
    t.events[0] = dataclasses.replace(t.events[0], kind="compute")
    assert [(j["op"], j["calls"]) for j in t.joins(0)] == [("all_reduce", 1), ("barrier", 1)]


def test_work_read_back_keeps_its_flops_and_products():
    assert work_of(None, [["mlp", 1, 2, 3, 4]]) is None
    w = work_of({"mlp": 48}, [["mlp", 2, 3, 4, 2], ["attention", 1, 1, 1, 5]])
    assert isinstance(w, Work) and dict(w) == {"mlp": 48}
    assert w.gemms == {("mlp", 2, 3, 4): 2, ("attention", 1, 1, 1): 5}
    bare = work_of({"mlp": 1}, None)
    assert dict(bare) == {"mlp": 1} and bare.gemms == {}
    assert Work().gemms == {}


def test_the_json_of_a_trace_is_one_line_unless_indented_and_names_the_trace_in_its_errors(tmp_path):
    t = parasim.run(_calls, 2).trace
    assert "\n" not in t.to_json()
    assert t.to_json(indent=2).startswith('{\n  "format"')
    with pytest.raises(UsageError, match=r"^the trace, at \['meta'\]\['x'\]"):
        Trace(1, meta={"x": object()}).to_json()
    path = tmp_path / "t.json"
    t.save(path)
    assert Trace.load(path).peak(1) == t.peak(1) and t.peak(1)["bytes"] == 101
    path.write_text("{")
    with pytest.raises(UsageError, match=rf"^{path} is not JSON"):
        Trace.load(path)
    with pytest.raises(UsageError, match=rf"^cannot read trace {tmp_path / 'none.json'}"):
        Trace.load(tmp_path / "none.json")


def test_a_trace_read_from_bytes_names_its_source_and_takes_old_constants():
    with pytest.raises(UsageError, match=r"^mine\.json is not a parasim trace: "):
        Trace.from_json(b'{"a": 1, "a": 2}', "mine.json")
    with pytest.raises(UsageError, match=r"^the trace is empty, not a parasim trace"):
        Trace.from_json(b" ")
    # traces written before strict JSON hold NaN and Infinity: still read
    t = parasim.run(_calls, 2).trace
    t.meta["loss"] = math.nan
    text = t.to_json().replace('"nan"', "NaN")
    assert "NaN" in text and math.isnan(Trace.from_json(text.encode()).meta["loss"])


def test_what_a_rank_held_while_an_event_ran_or_before_a_mark():
    """held(rank, step): every hold made before that step (a buffer is held before the collective that fills it);
    held(rank, before=i): the holds among marks 0..i-1 of the trace. Worked from _trace's marks by hand."""
    t = _trace()
    assert t.held(1, step=2) == _kinds(weights=100)  # the gathering at step 2 itself not yet
    assert t.held(1, step=3) == _kinds(weights=100, gathered=50)
    assert t.held(1) == _kinds(weights=20, gathered=130)  # every mark
    assert t.held(1, before=3) == _kinds(weights=100)  # marks 0, 1, 2: rank 0's optimizer is not rank 1's
    assert t.held(1, before=4) == _kinds(weights=100, gathered=50)  # mark 3 is rank 1's gathering
    assert t.held(0, before=3) == _kinds(optimizer=7)
    assert t.held(1, step=3, before=4) == _kinds(weights=100, gathered=50)
    assert t.held(1, step=2, before=4) == _kinds(weights=100)  # both bounds apply


def test_a_note_is_noted_only_by_its_kind_and_its_field():
    phases_only = Trace(2, marks=[Mark(0, 0, "phase", "a"), _held(0, 1, "w", "weights", 1)])
    assert not phases_only.noted() and not phases_only.noted("table_row")
    noted = Trace(2, marks=[Mark(0, 0, "phase", "a"), Mark(1, 1, "note", "hello", {"x": 1})])
    assert noted.noted() and noted.noted("x") and not noted.noted("table_row")
    bare = Trace(2, marks=[Mark(1, 1, "note", "no fields")])
    assert bare.noted() and not bare.noted("x")

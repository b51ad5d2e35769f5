"""Pipeline schedules as data and their slot timing: the post's GPipe and 1F1B tables slot for slot, the
bubble, activation peaks, and the same action order as torch.distributed.pipelining."""
import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers_schedules import POST_1F1B, POST_GPIPE  # the post's tables, which other tests show too

from parasim.errors import UsageError
from parasim.pipeline.action import Action
from parasim.pipeline.schedules import SCHEDULES, check_layers, generate
from parasim.pipeline.timing import time_schedule

TORCH_NAMES = {e.name: e.torch_name for e in SCHEDULES if e.torch_name}  # the classes our orders are checked against


def table(name, pp=4, m=4):
    return [" ".join(x or "." for x in row) for row in time_schedule(generate(name, pp, m)).slots]


def test_the_posts_tables():
    assert table("gpipe") == POST_GPIPE
    assert table("1f1b") == POST_1F1B
    for name in ("gpipe", "1f1b"):
        t = time_schedule(generate(name, 4, 4))
        assert t.bubble == Fraction(3, 7) and t.idle == [6] * 4  # busy 8 of 14 slots


def test_bubbles_for_more_microbatches():
    bubble = lambda p, m: time_schedule(generate("1f1b", p, m)).bubble  # noqa: E731
    assert round(float(bubble(4, 16)), 2) == 0.16 and round(float(bubble(4, 32)), 2) == 0.09
    assert next(m for m in range(1, 200) if bubble(8, m) < Fraction(1, 10)) == 64


def test_activation_peaks():
    assert time_schedule(generate("gpipe", 4, 8)).peak == [8] * 4
    assert time_schedule(generate("1f1b", 4, 8)).peak == [4, 3, 2, 1]
    zb = time_schedule(generate("zb-h1", 4, 8))
    assert zb.peak == [4] * 4 and zb.makespan == 27  # 1F1B's memory, a third of its bubble
    assert time_schedule(generate("1f1b", 4, 8), {"B": 2}).makespan == 33


def _torch_order(schedule, pp, m, v=1):
    """Ask the installed torch for its order: stages are mocks, only their counts and indices matter."""
    import warnings
    from unittest import mock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules
    stages = []
    for c in range(v):
        stage = mock.create_autospec(PipelineStage, instance=True)
        stage.num_stages, stage.group_size, stage.group_rank, stage.stage_index = pp * v, pp, 0, c * pp
        stage.submod = torch.nn.Identity()
        stages.append(stage)
    cls = getattr(schedules, TORCH_NAMES[schedule])
    order = cls(stages[0] if schedule == "1f1b" else stages, m).pipeline_order
    out = {}
    for r, acts in order.items():  # DualPipeV's overlapped pairs: the forward, then the backward
        flat = [x for a in acts if a is not None for x in (a.sub_actions or (a,))]
        out[r] = [str(a) for a in flat if "REDUCE" not in str(a)]
    return out


def _compare(schedule, pp, m, v):
    theirs = _torch_order(schedule, pp, m, v)
    ours = generate(schedule, pp, m, v)
    if schedule == "1f1b":  # torch 2.13's IR numbers the last rank's forwards one too high (it runs F0 B0 F1 ..)
        theirs[pp - 1] = [f"{pp - 1}F{int(a.split('F')[1]) - 1}" if "F" in a else a for a in theirs[pp - 1]]
    for r in range(pp):
        assert [a.torch_name() for a in ours[r]] == theirs[r], (schedule, pp, m, v, r)


@pytest.mark.parametrize("schedule, pp, m, v", [
    ("1f1b", 2, 2, 1), ("1f1b", 3, 5, 1), ("1f1b", 4, 4, 1), ("1f1b", 8, 16, 1),
    ("zb-h1", 4, 8, 1), ("zb-h1", 3, 6, 1),
    ("interleaved", 4, 4, 2), ("interleaved", 4, 8, 3), ("interleaved", 4, 10, 2), ("interleaved", 8, 24, 4),
    ("interleaved-zb", 4, 8, 2), ("interleaved-zb", 3, 3, 2),
    ("zbv", 4, 8, 2), ("zbv", 3, 2, 2), ("zbv", 2, 2, 2), ("zbv", 3, 4, 2), ("zbv", 4, 5, 2),  # m < 2p-1
    ("dualpipev", 4, 8, 2), ("dualpipev", 3, 9, 2),
    ("dualpipev", 5, 10, 2), ("dualpipev", 6, 13, 2)])
def test_order_equals_torch(schedule, pp, m, v):
    pytest.importorskip("torch")
    _compare(schedule, pp, m, v)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TORCH_NAMES)), st.integers(1, 6), st.integers(1, 20), st.integers(2, 4))
def test_order_equals_torch_drawn(schedule, pp, m, v):
    """Orders for parameters no table here contains, against torch asked live; both refuse the same ones."""
    pytest.importorskip("torch")
    v = 1 if schedule in ("1f1b", "zb-h1") else 2 if schedule in ("zbv", "dualpipev") else v
    try:
        theirs = _torch_order(schedule, pp, m, v)
    except (ValueError, AssertionError, ZeroDivisionError, IndexError):
        theirs = None
    try:
        generate(schedule, pp, m, v)
    except UsageError:
        assert theirs is None or schedule == "1f1b" and pp == 1, (schedule, pp, m, v)
        return
    if theirs is not None:
        _compare(schedule, pp, m, v)


@pytest.mark.parametrize("schedule, pp, m, v", [("zbv", 4, 8, 2), ("dualpipev", 3, 6, 2), ("interleaved", 4, 8, 3),
                                                 ("interleaved-zb", 4, 8, 2)])
def test_each_action_names_its_rank_chunk(schedule, pp, m, v):
    """The chunk index is the stage's place among the rank's stages: V shapes hold stage r going down and
    2p-1-r coming up; interleaving holds r, r+p, r+2p, ..."""
    for r, acts in enumerate(generate(schedule, pp, m, v)):
        stages = [r, 2 * pp - 1 - r] if schedule in ("zbv", "dualpipev") else [r + c * pp for c in range(v)]
        assert {(a.stage, a.chunk) for a in acts} == {(s, c) for c, s in enumerate(stages)}


def test_interleaved_bubble():
    t = time_schedule(generate("interleaved", 4, 4, 2))
    assert t.bubble == Fraction(3, 11) and t.idle == [6] * 4  # the post's 3/7 -> 3/11 with v = 2
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2)]:
        assert time_schedule(generate("interleaved", p, m, v)).bubble == Fraction(p - 1, v * m + p - 1)


def test_zero_bubble_formulas():
    costs = {"F": 1, "B": 2, "I": 1, "W": 1}
    for p in (2, 4, 6):
        assert time_schedule(generate("zb-h1", p, 2 * p), costs).idle == [p - 1] * p  # (p-1)(F+I-W)
        assert time_schedule(generate("1f1b", p, 2 * p), costs).idle == [3 * (p - 1)] * p  # (p-1)(F+B)
        assert time_schedule(generate("dualpipev", p, 2 * p), costs).peak == [2 * p + 1] * p


@pytest.mark.parametrize("args, rule", [
    (("pipedream", 4, 4), "unknown schedule"),
    (("1f1b", 4, 0), "microbatches must be a positive integer"),
    (("interleaved", 4, 9, 2), "multiple of max"),
    (("interleaved", 4, 4, 1), "at least 2 chunks"),
    (("1f1b", 4, 4, 2), "one chunk per rank"),
    (("zbv", 4, 8, 3), "exactly 2 chunks"),
    (("dualpipev", 4, 7, 2), "m >= 2 \\* pp = 8")])
def test_bad_parameters(args, rule):
    with pytest.raises(UsageError, match=rule):
        generate(*args)
    with pytest.raises(UsageError, match="do not split evenly over 8 stages"):
        check_layers(12, generate("interleaved", 4, 4, 2))


def test_cli():
    from conftest import cli
    out = cli("schedule", "--schedule", "gpipe", "--pp", "4", "--microbatches", "4", "--json")
    data = json.loads(out.stdout)
    assert set(data) >= {"schedule", "pp", "microbatches", "slots", "bubble", "peak_activations", "makespan"}
    assert [" ".join(x or "." for x in row) for row in data["slots"]] == POST_GPIPE and data["bubble"] == "3/7"
    for args in (["--pp", "0"], ["--schedule", "dualpipev", "-m", "4"], ["--layers", "6"],
                 ["--schedule", "interleaved", "-m", "7", "--pp", "3"]):
        bad = cli("schedule", *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, args
    out = cli("schedule", "--schedule", "interleaved", "--chunks", "2", "--json")
    data = json.loads(out.stdout)
    assert data["bubble"] == "3/11" and data["chunks"] == 2 and data["slots"][0][4] == "f1"


def test_cli_json_of_the_smallest_1f1b():
    from conftest import cli
    data = json.loads(cli("schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--json").stdout)
    # p = m = 2: bubble (p-1)/(m+p-1) = 1/3, 2(p-1) = 2 idle slots per rank, rank 0 holds both micro-batches
    assert data == {"schedule": "1f1b", "pp": 2, "microbatches": 2, "chunks": 1,
                    "slots": [["F1", "F2", None, "B1", None, "B2"], [None, "F1", "B1", "F2", "B2", None]],
                    "bubble": "1/3", "bubble_fraction": pytest.approx(1 / 3), "peak_activations": [2, 1],
                    "makespan": 6, "idle": [2, 2]}


def test_plot_two_chunks(tmp_path):
    from parasim.render.plots import plot_slots
    out = tmp_path / "dualpipev.png"
    plot_slots(time_schedule(generate("dualpipev", 4, 8), {"B": 2}), "dualpipev", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bubble_with_unequal_idle():
    """Rank 0 holds stages 0 and 1, rank 1 holds stage 2 (one micro-batch): rank 0 works 4 slots of 6 and
    rank 1 works 2, so the bubble is (2 + 4) / (2 * 6) = 1/2, not either rank's own share."""
    from parasim.pipeline.action import Action
    sched = [[Action("F", 0, 0), Action("F", 0, 1, 1), Action("B", 0, 1, 1), Action("B", 0, 0)],
             [Action("F", 0, 2), Action("B", 0, 2)]]
    t = time_schedule(sched)
    assert [" ".join(x or "." for x in row) for row in t.slots] == ["F1 f1 . . b1 B1", ". . F1 B1 . ."]
    assert t.idle == [2, 4] and t.makespan == 6 and t.bubble == Fraction(1, 2)
    assert t.peak == [2, 1]


def test_timing_of_empty_and_reversed_schedules():
    """No ranks: nothing to time. A rank that finishes first (rank 0 holds the last stage here) must not stop
    the others from being placed."""
    from parasim.pipeline.action import Action
    t = time_schedule([])
    assert (t.makespan, t.bubble, t.slots, t.idle) == (0, Fraction(0), [], [])
    t = time_schedule([[]])
    assert (t.makespan, t.slots, t.idle, t.peak) == (0, [[]], [0], [0])
    t = time_schedule([[Action("F", 0, 1), Action("B", 0, 1)], [Action("F", 0, 0), Action("B", 0, 0)]])
    assert [" ".join(x or "." for x in row) for row in t.slots] == [". F1 B1 .", "F1 . . B1"]


def test_a_weight_pass_before_its_input_pass_deadlocks():
    """W needs its I: a rank that lists W first waits forever, and the error names what each rank waits on."""
    from parasim.pipeline.action import Action
    with pytest.raises(UsageError, match=r"deadlocks: every rank waits \(\{0: 'W1'\}\)"):
        time_schedule([[Action("F", 0, 0), Action("W", 0, 0), Action("I", 0, 0)]])
    with pytest.raises(UsageError, match=r"\{0: 'B1', 1: 'F2'\}"):  # rank 1 waits on a forward nobody runs
        time_schedule([[Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 1, 1), Action("F", 0, 1)]])


def test_one_chunk_needs_no_rounds():
    """ZB-H1 has a single chunk, so there are no rounds to walk and any m works: 5 micro-batches on 2 ranks
    (torch 2.13 asks for a multiple of its round size even here). Each rank runs F, I and W for each."""
    plan = generate("zb-h1", 2, 5)
    assert [sorted(a.torch_name() for a in acts) for acts in plan] == [
        sorted(f"{r}{k}{mb}" for k in "FIW" for mb in range(5)) for r in range(2)]
    assert time_schedule(plan).makespan > 0


def test_an_action_names_itself_from_one():
    """Slot tables count micro-batches from 1; a second chunk is lower case, a third or later numbered."""
    from parasim.pipeline.action import Action
    assert [str(Action("F", 0, 2, c)) for c in range(3)] == ["F1", "f1", "F1:3"]
    assert str(Action("W", 4, 9, 3)) == "W5:4"


@pytest.mark.parametrize("args, message", [(("1f1b", 0, 4), "pp must be a positive integer, got 0"),
                                           (("interleaved", 2, 4, 2.5), "chunks must be a positive integer, got 2.5"),
                                           (("1f1b", 2, 2.5), "microbatches must be a positive integer, got 2.5")])
def test_sizes_are_positive_whole_numbers(args, message):
    with pytest.raises(UsageError, match=message.replace(".", "\\.")):
        generate(*args)


def test_a_rank_that_finishes_early_does_not_stop_the_others():
    # rank 0 is done after its one forward; rank 1 still has the backward of the last stage to run
    sched = [[Action("F", 0, 0)], [Action("F", 0, 1), Action("B", 0, 1)]]
    t = time_schedule(sched)
    assert t.begin == [[0], [1, 2]] and t.makespan == 3 and t.slots == [["F1", None, None], [None, "F1", "B1"]]


def test_a_deadlock_names_only_the_ranks_still_waiting():
    # rank 1's forward of micro-batch 2 waits for a stage-0 forward that nobody runs; rank 0 has finished
    sched = [[Action("F", 0, 0)], [Action("F", 0, 1), Action("F", 1, 1)]]
    with pytest.raises(UsageError, match=r"^the schedule deadlocks: every rank waits \(\{1: 'F2'\}\)$"):
        time_schedule(sched)

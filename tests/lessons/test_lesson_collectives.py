"""The collectives lesson reproduces the post's 2-GPU figures and the ring's byte counts, by running."""
import json

import pytest
from conftest import cli

from parasim.lesson import get_lesson, load_lessons, run_lesson
from parasim.render.walkthrough import walkthrough


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("collectives"))


def test_every_check_is_ok(lr):
    assert lr.checks and all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_the_posts_two_gpu_figures(lr):
    v = lr.result.values
    assert [v[r]["all_reduce"].tolist() for r in (0, 1)] == [[11, 22, 33, 44]] * 2
    assert [v[r]["reduce_scatter"].tolist() for r in (0, 1)] == [[11, 22], [33, 44]]
    assert [v[r]["all_gather"].tolist() for r in (0, 1)] == [[11, 22, 33, 44]] * 2
    first = lr.result.trace.events[0]
    assert [m.before for m in first.members] == [([1, 2, 3, 4],), ([10, 20, 30, 40],)]


def test_ring_hop_by_hop(lr):
    ring = next(e for e in lr.result.trace.events if e.phase == "ring all-reduce")
    assert ring.algo == "ring" and len(ring.hops) == 6
    assert [m.after for m in ring.members] == [([1111, 2222, 3333, 4444],)] * 4
    # after the reduce-scatter hops, rank i holds the finished chunk i (its digits: every rank took part)
    last_rs = ring.hops[2]["transfers"]
    assert sorted(t["value"][0] for t in last_rs) == [444, 1110, 2202, 3033]


def test_bytes_per_rank_fraction_of_buffer(lr):
    nbytes = 1024 * 4
    for t in (2, 4, 8):
        for op, factor in (("reduce_scatter", 1), ("all_gather", 1), ("all_reduce", 2)):
            (e,) = [e for e in lr.result.trace.events
                    if e.phase == "bytes per rank" and e.op == op and len(e.members) == t]
            assert {m.sent for m in e.members} == {factor * (t - 1) * nbytes // t}
            assert {m.recv for m in e.members} == {factor * (t - 1) * nbytes // t}


def test_walkthrough_shows_values_bytes_and_sites(lr):
    text = walkthrough(lr)
    assert "[1, 2, 3, 4] -> [11, 22, 33, 44]" in text
    assert "lessons/collectives.py:" in text and "sent" in text
    assert "hop 1 of reduce-scatter" in text
    assert "18 of 18 checks ok." in text


@pytest.mark.parametrize("world", [1, 2, 3, 4, 16])
def test_other_world_sizes(world):
    other = run_lesson(get_lesson("collectives"), world)
    assert other.ok and other.result.world == world


def test_lesson_registry():
    lessons = load_lessons()
    assert "collectives" in lessons and lessons["collectives"].world == 8


_cli = cli


def test_json_is_complete_and_identical_across_runs():
    a, b = _cli("lesson", "collectives", "--json"), _cli("lesson", "collectives", "--json")
    assert a.returncode == 0 and a.stdout == b.stdout
    data = json.loads(a.stdout)
    assert set(data) >= {"lesson", "world", "events", "values", "checks"}
    assert all(c["ok"] and {"got", "expected"} <= set(c) for c in data["checks"])
    for e in data["events"]:
        assert {"op", "group", "ranks", "step", "seq"} <= set(e)
        for m in e["members"]:
            assert {"in", "out", "sent", "recv", "site"} <= set(m)
            assert m["site"].startswith("lessons/collectives.py:")


def test_plain_walkthrough_from_the_cli():
    out = _cli("lesson", "collectives", "--plain")
    assert out.returncode == 0 and "[11, 22, 33, 44]" in out.stdout


def test_cli_lists_lessons():
    out = _cli("lesson")
    assert out.returncode == 0 and "collectives" in out.stdout


@pytest.mark.parametrize("args", [(), ("lesson",)])
def test_help(args):
    out = _cli(*args, "--help")
    assert out.returncode == 0 and "usage:" in out.stdout


@pytest.mark.parametrize("args, needle", [
    (("lesson", "no-such-lesson"), "unknown lesson"),
    (("lesson", "collectives", "--frobnicate"), "unrecognized arguments"),
    (("lesson", "collectives", "--json", "--plain"), "not allowed with"),
    (("lesson", "collectives", "--trace", "/no/such/dir/t.json"), "cannot write"),
    (("nosuchcommand",), "invalid choice"),
    (("lesson", "collectives", "--world", "zero"), "positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = _cli(*args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr
    assert "Traceback" not in out.stderr

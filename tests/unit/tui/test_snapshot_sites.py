"""Snapshots keep no source line: the app's call sites are named by function in them (tests/helpers/helpers_sites.py),
so a line that moves in the package or a lesson changes no SVG."""
from __future__ import annotations

import re
from pathlib import Path

from helpers_sites import by_function, enclosing, function_site, lines_left

import parasim

SNAPSHOTS = Path(__file__).resolve().parent / "__snapshots__"


def _screen_text(svg: str) -> str:
    """What an SVG snapshot shows: its text without the markup (a site could be split over two spans; the
    spaces written as &#160; then stand between words, as spaces do)."""
    return re.sub(r"<[^>]*>", "", svg)


def test_no_snapshot_shows_a_file_and_line():
    svgs = sorted(SNAPSHOTS.rglob("*.svg"))
    assert svgs, "no snapshots found: this test would check nothing"
    found = {p.name: lines_left(_screen_text(p.read_text())) for p in svgs}
    assert {name: sites for name, sites in found.items() if sites} == {}


def test_the_screen_text_of_a_split_site_is_whole():
    svg = '<text x="0">at&#160;parasim/nn/co</text><text x="9">re.py:117</text>'
    assert lines_left(_screen_text(svg)) == ["parasim/nn/core.py:117"]


SOURCE = '''\
import functools
X = 1


class Box:
    size = 2

    def method(self):
        return 3

    @functools.cache
    def cached(self):
        def inner():
            return 4
        return inner


if X:
    def guarded():
        return 5
'''


def test_a_line_is_named_by_its_innermost_def_or_class(tmp_path):
    src = tmp_path / "prog.py"
    src.write_text(SOURCE)
    spans: dict = {}
    names = [function_site(f"{src}:{n}", spans).split(" ", 1)[1] for n in range(1, 22)]
    assert names == ["(module)", "(module)", "(module)", "(module)",
                     "(Box)", "(Box)", "(Box)", "(Box.method)", "(Box.method)", "(Box)",
                     "(Box.cached)", "(Box.cached)", "(Box.cached.inner)", "(Box.cached.inner)", "(Box.cached)",
                     "(module)", "(module)", "(module)", "(guarded)", "(guarded)", "(module)"]
    assert function_site(f"{src}:9", spans) == f"{src} (Box.method)"
    assert list(spans) == [str(src)]  # parsed once for every line asked


def test_a_site_without_a_line_is_kept_and_spans_outside_every_def_are_the_module():
    assert function_site("<unknown>", {}) == "<unknown>"
    assert enclosing([], 7) == "module"
    assert enclosing([(1, 9, "outer"), (3, 4, "outer.inner")], 4) == "outer.inner"
    assert enclosing([(1, 9, "outer"), (3, 4, "outer.inner")], 5) == "outer"


def test_every_member_of_a_run_is_named_by_its_function():
    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0]))
        return ctx.comm.all_gather(ctx.asarray([1.0]), dim=0)

    res = parasim.run(prog, world=2)
    named = by_function(res.trace)
    want = "tests/unit/tui/test_snapshot_sites.py (test_every_member_of_a_run_is_named_by_its_function.prog)"
    assert [m.site for e in named.events for m in e.members] == [want] * 4
    assert lines_left(named.to_json()) == [] and lines_left(res.trace.to_json())  # the run's own trace kept
    assert [(e.op, e.ranks) for e in named.events] == [(e.op, e.ranks) for e in res.trace.events]

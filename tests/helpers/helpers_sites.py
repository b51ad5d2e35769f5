"""Call sites named by their function instead of their line, for tests that keep what a screen shows.

The app shows a learner `at parasim/nn/core.py:117`; a snapshot that kept that line would change whenever
a line above it moved. Snapshot tests rewrite each site of a trace as `parasim/nn/core.py (Linear.forward)`
first: the innermost function or class around that line, found in the source with `ast`.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import parasim
from parasim.comm.trace import Trace

ROOT = Path(parasim.__file__).resolve().parent.parent  # sites are named from here (parasim/comm/sites.py)
SITE = re.compile(r"(?P<path>[\w./-]+\.py):(?P<line>[0-9]+)")  # a site with a line, anywhere in a text

Spans = list[tuple[int, int, str]]  # (first line, last line, qualified name) of every def and class


def _spans(tree: ast.AST) -> Spans:
    out: Spans = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.append((first, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)  # a def inside an if or a with still belongs to the same scope
    visit(tree, "")
    return out


def enclosing(spans: Spans, line: int) -> str:
    """The innermost def or class holding `line`, as `Class.method` or `outer.inner`; `module` outside all."""
    around = [(last - first, name) for first, last, name in spans if first <= line <= last]
    return min(around)[1] if around else "module"


def function_site(site: str, spans_of: dict[str, Spans]) -> str:
    """'path:line' as 'path (function)'. `spans_of` keeps each file parsed once for one trace."""
    m = SITE.fullmatch(site)
    if m is None:
        return site  # no line in it (a site the engine could not place): nothing moves
    path = m["path"]
    if path not in spans_of:
        file = Path(path) if Path(path).is_absolute() else ROOT / path
        spans_of[path] = _spans(ast.parse(file.read_text(), str(file)))  # a site in no file here fails loudly
    return f"{path} ({enclosing(spans_of[path], int(m['line']))})"


def by_function(trace: Trace) -> Trace:
    """A copy of `trace` whose every call site names its function instead of its line (members' sites are
    the only place a trace keeps one: `lines_left` says if that stops being true)."""
    spans_of: dict[str, Spans] = {}
    events = [dataclasses.replace(e, members=[m._replace(site=function_site(m.site, spans_of)) for m in e.members])
              for e in trace.events]
    return dataclasses.replace(trace, events=events)


def lines_left(text: str) -> list[str]:
    """Every 'file.py:line' site still in `text`."""
    return [m[0] for m in SITE.finditer(text)]

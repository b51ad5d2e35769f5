"""No hidden state in the package: no module-level memo (functools caches, module dicts, lists and sets that
functions fill), so nothing a run or a test did is left for the next; helpers that make a call for their
caller declare it (`__site_hide__`), and the mutation tool's frames are known to the test configuration only.
What the old memos computed is still what is asked (the ring's sequence splits, short file names)."""
from __future__ import annotations

import ast
import os
from itertools import chain
from pathlib import Path

import numpy as np
import pytest
from conftest import site_at

import parasim
from parasim.comm import sites
from parasim.nn.core import ParallelContext
from parasim.nn.ring_attention import SequenceSplit, positions

PKG = Path(parasim.__file__).parent
HERE = str(Path(__file__).resolve())
MUTATORS = {"append", "add", "update", "setdefault", "clear", "extend", "insert", "pop", "popitem", "remove",
            "discard"}


def modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PKG.parent)), ast.parse(p.read_text(), str(p))) for p in sorted(PKG.rglob("*.py"))]


def functools_caches(tree: ast.Module) -> list[int]:
    """Lines that import or use functools' lru_cache or cache."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "functools":
            found += [node.lineno for a in node.names if a.name in ("lru_cache", "cache")]
        elif isinstance(node, ast.Attribute) and node.attr in ("lru_cache", "cache") \
                and isinstance(node.value, ast.Name) and node.value.id == "functools":
            found.append(node.lineno)
    return found


def empty_container(value: ast.expr) -> bool:
    return isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", getattr(value, "elts", None)) \
        or isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list", "set") \
        and not value.args and not value.keywords


def module_state(tree: ast.Module) -> list[str]:
    """'name:line' of module-level names bound to an empty dict, list or set that a function of the module
    fills or empties (a subscript assigned or deleted, a mutating method called), and of `global` rebinding."""
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
             and empty_container(node.value)
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | \
            {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found += [f"{n}:{node.lineno}" for n in node.names]
            target = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                target = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                target = node.func.value
            if isinstance(target, ast.Name) and target.id in names and target.id not in local:
                found.append(f"{target.id}:{node.lineno}")
    return found


def test_no_module_uses_a_functools_cache():
    found = {path: lines for path, tree in modules() if (lines := functools_caches(tree))}
    assert not found


def test_no_module_level_container_is_filled_at_run_time():
    found = {path: hits for path, tree in modules() if (hits := module_state(tree))}
    assert not found


def test_the_scans_find_what_they_look_for():
    """The two scans flag a cache, a filled module dict and a rebound global, and pass a module constant."""
    src = ("import functools\nfrom functools import lru_cache\nSEEN = {}\nDONE = set()\nNAMES = {'a': 1}\n"
           "@functools.cache\ndef f(x):\n    SEEN[x] = 1\n    DONE.add(x)\n    return NAMES['a']\n"
           "def g():\n    global N\n    N = 1\ndef h(SEEN):\n    SEEN[0] = 1\n")
    tree = ast.parse(src)
    assert functools_caches(tree) == [2, 6]
    assert module_state(tree) == ["SEEN:8", "DONE:9", "N:12"]


# -- call sites: a helper that calls for its caller declares it ----------------------------------------------

def _sum_for_caller(ctx, x):
    __site_hide__ = True  # noqa: F841 (the call site is the line that called this helper)
    return ctx.comm.all_reduce(x, label="helped")


def _sum_and_be_named(ctx, x):
    __site_hide__ = False  # noqa: F841 (declared, but off: this helper's own line is the site)
    return ctx.comm.all_reduce(x, label="named")  # own line


def helped(ctx):
    x = ctx.xp.ones(2)
    _sum_for_caller(ctx, x)  # the caller
    _sum_and_be_named(ctx, x)


def _sites(trace, label):
    (event,) = [e for e in trace.events if e.label == label]
    return {m.site for m in event.members}


def test_a_hidden_helper_names_its_caller_on_virtual_ranks():
    trace = parasim.run(helped, 2).trace
    assert _sites(trace, "helped") == {site_at(HERE, "the caller")}
    assert _sites(trace, "named") == {site_at(HERE, "own line")}


@pytest.mark.slow
def test_a_hidden_helper_names_its_caller_on_gloo_ranks():
    pytest.importorskip("torch")
    trace = parasim.run(helped, 2, backend="gloo", timeout=60).trace
    assert _sites(trace, "helped") == {site_at(HERE, "the caller")}
    assert _sites(trace, "named") == {site_at(HERE, "own line")}


def test_settle_names_the_layer_line():
    """placement.settle sums a gradient for the layer that called it: the layer's line is the site."""
    from parasim.layout.placement import Partial, settle

    def program(ctx):
        tp = ParallelContext(ctx, ctx.new_group(range(2), "tp"))
        return settle(tp, {"tp": Partial()}, ctx.xp.ones(2), "sum")  # settle's caller
    trace = parasim.run(program, 2).trace
    assert _sites(trace, "sum") == {site_at(HERE, "settle's caller")}


def test_a_raised_error_names_the_hidden_helpers_caller():
    def program(ctx):
        _sum_for_caller(ctx, "not an array")  # the bad call
    with pytest.raises(parasim.CollectiveError) as info:
        parasim.run(program, 2)
    assert site_at(HERE, "the bad call") in str(info.value)


def test_mutation_trampolines_are_passed_over_only_under_mutation(monkeypatch, tmp_path):
    """tests/conftest.py: under mutmut (MUTANT_UNDER_TEST set), a frame of mutmut's trampoline file is a
    wrapper; the package's own test is left as it is otherwise."""
    import conftest
    tramp = tmp_path / "mutmut" / "mutation" / "trampoline.py"
    tramp.parent.mkdir(parents=True)
    space: dict = {}
    exec(compile(  # noqa: S102 (functions whose frames lie in a file named as mutmut's trampoline)
        "import sys\ndef trampoline(f, *a):\n    return f(*a)\ndef frame():\n    return sys._getframe()\n",
        str(tramp), "exec"), space)

    def program(ctx):
        space["trampoline"](ctx.comm.all_reduce, ctx.xp.ones(2))  # through the trampoline
    # the package's own test (this very run may be a mutation run); restored after the test
    plain = getattr(sites.is_wrapper, "plain", sites.is_wrapper)
    monkeypatch.setattr(sites, "is_wrapper", plain)
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    conftest.pytest_configure(None)
    assert sites.is_wrapper is plain and not sites.is_wrapper(space["frame"]())
    monkeypatch.setenv("MUTANT_UNDER_TEST", "")
    conftest.pytest_configure(None)
    conftest.pytest_configure(None)  # a second session in the same process: wrapped once
    assert sites.is_wrapper(space["frame"]()) and sites.is_wrapper.plain is plain
    sites_seen = {m.site for e in parasim.run(program, 2).trace.events for m in e.members}
    assert sites_seen == {site_at(HERE, "through the trampoline")}


# -- what the memos that left computed ------------------------------------------------------------------------

def test_short_path_is_relpath_below_the_checkout_and_cwd(tmp_path, monkeypatch):
    root = PKG.parent
    for f in (PKG / "comm" / "sites.py", root / "tests" / "x.py", str(root) + "/./parasim//a.py"):
        assert sites.short_path(str(f)) == os.path.relpath(os.path.abspath(f), root)
    monkeypatch.chdir(tmp_path)
    assert sites.short_path("prog.py") == "prog.py"  # relative to the cwd, asked each time (never remembered)
    assert sites.short_path(str(tmp_path / "d" / "p.py")) == os.path.join("d", "p.py")
    assert sites.short_path("/elsewhere/p.py") == "/elsewhere/p.py"


def test_a_runs_site_names_are_the_plain_names_each_named_once(tmp_path, monkeypatch):
    names, site = sites.SiteNames(), (str(PKG / "nn" / "layer.py"), 7)
    assert names(site) == "parasim/nn/layer.py:7" == names(site)
    assert names((site[0], 8)) == "parasim/nn/layer.py:8"
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    prog = (str(tmp_path / "a" / "prog.py"), 3)
    assert names(prog) == "prog.py:3"
    monkeypatch.chdir(tmp_path)  # a program that changes directory keeps the names its run gave
    assert names(prog) == "prog.py:3" and sites.site_name(prog) == os.path.join("a", "prog.py:3")
    assert sites.SiteNames()(prog) == os.path.join("a", "prog.py:3")  # a new run names afresh


def _held(split, seq, cp, r):
    """A rank's positions written out from the splits' definition (module docstring of ring_attention)."""
    if split == "contiguous":
        c = seq // cp
        return list(range(r * c, (r + 1) * c))
    c = seq // (2 * cp)
    return list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))


@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("per", [1, 2, 3, 6])
def test_sequence_split_positions_ends_and_chunks(split, cp, per):
    seq = 2 * cp * per if split == "zigzag" else cp * per
    s = SequenceSplit(split, seq, cp)
    held = [_held(split, seq, cp, r) for r in range(cp)]
    fine = seq // (2 * cp) if seq % (2 * cp) == 0 else seq // cp
    assert s.fine == fine
    assert s.ends == [(min(p), max(p)) for p in held]
    assert s.chunks == [np.unique(np.asarray(p) // fine).tolist() for p in held]
    for r, p in enumerate(held):
        assert positions(split, seq, cp, r) == p and list(s.positions(r)) == p and len(s.positions(r)) == len(p)
        view = s.positions(r)
        for lo in range(-2, len(p) + 2):
            for hi in range(-2, len(p) + 2):
                assert view[lo:hi] == p[lo:hi]
        assert view[::2] == p[::2] and view[-1] == p[-1]
        assert s.index(r, np).tolist() == p and s.index(r, np).dtype == np.int64


def test_token_positions_list_only_the_sp_share():
    """Under SP the rank's share is listed from the split's ranges: the same positions as the whole slice's."""
    def program(ctx):  # tp pairs (0, 1), (2, 3); cp pairs (0, 2), (1, 3)
        tps = [ctx.new_group([0, 1], "tp"), ctx.new_group([2, 3], "tp")]
        cps = [ctx.new_group([0, 2], "cp"), ctx.new_group([1, 3], "cp")]
        t = ParallelContext(ctx, tps[ctx.rank // 2], sp=True, cp_group=cps[ctx.rank % 2], seq=16, cp_split="zigzag")
        return t.token_positions(), t.cp_positions()
    got = parasim.run(program, 4).values
    for rank, (share, whole) in enumerate(got):
        assert whole == _held("zigzag", 16, 2, rank // 2) and type(share) is list
        assert share == whole[rank % 2 * 4:(rank % 2 + 1) * 4] and all(type(p) is int for p in share)


def test_cp_positions_follow_a_changed_sequence():
    """The context keeps its CP slice per sequence length and split: set either again, and it is asked anew."""
    def program(ctx):
        t = ParallelContext(ctx, None, cp_group=ctx.new_group(range(2), "cp"), seq=8, cp_split="zigzag")
        first = t.cp_positions()
        t.seq = 12
        longer = t.cp_positions()
        t.cp_split = "contiguous"
        return first, longer, t.cp_positions(), t.token_positions()
    got = parasim.run(program, 2).values
    for r, (first, longer, contiguous, tokens) in enumerate(got):
        assert first == _held("zigzag", 8, 2, r) and longer == _held("zigzag", 12, 2, r)
        assert contiguous == tokens == _held("contiguous", 12, 2, r)


def test_positions_from_ranges_are_python_ints():
    assert [type(p) for p in chain(positions("zigzag", 8, 2, 1))] == [int] * 4

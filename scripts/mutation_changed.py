"""The mutants of functions whose code changed since a revision: what a change must run again.

mutmut keeps a mutant's result until its function changes, but a fresh checkout has no results, and
running every mutant of a module takes hours on 2 cores. A function whose code (docstrings and comments
aside) is the same as at REV has the result recorded in docs/testing.md; the ones that changed, or are
new, are what a change has to run again.

    .venv/bin/python scripts/mutation_changed.py 02268b6                 # counts per module
    .venv/bin/python scripts/mutation_changed.py 02268b6 --names parasim.nn.moe   # names, one per line
    bash scripts/mutation.sh $(.venv/bin/python scripts/mutation_changed.py 02268b6 --names parasim.nn.moe)

Run `bash scripts/mutation.sh PATTERN` once first: it writes mutants/ (the names are read from it).
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"


class _NoHints(ast.NodeTransformer):
    """Drops type hints: mutmut mutates nothing inside an annotation (libcst's Annotation nodes are skipped), so
    a function whose hints alone changed (`ctx: Any` -> `ctx: Context`) has the same mutants, numbered alike."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:  # `x: int`, a declaration only
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=self.visit(node.value), lineno=0)


class _Renamed(ast.NodeTransformer):
    """Applies renames made across the whole package (`tp` -> `par`) to the old code: mutmut mutates no name, so
    a function changed only by such a rename has the same mutants, and the tests that held them still run."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.renames.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.renames.get(node.arg, node.arg)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        node.attr = self.renames.get(node.attr, node.attr)
        self.generic_visit(node)
        return node


def _body(node: ast.AST, renames: dict[str, str] | None = None, hints: bool = True) -> str:
    """A function's code without its docstring (a changed comment or docstring changes no mutant); without its
    type hints too unless `hints` (the saved results' hashes keep them); `renames` (old name -> new) first."""
    node = ast.parse(ast.unparse(node)).body[0]  # a copy
    if renames:
        node = _Renamed(renames).visit(node)
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    if not hints:
        node = _NoHints().visit(node)
    return ast.dump(node, include_attributes=False)


def functions(source: str, renames: dict[str, str] | None = None, hints: bool = True) -> dict[str, str]:
    """mutmut's name of each function and method (`x_f`, `xǁClassǁmethod`) -> its code (type hints dropped
    unless `hints`)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"x_{node.name}"] = _body(node, renames, hints)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"xǁ{node.name}ǁ{item.name}"] = _body(item, renames, hints)
    return out


def _old_source(rev: str, path: str) -> str:
    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else ""  # a file new since rev: every function is new


def moved_since(rev: str) -> dict[str, str]:
    """A file moved since rev (git's rename detection) -> its path at rev: a moved function with the same code
    is not a changed one."""
    done = subprocess.run(["git", "diff", "--name-status", "-M", rev, "--", "parasim"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    out = {}
    for line in done.stdout.splitlines():
        parts = line.split("\t")
        if parts[0].startswith("R") and len(parts) == 3:
            out[parts[2]] = parts[1]
    return out


def changed_functions(rev: str, rel: str, renames: dict[str, str] | None = None,
                      moved: dict[str, str] | None = None) -> set[str]:
    """The functions of file `rel` (parasim/nn/moe.py) whose code changed since rev, or are new: type hints
    aside, and each of `renames` (old -> new, names changed everywhere since rev) tried, not forced (the same
    word may also name something the change kept: `layout.tp`)."""
    moved = moved_since(rev) if moved is None else moved
    source = _old_source(rev, moved.get(rel, rel))
    new, old = functions((ROOT / rel).read_text(), hints=False), functions(source, hints=False)
    renamed = functions(source, renames, hints=False) if renames else old
    return {name for name, code in new.items() if code not in (old.get(name), renamed.get(name))}


def changed_mutants(rev: str, renames: dict[str, str] | None = None) -> dict[str, list[str]]:
    """module -> the names of its mutants in functions changed (or new) since rev; `renames` (old -> new) are
    names changed everywhere since rev."""
    out: dict[str, list[str]] = {}
    moved = moved_since(rev)
    for meta in sorted((MUTANTS / "parasim").rglob("*.py.meta")):
        rel = meta.relative_to(MUTANTS).as_posix()[: -len(".meta")]  # parasim/nn/moe.py
        module = rel[: -len(".py")].replace("/", ".")
        changed = changed_functions(rev, rel, renames, moved)
        keys = json.loads(meta.read_text())["exit_code_by_key"]
        names = [k for k in keys if k[len(module) + 1:].split("__mutmut_")[0] in changed]
        if names:
            out[module] = names
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the revision before the change (a commit, tag or branch)")
    ap.add_argument("--names", nargs="*", metavar="MODULE",
                    help="print the mutant names (of these modules, or of all) instead of counts")
    ap.add_argument("--renamed", action="append", default=[], metavar="OLD=NEW",
                    help="a name changed everywhere since rev (a variable, argument or attribute; repeat the option)")
    args = ap.parse_args()
    if any(pair.count("=") != 1 for pair in args.renamed):
        print("mutation_changed: --renamed takes OLD=NEW", file=sys.stderr)
        return 2
    renames = dict(pair.split("=") for pair in args.renamed)
    if not (MUTANTS / "parasim").is_dir():
        print("mutation_changed: no mutants/ yet: run `bash scripts/mutation.sh PATTERN` once first",
              file=sys.stderr)
        return 2
    found = changed_mutants(args.rev, renames)
    if args.names is not None:
        for module, names in found.items():
            if not args.names or module in args.names:
                print("\n".join(names))
        return 0
    total = 0
    for module, names in found.items():
        print(f"{len(names):6d}  {module}")
        total += len(names)
    print(f"{total:6d}  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())

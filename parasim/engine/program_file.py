"""A user's program file (`path/to/file.py:function`), loaded with every fault named in one line.

The file is the user's, so anything can be wrong with it: it may not compile, not decode, import what is
not installed, loop at its top level, or define WORLD, TITLE, NARRATIVE, KEEP_VALUES or checks() as
something they cannot be. Each is a UsageError that names the file, the line and what is wrong (the CLI
exits 2); a program's own exceptions while it runs keep their traceback (engine/virtual.py), since there
the user wants to see their stack.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import MethodWrapperType, ModuleType
from typing import Any, Callable

from ..comm.sites import short_path
from ..comm.watchdog import Stopped, TimeLimit, frame_text
from ..errors import UsageError
from ..limits import VIRTUAL_WORLD, brief, read_bounded

KEEP_MAX = 10**7  # KEEP_VALUES: elements of one array shown by value (a lesson shows a few dozen)


@dataclass
class ProgramFile:
    """What a user's file defines, each checked: the program and the optional names beside it."""

    path: Path
    program: Callable[[Any], Any]
    world: int | None
    title: str | None
    narrative: dict[str, str]
    keep_values: int | None
    checks: Callable[[Any], Any] | None  # as the file defines it: lesson.py checks what it returns
    checks_at: str  # 'file.py:12', where checks is defined
    reference: Callable[[Any], Any] | None


def load_program(path_text: str, fn: str, timeout: float | None) -> ProgramFile:
    """Load `path_text` and check what it defines; `fn` names the program. Loading may take `timeout`
    seconds at most (its top level runs as it loads)."""
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such program file: {path_text}")
    source = read_bounded(path_text, "program file")
    lines = _top_level_lines(source, path_text)
    module = _execute(path, timeout)
    where = lambda name: f"{short_path(str(path))}:{lines[name]}" if name in lines else short_path(str(path))
    program = getattr(module, fn, None)
    if program is None:
        found = sorted(
            k
            for k, v in vars(module).items()
            if inspect.isfunction(v) and not k.startswith("_") and v.__module__ == module.__name__
        )
        raise UsageError(f"{path_text} has no function {fn!r}" + (f"; it defines {', '.join(found)}" if found else ""))
    _check_program(program, f"{fn!r} in {where(fn)}")
    world = _optional(
        module, "WORLD", where, _positive_int(VIRTUAL_WORLD), f"a whole number of ranks from 1 to {VIRTUAL_WORLD:,}"
    )
    title = _optional(module, "TITLE", where, lambda v: isinstance(v, str), "a string")
    narrative = _optional(module, "NARRATIVE", where, _text_by_text, "a dict of phase name -> text (strings)")
    keep = _optional(
        module,
        "KEEP_VALUES",
        where,
        _positive_int(KEEP_MAX, lo=0),
        f"a whole number of elements from 0 to {KEEP_MAX:,}",
    )
    checks = _optional(module, "checks", where, callable, "a function checks(result) returning a list of checks")
    reference = _optional(module, "reference", where, callable, "a function reference(ctx), the one-rank program")
    if reference is not None:
        _check_program(reference, f"'reference' in {where('reference')}")
    return ProgramFile(path, program, world, title, narrative or {}, keep, checks, where("checks"), reference)


def _top_level_lines(source: bytes, path: str) -> dict[str, int]:
    """Where each top-level name is defined (assigned or def'd), to point at it; compiling it here also
    names a syntax or encoding error before anything runs."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        line = f":{exc.lineno}" if exc.lineno else ""
        raise UsageError(f"{short_path(path)}{line}: it does not compile: {exc.msg}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # null bytes, a bad encoding declaration
        raise UsageError(f"{short_path(path)}: it cannot be read as Python source: {exc}") from None
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines[node.name] = node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    lines[target.id] = node.lineno
    return lines


def _execute(path: Path, timeout: float | None) -> ModuleType:
    """Run the file's top level as a module of its own. Its prints go to stderr, so that stdout stays
    what the command writes (--json)."""
    name = f"parasim_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    shown = short_path(str(path))
    try:
        with contextlib.redirect_stdout(sys.stderr), TimeLimit(timeout, lambda: 0):
            spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Stopped as exc:
        raise UsageError(
            f"{shown}: loading it ran for {timeout:g} s (the time limit, --timeout) and was stopped at "
            f"{frame_text(exc.at())}: its top level runs when it is loaded, so keep long work inside "
            "the program"
        ) from None
    except SyntaxError as exc:  # a file it imports does not compile
        raise UsageError(
            f"{short_path(exc.filename or str(path))}:{exc.lineno}: it does not compile: {exc.msg} "
            f"(imported by {shown})"
        ) from None
    except (Exception, SystemExit) as exc:
        raise UsageError(
            f"{shown}: loading it raised {type(exc).__name__}: {one_line(exc)} at {raised_at(exc, path)}"
        ) from None
    return module


def raised_at(exc: BaseException, path: Path) -> str:
    """The line of the user's file closest to where `exc` was raised (else the innermost line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == path.resolve()] or frames
    if not mine:
        return short_path(str(path))
    f = mine[-1]
    return f"{short_path(f.filename)}:{f.lineno}"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "(no message)"


def _check_program(obj: Any, what: str) -> None:
    """A program is a plain function (or a callable object) run once per rank to its end."""
    if inspect.isgeneratorfunction(obj) or inspect.isasyncgenfunction(obj):
        raise UsageError(
            f"{what} is a generator function (it uses yield): a program runs to its end and returns its value"
        )
    if inspect.iscoroutinefunction(obj):
        raise UsageError(f"{what} is an async function: a program is a plain function (def, not async def)")
    if inspect.isfunction(obj) or isinstance(obj, functools.partial):
        return
    if (
        callable(obj)
        and not inspect.isclass(obj)
        and not inspect.isbuiltin(obj)
        and not isinstance(obj, MethodWrapperType)
        and type(obj).__module__ != "builtins"
    ):
        return  # an instance whose class defines __call__
    name = type(obj).__name__
    kind = "a class" if inspect.isclass(obj) else f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
    raise UsageError(f"{what} is {kind}, not a function: name a function def NAME(ctx) of the file")


def _optional(module: ModuleType, name: str, where: Callable[[str], str], ok: Callable[[Any], bool], what: str) -> Any:
    if not hasattr(module, name):
        return None
    value = getattr(module, name)
    if not ok(value):
        raise UsageError(f"{where(name)}: {name} must be {what}, got {brief(value)}")
    return value


def _positive_int(hi: int, lo: int = 1) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi  # bool is an int to Python, not a number of ranks


def _text_by_text(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(t, str) for k, t in v.items())

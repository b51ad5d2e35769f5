"""The design, kept true: the rooms docs/architecture.md names exist, the package top stays small, the
import graph has no cycle, and each concept is defined once."""
import ast
import re
from pathlib import Path

import parasim

ROOT = Path(parasim.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("parasim",) + path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every parasim module `name` imports, at the top or inside a function (a lazy import is an edge too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in modules and m != name}


def test_every_room_the_page_names_exists():
    rooms = set(re.findall(r"`parasim/([a-z_]+)/`", DOC.read_text()))
    assert {"layout", "comm", "engine", "nn", "dp", "pipeline", "estimate", "render", "cli", "tui",
            "examples"} <= rooms
    for room in rooms:
        assert (ROOT / room / "__init__.py").is_file(), room


def test_the_package_top_holds_at_most_eight_modules():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 8, top


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, " -> ".join(path[path.index(n):] + [n] if n in path else path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    """The check above can fail: two modules that import each other are found."""
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    mods = {"parasim.a": tmp_path / "a.py", "parasim.b": tmp_path / "b.py"}
    assert _imports("parasim.a", mods["parasim.a"], mods) == {"parasim.b"}
    assert _imports("parasim.b", mods["parasim.b"], mods) == {"parasim.a"}


def _package(module: str) -> str:
    """The room a module is in: its first name under parasim (a top-level module is a room of its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "parasim"


def package_cycle(modules: dict[str, Path]) -> list[str] | None:
    """A cycle among the package's rooms (a room imports another that imports it back, maybe through others;
    lazy imports inside functions count), or None."""
    graph: dict[str, set[str]] = {}
    for m, p in modules.items():
        graph.setdefault(_package(m), set()).update(
            _package(n) for n in _imports(m, p, modules) if _package(n) != _package(m))
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> list[str] | None:
        state[room] = 1
        for n in sorted(graph.get(room, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n, path + [n])):
                return found
        state[room] = 2
        return None
    for room in sorted(graph):
        if room not in state and (found := visit(room, [room])):
            return found
    return None


def test_no_two_rooms_import_each_other():
    """Issue 52: the rooms form layers (layout < comm < engine < nn < ... < cli), with lazy imports counted."""
    cycle = package_cycle(_modules())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_room_cycle_finder_finds_one(tmp_path):
    """The check above can fail: comm's trace importing the engine, whose runner imports comm, is found."""
    (tmp_path / "trace.py").write_text("def f():\n    from ..engine.work import Meter\n")
    (tmp_path / "work.py").write_text("from ..comm.ops import OPS\n")
    (tmp_path / "ops.py").write_text("OPS = {}\n")
    mods = {"parasim.comm.trace": tmp_path / "trace.py", "parasim.engine.work": tmp_path / "work.py",
            "parasim.comm.ops": tmp_path / "ops.py"}
    assert package_cycle(mods) == ["comm", "engine", "comm"]
    del mods["parasim.engine.work"]
    assert package_cycle(mods) is None


def test_one_layout_one_model_one_preset_table():
    """grep finds one Layout type, one model type and one preset table; the estimator, the layers and the
    engine use those very objects."""
    classes, tables = {}, []
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(path.relative_to(ROOT).as_posix())
            targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
            tables += [path.name for t in targets if isinstance(t, ast.Name) and t.id == "PRESETS"]
    assert classes["Layout"] == ["layout/mesh.py"] and classes["ModelSpec"] == ["layout/model.py"]
    assert not {"Model", "LayerShape"} & set(classes)
    assert tables == ["presets.py"]
    from parasim.estimate import memory, models
    from parasim.layout import Layout, ModelSpec
    from parasim.nn import layer
    assert memory.ModelSpec is models.ModelSpec is layer.ModelSpec is ModelSpec is parasim.ModelSpec
    assert issubclass(memory.Plan, Layout) and parasim.Layout is Layout


def test_every_file_the_rooms_name_exists():
    """The file names the Rooms section gives (`mesh.py`, `runner.py`, ...) are files of parasim."""
    text = DOC.read_text()
    rooms = text[text.index("## Rooms"):text.index("## Recipes")]
    named = set(re.findall(r"`([a-z_0-9]+\.py)`", rooms))
    files = {p.name for p in ROOT.rglob("*.py")}
    assert len(named) > 20 and named <= files, sorted(named - files)


def _rooms_text() -> str:
    text = DOC.read_text()
    return text[text.index("## Rooms"):text.index("## Recipes")]


def named_by_room(rooms: str) -> dict[str, set[str]]:
    """Room -> the file names its paragraph gives: a bullet starting `parasim/<room>/` (or `parasim/<room>/<sub>/`)
    names its room's files;
    the paragraph before the bullets names the package top's modules (room "")."""
    out: dict[str, set[str]] = {}
    for block in re.split(r"\n(?=- `parasim/)", rooms):
        m = re.match(r"- `parasim/([a-z_/]+)/`", block)
        out.setdefault(m.group(1) if m else "", set()).update(re.findall(r"`([a-z_0-9]+\.py)`", block))
    return out


def unnamed_files(named: dict[str, set[str]], root: Path) -> list[str]:
    """Files of the package that the page does not name in their own room's paragraph."""
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        room = "/".join(rel.parts[:-1])  # a subpackage (engine/symbolic) is a room of its own
        if path.name == "__init__.py" and room:
            continue  # a room's __init__ is the room itself
        if path.name not in named.get(room, set()):
            missing.append(rel.as_posix())
    return missing


def test_the_page_names_every_file_of_the_package_in_its_room():
    assert unnamed_files(named_by_room(_rooms_text()), ROOT) == []


def test_a_file_the_page_does_not_name_is_found(tmp_path):
    """The check above can fail: a new file in a room, or one named only in another room's paragraph."""
    (tmp_path / "comm").mkdir()
    for name in ("comm/ring.py", "comm/new.py", "comm/__init__.py", "trace.py", "extra.py"):
        (tmp_path / name).write_text("")
    rooms = ("## Rooms\nTop: `trace.py`.\n\n- `parasim/comm/`: `ring.py`.\n- `parasim/nn/`: `new.py`, `extra.py`.\n")
    assert unnamed_files(named_by_room(rooms), tmp_path) == ["comm/new.py", "extra.py"]


def test_a_virtual_lesson_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys; from parasim.lesson import get_lesson, run_lesson; "
            "[run_lesson(get_lesson(n)) for n in ('moe16', 'tp-mlp', 'memory')]; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def cross_command_privates(modules: dict[str, Path]) -> list[str]:
    """`module -> name` for each private name (a leading underscore) one command module of parasim/cli imports
    from another (cli/common.py holds what commands share)."""
    found = []
    for name, path in modules.items():
        if not name.startswith("parasim.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module not in (None, "common"):
                found += [f"{name} -> {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_command_imports_another_commands_private_function():
    """Issue 52: what two commands share is public (cli/common.py, or a command's documented function)."""
    assert cross_command_privates(_modules()) == []


def test_the_private_import_finder_finds_one(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from .trace import _layout, add_trace\n    from .common import _x\n")
    assert cross_command_privates({"parasim.cli.a": tmp_path / "a.py"}) == ["parasim.cli.a -> trace._layout"]


def written_arguments(modules: dict[str, Path]) -> list[str]:
    """Each place a command module writes into its parsed arguments (`args.x = ...`, `setattr(args, ...)`): the
    flags are read, never used as a cache or rewritten for another command."""
    found = []
    for name, path in sorted(modules.items()):
        if not name.startswith("parasim.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for part in ast.walk(t):
                    if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "args":
                        found.append((name, node.lineno))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
                found.append((name, node.lineno))
    return [f"{name}:{line}" for name, line in sorted(found)]


def test_no_command_writes_into_its_arguments():
    """Issue 52: a command parses its flags and reads them; what it works out travels as values (a JobQuery, the
    Megatron job read once), not as attributes stuck on argparse's namespace."""
    assert written_arguments(_modules()) == []


def test_the_argument_writer_finder_finds_each_kind(tmp_path):
    (tmp_path / "a.py").write_text("def f(args):\n    args.seq = 4\n    args.x, y = 1, 2\n    setattr(args, 'z', 3)\n"
                                   "    ns.seq = 5\n    args.n += 1\n")
    assert written_arguments({"parasim.cli.a": tmp_path / "a.py"}) == [
        "parasim.cli.a:2", "parasim.cli.a:3", "parasim.cli.a:4", "parasim.cli.a:6"]
    assert written_arguments({"parasim.render.a": tmp_path / "a.py"}) == []


# Public names defined at the top of two or more modules, each kept on purpose (issue 52: no name for two
# different things without a reason). A new one fails the test below: rename it, or add it here with why.
SHARED_NAMES = {
    # each published run set (clock/runs*.py) states its sources and its models as its own documents state them
    # (another vocabulary, another name): the sets are frozen by source, so none imports another's rows
    "SOURCES", "GATHERED", "GPT3_175B", "LLAMA2_7B", "LLAMA31_405B", "LLAMA31_8B", "LLAMA3_405B", "LLAMA3_70B",
    "LLAMA3_8B", "MIXTRAL_8X7B", "DEEPSEEK_V3",
    # one module's own setting, private in spirit, read by its tests: a data folder, a width, a gap, styles,
    # a learning rate, a model shape, a unit table, the rules a table follows
    "DATA", "GAP", "KEEP", "LAYOUT", "LR", "MOE16", "RULES", "SHAPE", "SHARDING", "SHORT", "SHOWN", "STYLES",
    "UNITS", "WIDTH",
    # the word of each room for its own thing: the clock's Timeline (times) and the app's (a panel), a routing
    # Rule and a critic's, a table's Source and a run's; verbs each room reads in its own sense
    "Key", "Rule", "Source", "Timeline", "Watch", "assemble", "build_parser", "check", "compare", "describe",
    "family", "fingerprint", "kind_of", "measure", "parse", "plan_of", "rounds", "rows", "score", "sequences",
    "summary", "validate", "where",
    # each stack's job reader (job/<stack>.py) has the one shape job/formats.py's registry reads: its table of
    # fields, its file in words, a test on the parsed file, the reader and the writer (cli/common's write prints)
    "FIELDS", "TITLE", "looks_like", "read", "write",
    # the public API's calls (api.py) are the commands' words for what one room's function does for them
    "fit", "read_job",
}


def shared_names(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Each public name (function, class or constant at a module's top) that two or more modules define."""
    defined: dict[str, list[str]] = {}
    for name, path in sorted(modules.items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for n in names:  # mutmut's copies of each function (x_f__mutmut_1, mutants_x_f__mutmut) are not ours
                if not n.startswith("_") and "__mutmut" not in n:
                    defined.setdefault(n, []).append(name)
    return {n: where for n, where in defined.items() if len(where) > 1}


def test_no_public_name_means_two_things_without_a_reason():
    found = shared_names(_modules())
    new = {n: found[n] for n in sorted(set(found) - SHARED_NAMES)}
    assert not new, f"defined in two or more modules, not in SHARED_NAMES: {new}"
    assert not SHARED_NAMES - set(found), f"no longer shared, take out of SHARED_NAMES: {SHARED_NAMES - set(found)}"


def test_the_shared_name_finder_finds_one(tmp_path):
    """The check above can fail: two modules each defining `seconds` (a parser and a formatter) are found, and a
    class named as another module's chained constant; a private name is not public."""
    (tmp_path / "a.py").write_text("def seconds(text):\n    return float(text)\n_private = 1\n")
    (tmp_path / "b.py").write_text("seconds: int = 3\nX = Y = 1\n")
    (tmp_path / "c.py").write_text("class X:\n    pass\n")
    mods = {"parasim.a": tmp_path / "a.py", "parasim.b": tmp_path / "b.py", "parasim.c": tmp_path / "c.py"}
    assert shared_names(mods) == {"seconds": ["parasim.a", "parasim.b"], "X": ["parasim.b", "parasim.c"]}

"""Issue 52: the mesh axes are one table (layout/axes.py). Its facts against Megatron-Core's group table and by
hand, every command's size flags read from it, and no other table of axes in the package."""
import ast
from pathlib import Path

import parasim
from parasim.layout import AXES, COORD_GROUP, COORDS, GROUP_KINDS, SIZED, Layout
from parasim.layout import placement

from conftest import cli

ROOT = Path(parasim.__file__).parent
NAMES = {"tp", "cp", "dp", "pp", "ep", "etp", "edp"}

# Where a literal may still name four or more axes, and why: not a table of what an axis is, but a type's
# fields (a Layout's, a Plan's, a Megatron job's), a rank generator's rule, or a step's parts.
ALLOWED = {
    "layout/axes.py": "the table itself",
    "layout/mesh.py": "the Layout's fields, its rank generators' sizes per axis and the rank order's words",
    "estimate/memory.py": "the Plan's fields (a Layout's and the training choices)",
    "megatron/job.py": "a Megatron-LM job's flags as the Layout's fields",
    "clock/fastest.py": "a step's time by part (TP's exposed collectives, the bubble, ...)",
    "engine/symbolic/fold.py": "the attention view's coordinates that name a rank's place",
    "train/keeps.py": "the moe16 program's coordinates as its value reports them",
}


def test_each_axis_names_the_group_megatron_core_builds_over_it_alone():
    """layout.GROUP_KINDS is Megatron-Core's group table (initialize_model_parallel's order): the group of an axis's
    generator over that axis alone is the one its entry names, and a rank's coordinate is its index there."""
    for name, axis in AXES.items():
        (group,) = [g for g, gen, over in GROUP_KINDS if gen == axis.generator and over == (axis.named,)]
        assert axis.group == group == COORD_GROUP[name], name
    assert COORDS == tuple(AXES) and SIZED == ("tp", "cp", "dp", "pp", "ep", "etp")  # expert DP is derived
    layout = Layout(tp=2, cp=2, pp=2, ep=2, world=16)
    groups = layout.groups()
    for rank, c in enumerate(layout.coords()):
        for name in COORDS:
            (mine,) = [g for g in groups[AXES[name].group] if rank in g]
            assert c[name] == mine.index(rank)


def test_the_tables_facts_by_hand():
    """What each axis does (the post's and Megatron's words): TP and expert TP cut a weight, EP spreads whole
    experts, CP, DP and expert DP see different data, PP holds different layers; the all-to-all goes between
    every pair, the pipeline along a chain, the rest round a ring; DP's gradients reduce over DP x CP."""
    assert {n: a.role for n, a in AXES.items()} == {"tp": "cut", "etp": "cut", "ep": "experts", "cp": "data",
                                                    "dp": "data", "edp": "data", "pp": "stages"}
    assert {n: a.hops for n, a in AXES.items()} == {"tp": "ring", "cp": "ring", "dp": "ring", "pp": "chain",
                                                    "ep": "pairs", "etp": "ring", "edp": "ring"}
    assert AXES["dp"].traffic == "dp-cp" and AXES["etp"].traffic is None
    assert [AXES[n].megatron for n in ("tp", "pp", "ep")] == [
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"]
    assert set(placement.WEIGHT_AXES) == NAMES - {"pp"}  # a weight lies over every axis but the pipeline's


def test_every_command_takes_the_sizes_the_table_gives():
    """trace, memory and layout take every size; lesson and compare the ones a lesson turns (no lesson turns
    expert TP: compare takes it for its layouts alone), each with the table's words."""
    for command, names in ((("trace",), SIZED), (("memory",), SIZED), (("layout",), SIZED),
                           (("lesson",), SIZED[:-1]), (("compare",), SIZED)):
        text = " ".join(cli(*command, "--help").stdout.split())
        for name in names:
            assert f"--{name} {AXES[name].metavar}" in text or f"--{name} N,..." in text, (command, name)
            assert AXES[name].what in text, (command, name)
    assert "--etp" not in cli("lesson", "--help").stdout
    layout = " ".join(cli("layout", "--help").stdout.split())
    assert "--tensor-model-parallel-size" in layout
    # what a command adds to an axis's words: its default there
    assert "without experts it follows tp, as Megatron's does" in layout
    assert "data-parallel size (default: derived from --gpus)" in " ".join(cli("memory", "--help").stdout.split())
    assert "expert tensor-parallel size (default 1)" in " ".join(cli("trace", "--help").stdout.split())


def axis_tables(source: str) -> list[int]:
    """The lines of `source` where a literal (a tuple, list, set or dict's keys) names four or more axes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            if len({i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES}) >= 4:
                found.append(node.lineno)
    return found


def test_no_other_table_of_axes():
    """A second table of the axes, outside the files ALLOWED says why, is found by its line."""
    found = [f"{p.relative_to(ROOT).as_posix()}:{line}" for p in sorted(ROOT.rglob("*.py"))
             if p.relative_to(ROOT).as_posix() not in ALLOWED for line in axis_tables(p.read_text())]
    assert not found, found


def test_the_scan_finds_a_table():
    """The scan above can fail: a tuple of four axes and a dict keyed by them are found; three axes are not."""
    assert axis_tables('SIZES = ("tp", "cp", "pp", "dp", "world")\nx = 1\nL = {"tp": 1, "ep": 2, "etp": 3, "edp": 4}') \
        == [1, 3]
    assert axis_tables('PLACE = ("tp", "cp", "pp")') == []

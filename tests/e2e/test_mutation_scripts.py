"""scripts/mutation_changed.py decides which mutants a change must run again: a function changed only in its
type hints, or by a name renamed everywhere, keeps its mutants (mutmut mutates neither); any other change,
however small, runs them again. The saved results' hashes keep the hints (they were written with them)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from mutation_changed import functions  # noqa: E402

OLD = '''
def f(tp, x: Any) -> Any:
    """Old words."""
    y: int = tp.size
    z: float
    return tp.xp.sum(x) + y

class C:
    def m(self, a: int = 1) -> int:
        return a * self.tp.size
'''


def test_hints_and_docstrings_change_no_mutant():
    new = (OLD.replace("x: Any) -> Any", "x: Array) -> Array").replace("Old words.", "New words.")
           .replace("y: int = tp.size", "y = tp.size").replace("a: int = 1) -> int", "a=1)")
           .replace("    z: float\n", "    z: int\n"))
    assert functions(new, hints=False) == functions(OLD, hints=False)
    # the saved results' hashes keep the hints: a hint-only change is not the same code to them
    assert functions(new)["x_f"] != functions(OLD)["x_f"]
    assert functions(new)["xǁCǁm"] != functions(OLD)["xǁCǁm"]


def test_a_rename_made_everywhere_is_tried():
    new = OLD.replace("tp", "par")
    assert functions(new, hints=False) != functions(OLD, hints=False)
    assert functions(OLD, {"tp": "par"}, hints=False) == functions(new, hints=False)


def test_any_other_change_runs_the_mutants_again():
    for old, new in (("+ y", "- y"), ("a * self", "a + self"), ("a: int = 1", "a: int = 2"), ("z: float", "z = 0.0")):
        changed = OLD.replace(old, new)
        assert changed != OLD
        assert functions(changed, hints=False) != functions(OLD, hints=False), new

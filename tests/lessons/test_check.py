"""parasim.lesson.check: the comparison every lesson's verdict rests on, tried with values that agree and
values that do not, on both of its paths (numeric: both sides convert to float arrays; otherwise `==`).
Every expected value is written out here, never computed by the function under test."""
from fractions import Fraction

import numpy as np
import pytest

from parasim.lesson import Check, Lesson, LessonRun, check, run_lesson


def ok(got, expected, **tol) -> bool:
    return check("c", got, expected, **tol).ok


# --- the numeric path: numbers, arrays and nested lists, exact unless a tolerance is given ---

@pytest.mark.parametrize("got, expected", [
    (3, 3), (2.5, 2.5), (1.0, 1), (0, -0.0), (np.float64(0.25), 0.25), (np.int64(7), 7),
    ([1, 2, 3], [1, 2, 3]), ((1, 2), [1, 2]), (np.array([1.0, 2.0]), [1, 2]),
    ([[1, 2], [3, 4]], np.array([[1, 2], [3, 4]])), ([], []), (float("inf"), float("inf")),
])
def test_numbers_equal(got, expected):
    assert ok(got, expected)


@pytest.mark.parametrize("got, expected", [
    (3, 4), (2.5, 2.25), (1, -1), (0.1 + 0.2, 0.3),  # exact by default: 0.30000000000000004 is not 0.3
    ([1, 2, 3], [1, 2, 4]), (np.array([1.0, 2.0]), [2, 1]),
    ([[1, 2], [3, 4]], [[1, 2], [3, 5]]), (float("inf"), float("-inf")), (float("inf"), 1e308),
])
def test_numbers_differ(got, expected):
    assert not ok(got, expected)


@pytest.mark.parametrize("got, expected", [
    ([1, 2], [1, 2, 3]),      # lengths differ
    ([[1, 2]], [1, 2]),       # same numbers, one more dimension
    ([1, 2], [[1], [2]]),     # same numbers, transposed
    ([1, 1], 1),              # would broadcast, but shapes must match
    (5, [5]),
    ([], [0]),
])
def test_shapes_differ(got, expected):
    assert not ok(got, expected)


def test_absolute_tolerance_just_inside_and_outside():
    # binary fractions, so the distances are exact: |1.25 - 1| = 0.25
    assert ok(1.0, 1.25, atol=0.25)        # on the boundary: inside
    assert not ok(1.0, 1.25, atol=0.125)  # outside
    assert not ok(1.0, 1.25)              # no tolerance: exact
    assert ok([0.0, 10.0], [0.5, 10.5], atol=0.5)
    assert not ok([0.0, 10.0], [0.5, 10.75], atol=0.5)  # one element outside is enough


def test_relative_tolerance_is_relative_to_the_expected_value():
    assert ok(6.0, 4.0, rtol=0.5)       # |6 - 4| = 2 <= 0.5 * 4
    assert not ok(6.5, 4.0, rtol=0.5)   # 2.5 > 2
    assert ok(2.0, 4.0, rtol=0.5)       # 2 <= 0.5 * 4
    assert not ok(4.0, 2.0, rtol=0.5)   # the same two numbers swapped: 2 > 0.5 * 2
    assert ok(1e12 + 0.5, 1e12, rtol=1e-12)
    assert not ok(1e12 + 4, 1e12, rtol=1e-12)


def test_tolerances_add_up():
    # numpy's allclose: |got - expected| <= atol + rtol * |expected|
    assert ok(5.0, 4.0, rtol=0.125, atol=0.5)      # 1 <= 0.5 + 0.5
    assert not ok(5.25, 4.0, rtol=0.125, atol=0.5)  # 1.25 > 1


def test_booleans_compare_as_numbers():
    assert ok(True, True) and ok(False, False)
    assert not ok(True, False)
    assert ok(True, 1) and ok(False, 0)  # the numeric path sees 1.0 and 0.0
    assert not ok([True, False], [True, True])


def test_strings_that_read_as_numbers_take_the_numeric_path():
    assert ok("1", "1.0") and ok(1, "1")
    assert not ok("2", "2.5")


# --- the non-numeric path: ==, for strings, fractions written "p/q", dicts and mixed lists ---

@pytest.mark.parametrize("got, expected", [
    ("92 of 92 weights", "92 of 92 weights"), ("3/7", "3/7"),
    (Fraction(3, 7), Fraction(3, 7)), (Fraction(3, 7), "3/7"), ([Fraction(1, 2)], ["1/2"]),
    (Fraction(4, 2), 2),  # a whole fraction is an int
    ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}), ({1: "x"}, {"1": "x"}),  # keys become strings
    ({"w": np.array([1.0, 2.0])}, {"w": [1.0, 2.0]}),
    ([2, ["the", "contract"]], [2, ["the", "contract"]]), ((0, "layer 1"), [0, "layer 1"]),
    ([1, [2, 3]], [1, [2, 3]]),  # ragged: no float array
])
def test_non_numeric_equal(got, expected):
    assert ok(got, expected)


@pytest.mark.parametrize("got, expected", [
    ("91 of 92 weights", "92 of 92 weights"), ("a", "b"), ("a", "A"),
    (Fraction(3, 7), Fraction(3, 11)), (Fraction(3, 7), "3/11"), (Fraction(1, 2), 0.5),  # "1/2" is no float
    ({"a": 1}, {"a": 2}), ({"a": 1}, {"b": 1}), ({"a": 1}, {"a": 1, "b": 2}),
    ([2, ["the", "contract"]], [2, ["the", "void"]]), ([2, ["the", "contract"]], [3, ["the", "contract"]]),
    ([1, [2, 3]], [1, [2, 4]]), ([1, [2, 3]], [1, [2, 3], 4]),
    ("x", 1), ({"a": 1}, [1]),
])
def test_non_numeric_differ(got, expected):
    assert not ok(got, expected)


def test_tolerance_does_not_reach_the_non_numeric_path():
    assert not ok({"a": 1.0}, {"a": 1.25}, atol=1.0)  # inside a dict, numbers compare with ==
    assert not ok([1.0, "x"], [1.25, "x"], atol=1.0)


# --- NaN, infinities and None, as check handles them today ---

def test_nan_never_equals_nan():
    assert not ok(float("nan"), float("nan"))
    assert not ok(np.nan, np.nan, atol=1.0)
    assert not ok([1.0, np.nan], [1.0, np.nan])
    assert not ok(float("nan"), 0.0)


def test_non_finite_numbers_are_recorded_as_strings():
    c = check("c", float("nan"), float("inf"))
    assert (c.got, c.expected, c.ok) == ("nan", "inf", False)
    assert ok(float("inf"), "inf")
    assert ok(float("-inf"), float("-inf"))


def test_none_is_not_equal_to_anything_even_none():
    # None becomes a float NaN on the numeric path, so a check of a missing value never passes
    assert not ok(None, None)
    assert not ok(None, 0)
    assert not ok(0, None)
    assert not ok([None], [None])


# --- what a Check records, and the verdict of a run ---

def test_check_records_jsonable_values():
    c = check("ratio", Fraction(3, 11), Fraction(3, 7))
    assert c == Check("ratio", "3/11", "3/7", False)
    assert c.to_dict() == {"name": "ratio", "got": "3/11", "expected": "3/7", "ok": False}
    c = check("array", np.array([[1, 2]]), (np.int64(1), np.int64(2)))
    assert (c.got, c.expected, c.ok) == ([[1, 2]], [1, 2], False)


def _lesson(checks):
    return Lesson(name="t", title="t", world=1, program=lambda ctx: {"x": 1}, narrative={}, checks=checks)


def test_lesson_run_fails_when_one_check_fails():
    lr = run_lesson(_lesson(lambda result: [check("good", 1, 1), check("bad", 1, 2), check("good", "a", "a")]))
    assert [c.ok for c in lr.checks] == [True, False, True]
    assert lr.ok is False
    assert [c["ok"] for c in lr.to_dict()["checks"]] == [True, False, True]


def test_lesson_run_fails_when_the_last_check_fails():
    lr = run_lesson(_lesson(lambda result: [check("good", 1, 1), check("bad", "91 of 92", "92 of 92")]))
    assert lr.ok is False


def test_lesson_run_passes_when_every_check_passes():
    lr = run_lesson(_lesson(lambda result: [check("value", result.values[0]["x"], 1), check("s", "a", "a")]))
    assert lr.ok is True
    assert LessonRun(lr.lesson, lr.result, [Check("bad", 1, 2, False)]).ok is False

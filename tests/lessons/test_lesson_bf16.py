"""The bf16-sums lesson: every figure it prints, worked out again here in numpy (float64 for the exact sums, a
ring written in this test's helper for the bfloat16 ones)."""
import json

import numpy as np
import pytest
from conftest import cli
from half_ref import ring_reference

from parasim.lesson import get_lesson, run_lesson

SMALL = 2.0 ** -8


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("bf16-sums"))


def _figures(got: np.ndarray, exact: np.ndarray, terms: np.ndarray) -> dict:
    """What the lesson reports for a sum, from numpy: elements off, median relative error, the error of the
    whole vector as a share of its length, the worst error as a share of the magnitudes added (percent)."""
    got, exact = got.astype(np.float64), exact.astype(np.float64)
    nonzero = exact != 0
    rel = np.abs(got - exact)[nonzero] / np.abs(exact)[nonzero]
    return {"off": int(np.sum(got != exact)), "of": exact.size, "median_pct": 100 * float(np.sort(rel)[rel.size // 2]),
            "norm_pct": 100 * float(np.linalg.norm(got - exact) / np.linalg.norm(exact)),
            "worst_pct": 100 * float(np.max(np.abs(got - exact) / terms))}


def _grads(lr) -> np.ndarray:
    return np.stack([np.asarray(lr.result.values[r]["grad"]) for r in range(lr.result.world)])


def _notes(lr, key: str) -> list[dict]:
    return [data for _, _, _, data in lr.result.trace.notes(key)]


def _close(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(np.isclose(got[k], want[k], rtol=1e-12, atol=0) for k in want)


def test_checks_pass_and_the_example_is_worked_out_by_hand(lr):
    assert lr.ok, [c.name for c in lr.checks if not c.ok]
    # 8 ranks: 1.0 and seven 2^-8. Exact: 1 + 7/256. In rank order each 2^-8 is a tie at 1.0 and rounds to
    # even, 1.0. gloo's ring ends at rank 0: 7/256 first (exact), then + 1 = 1.02734375, which lies halfway
    # between the bfloat16 neighbours 1.0234375 and 1.03125 and rounds to the even one, 1.03125.
    (example,) = _notes(lr, "example")
    assert example["example"] == {"bf16": 1.03125, "fp32": 1.02734375, "rank_order": 1.0}


def test_the_error_figures(lr):
    grads = _grads(lr)
    assert grads.shape == (8, 1024) and str(grads.dtype) == "bfloat16"
    g64 = grads.astype(np.float64)
    exact, terms = g64.sum(axis=0), np.abs(g64).sum(axis=0)
    bf16 = ring_reference(grads)
    assert np.array_equal(np.asarray(lr.result.values[0]["bf16"]).view(np.uint16), bf16.view(np.uint16))
    fp32 = g64.astype(np.float32).sum(axis=0, dtype=np.float32)  # any order: these sums fit in 24 bits
    by_dtype = {d["dtype"]: d["errors"] for d in _notes(lr, "dtype")}
    assert _close(by_dtype["bfloat16"], _figures(bf16, exact, terms))
    assert _close(by_dtype["float32"], _figures(fp32, exact, terms))
    assert by_dtype["float32"]["off"] == 0 and by_dtype["bfloat16"]["off"] > 900


def test_more_ranks_more_roundings(lr):
    grads = _grads(lr)
    sizes = {d["ranks"]: d["errors"] for d in _notes(lr, "ranks")}
    assert sorted(sizes) == [2, 4, 8]
    for t, got in sizes.items():
        g64 = grads[:t].astype(np.float64)
        assert _close(got, _figures(ring_reference(grads[:t]), g64.sum(axis=0), np.abs(g64).sum(axis=0))), t
    assert sizes[2]["norm_pct"] < sizes[4]["norm_pct"] < sizes[8]["norm_pct"]


@pytest.mark.parametrize("world", [2, 3, 5])
def test_other_world_sizes(world):
    other = run_lesson(get_lesson("bf16-sums"), world)
    assert other.ok, [c.name for c in other.checks if not c.ok]
    (example,) = _notes(other, "example")
    assert example["example"]["fp32"] == 1 + (world - 1) * SMALL and example["example"]["rank_order"] == 1.0


def test_json_is_strict():
    out = cli("lesson", "bf16-sums", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["lesson"] == "bf16-sums" and all(c["ok"] for c in data["checks"])
    assert {t["dtype"] for e in data["events"] for m in e["members"] for t in m["in"]} == \
           {"bfloat16", "float32", "float64"}


def test_a_checks_long_array_is_summed_up_in_the_walk_through_and_whole_in_json():
    """Issue 53: bf16-sums' check of 8 ranks' 1,024 sums once printed 78,736 characters on one line; the
    walk-through gives its shape and first values, --json every value."""
    import json
    from conftest import cli
    text = cli("lesson", "bf16-sums", "--plain").stdout
    import re
    text = re.sub(r"\n {7}(?=\S)", " ", text)  # a check wrapped at the page's width, read as one line
    line = next(l for l in text.splitlines() if "every rank holds the same bfloat16 sums" in l)
    assert len(line) < 300 and "8 x 1,024 values: [[" in line and ", ...]" in line
    assert all(len(l) <= 96 for l in cli("lesson", "bf16-sums", "--plain").stdout.splitlines()
               if l.startswith("  ok") or l.startswith("       "))  # each check's lines within the page
    data = json.loads(cli("lesson", "bf16-sums", "--json").stdout)
    check = next(c for c in data["checks"] if c["name"] == "every rank holds the same bfloat16 sums")
    assert len(check["got"]) == 8 and all(len(row) == 1024 for row in check["got"])

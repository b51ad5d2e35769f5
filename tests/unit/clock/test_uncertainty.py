"""Every step time parasim prints carries the range the held-out runs like it measured (issue 50, item 6;
clock/uncertainty.py): the family a run falls in, the circles a range widens through, the ratio's sign
against a published step worked out by hand, and the range in `memory` and `fit --search --by time`, text and
--json alike."""
from __future__ import annotations

import json
import re

import pytest

from parasim.clock.costs import machine
from parasim.clock.plan import step_time
from parasim.estimate.memory import Plan
from parasim.clock.runs import HELD_OUT, RUNS
from parasim.clock.runs_fifth import FIFTH
from parasim.clock.runs_eighth import EIGHTH
from parasim.clock.runs_ninth import NINTH
from parasim.clock.runs_tenth import TENTH
from parasim.clock.runs_eleventh import ELEVENTH
from parasim.clock.runs_seventh import SEVENTH
from parasim.clock.runs_sixth import SIXTH
from parasim.clock.runs_fourth import FOURTH
from parasim.clock.runs_fresh import FRESH
from parasim.clock.uncertainty import MIN_RUNS, family, held_out, step_range
from parasim.layout import ModelSpec
from tests.conftest import cli

DENSE = ModelSpec(layers=2, hidden=64, heads=4, vocab=100)
MOE = ModelSpec(layers=2, hidden=64, heads=4, vocab=100, experts=8, top_k=2, expert_ffn=32)


@pytest.mark.parametrize("model, plan, name", [
    (MOE, Plan(ep=8, dp=8, zero=3), "moe"),  # MoE first, whatever else the run does
    (DENSE, Plan(zero=3, tp=2, dp=2), "fsdp"),
    (DENSE, Plan(tp=2), "model-parallel"), (DENSE, Plan(pp=4), "model-parallel"),
    (DENSE, Plan(cp=2), "model-parallel"), (DENSE, Plan(dp=64), "data-parallel"),
])
def test_a_run_falls_in_the_first_family_it_matches(model, plan, name):
    assert family(model, plan).name == name


# (key, GPU type, family, error): a made-up held-out table
TABLE = [("a", "h100", "model-parallel", 0.10), ("b", "h100", "model-parallel", -0.20),
         ("c", "h100", "model-parallel", 0.30), ("d", "a100", "model-parallel", 0.50),
         ("e", "h100", "fsdp", 1.00), ("f", "a100", "fsdp", 0.05), ("g", "h200", "moe", 0.40)]


def test_the_range_is_the_spread_of_the_same_gpu_and_family_when_there_are_enough():
    """H100, TP: a, b, c (3 = MIN_RUNS) -> measured over parasim's step 0.80 to 1.30."""
    assert MIN_RUNS == 3
    r = step_range(DENSE, Plan(tp=8), "h100", TABLE)
    assert (r.low, r.high, r.runs) == (pytest.approx(0.80), pytest.approx(1.30), ("a", "b", "c"))
    assert r.like == "held-out H100 runs, TP, PP or CP"
    d = r.to_dict(10.0)
    assert (d["low_s"], d["high_s"]) == (pytest.approx(8.0), pytest.approx(13.0))


def test_too_few_on_the_gpu_widens_to_the_family_then_to_every_run():
    """A100, TP: only d on the A100 -> the family on any GPU, a-d: 0.80 to 1.50. FSDP: e and f, two on any GPU
    -> every run, b's 0.80 to e's 2.00."""
    r = step_range(DENSE, Plan(tp=8), "a100", TABLE)
    assert (r.low, r.high, len(r.runs)) == (pytest.approx(0.80), pytest.approx(1.50), 4)
    assert r.like == "held-out runs on any GPU, TP, PP or CP"
    r = step_range(DENSE, Plan(zero=3, dp=8), "h100", TABLE)
    assert (r.low, r.high, len(r.runs), r.like) == (pytest.approx(0.80), pytest.approx(2.00), 7, "every held-out run")


def test_the_held_out_table_is_every_held_out_fresh_and_fourth_run_once():
    table = held_out()
    assert sorted(k for k, *_ in table) == sorted([r.key for r in RUNS if r.set == HELD_OUT] + [r.key for r in FRESH]
                                                  + [r.key for r in FOURTH] + [r.key for r in FIFTH]
                                                  + [r.key for r in SIXTH] + [r.key for r in SEVENTH]
                                                  + [r.key for r in EIGHTH + NINTH + TENTH + ELEVENTH
                                                     if (r.gpu != "b200" or "tp" not in r.overlap)
                                                     and (r.gpu == "b200" or r.plan.attention_kernel != "cudnn")])
    assert {f for _, _, f, _ in table} <= {"moe", "fsdp", "model-parallel", "data-parallel"}


def test_a_ratio_is_the_measured_step_over_parasims():
    """A held-out run published in seconds a step: its error, read from the table, times parasim's step gives the
    published step back (measured = parasim's x (1 + error))."""
    run = next(r for r in RUNS if r.set == HELD_OUT and r.unit == "s per step")
    err = next(e for k, _, _, e in held_out() if k == run.key)
    step = step_time(run.model, run.plan, run.seq, machine(run.gpu, run.plan.gpus_per_node), run.overlap)["step_s"]
    assert step * (1 + err) == pytest.approx(run.published)


def _said(s: float) -> str:
    """A time as the step line prints it: seconds from a tenth up, milliseconds below (written out here)."""
    return f"{s:,.2f} s" if s >= 0.1 else f"{s * 1e3:,.2f} ms"


def test_memory_prints_the_range_and_gives_it_in_json():
    out = cli("memory", "--model", "27b", "--tp", "8")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    # the range comes from the held-out runs of the step's own GPU and family where there are enough of them (four
    # H200 runs since the eleventh set), else from every held-out run
    assert "runs like it measured" in text and re.search(r"\d+ held-out (H200 )?runs", text)
    data = json.loads(cli("memory", "--model", "27b", "--tp", "8", "--json").stdout)
    t = data["time"]
    r = t["range"]
    assert r["low_s"] == pytest.approx(t["step_s"] * r["low_ratio"]) and r["low_s"] <= r["high_s"]
    errors = {k: e for k, _, _, e in held_out()}
    assert r["low_ratio"] == pytest.approx(1 + min(errors[k] for k in r["runs"]))
    assert r["high_ratio"] == pytest.approx(1 + max(errors[k] for k in r["runs"]))
    assert f"{_said(r['low_s'])} to {_said(r['high_s'])}" in text


def test_every_layout_the_search_ranks_carries_its_range():
    out = cli("fit", "--search", "--by", "time", "--model", "27b", "--nodes", "1", "--seq", "4096",
              "--global-batch", "64", "--json")
    assert out.returncode == 0, out.stderr
    rows = [r for n in json.loads(out.stdout)["nodes"] for r in n["top"]]
    assert rows and all(r["range"]["low_s"] <= r["step_s"] * max(1.0, r["range"]["high_ratio"]) for r in rows)
    assert all(r["range"]["low_s"] == pytest.approx(r["step_s"] * r["range"]["low_ratio"]) for r in rows)
    text = cli("fit", "--search", "--by", "time", "--model", "27b", "--nodes", "1", "--seq", "4096",
               "--global-batch", "64").stdout
    assert text.count("(runs like it: ") == len(rows) and "runs like it: the measured steps of" in text


# -- a run's trace on the clock: the family read from what it did, and the range in the walk-through ----------

def _trace_of(calls):
    """A 4-rank run making `calls`: (op, group name) pairs, every rank in one group of that name."""
    import parasim

    def prog(ctx):
        for op, name in calls:
            g = ctx.new_group([0, 1, 2, 3], name)
            x = ctx.asarray([1.0, 2.0, 3.0, 4.0])
            getattr(ctx.comm, op)(x, group=g)
    return parasim.run(prog, 4).trace


@pytest.mark.parametrize("calls, name", [
    ([("all_reduce", "dp")], "data-parallel"),
    ([("all_gather", "dp")], "data-parallel"),  # ZeRO-1: the parameters gathered once a step
    ([("all_gather", "dp-cp"), ("all_gather", "dp-cp")], "fsdp"),  # ZeRO-3: gathered again for backward
    ([("all_reduce", "tp"), ("all_gather", "dp")], "model-parallel"),
    ([("all_gather", "expert-dp"), ("all_gather", "expert-dp"), ("all_reduce", "tp")], "moe"),  # MoE first
    ([("all_gather", "ep")], "moe"),
])
def test_a_traces_family_is_read_from_its_groups(calls, name):
    from parasim.clock.uncertainty import trace_family
    assert trace_family(_trace_of(calls)).name == name


def test_a_real_size_lesson_says_its_range_and_an_exact_one_does_not():
    """fit-is-not-fast runs the 27B model at real size on symbolic ranks (TP 8): its step carries the range of
    the held-out TP/PP/CP runs, in --json as ratios and seconds (the step times each ratio) and in the
    walk-through; tp-mlp runs exact values on toy shapes, where no measured run is like it: no range."""
    data = json.loads(cli("lesson", "fit-is-not-fast", "--json").stdout)
    c = data["clock"]
    r = c["range"]
    fam = [f for k, _, f, _ in held_out() if k in r["runs"]]
    assert fam and set(fam) == {"model-parallel"} and "TP, PP or CP" in r["like"]
    assert r["low_s"] == pytest.approx(c["step_us"] / 1e6 * r["low_ratio"], rel=1e-12)
    assert r["high_s"] == pytest.approx(c["step_us"] / 1e6 * r["high_ratio"], rel=1e-12)
    errors = {k: e for k, _, _, e in held_out()}
    assert r["low_ratio"] == pytest.approx(min(1 + errors[k] for k in r["runs"]))
    assert r["high_ratio"] == pytest.approx(max(1 + errors[k] for k in r["runs"]))
    text = " ".join(cli("lesson", "fit-is-not-fast", "--plain").stdout.split())
    assert f"held-out runs like it measured {r['low_ratio']:.2f}x to {r['high_ratio']:.2f}x the clock's time" in text
    exact = json.loads(cli("lesson", "tp-mlp", "--json").stdout)
    assert "range" not in exact["clock"]
    assert "held-out runs like it" not in cli("lesson", "tp-mlp", "--plain").stdout


def test_the_real_size_trace_says_its_steps_range():
    """`trace --symbolic` times a step of a real-size layout (Megatron's 8.3B: TP 8): its time carries the range
    of the held-out runs with TP, PP or CP, the step times each ratio, in --json and in words."""
    data = json.loads(cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3", "--json").stdout)
    t = data["time"]
    r = t["range"]
    assert {f for k, _, f, _ in held_out() if k in r["runs"]} == {"model-parallel"}
    assert (r["low_s"], r["high_s"]) == (pytest.approx(t["step_s"] * r["low_ratio"], rel=1e-12),
                                         pytest.approx(t["step_s"] * r["high_ratio"], rel=1e-12))
    text = " ".join(cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3").stdout.split())
    assert f"runs like it measured {_said(r['low_s'])} to {_said(r['high_s'])}" in text


def test_a_toy_models_step_is_printed_in_milliseconds_not_as_zero_seconds():
    """moe16 (a toy) on 32 H100s steps in well under a millisecond of compute: its step line, parts and range
    read in ms or us, never '0.00 s'; a real model's stay in seconds."""
    from parasim.render.estimate_text import seconds
    assert (seconds(0.2), seconds(0.0123456), seconds(0.0000456), seconds(0), seconds(12345.6)) == (
        "0.20 s", "12.35 ms", "45.6 us", "0.00 s", "12,345.60 s")
    text = " ".join(cli("memory", "--model", "moe16", "--ep", "4", "--dp", "8", "--gpu", "h100").stdout.split())
    step = text[text.index("step: "):]
    assert "0.00 s" not in step and " ms " in step and "runs like it measured" in step


def test_a_range_times_only_the_runs_it_keeps_and_is_the_range_of_the_whole_table():
    """held_out() times each run when a range first needs it (HeldOut): a range on one GPU type and family with
    enough runs times those runs alone, and every range is the one the whole table, listed, gives."""
    from parasim.clock.published import rows
    from parasim.clock.runs import CALIBRATION
    from parasim.clock.uncertainty import FAMILIES, HeldOut, family_range

    lazy = held_out()
    assert isinstance(lazy, HeldOut) and not lazy._errors
    moe = next(f for f in FAMILIES if f.name == "moe")
    got = family_range(moe, "h100", lazy)
    assert got.like.startswith("held-out H100 runs") and len(got.runs) >= MIN_RUNS
    assert set(lazy._errors) == {r.key for r in lazy.runs if r.gpu == "h100" and lazy.families[r.key] == "moe"}
    # the whole table, from published.rows (which times every run and variant on its own)
    whole = [(row["name"], row["gpu"], held_out().families[row["name"]], row["error"]) for row in rows()
             if row["set"] != CALIBRATION and row["error"] is not None]
    assert sorted(held_out()) == sorted(whole)
    for fam in FAMILIES:
        for gpu in ("h100", "a100", "h200", "b200"):
            assert family_range(fam, gpu, lazy) == family_range(fam, gpu, whole), (fam.name, gpu)

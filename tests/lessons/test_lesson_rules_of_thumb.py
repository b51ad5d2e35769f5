"""`parasim lesson rules-of-thumb` (issue 53, build item 3): each of the post's rules of thumb run broken and
kept, at real size on symbolic ranks, on the clock. The figures are worked out here by hand from the 27B
model's sizes (h 6,144, 48 heads and 48 KV heads, an MLP of 4h, LayerNorm, biases), never read from the
lesson."""

from __future__ import annotations

import re

import json

import pytest

from conftest import cli
from parasim.lesson import get_lesson, run_lesson
from parasim.render.walkthrough import walkthrough

H, S, LONG = 6144, 4096, 32768
_RUN: list = []


def ran():
    """The lesson run once for the module (symbolic, at real size: about a second)."""
    if not _RUN:
        _RUN.append(run_lesson(get_lesson("rules-of-thumb")))
    return _RUN[0]


def held(phase_start: str) -> dict:
    lr = ran()
    (phase,) = [p for p in lr.result.values[0] if p.startswith(phase_start)]
    return lr.result.values[0][phase]


def params_on_gpu0(tp: int, layers: int) -> int:
    """GPU 0's parameters of `layers` layers at TP `tp`: the matrices (4h^2 attention, 8h^2 MLP) split by TP,
    the column-parallel biases (QKV 3h, fc1 4h) split, the row-parallel biases (h each) and the two
    LayerNorms' scales and shifts (4h) whole."""
    return layers * (12 * H * H // tp + 7 * H // tp + 6 * H)


def test_every_check_holds_and_both_tables_are_made():
    lr = ran()
    assert lr.checks and all(c.ok for c in lr.checks), [c.name for c in lr.checks if not c.ok]
    assert [len(t.rows) for t in lr.tables] == [14, 7]


@pytest.mark.parametrize(
    "phase,tp,layers",
    [
        ("TP inside a node: breaks", 16, 2),
        ("TP inside a node: follows", 8, 2),
        ("PP across nodes: breaks", 8, 1),
        ("PP across nodes: follows", 8, 1),
    ],
)
def test_weights_gradients_and_adam_on_gpu0_by_hand(phase, tp, layers):
    p = params_on_gpu0(tp, layers)
    got = held(phase)
    assert (got["weights"], got["gradients"], got["optimizer"]) == (2 * p, 2 * p, 12 * p)


def test_zero1_halves_adam_over_dp2():
    assert held("ZeRO-1 over DP almost always: follows")["optimizer"] == 12 * params_on_gpu0(8, 2) // 2
    assert held("ZeRO-1 over DP almost always: breaks")["optimizer"] == 12 * params_on_gpu0(8, 2)


def test_activations_by_hand_without_dropout():
    # Korthikanti et al.'s sbh(10 + 24/t) and 34sbh/t less the two residual dropout masks (1 byte a value):
    # no dropout here
    sbh = S * H
    assert held("SP whenever TP is on: breaks")["activations"] == 2 * sbh * (8 + 24 // 8)
    assert held("SP whenever TP is on: follows")["activations"] == 2 * 32 * sbh // 8
    # at 32K, TP 16 and TP 8 x CP 2 each keep a 16th of the sequence's activations
    assert held("CP when sequences get long: breaks")["activations"] == 2 * 32 * LONG * H // 16
    assert held("CP when sequences get long: follows")["activations"] == 2 * 32 * LONG * H // 16


def _study():
    import importlib.util

    lr = ran()
    spec = importlib.util.spec_from_file_location("rules_of_thumb_under_test", lr.lesson.source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    s = module.study(lr.result)
    return module, {p: module.figures(lr.result, s, p) for p in lr.result.values[0]}


def test_bytes_across_nodes_by_hand():
    _, f = _study()
    pp = next(v for p, v in f.items() if p.startswith("PP across nodes: follows"))
    # 8 GPU pairs, each an SP slice (S/8 tokens x h x 2 bytes) forward and its gradient back
    assert pp["across"] == 2 * 8 * (S // 8) * H * 2
    kept = next(v for p, v in f.items() if p.startswith("TP inside a node: follows"))
    # DP 2's all-reduce: a ring of 2 sends each GPU's gradient bytes once; 16 GPUs; within the vectors
    # (norms' and row-parallel biases are whole on every GPU, so they count in full)
    assert kept["across"] == 16 * 2 * params_on_gpu0(8, 2)


def test_what_each_rule_shows_on_the_clock():
    _, f = _study()
    ms = {p.split(" (")[0]: v["ms"] for p, v in f.items()}
    assert ms["TP inside a node: breaks it"] > 2 * ms["TP inside a node: follows it"]
    assert ms["PP across nodes: breaks it"] > 2 * ms["PP across nodes: follows it"]
    assert ms["CP when sequences get long: breaks it"] > 2 * ms["CP when sequences get long: follows it"]
    zero = ms["ZeRO-1 over DP almost always: follows it"] / ms["ZeRO-1 over DP almost always: breaks it"]
    assert zero == pytest.approx(1, abs=0.02)


def test_etp_2_holds_half_of_twice_the_experts_and_swaps_with_its_pair():
    """The ETP rule by hand (DeepSeek-V3's layer: 256 experts of two 7,168 x 2,048 matrices): ETP 2 x EP 4
    gives GPU 0 64 experts, each half of it; ETP 1 x EP 8 gives it 32 whole: the same parameters, held at 2
    (weights) + 2 (gradients) + 12 (Adam) bytes each. Only ETP 2 has expert-TP calls, and only with GPU 1."""
    d, f = 7168, 2048
    broken, kept = held("ETP 1 for the experts: breaks"), held("ETP 1 for the experts: follows")
    for got, experts, share in ((broken, 256 // 4, 2), (kept, 256 // 8, 1)):
        p = experts * 2 * d * f // share
        assert (got["weights"], got["gradients"], got["optimizer"]) == (2 * p, 2 * p, 12 * p)
    lr = ran()
    phases = [p for p in lr.result.values[0] if p.startswith("ETP 1 for the experts")]
    groups = {p: {tuple(e.ranks) for e in lr.result.trace.events
                  if e.phase == p and e.group is not None and e.group.name == "expert-tp" and 0 in e.ranks}
              for p in phases}
    assert groups == {phases[0]: {(0, 1)}, phases[1]: set()}
    eps = {tuple(e.ranks) for e in lr.result.trace.events
           if e.phase == phases[0] and e.op == "all_to_all" and e.group.name == "ep" and 0 in e.ranks}
    assert eps == {(0, 2, 4, 6)}  # EP 4 over GPU 0's place in each pair of node 0


def test_gpu0_calls_across_nodes_count_the_tp16_collectives():
    lr = ran()
    _, f = _study()
    phase = next(p for p in f if p.startswith("TP inside a node: breaks"))
    tp16 = [e for e in lr.result.trace.events if e.phase == phase and e.kind == "collective" and len(e.ranks) == 16]
    assert f[phase]["crossing"] == len(tp16) > 20
    kept = next(p for p in f if p.startswith("TP inside a node: follows"))
    assert f[kept]["crossing"] == 1  # the gradient all-reduce over DP


def test_the_walkthrough_shows_a_few_events_a_phase_and_counts_the_rest():
    lr = ran()
    text = walkthrough(lr, width=100)
    # 363 before heads wrapped; 586 with the ETP rule's two MoE runs
    assert max(map(len, text.splitlines())) <= 100 and len(text.splitlines()) < 620
    for phase in lr.result.values[0]:
        block = text.split(f"== {phase} ==")[1].split("\n== ")[0]
        events = [e for e in lr.result.trace.events if e.phase == phase]
        words = " ".join(block.split())
        same = re.search(r"the same (\d+) calls as '", words)
        if same:  # a phase that repeats an earlier one's very calls, on the same groups: said once
            assert int(same[1]) == len(events)
            continue
        shown = block.count("\nstep ")
        more = words.split("... and ")[1].split(" more events")[0]
        assert shown == 4 and int(more) == len(events) - 4


def test_the_table_reads_across_at_100_columns():
    text = walkthrough(ran(), width=100)
    assert "(columns" not in text.split("== tables")[1]


@pytest.mark.timeout(600)  # two runs at real size (about 15 s each idle): room for a busy machine
def test_plot_and_json(tmp_path):
    png = tmp_path / "r.png"
    out = cli("lesson", "rules-of-thumb", "--plot", str(png), "--plain")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = cli("lesson", "rules-of-thumb", "--json")
    got = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))  # as strict_json's
    assert [t["title"][:20] for t in got["tables"]] == ["Each rule broken and", "What breaking each r"]


def test_readme_says_what_the_run_computes():
    """README's row for the lesson quotes the run's ratios: each worked out here from the run's clock and
    bytes, rounded as README rounds them."""
    from pathlib import Path

    row = next(
        line
        for line in (Path(__file__).parents[2] / "README.md").read_text().splitlines()
        if line.startswith("| `rules-of-thumb`")
    )
    _, f = _study()
    ms = {p.split(":")[0] + (":b" if ": breaks" in p else ":f"): v for p, v in f.items()}
    ratio = lambda rule: ms[rule + ":b"]["ms"] / ms[rule + ":f"]["ms"]  # noqa: E731
    said = [
        f"{ratio('TP inside a node'):.1f}x slower than TP 8",
        f"{ratio('PP across nodes'):.1f}x slower than across",
        f"{ratio('CP when sequences get long'):.1f}x slower than TP 8 with CP 2",
        f"{ms['SP whenever TP is on:b']['activations'] / ms['SP whenever TP is on:f']['activations']:.2f}x less",
        f"it wins from {_break_even()} micro-batches",
    ]
    assert all(s in row for s in said), (said, row)


def _break_even() -> int:
    """The micro-batches a step from which EP 8 in a node beats EP 16 over two, from the run's clock: the
    all-to-alls one micro-batch saves against the experts' gradient sum over the nodes, once a step."""
    import math

    module, f = _study()
    broken = next(v for p, v in f.items() if p.startswith("EP inside a node: breaks"))
    kept = next(v for p, v in f.items() if p.startswith("EP inside a node: follows"))
    # the step runs module.MOE_MICRO micro-batches through the layer; EP 16's experts have no copy to sum with
    saved = (broken["ms"] - kept["ms"] + kept["edp_ms"]) / module.MOE_MICRO
    return math.floor(kept["edp_ms"] / saved) + 1


def test_ep_inside_a_node_by_hand():
    """EP 8 in each node keeps twice the experts a GPU (16 bytes a parameter: BF16 weights and gradients, Adam in
    FP32) and sends across nodes only their gradients' sum over the two copies; EP 16 holds half, its all-to-alls
    crossing."""
    d, f, experts = 7168, 2048, 256
    broken = held("EP inside a node: breaks")
    kept = held("EP inside a node: follows")
    per = lambda n: n * 2 * d * f  # noqa: E731  (n experts' two d x f matrices)
    assert broken["optimizer"] == 12 * per(experts // 16) and kept["optimizer"] == 12 * per(experts // 8)
    _, fig = _study()
    across = next(v for p, v in fig.items() if p.startswith("EP inside a node: follows"))["across"]
    assert across == 16 * per(experts // 8) * 2  # each GPU its gradients once (a ring of 2), BF16
    assert _break_even() == 4
    notes = " ".join(" ".join(t.notes) for t in ran().tables)
    assert f"keeping the rule wins from {_break_even()} micro-batches a step" in " ".join(notes.split())


def test_sp_s_memory_is_scaled_to_the_model_s_layers_and_points_to_the_lengths():
    """The SP row's 0.35 GB is two layers: the note under the table scales it to the 27B model's 60 layers, by
    hand 60 x s h (8 + 24/8 - 32/8) bytes without dropout masks, and quotes the one-node longest sequences with
    TP 8 alone and with SP (the post's about 13K and about 40K)."""
    lr = ran()
    (costs,) = [t for t in lr.tables if t.title.startswith("What breaking each rule")]
    (note,) = [n for n in costs.notes if n.startswith("SP's memory:")]
    per_layer = S * H * (8 + 3 - 4)  # bytes TP 8 alone keeps beyond TP 8 + SP, a layer
    assert f"its {round(2 * per_layer / 1e9, 2)} GB is two layers' worth" in note
    assert f"has 60 layers: {round(60 * per_layer / 1e9, 2)} GB more a GPU at {S:,} tokens" in note
    alone, with_sp = (int(n.replace(",", "")) for n in
                      re.search(r"is ([\d,]+) tokens with TP 8 alone against ([\d,]+) with SP", note).groups())
    assert alone == pytest.approx(13_000, rel=0.1) and with_sp == pytest.approx(40_000, rel=0.05)
    assert f"gives up {1 - alone / with_sp:.0%} of the length" in note
    (c,) = [c for c in lr.checks if c.name.startswith("SP's memory over the whole model")]
    assert c.ok and c.got == 60 * per_layer

"""Lesson moe16 as a reader walks it (the review's findings): the walk-through names the command that draws the
post's layout, prints the step's slot table beside the post's picture with why its third slot cannot be as
drawn, and says what the combine adds back (the token itself, the residual) with the run's figures; moe16-variants
names the phases of the layout it replays once. Expected values are worked out here by hand or from an
independent one-device run, never read from the code under test."""

from __future__ import annotations

import importlib.util
import re
import types

import numpy as np
import parasim
import pytest
from conftest import cli

from parasim.layout import preset
from parasim.lesson import get_lesson, run_lesson
from parasim.render.walkthrough import _quiet_runs, walkthrough


@pytest.fixture(scope="module")
def moe16():
    return run_lesson(get_lesson("moe16"))


def _module():
    """The lesson's file as a module (lessons are loaded by path), for its slot placement."""
    spec = importlib.util.spec_from_file_location("moe16_lesson_walk", get_lesson("moe16").source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_text_names_the_command_that_draws_the_post_s_layout_and_it_does(tmp_path):
    """Where the layout is first told, the walk-through names `parasim layout ... --plot FILE.png`; run as it is
    written, it draws a picture and builds the post's groups (TP 2, CP 2, PP 2, DP 2, EP 4 on 16 GPUs)."""
    text = " ".join(get_lesson("moe16").narrative["data"].split())
    (command,) = re.findall(r"`(parasim layout [^`]*)`", text)
    assert command == "parasim layout --tp 2 --cp 2 --dp 2 --pp 2 --ep 4 --sequence-parallel --plot FILE.png"
    args = command.split()[1:]
    out = cli(*[str(tmp_path / "l.png") if a == "FILE.png" else a for a in args])
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = __import__("json").loads(cli(*[a for a in args if a not in ("--plot", "FILE.png")], "--json").stdout)
    post = preset("moe16").groups()
    assert {k: data["groups"][k] for k in ("tp", "cp", "pp", "ep", "dp-cp", "expert-dp")} == {
        k: [list(g) for g in post[k]] for k in ("tp", "cp", "pp", "ep", "dp-cp", "expert-dp")
    }
    assert data["groups"]["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


# the slots of 1F1B over 2 stages and 2 micro-batches, by hand: A's F1 in slot 1, B's F1 in 2 (A's output), B's
# B1 in 3 (its own F1 done), A's F2 in 2 and so B's F2 in 4 (after its B1), B's B2 in 5, A's B1 in 4 (B's B1
# sent at the end of 3), A's B2 in 6 (B's B2 in 5)
RAN = {"node A": ["F1", "F2", ".", "B1", ".", "B2"], "node B": [".", "F1", "B1", "F2", "B2", "."]}


def test_the_slot_table_is_a_table_of_the_walk_beside_the_post_s(moe16):
    (table,) = [t for t in moe16.tables if t.title.startswith("Step 1's pipeline slots")]
    assert table.columns == ["node", *[f"slot {i}" for i in range(1, 7)]]
    assert dict(table.rows) == {
        "node A, the run (g0-g7)": RAN["node A"],
        "node B, the run (g8-g15)": RAN["node B"],
        "node A, the post": ["F1", "F2", "backward work", "", "", ""],
        "node B, the post": [".", "F1", "F2", "", "", ""],
    }
    why = " ".join(table.notes)
    assert "sends at the end of slot 3" in why and "first backward on node A is in slot 4" in why
    assert "runs F2 in slot 3" in why and "1F1B runs B1 there" in why
    text = walkthrough(moe16, width=100)
    tables = text.split("== tables (every figure from the run) ==")[1].split("== checks")[0]
    assert "Step 1's pipeline slots" in tables
    rows = {line.split("  ")[1].strip(): line.split()[-6:] for line in tables.splitlines() if ", the run (g" in line}
    assert rows == {"node A, the run (g0-g7)": RAN["node A"], "node B, the run (g8-g15)": RAN["node B"]}


def test_the_hand_offs_are_sent_in_the_slots_the_table_gives():
    """The run's own slot tags on its sends: A's forwards send activations in slots 1 and 2, B's backwards send
    gradients back in 3 and 5 (the table above, read by hand)."""
    lr = run_lesson(get_lesson("moe16"))
    (c,) = [c for c in lr.checks if c.name.startswith("each hand-off's slot")]
    assert c.ok and c.got == [[1, "node A", "F1"], [2, "node A", "F2"], [3, "node B", "B1"], [5, "node B", "B2"]]


def test_slot_placement_by_hand():
    """GPipe's order (every forward, then every backward) on 2 stages: B's forwards wait one slot for A's, A's
    backwards wait for B's; orders that wait on each other are refused, not looped on."""
    place = _module().place_in_slots
    assert place([["F1", "F2", "B1", "B2"]] * 2) == [
        ["F1", "F2", ".", ".", "B1", "B2"],
        [".", "F1", "F2", "B1", "B2", "."],
    ]
    assert place([["F1", "F2", "B1", "B2"], ["F1", "B1", "F2", "B2"]]) == [RAN["node A"], RAN["node B"]]
    with pytest.raises(RuntimeError, match="wait on each other"):
        place([["B1", "F1"], ["F1", "B1"]])


def test_the_combine_adds_the_token_itself_the_residual_with_the_run_s_figures(moe16):
    """After each MoE layer the token's holder notes its output's two terms: the token as attention left it (the
    residual) and the experts' share. Their norms are the one-device model's own, read from its marked tensors
    (t6 of A: row 5): the residual is its after-attention row, the experts' share its output row less that."""
    notes = [(r, d) for _, r, _, d in moe16.result.trace.notes("residual")]
    assert [(r, d["layer"]) for r, d in notes] == [(2, 1), (2, 2), (10, 3), (10, 4)]
    assert all(d["gap"] == 0 and d["gates"] == [0.6, 0.4] and d["experts"] == [3, 8] for _, d in notes)
    whole = dict(parasim.run(get_lesson("moe16").reference, 1).marked[0])
    for _, d in notes:
        after, out = (np.asarray(whole[f"A.L{d['layer'] - 1}.{w}"]).reshape(8, -1)[5] for w in ("after-attn", "out"))
        assert d["norms"]["residual"] == pytest.approx(np.linalg.norm(after), rel=1e-9)
        assert d["norms"]["experts"] == pytest.approx(np.linalg.norm(out - after), rel=1e-9)
        assert d["norms"]["output"] == pytest.approx(np.linalg.norm(out), rel=1e-9)
    text = " ".join(walkthrough(moe16, width=100).split())
    for layer in (1, 2, 3, 4):
        assert f"layer {layer}: output = contract + 0.60 x E3(contract) + 0.40 x E8(contract): contract itself" in text
    assert "added to the token itself: the residual" in text  # the narrative says it before the note


def test_moe16_variants_names_the_replayed_phases_once():
    """The replayed layout's phases have no text of their own: one header and one line name them all (2
    micro-batches x 4 layers, forward and backward, then the gradient sync: 17), their events counted once."""
    lr = run_lesson(get_lesson("moe16-variants"))
    text = walkthrough(lr, width=100)
    walk = text.split("== tables")[0]
    heads = re.findall(r"^== (.*) ==$", walk, re.M)
    assert heads[0] == "data" and len(heads) == 2
    assert heads[1] == "forward mb1 layer 1 ... gradient sync: 17 phases with no text of their own"
    named = " ".join(walk.split("phases run, in order: ")[1].split("events in them")[0].split())
    phases = [p.strip() for p in re.sub(r"\s*\d+$", "", named).split(",")]
    assert sorted(phases) == sorted(
        [f"{d} mb{m} layer {n}" for d in ("forward", "backward") for m in (1, 2) for n in (1, 2, 3, 4)]
        + ["gradient sync"]
    )
    counted = int(re.search(r"(\d+) events in them", walk)[1])
    assert counted == sum(1 for e in lr.result.trace.events if e.phase != "data")


def test_only_runs_of_quiet_phases_fold_and_only_where_no_event_is_shown():
    said = {"a": "text", "d": "more text"}
    blocks = [("a", [1]), ("b", [2]), ("c", [3]), ("e", []), ("d", [4]), ("f", [5]), (None, [6])]
    folded = _quiet_runs(blocks, types.SimpleNamespace(events_shown=0, narrative=said))
    assert folded == [("a", [1]), (("b", "c"), [2, 3]), ("d", [4]), ("f", [5]), (None, [6])]
    assert _quiet_runs(blocks, types.SimpleNamespace(events_shown=2, narrative=said)) == blocks
    assert _quiet_runs(blocks, types.SimpleNamespace(events_shown=None, narrative=said)) == blocks

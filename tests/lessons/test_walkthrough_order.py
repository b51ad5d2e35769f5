"""The plain walk-through keeps the program's order: phases as a rank meets them, the ranks' notes in rank
order, compute said as one rank's work, no empty headings (issue 33, defects 5 and 11)."""
import re

import pytest

from conftest import cli


def _headings(text):
    return [line[3:-3] for line in text.splitlines() if line.startswith("== ") and line.endswith(" ==")]


def _steps(text):
    return [int(m.group(1)) for m in re.finditer(r"^step +(\d+) ", text, re.M)]


def test_collectives_steps_come_in_order():
    text = cli("lesson", "collectives", "--plain").stdout
    steps = _steps(text)
    assert steps == sorted(steps) and steps[:3] == [1, 2, 3]
    assert _headings(text)[:3] == ["all-reduce", "reduce-scatter", "all-gather"]
    assert " 1 reduce-scatter hops" not in text


def test_slot_tables_list_gpu_1_first():
    for lesson in ("pp-zero-bubble", "pp-vs-zero3"):
        text = cli("lesson", lesson, "--plain").stdout
        for block in text.split("\n== ")[1:]:
            # a long table is cut into blocks of slots, each listing the GPUs in order
            for part in re.split(r"^  slots \d+-\d+:$", block, flags=re.M):
                ranks = [int(r) for r in re.findall(r"^  rank (\d+): GPU", part, re.M)]
                if ranks:
                    assert ranks == sorted(ranks), (lesson, block.splitlines()[0], ranks)


def test_moe16_syncs_gradients_after_the_last_backward_and_says_cp_rank():
    text = cli("lesson", "moe16", "--plain").stdout
    heads = _headings(text)
    last_backward = max(i for i, h in enumerate(heads) if h.startswith("backward"))
    assert heads.index("gradient sync") > last_backward
    # every heading has something under it
    for block in text.split("\n== ")[1:]:
        body = [line for line in block.splitlines()[1:] if line.strip()]
        assert body, block.splitlines()[0]
    assert "attend to K/V of CP rank" in text and "K/V of rank" not in text
    assert re.search(r"^step +\d+  compute on rank \d+: .* \(\d[\d,]* FLOPs\)", text, re.M)
    assert not re.search(r"^step .*FLOPs.* on world\[", text, re.M)  # compute is no collective over the world


def test_figures_said_for_the_whole_run_carry_no_rank():
    """The estimator's lines (said once, by rank 0, for the run: note field run=True) are not "rank 0: ..."."""
    text = cli("lesson", "memory", "--plain").stdout
    assert "\n  27B over 8 DP ranks, ZeRO-1: 5.5 bytes per parameter" in text
    assert "rank 0: 27B over" not in text and "rank 0: one layer" not in text


def test_memory_prints_the_zero_stages_as_a_table():
    import json
    data = json.loads(cli("lesson", "memory", "--json").stdout)
    zero = next(t for t in data["tables"] if t["columns"][0] == "stage")
    params = 27e9  # the post's 27B model over 8 DP ranks: 2 + 2 + 12 bytes, divided by 8 stage by stage
    want = [16, 2 + 2 + 12 / 8, 2 + 14 / 8, 16 / 8]
    assert [r["bytes per parameter"] for r in zero["rows"]] == pytest.approx(want, rel=1e-3)
    assert [r["GB per GPU"] for r in zero["rows"]] == pytest.approx([w * params / 1e9 for w in want], rel=2e-2)
    assert "101.25" in cli("lesson", "memory", "--plain").stdout  # not cut to 101.2


def _trace(marks, events=()):
    from types import SimpleNamespace
    from parasim.comm.trace import Mark
    return SimpleNamespace(marks=[Mark(*m) for m in marks], events=list(events))


def test_phases_no_rank_shares_come_in_the_order_of_their_first_step():
    """Rank 1 mentions its phase first (it had nothing to wait for) but reaches it at step 5; rank 0's phase
    begins at step 1: with no rank in both, the earlier step leads."""
    from parasim.render.walkthrough import phase_order
    trace = _trace([(1, 5, "phase", "Q"), (0, 1, "phase", "P")])
    assert phase_order(trace) == [None, "P", "Q"]


def test_the_k_th_notes_of_every_rank_are_said_together_in_rank_order():
    from parasim.render.walkthrough import _phase_blocks
    trace = _trace([(0, 0, "phase", "P"), (0, 0, "note", "first of 0"), (0, 0, "note", "second of 0"),
                    (1, 0, "phase", "P"), (1, 0, "note", "first of 1"), (1, 0, "note", "second of 1")])
    (phase, items), = [b for b in _phase_blocks(trace) if b[0] == "P"]
    assert [it[-1] for it in items] == ["rank 0: first of 0", "rank 1: first of 1", "rank 0: second of 0",
                                        "rank 1: second of 1"]


def test_a_big_groups_event_shows_its_first_and_last_members_and_sums_up_many_chunks():
    """An all-to-all over 16 ranks, rank r sending r + 1 rows of 3 to each: the walk-through writes ranks
    0-7 and 14-15 out, one line for ranks 8-13 (what they sent and received, lowest to highest), and each
    member's 16 chunks as one count with the range of their rows."""
    import parasim
    from parasim.render.walkthrough import event_lines

    def program(ctx):
        ctx.comm.all_to_all([ctx.xp.zeros((ctx.rank + 1, 3)) for _ in range(ctx.world)])
    (event,) = parasim.run(program, 16).trace.events
    lines = list(event_lines(event))[1:]
    assert [ln.split()[1] for ln in lines[:8]] == [str(r) for r in range(8)]
    # rank r sends 15 chunks of (r + 1) x 3 float64 values (its own stays); it receives rows 1..16 but its own
    sent = {r: 15 * (r + 1) * 3 * 8 for r in range(16)}
    recv = {r: (sum(range(1, 17)) - (r + 1)) * 3 * 8 for r in range(16)}
    assert lines[8] == (f"    ... ranks 8 to 13 (6): sent {sent[8]:,} B to {sent[13]:,} B, recv {recv[13]:,} B to "
                        f"{recv[8]:,} B")
    assert [ln.split()[1] for ln in lines[9:]] == ["14", "15"]
    assert "16 x float64[1, 3] -> 16 x float64[1..16, 3]" in lines[0]


@pytest.mark.parametrize("name", ["moe16", "tp-across-nodes", "checkpoint"])
def test_calls_alike_on_other_groups_are_said_once_and_none_is_lost(name):
    """Issue 53 (walls of text): a step's calls that did the same on other groups or ranks (the TP all-gather in
    each TP pair, the CP ring's passes) are printed once, with a line naming the others; counted back here from
    the text, every event of the run is still there."""
    from parasim.lesson import get_lesson, run_lesson
    from parasim.render.walkthrough import walkthrough

    lr = run_lesson(get_lesson(name))
    text = walkthrough(lr, width=100)
    heads = len(re.findall(r"^step +\d+ ", text, re.M))
    more = sum(int(n) for n in re.findall(r"^    \.\.\. and the same call on (\d+) more", text, re.M))
    more += sum(int(n) for n in re.findall(r"^    \.\.\. and (\d+) more transfers? like it", text, re.M))
    more += sum(len(r.split(", ")) for r in re.findall(r"^    \.\.\. and the same work on ranks? ([\d, ]+)", text, re.M))
    # a lesson that shows a phase's first events (checkpoint's training) counts the rest in one line
    more += sum(int(n) for n in re.findall(r"^    \.\.\. and (\d+) more events in this phase", text, re.M))
    assert heads + more == len(lr.result.trace.events)
    assert heads < len(lr.result.trace.events)  # something was folded
    if name == "moe16":
        # it was 2,866 lines (heads too long for 100 columns take two); its tables at the end (step 5's groups,
        # bytes by link) take some 50 of these
        assert len(text.splitlines()) < 1450
        assert "... and the same call on 3 more tp groups: [2, 3], [4, 5], [6, 7]" in text


def test_a_long_slot_table_is_a_grid_cut_into_blocks_of_slots_that_fit():
    """pp-zero-bubble's 1F1B table runs 66 slots: at 100 columns each row holds 27 of them, cells aligned in
    columns, each block headed by its slots; together the blocks hold every slot of every row once."""
    text = cli("lesson", "pp-zero-bubble", "--plain", "--width", "100").stdout
    block = text.split("== 1F1B: the schedule ==")[1].split("\n== ")[0]
    heads = re.findall(r"^  slots (\d+)-(\d+):$", block, re.M)
    assert heads[0] == ("1", "27") and all(int(b) + 1 == int(a) for (_, b), (a, _) in zip(heads, heads[1:]))
    rows = [line for line in block.splitlines() if line.startswith("  rank 0: GPU 1:")]
    assert all(len(line) <= 100 for line in block.splitlines() if line.startswith("  rank"))
    cells = [c for line in rows for c in line[len("  rank 0: GPU 1:"):].split()]
    assert len(cells) == int(heads[-1][1])
    # the cells sit in columns: a row's n-th cell starts where every other row's does
    grid = [line[len("  rank 0: GPU 1: "):] for line in block.splitlines() if line.startswith("  rank")]
    assert all(m.start() % 3 == 0 for line in grid for m in re.finditer(r"\S+", line))  # 2-wide cells, 1 apart

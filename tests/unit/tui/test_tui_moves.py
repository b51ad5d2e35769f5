"""The app's 'what moves' panel (issue 33, build item 6): who sends how many bytes to whom at the selected
event, worked out here from each member's tensors and the ring's byte formula, not from the panel's code."""
from math import prod

from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.moves import moves
from parasim.tui.view import View

ITEM = {"float64": 8, "float32": 4}


def events(name: str):
    return run_lesson(get_lesson(name)).result.trace.events


def test_a_ring_all_reduce_sends_2_t_minus_1_over_t_of_the_buffer_to_the_next_rank():
    e = next(e for e in events("collectives") if e.algo == "ring" and e.op == "all_reduce")
    t = len(e.group.ranks)
    tensor = e.members[0].ins[0]
    each = 2 * (t - 1) * prod(tensor.shape) * ITEM[tensor.dtype] // t  # NCCL's ring: 2(t-1)/t of the buffer
    lines = moves(e)
    ranks = list(e.group.ranks)
    for i, r in enumerate(ranks):
        assert f"rank {r} → rank {ranks[(i + 1) % t]}   {each:,} B" in lines
    assert f"in all: {t * each:,} B in {t} transfers" in lines
    assert any("t shows each step" in line for line in lines)


def test_the_moe_dispatch_is_a_matrix_of_what_each_rank_sends_each_other():
    e = next(e for e in events("moe16") if e.op == "all_to_all")
    ranks = list(e.group.ranks)
    lines = moves(e)
    start = lines.index("bytes sent (rows: from rank; columns: to rank)")
    rows = lines[start + 2:start + 2 + len(ranks)]
    for s, row in zip(ranks, rows):
        member = e.member(s)
        # chunk j of sender s goes to member j; its bytes from its shape (float64); its own chunk stays
        want = ["·" if j == i else f"{prod(t.shape) * ITEM[t.dtype]:,}"
                for i in [ranks.index(s)] for j, t in enumerate(member.ins)]
        assert row.split()[2:] == want, (row, want)
    assert f"in all: {sum(m.sent for m in e.members):,} B" in lines[-1]


def test_a_point_to_point_send_is_one_line_and_compute_moves_nothing():
    evs = events("pp-1f1b")
    send = next(e for e in evs if e.kind == "p2p")
    src, dst = send.members[0].rank, send.members[1].rank
    assert f"rank {src} → rank {dst}   {send.members[0].sent:,} B" in moves(send)
    compute = next(e for e in events("tp-mlp") if e.kind == "compute")
    assert moves(compute) is None


async def test_the_panel_shows_at_100x30_on_the_dispatch():
    lr = run_lesson(get_lesson("moe16"))
    view = View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)
    at = next(i for i, e in enumerate(view.events) if e.op == "all_to_all")
    app = ParasimApp(view, start=at)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        panel = app.query_one("#moves")
        assert panel.display and "bytes sent (rows: from rank" in str(panel.render())
        compute = next(i for i, e in enumerate(view.events) if e.kind == "compute")
        await pilot.press("g", *str(view.visible.index(compute) + 1), "enter")
        await pilot.pause()
        assert not panel.display

"""The at-scale lesson: the post's figures at their real sizes from symbolic runs. Expected values are the
post's parameters multiplied out here, or the estimator's own formulas (which the runs are held against)."""
import json

import pytest

from parasim.lesson import get_lesson, run_lesson
from tests.conftest import cli


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("at-scale"))


def test_every_check_holds_and_the_runs_were_symbolic(lr):
    assert lr.result.trace.backend == "symbolic"
    assert len(lr.checks) == 20 and all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]


def test_token_copies_are_the_posts(lr):
    (copies,) = [c for c in lr.checks if c.name.startswith("(token, expert) pairs")]
    assert copies.got == [2 * 4096 * 8, 4096 * 8] == [65_536, 32_768]


def test_the_all_to_all_counts(lr):
    by_name = {c.name.split(":")[0]: c for c in lr.checks}
    mb = next(c for n, c in by_name.items() if n.startswith("the post's one-direction all-to-all"))
    assert mb.expected == round(4096 * 8 * 7168 * 2 * 7 / 8 / 1e6) == 411 and abs(mb.got - 411) <= 8
    sent = next(c for n, c in by_name.items() if n.startswith("what the run sends instead"))
    assert all(b % ((7168 + 32) * 2) == 0 for b in sent.got)  # whole rows of a token and 32 gates
    assert all(b < 28_672 * 7168 * 2 for b in sent.got)  # fewer than the pairs' bytes at 7/8 of T x K


def test_the_27b_rows_reach_the_posts_lengths(lr):
    rows = [c for c in lr.checks if c.name.startswith("27B, ")]
    assert len(rows) == 9
    longest = max(int(c.name.split(" at ")[1].split(" tokens")[0].replace(",", "")) for c in rows)
    assert 800_000 < longest < 840_000  # the post's 820K for TP8 + SP + CP2 + full recompute


def test_real_ranks_refuse_it_and_check_says_why():
    out = cli("run", "at-scale", "--backend", "gloo", "--nproc", "8")
    assert out.returncode == 2 and "real ranks cannot run it" in out.stderr
    out = cli("check", "at-scale", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["first_divergence"] is None and d["compared"] == 0


def test_ep_beside_tp_and_zero3_by_hand(lr):
    """Issue 53, item 6: the post's EP comparisons, from the run, each worked out here from the post's T, d, K,
    EP and DeepSeek-V3's expert width (two matrices a run's expert)."""
    T, d, K, E, F, ep, b = 4096, 7168, 8, 256, 2048, 8, 2
    (table,) = [t for t in lr.tables if t.title.startswith("What one GPU sends for one MoE layer")]
    rows = {name: cells for name, cells in table.rows}
    post = 2 * T * K * d * b * (ep - 1) / ep
    assert rows["EP: dispatch + combine, forward"][1] == round(post / 1e9, 3) == 0.822  # "about 0.8 GB"
    assert rows["TP 8: two all-reduces of the activations, forward"] == [round(2 * T * d * b * 2 * 7 / 8 / 1e9, 3)] * 2
    assert rows["ZeRO-3: this layer's experts gathered to every GPU"][0] == round((ep - 1) * E // ep * 2 * d * F * b / 1e9, 3)
    trace = lr.result.trace
    a2a = [e for e in trace.events if e.op == "all_to_all" and e.phase == "EP 8 dispatch"]
    forward = sum(m.sent for e in a2a if "backward" not in e.label for m in e.members)
    backward = sum(m.sent for e in a2a if "backward" in e.label for m in e.members)
    assert len(a2a) == 4 and backward == forward  # the post: "backward doubles it"
    gpu0 = {way: sum(e.member(0).sent for e in a2a if ("backward" in e.label) == (way == "backward"))
            for way in ("forward", "backward")}
    assert [rows["EP: dispatch + combine, forward"][0], rows["EP: the same two, backward"][0]] == [
        round(gpu0["forward"] / 1e9, 3), round(gpu0["backward"] / 1e9, 3)]
    assert rows["EP: dispatch + combine, forward"][0] < rows["EP: dispatch + combine, forward"][1]  # merged tokens


def _gb(n):
    return round(n / 1e9, 3)


def test_the_27b_layouts_are_a_table_of_the_run_against_the_estimator(lr):
    """The 27B part is a table the walk-through prints: one row per layout of the estimator's nine, in its
    order, each at the sequence its check ran, the run's figures beside the estimator's (called here)."""
    from parasim.estimate import Plan, get_model
    from parasim.estimate.fit import LONGEST_ROWS
    from parasim.estimate.memory import layer_saved_bytes
    from parasim.estimate.models import layer_param_count
    from parasim.train.differences import as_run

    (table,) = [t for t in lr.tables if t.title.startswith("One layer of the 27B model")]
    assert [label for label, _ in table.rows] == [label for _, label, _ in LONGEST_ROWS]
    rows = {label: dict(zip(table.columns[1:], cells)) for label, cells in table.rows}
    model = get_model("27b")
    for c in (c for c in lr.checks if c.name.startswith("27B, ")):
        label, seq = c.name[5:].split(", one layer at ")[0], int(c.name.split(" at ")[1].split(" tokens")[0].replace(",", ""))
        row = rows[label]
        (kept,), (work,), (params,) = c.got
        assert row["seq (tokens)"] == seq
        # one figure per quantity: the run's, which is the estimator's too ('same as est.', and the check)
        assert [row["kept (GB)"], row["recomp. (GB)"], row["weights (M)"]] == [
            _gb(kept), _gb(work), round(params / 1e6, 2)]
        assert [row["kept (GB)"], row["recomp. (GB)"]] == [_gb(x) for (x,) in c.expected[:2]]
        kw = next(kw for _, lab, kw in LONGEST_ROWS if lab == label)
        assert row["weights (M)"] == round(layer_param_count(model.hidden, model.heads, model.kv, model.ffn_size,
                                                             kw["tp"], model.bias) / 1e6, 2)
        if set(kw) <= {"tp", "sp", "dp", "pp"}:  # no CP, no recomputation: the estimator's saved bytes as they are
            plan = Plan(**kw)
            est = layer_saved_bytes(model.hidden, model.heads, model.kv, model.ffn_size, seq, 1, plan.tp, plan.sp,
                                    plan.cp, dropout=as_run(plan).dropout)
            assert row["kept (GB)"] == row["recomp. (GB)"] == _gb(est)
        assert row["same as est."] is c.ok is True
    assert table.columns == ["layout", "seq (tokens)", "kept (GB)", "recomp. (GB)", "weights (M)", "same as est."]
    recompute = rows["TP8 + SP + full recompute"]
    assert recompute["kept (GB)"] < recompute["recomp. (GB)"]  # only the input kept; the layer redone


def test_the_no_sp_all_to_alls_are_on_the_tp_pair_which_is_the_ep_group_and_the_text_says_so(lr):
    """In the TP 2 phases the layer's 256 experts are split over the pair (EP 2, 128 each): a dispatch row is
    7,168 values and 128 gates, over 2 GPUs; the narrative says the pair is the EP group."""
    rows = {(e.group.name, len(e.ranks), t.shape[1]) for e in lr.result.trace.events
            if e.op == "all_to_all" and e.phase == "MoE under TP 2, without SP" and "dispatch" in e.label
            for m in e.members for t in m.ins}
    assert rows == {("tp", 2, 7168 + 128)}
    text = " ".join(get_lesson("at-scale").narrative["MoE under TP 2, without SP"].split())
    assert "the pair is also the layer's EP group" in text and "split EP 2" in text and "128 on each" in text


@pytest.mark.parametrize("width", [100, 200])
def test_the_27b_table_reads_across_the_page(lr, width):
    """At 100 and 200 columns the table is printed as it is (not turned, not in blocks): each layout's line
    holds its eight cells, as the table has them."""
    from parasim.render.tables import cell

    text = cli("lesson", "at-scale", "--plain", "--width", str(width)).stdout
    table = text[text.index("One layer of the 27B model"):text.index(" events over ")]
    assert max(map(len, text.splitlines())) <= width
    assert "turned to fit" not in table and "(column" not in table
    (t,) = [t for t in lr.tables if t.title.startswith("One layer of the 27B model")]
    for label, cells in t.rows:
        (line,) = [line for line in table.splitlines() if line.startswith(f"  {label}  ")]
        assert line[2 + len(label):].split() == [cell(v) for v in cells] and cells[-1] is True

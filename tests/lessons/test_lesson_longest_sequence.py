"""longest-sequence as a learner reads it: the nine layouts printed once, recomputation's gain over both
baselines side by side (the post's "about 8x" is over TP8 + SP), TP4 + SP + CP2's activations set beside
TP8 + SP's, and why the small layer's bytes table sits in this lesson. Expected figures are worked out here
from the table's own token counts and the 27B model's shape, not read from the lesson's notes."""
import pytest

from parasim.estimate import get_model
from parasim.lesson import get_lesson, run_lesson
from parasim.render.walkthrough import walkthrough


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("longest-sequence"))


@pytest.fixture(scope="module")
def text(lr):
    return walkthrough(lr, width=100)


def _longest(lr):
    (table,) = [t for t in lr.tables if t.title.startswith("The longest sequence")]
    return table, {label: dict(zip(table.columns[1:], cells)) for label, cells in table.rows}


def test_recomputation_s_gain_is_shown_over_tp8_and_over_tp8_with_sp(lr, text):
    table, rows = _longest(lr)
    rec, sp, tp8 = (rows[k]["longest (tokens)"] for k in ("TP8 + SP + full recompute", "TP8 + SP", "TP8"))
    over_sp, over_tp8 = round(rec / sp, 1), round(rec / tp8, 1)
    assert 7.5 < over_sp < 8.5 < over_tp8  # the post's "about 8x" is the gain over TP8 + SP
    assert (rows["TP8 + SP + full recompute"]["x TP8"], rows["TP8 + SP + full recompute"]["x TP8 + SP"]) == \
        (over_tp8, over_sp)
    words = " ".join(text.split())
    assert f"its gain is {over_sp}x ({rec:,} over {sp:,} tokens)" in words and f"it is {over_tp8}x" in words
    assert f"({over_tp8}x TP8 alone)" not in words  # the one base the lesson once gave


def test_the_layouts_are_printed_once_as_a_table(lr, text):
    _, rows = _longest(lr)
    before_tables = text[:text.index("== tables")]
    for label, row in rows.items():
        assert f"{row['longest (tokens)']:,}" not in before_tables, label  # once listed as notes too
        assert sum(line.strip().startswith(label + "  ") for line in text.splitlines()) == 1, label


def test_tp4_with_cp2_keeps_tp8_with_sp_s_activations_per_token(lr, text):
    """34 sbh a layer split 4 ways over half the tokens is 34 sbh split 8 ways: per token of the sequence a
    GPU keeps 34 x h x L / 8 bytes (bf16, 60 layers of h = 6144) under both layouts."""
    model = get_model("27b")
    mb = f"{34 * model.hidden * model.layers / 8 / 1e6:.2f} MB"
    words = " ".join(text.split())
    assert f"TP4 + SP + CP2 {mb}, TP8 + SP {mb}" in words
    (c,) = [c for c in lr.checks if c.name.startswith("TP4 + SP + CP2 keeps the activations per token")]
    assert c.ok and c.got == pytest.approx(34 * model.hidden * model.layers / 8, rel=1e-12)


def test_the_small_layer_s_bytes_table_says_why_it_is_here(lr):
    (table,) = [t for t in lr.tables if t.title.startswith("Bytes rank 0 sent")]
    assert any(n.startswith("why here:") and "SP buys" in n for n in table.notes)


def test_why_pp_buys_no_length_is_said_with_the_estimator_s_figures(lr, text):
    """Under 1F1B stage 1 of TP2 + SP + PP4 holds p = 4 micro-batches of L/p = 15 layers: all 60 layers'
    activations at TP 2's share, 34 h / 2 bytes a layer and token, 4x what TP8 + SP keeps (34 h / 8). Worked out
    from the 27B model's shape."""
    model = get_model("27b")
    L, h = model.layers, model.hidden
    pp4, sp = L * 34 * h / 2, L * 34 * h / 8
    words = " ".join(text.split())
    assert f"holds 4 micro-batches at once, each with its own {L // 4} layers' activations: 4 x {L // 4} = {L}" \
        in words
    assert f"it holds {pp4 / 1e6:.2f} MB against {sp / 1e6:.2f} MB ({pp4 / sp:.1f}x)" in words
    assert f"holds 2 x {L // 2} = {L} layers at TP 8's share, {sp / 1e6:.2f} MB a token" in words
    (c,) = [c for c in lr.checks if c.name.startswith("... because 1F1B keeps p micro-batches")]
    assert c.ok and c.got == pytest.approx([pp4, sp, sp], rel=1e-9)


def test_the_default_tp_is_said_not_to_be_the_post_s(text):
    """The small layer runs at TP 4 by default; the post's one-node baseline is TP 8: the settings line says so
    and never calls 4 the post's."""
    head = " ".join(text.split("\n== ")[0].split())
    assert "settings: --tp 4 (the lesson's defaults; the post's is --tp 8" in head
    assert "(the post's)" not in head

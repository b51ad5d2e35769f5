"""Layers mark what they make (`Saved(tag=...)`), pieces that hold rows of a whole go back to their rows, and
`parasim check` compares a split run with the unsplit model or with the same program on another layout,
naming the collective inside a layer that broke it. Expected names, groups and labels are written out."""
import json
import textwrap

import numpy as np
import pytest

import parasim
from parasim.engine.divergence import assemble, collect, first_divergence
from parasim.errors import UsageError
from parasim.lesson import get_lesson
from parasim.nn import ParallelContext
from tests.conftest import cli

KEEP = 10 ** 6
SEQS = "ABCD"  # the moe16 example's sequences: replica 0 runs A and B, replica 1 C and D
LAYERS = 4


def test_rows_go_back_to_their_positions():
    a = np.arange(8.0).reshape(4, 2)
    zigzag = assemble("Replicate()", (0, 1), {0: a[[0, 3]], 1: a[[1, 2]]}, {0: (0, 3), 1: (1, 2)}, 4)
    assert np.array_equal(zigzag, a)
    # two CP slices, each split by columns over a TP pair: members with the same rows first, then the rows
    pieces = {0: a[:2, :1], 1: a[:2, 1:], 2: a[2:, :1], 3: a[2:, 1:]}
    rows = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    assert np.array_equal(assemble("Shard(1)", (0, 1, 2, 3), pieces, rows, 4), a)
    assert np.array_equal(assemble("Shard(1)", (1, 0, 3, 2), pieces, rows, 4), a[:, ::-1])  # group order counts
    missing = assemble("Replicate()", (0,), {0: a[:2]}, {0: (0, 1)}, 4)
    assert np.array_equal(missing[:2], a[:2]) and np.isnan(missing[2:]).all()
    ints = assemble("Replicate()", (0,), {0: np.arange(2)}, {0: (1,) * 0 + (0, 1)}, 2)
    assert ints.dtype == np.float64  # integers are compared as floats, so a missing row can be NaN


def _rows_program(bad: int | None = None, skip: tuple[int, ...] = ()):
    """4 ranks: two CP slices (zigzag: positions 0, 1, 6, 7 and 2, 3, 4, 5), each held whole by a TP pair."""
    def program(ctx):
        pairs = [ctx.new_group([0, 1], "tp"), ctx.new_group([2, 3], "tp")]
        whole = ctx.shared_rng("x").normal((8, 3))
        rows = [[0, 1, 6, 7], [2, 3, 4, 5]][ctx.rank // 2]
        piece = whole[rows] + (0.5 if ctx.rank == bad else 0.0)
        if ctx.rank not in skip:
            ctx.mark("x", piece, "Replicate()", pairs[ctx.rank // 2], rows=rows, size=8)
    return program


def _whole(ctx):
    ctx.mark("x", ctx.shared_rng("x").normal((8, 3)))


def _diverge(program, world, reference=_whole, ref_world=1):
    return first_divergence(parasim.run(program, world, keep_values=KEEP),
                            parasim.run(reference, ref_world, keep_values=KEEP))


def test_row_pieces_from_several_groups_make_one_tensor():
    result = parasim.run(_rows_program(), 4, keep_values=KEEP)
    (entry,) = collect(result.trace, result.marked)["x"]
    assert entry.group == (0, 1, 2, 3) and entry.size == 8 and entry.rows[3] == (2, 3, 4, 5)
    assert _diverge(_rows_program(), 4) is None


def test_a_wrong_copy_of_some_rows_is_found():
    d = _diverge(_rows_program(bad=3), 4)
    assert d["name"] == "x" and d["copies_differ"] and d["marked_on"] == "ranks[0, 1, 2, 3] by rows"
    assert d["max_abs"] == pytest.approx(0.5)
    d = _diverge(_rows_program(bad=2), 4)  # the copy written first is wrong: the whole still differs
    assert d["copies_differ"] and d["max_abs"] == pytest.approx(0.5)


def test_rows_nobody_marked_compare_as_wrong():
    d = _diverge(_rows_program(skip=(2, 3)), 4)
    assert d["name"] == "x" and d["max_abs"] == float("inf")


@pytest.mark.parametrize("rows, size, word", [([0, 1], 8, "one position"), ([0, 1, 2, 8], 8, "in \\[0, 8\\)"),
                                              ([-1, 0, 1, 2], 8, "one position")], ids=["few", "past", "neg"])
def test_rows_must_fit_the_tensor(rows, size, word):
    def program(ctx):
        ctx.mark("x", ctx.asarray(np.zeros((4, 2))), rows=rows, size=size)
    with pytest.raises(UsageError, match=f"mark 'x' at [^:]+:[0-9]+: rows must give {word}" if word == "one position" else word):
        parasim.run(program, 1)


def _moe16(bug=None, monkeypatch=None):
    lesson = get_lesson("moe16")
    if bug is not None:
        monkeypatch.setattr(ParallelContext, bug[0], bug[1])
    return first_divergence(parasim.run(lesson.program, 16, keep_values=KEEP),
                            parasim.run(lesson.reference, 1, keep_values=KEEP))


def test_moe16_layers_mark_every_activation_and_gradient():
    lesson = get_lesson("moe16")
    result = parasim.run(lesson.program, 16, keep_values=KEEP)
    names = set(collect(result.trace, result.marked))
    want = {f"{s}.L{i}.{what}" for s in SEQS for i in range(LAYERS)
            for what in ("after-attn", "out", "after-attn.grad", "in.grad")}
    want |= {f"{s}.layer {i + 1}.attn.out.out" for s in SEQS for i in range(LAYERS)}  # the row-parallel projection
    assert names == want
    assert first_divergence(result, parasim.run(lesson.reference, 1, keep_values=KEEP)) is None


def test_a_wrong_reduce_scatter_inside_attention_is_named(monkeypatch):
    scatter = ParallelContext.scatter_seq

    def off(self, y, label):  # forward's reduce-scatter, 0.1% off
        out = scatter(self, y, label)
        return out * 1.001 if "backward" not in label else out
    d = _moe16(("scatter_seq", off), monkeypatch)
    assert d["name"] in ("A.layer 1.attn.out.out", "C.layer 1.attn.out.out")
    assert (d["op"], d["group"].split("[")[0], d["label"]) == ("reduce_scatter", "tp",
                                                               "layer 1.attn.out: reduce-scatter the sequence")
    assert d["max_rel"] == pytest.approx(1e-3, rel=0.05)


def test_a_wrong_gather_in_backward_is_named(monkeypatch):
    gather = ParallelContext.gather_seq

    def off(self, x, label):
        out = gather(self, x, label)
        return out * 1.001 if "attn.out backward" in label else out
    d = _moe16(("gather_seq", off), monkeypatch)
    assert d["name"].endswith(".L3.in.grad") and d["op"] == "all_gather" or d["op"] == "reduce_scatter"
    assert d["name"].split(".")[0] in SEQS and d["name"].endswith(".grad")


def test_the_reference_can_be_the_same_program_on_another_layout():
    out = cli("check", "moe16", "--reference-layout", "tp=1,pp=2,ep=2,dp=2", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr
    assert d["first_divergence"] is None and d["compared"] == 80
    assert d["reference"] == "the same program on tp=1,pp=2,ep=2,dp=2"
    text = cli("check", "moe16-variants", "--reference-layout", "tp=2,cp=2,sp,ep=2,dp=2,zigzag")
    assert text.returncode == 0 and "80 marked tensor(s) agree with the same program on tp=2,cp=2,sp,ep=2,dp=2,zigzag" \
        in text.stdout


@pytest.mark.parametrize("args, message", [
    (["moe16", "--reference-layout", "4"], "moe16 is built on a layout: give its sizes"),
    (["moe16", "--reference-layout", "tp=x"], "layout sizes are tp=N, cp=N"),
    (["moe16", "--reference-layout", "tp=3"], "heads 4 do not divide by tp 3"),
    (["moe16", "--reference-layout", "dp=3"], "do not split evenly over dp 3"),
    (["moe16", "--reference-layout", ","], "needs a world size N or sizes"),
    (["tp-attention", "--reference-layout", "tp=2"], "adapts to the world size alone"),
    (["tp-attention", "--reference-layout", "3"], "runs on 1, 2, 4, 8, 16 ranks, not 3"),
    (["moe16", "--reference-layout", "tp=1", "--reference", "x.py:f"], "--reference or --reference-layout"),
], ids=["world", "bad", "heads", "dp", "empty", "sizes", "ranks", "both"])
def test_bad_reference_layouts_get_one_line(args, message):
    out = cli("check", *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_sequence_parallel_marks_without_cp_agree_with_the_lessons_layout():
    """The reference on TP + SP without CP: each rank marks its SP share of the sequence (rows r*n .. of n*t),
    not CP slices, and those rows must fall where moe16's own layout (CP 2) puts them."""
    out = cli("check", "moe16", "--reference-layout", "tp=2,sp,pp=2,ep=2,dp=2", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["first_divergence"] is None and d["compared"] == 80, out.stderr


def test_a_users_program_is_checked_against_itself_on_fewer_ranks(tmp_path):
    out = cli("check", "examples/my_tp.py:program", "--world", "2", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["reference"] == "the same program on 1 rank" and d["compared"] == 2
    assert d["first_divergence"] is None
    out = cli("check", "examples/my_tp.py:program", "--world", "4", "--reference-layout", "2")
    assert out.returncode == 0 and "2 marked tensor(s) agree with the same program on 2 ranks" in out.stdout
    wrong = tmp_path / "wrong.py"
    wrong.write_text(textwrap.dedent("""
        def program(ctx):
            tp = ctx.new_group(range(ctx.world), "tp")
            x = ctx.shared_rng("x").normal((2, 4))
            w = ctx.shared_rng("w").normal((4, 2))
            rows = slice(ctx.rank * 4 // ctx.world, (ctx.rank + 1) * 4 // ctx.world)
            y = x[:, rows] @ w[rows]  # a partial sum: the all-reduce is missing
            ctx.mark("y", y, "Replicate()", tp)
    """))
    out = cli("check", f"{wrong}:program", "--world", "2", "--json")
    d = json.loads(out.stdout)["first_divergence"]
    assert out.returncode == 1 and d["name"] == "y" and d["event"] is None
    assert d["would_match"] == "summing these pieces over tp (they are partial sums) would match"


def _pairs_program(order=((0, 1), (3, 2)), copies=False):
    """Two TP pairs (the second listed 3, 2), each holding a column block (or, with `copies`, the whole)
    of rows 0-1 and rows 2-3 of one 4 x 4 tensor, marked Shard(1) over its pair with the rows."""
    def program(ctx):
        pairs = [ctx.new_group(list(order[0]), "tp"), ctx.new_group(list(order[1]), "tp")]
        whole = ctx.shared_rng("x").normal((4, 4))
        mine = pairs[0] if ctx.rank in order[0] else pairs[1]
        rows = [0, 1] if ctx.rank in order[0] else [2, 3]
        part = mine.group_rank(ctx.rank)
        piece = whole[rows] if copies else whole[rows][:, part * 2:(part + 1) * 2]
        ctx.mark("x", piece, "Shard(1)", mine, rows=rows, size=4)
    return program


def test_each_groups_members_keep_their_own_order():
    result = parasim.run(_pairs_program(), 4, keep_values=KEEP)
    (entry,) = collect(result.trace, result.marked)["x"]
    assert entry.group == (0, 1, 3, 2)  # the second pair as it was made: rank 3 holds the first columns
    assert _diverge(_pairs_program(), 4, lambda ctx: ctx.mark("x", ctx.shared_rng("x").normal((4, 4)))) is None


def test_whole_copies_marked_as_shards_are_named():
    d = _diverge(_pairs_program(copies=True), 4, lambda ctx: ctx.mark("x", ctx.shared_rng("x").normal((4, 4))))
    assert d["name"] == "x" and d["would_match"] == "taking them as whole copies on tp would match"


def test_the_report_has_exactly_its_fields():
    d = _diverge(_rows_program(bad=3), 4)
    assert set(d) == {"name", "placement", "marked_on", "event", "op", "group", "label", "ranks", "site", "max_abs",
                      "max_rel", "tolerance", "allowance", "copies_differ", "would_match", "got", "want",
                      "received_at", "transfer", "nan", "rows_missing"}


def test_copies_that_already_differed_after_the_collective_are_not_blamed_on_a_draw():
    def program(ctx):
        tp = ctx.new_group([0, 1], "tp")
        x = ctx.shared_rng(f"x{ctx.rank}").normal((4, 2))
        y = ctx.comm.reduce_scatter(x, dim=0, group=tp, label="each keeps its half")  # different on each
        ctx.mark("y", y, "Replicate()", tp)  # wrongly marked as copies

    def ref(ctx):
        ctx.mark("y", (ctx.shared_rng("x0").normal((4, 2)) + ctx.shared_rng("x1").normal((4, 2)))[:2])
    d = first_divergence(parasim.run(program, 2, keep_values=KEEP), parasim.run(ref, 1, keep_values=KEEP))
    assert d["copies_differ"] and d["op"] == "reduce_scatter" and d["would_match"] is None


@pytest.mark.parametrize("tp, cp, sp, split, dp", [(2, 2, True, "zigzag", 1), (2, 2, False, "contiguous", 1),
                                                   (2, 1, True, "zigzag", 1), (2, 1, False, "zigzag", 1),
                                                   (1, 3, False, "zigzag", 1), (2, 1, True, "zigzag", 2)])
def test_a_dense_layers_marks_put_back_together_are_the_unsplit_layers(tp, cp, sp, split, dp):
    """A dense layer (column- and row-parallel matmuls) marks its matmul outputs, activations and gradients
    with its rows (CP slice, SP share) and placement over its TP pair; put back together they are the unsplit
    layer's own marks. With two data-parallel replicas on the same data each TP pair's pieces are one copy
    (put together over its own pair, not over every rank that marked the name)."""
    from parasim.layout import Layout, ModelSpec
    from parasim.nn import Saved
    from parasim.nn.layer import TransformerLayer, layer_weights
    shape = ModelSpec(hidden=8, heads=2, kv_heads=1, ffn=16, dropout=0.0)
    s, b = 2 * cp * tp, 1

    def program(ctx):
        split_run = ctx.world > 1
        t = ParallelContext(ctx, ctx.groups["tp"] if split_run and tp > 1 else None, sp=split_run and sp,
                            cp_group=ctx.groups["cp"] if split_run and cp > 1 else None, seq=s, cp_split=split)
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0")
        idx = ctx.xp.asarray(t.token_positions())
        x = ctx.xp.take(ctx.shared_rng("x").normal((s, b, shape.hidden)), idx, axis=0)
        dy = ctx.xp.take(ctx.shared_rng("dy").normal((s, b, shape.hidden)), idx, axis=0)
        y, cache = layer.forward(x, Saved(tag="A"))
        layer.backward(cache, dy)
    split_run = parasim.run(program, layout=Layout(tp=tp, cp=cp, dp=dp), keep_values=KEEP)
    whole = parasim.run(program, layout=Layout(), keep_values=KEEP)
    names = set(collect(split_run.trace, split_run.marked))
    assert {"A.L0.out", "A.L0.in.grad", "A.layer.attn.out.out", "A.layer.mlp.fc2.out"} <= names
    assert "A.layer.mlp.fc1.out" in names  # even columns: a column-parallel output has a placement
    assert first_divergence(split_run, whole) is None

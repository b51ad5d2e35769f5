"""`parasim check`: marked tensors put back together from their pieces, compared with a reference's, and
the first wrong one pinned on its collective with what would have matched. Expected names, groups, labels
and lines are written out here."""
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import parasim
from parasim.engine.divergence import assemble, first_divergence
from parasim.layout.placement import Shard, parse
from parasim.errors import UsageError
from tests.conftest import cli, cli_process

ROOT = Path(__file__).resolve().parents[2]
LESSON_FILE = ROOT / "lessons" / "silent_bugs.py"


def _line_of(path: Path, text: str) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


@pytest.mark.parametrize("bug, name, group, label_start, would", [
    ("expert-over-dp-cp", "expert", "dp-cp", "sum the expert's gradient",
     "all_reduce over dp or expert-dp instead of dp-cp would match"),
    ("dense-over-dp", "attn.grad", "dp", "sum the attention shard's gradient",
     "all_reduce over dp-cp instead of dp would match"),
    ("norm-not-over-tp", "norm.grad", "dp-cp", "sum the norm's gradient over dp-cp",
     "summing these pieces over tp (they are partial sums) would match"),
    ("clip-per-group", "dense.norm_sq", "dp-cp", "add up the squares of the dense gradient pieces",
     "all_reduce over world or tp-dp-cp instead of dp-cp would match"),
    ("dropout-per-rank", "dropout.", "tp", "sum the row-parallel output over tp",
     "the copies on tp were equal after 'sum the row-parallel output over tp' and differ here: what each rank did "
     "alone since then (a draw from its own random stream?) must be the same on all of tp (one stream shared by the "
     "group) to match"),
], ids=["expert-over-dp-cp", "dense-over-dp", "norm-not-over-tp", "clip-per-group", "dropout-per-rank"])
def test_each_silent_bug_is_named(bug, name, group, label_start, would):
    out = cli("check", "silent-bugs", "--bug", bug, "--json")
    assert out.returncode == 1, out.stderr
    d = json.loads(out.stdout)["first_divergence"]
    assert d["name"].startswith(name) and d["group"].split("[")[0] == group and d["op"] == "all_reduce"
    assert d["label"].startswith(label_start) and d["would_match"] == would
    # partial sums differ too, and so do norms summed over each TP shard's own group
    assert d["copies_differ"] == (bug in ("dropout-per-rank", "norm-not-over-tp", "clip-per-group"))
    call = {"norm-not-over-tp": "ctx.comm.all_reduce(norm, group=g[\"dp-cp\"]", "expert-over-dp-cp": "expert = ctx.comm",
            "dense-over-dp": "attn = ctx.comm", "clip-per-group": "total = ctx.comm", "dropout-per-rank": "act = ctx.comm"}[bug]
    assert d["site"] == f"lessons/silent_bugs.py:{_line_of(LESSON_FILE, call)}"
    assert d["max_rel"] > 0.1 and d["max_abs"] > 0.05  # a whole piece's worth, not rounding


def test_the_lesson_runs_one_bug_beside_the_right_groups():
    """expert-over-dp-cp, worked out from the layout: dp-cp groups {g0,g2,g4,g6} and {g1,g3,g5,g7} hold experts
    E1, E3 (EP ranks 0 and 2) and E2, E4 (1 and 3), each on two expert-dp ranks, so the bug hands E1's holders
    E1 + E3 of the one-device gradients (and so on). The attention and the norm are untouched; the right run's
    experts equal one device's; the table's note names check's first divergence as the command does."""
    from parasim.lesson import get_lesson, lesson_module, run_lesson

    mod = lesson_module("silent_bugs")
    lr = run_lesson(get_lesson("silent-bugs"))
    (table,) = [t for t in lr.tables if t.title.startswith("The right groups beside one bug")]
    rows = {label: dict(zip(table.columns[1:], cells)) for label, cells in table.rows}
    whole = dict(parasim.run(mod.reference, 1).marked[0])
    norm = lambda a: round(float(np.linalg.norm(a)), 3)  # noqa: E731
    e = [whole[f"expert{k}.grad"] for k in range(4)]
    for k, mixed in enumerate([e[0] + e[2], e[1] + e[3], e[0] + e[2], e[1] + e[3]]):
        row = rows[f"expert E{k + 1}"]
        assert row["held on"] == f"g{k},g{k + 4}"
        assert row["one device"] == row["right run"] == norm(e[k]) and row["bug's run"] == norm(mixed)
        assert row["right: error"] == "0" and float(row["bug: error"]) == pytest.approx(
            float(np.max(np.abs(mixed - e[k]))), rel=1e-2)
    assert rows["attention shard (TP rank 0)"]["bug: error"] == "0"
    assert rows["norm"]["held on"] == "g0-g7" and float(rows["norm"]["bug: error"]) < 1e-12
    d = json.loads(cli("check", "silent-bugs", "--bug", "expert-over-dp-cp", "--json").stdout)["first_divergence"]
    assert (f"'{d['name']}' (E4's, {d['placement']} on {d['marked_on']}): max abs error {d['max_abs']:.3g}"
            in table.notes[1]) and d["name"] == "expert3.grad"


@pytest.mark.parametrize("width", [60, 100])
def test_check_holds_its_report_to_the_width(width):
    """`--width N` wraps every line of the report at N (later lines of one indented), the words unchanged; into
    a pipe without it each line stays whole; below 60 is refused in one line."""
    out = cli("check", "silent-bugs", "--bug", "expert-over-dp-cp", "--width", str(width))
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= width and len(lines) > 4
    whole = cli("check", "silent-bugs", "--bug", "expert-over-dp-cp").stdout
    assert " ".join(out.stdout.split()) == " ".join(whole.split())
    assert max(map(len, whole.splitlines())) > 100  # the long lines it wraps
    assert lines[0].startswith("silent-bugs --bug") and all(line.startswith("  ") for line in lines[1:])
    bad = cli("check", "silent-bugs", "--width", "30")
    assert bad.returncode == 2 and "at least 60" in bad.stderr

def test_the_right_program_and_every_lesson_report_none():
    out = cli("check", "silent-bugs", "--json")
    d = json.loads(out.stdout)
    assert out.returncode == 0 and d["first_divergence"] is None and d["compared"] == 17
    assert all(c["ok"] for c in d["checks"])


@pytest.mark.slow
def test_every_lesson_checks_clean():
    """Every lesson that marks tensors with values agrees with its reference; of the symbolic lessons (no
    values to mark: check runs them and their own checks, as tests/e2e/test_strict_json.py does) one stands for
    all, the quickest."""
    from parasim.lesson import load_lessons
    lessons = load_lessons()
    symbolic = [n for n, lesson in lessons.items() if lesson.backend == "symbolic"]
    assert "fit-is-not-fast" in symbolic
    for name in [n for n in lessons if n not in symbolic] + ["fit-is-not-fast"]:
        out = cli("check", name, "--json")
        assert out.returncode == 0, (name, out.stdout[-400:], out.stderr)
        assert json.loads(out.stdout)["first_divergence"] is None, name


def test_pieces_are_put_back_together_by_their_placement():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0, 12.0).reshape(2, 3)
    assert np.array_equal(assemble("Shard(1)", (4, 5), {5: b, 4: a}), np.concatenate([a, b], axis=1))
    assert np.array_equal(assemble("Shard(0)", (5, 4), {5: b, 4: a}), np.concatenate([b, a], axis=0))
    assert np.array_equal(assemble("Partial()", (0, 1), {0: a, 1: b}), a + b)
    assert np.array_equal(assemble("Replicate()", (0, 1), {0: a, 1: b}), a)
    assert parse("Shard(-1)") == Shard(-1) and parse("Shard(dim=2)") == Shard(2)
    for bad in ("Shard()", "shard(0)", "Replicate", "Partial(0)", ""):
        with pytest.raises(UsageError, match="placement must be Shard"):
            parse(bad)


def test_a_bad_placement_fails_at_the_mark():
    def program(ctx):
        ctx.mark("x", ctx.asarray([1.0]), "Sharded(0)")
    with pytest.raises(UsageError, match="placement must be Shard"):
        parasim.run(program, 1)


def _tp_program(ctx, gather_dim):
    tp = ctx.new_group(range(ctx.world), "tp")
    x = ctx.shared_rng("x").normal((4, 6))
    mine = x[:, ctx.rank * 3:(ctx.rank + 1) * 3]
    ctx.mark("x", mine, "Shard(1)", tp)
    y = ctx.comm.all_gather(mine, dim=gather_dim, group=tp, label="gather the columns")
    ctx.mark("y", y, "Replicate()", tp)


def _reference(ctx):
    x = ctx.shared_rng("x").normal((4, 6))
    ctx.mark("x", x)
    ctx.mark("y", x)


def test_a_gather_along_the_wrong_dim_is_pinned_on_it():
    keep = 10 ** 6
    ref = parasim.run(_reference, 1, keep_values=keep)
    right = parasim.run(lambda ctx: _tp_program(ctx, 1), 2, keep_values=keep)
    assert first_divergence(right, ref) is None
    wrong = parasim.run(lambda ctx: _tp_program(ctx, 0), 2, keep_values=keep)
    d = first_divergence(wrong, ref)
    assert d["name"] == "y" and d["op"] == "all_gather" and d["label"] == "gather the columns"
    assert d["max_abs"] == float("inf")  # (8, 3) against (4, 6): not even the shape
    assert d["would_match"] is None


def test_copies_that_differ_are_a_divergence_even_when_the_first_is_right():
    def program(ctx):
        tp = ctx.new_group(range(2), "tp")
        x = ctx.shared_rng("x").normal((3,))
        ctx.comm.barrier(group=tp)
        ctx.mark("x", x if ctx.rank == 0 else x + 1.0, "Replicate()", tp)

    def ref(ctx):
        ctx.mark("x", ctx.shared_rng("x").normal((3,)))
    d = first_divergence(parasim.run(program, 2), parasim.run(ref, 1))
    assert d["name"] == "x" and d["max_abs"] == pytest.approx(1.0) and d["op"] == "barrier"


def test_a_users_program_is_checked_against_a_users_reference(tmp_path):
    src = tmp_path / "mine.py"
    src.write_text(textwrap.dedent("""\
        def program(ctx):
            dp = ctx.new_group(range(ctx.world), "dp")
            g = ctx.shared_rng(f"g{ctx.rank}").normal((3,))
            total = ctx.comm.all_reduce(g, op="max", group=dp, label="sum the gradients")  # the bug: max
            ctx.mark("grad", total, "Replicate()", dp)


        def reference(ctx):
            ctx.mark("grad", sum(ctx.shared_rng(f"g{r}").normal((3,)) for r in range(4)))
        """))
    out = cli("check", f"{src}:program", "--world", "4", "--json")
    assert out.returncode == 1, out.stderr
    d = json.loads(out.stdout)["first_divergence"]
    assert d["label"] == "sum the gradients" and d["site"].endswith(f"mine.py:{_line_of(src, 'the bug')}")
    out = cli("check", f"{src}:program", "--world", "4", "--reference", f"{src}:reference")
    assert out.returncode == 1 and f"first divergence from {src}:reference on 1 rank at 'grad'" in out.stdout
    assert "all_reduce with op=sum instead of op=max over dp would match" in out.stdout


@pytest.mark.parametrize("args, reason", [
    (["check", "silent-bugs", "--bug", "nope"], "silent-bugs has no variant 'nope'"),
    (["check", "silent-bugs", "--reference", "ref"], "--reference takes path/to/file.py:function"),
    (["check", "nosuchlesson"], "unknown lesson 'nosuchlesson'"),
], ids=["unknown-bug", "bad-reference", "unknown-lesson"])
def test_bad_check_input_is_one_line_and_exit_2(args, reason):
    out = cli(*args)
    assert out.returncode == 2 and reason in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.slow
def test_against_gloo_names_the_first_call_that_differs(tmp_path):
    src = tmp_path / "backend.py"
    src.write_text(textwrap.dedent("""\
        def program(ctx):
            x = ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), label="same everywhere")
            return ctx.xp.__name__  # which array library ran it: numpy here, torch on real ranks
        """))
    same = cli_process("check", f"{ROOT}/examples/my_tp.py:program", "--world", "2", "--against", "gloo", "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["first_divergence"] is None
    out = cli_process("check", f"{src}:program", "--world", "2", "--against", "gloo", "--json")
    assert out.returncode == 1, out.stderr
    d = json.loads(out.stdout)["first_divergence"]
    assert d["against"] == "gloo" and d["call"].startswith("rank 0: return value differs")
    assert "torch" in d["call"] and "numpy" in d["call"]

"""The checkpoint lesson: trained on TP2 x DP2 / EP4, saved, resumed on DP4 / EP2, trained on. Its checks
pass, its table says which slice each rank held, and resumed training lands where one device that ran
every step lands (a reference written here: every sequence, every expert, Adam by hand). Two mutations
of the resume (the data-parallel groups swapped, the ZeRO share's offset dropped) and the lesson's own
silent bug are caught against that reference. The checkpoint lives in a temporary folder that goes
away; with no writable one the lesson stops in one line."""
import errno
import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import pytest

import parasim
from parasim.dp import checkpoint
from parasim.dp.checkpoint_format import CheckpointReader
from parasim.errors import UsageError
from parasim.lesson import get_lesson, run_lesson
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import Stack, TransformerLayer, layer_weights
from tests.conftest import cli

LESSON_FILE = Path(__file__).resolve().parents[2] / "lessons" / "checkpoint.py"
WEIGHTS_CHECK = "every weight on every rank of B after step 4 = one device's"
RESTORED_CHECK = "the state each rank of B restored = one device's after step 2, cut to its shares"


@pytest.fixture
def lesson():
    """A fresh copy of the lesson's module, so a test may patch it."""
    spec = importlib.util.spec_from_file_location("checkpoint_lesson_under_test", LESSON_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_device(mod, steps: int) -> dict:
    """Written here, apart from the lesson: one rank, every sequence of every step, every expert whole, and
    Adam (bias-corrected) by hand. Returns the losses, the weights and moments after step 2, the weights
    at the end."""
    model, lr, (b1, b2), eps, n = mod.MODEL, mod.LR, mod.BETAS, mod.EPS, mod.SEQUENCES

    def data(ctx, what, step):
        return np.concatenate([ctx.shared_rng(f"{what}{step}.{i}").normal((model.seq, 1, model.hidden))
                               for i in range(n)], axis=1)

    def program(ctx):
        tp, shapes = ParallelContext(ctx), [mod._shape(i) for i in range(model.layers)]
        stack = Stack([TransformerLayer(tp, s, layer_weights(ctx, s, f"L{i}"), key=f"L{i}") for i, s in enumerate(shapes)])
        w = stack.params()
        m = {k: np.zeros_like(x) for k, x in w.items()}
        v = {k: np.zeros_like(x) for k, x in w.items()}
        out = {"losses": []}
        for t in range(1, steps + 1):
            for layer in stack.layers:
                layer.zero_grad()
            y, caches = stack.forward(data(ctx, "x", t - 1), Saved())
            stack.backward(caches, data(ctx, "t", t - 1) / n)
            out["losses"].append(float(np.sum(y * data(ctx, "t", t - 1) / n)))
            for k, g in stack.grads.items():
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g ** 2
                w[k] = w[k] - lr * m[k] / (1 - b1 ** t) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
            stack.load(w)
            if t == 2:
                out["after 2"] = {"model": dict(w), "optim/master": dict(w), "optim/m": dict(m), "optim/v": dict(v)}
        out["weights"] = w
        return out
    return parasim.run(program, 1).values[0]


def largest_gap(got: dict, want: dict) -> float:
    return max(float(np.max(np.abs(np.asarray(got[k]) - want[k]))) for k in got)


def resumed(mod, tmp_path, expert_group=None) -> list[dict]:
    """The lesson's program on A, its parts saved in tmp_path, resumed on B and trained on."""
    saved = parasim.run(mod.program, mod.A.world).values
    path = mod.save(saved, tmp_path)
    return parasim.run(mod.resume(path, expert_group), mod.B.world).values


def test_the_lessons_checks_pass():
    lr = run_lesson(get_lesson("checkpoint"))
    assert lr.ok and len(lr.checks) == 8, [c.name for c in lr.checks if not c.ok]
    phases = [m.text for m in lr.result.trace.marks if m.kind == "phase" and m.rank == 0]
    assert phases == ["train on layout A", "save", "plan the resume on layout B"]


def test_resumed_training_lands_where_one_device_does(lesson, tmp_path):
    ref = one_device(lesson, 4)
    saved = parasim.run(lesson.program, 4).values
    path = lesson.save(saved, tmp_path)
    reader = CheckpointReader(path)
    assert reader.step == 2 and sorted(reader.meta["files"]) == [f"rank{r}.npz" for r in range(4)]
    settings = reader.meta["optimizer"]  # both optimizers', each under its group: dp-cp has 2 ranks on A, expert-dp 1
    assert (settings["dp-cp group"], settings["expert-dp group"], settings["expert-dp lr"]) == (2, 1, lesson.LR)
    for kind, want in ref["after 2"].items():  # every whole tensor, from the 4 files' chunks
        assert largest_gap({k: reader.tensor(f"{kind}/{k}") for k in want}, want) < 1e-12, kind
    assert np.allclose([sum(x["losses"][s] for x in saved) for s in range(2)], ref["losses"][:2], rtol=1e-12, atol=0)
    ranks = parasim.run(lesson.resume(path), 4).values
    assert np.allclose([sum(x["losses"][s] for x in ranks) for s in range(2)], ref["losses"][2:], rtol=1e-12, atol=0)
    for x in ranks:
        assert x["step"] == 2 and largest_gap(x["weights"], ref["weights"]) < 1e-12


def test_the_table_says_which_slice_each_rank_held(lesson):
    """On A the fused QKV weight (8 x 24: Q, K, V of 2 heads of 4) is cut by heads over TP; the experts go
    one per rank, each keeping its whole Adam state (expert-DP 1); on B the experts go two per EP rank,
    and of the two ranks holding expert 1 only the first keeps its state (expert-DP 2: halves of the
    256 values of experts 1 and 2, expert 1's 128 first)."""
    values = run_lesson(get_lesson("checkpoint")).result.values
    rows = [{r["tensor"]: r for r in x["wrote"]} for x in values]
    reads = [{r["tensor"]: r for r in x["reads on B"]} for x in values]
    qkv = "L0.attn.qkv.weight"
    for rank, tp in ((0, 0), (1, 1), (2, 0), (3, 1)):  # tp is the fastest axis of A
        cols = "+".join(f"{part * 8 + tp * 4}:{part * 8 + tp * 4 + 4}" for part in range(3))
        assert rows[rank][qkv]["whole"] == [8, 24] and rows[rank][qkv]["weights"] == f"[0:8, {cols}]"
        assert rows[rank][qkv]["writes them"] is (rank < 2)  # DP rank 0 of each pair writes the copy
        assert reads[rank][qkv]["weights"] == "[0:8, 0:24]"
    assert [sorted(k for k in r if ".expert" in k) for r in rows] == [["L1.moe.expert1.w1"], [], [],
                                                                      ["L1.moe.expert4.w2"]]
    assert [r["L1.moe.expert1.w1"]["adam state"] for r in rows[:1]] == ["0:64 of 64"]
    assert [reads[r].get("L1.moe.expert1.w1", {}).get("adam state") for r in range(4)] == \
        ["0:64 of 64", None, "none", None]


def test_swapping_the_two_groups_is_caught(lesson, monkeypatch):
    """The lesson's own description of which group a weight's state is split over, swapped: the experts'
    state split over dp-cp, whose two ranks hold different experts, so half of each expert's state is
    kept by no one, and the dense gradients left unsummed over DP."""
    real = lesson.data_group
    monkeypatch.setattr(lesson, "data_group", lambda placed: "dp-cp" if real(placed) == "expert-dp" else "expert-dp")
    ref = one_device(lesson, 2)
    losses = [sum(x["losses"][s] for x in parasim.run(lesson.program, 4).values) for s in range(2)]
    assert abs(losses[0] - ref["losses"][0]) < 1e-12 and abs(losses[1] - ref["losses"][1]) > 1e-6
    with pytest.raises(UsageError, match=r"the chunks of optim/master/L1\.moe\.expert\d\.w\d hold 0 values"):
        run_lesson(lesson.LESSON)


def test_a_resume_that_drops_the_zero_offset_is_caught(lesson, tmp_path, monkeypatch):
    """Every rank of B takes the first share of each buffer: no error, and the state is another rank's."""
    real = checkpoint.restore

    def restore_without_offset(ctx, path, model, opt):
        with monkeypatch.context() as m:
            m.setattr(checkpoint, "share_ranges", lambda o, me: [(0, hi - lo) for lo, hi in o.ranges(me)])
            return real(ctx, path, model, opt)
    monkeypatch.setattr(lesson, "restore", restore_without_offset)
    ref = one_device(lesson, 4)
    gaps = [largest_gap(x["weights"], ref["weights"]) for x in resumed(lesson, tmp_path)]
    assert min(gaps) > 1e-4  # the all-gather spreads the wrong shares' updates to every rank
    failed = [c.name for c in run_lesson(lesson.LESSON).checks if not c.ok]
    assert WEIGHTS_CHECK in failed and RESTORED_CHECK in failed


def test_the_silent_bug_gives_wrong_expert_weights_and_no_error(lesson, tmp_path):
    ref = one_device(lesson, 4)
    ranks = resumed(lesson, tmp_path, expert_group="dp-cp")
    experts = {k for k in ref["weights"] if ".moe.expert" in k}
    assert min(largest_gap({k: w for k, w in x["weights"].items() if k in experts}, ref["weights"])
               for x in ranks) > 1e-3


def test_the_checkpoint_folder_goes_away_and_the_current_folder_is_untouched(tmp_path, monkeypatch):
    scratch, work = tmp_path / "tmp", tmp_path / "work"
    scratch.mkdir()
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(work)
    made = []
    real = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    out = cli("lesson", "checkpoint", "--plain")
    assert out.returncode == 0, out.stderr
    mine = [Path(p) for p in made if Path(p).parent == scratch]  # the writer's own temporaries lie inside it
    assert len(mine) == 1 and mine[0].name.startswith("parasim-checkpoint-") and not mine[0].exists()
    assert list(scratch.iterdir()) == [] and list(work.iterdir()) == []


def test_no_writable_temporary_folder_stops_the_lesson_in_one_line(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    out = cli("lesson", "checkpoint", "--plain")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "Read-only file system; set TMPDIR" in out.stderr
    # tempfile's last resort is the current folder: the lesson refuses it rather than write there
    monkeypatch.undo()
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = cli("lesson", "checkpoint", "--json")
    assert out.returncode == 2 and "tempfile would use the current one" in out.stderr
    assert list(tmp_path.iterdir()) == []


async def test_the_app_opens_on_the_lesson():
    from parasim.tui.app import ParasimApp
    from parasim.tui.view import View
    lr = run_lesson(get_lesson("checkpoint"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(120, 40)) as pilot:
        assert "train on layout A" in str(app.query_one("#narrative").render())
        await pilot.press("end")
        assert "layout B" in str(app.query_one("#narrative").render())


def test_the_walkthrough_counts_the_training_and_tables_what_a_wrote_and_b_reads(lesson):
    """Walk 25 (#35): 330 lines of training on A came before the save. The training now shows its first calls
    and counts the rest, a table gives each step's calls by group, and another each rank's part on A and on B.
    Worked out here from the layouts: A is TP2 (the fastest axis) x DP2, so ranks 0 and 1 (DP rank 0) write
    the dense pieces and rank r holds expert r + 1 (EP4); B is DP4 with experts 1-2 on ranks 0 and 2, 3-4 on
    1 and 3 (EP2). The dense Adam buffers: on A a rank's is half of every attention and MLP matrix plus the
    norms and the router whole (a copy on each TP rank); on B every dense weight whole."""
    import re
    text = cli("lesson", "checkpoint", "--plain", "--width", "100").stdout
    assert len(text.splitlines()) < 170
    train = text.split("== train on layout A ==")[1].split("\n== ")[0]
    assert len(re.findall(r"^step +\d+", train, re.M)) == 2 and "more events in this phase" in train
    lr = run_lesson(get_lesson("checkpoint"))
    calls, parts = lr.tables
    by_group = {label.split(" ")[0]: (label, cells) for label, cells in calls.rows}
    assert by_group["dp-cp"][0] == "dp-cp [0, 2] [1, 3]" and by_group["expert-dp"][1][1] == 0
    rows = dict(parts.rows)
    cols = {c: i - 1 for i, c in enumerate(parts.columns)}
    experts_b = {0: "1, 2", 1: "3, 4", 2: "1, 2", 3: "3, 4"}
    for r in range(4):
        wrote, reads = rows[f"rank {r}: A wrote"], rows[f"rank {r}: B reads"]
        assert wrote[cols["dense weights"]] == ("its TP piece" if r < 2 else "none (its DP peer's)")
        assert wrote[cols["experts"]] == str(r + 1) and reads[cols["experts"]] == experts_b[r]
        files = reads[cols["B's weights: in A's files of ranks"]]
        assert files == ("0, 1" if r in (0, 2) else "0, 1, 2, 3")
    # B's rank 2 keeps expert 2's Adam state (the second half of experts 1-2's buffer), written by A's rank 1
    adam = cols["B's Adam share: in A's files of ranks"]
    assert rows["rank 2: B reads"][cols["Adam: experts' share"]] == "128:256 of 256, expert 2"
    assert "1" in rows["rank 2: B reads"][adam].split(", ")
    # B's dense buffer runs layer 1 then layer 2; its first quarter (216 of 864 values: layer 1's norm, QKV and
    # part of its output projection) lies in the first half of each TP rank's 480 on A, kept by DP rank 0
    # (ranks 0 and 1), and expert 1's state by A's rank 0; its last quarter (layer 2's) in the second half, kept
    # by DP rank 1 (ranks 2 and 3), and expert 4's by A's rank 3
    assert rows["rank 0: B reads"][adam] == "0, 1" and rows["rank 3: B reads"][adam] == "2, 3"
    # B's rank 1 keeps values 216:432: layer 1's output projection (most of it), second norm, fc1 and fc2's first
    # 16 values (its first 2 rows), all kept on A by DP rank 0 (ranks 0 and 1) but fc2: TP rank 0 holds rows 0-7
    # and of those DP rank 0 keeps the first 16 values, on rank 0 alone (ranks 2 and 3 keep fc2 values B's rank 1
    # does not); expert 3's state is A's rank 2's
    assert rows["rank 1: B reads"][adam] == "0, 1, 2"
    # the dense sizes, from the model's own weights (one device): TP splits attention and MLP matrices
    sizes = parasim.run(lambda ctx: {k: int(np.size(w)) for k, w in lesson.build(ctx, ParallelContext(ctx)).params().items()
                                     if ".moe.expert" not in k}, 1).values[0]
    split = sum(n for k, n in sizes.items() if ".attn." in k or ".mlp." in k)
    kept = sum(sizes.values()) - split
    a, b = split // 2 + kept, split + kept
    note = " ".join(" ".join(parts.notes).split())
    assert (a, b) == (480, 864) and f"{split // 2} + {kept} = {a}" in note and f"{split} + {kept} = {b}" in note
    assert f"2 x {a} = {2 * a} = {b} + {kept}" in note

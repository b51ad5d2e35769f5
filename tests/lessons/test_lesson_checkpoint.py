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

"""Real ranks (gloo on 127.0.0.1): the same programs give the same trace and values as virtual ranks,
and faults end every process quickly with the failing rank, op and line."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cli_process
from helpers_real import children, every_op

torch = pytest.importorskip("torch")

import parasim  # noqa: E402
from parasim.engine.launch import RealOptions  # noqa: E402
from parasim.engine.compare import compare
from parasim.engine.real import run_real  # noqa: E402

pytestmark = pytest.mark.slow


_cli = cli_process  # real ranks: `python -m parasim` as its own process


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_lesson_matches_its_virtual_run(nproc):
    """`run all` runs every lesson that fits nproc in one launch; each is compared with its own virtual run."""
    from parasim.lesson import load_lessons
    lessons = load_lessons().values()
    # a symbolic lesson holds no values to run for real: `run all` leaves it out, as it does one that does not fit
    fit = [lesson.name for lesson in lessons if lesson.fits(nproc) and lesson.backend == "virtual"]
    out = _cli("run", "all", "--backend", "gloo", "--nproc", str(nproc), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["lesson"] for d in data["lessons"]] == fit and len(fit) >= 10
    assert data["skipped"] == [lesson.name for lesson in lessons if lesson.name not in fit]
    assert data["match"] is True
    for d in data["lessons"]:
        assert d["match"] is True and d["differences"] == [] and d["world"] == nproc, d["lesson"]
        assert d["checks"] and all(c["ok"] for c in d["checks"]), d["lesson"]
        assert d["timings"] and d["events"] > 0


def test_one_lesson_on_real_ranks_prints_its_verdict():
    out = _cli("run", "tp-mlp", "--backend", "gloo", "--nproc", "2")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "(tp-mlp: 2 real ranks on gloo, compared with 2 virtual ranks)" in text
    assert "MATCH" in text and "DIFFERENT" not in text and "checks on the real values: 11 of 11 ok" in text


def draws(ctx):
    g = ctx.new_group([1, 0], "pair")
    return ctx.comm.all_reduce(ctx.rng.normal((2,)), group=g)


def test_programs_of_one_launch_keep_their_own_seed_groups_and_records():
    """Two programs on one launch: each gets a fresh comm (its own groups and records, call numbers from 0)
    and its own seed, and each report is compared with its own virtual run."""
    from parasim.engine.real import run_real_many
    reports = run_real_many([(draws, RealOptions("gloo", seed=1)), (every_op, RealOptions("gloo", keep_values=16)),
                             (draws, RealOptions("gloo", seed=2))], 2)
    assert [r.match for r in reports] == [True] * 3, [r.differences for r in reports]
    assert [len(r.trace.events) for r in reports] == [1, len(parasim.run(every_op, 2).trace.events), 1]
    assert not np.array_equal(reports[0].values[0], reports[2].values[0])
    assert np.array_equal(reports[0].values[0], parasim.run(draws, 2, seed=1).values[0])
    assert reports[0].trace.groups == reports[2].trace.groups


def test_run_all_refuses_a_chrome_file_in_one_line():
    out = _cli("run", "all", "--nproc", "2", "--chrome", "x.json")
    assert out.returncode == 2 and "name the lesson" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_every_op_matches_virtual_on_three_ranks():
    report = run_real(every_op, 3, RealOptions("gloo", keep_values=16))
    assert report.match, report.differences
    assert report.tolerance_used  # float32 sums in gloo's order differ in the last bits
    virtual = parasim.run(every_op, 3, keep_values=16)
    assert [e.op for e in report.trace.events if e.kind == "collective"] == \
           [e.op for e in virtual.trace.events if e.kind == "collective"]
    def layout(trace):  # everything but values and times: the same scheduler lays out both traces
        return [(e.seq, e.step, e.kind, e.op, e.group, e.phase, e.params, e.label,
                 [(m.rank, m.ins, m.outs, m.sent, m.recv, m.site) for m in e.members]) for e in trace.events]
    assert layout(report.trace) == layout(virtual.trace)
    assert report.trace.marks == virtual.trace.marks
    assert report.values[0]["rs"].tolist() == virtual.values[0]["rs"].tolist()


def rooted(ctx):
    """reduce and scatter with roots in a group of non-ascending order, integer-valued and float32 data."""
    comm = ctx.comm
    rev = ctx.new_group(list(range(ctx.world))[::-1], "rev")
    x = ctx.asarray([1, 2, 3, 4, 5, 6]) * (10 ** ctx.rank)
    y = ctx.rng.normal((3,), dtype="float32")
    return {"rd": comm.reduce(x, dst=1, group=rev), "max": comm.reduce(x, 2, op="max"),
            "avg": comm.reduce(y, 0, op="avg", group=rev),
            "sc": comm.scatter(x, src=2, group=rev), "sc1": comm.scatter(x.reshape(2, 3), 0, dim=1, label="cols")}


def test_reduce_and_scatter_on_gloo_equal_numpy_and_the_virtual_run():
    report = run_real(rooted, 3, RealOptions("gloo", keep_values=16))
    assert report.match, report.differences
    base = np.array([1, 2, 3, 4, 5, 6], dtype=np.float64)
    xs = [base * 10 ** r for r in range(3)]
    for r, v in enumerate(report.values):
        assert (v["rd"] is None) == (r != 1) and (v["max"] is None) == (r != 2) and (v["avg"] is None) == (r != 0)
        assert v["sc"].tolist() == xs[2].reshape(3, 2)[2 - r].tolist()  # rev: rank r is member 2 - r
        assert v["sc1"].tolist() == xs[0].reshape(2, 3)[:, r:r + 1].tolist()
    assert report.values[1]["rd"].tolist() == (xs[0] + xs[1] + xs[2]).tolist()
    assert report.values[2]["max"].tolist() == xs[2].tolist()
    events = [e for e in report.trace.events if e.op in ("reduce", "scatter")]
    assert [(e.op, [(m.rank, m.sent, m.recv) for m in e.members]) for e in events] == [
        ("reduce", [(2, 48, 0), (1, 0, 48), (0, 48, 48)]),  # chain 2 -> 0 -> 1 (rev order from dst)
        ("reduce", [(0, 48, 48), (1, 48, 0), (2, 0, 48)]),
        ("reduce", [(2, 12, 12), (1, 12, 0), (0, 0, 12)]),
        ("scatter", [(2, 32, 0), (1, 0, 16), (0, 0, 16)]),
        ("scatter", [(0, 32, 0), (1, 0, 16), (2, 0, 16)])]


def test_a_changed_value_is_reported():
    results = [{"rank": 0, "world": 1, "value": np.array([1.0]), "records": [], "groups": [[0, "world", [0]]]}]
    virtual = parasim.run(lambda ctx: ctx.asarray([2.0]), 1)
    diffs, _ = compare(virtual, results)
    assert diffs and "return value differs" in diffs[0]


def raises_on_rank_1(ctx):
    ctx.comm.barrier()
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    ctx.comm.all_reduce(ctx.asarray([1.0]))


def test_a_rank_that_raises_ends_every_process():
    with pytest.raises(parasim.RankFailed) as info:  # the type a virtual run raises: rank 1's error, no time-out
        parasim.run(raises_on_rank_1, 2, backend="gloo", timeout=20)
    msg = str(info.value)
    head = f"rank 1 raised ValueError: boom on rank 1 at tests/e2e/test_real.py:{raises_on_rank_1.__code__.co_firstlineno + 3}"
    assert msg.startswith(f"{head} (in raises_on_rank_1)\nTraceback"), msg
    assert info.value.rank == 1
    time.sleep(0.5)
    assert children() == []


def mismatched(ctx):
    x = ctx.asarray([1.0, 2.0])
    if ctx.rank == 0:
        ctx.comm.all_reduce(x)
    else:
        ctx.comm.all_gather(x)


def test_a_mismatch_has_the_same_text_as_on_virtual_ranks():
    with pytest.raises(parasim.CollectiveMismatch) as virtual:
        parasim.run(mismatched, 2)
    with pytest.raises(parasim.CollectiveMismatch) as real:
        parasim.run(mismatched, 2, backend="gloo", timeout=20)
    assert str(real.value) == str(virtual.value)
    assert (real.value.ranks, real.value.calls) == (virtual.value.ranks, virtual.value.calls)
    assert children() == []


def skips_a_collective(ctx):
    if ctx.rank == 0:
        ctx.comm.all_reduce(ctx.asarray([1.0]))


def test_a_skipped_collective_is_reported_not_hung():
    with pytest.raises(parasim.Deadlock, match="(?s)^every unfinished rank is waiting.*rank 1: finished"):
        parasim.run(skips_a_collective, 2, backend="gloo", timeout=20)


def test_nccl_without_gpus_is_exit_2_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = _cli("run", "collectives", "--backend", "nccl")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "GPU" in out.stderr


def test_a_world_the_lesson_cannot_use_is_exit_2():
    out = _cli("run", "collectives", "--nproc", "0")
    assert out.returncode == 2 and "positive integer" in out.stderr


def test_the_same_command_runs_under_torchrun(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # TMPDIR: torchrun leaves its torchelastic folder behind; in the test's own folder it goes with it
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr",
                          "127.0.0.1", "-m", "parasim", "run", "collectives", "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)  # only rank 0 prints
    assert data["match"] is True and data["world"] == 2


def leaves_fields(ctx):
    ctx.phase("p", stage=ctx.rank + 1)
    ctx.note("with fields", token="x", cells=[".", "F1"])
    other = 1 - ctx.rank
    ctx.comm.exchange([parasim.Send(ctx.asarray([1.0]), other), parasim.Recv(other, (1,), "float64")],
                      label="swap", tags={"slot": 3})


def test_note_and_call_fields_come_back_from_real_ranks():
    real, virtual = parasim.run(leaves_fields, 2, backend="gloo", timeout=20).trace, parasim.run(leaves_fields, 2).trace
    assert real.marks == virtual.marks
    assert [m.data for m in real.marks if m.rank == 1] == [{"stage": 2}, {"token": "x", "cells": [".", "F1"]}]
    assert [e.tags for e in real.events] == [e.tags for e in virtual.events] == [{"slot": 3}] * 2


def passes_two(ctx):
    """Rank 0 sends K and V to rank 1 in one exchange, each transfer under its own label (as a ring does)."""
    if ctx.rank == 0:
        ops = [parasim.Send(ctx.asarray([1.0]), 1, label="pass K on"), parasim.Send(ctx.asarray([2.0]), 1, label="pass V on")]
    else:
        ops = [parasim.Recv(0, (1,), "float64"), parasim.Recv(0, (1,), "float64")]  # the sender names them
    ctx.comm.exchange(ops, label="the pair")


def test_each_transfers_own_label_comes_back_from_real_ranks():
    """A real run replayed into its trace keeps each transfer's label, not the exchange's (ring attention's
    K and V passes read apart on real ranks as on virtual ones)."""
    real, virtual = parasim.run(passes_two, 2, backend="gloo", timeout=20).trace, parasim.run(passes_two, 2).trace
    assert [e.label for e in real.events] == [e.label for e in virtual.events] == ["pass K on", "pass V on"]


def test_ranks_import_the_parasim_the_launcher_imported(tmp_path):
    """Run from a folder that holds another `parasim` (a checkout beside an installed copy), the ranks
    import the launcher's parasim, not the folder's: a real run of tp-mlp matches its virtual run, with the
    same file names for the same lines (the fork server starts as `python -c`, which puts the current folder
    first on its path)."""
    import shutil
    shadow = tmp_path / "cwd" / "parasim"  # a copy of the package: it runs, under other file names
    shutil.copytree(os.path.dirname(os.path.abspath(parasim.__file__)), shadow,
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "bin" / "parasim"  # a console script, as pip writes it: no .py
    script.parent.mkdir()
    script.write_text("import sys\nfrom parasim.cli import main\nif __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(parasim.__file__)))
    env["PYTHONPATH"] = repo  # the launcher's parasim, wherever this suite's comes from
    out = subprocess.run([sys.executable, str(script), "run", "tp-mlp", "--backend", "gloo", "--nproc", "2"],
                         cwd=shadow.parent, env=env, capture_output=True, text=True, timeout=120)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "MATCH" in text and "DIFFERENT" not in text

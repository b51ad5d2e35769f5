"""A user's own SPMD program, given as path/to/file.py:function, runs wherever a lesson does: walked through
on virtual ranks, opened with `view`, run on gloo ranks and compared; its mismatches and errors name the
user's file and line; bad names get one line and exit code 2."""
import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import cli, cli_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/my_tp.py:program"


def _line(path: Path, text: str) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


@pytest.fixture
def user(tmp_path, monkeypatch):
    src = tmp_path / "mine.py"
    src.write_text(textwrap.dedent("""\
        def mismatch(ctx):
            x = ctx.asarray([1.0, 2.0])
            if ctx.rank == 0:
                ctx.comm.all_reduce(x)  # rank 0 sums
            else:
                ctx.comm.all_gather(x)  # rank 1 gathers


        def raises(ctx):
            ctx.comm.barrier()
            if ctx.rank == 1:
                return {"a": 1}["b"]  # a user's bug
        """))
    return src


def test_the_shipped_example_walks_through_and_checks_itself(monkeypatch):
    monkeypatch.chdir(ROOT)
    out = cli("lesson", EXAMPLE, "--world", "2", "--plain")
    assert out.returncode == 0, out.stderr
    site = f"examples/my_tp.py:{_line(ROOT / 'examples/my_tp.py', 'ctx.comm.all_reduce(')}"
    assert "all_reduce  on tp[0, 1]" in out.stdout and site in out.stdout
    assert "== forward ==" in out.stdout and "2 of 2 checks ok." in out.stdout
    data = json.loads(cli("lesson", EXAMPLE, "--world", "4", "--json").stdout)
    assert data["world"] == 4 and len(data["events"]) == 1 and all(c["ok"] for c in data["checks"])
    view = cli("view", EXAMPLE, "--world", "2", "--plain")
    assert view.returncode == 0 and "My TP MLP" in view.stdout


@pytest.mark.slow
def test_the_shipped_example_matches_on_gloo_ranks(monkeypatch):
    monkeypatch.chdir(ROOT)
    out = cli_process("run", EXAMPLE, "--backend", "gloo", "--nproc", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["match"] is True and data["differences"] == [] and data["lesson"] == EXAMPLE
    assert all(c["ok"] for c in data["checks"])


def test_a_mismatch_names_the_users_file_and_lines(user):
    out = cli("lesson", f"{user}:mismatch", "--world", "2", "--plain")
    assert out.returncode == 1
    for rank, text in ((0, "rank 0 sums"), (1, "rank 1 gathers")):
        assert f"rank {rank}: " in out.stderr and f"{user}:{_line(user, text)}" in out.stderr


@pytest.mark.slow
def test_a_mismatch_on_gloo_ranks_names_the_same_lines(user):
    out = cli_process("run", f"{user}:mismatch", "--backend", "gloo", "--nproc", "2")
    assert out.returncode == 1
    assert f"{user}:{_line(user, 'rank 0 sums')}" in out.stderr and f"{user}:{_line(user, 'rank 1 gathers')}" in out.stderr


def test_an_error_in_user_code_keeps_the_users_traceback(user):
    out = cli("lesson", f"{user}:raises", "--world", "2", "--plain")
    assert out.returncode != 0
    where = f'File "{user}", line {_line(user, "a user")}'
    assert where in out.stderr and "KeyError: 'b'" in out.stderr


@pytest.mark.parametrize("args, reason", [
    (["lesson", "{dir}/nowhere.py:f", "--world", "2"], "no such program file: {dir}/nowhere.py"),
    (["lesson", "{user}:absent", "--world", "2"], "{user} has no function 'absent'; it defines mismatch, raises"),
    (["lesson", "{user}:mismatch"], "say how many ranks {user}:mismatch runs on: --world N"),
    (["run", "{user}:mismatch"], "say how many ranks {user}:mismatch runs on: --nproc N"),
    (["view", "{user}:mismatch", "--world", "0"], "expected a positive integer"),
])
def test_bad_program_names_get_one_line_and_exit_2(user, args, reason):
    fill = {"user": str(user), "dir": str(user.parent)}
    out = cli(*[a.format(**fill) for a in args])
    assert out.returncode == 2 and reason.format(**fill) in out.stderr
    assert out.stderr.count("\n") <= 2 and "Traceback" not in out.stderr

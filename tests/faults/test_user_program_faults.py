"""A user's own program that cannot be run as written, on virtual ranks: one line naming the file and line,
exit code 2, no traceback, whatever the command (check, lesson). Each case is planted in a program file."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAMS = {
    # a collective from a thread the program started: virtual ranks take turns in one thread
    "thread": """
        import threading
        def prog(ctx):
            out = {}
            def work():
                out["x"] = ctx.comm.all_reduce(ctx.xp.ones(2))
            t = threading.Thread(target=work)
            t.start()
            t.join()
            return out.get("x")
    """,
    # placements no tensor of that shape can have
    "shard-past-dims": """
        def prog(ctx):
            x = ctx.xp.ones(4)
            ctx.mark("x", x, "Shard(9)")
            return x
    """,
    "shard-negative": """
        def prog(ctx):
            x = ctx.xp.ones((2, 3))
            ctx.mark("x", x, "Shard(-1)")
            return x
    """,
    "shard-a-scalar": """
        def prog(ctx):
            x = ctx.xp.asarray(1.0)
            ctx.mark("x", x, "Shard(0)")
            return x
    """,
    # rows of the whole without its size: the size is then the number of rows given
    "rows-without-size": """
        def prog(ctx):
            x = ctx.xp.ones(4)
            ctx.mark("x", x, "Shard(0)", rows=[0, 1])
            return x
    """,
}

# (program, the line it fails on, words of its one line)
CASES = [
    ("thread", 6, "rank 0 called all_reduce at {file}:6 from a thread it started"),  # rank 0 runs first
    ("shard-past-dims", 4, "mark 'x' at {file}:4: Shard(9) shards dim 9, but the tensor has 1 dim"),
    ("shard-negative", 4, "mark 'x' at {file}:4: Shard(-1) shards dim -1, but the tensor has 2 dims"),
    ("shard-a-scalar", 4, "mark 'x' at {file}:4: Shard(0) shards a tensor with no dims"),
    ("rows-without-size", 4, "mark 'x' at {file}:4: rows must give one position in [0, 2) per row of the tensor "
                             "(4 rows), got 2"),
]


@pytest.mark.parametrize("command", ["check", "lesson"])
@pytest.mark.parametrize("name,line,words", CASES, ids=[c[0] for c in CASES])
def test_a_program_that_cannot_run_as_written_is_one_line_naming_its_line(tmp_path, command, name, line, words):
    file = f"{name}.py"
    (tmp_path / file).write_text(textwrap.dedent(PROGRAMS[name]))
    argv = [command, f"{file}:prog", "--world", "2"] + (["--plain"] if command == "lesson" else [])
    got = subprocess.run([sys.executable, "-m", "parasim", *argv], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert got.returncode == 2, (got.returncode, got.stderr[-3000:])
    assert "Traceback" not in got.stderr
    assert len(got.stderr.splitlines()) == 1, got.stderr
    assert words.format(file=file) in got.stderr


@pytest.mark.parametrize("command", ["check", "lesson"])
def test_help_says_how_to_isolate_a_program_that_ends_the_process(command):
    """os._exit(7) in a virtual rank ends the one process every virtual rank shares: nothing is left to name
    the rank, so the help says what does (a process per rank)."""
    got = subprocess.run([sys.executable, "-m", "parasim", command, "--help"], capture_output=True, text=True,
                         timeout=60, env={"COLUMNS": "200", "PATH": ""})
    text = " ".join(got.stdout.split())
    assert "os._exit" in text and "parasim run FILE.py:FN --nproc N" in text and "check --against gloo" in text


def test_a_program_that_ends_the_process_ends_parasim_with_its_code_and_real_ranks_name_it(tmp_path):
    """What README's list of exit codes says: on virtual ranks the program's own code, and on real ranks
    (a process each) exit 1 with the rank named."""
    pytest.importorskip("torch")
    (tmp_path / "ends.py").write_text("import os\ndef prog(ctx):\n    if ctx.rank == 1:\n        os._exit(7)\n"
                                      "    return 1\n")
    virtual = subprocess.run([sys.executable, "-m", "parasim", "check", "ends.py:prog", "--world", "2"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert virtual.returncode == 7
    real = subprocess.run([sys.executable, "-m", "parasim", "run", "ends.py:prog", "--nproc", "2"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert real.returncode == 1
    assert real.stderr.strip() == "parasim: rank 1 exited with code 7 without raising an error; the other ranks " \
                                  "were stopped"

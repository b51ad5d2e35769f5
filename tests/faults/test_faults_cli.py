"""The command line's own faults (issue 31): every size flag bounded by what its command does in seconds,
sizes in digits only, one rule set for `parasim layout` and the estimator, output that cannot be written
(a full disk, a closed stdout, a broken pipe, an ASCII-only terminal), files written whole or not at all,
and odd environments. Each case ends in seconds with the exit code `parasim/cli/__init__.py` documents
and, where something is said, one line on stderr and no traceback."""
from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys

import pytest

from parasim.errors import OutputError, UsageError
from parasim.render.output import shown, write_whole
from tests.conftest import cli

# (argv, words the one line must hold): refused before any work, exit 2
BOUNDS = [
    # sizes past what the command does in seconds: the limit is in the line
    (["trace", "--experts", "100000000"], "experts x layers of the token trace (100,000,000 x 4): 400,000,000 is "
                                          "more than the limit of 1,024"),
    (["trace", "--microbatches", "1000000000000"], "GPUs x micro-batches x layers of the token trace"),
    (["trace", "-m", "64"], "(16 x 64 x 4): 4,096 is more than the limit of 2,048"),
    (["trace", "--symbolic", "--layout", "deepseek-v3", "--gpu", "0", "--routing", "balanced", "-m", "65"],
     "micro-batches x pipeline stages of a symbolic step (65 x 16): 1,040 is more than the limit of 1,024"),
    (["trace", "--symbolic", "--layout", "llama3-405b", "--app"],  # the app writes every GPU's part out
     "GPUs x micro-batches of a real-size step in the app (16,384 x 16): 262,144 is more than the limit of 65,536"),
    (["trace", "--symbolic", "--layout", "deepseek-v3", "--app", "-m", "33"],
     "GPUs x micro-batches of a real-size step in the app (2,048 x 33): 67,584 is more than the limit of 65,536"),
    # its CP as a ring (the preset's is an all-gather, whose CP ranks fold): each CP rank runs, 16 x 16 x 16
    (["trace", "--symbolic", "--layout", "llama3-405b-long", "--cp-comm", "p2p", "--gpu", "0"],
     "micro-batches x pipeline stages x CP ranks of a symbolic step (16 x 16 x 16): 4,096 is more than the limit "
     "of 256"),
    (["trace", "--symbolic", "--layout", "27b-tp8", "--gpu", "0", "--seq", "100000000"],
     "tokens per sequence of a symbolic step: 100,000,000 is more than the limit of 4,194,304"),
    (["schedule", "--pp", "1000"], "1,000 ranks x 11 or more time slots: 11,000 slots is more than the limit of "
                                   "10,000"),
    (["schedule", "--pp", "100000", "-m", "1"], "100,000 ranks x 1 or more time slots"),
    (["schedule", "--pp", "100000", "-m", "1", "--json"], "more than the limit of 1,000,000"),
    (["schedule", "--pp", "16", "-m", "300", "--plot", "{tmp}/s.png"], "2,016 slots is more than the limit of 2,000"),
    (["layout", "--tp", "8", "--dp", "8192", "--nodes", "1000000000"], "--nodes: 1,000,000,000 is more than the "
                                                                       "limit of 64"),
    (["layout", "--tp", "8", "--dp", "64", "--plot", "{tmp}/l.png"], "GPUs in a layout picture: 512 is more than "
                                                                     "the limit of 256"),
    (["fit", "--model", "27b", "--search", "--gpus-per-node", "1000000000000", "--nodes", "1"],
     "1,000,000,000,000 is more than the limit of 65,536"),
    (["fit", "--model", "27b", "--search", "--nodes", "1-512"], "layouts in one search: 277,788 is more than the "
                                                                "limit of 200,000"),
    (["fit", "--model", "27b", "--search", "--top", "1000"], "--top: 1,000 is more than the limit of 100"),
    (["layout", "--experts", "1024", "--dp", "512", "--nodes", "64"],
     "expert names drawn (512 GPUs x 1,024 experts each): 524,288 is more than the limit of 131,072"),
    (["layout", "--num-experts", "1000000000000"], "expert names drawn (1 GPUs x 1,000,000,000,000 experts each)"),
    (["memory", "--model", "27b", "--tp", "2", "--sp", "--symbolic", "--seq", "1000000000000"],
     "tokens per sequence of a symbolic step: 1,000,000,000,000 is more than the limit"),
    (["memory", "--model", "27b", "--tp", "2", "--sp", "--symbolic", "--pp", "4", "--microbatches", "1000"],
     "(1,000 x 4): 4,000 is more than the limit of 1,024"),
    # forms int() and float() read that a person did not mean
    (["schedule", "--pp", "1_000"], "--pp: expected a positive integer up to 1e+12, got '1_000'"),
    (["schedule", "--pp", "+5"], "got '+5' (digits only"),
    (["schedule", "--pp", " 5"], "got ' 5' (digits only"),
    (["schedule", "--pp", "\u0665"], "got '\u0665' (digits only"),  # ARABIC-INDIC DIGIT FIVE: int() reads 5
    (["schedule", "--backward-cost", "0_1"], "--backward-cost: expected an integer from 0"),
    (["trace", "--gpu", "1_0"], "--gpu: expected an integer from 0"),
    (["memory", "--model", "27b", "--seq", "4_096"], "--seq: expected a positive integer up to 1e+12, got "
                                                     "'4_096'"),
    (["memory", "--model", "27b", "--zero", "+1"], "--zero: expected an integer from 0"),
    (["fit", "--model", "27b", "--search", "--nodes", "1_0"], "--nodes expects N or A-B (e.g. 1-64), got '1_0'"),
    (["memory", "--model", "27b", "--overlap", "tp,sometimes"], "--overlap: 'sometimes' is not one of"),
    (["memory", "--model", "27b", "--usable", "nan"], "--usable: expected usable memory per GPU in GB"),
    (["fit", "--model", "27b", "--params", "1_0"], "--params: expected a parameter count from 1"),
    (["lesson", "collectives", "--timeout", "1_0"], "argument --timeout:"),
    # pairs of flags that cannot both be honoured
    (["trace", "--app", "--json"], "argument --json: not allowed with argument --app"),
    (["lesson", "collectives", "--trace", "{tmp}/no/such/t.json"], "there is no folder"),
    (["lesson", "collectives", "--chrome", "{tmp}"], "it is a folder; give a file name"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, words", BOUNDS, ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(BOUNDS)])
def test_past_a_bound_is_one_line_and_exit_2(argv, words, tmp_path):
    got = cli(*[a.format(tmp=tmp_path) for a in argv])
    assert got.returncode == 2 and got.stdout == "", got.stderr
    assert words.format(tmp=tmp_path) in got.stderr and got.stderr.count("\n") == 1, got.stderr
    assert os.listdir(tmp_path) == []  # nothing was drawn or written


def test_a_slot_table_at_its_limit_is_placed():
    """The bound is a limit, not off by one: GPipe's table is p x 2(m + p - 1) slots (a forward and a
    backward per micro-batch, plus the fill and the drain), so p = 50, m = 51 makes exactly 10,000."""
    from parasim.pipeline.schedules import generate
    from parasim.pipeline.timing import time_schedule
    assert time_schedule(generate("gpipe", 50, 51), max_slots=10_000).makespan == 2 * (51 + 50 - 1)
    with pytest.raises(UsageError, match=r"50 ranks x 201 or more time slots: 10,050 slots is more than the limit "
                                         r"of 10,000 \(the timing fills every slot of every rank\)"):
        time_schedule(generate("gpipe", 50, 52), max_slots=10_000)
    with pytest.raises(UsageError, match=r"pp x microbatches x chunks: 100,100 is more than the limit of 100,000 "
                                         r"\(the slot table holds every action\)"):
        generate("gpipe", 50, 2002)


# one rule set: the estimator refuses what `parasim layout` refuses, in the same words
SAME_RULE = [
    (["memory", "--model", "27b", "--cp", "3"], ["layout", "--cp", "3", "--seq", "4096"],
     "sequence 4096 does not divide by 2*cp = 6 (the zigzag split)"),
    (["memory", "--model", "27b", "--tp", "3", "--sp"], ["layout", "--tp", "3", "--sp", "--seq", "4096", "--heads",
                                                        "48", "--hidden", "6144"],
     "sequence 4096 does not divide by cp x tp = 3"),
    (["fit", "--model", "27b", "--tp", "5"], ["layout", "--tp", "5", "--heads", "48", "--hidden", "6144"],
     "heads 48 do not divide by tp 5"),
    (["memory", "--model", "27b", "--sp"], ["layout", "--sp"], "sequence parallelism needs tp > 1"),
]


@pytest.mark.parametrize("estimator, layout, words", SAME_RULE, ids=["cp3", "sp-tp3", "tp5", "sp-tp1"])
def test_the_estimator_and_layout_refuse_alike(estimator, layout, words):
    a, b = cli(*estimator), cli(*layout)
    assert a.returncode == b.returncode == 2 and a.stderr == b.stderr, (a.stderr, b.stderr)
    assert a.stderr.startswith(f"parasim: error: {words}") and a.stderr.count("\n") == 1


def test_what_both_accept_both_run():
    """TP 3 splits the 27B model's 48 heads evenly (16 a rank): without SP no rule refuses it, on either
    command; at 4,095 tokens (a multiple of 3) SP can split them too."""
    assert cli("memory", "--model", "27b", "--tp", "3").returncode == 0
    assert cli("memory", "--model", "27b", "--tp", "3", "--sp", "--seq", "4095").returncode == 0
    assert cli("layout", "--tp", "3", "--sp", "--seq", "4095", "--heads", "48", "--hidden", "6144").returncode == 0


def test_a_deleted_current_folder_is_one_line(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # os.getcwd() now raises FileNotFoundError
    got = cli("lesson", "collectives", "--plain")
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and "current folder no longer exists" in got.stderr


# -- output that cannot be written, in a separate process (the real stdout, the real exit) ------------------
def _closed_stdout():
    os.close(1)


def _tiny_files():  # a file may hold at most 1,000 bytes: a write past that fails as on a full disk (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))


def _run(argv: list[str], stdout, env: dict | None = None, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parasim", *argv], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=120, env={**os.environ, **(env or {})}, preexec_fn=preexec)


# (argv, where stdout goes, environment, exit code, words on stderr ("" for nothing said))
STDOUTS = [
    (["layout", "--tp", "2", "--json"], "full", {}, 1, "cannot write the output: No space left on device"),
    (["lesson", "collectives", "--plain"], "full", {}, 1, "cannot write the output: No space left on device"),
    (["lesson", "collectives", "--plain"], "closed", {}, 1, "standard output is closed"),
    (["schedule"], "closed", {}, 1, "standard output is closed"),
    (["lesson", "collectives", "--plain"], "broken", {}, 141, ""),
    (["schedule"], "broken", {}, 141, ""),  # Rich answers a broken pipe with exit 1 itself: the same 141 here
    (["lesson", "--json"], "broken", {}, 141, ""),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, where, env, code, words", STDOUTS,
                         ids=[f"{a[0]}-{w}-{i}" for i, (a, w, *_) in enumerate(STDOUTS)])
def test_output_that_cannot_be_written(argv, where, env, code, words, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in argv]
    if where == "full":
        with open("/dev/full", "w") as full:
            got = _run(argv, full, env)
    elif where == "broken":  # the reader is gone before the first write
        read, write = os.pipe()
        os.close(read)
        try:
            got = _run(argv, write, env)
        finally:
            os.close(write)
    else:
        got = _run(argv, subprocess.DEVNULL, env, _closed_stdout)
    assert got.returncode == code, got.stderr
    assert "Traceback" not in got.stderr and "Exception ignored" not in got.stderr, got.stderr
    assert (words in got.stderr and got.stderr.count("\n") == 1) if words else got.stderr == "", got.stderr


def test_an_unknown_matplotlib_back_end_is_no_matter(tmp_path):
    """Pictures go to a file through Agg whatever MPLBACKEND names (matplotlib refuses a name it does not
    know when it is imported, with a ValueError)."""
    got = _run(["schedule", "--plot", str(tmp_path / "s.png")], subprocess.DEVNULL, {"MPLBACKEND": "nonsense"})
    assert got.returncode == 0 and got.stderr == "" and os.listdir(tmp_path) == ["s.png"], got.stderr


def test_an_ascii_terminal_gets_ascii_spellings():
    """The sp lesson's walk-through writes 34sbh/t with a superscript and arrows; an ASCII-only stdout gets
    them spelled (^2, ->) and the run ends as on any terminal."""
    got = subprocess.run([sys.executable, "-m", "parasim", "lesson", "sp", "--plain"], capture_output=True,
                         timeout=120, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert got.returncode == 0 and got.stderr == b"", got.stderr[-500:]
    text = got.stdout.decode("ascii")  # raises if anything else came through
    assert "^2" in text


def test_a_full_disk_leaves_no_file_and_keeps_the_old_one(tmp_path):
    """--trace on a disk that fills: exit 1, one line, the earlier file of that name untouched and no
    temporary file left in the folder."""
    old = tmp_path / "t.json"
    old.write_text("the earlier trace\n")
    got = _run(["lesson", "collectives", "--plain", "--trace", str(old)], subprocess.DEVNULL, preexec=_tiny_files)
    assert got.returncode == 1 and got.stderr == f"parasim: cannot write {old}: File too large (nothing was " \
                                                 "written)\n", got.stderr
    assert old.read_text() == "the earlier trace\n" and os.listdir(tmp_path) == ["t.json"]


def test_a_file_is_written_whole_in_one_step(tmp_path):
    path = tmp_path / "out.json"
    write_whole(str(path), "new text\n")
    assert path.read_text() == "new text\n" and os.listdir(tmp_path) == ["out.json"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as open() would make it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("err, kind", [(errno.ENOSPC, OutputError), (errno.EDQUOT, OutputError),
                                       (errno.EACCES, UsageError), (errno.ENOENT, UsageError)],
                         ids=["nospace", "quota", "access", "nofolder"])
def test_a_failed_write_leaves_nothing_and_names_its_kind(tmp_path, err, kind):
    """A writer that fails half-way (here matplotlib's savefig stand-in writes, then fails): the error is
    OutputError (exit 1) for a disk that failed, UsageError (exit 2) for a name that cannot be written;
    either way no file and no temporary file are left."""
    def half(temp: str) -> None:
        with open(temp, "w") as f:
            f.write("half")
        raise OSError(err, os.strerror(err))
    with pytest.raises(kind, match=f"cannot write .*x.png: {os.strerror(err)}"):
        write_whole(str(tmp_path / "x.png"), half)
    assert os.listdir(tmp_path) == []


def test_a_link_is_followed_and_a_device_written_directly(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_whole(str(link), "new")
    assert link.is_symlink() and real.read_text() == "new"
    write_whole("/dev/null", "nothing")  # a device: no temporary file beside it (none could be made in /dev)


@pytest.mark.parametrize("text, encoding, want", [
    ("t -> GPU", "ascii", "t -> GPU"),
    ("a → b × c ≤ d", "ascii", "a -> b x c <= d"),
    ("34sbh/t², 5·a", "ascii", "34sbh/t^2, 5.a"),
    ("┌─┐ ✓", "ascii", "+-+ ok"),
    ("naïve 日本", "ascii", "na?ve ??"),
    ("naïve", "latin-1", "naïve"),
    ("→", "no-such-codec", "->"),
], ids=["plain", "signs", "super", "box", "other", "latin1", "unknown"])
def test_text_a_terminal_cannot_show_is_spelled_in_ascii(text, encoding, want):
    assert shown(text, encoding) == want

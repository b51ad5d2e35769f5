"""Every command README.md shows is run here, for real, as a reader would type it; or it is run by another test
named below (checked: that test still holds the command's words); or it is an exception, with its reason.
README is read when the tests are collected, so a command added to it later is picked up, and fails here
until it runs or is listed.

Which commands README shows (the rule):

1. Every line of every ```bash block. A line ending in `\\` continues on the next. `#` at the start of a word,
   outside quotes, begins a comment, which is not part of the command; a comment line indented under a
   commented command continues that comment (README aligns them). Blank lines and comment-only lines
   starting at column 0 are skipped.
2. Every inline code span of the prose (a span may run over a line break; its spaces are collapsed) that
   starts with `parasim `, `python benchmarks/` or `bash ` and is a complete command, which excludes
   a. `parasim WORD` alone: it names the command (`parasim fit`, `parasim serve`); where README means the bare
      command itself (`parasim lesson`, `parasim hardware`) it shows it in a block too;
   b. a span with a placeholder: a word of one capital letter (`N`), a word holding two capitals in a row
      (NAME, ARGS, TRACE.json, FILE.py:FN, HOST), or `...`;
   c. the spans in NOT_COMMANDS: a flag named in a sentence, without its value.

How each is run: in a temporary folder (commands write t.json, run.json, traces/, m.png, job.sh ... there,
never in the checkout), holding links to the checkout's examples/ and tests/ (commands name
examples/my_tp.py and tests/data/megatron/...), through `bash -c`, with the folder of this Python first on
PATH (the virtual environment's bin, where the `parasim` entry point is). It must exit 0 (or EXIT_CODES'
code, where README says another), print no traceback, write the files its flags name (--plot, --chrome,
--trace, --hta, `>`), and print the figures README's comment on it states (FIGURES). What a command reads
is made first: a file another README command writes (job.sh, run.json) by running that command; mine.py by
this test (MADE_HERE). Three kinds are run their own way:
- `parasim serve ...`: with `--port P` added, P a free port (found by binding 127.0.0.1:0) so that tests
  never collide and never take README's 8000; the page is fetched from 127.0.0.1:P, then Ctrl-C (SIGINT to
  its process group) must end it with 0 and leave nothing of its session running;
- the app on a terminal (`--tui`, `--app`, `parasim view`, or README's comment says "app"): in a real
  pseudo-terminal of 100 x 30, until it has painted its timeline; then "q" must end it;
- commands that need torch (`parasim run`, `--against`) skip without it.
"""
from __future__ import annotations

import os
import pty
import re
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the virtual environment's bin: `parasim` is there
LIMIT_S = 300  # a command's limit: generous, for a loaded 2-core machine (the slowest takes ~20 s here)


# ---------------------------------------------------------------------------------------------- README's commands


@dataclass(frozen=True)
class Shown:
    command: str  # as README shows it: continuation lines joined, the comment cut off, spaces collapsed
    comment: str  # README's comment on it ("" where it has none), its continuation lines joined
    line: int  # README's line where it starts
    where: str  # "block" or "prose"


def _split_comment(line: str) -> tuple[str, str | None]:
    """(code, comment): a `#` at the start of a word and outside quotes begins the comment (None: none)."""
    quote, i = None, 0
    while i < len(line):
        c = line[i]
        if c == "\\" and quote != "'":
            i += 2  # an escaped character, in double quotes or outside quotes
            continue
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:].strip()
        i += 1
    return line, None


def _collapse(text: str) -> str:
    return " ".join(text.split())


def block_commands(text: str) -> list[Shown]:
    """Rule 1: the commands of README's ```bash blocks."""
    out: list[Shown] = []
    fence: str | None = None  # the language of the block we are in
    pending, start, comment, last_end = "", 0, None, -1
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence != "bash":
            continue
        code, said = _split_comment(line)
        if not pending and not code.strip():
            # a comment-only line: indented right under a commented command, it continues that comment
            if said is not None and line[:1].isspace() and out and out[-1].comment and last_end == n - 1:
                last = out.pop()
                out.append(Shown(last.command, f"{last.comment}\n{said}", last.line, last.where))
                last_end = n
            continue
        if not pending:
            start, comment = n, said
        elif said is not None:
            comment = said if comment is None else f"{comment} {said}"
        if code.rstrip().endswith("\\"):
            pending += code.rstrip()[:-1] + " "
            continue
        out.append(Shown(_collapse(pending + code), comment or "", start, "block"))
        pending, last_end = "", n
    return out


PROSE_START = ("parasim ", "python benchmarks/", "bash ")
# rule 2c: spans that name a flag in a sentence, not a command
NOT_COMMANDS = {
    "parasim trace --plot": "names the flag ('parasim trace --plot draws the followed token's path'): --plot needs "
                            "a FILE.png; `parasim trace --routing post --plot path.png` is the command, run here",
    "parasim check --bug": "names the flag ('its bugs are turned on with parasim check --bug'): --bug needs a "
                           "variant; `parasim check silent-bugs --bug ...` are the commands, run here",
}


def is_placeholder(word: str) -> bool:
    """Rule 2b: `N`, a word holding two capitals in a row (NAME, ARGS, TRACE.json, FILE.py:FN, HOST), or `...`."""
    return "..." in word or re.fullmatch(r"[A-Z]", word) is not None or re.search(r"[A-Z]{2}", word) is not None


def prose_spans(text: str) -> list[tuple[int, str]]:
    """(line, span) of every inline code span outside the fenced blocks, its spaces collapsed."""
    prose, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            prose.append("")
            continue
        prose.append("" if fenced else line)
    joined = "\n".join(prose)
    return [(joined.count("\n", 0, m.start()) + 1, _collapse(m.group(1))) for m in re.finditer(r"`([^`]+)`", joined)
            if "\n\n" not in m.group(1)]  # a span never runs over a paragraph: that is an unpaired backtick


def prose_commands(text: str) -> list[Shown]:
    """Rule 2: the complete commands of the prose's inline code spans."""
    out = []
    for line, span in prose_spans(text):
        if not span.startswith(PROSE_START) or span in NOT_COMMANDS:
            continue
        words = span.split()
        if span.startswith("parasim ") and len(words) == 2:  # rule 2a
            continue
        if any(is_placeholder(w) for w in words):  # rule 2b
            continue
        out.append(Shown(span, "", line, "prose"))
    return out


def shown_commands(text: str) -> list[Shown]:
    """Every command README shows, once each (a block's line, with its comment, before the same in prose)."""
    seen: dict[str, Shown] = {}
    for s in block_commands(text) + prose_commands(text):
        seen.setdefault(s.command, s)
    return list(seen.values())


# ---------------------------------------------------------------------------------------------------- the tables

# Not run, with the reason.
EXCEPTIONS = {
    # the set-up, for a fresh machine
    'python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/parasim lesson collectives':
        "a fresh machine's set-up (a new .venv, an install): tests/e2e/test_wheel.py builds and installs the wheel "
        "apart from the checkout and runs lessons and the app from it; `parasim lesson collectives` is run here",
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest':
        "a fresh machine's set-up and the whole suite: CI runs it verbatim (.ci/run takes it from README: "
        "test_ci_runs_readmes_second_set_up_command); running it here would run this suite inside itself",
    "bash .ci/run": "it is CI: a new .venv, apt-get, then the whole suite, this test included",
    "bash scripts/mutation.sh": "mutation testing takes about an hour and is not part of CI (docs/testing.md)",
    "bash scripts/gpu_check.sh": "needs CUDA GPUs (without one it stops with 2: nothing could run); "
                                 "tests/e2e/test_gpu_check.py runs its checks' logic on CPU with torch.cuda faked",
    "parasim run collectives --backend nccl --nproc 8 --json": "NCCL needs 8 CUDA GPUs; scripts/gpu_check.sh and "
                                                               "tests/e2e/test_nccl.py (mark nccl) run NCCL on a GPU "
                                                               "machine",
    # several machines
    "export NCCL_SOCKET_IFNAME=ib0": "the multi-node recipe: an InfiniBand interface of a cluster's node",
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id run1 "
    "-m parasim run collectives --backend nccl":
        "two nodes of 8 GPUs each meeting at HOST (NCCL); the same recipe on one machine is run by "
        "tests/e2e/test_torchrun.py (the two-nodes-on-one-machine lines below)",
    'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)': "needs a Slurm job (scontrol)",
    'srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d '
    '--rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID" -m parasim run collectives --backend nccl':
        "needs a Slurm job of two nodes with 8 GPUs each (srun, NCCL)",
}

# Run by another test: (its file, words it must still hold). The words are the test's own spelling of the
# command, so that the mapping cannot rot: a test that no longer runs the command fails here.
COVERED = {
    # README's two "nodes" on one machine, line by line
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1":
        ("tests/e2e/test_torchrun.py", ['"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"']),
    "rdzv=$(mktemp -u)": ("tests/e2e/test_torchrun.py", ['"--rdzv-endpoint", str(tmp_path / "rdzv")']),
    'for n in 1 2; do torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-conf store_type=file '
    '--rdzv-endpoint "$rdzv" --rdzv-id local --local-addr 127.0.0.1 -m parasim run collectives --json & done':
        ("tests/e2e/test_torchrun.py", ['"--nnodes", "2", "--nproc-per-node", "2"',
                                    '"--rdzv-backend", "c10d", "--rdzv-conf", "store_type=file"',
                                    '"--local-addr", "127.0.0.1"', '"-m", "parasim", "run", "collectives", "--json"',
                                    "for _ in range(2)]"]),
    'wait; rm -f "$rdzv"': ("tests/e2e/test_torchrun.py", ["p.communicate(timeout=10)", "tmp_path"]),
    # expensive, and already run as README writes them
    "parasim run moe16 --nproc 16":
        ("tests/lessons/test_moe16.py", ['_cli("run", "moe16", "--backend", "gloo", "--nproc", "16"']),
    "parasim run all --nproc 4":  # gloo is `parasim run`'s default backend
        ("tests/e2e/test_real.py", ['@pytest.mark.parametrize("nproc", [2, 4])',
                                '_cli("run", "all", "--backend", "gloo", "--nproc", str(nproc)']),
    "parasim memory --model deepseek-v3 --pp 16 --ep 64 --gpus 2048 --microbatches 16 --symbolic":
        ("tests/e2e/test_one_memory_model.py", ['cli("memory", "--model", "deepseek-v3", "--pp", "16", "--ep", "64", '
                                            '"--gpus", "2048",', '"--microbatches", "16", "--symbolic", "--json")']),
}
BENCHMARK = re.compile(r"python benchmarks/(\w+\.py)( --\w+)*")  # run at a tiny size by tests/e2e/test_benchmarks.py

# What README's comment on a command states, as (its words in README's comment, the words the output must
# hold). A figure README changes fails here until it is checked again. Output is read with spaces collapsed.
FIGURES = {
    "parasim lesson collectives --json": [(f'"{k}"', f'"{k}":') for k in
                                          ("lesson", "world", "clock", "events", "values", "checks")],
    "parasim lesson sp --tp 4": [("(the post's: --tp 8)", "(the post's: --tp 8)")],
    "parasim lesson pp-1f1b --pp 8 -m 16": [("bubble 7/23", "measured from the slot table: 7/23")],
    "parasim cheatsheet": [("5.5, 3.75, 2 bytes", "5.5 /"), ("5.5, 3.75, 2 bytes", "3.75 / 2 B"), ("the 3/7 bubble", "3/7")],
    "parasim layout --list": [("Megatron 8.3B", "megatron-8.3b"), ("DeepSeek-V3-like", "DeepSeek-V3-like")],
    "parasim trace --layout moe16 --token contract": [("t6 of sequence A", "t6 of sequence A")],
    "parasim trace --layout moe16 --split zigzag": [("contract moves to g3", "g3: holds 'contract'")],
    "parasim trace --routing post": [("contract -> E3 (0.6) on g1, E8 (0.4) on g3",
                                      "picks E3 (gate 0.60) on g1, E8 (gate 0.40) on g3")],
    "parasim trace --gpu 2": [("what g2 stores", "g2 on the moe16 layout"), ("what g2 stores", "stores:")],
    "parasim trace --tp 2 --sp --cp 2 --pp 2 --dp 8 --ep 8 --token t6": [("64 GPUs", "on 64 GPUs")],
    "parasim schedule --schedule 1f1b --pp 8 -m 64 --json": [(f'"{k}"', f'"{k}":') for k in
                                                             ("schedule", "pp", "microbatches", "slots")],
    # 3/7 is the bubble with one chunk: the gpipe and 1f1b lines' (3/7 at p = 4, m = 4 is asserted below)
    "parasim schedule --schedule interleaved --chunks 2 -m 4": [("bubble 3/7 -> 3/11", "bubble 3/11")],
    "parasim schedule --schedule gpipe --pp 4 --microbatches 4": [("bubble", "bubble 3/7")],
    "parasim fit --model 27b --tp 8 --sp --recompute --json": [('"max_seq_tokens"', '"max_seq_tokens":'),
                                                               ('"memory_at_max"', '"memory_at_max":')],
    "parasim hardware": [(g, g) for g in ("H200", "H100", "A100")],
    "parasim memory --job tests/data/jobs/deepspeed/ds_config_func_bs8_zero2_gas3.json --config "
    "tests/data/jobs/hf/Llama-3.1-8B-Instruct_config.json --gpus 8": [
        ("ZeRO-2", "DP8 + ZeRO-2 on 8 GPUs"), ("FP16", "precision deepspeed-fp16"),
        ("micro-batch 8 x 3", "a micro-batch of 8 sequences"), ("micro-batch 8 x 3", "3 micro-batches a step")],
    "parasim memory --job tests/data/jobs/picotron/template_base_configs.json --config "
    "tests/data/jobs/hf/Llama-3.1-8B-Instruct_config.json": [
        ("PP 2 x DP 2", "PP2 + DP2"), ("12 bytes a parameter", "12.00 bytes per parameter")],
    "parasim memory --job tests/data/jobs/torchtitan/llama3_70b.toml --gpus 64": [
        ("TP 8 with FSDP over the rest", "TP8 + SP + DP8 + ZeRO-3")],
    "parasim memory --model 27b --dp 8 --precision megatron-bf16": [("7.50 bytes a parameter",
                                                                     "7.50 bytes per parameter this GPU holds")],
    "parasim memory --model deepseek-v3 --pp 16 --ep 64 --gpus 2048 --first-stage-layers 1": [
        ("1 layer, then 4 a stage", "61 layers over 16 stages: 1 stage of 1, 15 of 4")],
    "parasim trace --symbolic --layout megatron-8.3b --gpu 0": [("512 GPUs", "512 symbolic GPUs"),
                                                                ("peak 16.05 GB", "peak held: 16.05 GB")],
    "parasim trace --symbolic --layout deepseek-v3 --gpu 200 --routing balanced": [("2,048 GPUs",
                                                                                   "2,048 symbolic GPUs")],
    "parasim trace --symbolic --layout llama3-405b --gpu 0 --seq 8192": [("16,384 GPUs", "16,384 symbolic GPUs")],
    "parasim trace --symbolic --layout llama3-405b-long --gpu 0 --seq 131072": [
        ("CP 16, K/V all-gathered", "all-gather over cp")],
    "parasim fit --model 27b --tp 8 --sp --symbolic": [("fits the run", "): fits"),
                                                       ("one step longer does not", "): does NOT fit")],
    "parasim check silent-bugs --bug expert-over-dp-cp": [
        ("all_reduce on dp-cp", "all_reduce on dp-cp"),
        ("at lessons/silent_bugs.py:68", "at lessons/silent_bugs.py:68"),
        ('"all_reduce over dp or expert-dp instead of dp-cp would match"',
         "all_reduce over dp or expert-dp instead of dp-cp would match")],
    "parasim check silent-bugs --json": [('"first_divergence": null', '"first_divergence": null'),
                                         ('"compared": 17', '"compared": 17')],
    "parasim check moe16 --reference-layout tp=1,pp=2,ep=2,dp=2": [("80 activations and gradients",
                                                                    "80 marked tensor(s) agree")],
}

# README: "Exit code 1 when something differs" (`parasim check`): the commands that show a bug
EXIT_CODES = {
    "parasim check silent-bugs --bug expert-over-dp-cp": 1,
    "parasim check silent-bugs --bug dense-over-dp --tui": 1,
}

# More than a few seconds here (the suite's `slow` mark; still run in CI), besides those that need torch
SLOW = {
    "parasim trace --symbolic --layout deepseek-v3 --gpu 200 --routing balanced",
    "parasim trace --symbolic --layout llama3-405b --gpu 0 --seq 8192",
    "parasim trace --symbolic --layout llama3-405b-long --gpu 0 --seq 131072",
    "parasim trace --symbolic --layout deepseek-v3 --app",
}


def _mine(folder: Path) -> None:
    """`parasim check mine.py:program --world 4 --reference mine.py:reference`: README's "your own" reference,
    which marks the same names. examples/my_tp.py (which marks h and y), and the same MLP unsplit on one rank."""
    (folder / "mine.py").write_text((ROOT / "examples" / "my_tp.py").read_text() + '''

def reference(ctx):
    """The same MLP on one device, marking what program marks."""
    x = ctx.shared_rng("x").normal((TOKENS, HIDDEN))
    w1 = ctx.shared_rng("w1").normal((HIDDEN, FFN))
    w2 = ctx.shared_rng("w2").normal((FFN, HIDDEN))
    h = ctx.mark("h", ctx.xp.maximum(x @ w1, 0.0))
    return ctx.mark("y", h @ w2)
''')


MADE_HERE = {"mine.py": _mine}


# --------------------------------------------------------------------------------------------- how each is taken


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def kind(shown: Shown) -> str | None:
    """How the command is accounted for: "exception", "covered", "benchmark", "serve", "app", "run" (None: not
    at all, which fails)."""
    c = shown.command
    if c in EXCEPTIONS:
        return "exception"
    if c in COVERED:
        return "covered"
    if BENCHMARK.fullmatch(c):
        return "benchmark"
    if not c.startswith("parasim "):
        return None  # a shell line or another tool: it must be listed
    words = _words(c)
    if words[1] == "serve":
        return "serve"
    if "--tui" in words or "--app" in words or words[1] == "view" or re.search(r"\bapp\b", shown.comment):
        return "app"
    return "run"


def writes(command: str) -> list[str]:
    """The files (or, for --hta, the folder) a command writes, from its flags and a `>`."""
    words = _words(command)
    if words[:2] == ["parasim", "serve"]:
        return []  # serve's --trace is the arguments of a trace, not a file
    flags = {"--plot", "--chrome", "--trace", "--hta", ">"}
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in flags]


def needs_torch(command: str) -> bool:
    words = _words(command)
    return words[:2] == ["parasim", "run"] or "--against" in words


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # pytest-xdist sets them
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _kill(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _in_session(sid: int) -> list[int]:
    """The live processes of session `sid` (field 6 of /proc/PID/stat)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def bash(command: str, folder: Path, timeout: float = LIMIT_S) -> subprocess.CompletedProcess:
    p = subprocess.Popen(["bash", "-c", command], cwd=folder, env=_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p.pid)
        out, err = p.communicate()
        pytest.fail(f"`{command}` ran past {timeout} s:\n{out[-2000:]}\n{err[-2000:]}")
    finally:
        _kill(p.pid)
    return subprocess.CompletedProcess(command, p.returncode, out, err)


def prepare(shown: Shown, folder: Path, commands: list[Shown]) -> None:
    """What the command reads: a file another README command writes (that command is run first), or one made
    here (MADE_HERE)."""
    words, mine = _words(shown.command), writes(shown.command)
    for name, make in MADE_HERE.items():
        if any(w == name or w.startswith(name + ":") for w in words):
            make(folder)
    for other in commands:
        if other.command == shown.command or kind(other) != "run":
            continue
        for made in writes(other.command):
            if made in words and made not in mine and not (folder / made).exists():
                got = bash(other.command, folder)
                assert got.returncode == 0, f"README's `{other.command}`, which makes {made}, failed:\n{got.stderr}"


def _link_checkout(folder: Path) -> Path:
    for name in ("examples", "tests"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    return folder


def _figures(shown: Shown, output: str) -> None:
    said, got = _collapse(shown.comment), _collapse(output)
    for in_readme, in_output in FIGURES.get(shown.command, []):
        assert _collapse(in_readme) in said, (f"README's comment on `{shown.command}` no longer says {in_readme!r}: "
                                              f"FIGURES is out of date, or README's figure is ({shown.comment!r})")
        assert _collapse(in_output) in got, (f"README says {in_readme!r} of `{shown.command}`, but its output does "
                                             f"not hold {in_output!r}:\n{output[-4000:]}")


# ------------------------------------------------------------------------------------------------ the app, serve

ANSI = re.compile(r"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Z0-9]|\x1b[=>78]")
# every screen of the step-through app has its timeline panel; the live estimator (memory --app) its fit line
PAINTED = ("timeline", "GB usable on an")


def _screen_text(raw: bytes) -> str:
    return ANSI.sub("", raw.decode("utf-8", "replace"))


def run_app(command: str, folder: Path, paint_s: float = 120, quit_s: float = 60) -> tuple[int, str]:
    """The command in a pseudo-terminal of 100 x 30 until the app has painted, then "q": (exit code, what the
    terminal showed, escape sequences taken out)."""
    import fcntl
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    p = subprocess.Popen(["bash", "-c", command], cwd=folder, env=_env(TERM="xterm-256color"), stdin=slave,
                         stdout=slave, stderr=slave, start_new_session=True, close_fds=True)
    os.close(slave)
    raw = bytearray()

    def read(seconds: float) -> None:
        r, _, _ = select.select([master], [], [], seconds)
        if r:
            try:
                raw.extend(os.read(master, 1 << 16))
            except OSError:  # EIO: every process holding the terminal is gone
                time.sleep(seconds)
    try:
        deadline = time.monotonic() + paint_s
        while not any(word in _screen_text(bytes(raw)) for word in PAINTED):
            assert p.poll() is None, f"`{command}` exited {p.returncode} before the app painted:\n" \
                                     f"{_screen_text(bytes(raw))[-3000:]}"
            assert time.monotonic() < deadline, f"`{command}`: no app painted in {paint_s} s:\n" \
                                                f"{_screen_text(bytes(raw))[-3000:]}"
            read(0.2)
        end = time.monotonic() + 0.5  # the rest of the first paint
        while time.monotonic() < end:
            read(0.1)
        deadline, pressed = time.monotonic() + quit_s, 0.0
        while p.poll() is None:
            assert time.monotonic() < deadline, f"`{command}`: q did not end the app in {quit_s} s"
            if time.monotonic() - pressed > 10:  # once, and again should a key come before the app took keys
                os.write(master, b"q")
                pressed = time.monotonic()
            read(0.1)
        for _ in range(20):  # what it wrote last
            read(0.05)
        return p.returncode, _screen_text(bytes(raw))
    finally:
        _kill(p.pid)
        p.wait(10)
        os.close(master)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(command: str, folder: Path, start_s: float = 60) -> tuple[int, str, str]:
    """`command --port P` until it serves, its page fetched from 127.0.0.1:P, then Ctrl-C: (exit code, what it
    printed, the page)."""
    port = _free_port()
    p = subprocess.Popen(["bash", "-c", f"{command} --port {port}"], cwd=folder, env=_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in p.stdout:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline, url = time.monotonic() + start_s, None
        while url is None:
            assert p.poll() is None or any("serving" in s for s in lines), \
                f"`{command}` exited {p.returncode} before serving:\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"`{command}`: not serving after {start_s} s:\n{''.join(lines)}"
            m = next((re.search(r"serving .* at (http://127\.0\.0\.1:(\d+)/)", s) for s in lines if "serving" in s),
                     None)
            if m:
                assert int(m.group(2)) == port, m.group(0)
                url = m.group(1)
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as page:
            assert page.status == 200
            html = page.read().decode("utf-8", "replace")
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
        code = p.wait(60)
        reader.join(10)
        end = time.monotonic() + 10
        while _in_session(p.pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert _in_session(p.pid) == [], f"`{command}`: processes of its session still run after Ctrl-C"
        return code, "".join(lines), html
    finally:
        _kill(p.pid)
        if p.poll() is None:
            p.wait(10)


# ------------------------------------------------------------------------------------------------------ the tests

TEXT = README.read_text(encoding="utf-8")
COMMANDS = shown_commands(TEXT)


def _param(shown: Shown):
    marks = [pytest.mark.slow] if shown.command in SLOW or needs_torch(shown.command) else []
    return pytest.param(shown, id=shown.command, marks=marks)


def test_the_rules_read_blocks_and_prose():
    """The rules on a small README of their own: continuations, comments and their continuation lines,
    quotes, prose spans over a line break, the references and placeholders they leave out."""
    text = "\n".join([
        "Set up:", "", "```bash", "parasim lesson x --json     # {\"a\": 1} # the same comment",
        "                            #   and its second line", "# a note, not a command", "",
        "torchrun --a 1 \\", "    -m parasim run y   # joined", 'echo "a # not a comment" \'#\' x#y', "```", "",
        "```python", "parasim.run(program)", "```", "",
        "See `parasim fit`, `parasim lesson NAME`, `parasim view TRACE.json`, `parasim run FILE.py:FN --nproc N`,",
        "`parasim compare ... --plot c.png`, `parasim check --bug`, `parasim/clock`, `parasim lesson",
        "checkpoint`, `python", "benchmarks/tui.py` and `bash scripts/x.sh`.",
    ])
    got = [(s.command, s.comment, s.line, s.where) for s in shown_commands(text)]
    assert got == [
        ("parasim lesson x --json", '{"a": 1} # the same comment\nand its second line', 4, "block"),
        ("torchrun --a 1 -m parasim run y", "joined", 8, "block"),
        ('echo "a # not a comment" \'#\' x#y', "", 10, "block"),
        ("parasim lesson checkpoint", "", 18, "prose"),
        ("python benchmarks/tui.py", "", 19, "prose"),
        ("bash scripts/x.sh", "", 20, "prose"),
    ]
    kinds = {s.command: kind(s) for s in shown_commands(text)}
    assert kinds["parasim lesson x --json"] == "run" and kinds["python benchmarks/tui.py"] == "benchmark"
    assert kinds["torchrun --a 1 -m parasim run y"] is None and kinds["bash scripts/x.sh"] is None


def test_readme_shows_its_commands():
    """The reading finds README's commands: its blocks' and its prose's, both set-up lines among them."""
    where = {s.where for s in COMMANDS}
    assert len(COMMANDS) >= 80 and where == {"block", "prose"}, len(COMMANDS)
    setup = [s.command for s in COMMANDS if s.command.startswith("python3 -m venv")]
    assert len(setup) == 2 and all(s in EXCEPTIONS for s in setup)


def test_every_readme_command_is_run_or_listed():
    """A command README shows that is neither run (here or by the test named for it) nor an exception fails."""
    missing = [f"README.md:{s.line}: {s.command}" for s in COMMANDS if kind(s) is None]
    assert missing == [], "README shows commands no test runs; run them here or list them in EXCEPTIONS or " \
                          "COVERED, with the reason:\n" + "\n".join(missing)


def test_the_tables_name_commands_readme_shows():
    """An entry for a command README no longer shows is stale: it would hide that the command changed."""
    shown = {s.command for s in COMMANDS}
    spans = {span for _, span in prose_spans(TEXT)}
    stale = [c for table in (EXCEPTIONS, COVERED, FIGURES, EXIT_CODES) for c in table if c not in shown]
    stale += [c for c in SLOW if c not in shown] + [c for c in NOT_COMMANDS if c not in spans]
    assert stale == []


def test_ci_runs_readmes_second_set_up_command():
    """.ci/run takes the second set-up command from README (the first line its pattern matches) and runs it."""
    ci = (ROOT / ".ci" / "run").read_text()
    pattern = re.search(r"grep -m1 -E '([^']+)' README.md", ci).group(1)
    first = next(line for line in TEXT.splitlines() if re.search(pattern, line))
    assert first == 'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest'
    assert 'eval "$cmd"' in ci


@pytest.mark.timeout(2 * LIMIT_S + 120)
@pytest.mark.parametrize("shown", [_param(s) for s in COMMANDS])
def test_readme_command(shown: Shown, tmp_path: Path):
    how = kind(shown)
    command = shown.command
    if how is None:
        pytest.fail(f"README.md:{shown.line} shows `{command}`, which no test runs and no table lists")
    if how == "exception":
        pytest.skip(EXCEPTIONS[command])
    if how == "covered":
        path, words = COVERED[command]
        source = (ROOT / path).read_text()
        assert [w for w in words if w not in source] == [], f"{path} no longer runs `{command}`"
        return
    if how == "benchmark":
        name = BENCHMARK.fullmatch(command).group(1)
        assert (ROOT / "benchmarks" / name).is_file(), f"README names benchmarks/{name}, which is not there"
        assert 'glob("*.py")' in (ROOT / "tests" / "e2e" / "test_benchmarks.py").read_text()
        return
    if needs_torch(command):
        pytest.importorskip("torch", reason="real ranks need torch")
    assert (BIN / "parasim").exists(), f"no parasim entry point beside {sys.executable}"
    folder = _link_checkout(tmp_path)
    prepare(shown, folder, COMMANDS)
    expected = EXIT_CODES.get(command, 0)
    if how == "app":
        code, screen = run_app(command, folder)
        assert code == expected, f"`{command}` exited {code} after q:\n{screen[-3000:]}"
        assert "Traceback" not in screen, screen[-3000:]
        _figures(shown, screen)
        return
    if how == "serve":
        code, printed, html = run_serve(command, folder)
        assert code == 0, f"`{command}` exited {code} on Ctrl-C:\n{printed}"
        assert "Traceback" not in printed, printed
        assert "<html" in html.lower() and "textual" in html.lower(), html[:2000]
        return
    got = bash(command, folder)
    assert got.returncode == expected, f"`{command}` exited {got.returncode}:\n{got.stderr[-3000:]}"
    assert "Traceback" not in got.stderr, got.stderr[-3000:]
    if "|" in _words(command):  # parasim's stdout read by another program: its end of the pipe may close first
        assert got.stderr == "", got.stderr  # "141, silently, when stdout's reader goes away"
        if _words(command)[-2:] == ["head", "-1"]:
            assert len(got.stdout.splitlines()) == 1, got.stdout
    for made in writes(command):
        path = folder / made
        if made.endswith("/"):  # --hta DIR: DIR/rank<r>.json
            assert (path / "rank0.json").is_file(), f"`{command}` wrote no {made}rank0.json"
        else:
            assert path.is_file() and path.stat().st_size > 0, f"`{command}` did not write {made}"
    _figures(shown, got.stdout + "\n" + got.stderr)

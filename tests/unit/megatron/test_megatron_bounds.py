"""The Megatron-LM script reader (`--megatron FILE`) is bounded in size and work: a script that doubles a
variable, nests defaults or arithmetic thousands deep, or launches no process is refused in one line that names
the limit and why (exit 2, never a traceback, never a hang); backquotes are command substitutions, read as
empty and noted as `$(...)` is. A grammar of bash (assignments, doubling, nesting, arrays, arithmetic, command
substitutions, if/else, quotes, continued lines) is fuzzed: every script is read, or refused with UsageError,
within 2 s of CPU and 200 MB."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import traceback
from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from parasim.errors import UsageError
from parasim.megatron import words
from parasim.megatron.job import PATTERN_CHARS, PATTERN_LAYERS, read_job
from parasim.megatron.script import IF_DEPTH, SCRIPT_BYTES, read_script

FLAGS = "pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64"
LAUNCH = f"torchrun --nproc_per_node 8 {FLAGS}\n"
CPU_SECONDS = 2.0  # per script, read and made a job: CPU time, so that a loaded machine does not fail it
MEMORY_BYTES = 200 << 20  # more address space than the reader's process had before it read the script
CPU_KILL_SECONDS = 30  # a read still running by then is a hang: the child is killed (SIGXCPU)


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def _bounded(read: Callable[[], object], cpu_kill_seconds: int = CPU_KILL_SECONDS) -> tuple[str, float]:
    """`read()` in a forked child held to MEMORY_BYTES more memory (RLIMIT_AS: past it, MemoryError) and
    CPU_KILL_SECONDS of CPU: what came of it ("read", "refused: <message>" or "failed: <traceback>") and the
    CPU seconds it took. In a child, so that memory is bounded exactly and tracing does not slow the read."""
    ready, done = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        spent = -1.0
        try:
            os.close(ready)
            for limit, soft in ((resource.RLIMIT_AS, _address_space() + MEMORY_BYTES),
                                (resource.RLIMIT_CPU, cpu_kill_seconds)):
                hard = resource.getrlimit(limit)[1]  # kept: a lower one (ulimit) may not be raised
                resource.setrlimit(limit, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
            start = time.process_time()
            try:
                read()
                outcome = "read"
            except UsageError as err:
                outcome = f"refused: {err}"
            spent = time.process_time() - start
        except BaseException:  # noqa: BLE001 - any other exception is what the test looks for
            outcome = "failed: " + traceback.format_exc()[-3000:]
        try:
            os.write(done, json.dumps([outcome, spent]).encode())
        finally:
            os._exit(0)
    os.close(done)
    with os.fdopen(ready, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return f"failed: the child ended without an answer (wait status {status}: killed past the CPU limit?)", -1.0
    outcome, spent = json.loads(data)
    return outcome, spent


def _launch(nproc: str = "8", nnodes: str = "1") -> str:
    return f"torchrun --nproc_per_node {nproc} --nnodes {nnodes} {FLAGS} --global-batch-size 8\n"


def _chain(n: int) -> str:
    """V1="$V0$V0", V2="$V1$V1", ...: each variable twice the last."""
    return "V0=xxxxxxxx\n" + "".join(f'V{i + 1}="$V{i}$V{i}"\n' for i in range(n))


_HALF_MB = "A=xxxxxxxx\n" + 'A="$A$A"\n' * 16  # A: 8 x 2**16 = 524,288 characters, under the limit on one value

# (name, script, a fragment of the one-line refusal: the limit it names and why): what the script reader refuses
SCRIPT_PLANTED = [
    ("doubling a variable forty times", "A=xxxxxxxx\n" + 'A="$A$A"\n' * 40 + LAUNCH,
     "a value grows past 1,048,576 characters, the limit on one word or variable (a launch script's are a few KB"),
    ("doubling an array forty times", "A=(x)\n" + "A+=(${A[@]} ${A[@]})\n" * 40 + LAUNCH,
     "the array A grows past 65,536 elements, the limit on one array (a launch script's arrays hold tens"),
    ("a chain of variables, each twice the last", _chain(40) + LAUNCH,
     "a value grows past 1,048,576 characters, the limit on one word or variable"),
    ("seventy copies of a half-megabyte value", _HALF_MB + "".join(f'B{i}="$A"\n' for i in range(70)) + LAUNCH,
     "more than 33,554,432 characters, the limit over the whole read (a launch script's expansions come to a few KB"),
    ("a string appended to twenty thousand times", "A+=xxxxxxxx\n" * 20_000 + LAUNCH,
     "the limit over the whole read"),
    ("forty arrays of 32,000 words", 'W="' + "w " * 4000 + '"\n' + "F=($W $W $W $W $W $W $W $W)\n" * 40 + LAUNCH,
     "the limit over the whole read"),  # each word counts ITEM_CHARS more than its letter
    ("a megabyte of braces inside 8 defaults", "X=" + "${A:-" * 8 + "{}" * 520_000 + "}" * 8 + "\n" + LAUNCH,
     "line 1: expanding the script reads and builds more than"),  # a million braces passed over at each level
    ("fifty thousand signs in arithmetic", "X=$((" + "-" * 50_000 + "4))\n" + LAUNCH,
     "comes to more than 1,000 characters with its variables in place, the limit on one arithmetic expression (a "
     "launch script's multiplies a few numbers)"),
    ("a 5,000-digit number in arithmetic", "X=$((" + "1" * 5_000 + "))\n" + LAUNCH,
     "more than 1,000 characters with its variables in place"),
    ("a half-megabyte variable in arithmetic", _HALF_MB + "X=$(($A + 1))\n" + LAUNCH,
     "line 18: the arithmetic $(($A + 1)) comes to more than 1,000 characters with its variables in place"),
    ("forty signs in arithmetic", "X=$((" + "-" * 40 + "4))\n" + LAUNCH,
     "nests parentheses or signs more than 32 deep, the limit (a launch script's nests one or two"),
    ("forty parentheses in arithmetic", "X=$((" + "(" * 40 + "1" + ")" * 40 + "))\n" + LAUNCH,
     "nests parentheses or signs more than 32 deep"),
    ("3,000 nested defaults", "X=" + "${A:-" * 3000 + "x" + "}" * 3000 + "\n" + LAUNCH,
     "${...} nested more than 32 deep in one another's defaults, the limit (a launch script nests one or two"),
    ("3,000 nested quoted defaults", 'X="' + '${A:-"' * 3000 + "x" + '"}' * 3000 + '"\n' + LAUNCH,
     "nested more than 32 deep in one another's defaults"),
    ("50,000 arrays inside one another", "A=(" + "B=(" * 50_000 + "x" + ")" * 50_001 + "\n" + LAUNCH,
     "line 1: an array inside an array"),
    ("a hundred nested ifs", "if [ 1 ]; then\n" * 100 + LAUNCH + "fi\n" * 100,
     "line 65: 'if' nested more than 64 deep, the limit (a launch script nests one or two)"),
]
JOB_PLANTED = [  # what the job reader refuses: torchrun's counts, the MoE layer pattern
    ("GPUS_PER_NODE=0", "GPUS_PER_NODE=0\n" + _launch("$GPUS_PER_NODE"),
     "line 2: torchrun --nproc_per_node 0 launches no process: it takes a count of at least 1"),
    ("--nnodes 0", _launch(nnodes="0"), "torchrun --nnodes 0 launches no process"),
    ("--nnodes -3", _launch(nnodes="-3"), "torchrun --nnodes -3 launches no process"),
    ("elastic --nnodes 1:0", _launch(nnodes="1:0"), "torchrun --nnodes 0 launches no process"),
    ("a negative --nproc_per_node", _launch("-8"), "torchrun --nproc_per_node -8 launches no process"),
    ("a huge --nproc_per_node", _launch("99999999999999999999"),
     "torchrun --nproc_per_node 99999999999999999999: more than 1e+12, the limit on any one size"),
    ("a 100,000-digit --nnodes", _launch(nnodes="9" * 100_000), "more than 1e+12, the limit on any one size"),
    ("a --moe-layer-freq of 10**10 layers", LAUNCH.rstrip() + " --num-experts 4 --moe-layer-freq ([0]*100000)*100000\n",
     "describes more than 10,000 layers, the limit (the deepest models have a few hundred)"),
    ("a --normalization of 100 KB", LAUNCH.rstrip() + " --normalization " + "x" * 100_000 + "\n",
     "--normalization 'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx': Megatron takes LayerNorm or "
     "RMSNorm"),
    ("a --moe-layer-freq of 100 KB", LAUNCH.rstrip() + " --num-experts 4 --moe-layer-freq " + "+".join(["[1]"] * 25_000)
     + "\n", "--moe-layer-freq is 99,999 characters long, more than the limit of 1,000"),
]
PLANTED = SCRIPT_PLANTED + JOB_PLANTED


@pytest.mark.parametrize("name, text, words_", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_script_past_a_limit_is_one_line_naming_it_and_exit_2(tmp_path, name, text, words_):
    path = tmp_path / "job.sh"
    path.write_text(text)
    got = subprocess.run([sys.executable, "-m", "parasim", "memory", "--megatron", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert "Traceback" not in got.stderr, got.stderr[-2000:]
    assert got.returncode == 2, (got.returncode, got.stderr[-500:])
    assert got.stderr.count("\n") == 1 and got.stderr.endswith("\n"), got.stderr[:500]
    assert f"{path}: line " in got.stderr or f"{path}: --" in got.stderr, got.stderr  # the file, and where
    assert words_ in got.stderr, got.stderr
    assert len(got.stderr) < 400, got.stderr[:500]  # a line, not the value that grew


@pytest.mark.parametrize("name, text, words_", SCRIPT_PLANTED, ids=[p[0] for p in SCRIPT_PLANTED])
def test_the_script_reader_refuses_it_itself(name, text, words_):
    with pytest.raises(UsageError) as err:
        read_script(text, "job.sh")
    assert words_ in str(err.value) and str(err.value).startswith("job.sh: line ") and "\n" not in str(err.value)


# -- just under each limit: read, not refused (a limit set too low fails here) -----------------------------------
def test_what_stays_under_the_limits_is_read():
    s = read_script(_HALF_MB + 'B="$A$A"\n' + LAUNCH, "job.sh")  # exactly 1,048,576 characters
    assert len(s.variables["B"]) == words.VALUE_CHARS
    s = read_script("A=(x)\n" + "A+=(${A[@]} ${A[@]})\n" * 10 + LAUNCH, "job.sh")  # each thrice the last
    assert len(s.variables["A"]) == 3 ** 10 <= words.ARRAY_ITEMS
    nested = "${A:-" * words.NESTING + "x" + "}" * words.NESTING
    assert read_script(f"X={nested}\n" + LAUNCH, "job.sh").variables["X"] == "x"
    deep = "(" * words.ARITH_DEPTH + "2*3" + ")" * words.ARITH_DEPTH
    assert read_script(f"X=$(({deep}))\n" + LAUNCH, "job.sh").variables["X"] == "6"
    long_sum = "+".join(["1"] * 400)  # a long chain is not a deep one
    assert read_script(f"X=$(({long_sum}))\n" + LAUNCH, "job.sh").variables["X"] == "400"
    s = read_script("if [ 1 ]; then\n" * IF_DEPTH + LAUNCH + "fi\n" * IF_DEPTH, "job.sh")
    assert s.flags[:2] == ["--num-layers", "2"]
    s = read_script("A+=(x)\n" * 60_000 + LAUNCH, "job.sh")  # in place: not 60,000 copies of a growing list
    assert len(s.variables["A"]) == 60_000
    pattern = "([0]*3+[1]*" + str(PATTERN_LAYERS - 3) + ")"
    job = read_job("job.sh", f"{LAUNCH.rstrip()} --num-experts 4 --moe-layer-freq {pattern}\n".replace(
        "--num-layers 2", f"--num-layers {PATTERN_LAYERS}"))
    assert job.model["dense_layers"] == 3 and len(pattern) < PATTERN_CHARS


@pytest.mark.parametrize("grown", [lambda n: "A=(x)\n" + "A+=y\n" * (n - 1), lambda n: "A+=(x y)\n" * (n // 2),
                                   lambda n: "A=(" + "x " * n + ")\n", lambda n: "A=(" + '"${B[@]}" ' * n + ")\n"],
                         ids=["A+=y", "A+=(x y)", "A=(...)", "A=(${B[@]}...)"])
def test_an_array_grown_any_way_is_held_to_its_limit(grown):
    with pytest.raises(UsageError, match=r"line \d+: the array A grows past 65,536 elements, the limit on one array"):
        read_script("B=(x)\n" + grown(words.ARRAY_ITEMS + 2) + LAUNCH, "job.sh")
    assert len(read_script("B=(x)\n" + grown(words.ARRAY_ITEMS) + LAUNCH, "job.sh").variables["A"]) == words.ARRAY_ITEMS


MEGABYTE = SCRIPT_BYTES - 200  # a script as large as may be read, with a launch line
LINEAR = {  # scripts of n bytes (up to a megabyte) that are read in one pass
    "one long word": lambda n: "torchrun pretrain_gpt.py --x " + "x" * n + "\n",
    "a word of parentheses": lambda n: "torchrun pretrain_gpt.py --x a" + "(" * n + "\n",
    "a word of closing parentheses": lambda n: "torchrun pretrain_gpt.py --x " + "x)" * (n // 2) + "\n",
    "a word of empty quotes": lambda n: "torchrun pretrain_gpt.py --x " + '""' * (n // 2) + "\n",
    "a quoted word of dollars": lambda n: 'torchrun pretrain_gpt.py --x "' + "-$" * (n // 2) + '"\n',
    "a word of variables": lambda n: "A=y\ntorchrun pretrain_gpt.py --x " + "$A" * (n // 4) + "\n",
    "a quoted word of variables": lambda n: 'A=y\ntorchrun pretrain_gpt.py --x "' + "$A-" * (n // 3) + '"\n',
    "a comment": lambda n: "#" + "x" * n + "\n" + LAUNCH,
    "continued lines": lambda n: "torchrun pretrain_gpt.py --x" + " \\\n" * (n // 3) + " y\n",
    "statements": lambda n: "A=1\n" * (n // 4) + LAUNCH,
    "if after if": lambda n: "if [ 1 ]; then\nA=1\nfi\n" * (n // 24) + LAUNCH,
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks and reads /proc/self/status")
@pytest.mark.parametrize("name", LINEAR)
def test_a_megabyte_script_is_read_in_linear_time(name):
    """A quarter of the script takes about a quarter of the time (a step that copies what it has built so far
    takes a sixteenth): measured against itself, so that the speed of the machine does not matter."""
    outcome, spent = _bounded(lambda: read_script(LINEAR[name](MEGABYTE), "job.sh"), cpu_kill_seconds=20)
    assert outcome == "read", outcome
    quarter = _bounded(lambda: read_script(LINEAR[name](MEGABYTE // 4), "job.sh"))[1]
    assert 0 <= spent < 6 * CPU_SECONDS, spent  # about a second on one core
    assert spent < 8 * quarter + 0.3, (spent, quarter)


def test_arithmetic_stays_within_its_numbers():
    s = read_script("A=$((2**10))\nB=$((1000000000000000 * 10))\nC=$((-1000000000000000 - 1))\n"
                    "D=$((1000000000000000))\nE=$((7 / 0))\n" + LAUNCH, "job.sh")
    assert [s.variables[k] for k in "ABCDE"] == ["0", "0", "0", "1000000000000000", "0"]
    assert sum("is not arithmetic parasim reads: read as 0" in n for n in s.notes) == 4


def test_torchrun_counts_that_are_not_numbers_are_noted_not_refused():
    job = read_job("job.sh", "torchrun --nproc_per_node auto --nnodes $NODES " + FLAGS + "\n")
    assert job.launched == 1 and any("'auto'" in c for c in job.contradictions)
    assert any("--nnodes is ''" in c for c in job.contradictions)


# -- backquotes: a command substitution, as $(...) is ------------------------------------------------------------
def test_backquotes_are_command_substitutions_read_as_empty_and_noted():
    text = ('H=`hostname -s`\nA="x `echo "a b"` y"\nB=${C:-`date`}\n'
            'torchrun pretrain_gpt.py --a "$A" --b "[$B]" --c `ls -l /` --d \\`literal\\` --e "\\`q\\`"\n')
    s = read_script(text, "job.sh")
    assert s.flags == ["--a", "x  y", "--b", "[]", "--c", "--d", "`literal`", "--e", "`q`"]
    assert s.variables["H"] == ""
    assert s.notes == ["line 1: `hostname -s` runs a command: read as empty",
                       'line 2: `echo "a b"` runs a command: read as empty',
                       "line 3: `date` runs a command: read as empty",
                       "line 4: `ls -l /` runs a command: read as empty"]
    dollar = read_script(text.replace("`hostname -s`", "$(hostname -s)").replace("`ls -l /`", "$(ls -l /)"), "job.sh")
    assert dollar.flags == s.flags
    assert [n.replace("$(", "`").replace(")", "`") for n in dollar.notes] == s.notes
    with pytest.raises(UsageError, match=r"^job.sh: line 2: a backquote ` that never closes$"):
        read_script("A=1\ntorchrun pretrain_gpt.py --a `date\n", "job.sh")
    with pytest.raises(UsageError, match="line 1: a backquote ` that never closes"):
        read_script('torchrun pretrain_gpt.py --a "`date"\n', "job.sh")


def test_a_backquote_in_the_launch_is_listed_as_not_read_like_a_dollar_substitution(tmp_path):
    outs = []
    for sub in ("`hostname`", "$(hostname)"):
        path = tmp_path / "job.sh"
        path.write_text(f"NODE={sub}\ntorchrun --nproc_per_node 8 {FLAGS} --note \"{sub}\"\n")
        got = subprocess.run([sys.executable, "-m", "parasim", "memory", "--megatron", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr
        assert "not read in the script (2):" in got.stdout, got.stdout
        assert f"line 1: {sub} runs a command: read as empty" in got.stdout
        assert f"line 2: {sub} runs a command: read as empty" in got.stdout
        outs.append(got.stdout.replace(sub, "SUB"))
    assert outs[0] == outs[1]


# -- the fuzzer --------------------------------------------------------------------------------------------------
# A grammar of the bash launch scripts are written in, with the shapes that grow: doubling, nesting thousands deep,
# long arithmetic. Sizes are drawn both around each limit and far past it, so that some scripts are read whole.
def _mostly(common: st.SearchStrategy, rare: st.SearchStrategy, odds: int = 5) -> st.SearchStrategy:
    """`common` `odds` times in `odds + 1`, else `rare` (one_of would draw each equally often)."""
    return st.integers(0, odds).flatmap(lambda i: rare if i == 0 else common)


def _around(limit: int, most: int, odds: int = 5) -> st.SearchStrategy[int]:
    """Up to `limit` (so that the script may be read whole) `odds` times in `odds + 1`, else up to `most`."""
    return _mostly(st.integers(0, limit), st.integers(0, most), odds)


NAMES = st.sampled_from(["A", "B", "GPUS", "NODES", "X"])
SIMPLE = st.one_of(
    st.sampled_from(["x", "8", "--num-layers", "''", '"q r"', "a\\ b", "2>&1", "$1", "$#", "$@", "a,b", "a b"]),
    NAMES.map(lambda n: f"${n}"), NAMES.map(lambda n: f"${{{n}}}"), NAMES.map(lambda n: f'"${n}${n}"'),
    NAMES.map(lambda n: f"${{{n}[@]}}"), NAMES.map(lambda n: f'"${{{n}[@]}}"'), NAMES.map(lambda n: f"${{#{n}}}"),
    st.sampled_from(["$(hostname)", "`hostname`", '"`date +%s`"', "`echo \\`x\\``", "$(echo $(date))", '"$(nproc)"']),
)
ARITH = st.recursive(
    st.one_of(st.integers(-10**18, 10**18).map(str), NAMES, NAMES.map(lambda n: f"${n}"),
              _around(20, 6000).map(lambda k: "9" * max(k, 1))),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%", "**", "<<"]), inner).map(" ".join),
        inner.map(lambda e: f"({e})"), inner.map(lambda e: f"-{e}"),
        st.tuples(_around(words.ARITH_DEPTH, 5000, 2), inner).map(lambda t: "(" * t[0] + t[1] + ")" * t[0]),
        st.tuples(_around(words.ARITH_DEPTH, 8000, 2), inner).map(lambda t: "-" * t[0] + t[1]),
    ),
    max_leaves=6,
)


def _nest(t: tuple[int, str, str, bool]) -> str:
    """${N:-${N:-...inner...}} `depth` deep, each level quoted or not."""
    depth, name, inner, quoted = t
    q = '"' if quoted else ""
    return f"{q}${{{name}:-" * depth + inner + f"}}{q}" * depth


VALUE = st.recursive(
    st.one_of(SIMPLE, ARITH.map(lambda e: f"$(({e}))")),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(NAMES, st.sampled_from([":-", "-", ":=", ":+", "?"]), inner).map(
            lambda t: f"${{{t[0]}{t[1]}{t[2]}}}"),
        inner.map(lambda v: f'"{v}"'),
        st.tuples(_around(words.NESTING, 5000, 12), NAMES, inner, st.booleans()).map(_nest),
    ),
    max_leaves=8,
)


def _expanding(t: tuple[str, int]) -> str:
    """An expanding statement repeated `k` times: a variable, an array, or a chain, each twice the last."""
    shape, k = t
    if shape == "double":
        return "A=xxxxxxxx\n" + 'A="$A$A"\n' * k
    if shape == "array":
        return "A=(x)\n" + "A+=(${A[@]} ${A[@]})\n" * k
    if shape == "quoted array":
        return "A=(x y)\n" + 'A=("${A[@]}" "${A[@]}")\n' * k
    if shape == "append":
        return "A=xxxxxxxx\n" + 'A+="$A"\n' * k
    if shape == "copies":  # copies of a half-megabyte value: past about thirty, the budget of the whole read
        return _HALF_MB + "".join(f'C{i}="$A"\n' for i in range(k))
    if shape == "fields":  # a value of many words, split into an array again and again: the budget past ~16
        return 'W="' + "w " * 4000 + '"\n' + "".join(f"F{i}=($W $W $W $W $W $W $W $W)\n" for i in range(k))
    return _chain(k)


PLAIN = st.one_of(
    st.tuples(NAMES, VALUE).map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(NAMES, VALUE).map(lambda t: f"{t[0]}+={t[1]}"),
    st.tuples(NAMES, st.lists(VALUE, max_size=4)).map(lambda t: f"{t[0]}=({' '.join(t[1])})"),
    st.tuples(NAMES, st.lists(VALUE, max_size=4)).map(lambda t: f"{t[0]}+=({' '.join(t[1])})"),
    st.tuples(NAMES, VALUE).map(lambda t: f"export {t[0]}={t[1]}"),
    st.lists(VALUE, min_size=1, max_size=4).map(lambda vs: "echo " + " \\\n  ".join(vs)),
    st.sampled_from(["# a comment", "mkdir -p /tmp/x && cd /tmp/x", "for i in 1 2; do\n  A+=(x)\ndone", "true",
                     "while true; do", "done", "exit 0"]),
)
EXPANDING = st.tuples(st.sampled_from(["double", "array", "quoted array", "append", "copies", "fields", "chain"]),
                      st.integers(0, 60)).map(_expanding)
GROWING = _mostly(EXPANDING,  # the shapes that grow past a limit (BLOCK's ifs may hold the deep ones)
                  _around(IF_DEPTH - 4, 200).map(lambda k: "if [ 1 ]; then\n" * k + "X=1\n" + "fi\n" * k), 2)
STATEMENT = _mostly(PLAIN, GROWING, 3)
BLOCK = st.recursive(
    STATEMENT,
    lambda inner: st.tuples(VALUE, st.lists(inner, max_size=3), st.lists(inner, max_size=2),
                            st.lists(inner, max_size=2)).map(
        lambda t: f'if [ "{t[0]}" = "8" ]; then\n' + "\n".join(t[1]) + "\nelif [[ -n $A ]]; then\n"
        + "\n".join(t[2]) + "\nelse\n" + "\n".join(t[3]) + "\nfi"),
    max_leaves=4,
)


def _repeated(t: tuple[str, int]) -> str:
    """`statement` `k` times, as many as fit in a script (SCRIPT_BYTES)."""
    statement, k = t
    return "\n".join([statement] * min(k, SCRIPT_BYTES // (4 * len(statement) + 4) + 1))


LAUNCH_LINE = st.tuples(
    st.sampled_from(["8", "0", "-1", "auto", "$GPUS", "`nproc`", "99999999999999999999", "${GPUS:-4}", "9" * 5000]),
    st.sampled_from(["1", "2", "0", "1:4", "$NODES", "-2"]),
    st.lists(VALUE, max_size=4),
    st.sampled_from(["", "--global-batch-size 8", "--tensor-model-parallel-size 2 --global-batch-size 16",
                     "--num-experts 4 --moe-layer-freq ([0]*1+[1]*1)", "--moe-layer-freq ([0]*100000)*100000"]),
).map(lambda t: f"torchrun --nproc_per_node {t[0]} --nnodes {t[1]} \\\n  {FLAGS} {t[3]} {' '.join(t[2])}")

SCRIPT = st.tuples(st.lists(st.tuples(BLOCK, st.one_of(st.just(1), st.integers(1, 30))).map(_repeated), max_size=5),
                   st.one_of(LAUNCH_LINE, LAUNCH_LINE, LAUNCH_LINE, st.none())).map(
    lambda t: "\n".join(t[0] + ([t[1]] if t[1] else [])) + "\n").filter(lambda text: len(text) <= SCRIPT_BYTES)

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks and reads /proc/self/status")
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the scripts are long: so are reprs
@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: a script of 100 KB shrinks for many minutes
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.filter_too_much])
@given(SCRIPT, st.booleans())
def test_any_script_is_read_or_refused_in_one_line_within_bounds(text, as_job):
    outcome, spent = _bounded(lambda: read_job("fuzz.sh", text) if as_job else read_script(text, "fuzz.sh"))
    assert outcome == "read" or outcome.startswith("refused: fuzz.sh"), (outcome, text[:300])
    assert "\n" not in outcome and len(outcome) < 400, (outcome[:500], text[:300])  # one line, not the value
    assert 0 <= spent < CPU_SECONDS, (spent, text[:300])


def test_the_bounds_of_the_fuzzer_are_real():
    """What the fuzzer takes as failure is failure: another exception, memory past the bound, a hang."""
    assert _bounded(lambda: read_script(LAUNCH, "x.sh"))[0] == "read"
    assert _bounded(lambda: read_script("", "x.sh"))[0].startswith("refused: x.sh: no launch")
    assert _bounded(lambda: 1 // 0)[0].startswith("failed: ") and "ZeroDivisionError" in _bounded(lambda: 1 // 0)[0]
    assert "MemoryError" in _bounded(lambda: bytearray(MEMORY_BYTES + (50 << 20)))[0]
    spent = _bounded(lambda: sum(range(3 * 10**7)))[1]
    assert spent > 0.1

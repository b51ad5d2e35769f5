"""The Megatron-LM launch-script reader (parasim/megatron/words.py, script.py): arrays expanded as bash expands
them, launches behind a prefix (uv run, nsys profile, srun, env, ...), variables given from outside the script
(--megatron-env), and one test for each wrong reader that once passed the rest of the suite. Every expected
value is typed here: bash's own output (run on bash 5.2 and written down), or worked out by hand from the
script in the test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from parasim.errors import UsageError
from parasim.megatron.job import read_job
from parasim.megatron.script import OUTSIDE_CHARS, read_script
from parasim.megatron.words import VALUE_CHARS
from tests.conftest import cli

LLAMA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "megatron", "train_llama3_8b_h100_fp8.sh")
MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 128"


def _job(tmp_path, text: str, outside: dict[str, str] | None = None):
    """The job of `text`, written to a script in tmp_path and read from there."""
    path = tmp_path / "job.sh"
    path.write_text(text)
    return read_job(str(path), outside=outside)


# -- arrays, as bash expands them ---------------------------------------------------------------------------
SETUP = 'A=(); B=(x "y z" w); C=(""); E=; S=s\n'
# each word after SETUP, and the words bash 5.2.15 makes of it (`for a in WORD; do printf "<%s>" "$a"; done`)
BASH_WORDS = [
    ('"${A[@]}"', []),  # an empty array, quoted: no word at all
    ('"${U[@]}"', []),  # an unset one: none either
    ('"${A[*]}"', [""]),  # [*] quoted: one word, empty
    ('"${U[*]}"', [""]),
    ('"pre${A[@]}post"', ["prepost"]),
    ('"pre${B[@]}post"', ["prex", "y z", "wpost"]),
    ('"${B[*]}"', ["x y z w"]),  # one word, the elements joined by a space
    ('"pre${B[*]}post"', ["prex y z wpost"]),
    ('a "${A[@]}" b', ["a", "b"]),
    ("${A[@]}", []),
    ('"${C[@]}"', [""]),  # one element, empty: one empty word
    ('"${A[@]}${A[@]}"', []),
    ('"${A[@]}"x', ["x"]),
    ('""${A[@]}', [""]),  # the quoted "" is a word of its own
    ('"${A[@]}"""', [""]),
    ('"${S[@]}"', ["s"]),  # a variable set to text: an array of that one element
    ('"${E[@]}"', [""]),  # set to nothing: one empty element
    ('"$@"', []),  # the script gets no arguments
    ('"$*"', [""]),
    ('"${B[@]}${B[@]}"', ["x", "y z", "wx", "y z", "w"]),
    ('"$E${A[@]}"', []),  # an empty text beside an empty array: still no word
    ('"${A[@]}$E"', []),
    ('"${C[@]}${A[@]}"', [""]),  # an empty element is a word
    ("${B[*]}", ["x", "y", "z", "w"]),  # unquoted: split on blanks
    ("x${B[*]}y", ["xx", "y", "z", "wy"]),
    ('"${#A[@]}" "${#B[@]}" ${#S[@]} ${#E[@]} ${#U[@]} ${#B}', ["0", "3", "1", "1", "0", "1"]),
]


def _words(word: str) -> list[str]:
    return read_script(SETUP.replace("; ", "\n") + f"python x.py {word}\n", "job.sh").flags


@pytest.mark.parametrize("word, words", BASH_WORDS, ids=[w for w, _ in BASH_WORDS])
def test_a_word_expands_to_the_words_bash_makes_of_it(word, words):
    assert _words(word) == words


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash to compare with")
def test_the_expected_words_are_what_bash_itself_makes():
    """The table above, checked against the bash on this machine (so that a typing slip in it shows)."""
    for word, words in BASH_WORDS:
        out = subprocess.run(["bash", "-c", SETUP + f'for a in {word}; do printf "<%s>" "$a"; done'],
                             capture_output=True, text=True, check=True).stdout
        assert [w[1:] for w in out.split(">")[:-1]] == words, word


def test_an_empty_extra_args_array_adds_nothing_to_the_launch(tmp_path):
    # bash gives torchrun no empty word here: an empty "" would be read as the value of the flag before it
    job = _job(tmp_path, f'EXTRA=()\ntorchrun --nproc_per_node 2 pretrain_gpt.py {MODEL} --sequence-parallel '
                         '"${EXTRA[@]}" --tensor-model-parallel-size 2\n')
    assert job.script.flags == MODEL.split() + ["--sequence-parallel", "--tensor-model-parallel-size", "2"]
    assert (job.layout["tp"], job.layout["sp"]) == (2, True)


def test_arithmetic_divides_toward_zero_as_bash_does():
    # bash 5.2: $(( -7 / 2 )) -3, $(( -7 % 2 )) -1, $(( 7 / -2 )) -3, $(( 7 % -2 )) 1 (Python's // and % differ)
    s = read_script("X=$(( -7 / 2 ))\nY=$(( -7 % 2 ))\nZ=$(( 7 / -2 ))\nW=$(( 7 % -2 ))\npython x.py\n", "job.sh")
    assert [s.variables[k] for k in "XYZW"] == ["-3", "-1", "-3", "1"]


# -- the wrong readers that once passed the suite: one test each ----------------------------------------------
def test_a_quoted_array_is_one_word_per_element(tmp_path):
    job = _job(tmp_path, "ARGS=(--tensor-model-parallel-size 2 --sequence-parallel)\n"
                         f'torchrun --nproc_per_node 2 pretrain_gpt.py {MODEL} "${{ARGS[@]}}"\n')
    assert (job.layout["tp"], job.layout["sp"]) == (2, True)  # read as one word, TP would be 1 and SP absent


def test_arithmetic_reads_the_script_s_variables(tmp_path):
    job = _job(tmp_path, "GPUS=8\nTP=$((GPUS/4))\nPP=$(( $GPUS / 4 ))\nCP=$(( (GPUS - 4) * 3 / 6 ))\n"
                         f"torchrun --nproc_per_node $GPUS pretrain_gpt.py {MODEL} --tensor-model-parallel-size $TP "
                         "--pipeline-model-parallel-size $PP --context-parallel-size $CP\n")
    # 8 / 4 = 2; (8 - 4) * 3 / 6 = 2
    assert (job.layout["tp"], job.layout["pp"], job.layout["cp"]) == (2, 2, 2)
    assert not job.script.notes


def test_continued_lines_are_counted_where_notes_name_a_line(tmp_path):
    text = ("A=1 \\\n"  # 1
            "  B=2\n"  # 2
            "D=$(date)\n"  # 3: a command substitution in an assignment, noted with its line
            "torchrun --nproc_per_node 2 \\\n"  # 4: the launch starts here
            "    pretrain_gpt.py \\\n"  # 5
            f"    {MODEL} --num-lay\\\n"  # 6: a word continued on the next line
            "ers 2 \\\n"  # 7
            '    --note "$(hostname)"\n'  # 8
            'X="a\\\n'  # 9: a quoted text continued
            'b" Y=$(whoami)\n'  # 10
            f"torchrun pretrain_gpt.py {MODEL}\n")  # 11
    job = _job(tmp_path, text)
    assert job.script.line == 4
    assert job.script.notes == ["line 3: $(date) runs a command: read as empty",
                                "line 4: $(hostname) runs a command: read as empty",
                                "line 9: $(whoami) runs a command: read as empty",
                                "line 11: a second launch (the first, line 4, is the one read)"]
    assert job.model["layers"] == 2  # --num-lay\<newline>ers 2: one flag, given twice, the last wins
    assert job.script.variables["X"] == "ab"


def test_an_elif_does_not_run_once_its_if_has(tmp_path):
    text = ("MODE=a\n"
            'if [ "$MODE" = a ]; then\n'
            "    X=(--tensor-model-parallel-size 2)\n"
            'elif [ -n "$MODE" ]; then\n'  # true as well, but the if has run
            "    X=(--tensor-model-parallel-size 4)\n"
            "else\n"
            "    X=(--tensor-model-parallel-size 8)\n"
            "fi\n"
            'if [ "$MODE" = b ]; then Y=(--pipeline-model-parallel-size 8)\n'
            'elif [ "$MODE" = a ]; then Y=(--pipeline-model-parallel-size 2)\n'
            "elif [ -n x ]; then Y=(--pipeline-model-parallel-size 4)\n"
            "fi\n"
            f"torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL} ${{X[@]}} ${{Y[@]}}\n")
    job = _job(tmp_path, text)
    assert (job.layout["tp"], job.layout["pp"]) == (2, 2)


def test_the_first_of_two_launches_is_read_and_the_second_named(tmp_path):
    job = _job(tmp_path, f"torchrun --nproc_per_node 2 pretrain_gpt.py {MODEL} --tensor-model-parallel-size 2\n"
                         "echo done\n"
                         f"torchrun --nproc_per_node 4 pretrain_gpt.py {MODEL} --tensor-model-parallel-size 4\n")
    assert (job.script.line, job.layout["tp"], job.launched) == (1, 2, 2)
    assert job.script.notes == ["line 3: a second launch (the first, line 1, is the one read)"]


def test_virtual_stages_count_chunks_per_gpu_over_pp(tmp_path):
    job = _job(tmp_path, "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 32 --hidden-size 64 "
                         "--num-attention-heads 4 --vocab-size 128 --pipeline-model-parallel-size 4 "
                         "--num-layers-per-virtual-pipeline-stage 4\n")
    # 32 layers over PP 4 is 8 a GPU; in virtual stages of 4 layers, 2 chunks a GPU (not 32 / 4 = 8)
    assert job.step["chunks"] == 2
    assert ("--num-layers-per-virtual-pipeline-stage 4", "interleaved 1F1B: 2 model chunks per GPU") in job.used


@pytest.mark.parametrize("freq, used", [("2", False), ("1", True)])
def test_an_integer_moe_layer_freq_is_modelled_only_when_every_layer_is_moe(tmp_path, freq, used):
    job = _job(tmp_path, f"torchrun --nproc_per_node 4 pretrain_gpt.py {MODEL} --num-experts 4 "
                         f"--moe-layer-freq {freq}\n")
    # Megatron: an integer N makes every N-th layer MoE. 1: all of them, what parasim models (no dense layer
    # first); 2: MoE layers between dense ones, which parasim does not model: named so, and not listed as used
    names = [flag.split(" ", 1)[0] for flag, _ in job.used]
    assert ("--moe-layer-freq" in names) is used
    left = [line for line in job.unmodelled if line.startswith("--moe-layer-freq")]
    assert left == ([] if used else ["--moe-layer-freq 2: MoE layers between dense ones; parasim models dense "
                                     "layers first, then MoE layers"])
    assert job.model_spec().dense_layers == 0


# -- launches behind a prefix ---------------------------------------------------------------------------------
TORCHRUN = f"torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py {MODEL}"
PREFIXED = [  # (the launch line, the prefixes' words, the launcher's words, processes launched)
    (f"uv run {TORCHRUN}", [["uv", "run"]], ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"uv run --with x --project . -- {TORCHRUN}", [["uv", "run", "--with", "x", "--project", ".", "--"]],
     ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"nsys profile -o x --trace cuda {TORCHRUN}", [["nsys", "profile", "-o", "x", "--trace", "cuda"]],
     ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"srun -N 2 --ntasks-per-node 8 python pretrain_gpt.py {MODEL}",
     [["srun", "-N", "2", "--ntasks-per-node", "8"]], ["python"], 16),
    (f"env X=1 Y=2 {TORCHRUN}", [["env", "X=1", "Y=2"]], ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"python -m torch.distributed.run --nproc_per_node 8 pretrain_gpt.py {MODEL}", [],
     ["python", "-m", "torch.distributed.run", "--nproc_per_node", "8"], 8),
    (f"python3 -m torch.distributed.launch --nproc_per_node 4 --nnodes 2 pretrain_gpt.py {MODEL}", [],
     ["python3", "-m", "torch.distributed.launch", "--nproc_per_node", "4", "--nnodes", "2"], 8),
    (f"exec {TORCHRUN}", [["exec"]], ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"numactl --cpunodebind=0 {TORCHRUN}", [["numactl", "--cpunodebind=0"]],
     ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"/usr/bin/numactl -N 0 -l nohup {TORCHRUN}", [["/usr/bin/numactl", "-N", "0", "-l"], ["nohup"]],
     ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),
    (f"time -p srun -lu --nodes=2 -n16 {TORCHRUN}", [["time", "-p"], ["srun", "-lu", "--nodes=2", "-n16"]],
     ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"], 16),  # in front of torchrun: torchrun's counts
    (f"/usr/bin/srun -l --unbuffered -N 2 --ntasks-per-node 4 -- python pretrain_gpt.py {MODEL}",
     [["/usr/bin/srun", "-l", "--unbuffered", "-N", "2", "--ntasks-per-node", "4", "--"]], ["python"], 8),
    (f"srun --ntasks 4 -u python pretrain_gpt.py {MODEL}", [["srun", "--ntasks", "4", "-u"]], ["python"], 4),
]


@pytest.mark.parametrize("line, prefixes, launcher, launched", PREFIXED, ids=[p[0][:40] for p in PREFIXED])
def test_a_launch_behind_a_prefix_is_found(tmp_path, line, prefixes, launcher, launched):
    job = _job(tmp_path, line + "\n")
    s = job.script
    assert (s.prefixes, s.launcher, s.program, s.line) == (prefixes, launcher, "pretrain_gpt.py", 1)
    assert s.flags == MODEL.split()
    assert job.launched == launched and not job.contradictions


def test_env_and_assignments_before_the_launch_are_its_environment_not_its_words(tmp_path):
    # as in bash, $TP is expanded before env runs: the launch's words keep the script's TP
    job = _job(tmp_path, "TP=2\nZ=3 env X=1 TP=4 Y=$Z torchrun --nproc_per_node 2 pretrain_gpt.py "
                         f"{MODEL} --tensor-model-parallel-size $TP\n")
    assert job.script.environment == {"Z": "3", "X": "1", "TP": "4", "Y": ""}  # Z=3 is not set for $Z either
    assert job.layout["tp"] == 2
    assert json.loads(json.dumps(job.to_dict()))["launch"]["environment"] == job.script.environment


@pytest.mark.parametrize("srun, launched, per_node, said", [
    ("srun -N 2 --ntasks-per-node 8", 16, 8, None),
    ("srun --nodes=4 --ntasks-per-node=2", 8, 2, None),
    ("srun -N 2", 2, 1, None),  # one task a node, srun's default
    ("srun -n 12 -N 2", 12, 6, None),
    ("srun -n 12 -N 8", 12, 2, None),  # 12 over 8 nodes: the first 4 take 2
    ("srun --ntasks 4", 4, 4, None),
    ("srun -N $NODES --ntasks-per-node 8", 8, 8, "srun's -N is '': parasim takes 1"),  # NODES unset: -N empty
    ("srun -p batch", None, None, "srun is given no -N, -n or --ntasks-per-node"),
])
def test_srun_starting_the_program_gives_the_world(tmp_path, srun, launched, per_node, said):
    job = _job(tmp_path, f"{srun} python pretrain_gpt.py {MODEL}\n")
    assert (job.launched, job.gpus_per_node) == (launched, per_node)
    assert [c[:len(said or "")] for c in job.contradictions] == ([] if said is None else [said])


def test_srun_launching_too_few_for_the_layout_says_srun(tmp_path):
    job = _job(tmp_path, f"srun -N 1 --ntasks-per-node 4 python pretrain_gpt.py {MODEL} "
                         "--tensor-model-parallel-size 8\n")
    assert job.contradictions == ["the script's srun launches 4 processes (4 per node x 1 node), but TP 8 x CP 1 x "
                                  "PP 1 needs a multiple of 8: parasim takes 8 GPUs (--gpus N, or --world N on "
                                  "layout and trace, takes another)"]


def test_srun_with_no_process_is_refused(tmp_path):
    with pytest.raises(UsageError, match="line 1: srun -N 0 launches no process"):
        _job(tmp_path, f"srun -N 0 python pretrain_gpt.py {MODEL}\n")


def test_llama3_behind_uv_run_reads_as_it_does_plain(tmp_path):
    with open(LLAMA) as f:
        text = f.read()
    assert "\ntorchrun ${DISTRIBUTED_ARGS[@]}" in text  # the file itself launches torchrun plainly
    plain = read_job(LLAMA)
    for prefix in ("uv run ", "srun -N 1 --ntasks-per-node 1 ", "nsys profile -o llama --trace cuda,nvtx "):
        job = _job(tmp_path, text.replace("\ntorchrun ${DISTRIBUTED_ARGS[@]}", f"\n{prefix}torchrun "
                                                                              "${DISTRIBUTED_ARGS[@]}"))
        assert job.script.prefixes == [prefix.split()]
        assert (job.given, job.layout, job.world, job.launched) == (plain.given, plain.layout, 8, 8)


def test_a_launch_behind_an_unknown_command_is_one_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(f"mywrapper --fast {TORCHRUN}\n")
    got = cli("memory", "--megatron", str(path))
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert "line 1: torchrun runs behind mywrapper, a command parasim does not read its way past (it knows uv run, " \
           "nsys profile, srun, env, exec, numactl, nohup, time): this launch is not read" in got.stderr
    # beside a launch it can read, the hidden one is a note; printing its words is no launch
    job = _job(tmp_path, f"echo {TORCHRUN}\nmywrapper {TORCHRUN}\nnsys launch {TORCHRUN}\n{TORCHRUN}\n")
    assert job.script.line == 4
    # nsys is read only as `nsys profile`
    assert [n.split(",")[0] for n in job.script.notes] == ["line 2: torchrun runs behind mywrapper",
                                                           "line 3: torchrun runs behind nsys"]


# -- variables from outside the script ----------------------------------------------------------------------
SCRIPT = ("NODES=${NODES:-1}\nGPUS=8\nTP=2\n"
          "torchrun --nproc_per_node $GPUS --nnodes $NODES pretrain_gpt.py "
          f"{MODEL} --tensor-model-parallel-size $TP --seq-length ${{SEQ:-128}}\n")


def test_a_variable_from_outside_is_read_and_the_script_s_own_assignment_wins(tmp_path):
    job = _job(tmp_path, SCRIPT, {"NODES": "2", "TP": "4", "SEQ": "256", "OTHER": "x"})
    assert (job.launched, job.layout["tp"], job.seq) == (16, 2, 256)  # 8 x 2 nodes; TP=2 is the script's
    assert job.script.outside_read == ["NODES", "SEQ"]  # read before the script set them; TP and OTHER not
    assert job.to_dict()["from_outside"] == ["NODES", "SEQ"]
    # an array from outside's text grows by += (bash: its text is element 0); one the script sets is its own
    job = _job(tmp_path, "EXTRA+=(--bf16)\nOWN=(--sequence-parallel)\nX=$SEQ$SEQ\ntorchrun --nproc_per_node 2 "
                         f"pretrain_gpt.py {MODEL} --tensor-model-parallel-size 2 ${{EXTRA[@]}} ${{OWN[@]}}\n",
               {"EXTRA": "--use-distributed-optimizer", "OWN": "--fp16", "SEQ": "1"})
    assert job.script.flags[-3:] == ["--use-distributed-optimizer", "--bf16", "--sequence-parallel"]
    assert job.script.outside_read == ["EXTRA", "SEQ"]  # each once, in the order read
    alone = _job(tmp_path, SCRIPT)
    assert (alone.launched, alone.seq, alone.script.outside_read) == (8, 128, [])


def test_megatron_env_on_the_command_line(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT)
    for command in ("memory", "fit", "layout"):
        got = cli(command, "--megatron", str(path), "--megatron-env", "NODES=2", "--megatron-env", "SEQ=256",
                  "--json")
        assert got.returncode == 0, got.stderr
        data = json.loads(got.stdout)
        assert data["layout"]["world"] == 16, command
    trace = tmp_path / "trace.sh"  # trace runs the job's step, which shards the optimizer state
    trace.write_text(SCRIPT.replace("pretrain_gpt.py", "pretrain_gpt.py --use-distributed-optimizer --bf16"))
    got = cli("trace", "--megatron", str(trace), "--megatron-env", "NODES=2", "--gpu", "0", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["sizes"]["dp"] == 8  # 8 GPUs x 2 nodes over TP 2
    text = cli("memory", "--megatron", str(path), "--megatron-env", "NODES=2", "--megatron-env", "SEQ=256").stdout
    assert "  read from outside the script (2): NODES, SEQ\n" in text
    assert "NODES" not in cli("memory", "--megatron", str(path)).stdout


def test_megatron_env_from_shell_takes_parasim_s_environment(tmp_path, monkeypatch):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT)
    monkeypatch.setenv("NODES", "4")
    monkeypatch.setenv("SEQ", "512")
    data = json.loads(cli("memory", "--megatron", str(path), "--megatron-env-from-shell", "--json").stdout)
    assert (data["layout"]["world"], data["seq"]) == (32, 512)
    assert data["megatron"]["from_outside"] == ["NODES", "SEQ"]
    # --megatron-env replaces the shell's; without --megatron-env-from-shell the shell's are not given
    data = json.loads(cli("memory", "--megatron", str(path), "--megatron-env-from-shell", "--megatron-env", "NODES=1",
                          "--json").stdout)
    assert (data["layout"]["world"], data["seq"]) == (8, 512)
    data = json.loads(cli("memory", "--megatron", str(path), "--json").stdout)
    assert (data["layout"]["world"], data["seq"]) == (8, 128)


@pytest.mark.parametrize("argv, words", [
    (["--megatron-env", "NODES"], "--megatron-env 'NODES': expected NAME=VALUE (such as NODES=4)"),
    (["--megatron-env", "1X=2"], "the variable '1X' from outside is not a name bash takes"),
    (["--megatron-env", "A-B=2"], "the variable 'A-B' from outside is not a name bash takes"),
    (["--megatron-env", "=2"], "the variable '' from outside is not a name bash takes"),
    (["--megatron-env", "A=" + "x" * (VALUE_CHARS + 1)], "the variable A from outside is longer than 1,048,576"),
])
def test_a_bad_variable_from_outside_is_one_line_and_exit_2(tmp_path, argv, words):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT)
    got = cli("memory", "--megatron", str(path), *argv)
    assert got.returncode == 2 and words in got.stderr and got.stderr.count("\n") == 1, got.stderr


def test_variables_from_outside_are_bounded_and_need_a_script(tmp_path):
    many = {f"V{i}": "x" * 1000 for i in range(OUTSIDE_CHARS // 1000)}  # each under the limit, all of them over
    with pytest.raises(UsageError, match="the variables from outside come to more than 1,048,576 characters"):
        read_script("python x.py\n", "job.sh", many)
    got = cli("memory", "--model", "27b", "--megatron-env", "NODES=2")
    assert got.returncode == 2 and "give it by --megatron FILE" in got.stderr and got.stderr.count("\n") == 1

"""Text from a file or a path never reaches the terminal as control characters: a config.json whose model_type
clears the screen, a launch script whose flags ring the bell or set the window title, a file name holding
ESC. Each case plants such text and runs the command for real: stdout and stderr hold the escaped spelling
(\\x1b) and none of the characters themselves."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ESC, BEL, RLO = "\x1b", "\x07", "\u202e"
# what a terminal acts on (parasim/render/text.py's UNSAFE, written out here: the test does not import it)
ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")

CONFIG = {"model_type": f"{ESC}[2Jwiped{BEL}", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
          "vocab_size": 100, "architectures": [f"{ESC}]0;title{BEL}X"], f"{ESC}[31mkey": 1}
SCRIPT = (f"#!/bin/bash\nX=$(echo {ESC}[2J)\nY=`date {ESC}]0;t{BEL}`\n"
          "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
          "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
          f"--vocab-size 100 --tokenizer-type \"{ESC}[31mGPT\" --{ESC}[2Jweird 1 --data-path \"{RLO}x\"\n")
BAD_NAME = f"{ESC}[2J{RLO}"

# (what, argv with {config} / {script} / {bad} for the planted files, where the escape must show)
CASES = [
    ("memory --config", ["memory", "--config", "{config}"], "stdout"),
    ("fit --config", ["fit", "--config", "{config}"], "stdout"),
    ("fit --config --search", ["fit", "--config", "{config}", "--search", "--nodes", "1"], "stdout"),
    ("layout --megatron", ["layout", "--megatron", "{script}"], "stdout"),
    ("memory --megatron", ["memory", "--megatron", "{script}"], "stdout"),
    ("memory --megatron --megatron-args", ["memory", "--megatron", "{script}", "--megatron-args"], "stdout"),
    ("trace --megatron, a missing file", ["trace", "--megatron", "{bad}"], "stderr"),
    ("memory --config, a missing file", ["memory", "--config", "{bad}.json"], "stderr"),
    ("view, a missing trace", ["view", "{bad}.json"], "stderr"),
    ("check, a missing program", ["check", "{bad}.py:prog", "--world", "2"], "stderr"),
    ("lesson, an unknown name", ["lesson", "{bad}"], "stderr"),
]


@pytest.mark.parametrize("what,argv,where", CASES, ids=[c[0] for c in CASES])
def test_text_from_files_and_paths_is_shown_escaped(tmp_path, what, argv, where):
    config = tmp_path / f"config{ESC}[5m.json"
    config.write_text(json.dumps(CONFIG))
    script = tmp_path / f"train{ESC}[2J.sh"
    script.write_text(SCRIPT)
    files = {"config": str(config), "script": str(script), "bad": BAD_NAME}
    args = [a.format(**files) for a in argv]
    got = subprocess.run([sys.executable, "-m", "parasim", *args], capture_output=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "COLUMNS": "100"})
    out, err = got.stdout.decode(), got.stderr.decode()
    assert "Traceback" not in err, err[-3000:]
    for name, text in (("stdout", out), ("stderr", err)):
        raw = ACTED_ON.search(text)
        assert raw is None, f"{what}: {name} holds {raw.group()!r}: {text[max(0, raw.start() - 80):raw.end() + 40]!r}"
    shown = out if where == "stdout" else err
    assert "\\x1b" in shown, f"{what}: the escape is not shown in {where}:\n{shown[-2000:]}"
    if where == "stderr":
        assert got.returncode == 2 and len(err.strip().splitlines()) == 1, err

"""The plain walk-through keeps the program's order: phases as a rank meets them, the ranks' notes in rank
order, compute said as one rank's work, no empty headings (issue 33, defects 5 and 11)."""
import re

from conftest import cli


def _headings(text):
    return [line[3:-3] for line in text.splitlines() if line.startswith("== ") and line.endswith(" ==")]


def _steps(text):
    return [int(m.group(1)) for m in re.finditer(r"^step +(\d+) ", text, re.M)]


def test_collectives_steps_come_in_order():
    text = cli("lesson", "collectives", "--plain").stdout
    steps = _steps(text)
    assert steps == sorted(steps) and steps[:3] == [1, 2, 3]
    assert _headings(text)[:3] == ["all-reduce", "reduce-scatter", "all-gather"]
    assert " 1 reduce-scatter hops" not in text


def test_slot_tables_list_gpu_1_first():
    for lesson in ("pp-zero-bubble", "pp-vs-zero3"):
        text = cli("lesson", lesson, "--plain").stdout
        for block in text.split("\n== ")[1:]:
            ranks = [int(r) for r in re.findall(r"^  rank (\d+): GPU", block, re.M)]
            if ranks:
                assert ranks == sorted(ranks), (lesson, block.splitlines()[0], ranks)


def test_moe16_syncs_gradients_after_the_last_backward_and_says_cp_rank():
    text = cli("lesson", "moe16", "--plain").stdout
    heads = _headings(text)
    last_backward = max(i for i, h in enumerate(heads) if h.startswith("backward"))
    assert heads.index("gradient sync") > last_backward
    # every heading has something under it
    for block in text.split("\n== ")[1:]:
        body = [line for line in block.splitlines()[1:] if line.strip()]
        assert body, block.splitlines()[0]
    assert "attend to K/V of CP rank" in text and "attend to K/V of rank" not in text
    assert re.search(r"^step +\d+  compute on rank \d+: .* \(\d[\d,]* FLOPs\)", text, re.M)
    assert not re.search(r"^step .*FLOPs.* on world\[", text, re.M)  # compute is no collective over the world

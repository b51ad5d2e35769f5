"""`parasim lesson` lists the lessons in the order of the post's sections, each with its section."""
import json

from conftest import cli

# The post's sections in the order it has them (collectives, DP/ZeRO, TP, SP, CP, PP, EP, the
# worked example), written out here, not read from the package.
POST = ["why-split", "collectives", "bf16-sums", "zero", "memory", "tp-mlp", "tp-attention", "sp", "tp-across-nodes", "ring-attention",
        "online-softmax", "cp-causal", "pp-gpipe", "pp-1f1b", "pp-interleaved", "pp-zero-bubble", "pp-vs-zero3",
        "ep-split", "folding", "moe-sp", "links-shared", "hot-expert", "all-to-all-hidden", "node-limited",
        "rules-of-thumb",
        "longest-sequence", "fit-is-not-fast", "published-layouts", "moe16", "moe16-variants", "at-scale", "silent-bugs", "checkpoint"]


def test_the_list_follows_the_post():
    out = cli("lesson", "--list", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    names = [r["name"] for r in rows]
    assert names == POST
    assert all(r["section"] for r in rows)
    assert names.index("moe16") > max(names.index(n) for n in names if n.startswith("pp-"))
    assert json.loads(cli("lesson", "--json").stdout) == rows  # no NAME: the same list


def test_the_plain_list_puts_collectives_first_with_its_section():
    text = cli("lesson").stdout
    assert text.index("collectives") < text.index("tp-mlp") < text.index("pp-gpipe") < text.index("moe16")
    assert "Tensor parallelism" in text and "Pipeline parallelism" in text


def test_list_with_a_name_is_one_line_exit_2():
    out = cli("lesson", "sp", "--list")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--list" in out.stderr

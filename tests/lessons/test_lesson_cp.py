"""The context-parallel lessons reproduce the post's figures by running: the online softmax's rescale and
weights, the ring's K/V table, and the causal work shares."""
import pytest

from parasim.lesson import get_lesson, run_lesson


def test_online_softmax_figures():
    lr = run_lesson(get_lesson("online-softmax"))
    assert all(c.ok for c in lr.checks)
    steps = lr.result.values[0]["steps"]
    assert round(float(steps[1]["rescale"][0]), 3) == 0.135
    assert round(float(steps[1]["l"][0]), 3) == 1.135
    assert [round(float(w), 3) for w in lr.result.values[0]["weights"][0]] == [0.119, 0.881]


def test_online_softmax_says_the_first_chunk_has_nothing_to_rescale():
    """Issue 53: at the first chunk there are no old terms (m is -inf, l and o are 0), so 'rescaled by ... = 0'
    misleads; from the second chunk on, the factor e^(m_old - m) is the run's own."""
    from parasim.render.walkthrough import walkthrough
    text = walkthrough(run_lesson(get_lesson("online-softmax")))
    first = text[text.index("== chunk 1 =="):text.index("== chunk 2 ==")]
    second = text[text.index("== chunk 2 =="):]
    assert "no old terms yet" in first and "rescaled by" not in first
    assert "old terms rescaled by e^(m_old - m) = 0.1353" in second  # e^(1 - 3): rank 0 meets the larger score


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_ring_attention_table_and_exactness(world):
    lr = run_lesson(get_lesson("ring-attention"), world)
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    if world == 4:
        assert [v["held"] for v in lr.result.values] == [[0, 3, 2, 1], [1, 0, 3, 2], [2, 1, 0, 3], [3, 2, 1, 0]]


def test_cp_causal_shares():
    lr = run_lesson(get_lesson("cp-causal"), 4)
    assert all(c.ok for c in lr.checks)
    assert [v["contiguous"]["blocks"] for v in lr.result.values] == [2, 6, 10, 14]
    assert [v["zigzag"]["blocks"] for v in lr.result.values] == [8, 8, 8, 8]
    two = run_lesson(get_lesson("cp-causal"), 2)
    notes = [m.text for m in two.result.trace.marks if m.kind == "note" and "sentence" in m.text]
    assert notes == ["zigzag on the example sentence: the court was void",
                     "zigzag on the example sentence: ruled that the contract"]


def test_cp_causal_table_gives_the_post_s_units_and_shares():
    """The post counts a contiguous rank's causal work in whole-chunk pairs, 0.5 / 1.5 / 2.5 / 3.5, and gives
    shares 6 / 19 / 31 / 44 %; the run counts blocks of the 2cp-way split (4 to a chunk pair). The table
    has both, worked out here from the causal triangle: rank i sees i whole chunk pairs and half its own."""
    import json
    from conftest import cli
    data = json.loads(cli("lesson", "cp-causal", "--json").stdout)
    (table,) = data["tables"]
    rows = table["rows"]
    cp = 4
    post_units = [i + 0.5 for i in range(cp)]
    assert [r["in chunk-pairs"] for r in rows] == post_units
    assert [r["contiguous: blocks"] for r in rows] == [4 * u for u in post_units]
    assert [r["contiguous share %"] for r in rows] == [round(100 * u / sum(post_units)) for u in post_units] == [6, 19, 31, 44]
    assert [r["contiguous share %"] for r in rows][0] == 6 and {r["zigzag: blocks"] for r in rows} == {8}
    assert "4 blocks" in table["notes"][0]


def test_cp_causal_at_cp_3_grows_the_sequence_to_18():
    """Issue 53: --cp 3 was refused (16 tokens do not cut into 6 equal pieces); the sequence now grows to the
    next multiple of 2cp, 18, and the counts are the same rule's: contiguous rank i 4i + 2 blocks, zigzag 2cp each
    (worked out by hand)."""
    import json
    from conftest import cli
    data = json.loads(cli("lesson", "cp-causal", "--cp", "3", "--json").stdout)
    assert data["world"] == 3 and all(c["ok"] for c in data["checks"])
    assert [v["contiguous"]["blocks"] for v in data["values"]] == [2, 6, 10]
    assert [v["zigzag"]["blocks"] for v in data["values"]] == [6, 6, 6]
    assert data["tables"][0]["title"] == "Causal work per CP rank, 18 tokens over 3 ranks"


def test_a_zigzag_rank_s_two_chunks_are_said_one_by_one():
    """Zigzag at CP 4 over 16 tokens: rank r holds chunks r and 7 - r of 2 tokens each; the middle rank's two
    meet (7-8 and 9-10) and are still said as two."""
    import re
    from conftest import cli
    text = re.sub(r"\n {6}(?=\S)", " ", cli("lesson", "cp-causal", "--plain").stdout)
    zig = text.split("== zigzag split ==")[1]
    for r, (a, b) in enumerate([(1, 15), (3, 13), (5, 11), (7, 9)]):
        assert f"rank {r}: tokens {a}-{a + 1} + {b}-{b + 1}: work 8 blocks" in zig


def test_online_softmax_says_its_float32_tolerance_in_plain_words():
    """The last check's tolerance: five float32 roundings (one addition for two keys, two in the exp, one in the
    divide, one spare), each off by at most u = 2^-24, so 5u / (1 - 5u) relative. Its name once read 'rtol
    gamma(5) at float32's u = 2^-24': the figure stays, the symbols go."""
    from parasim.render.walkthrough import walkthrough
    u = 2.0 ** -24
    bound = 5 * u / (1 - 5 * u)
    lr = run_lesson(get_lesson("online-softmax"))
    (c,) = [c for c in lr.checks if c.name.startswith("... while subtracting the max first")]
    assert c.ok
    assert f"within a relative {bound:.2g}, the most that 5 float32 roundings can add up to" in c.name
    assert "the sum's 1 addition, two in the exp, one in the divide, and one to spare" in c.name
    text = " ".join(walkthrough(lr).split())
    assert "gamma(" not in text and "u = 2^-24" not in text and "rtol" not in text


def test_cp_causal_walkthrough_shows_a_ring_step_and_counts_the_rest():
    """Walk 25 (#13): the 48 transfers were listed one by one (262 lines). Each split now shows its first ring
    steps (the skip of a future chunk among them, said as 'CP rank' like the attend lines) and counts the rest:
    at CP 4 a split passes K and V 3 times on each of 4 ranks, 24 transfers, of which the two shown steps'
    (K and V, folded over the 4 ranks) are 8. The table's last note points to the custom-mask limit."""
    import re
    from conftest import cli
    text = cli("lesson", "cp-causal", "--plain", "--width", "100").stdout
    assert len(text.splitlines()) < 130
    assert "skip K/V of CP rank 3" in text and "K/V of rank" not in text
    flat = re.sub(r"\n {4,}(?=\S)", " ", text)
    cont = flat.split("== contiguous split ==")[1].split("== zigzag split ==")[0]
    assert len(re.findall(r"^step +\d+  p2p", cont, re.M)) == 2  # K and V of one step, the others folded
    assert f"more events in this phase ({4 * 3 * 2 - 2 * 4} p2p" in cont
    tables = flat.split("== tables")[1]
    assert "`parasim cheatsheet`" in tables and f"{14 / 8:.2f}x faster" in tables

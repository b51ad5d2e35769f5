"""Lessons whose settings a learner can turn (issue 33, build item 3): each runs exact at other settings and
checks itself; a setting a lesson does not take is one line, exit 2."""
import json
from fractions import Fraction

import pytest
from conftest import cli


def _run(*args):
    out = cli("lesson", *args, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["checks"] and all(c["ok"] for c in data["checks"]), [c for c in data["checks"] if not c["ok"]]
    return data


def _settings(text: str) -> str:
    """The walk-through's settings line (after its title, which may take two lines)."""
    return next(line for line in text.splitlines() if line.startswith("settings: "))


def _check(data, start):
    return next(c for c in data["checks"] if c["name"].startswith(start))


def test_sp_at_tp_4():
    data = _run("sp", "--tp", "4")
    assert data["world"] == 4 and data["settings"] == {"tp": 4}
    s, b, h = 16, 1, 16  # the lesson's layer; Korthikanti et al.: sbh(10 + 24/t) and 34sbh/t
    assert _check(data, "TP alone keeps")["got"] == [s * b * h * (10 + 24 / 4)]
    assert _check(data, "TP + SP keeps")["got"] == [34 * s * b * h / 4]


def test_1f1b_at_8_stages_16_microbatches():
    data = _run("pp-1f1b", "--pp", "8", "-m", "16")
    assert data["world"] == 8 and data["settings"] == {"pp": 8, "m": 16}
    assert Fraction(_check(data, "bubble")["got"]) == Fraction(7, 23)  # (p-1)/(m+p-1)
    assert _check(data, "micro-batches whose activations")["got"] == [8, 7, 6, 5, 4, 3, 2, 1]


def test_cp_causal_at_cp_8():
    data = _run("cp-causal", "--cp", "8")
    assert data["world"] == 8
    # 16 blocks of the zigzag split; rank i's contiguous queries see 4i + 2 of them (halves on the diagonal)
    assert _check(data, "contiguous")["got"] == [4 * i + 2 for i in range(8)]


def test_gpipe_with_few_microbatches_holds_all_of_them():
    data = _run("pp-gpipe", "--pp", "2", "-m", "3")
    assert Fraction(_check(data, "bubble")["got"]) == Fraction(1, 4)
    assert _check(data, "micro-batches whose activations")["got"] == [3, 3]


@pytest.mark.parametrize("args, needle", [
    (("sp", "--cp", "2"), "has no --cp"),
    (("sp", "--tp", "3"), "--tp 1 or 2 or 4 or 8, not 3"),
    (("collectives", "--tp", "4"), "has no --tp"),
    (("pp-1f1b", "--pp", "8", "--world", "4"), "disagree"),
    (("--tp", "4"), "apply to one lesson"),
    (("sp", "--tp", "0"), "--tp"),
])
def test_a_setting_that_does_not_apply_is_one_line(args, needle):
    out = cli("lesson", *args, "--json")
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1 and needle in out.stderr


def test_the_list_names_each_lesson_s_settings():
    rows = {r["name"]: r for r in json.loads(cli("lesson", "--list", "--json").stdout)}
    assert rows["pp-1f1b"]["knobs"] == {"--pp": {"default": 4, "choices": None, "post": 4},
                                        "--microbatches": {"default": 4, "choices": None, "post": 4}}
    # where the post's own value is not the lesson's default, or the post names none (issue 53)
    assert rows["moe16"]["knobs"]["--routing"]["post"] == "post"
    assert rows["tp-attention"]["knobs"]["--tp"]["post"] == 16
    assert rows["pp-zero-bubble"]["knobs"]["--microbatches"]["post"] is None
    assert rows["collectives"]["knobs"] == {}


def test_the_walk_through_says_the_settings_beside_the_post_s():
    text = cli("lesson", "sp", "--tp", "4", "--plain").stdout
    assert "settings: --tp 4  (the post's: --tp 8)" in _settings(text)
    assert "settings: --tp 8  (the post's)" in _settings(cli("lesson", "sp", "--plain").stdout)


@pytest.mark.parametrize("name, said", [
    ("longest-sequence", "(the lesson's defaults; the post's is --tp 8:"),
    ("memory", "(the lesson's defaults; the post gives no --tp:"),
    ("tp-attention", "(the lesson's defaults; the post's is --tp 16:"),
    ("pp-zero-bubble", "(the lesson's defaults; the post gives no --microbatches)"),
])
def test_a_default_that_is_not_the_posts_is_not_called_the_posts(name, said):
    """Issue 53: "(the post's)" only where it is; elsewhere the post's own value, or that it gives none."""
    head = " ".join(cli("lesson", name, "--plain").stdout.split("\n== ")[0].split())
    assert said in head and "(the post's)" not in head
    at_post = " ".join(cli("lesson", "moe16", "--plain").stdout.split("\n== ")[0].split())
    assert "settings: --routing post (the post's)" in at_post  # moe16's default is the post's routing
    other = _settings(cli("lesson", "pp-zero-bubble", "--pp", "2", "-m", "4", "--plain").stdout)
    assert other == "settings: --pp 2, --microbatches 4  (the post's: --pp 4; it gives no --microbatches)"


def test_a_symbolic_lesson_says_symbolic_ranks():
    lines = cli("lesson", "at-scale", "--plain").stdout.splitlines()
    head = " ".join([lines[0]] + [line for line in lines[1:3] if line.startswith("  ")])  # the title, wrapped
    assert "symbolic ranks" in head and "virtual" not in head


def test_moe16_with_the_post_s_routing_is_exact():
    data = _run("moe16", "--routing", "post")
    assert data["settings"] == {"routing": "post"}
    notes = [e for e in data["events"]]  # the run happened on 16 ranks
    assert data["world"] == 16 and notes
    text = cli("lesson", "moe16", "--routing", "post", "--plain").stdout
    assert "the post's routing (scripted) picks E3" in text
    out = cli("lesson", "moe16", "--routing", "skewed", "--json")
    assert out.returncode == 2 and "post or learned" in out.stderr


@pytest.mark.parametrize("args, world", [(("ring-attention", "--cp", "8"), 8), (("tp-attention", "--tp", "2"), 2),
                                         (("zero", "--dp", "4"), 4), (("pp-interleaved", "--pp", "2", "-m", "4",
                                                                       "--chunks", "3"), 2)])
def test_more_lessons_run_exact_at_other_settings(args, world):
    assert _run(*args)["world"] == world


def test_one_setting_changed_of_two_is_not_the_post_s():
    second = _settings(cli("lesson", "pp-1f1b", "--pp", "8", "--plain").stdout)
    assert second == "settings: --pp 8, --microbatches 4  (the post's: --pp 4, --microbatches 4)"


def test_world_given_as_world_is_the_world_setting():
    assert _run("sp", "--world", "4")["settings"] == {"tp": 4}


def test_interleaving_note_only_for_several_chunks():
    from parasim.pipeline.schedules import rounds_note
    assert rounds_note(4, 6, 1) is None and rounds_note(4, 8, 2) is None and "1 round of 6" in rounds_note(4, 6, 2)


def test_every_setting_offered_is_taken_by_some_lesson():
    from parasim.lesson import KNOB_KINDS, load_lessons
    taken = {name for lesson in load_lessons().values() for name in lesson.knobs}
    assert set(KNOB_KINDS) == taken


def test_zero_bubble_at_2_stages_4_microbatches():
    data = _run("pp-zero-bubble", "--pp", "2", "-m", "4")
    assert data["settings"] == {"pp": 2, "m": 4}
    F, B, I, W = 2, 4, 2, 2  # half-stage units: a forward 2, a backward 4 (input 2 + weights 2)
    assert _check(data, "1F1B makespan")["got"] == 4 * (F + B) + (2 - 1) * (F + B)
    assert _check(data, "ZB-H1 idle per GPU")["got"] == [(2 - 1) * (F + I - W)] * 2
    assert _check(data, "ZB-H1: the loss equals")["ok"]


def test_dualpipev_needs_twice_as_many_microbatches_as_stages():
    out = cli("lesson", "pp-zero-bubble", "-m", "4", "--json")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "m >= 2 * pp = 8" in out.stderr


@pytest.mark.parametrize("name", ["memory", "longest-sequence"])
def test_the_small_layer_at_tp_2_and_8(name):
    """TP alone makes 4 all-reduces per layer (2 forward, 2 backward) of s*b*h = 16*1*16 float64 values; a ring
    sends 2(t-1)/t of each."""
    for t in (2, 8):
        data = _run(name, "--tp", str(t))
        assert data["world"] == t and data["settings"]["tp"] == t
        sent = next(c for c in data["checks"] if c["name"].startswith("TP alone") and "sent" in c["name"])
        assert sent["got"] in (4 * 2 * (t - 1) / t * 16 * 16 * 8, [4 * 2 * (t - 1) / t * 16 * 16 * 8] * t)


def test_pp_vs_zero3_with_8_microbatches():
    """8 micro-batches of 2 sequences of 4 tokens, hidden 8: PP sends 8*2*4*8 values of 8 B forward and back over
    3 boundaries; its bubble is (p-1)/(m+p-1) = 3/11; ZeRO-3's bytes follow the weights, not the batch."""
    data = _run("pp-vs-zero3", "-m", "8")
    sent = _check(data, "the post's table, [PP, ZeRO-3]: bytes sent per step")["got"]
    assert int(sent[0]) == 8 * 2 * 4 * 8 * 8 * 2 * 3
    assert _check(data, "the post's table, [PP, ZeRO-3]: bubble")["got"] == ["3/11", "0"]
    base = _run("pp-vs-zero3")
    assert _check(base, "the post's table, [PP, ZeRO-3]: bytes sent per step")["got"][1] == sent[1]


def test_moe_sp_at_tp_4_does_the_expert_work_four_times():
    """The half "the contract was void" is 4 tokens, top-2: without SP each of 4 ranks routes all 4 tokens,
    4 x 4 x 2 (token, expert) copies; with SP each token once, 4 x 2."""
    data = _run("moe-sp", "--tp", "4")
    assert _check(data, "token copies")["got"] == [4 * 4 * 2, 4 * 2]
    assert _check(data, "rows dispatched")["got"] == 4


def test_tp_mlp_at_tp_4_one_column_each_and_at_tp_1_unsplit():
    """X = [1, 2]; A's columns are [1, 0], [0, 1], [-1, 1], [2, -1], so at --tp 4 rank i holds Y_i =
    ReLU(X·A[:, i]) = 1, 2, 1, 0 and the all-reduce after B gives Z = 1·[1 0] + 2·[0 1] + 1·[1 1] = [2, 3]; on one
    rank the 'wrong' row split is no split at all: ReLU(X·A) = [1, 2, 1, 0]."""
    data = _run("tp-mlp", "--tp", "4")
    assert data["world"] == 4 and data["settings"] == {"tp": 4}
    assert [v["Y_i"] for v in data["values"]] == [[[[1.0]]], [[[2.0]]], [[[1.0]]], [[[0.0]]]]
    assert [v["Z"] for v in data["values"]] == [[[[2.0, 3.0]]]] * 4
    one = _run("tp-mlp", "--tp", "1")
    assert one["values"][0]["ReLU then sum"] == [[[1.0, 2.0, 1.0, 0.0]]]


def test_compare_tp_mlp_one_row_per_setting():
    out = cli("compare", "tp-mlp", "--tp", "1,2,4", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [r["settings"] for r in rows] == [{"tp": 1}, {"tp": 2}, {"tp": 4}] and all(r["ok"] for r in rows)


def test_tp_mlp_refuses_a_split_of_four_columns_over_three():
    out = cli("lesson", "tp-mlp", "--tp", "3", "--json")
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "takes --tp 1 or 2 or 4, not 3" in out.stderr


def test_a_refused_setting_says_why_where_the_lesson_knows():
    """Issue 53: a TP size tp-attention cannot split its heads over is refused in one line that says which it
    takes and where the post's own case is."""
    out = cli("lesson", "tp-attention", "--tp", "3")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "takes --tp 1 or 2 or 4 or 8 or 16, not 3 (" in out.stderr and "runs with --tp 16" in out.stderr


def test_the_posts_gqa_case_runs_at_tp_16():
    """Issue 53: the post's GQA case, 8 KV heads on 16 GPUs, two each: at --tp 16 the model has 16 heads, rank r
    holds query head r and KV head r // 2 (worked out here), and every check holds, exact against one device."""
    data = _run("tp-attention", "--tp", "16")
    assert data["world"] == 16 and all(c["ok"] for c in data["checks"])
    held = [v["gqa"]["held"] for v in data["values"]]
    assert held == [{"q": [r], "k": [r // 2], "v": [r // 2]} for r in range(16)]
    text = cli("lesson", "tp-attention", "--tp", "16", "--plain").stdout
    assert "settings: --tp 16  (the post's)" in text


def test_online_softmax_on_a_ring_of_4():
    """Keys 1, 3, 2, 4 on four ranks: rank 0 sees them in that order; key 2 leaves the max at 3 (factor e^0 = 1),
    key 4 raises it (factor e^(3 - 4)); the weights are e^(k - 4) / (e^-3 + e^-1 + e^-2 + 1)."""
    import math
    data = _run("online-softmax", "--cp", "4")
    assert data["world"] == 4 and data["settings"] == {"cp": 4}
    steps = data["values"][0]["steps"]
    assert [s["rescale"][0] for s in steps[2:]] == [1.0, pytest.approx(math.exp(-1))]
    total = math.exp(-3) + math.exp(-1) + math.exp(-2) + 1
    assert data["values"][0]["weights"][0] == pytest.approx([math.exp(k - 4) / total for k in (1, 3, 2, 4)], rel=1e-12)


def test_memory_s_zero_table_over_4_dp_ranks():
    """Mixed-precision Adam: 2 + 2 + 12 bytes per parameter; over d = 4 DP ranks ZeRO-1 keeps 4 + 12/4 = 7,
    ZeRO-2 2 + 14/4 = 5.5, ZeRO-3 16/4 = 4, so ZeRO-0's GB per GPU is four times ZeRO-3's."""
    data = _run("memory", "--tp", "2", "--dp", "4")
    assert data["settings"] == {"tp": 2, "dp": 4}
    assert [_check(data, f"ZeRO-{z}: bytes per parameter")["got"] for z in range(4)] == [16, 7, 5.5, 4]
    table = next(t for t in data["tables"] if t["title"].startswith("The 27B model's weights"))
    assert "over 4 DP ranks" in table["title"] and "divided by 4" in table["notes"][0]
    gb = {r["stage"]: r["GB per GPU"] for r in table["rows"]}
    assert gb["ZeRO-0"] == pytest.approx(4 * gb["ZeRO-3"])


def test_memory_says_plainly_what_each_setting_sizes():
    """--tp is the number of ranks (they run the small layer and its small ZeRO step, as one DP group); --dp
    sizes only the 27B model's figures. The walk-through once reused --tp's size as 'the DP group here' in a
    parenthesis beside --dp, which read as if the two were one knob."""
    at_defaults = cli("lesson", "memory", "--plain", "--width", "100").stdout
    head = " ".join(at_defaults.split("\n== ")[0].split())
    assert "--tp: it is the number of ranks, which run the small layer and its ZeRO step; --dp sizes only the " \
           "27B figures" in head
    text = cli("lesson", "memory", "--tp", "2", "--dp", "4", "--plain", "--width", "100").stdout
    words = " ".join(text.split())
    assert "27B over 4 DP ranks, ZeRO-3: 4 bytes per parameter" in words  # --dp 4: the 27B figures, 16 / 4
    assert "the run's 2 ranks as one DP group: each rank keeps" in words  # --tp 2: the small ZeRO step's group
    assert "--tp's, the DP group here" not in words and "--dp sizes the 27B figures above" not in words


def test_memory_refuses_a_setting_it_does_not_take_naming_both_it_does():
    out = cli("lesson", "memory", "--pp", "2", "--json")
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "has no --pp (the settings it takes: --tp, --dp)" in out.stderr


def test_sent_in_phase_adds_up_what_one_rank_sent():
    """sp at t = 2, TP alone: 4 all-reduces (f and g, forward and backward) of s*b*h = 16*1*16 float64
    values, a ring sending 2(t-1)/t of each: 4 * 16*16*8 B from every rank. With SP the all-gathers and
    reduce-scatters that replace them send half of that each, the same in all."""
    from parasim.figures import sent_in_phase
    from parasim.lesson import get_lesson, run_lesson
    result = run_lesson(get_lesson("sp"), knobs={"tp": 2}).result
    sbh = 16 * 1 * 16 * 8
    assert [sent_in_phase(result, "TP alone", rank=r) for r in (0, 1)] == [4 * sbh, 4 * sbh]
    in_place = lambda e: e.op in ("all_gather", "reduce_scatter") and "again" not in (e.label or "")  # noqa: E731
    assert sent_in_phase(result, "TP + SP", in_place) == 4 * sbh
    every = sum(m.sent for e in result.trace.events for m in e.members if m.rank == 0)
    assert sent_in_phase(result, None) == every > 4 * sbh


def test_narratives_at_other_settings_say_what_is_the_post_s():
    """pp-zero-bubble on 2 GPUs has no GPU 4; pp-vs-zero3 at -m 8 has 16 sequences, not the post's 8."""
    zb = cli("lesson", "pp-zero-bubble", "--pp", "2", "-m", "4", "--plain").stdout
    assert "GPU 4 the two middle ones" not in zb and "the last GPU (GPU 4 at the post's p = 4)" in zb
    pz = " ".join(cli("lesson", "pp-vs-zero3", "-m", "8", "--plain").stdout.split())
    assert "8 sequences goes through in 4 micro-batches" not in pz and "on its own 2 sequences" not in pz
    assert "(4 of them at the post's settings, -m sets it)" in pz


def test_at_scale_at_ep_4_with_balanced_routing():
    """Balanced routing gives token j the experts j + 32i (i < 8) mod 256; at EP 4 (64 experts a GPU) that is two
    picks on every GPU, so each GPU sends 3/4 of its 4,096 x 8 pairs away, and each token once to each of the
    3 other GPUs, a row of 7,168 values and 64 gates at 2 bytes."""
    data = _run("at-scale", "--ep", "4", "--routing", "balanced")
    assert data["world"] == 4 and data["settings"] == {"ep": 4, "routing": "balanced"}
    assert _check(data, "pairs leaving each GPU at EP 4")["got"] == [4096 * 8 * 3 // 4] * 4
    assert _check(data, "what the run sends instead")["got"] == [3 * 4096 * (7168 + 64) * 2] * 4


@pytest.mark.parametrize("args, why", [
    (("tp-mlp", "--tp", "3"), "A has 4 columns and B 4 rows"),
    (("sp", "--tp", "3"), "8 heads and 16 tokens split into equal whole shares"),
    (("zero", "--dp", "3"), "1,088 weights (17 x 64) cuts into equal shards"),
    (("tp-attention", "--tp", "3"), "each rank takes whole heads"),
    (("ring-attention", "--cp", "3"), "the 8-token sequence cut into equal chunks"),
    (("online-softmax", "--cp", "5"), "one key a rank, of the 4 keys"),
])
def test_a_refused_value_says_why_the_lesson_takes_only_its_own(args, why):
    out = cli("lesson", *args, "--plain")
    assert out.returncode == 2 and why in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_moe_sp_with_the_post_s_routing_sends_contract_to_e3_and_e8_under_sp_and_without():
    """The post draws 'contract' -> E3 and E8 (and 'the' -> E1 and E2); with SP each GPU routes its own share,
    so the rank holding 'was' and 'void' routes them as the pair did without SP (the router's own choice)."""
    import re
    text = re.sub(r"\n {6}(?=\S)", " ", cli("lesson", "moe-sp", "--plain", "--routing", "post").stdout)
    without, with_sp = text.split("== with SP ==")
    assert "'contract' to E3 on g0, E8 on g1" in without and "'the' to E1 on g0, E2 on g0" in without
    mine = dict(re.findall(r"'(\w+)' to ([^;']+)", re.search(r"rank 0: routes (.*?); its experts", without)[1]))
    later = dict(re.findall(r"'(\w+)' to ([^;']+)", re.search(r"rank 1: routes (.*?); its experts", with_sp)[1]))
    assert list(later) == ["was", "void"] and all(later[w] == mine[w] for w in later)

"""The 16-GPU MoE example: every parallelism at once gives the unsplit model's loss and gradients, and
`parasim trace` follows a token through it from the run's own trace."""
import json

import pytest
from conftest import cli, cli_process

import parasim
from parasim.errors import UsageError
from parasim.lesson import get_lesson, run_lesson
from parasim.examples.moe16 import find_token, make_program
from parasim.examples.moe16_path import token_path
from parasim.nn import ParallelContext
from parasim.layout import preset


def _cli(*args, timeout=120):
    return cli_process(*args, timeout=timeout) if args[0] == "run" else cli(*args)


def _got(lr, start: str):
    (c,) = [c for c in lr.checks if c.name.startswith(start)]
    return c.got


def test_lesson_checks():
    lr = run_lesson(get_lesson("moe16"))
    assert lr.ok, [c for c in lr.checks if not c.ok]
    # the post's map, as the run found it
    assert _got(lr, "the GPU holding 'contract'") == [2, ["the", "contract"]]  # g2, beside "the"
    assert _got(lr, "it is routed") == [[2, "layer 1"], [2, "layer 2"], [10, "layer 3"], [10, "layer 4"]]
    # g0 t1 t2, g1 t3 t4 (the TP pair of CP rank 0), g2 t5 t6, g3 t7 t8 (CP rank 1), and the same on each
    # following group of 4 GPUs (the other DP replica, then the second pipeline stage)
    assert _got(lr, "token positions each GPU holds") == [[0, 1], [2, 3], [4, 5], [6, 7]] * 4
    # g0: E1 E2, g1: E3 E4, g2: E5 E6, g3: E7 E8, in both layers of its stage, and the same on every EP group
    assert _got(lr, "experts each GPU holds") == [[[0, 1]] * 2, [[2, 3]] * 2, [[4, 5]] * 2, [[6, 7]] * 2] * 4
    assert _got(lr, "its GPU keeps Adam state") == [0.25, 0.5]  # split 4 ways for attention, 2 for experts
    assert _got(lr, "every weight's gradient") == "92 of 92 weights"


def test_a_wrong_sequence_split_fails_the_position_check(monkeypatch):
    """Give each TP pair's shares the other way round (TP rank 0 the second half of its CP half): the
    position check must say so."""
    split = ParallelContext.token_positions

    def swapped(self):
        pos = split(self)
        return [p ^ 2 if self.sp else p for p in pos]  # t1 t2 <-> t3 t4, t5 t6 <-> t7 t8
    monkeypatch.setattr(ParallelContext, "token_positions", swapped)
    lr = run_lesson(get_lesson("moe16"))
    assert not lr.ok
    assert any(c.name.startswith("token positions each GPU holds") for c in lr.checks if not c.ok)


def test_contract_path():
    path = token_path(parasim.run(make_program(("A", 5)), 16).trace, ("A", 5))
    steps = path["steps"]
    assert path["token"] == "contract" and path["position"] == 6 and path["micro_batch"] == 1
    assert steps[0]["text"].startswith("g2: holds 'contract'")  # the post's map: t6 lives on g2
    forward = [s for s in steps if s["phase"].startswith("forward") and "event" in s]
    assert {s["group"] for s in forward} >= {"tp", "cp", "ep", "pp"}
    handoff = [s for s in forward if s["group"] == "pp"]
    assert handoff[0]["ranks"] == [2, 10] and "activation 1" in handoff[0]["text"]  # node A -> node B
    for layer in (1, 2, 3, 4):  # the router's choice is noted just before the dispatch it decides
        mine = [s for s in steps if s["phase"] == f"forward mb1 layer {layer}"]
        k = next(i for i, s in enumerate(mine) if "router picks" in s["text"])
        assert mine[k + 1]["op"] == "all_to_all" and "dispatch" in mine[k + 1]["text"]
    sync = {(s["op"], s["group"], tuple(s["ranks"])) for s in steps if s["phase"] == "gradient sync"}
    for op in ("reduce_scatter", "all_gather"):  # ZeRO-1, over 4 GPUs for attention and 2 for experts
        assert (op, "dp-cp", (0, 2, 4, 6)) in sync and (op, "expert-dp", (2, 6)) in sync


@pytest.mark.parametrize("word, where", [("contract", ("A", 5)), ("t1", ("A", 0)), ("the", ("A", 0)),
                                         ("C:claim", ("C", 4)), ("D:t8", ("D", 7))])
def test_find_token(word, where):
    assert find_token(word) == where


def test_cli():
    out = _cli("trace", "--layout", "moe16", "--token", "contract")
    assert out.returncode == 0 and "g2 -> g10" in out.stdout and "router picks" in out.stdout
    data = json.loads(_cli("trace", "--token", "C:claim", "--json").stdout)
    assert data["sequence"] == "C" and data["steps"][0]["text"].startswith("g6: holds 'claim'")
    for args in (["--token", "banana"], ["--layout", "27b-tp8"], ["--token", "E:the"]):
        bad = _cli("trace", *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, args


@pytest.mark.slow
def test_real_ranks():
    """All 16 ranks as gloo processes: the same calls and values as the virtual run, and the checks hold."""
    pytest.importorskip("torch", reason="real ranks need torch")
    out = _cli("run", "moe16", "--backend", "gloo", "--nproc", "16", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["match"] is True and all(c["ok"] for c in data["checks"])


def test_bad_token():
    with pytest.raises(UsageError):
        find_token("t9")


def test_moe_needs_sp():
    """The post's count for g2 and g3 on "the contract was void": 16 token copies without SP, 8 with it."""
    lr = run_lesson(get_lesson("moe-sp"))
    assert lr.ok, [c for c in lr.checks if not c.ok]
    assert lr.checks[0].got == [16, 8] and lr.checks[1].got == 2


@pytest.mark.parametrize("tp", [2, 4])
def test_moe_sp_says_where_each_token_goes(tp):
    """Issue 53: "g0 sends 'the' to E1, E2" is what a learner wants. Without SP every GPU of the pair routes all
    four words the same way (the same line on each); with SP each routes its own share; every expert is named
    with the GPU holding it (8 experts in order, 8/t a GPU), and each word keeps its two experts."""
    import re

    from parasim.render.walkthrough import walkthrough

    text = walkthrough(run_lesson(get_lesson("moe-sp"), knobs={"tp": tp}))
    text = re.sub(r"\n {6}(?=\S)", " ", text)  # a note wrapped at the page's width, read as one line
    without, with_sp = text.split("== with SP ==")
    said = {p: dict(re.findall(r"rank (\d): routes (.*); its experts", part)) for p, part in
            (("without", without), ("with", with_sp))}
    assert len(set(said["without"].values())) == 1 and len(said["without"]) == tp
    words = {w: dests for line in said["without"].values() for w, dests in re.findall(r"'(\w+)' to ([^;']+)", line)}
    assert list(words) == ["the", "contract", "was", "void"]
    shared = [re.findall(r"'(\w+)' to ([^;']+)", said["with"][str(r)]) for r in range(tp)]
    assert [w for part in shared for w, _ in part] == list(words)  # each word routed once, by its own GPU
    assert all(dict(part).items() <= words.items() for part in shared)  # ... to the same experts
    for dests in words.values():
        pairs = re.findall(r"E(\d) on g(\d)", dests)
        assert len(pairs) == 2 and all(int(g) == (int(e) - 1) // (8 // tp) for e, g in pairs)


def _holder(args: list[str]) -> tuple[int, dict]:
    data = json.loads(_cli("trace", *args, "--json").stdout)
    first = data["steps"][0]
    return first["ranks"][0], data


def test_the_zigzag_split_moves_contract_to_g3():
    """Zigzag over CP 2 cuts the 8 tokens in 4 chunks; CP rank 1 holds chunks 2 and 3 (t3-t6) and SP gives
    its TP rank 1 the second half (t5 t6): in Megatron's order (tp fastest, then cp) that is rank 1 + 2 = 3.
    The contiguous split gives CP rank 1 t5-t8, of which TP rank 0 holds t5 t6: g2."""
    assert _holder(["--layout", "moe16", "--split", "zigzag"])[0] == 3
    assert _holder(["--layout", "moe16"])[0] == 2


@pytest.mark.parametrize("args, holder", [
    # experts split by TP (ETP 2, EP 2) with TP, SP, CP and PP: t6 on CP rank 1 (t5-t8), TP rank 0 (t5 t6): g2
    (["--tp", "2", "--cp", "2", "--pp", "2", "--ep", "2", "--etp", "2", "--sp", "--experts", "8", "--world", "16",
      "--token", "t6"], 2),
    # dense, TP 2 without SP: both TP ranks of the first stage's replica 0 hold t3 (the first one notes first)
    (["--tp", "2", "--pp", "2", "--dp", "2", "--experts", "0", "--token", "t3"], 0),
    # EP 4 over DP 4: 'court' (t2 of A) is on replica 0, whose only GPU is g0
    (["--dp", "4", "--ep", "4", "--token", "court"], 0),
    # 3 micro-batches per replica, zigzag: B is replica 0's second sequence; 'law' is t6: CP rank 1, TP rank 1
    (["--tp", "2", "--sp", "--cp", "2", "--ep", "4", "--world", "8", "--split", "zigzag", "-m", "3",
      "--token", "B:law"], 3),
])
def test_any_layout_traces_exactly(args, holder):
    got, data = _holder(args)
    assert got == holder
    x = data["exactness"]
    assert x["exact"] and x["gradients"] == x["weights_after_adam"] and abs(x["loss"] - x["unsplit_loss"]) < 1e-9


def test_bad_trace_layouts_are_one_line():
    for args, why in ((["--tp", "3"], "heads 4 do not divide by tp 3"), (["--pp", "3"], "layers 4 do not divide"),
                      (["--layout", "moe16", "--tp", "2"], "not both"),
                      (["--experts", "-1"], "--experts: expected an integer from 0"),
                      (["--routing", "post", "--experts", "4"], "the post's routing picks 2 of experts E1-E8")):
        bad = _cli("trace", *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and why in bad.stderr, args


def test_the_posts_routing_reproduces_its_step_4_and_stays_exact():
    """--routing post: contract goes to E3 (on g1, gate 0.6) and E8 (on g3, gate 0.4); "the" (t5, also on g2)
    goes to E1 and E2, both on g0, so g2 sends it once. One dispatch row is h values and the gates of the
    receiving rank's 2 experts: g2 sends one row to each of g0, g1, g3 and keeps none."""
    from parasim.examples.moe16 import MOE16
    from parasim.examples.moe16_exact import exactness

    result = parasim.run(make_program(("A", 5), routing="post"), 16)
    route = [m.data for m in result.trace.marks if m.rank == 2 and m.data and m.data.get("watch") == "route"]
    assert route[0]["experts"] == [3, 8] and route[0]["gpus"] == [1, 3]
    layer1 = next(e for e in result.trace.events if e.op == "all_to_all" and e.phase == "forward mb1 layer 1"
                  and 2 in e.ranks)
    assert [t.shape[0] for t in layer1.member(2).ins] == [1, 1, 0, 1]
    assert layer1.member(2).sent == 3 * (MOE16.hidden + 2) * 8
    assert exactness(result.values, preset("moe16"), routing="post")["exact"]
    # the gates the post gives
    out = json.loads(_cli("trace", "--routing", "post", "--json").stdout)
    note = next(s["text"] for s in out["steps"] if "picks" in s["text"])
    assert "E3 (gate 0.60) on g1, E8 (gate 0.40) on g3" in note and out["routing"] == "post"


def test_bytes_by_link_moe16_only_the_handoff_crosses_and_pp1_dp4_reductions_do():
    """Nodes of 8: moe16 puts each pipeline stage on a node, so only the pp hand-off crosses; with PP 1 and
    DP 4 a replica pair spans both nodes, so the data-parallel reductions cross instead."""
    moe16 = json.loads(_cli("trace", "--json").stdout)["bytes_by_link"]
    assert moe16["gpus_per_node"] == 8
    crossing = {g for g, row in moe16["by_group"].items() if row["across"]}
    assert crossing == {"pp"} and moe16["by_group"]["pp"]["inside"] == 0
    pp1 = json.loads(_cli("trace", "--tp", "2", "--sp", "--cp", "2", "--dp", "4", "--ep", "4", "--world", "16",
                          "--json").stdout)["bytes_by_link"]["by_group"]
    assert {g for g, row in pp1.items() if row["across"]} == {"dp-cp", "expert-dp"} and "pp" not in pp1
    # one GPU per node: every byte crosses
    one = json.loads(_cli("trace", "--gpus-per-node", "1", "--json").stdout)["bytes_by_link"]["by_group"]
    assert all(row["inside"] == 0 for row in one.values())


def test_bytes_by_link_by_hand():
    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]))  # 4 ranks over 2 nodes of 2: 2 of its 4 hops cross
        pair = [ctx.new_group([0, 1], "tp"), ctx.new_group([2, 3], "tp")][ctx.rank // 2]
        ctx.comm.all_reduce(ctx.asarray([1.0]), group=pair)  # inside each node
        if ctx.rank in (1, 2):
            ctx.comm.exchange([parasim.Send(ctx.asarray([1.0, 2.0, 3.0]), 2)] if ctx.rank == 1 else
                              [parasim.Recv(1, (3,), "float64")])
    trace = parasim.run(prog, 4).trace
    by = trace.bytes_by_link(2)
    assert by["tp"] == {"inside": 2 * 2 * 8, "across": 0}  # two pairs, each rank sends its 8-byte value once
    # The world's all-reduce is a ring 0->1->2->3->0: hops 0->1 and 2->3 inside a node, 1->2 and 3->0 across.
    # Its 2 values split into 4 chunks of 8, 8, 0, 0 bytes; member i sends every chunk but its own in the
    # reduce-scatter half (16 - chunk i) and every chunk but chunk i+1 in the all-gather half (16 - chunk
    # i+1): members 0-3 send 16, 24, 32, 24 bytes. Inside: 16 + 32; across: 24 + 24, and the 3-value send.
    assert [m.sent for m in trace.events[0].members] == [16, 24, 32, 24]
    assert by["world"] == {"inside": 16 + 32, "across": 24 + 24 + 24}


def test_what_g2_stores_worked_out_by_hand():
    """moe16, g2 (stage 1: layers 1-2; hidden 8, 8 experts of width 8, no biases):
    TP shards per layer: half of qkv (8 x 24) and of out (8 x 8) = 96 + 32 = 128; whole copies per layer:
    two norms (weight and bias, 8 each) and the router (8 x 8) = 96; experts: E5 and E6 (EP rank 2 of 4,
    two each), 2 x (8x8 + 8x8) = 256 per layer. Optimizer: 3 values per parameter of its share, dense over
    dp-cp (4 GPUs), experts over expert-dp (2): 3 * (448 / 4 + 512 / 2) = 1104. Tokens: t5 t6 (contiguous
    CP half t5-t8, first SP half), t5-t8 inside attention."""
    out = json.loads(_cli("trace", "--gpu", "2", "--json").stdout)
    assert out["stores"] == {"tp shards": 256, "whole copies": 192, "experts": 512, "optimizer": 1104,
                             "tokens between matmuls": [5, 6], "tokens in attention": [5, 6, 7, 8]}
    assert out["experts_per_layer"] == [[5, 6], [5, 6]] and out["exactness"]["exact"]
    joins = {(d["op"], d["group"]): d["calls"] for d in out["does"]}
    assert joins[("all_to_all", "ep")] == 2 * 2 * 4  # 2 layers x 2 micro-batches x (dispatch, combine, both back)
    bad = _cli("trace", "--gpu", "16")
    assert bad.returncode == 2 and "GPUs 0-15" in bad.stderr


def test_sp_partial_gradients_are_summed_over_tp_once_per_step():
    """Megatron sums the SP-split weights' gradients (norms, router) over TP once per step, before the
    data-parallel reduction; the example does the same: one all-reduce per TP pair (8 pairs), in the
    gradient sync, none in backward, and the run stays exact."""
    result = parasim.run(make_program(None), 16)
    tp_sums = [e for e in result.trace.events if e.op == "all_reduce" and e.group.name == "tp"]
    assert len(tp_sums) == 8 and {e.phase for e in tp_sums} == {"gradient sync"}
    assert sorted(tuple(e.ranks) for e in tp_sums) == [(r, r + 1) for r in range(0, 16, 2)]
    # each pair sums its 2 layers' norms (4 x 8 weights, 4 x 8 biases) and routers (2 x 8 x 8): 192 values
    assert all(t.shape == (192,) for e in tp_sums for m in e.members for t in m.ins)
    from parasim.examples.moe16_exact import exactness
    assert exactness(result.values, preset("moe16"))["exact"]


def test_the_variants_lesson_holds_and_its_table_comes_from_the_runs():
    lr = run_lesson(get_lesson("moe16-variants"))
    assert lr.ok, [c for c in lr.checks if not c.ok]
    by = {c.name.split(":")[0]: c.got for c in lr.checks}
    assert list(by["the GPU holding 'contract' (t6 of A)"].values()) == [2, 3, 2, 2, 2]  # zigzag moves it to g3
    assert list(by["expert values per GPU"].values()) == [512, 512, 512, 256, 1024]


def test_the_layout_map_places_gpus_as_the_post_draws_them(tmp_path):
    """moe16: node 0 holds stage 1; in a node one row per DP replica, columns (CP rank, TP rank); g0-g3 hold
    E1-E2, E3-E4, E5-E6, E7-E8 (EP rank = CP x TP position, experts in contiguous pairs)."""
    from parasim.render.plots import layout_map
    cells = {c["gpu"]: c for c in layout_map(preset("moe16"))}
    assert [(cells[g]["node"], cells[g]["row"], cells[g]["col"]) for g in (2, 6, 13)] == [(0, 0, 2), (0, 1, 2), (1, 1, 1)]
    assert [cells[g]["experts"] for g in range(4)] == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert cells[2]["ep_group"] == cells[0]["ep_group"] != cells[4]["ep_group"]
    for args in (["layout", "--layout", "moe16", "--plot"], ["trace", "--plot"]):
        path = tmp_path / f"{args[0]}.png"
        out = _cli(*args, str(path))
        assert out.returncode == 0, out.stderr
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_gpu_text_names_its_tokens_as_runs():
    """`parasim trace --gpu N` in words lists the GPU's tokens as runs (t1-t2 t7-t8), the runs worked out
    here from the --json view's token numbers."""
    import json

    from tests.conftest import cli

    view = json.loads(cli("trace", "--layout", "moe16", "--gpu", "3", "--json").stdout)
    tokens = view["stores"]["tokens between matmuls"]
    runs, start = [], tokens[0]
    for prev, t in zip(tokens, tokens[1:] + [None]):
        if t != prev + 1:
            runs.append(f"t{start}" if start == prev else f"t{start}-t{prev}")
            start = t
    text = cli("trace", "--layout", "moe16", "--gpu", "3").stdout
    assert f"  tokens: {' '.join(runs)} between matmuls" in text


def test_compare_sets_the_token_s_experts_side_by_side_under_the_post_s_routing():
    """Under the post's routing 'contract' picks E3 and E8 at every layer; with 8 experts over the EP group
    g0-g3 (two each, in order) they live on g1 and g3, and on g9 and g11 for stage 2: both off the token's
    GPU (g2, then g10), so the dispatch sends 2 copies away at each of the 4 layers."""
    from parasim.figures import run_figures
    fig = run_figures(run_lesson(get_lesson("moe16"), knobs={"routing": "post"}))
    assert fig["GPUs holding the token, a stage each"] == "g2 g10"
    assert fig["layer 1: its experts (on GPU)"] == "E3 (g1), E8 (g3)"
    assert fig["layer 4: its experts (on GPU)"] == "E3 (g9), E8 (g11)"
    assert fig["copies the dispatch sends off the token's GPU, all layers"] == 2 * 4


def test_the_map_gives_every_gpu_its_place_as_the_post_draws_node_a():
    """The post's map of node A: DP picks the sequences (g0-g3: A and B), CP the half (g0, g1: tokens 1-4),
    TP the GPU of the pair; the MoE view puts E1 E2 on g0 and g4, E5 E6 on g2 and g6 (EDP 2). Node B repeats
    it for layers 3-4. Worked out here from Megatron's order (TP fastest, then CP, DP; PP across nodes)."""
    from parasim.lesson import get_lesson, run_lesson

    lr = run_lesson(get_lesson("moe16"))
    table = next(t for t in lr.tables if t.title.startswith("The map"))
    rows = dict(table.rows)
    for g in range(16):
        tp, cp, dp, node = g % 2, (g // 2) % 2, (g // 4) % 2, g // 8
        node_name, seqs, cp_rank, tp_rank, attention, between, ep, experts = rows[f"g{g}"]
        assert (node_name, cp_rank, tp_rank) == ("AB"[node], cp, tp)
        assert seqs == f"{dp} ({'A B' if dp == 0 else 'C D'})"
        assert attention == ("t1-t4" if cp == 0 else "t5-t8")
        first = 4 * cp + 2 * tp + 1
        assert between == f"t{first} t{first + 1}"
        k = g % 4  # the GPU's place in its EP group of 4, two experts each
        assert ep == k and experts == f"E{2 * k + 1} E{2 * k + 2}"


def test_step_5_table_sums_each_weight_over_the_post_s_groups():
    """The post's step 5, worked out from its map (g = 4 dp + 2 cp + tp on node A): attention heads 1-2 sit on
    TP rank 0 (g0 g2 g4 g6) and are summed over DP x CP; E1 E2 on EP rank 0 (g0, g4) summed over EDP; norms and
    router on all 8, summed over the TP pair and then dp-cp. The table's 'over' is read from the run's gradient
    sync, and where the post names a group, the post's braces list the same GPUs."""
    import re

    lr = run_lesson(get_lesson("moe16"))
    table = next(t for t in lr.tables if t.title.startswith("Step 5"))
    rows = dict(table.rows)
    by_hand = {"attention heads 1-2": "g0,g2,g4,g6", "attention heads 3-4": "g1,g3,g5,g7",
               **{f"experts E{2 * k + 1} E{2 * k + 2}": f"g{k},g{k + 4}" for k in range(4)},
               "norms and router": "g0-g7"}
    assert {w: row[2] for w, row in rows.items()} == by_hand
    assert {w: row[0] for w, row in rows.items()} == by_hand  # copies on exactly the GPUs it is summed over
    assert rows["norms and router"][1] == "all-reduce (tp), then reduce-scatter (dp-cp)"
    assert {row[1] for w, row in rows.items() if w.startswith("experts")} == {"reduce-scatter (expert-dp)"}
    posts = {w: re.search(r"\{(.*)\}", row[3]) for w, row in rows.items()}
    assert sum(1 for m in posts.values() if m) == 5  # the post lists heads 1-2, 3-4, E1 E2, E3 E4, the norms
    assert all(m.group(1) == by_hand[w] for w, m in posts.items() if m)
    # 448 = 2 layers x (128 attention shards + 96 norms and router); 512 = 2 layers x 2 experts x (64 + 64)
    assert "dp-cp reduce-scatter 448" in table.notes[0] and "expert-dp reduce-scatter 512" in table.notes[0]


def test_only_pp_carries_data_across_nodes_and_the_clip_norm_crosses_by_a_few_bytes():
    """Nodes of 8: PP's hand-offs are all across (2 micro-batches x 8 pairs x (activation down, gradient back) x
    2 tokens x 8 float64 = 4,096 B). The clip's all-reduce of 2 float64 over 16 GPUs is a ring: chunks of 8, 8,
    then 0 B; member i sends 16 - chunk i, then 16 - chunk i+1: member 7 sends 32 B (to g8), member 15 24 B (to
    g0): 56 B across. Nothing else crosses."""
    lr = run_lesson(get_lesson("moe16"))
    table = next(t for t in lr.tables if t.title.startswith("Bytes by link"))
    across = {label: row[1] for label, row in table.rows if row[1]}
    assert across == {"PP (pp)": 2 * 8 * 2 * 2 * 8 * 8, "world (the clip's norm)": 32 + 24}
    assert dict(table.rows)["PP (pp)"][0] == 0
    assert "only pp carries" in table.notes[0]


def test_the_picture_draws_the_neighbour_the_going_to_g0_and_says_how_its_grid_maps_to_the_post_s():
    """The post's step 4 sends 'the' (t5, on g2 beside 'contract') to g0 once, where E1 and E2 both live; the
    picture's map has a row per DP replica and columns (CP rank, TP rank), the post's TP ranks as rows and CP
    ranks as columns: g2 (tp 0, cp 1, dp 0) is replica 0's TP row 0, CP column 1."""
    from parasim.lesson import lesson_module
    from parasim.render.plot_layout import layout_map
    from parasim.render.plot_moves import post_grid

    mod = lesson_module("moe16")
    lr = run_lesson(get_lesson("moe16"))
    the = mod.neighbours(lr)
    assert list(the) == ["the"]
    first = next(r for r in the["the"] if r["layer"] == 1)
    assert first["gpu"] == 2 and [(e, g) for e, g, _ in first["picks"]] == [(1, 0), (2, 0)]
    assert next(r for r in the["the"] if r["layer"] == 3)["gpu"] == 10
    line = post_grid(layout_map(preset("moe16")), 2)
    assert "here row DP 0, column cp1 tp0" in line and "replica 0, row TP rank 0, column CP rank 1" in line


def test_the_picture_draws_the_to_g0_and_back_and_the_grid_caption(tmp_path, monkeypatch):
    """Drawn: the dispatch panel sends 'the' to E1, E2 on g0 once, the combine brings them back, and the layout's
    title says how its grid maps to the post's."""
    from matplotlib.figure import Figure

    figures, original = [], Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    lr = run_lesson(get_lesson("moe16"))
    lr.lesson.picture.draw(lr, str(tmp_path / "m.png"))
    (fig,) = figures
    panels = {ax.get_title(loc="left").rsplit(": ", 1)[-1]: [t.get_text() for t in ax.texts] for ax in fig.axes}
    assert "'the' to E1, E2 (once)" in panels["dispatch"] and "E1, E2 of 'the' back" in panels["combine"]
    assert "grey: g2's other token, 'the': E1, E2 on g0; sent to each GPU once" in panels["dispatch"]
    (layout,) = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("the layout the run used")]
    assert "the post's rows are TP ranks" in " ".join(layout.get_title(loc="left").split())

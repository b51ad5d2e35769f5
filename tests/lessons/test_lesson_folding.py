"""The folding lesson: MoE Parallel Folding on 8 GPUs, attention TP 2 x DP 4 and experts ETP 1 x EP 8 x EDP 1.
Its checks hold, and its figures are re-derived here by hand: the groups from Megatron's rank order (TP
fastest), what a GPU stores from the model's shapes, which group each collective ran on from the trace, and
the loss against the unsplit model run here on one device."""

import json

import pytest
from conftest import cli

import parasim
from parasim.examples.moe16 import MOE16
from parasim.examples.moe16_unsplit import unsplit_run
from parasim.lesson import get_lesson, run_lesson

WORLD, TP, DP, EP = 8, 2, 4, 8


@pytest.fixture(scope="module")
def ran():
    return run_lesson(get_lesson("folding"))


def table(ran, start: str) -> dict:
    t = next(t for t in ran.tables if t.title.startswith(start))
    return {label: dict(zip(t.columns[1:], values)) for label, values in t.rows}


def test_every_check_holds(ran):
    assert ran.ok, [c.name for c in ran.checks if not c.ok]


def test_the_two_layouts_over_the_same_gpus(ran):
    """TP fastest: GPU r is TP rank r % 2 of the pair (2(r//2), 2(r//2)+1), in DP replica r // 2 (sequences
    A, B, C, D one a replica); its attention gradients summed with the GPUs of the same TP rank; EP rank r of
    one group of all eight, holding expert r + 1."""
    rows = table(ran, "Two layouts")
    assert list(rows) == [f"g{r}" for r in range(WORLD)]
    assert TP * 1 * DP == 1 * EP * 1 == WORLD
    for r in range(WORLD):
        row, pair = rows[f"g{r}"], 2 * (r // 2)
        assert row["TP pair"] == f"g{pair} g{pair + 1}" and row["TP rank"] == r % TP
        assert row["DP replica (sequence)"] == f"{r // 2} ({'ABCD'[r // 2]})"
        assert row["attention's gradient group"] == " ".join(f"g{q}" for q in range(r % 2, WORLD, 2))
        assert row["EP rank"] == r and row["expert"] == f"E{r + 1}"
        assert row["its all-to-all group"] == " ".join(f"g{q}" for q in range(WORLD))


def test_a_gpu_holds_half_the_attention_and_one_whole_expert(ran):
    h, f, layers, experts = MOE16.hidden, MOE16.ffn, MOE16.layers, MOE16.experts
    assert experts == 8 and MOE16.top_k == 2
    rows = table(ran, "What g1")
    attention = 4 * h * h * layers  # q, k, v and the output projection, no biases
    expert_values = experts * 2 * h * f * layers
    assert rows["attention weights (its TP shard)"]["values on the GPU"] == attention // 2
    assert rows["attention weights (its TP shard)"]["whole model"] == attention
    assert rows["attention weights (its TP shard)"]["share"] == "1/2"
    assert rows["expert weights (its EP share, whole)"]["values on the GPU"] == expert_values // 8
    assert rows["expert weights (its EP share, whole)"]["share"] == "1/8"
    for v in ran.result.values:  # every GPU alike
        assert v["stores"]["tp shards"] == attention // 2 and v["stores"]["experts"] == expert_values // 8


def test_each_collective_on_its_group(ran):
    events = [e for e in ran.result.trace.events if e.kind != "compute"]
    pairs = {(2 * i, 2 * i + 1) for i in range(WORLD // 2)}
    for e in events:
        ranks = tuple(e.group.ranks)
        if e.op == "all_to_all":
            assert ranks == tuple(range(WORLD)), e.label  # over all eight: across the DP replicas
        elif e.group.name == "tp":
            assert ranks in pairs, e.label
        elif e.group.name == "dp-cp":
            assert ranks in {(0, 2, 4, 6), (1, 3, 5, 7)}, e.label
        elif e.group.name == "expert-dp":
            assert len(ranks) == 1 and sum(m.sent for m in e.members) == 0, e.label  # EDP 1: nothing moves
        else:
            raise AssertionError(f"unexpected group {e.group.name} for {e.label}")
    # 4 layers x (dispatch, combine) x (forward, backward), one micro-batch
    assert sum(e.op == "all_to_all" for e in events) == MOE16.layers * 2 * 2
    groups = table(ran, "The groups")
    assert groups["expert-dp"]["bytes"] == 0 and groups["ep"]["bytes"] > 0 and groups["ep"]["groups"] == 1


def test_contract_on_g1_goes_to_g2_and_g7(ran):
    """The post's routing sends 'contract' to E3 and E8: with one expert a GPU, expert e on GPU e - 1."""
    notes = ran.result.trace.notes("watch")
    assert {r for _, r, _, d in notes if d["watch"] == "holds"} == {1}  # A on replica 0, t5-t8 on TP rank 1
    for _, r, _, d in notes:
        if d["watch"] == "route":
            assert r == 1 and d["experts"] == [3, 8] and d["gpus"] == [2, 7]


def test_loss_equals_the_unsplit_model(ran):
    ref = parasim.run(lambda ctx: unsplit_run(ctx, MOE16, ["A", "B", "C", "D"], routing="post"), 1).values[0]
    loss = sum(v["loss"] for v in ran.result.values if v["last"])  # SP: each token's loss on one GPU
    assert loss == pytest.approx(ref["loss"], rel=1e-12)


def test_json_and_list():
    out = cli("lesson", "folding", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert all(c["ok"] for c in doc["checks"]) and len(doc["tables"]) == 3
    rows = [r["name"] for r in json.loads(cli("lesson", "--list", "--json").stdout)]
    assert rows.index("pp-vs-zero3") < rows.index("ep-split") < rows.index("folding") < rows.index("moe-sp")

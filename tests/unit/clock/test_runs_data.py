"""The published runs as data (parasim/clock/runs.py): every run's invariants (its GPUs are its layout's, its
layers sit on its stages, its batch divides into micro-batches, it names a source, a set, a unit and a rule
from the registries), the split by source, the 31 runs clock/published.py held before it read this module kept
in calibration, and every figure as docs/notes/step-time-runs.md quotes it."""
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from parasim.clock.runs import (CALIBRATION, FLOP_UNITS, HELD_OUT, PRECISION_SAID, RULES, RUNS, SHARDING,
                                PublishedRun, SOURCES, UNITS, runs)
from parasim.estimate.hardware import GPUS
from parasim.layout import Layout, Stages
from parasim.pipeline.schedules import schedule_entry

NOTES = Path(__file__).resolve().parents[3] / "docs" / "notes" / "step-time-runs.md"
BY_KEY = {r.key: r for r in RUNS}
IDS = [r.key for r in RUNS]


def test_enough_runs_sources_and_moe():
    assert len(BY_KEY) == len(RUNS)  # keys are unique
    assert len(RUNS) >= 40
    assert sum(r.moe for r in RUNS) >= 6
    assert len({r.source for r in RUNS}) >= 8
    assert {r.gpu for r in RUNS} == {"a100", "h100", "h200", "h800"}


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_gpus_are_the_layouts(r):
    plan = r.plan
    assert r.gpus == plan.tp * plan.pp * plan.dp * plan.cp == plan.world


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_the_layout_holds_the_model(r):
    """Megatron-Core's rules, as parasim's Layout checks them: whole heads on each TP rank, experts divided by
    EP and EP by the ranks, the layers on the stages by the model's stated rule, the sequence by CP and SP."""
    plan = r.plan
    model = r.model if plan.cp == 1 else replace(r.model, seq=r.seq)
    layout = Layout(tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, ep=plan.ep, etp=plan.etp, sp=plan.sp, model=model,
                    zero=SHARDING[r.sharding][0])
    assert layout.world == r.gpus
    if r.moe:
        assert r.model.top_k and r.model.expert_ffn


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_model_chunks_divide_the_layers(r):
    chunks_divide_the_layers(r)


def chunks_divide_the_layers(r: PublishedRun) -> None:
    """Interleaving needs each GPU's layers in whole chunks where the split is Megatron's even one (or counts
    the embedding and loss as layers); a listed or spread split is the entry's own statement (the fresh set's
    test reads it too)."""
    plan, rule = r.plan, r.model.stages
    if rule == Stages():
        assert r.model.layers % (plan.pp * plan.chunks) == 0
    elif rule == Stages(embedding=True, loss=True):
        assert (r.model.layers + 2) % (plan.pp * plan.chunks) == 0
    else:
        assert rule.counts is not None or rule.spread
        if rule.counts is not None:
            assert sum(rule.counts) == r.model.layers and len(rule.counts) == plan.pp


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_global_batch_divides_into_micro_batches(r):
    plan = r.plan
    assert plan.microbatches is not None and plan.microbatches >= 1  # the source's batch, whole


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_each_field_names_an_entry_of_its_registry(r):
    s = SOURCES[r.source]
    assert s.address.startswith("https://") and s.document and r.where
    assert r.set in (CALIBRATION, HELD_OUT)
    assert r.gpu in GPUS
    assert r.unit in UNITS and r.published > 0
    assert (r.rule in RULES) if r.unit in FLOP_UNITS else r.rule is None
    if r.unit == "MFU %":
        assert r.published < 100
    assert r.precision in PRECISION_SAID
    assert r.plan.recompute in ("none", "selective", "full")
    # ZeRO-3 but gathered once a step (Llama 3's FSDP without resharding) is timed as the distributed optimizer
    assert r.plan.zero == {"none": 0, "zero-1": 1, "zero-2": 2, "fsdp-no-reshard": 1, "zero-3": 3}[r.sharding]
    if r.plan.pp == 1:
        assert r.schedule is None and r.plan.chunks == 1
    else:
        schedule_entry(r.schedule).check_chunks(r.plan.chunks)  # raises on a chunk count the schedule refuses
    cite = r.cite
    assert cite[2] == s.address and r.where in cite[1] and cite[0].startswith(s.name)


def test_every_source_has_runs_and_one_set():
    sets = defaultdict(set)
    for r in RUNS:
        sets[r.source].add(r.set)
    assert set(sets) == set(SOURCES)
    assert all(len(v) == 1 for v in sets.values())
    assert {r.key for r in runs(CALIBRATION)} | {r.key for r in runs(HELD_OUT)} == set(BY_KEY)
    assert not {r.key for r in runs(CALIBRATION)} & {r.key for r in runs(HELD_OUT)}


def test_the_split_by_the_rule_in_the_notes():
    """The sources the current model was shaped on are calibration; calibration covers every GPU type and an
    MoE model; held-out keeps at least two MoE sources and holds every other source."""
    for name in ("Narayanan 2021", "Korthikanti 2022", "Llama 3 2024", "Megatron-LM README (H100)"):
        assert SOURCES[name].set == CALIBRATION
    assert {r.gpu for r in runs(CALIBRATION)} == {r.gpu for r in RUNS}
    moe_sources = {s: {r.set for r in RUNS if r.source == s} for s in {r.source for r in RUNS if r.moe}}
    assert sum(CALIBRATION in v for v in moe_sources.values()) >= 1
    assert sum(HELD_OUT in v for v in moe_sources.values()) >= 2
    moved = {s.name for s in SOURCES.values() if s.set == CALIBRATION and s.why.startswith("moved")}
    assert moved == {"DeepSeek-V3 2024", "torchtitan H200 (Trainy)"}
    assert {s.name for s in SOURCES.values() if s.set == HELD_OUT} == set(SOURCES) - moved - {
        "Narayanan 2021", "Korthikanti 2022", "Llama 3 2024", "Megatron-LM README (H100)"}


# The runs clock/published.py held as its own rows before it read this module (Narayanan Table 1, Korthikanti
# Tables 3 and 5 and section 6.3, Llama 3 Table 4, the Megatron-LM README's H100 table): calibration, by key.
OLD_ROWS = ([f"megatron-2021-{b}b" for b in ("1.7", "3.6", "7.5", "18.4", "39.1", "76.1", "145.6", "310.1", "529.6",
                                             "1008")]
            + [f"korthikanti-{m}-{how}" for m in ("22b", "175b", "530b", "1t") for how in ("full", "sp+sel")]
            + ["korthikanti-530b-dp8", "llama3-405b-8k", "llama3-405b-16k", "llama3-405b-16k-cp16"]
            + [f"megatron-h100-{m}" for m in ("1.7b", "7.1b", "16b", "32b", "70b", "119b", "177b", "314b", "462b")])


def test_the_runs_published_py_held_are_all_calibration():
    assert len(OLD_ROWS) == 31
    assert [k for k in BY_KEY if k in OLD_ROWS] == OLD_ROWS
    assert all(BY_KEY[k].set == CALIBRATION for k in OLD_ROWS)


def test_the_variants_of_what_the_old_rows_assume():
    """The other choices the validation shows: Narayanan Table 1 a micro-batch of 2 and, with a pipeline, one
    chunk; Llama 3 one or four chunks; the README's H100 rows without TP overlap; DeepSeek-V3 with DeepEP's
    sends; no other run has any."""
    for key in OLD_ROWS:
        r = BY_KEY[key]
        if key.startswith("megatron-2021-"):
            assert r.variants == {"micro-batch 2": {"micro_batch": 2}} | ({"1 chunk": {"chunks": 1}} if r.plan.pp > 1
                                                                         else {}), key
        elif key.startswith("llama3-"):
            assert r.variants == {"1 chunk": {"chunks": 1}, "4 chunks": {"chunks": 4}}
        elif key.startswith("megatron-h100-"):
            assert r.variants == {"TP overlap off": {"overlap": ("grad-reduce", "prefetch", "p2p")}}
            assert r.overlap == ("grad-reduce", "prefetch", "tp", "p2p")
        else:
            assert r.variants == {}
    ds = BY_KEY["deepseek-v3-pretrain"]  # its own kernels send a token once to each node and GPU
    assert ds.variants == {"DeepEP dispatch": {"dispatcher": "deepep"}} and ds.plan.dispatcher == "alltoall"
    assert all(not r.variants for r in RUNS if r.key not in OLD_ROWS and r is not ds)


def test_some_figures_as_read_by_hand():
    """A few figures against the sources' printed values (docs/notes/step-time-runs.md quotes them)."""
    assert BY_KEY["megatron-2021-1008b"].published == 163
    assert BY_KEY["korthikanti-530b-dp8"].published == 39.15
    assert BY_KEY["llama3-405b-16k-cp16"].plan.dp == 8 and BY_KEY["llama3-405b-16k-cp16"].published == 380
    assert BY_KEY["deepseek-v3-pretrain"].published == 180_000 and BY_KEY["deepseek-v3-pretrain"].gpus == 2048
    assert BY_KEY["megascale-megatron-175b-12288"].published == 8.57
    assert BY_KEY["titan-405b-fsdp1-cp8-tp8-pp8"].seq == 262_144
    assert BY_KEY["bridge-qwen3-235b-a22b-tp2-pp8-ep32"].published == 1712
    assert BY_KEY["mpt-3b-h100-512"].sharding == "zero-2"
    assert BY_KEY["bloom-176b"].published == 104.70 and BY_KEY["bloom-176b"].plan.micro_batch == 2


def _dash(v: object) -> str:
    return "-" if v in (None, 0) else str(v)


def _split(rule: Stages) -> str:
    """A layer split in the notes' words."""
    if rule.counts is not None:
        return "/".join(map(str, rule.counts))
    return ("spread" if rule.spread else "emb+loss" if rule.embedding and rule.loss else
            "even" if rule == Stages() else repr(rule))


# The notes' last table, column by column, from a run (the notes hold it as read from the sources).
COLUMNS = {
    "key": lambda r: r.key, "source": lambda r: r.source, "set": lambda r: r.set, "GPU": lambda r: r.gpu,
    "GPUs": lambda r: str(r.gpus), "L": lambda r: str(r.model.layers), "h": lambda r: str(r.model.hidden),
    "heads": lambda r: str(r.model.heads), "kv": lambda r: str(r.model.kv_heads or r.model.heads),
    "ffn": lambda r: str(r.model.ffn or 4 * r.model.hidden), "V": lambda r: str(r.model.vocab),
    "experts": lambda r: _dash(r.model.experts), "top-k": lambda r: _dash(r.model.top_k),
    "expert ffn": lambda r: _dash(r.model.expert_ffn), "shared": lambda r: _dash(r.model.shared_experts),
    "dense L": lambda r: _dash(r.model.dense_layers), "TP": lambda r: str(r.plan.tp), "PP": lambda r: str(r.plan.pp),
    "DP": lambda r: str(r.plan.dp), "CP": lambda r: str(r.plan.cp), "EP": lambda r: str(r.plan.ep),
    "VP": lambda r: str(r.plan.chunks), "mb": lambda r: str(r.plan.micro_batch), "GBS": lambda r: str(r.plan.micro_batch * r.plan.m * r.plan.dp),
    "seq": lambda r: str(r.seq), "recompute": lambda r: r.plan.recompute,
    "flash": lambda r: "yes" if r.plan.flash else "no", "precision": lambda r: r.precision,
    "sharding": lambda r: r.sharding, "schedule": lambda r: _dash(r.schedule),
    "published": lambda r: f"{r.published:g}", "unit": lambda r: r.unit, "rule": lambda r: _dash(r.rule),
    "split": lambda r: _split(r.model.stages), "ETP": lambda r: str(r.plan.etp),
    "overlap": lambda r: ",".join(r.overlap) or "-", "clock precision": lambda r: r.plan.precision,
    "MLP": lambda r: "gated" if r.model.gated else "plain", "tied": lambda r: "yes" if r.model.tied_embeddings else "no",
    "head": lambda r: "MLA" if r.model.kv_lora_rank else str(r.model.head_size or r.model.hidden // r.model.heads),
}


def notes_table() -> list[dict[str, str]]:
    """The notes' table of every run, one dict per row keyed by its header."""
    text = NOTES.read_text()
    lines = [line for line in text[text.index("## Every run"):].splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[1:]]


def test_the_notes_quote_every_run_as_the_data_holds_it():
    rows = notes_table()
    assert [row["key"] for row in rows] == [r.key for r in RUNS]
    assert list(rows[0]) == list(COLUMNS)
    for row in rows:
        r = BY_KEY[row["key"]]
        assert row == {name: get(r) for name, get in COLUMNS.items()}, r.key


def test_the_notes_split_table_counts_the_runs():
    """The split table at the top of the notes: each source's set and number of runs, as the data has them."""
    text = NOTES.read_text()
    head = text[text.index("| source | published | set |"):text.index("Totals:")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in head.splitlines()[2:] if line]
    assert {row[0] for row in rows} == set(SOURCES)
    for name, date, which, count, *_ in rows:
        assert (date, which, int(count)) == (SOURCES[name].date, SOURCES[name].set,
                                             sum(r.source == name for r in RUNS)), name
    m = re.search(r"Totals: (\d+) runs, (\d+) calibration and (\d+) held-out; (\d+) MoE", text)
    assert m and [int(g) for g in m.groups()] == [len(RUNS), len(runs(CALIBRATION)), len(runs(HELD_OUT)),
                                                  sum(r.moe for r in RUNS)]

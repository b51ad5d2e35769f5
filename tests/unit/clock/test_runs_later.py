"""The held-out sets gathered after the first (parasim/clock/runs_fresh.py, runs_fourth.py, runs_fifth.py,
runs_sixth.py, runs_seventh.py and runs_eighth.py) are well-formed, one parametrized check for all: each layout
holds its model by parasim's Layout/Plan rules, its GPUs are its degrees' product, its batch divides into
micro-batches, its unit, rule, precision, sharding and overlap switches are registry keys, its source is a document
no earlier set reads, with an https address, each set is as big and varied as its notes say, and the notes name
every run and quote its figure. Nothing here times a run: each set was gathered blind and is scored once
(tests/unit/clock/test_step_time_validation.py holds the page and README to that score)."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from parasim.clock import overlaps
from parasim.clock import runs as old
from parasim.clock.runs import FLOP_UNITS, PRECISION_SAID, RULES, SHARDING, UNITS, PublishedRun
from parasim.clock import (runs_eighth, runs_eleventh, runs_fifth, runs_fourth, runs_fresh, runs_ninth, runs_seventh,
                          runs_sixth, runs_tenth, runs_twelfth)
from parasim.estimate.hardware import GPUS
from parasim.layout import Layout
from parasim.pipeline.schedules import schedule_entry

DOCS = Path(__file__).resolve().parents[3] / "docs" / "notes"
# each set in the order gathered: (module, its runs, its set's name, at least: sources, runs, MoE runs; the GPU
# types it must hold)
LATER = [(runs_fresh, runs_fresh.FRESH, old.FRESH, 5, 20, 5, {"a100", "h100"}),
         (runs_fourth, runs_fourth.FOURTH, old.FOURTH, 4, 20, 5, {"a100", "h100"}),
         (runs_fifth, runs_fifth.FIFTH, old.FIFTH, 4, 20, 1, {"a100", "h100"}),
         (runs_sixth, runs_sixth.SIXTH, old.SIXTH, 2, 20, 1, {"a100", "h100", "h800"}),
         (runs_seventh, runs_seventh.SEVENTH, old.SEVENTH, 2, 10, 0, {"h100"}),
         (runs_eighth, runs_eighth.EIGHTH, "eighth", 2, 9, 4, {"h100", "b200"}),
         (runs_ninth, runs_ninth.NINTH, "ninth", 2, 21, 2, {"h100", "b200"}),
         (runs_tenth, runs_tenth.TENTH, "tenth", 2, 17, 0, {"h100", "h200", "b200"}),
         (runs_eleventh, runs_eleventh.ELEVENTH, "eleventh", 2, 13, 2, {"h100", "h200", "b200"}),
         (runs_twelfth, runs_twelfth.TWELFTH, "twelfth", 3, 16, 3, {"a100", "h100", "b200"})]
# with the registries of the sets gathered before each, and its notes
SETS = [(module, runs, name, DOCS / f"step-time-runs-{'fresh' if name == old.FRESH else name}.md", sources, least,
         moe, gpus, [old.SOURCES] + [m.SOURCES for m, *_ in LATER[:i]])
        for i, (module, runs, name, sources, least, moe, gpus) in enumerate(LATER)]
SET_IDS = [name for _, _, name, *_ in SETS]
EVERY = [r for _, runs, *_ in LATER for r in runs]
IDS = [r.key for r in EVERY]
ARGS = "module, runs, name, notes, sources, least, moe, gpus, before"


@pytest.mark.parametrize(ARGS, SETS, ids=SET_IDS)
def test_enough_runs_sources_and_moe(module, runs, name, notes, sources, least, moe, gpus, before):
    earlier = {r.key for r in old.RUNS} | {r.key for r in EVERY if r not in runs}
    assert len({r.key for r in runs}) == len(runs)  # keys are unique
    assert not {r.key for r in runs} & earlier
    assert len(runs) >= least
    assert len({r.source for r in runs}) >= sources
    assert sum(r.moe for r in runs) >= moe
    assert {r.gpu for r in runs} >= gpus


@pytest.mark.parametrize(ARGS, SETS, ids=SET_IDS)
def test_sources_are_new_documents(module, runs, name, notes, sources, least, moe, gpus, before):
    """No source of a set is one an earlier set's registry already holds: not by name, address or document."""
    seen = [o for registry in before for o in registry.values()]
    addresses = {o.address.split("#")[0].rstrip("/") for o in seen}
    for s in module.SOURCES.values():
        assert s.set == name and all(o.set != name for o in seen)
        assert s.address.startswith("https://") and s.document and s.why
        assert re.fullmatch(r"\d{4}-\d{2}", s.date)
        assert s.name not in {o.name for o in seen}
        assert s.address.split("#")[0].rstrip("/") not in addresses
        assert s.document not in {o.document for o in seen}
    assert {r.source for r in runs} == set(module.SOURCES)


@pytest.mark.parametrize(ARGS, SETS, ids=SET_IDS)
def test_not_among_the_seen_runs(module, runs, name, notes, sources, least, moe, gpus, before):
    assert not {id(r) for r in runs} & {id(r) for r in old.RUNS}
    assert all(r.set == name for r in runs)
    # each run looks its source up in its own set's registry, and the module's builder gives the set's runs
    assert all(r.source_entry is module.SOURCES[r.source] for r in runs)
    assert getattr(module, f"{name}_runs")() == list(runs)
    assert any(not r.moe for r in runs)
    assert (name in old.SETS) == (module is not runs_twelfth)  # the twelfth is kept unscored for the next model change


@pytest.mark.parametrize("r", EVERY, ids=IDS)
def test_gpus_are_the_layouts(r):
    assert isinstance(r, PublishedRun)
    plan = r.plan
    assert r.gpus == plan.tp * plan.pp * plan.dp * plan.cp == plan.world


@pytest.mark.parametrize("r", EVERY, ids=IDS)
def test_the_layout_holds_the_model(r):
    """Megatron-Core's rules as parasim's Layout and Plan check them: whole heads on each TP rank, experts
    divided by EP, the layers on the stages, the sequence by CP and SP."""
    plan = r.plan
    model = r.model if plan.cp == 1 else replace(r.model, seq=r.seq)
    layout = Layout(tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, ep=plan.ep, etp=plan.etp, sp=plan.sp, model=model,
                    zero=SHARDING[r.sharding][0])
    assert layout.world == r.gpus
    plan.check(r.model, r.seq)
    if r.moe:
        assert r.model.top_k and r.model.expert_ffn


@pytest.mark.parametrize("r", EVERY, ids=IDS)
def test_model_chunks_divide_the_layers(r):
    from tests.unit.clock.test_runs_data import chunks_divide_the_layers
    chunks_divide_the_layers(r)


@pytest.mark.parametrize("r", EVERY, ids=IDS)
def test_batch_and_registries(r):
    plan = r.plan
    assert plan.microbatches is not None and plan.microbatches >= 1
    assert r.gpu in GPUS
    assert r.unit in UNITS and r.published > 0
    assert (r.rule in RULES) if r.unit in FLOP_UNITS else r.rule is None
    assert r.precision in PRECISION_SAID and r.sharding in SHARDING
    assert plan.zero == SHARDING[r.sharding][2]
    assert r.where and r.assumed
    if plan.pp > 1:
        assert r.schedule is not None
        schedule_entry(r.schedule)
    else:
        assert r.schedule is None
    known = set(overlaps.OVERLAPS)
    assert set(r.overlap) <= known and set(r.machine) <= old.MACHINE_SAID
    for name, change in r.variants.items():  # each variant still a well-formed plan
        assert name and change
        assert set(change.get("overlap", ())) <= known
        replace(plan, **{k: v for k, v in change.items() if k != "overlap"}).check(r.model, r.seq)


@pytest.mark.parametrize("r", EVERY, ids=IDS)
def test_cite(r):
    short, document, address = r.cite
    assert short.startswith(r.source) and r.where in document and address.startswith("https://")


@pytest.mark.parametrize(ARGS, SETS, ids=SET_IDS)
def test_notes_quote_every_figure_and_source(module, runs, name, notes, sources, least, moe, gpus, before):
    text = notes.read_text()
    assert module.GATHERED == "2026-12-05" and module.GATHERED in text and "scored once" in text
    # the sets gathered while the model changed say they were gathered blind
    assert ("blind" in text) == (module not in (runs_fresh, runs_fourth))
    for s in module.SOURCES.values():
        assert s.address in text
    for r in runs:
        assert r.key in text
        assert f"{r.published:g}" in text.replace(",", "")


def test_the_sets_registry_holds_each_scored_set_once_with_its_runs_heading_and_notes():
    """clock/sets.py is the one list every reader of the sets reads: each entry's runs are its module's runs of
    that set, its notes exist and docs/validation.md has its heading; the runs of every set are runs.py's and each
    scored later set's, once each."""
    from parasim.clock.sets import NAMES, RUN_SETS, runs_of
    page = (DOCS.parent / "validation.md").read_text()
    assert NAMES[:2] == ("calibration", "held-out") and len(set(NAMES)) == len(NAMES)
    for s in RUN_SETS:
        mine = runs_of(s.name)
        assert mine and all(r.set == s.name for r in mine), s.name
        assert (DOCS / s.notes).is_file() and f"\n{s.heading}\n" in page, s.name
    scored = [r for _, runs, name, *_ in LATER if name in NAMES for r in runs]
    assert [r.key for r in runs_of()] == [r.key for r in old.RUNS] + [r.key for r in scored]
    assert NAMES == tuple(["calibration", "held-out"] + [name for _, _, name, *_ in LATER if name in NAMES])

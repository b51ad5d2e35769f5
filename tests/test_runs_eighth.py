"""The eighth held-out set (parasim/clock/runs_eighth.py) is well-formed: every run builds, its keys are unique
and new, every source is used and is a document no earlier set reads, each GPU has a sheet, each layout holds its
model and its degrees multiply to the GPU count, the registries know its unit, precision, sharding, schedule,
dispatcher and overlap switches, and the notes name every run and quote its figure. Nothing here times a run: the
set was gathered blind and is scored once, later, by whoever wires it in (runs.SETS does not hold it yet)."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from parasim.clock import overlaps
from parasim.clock import runs as old
from parasim.clock import runs_eighth, runs_fifth, runs_fourth, runs_fresh, runs_seventh, runs_sixth
from parasim.clock.dispatch import DISPATCHERS
from parasim.clock.runs import FLOP_UNITS, PRECISION_SAID, RULES, SHARDING, UNITS, PublishedRun
from parasim.estimate.hardware import GPUS
from parasim.layout import Layout
from parasim.pipeline.schedules import schedule_entry

NOTES = Path(__file__).resolve().parents[1] / "docs" / "notes" / "step-time-runs-eighth.md"
RUNS = list(runs_eighth.EIGHTH)
IDS = [r.key for r in RUNS]
BEFORE = [old.SOURCES, runs_fresh.SOURCES, runs_fourth.SOURCES, runs_fifth.SOURCES, runs_sixth.SOURCES,
          runs_seventh.SOURCES]


def test_runs_build_and_keys_are_unique_and_new():
    assert len(RUNS) >= 8 and runs_eighth.eighth_runs() == RUNS
    assert len(set(IDS)) == len(IDS)
    earlier = ({r.key for r in old.RUNS} | {r.key for r in runs_fresh.FRESH} | {r.key for r in runs_fourth.FOURTH}
               | {r.key for r in runs_fifth.FIFTH} | {r.key for r in runs_sixth.SIXTH}
               | {r.key for r in runs_seventh.SEVENTH})
    assert not set(IDS) & earlier
    assert {r.gpu for r in RUNS} >= {"h100", "b200"}
    assert sum(r.moe for r in RUNS) >= 4  # weighted toward mixture-of-experts runs


def test_every_source_is_used_and_new():
    seen = [o for registry in BEFORE for o in registry.values()]
    addresses = {o.address.split("#")[0].rstrip("/") for o in seen}
    assert runs_eighth.EIGHTH_SET == "eighth" and runs_eighth.EIGHTH_SET not in old.SETS
    for s in runs_eighth.SOURCES.values():
        assert s.set == runs_eighth.EIGHTH_SET and all(o.set != s.set for o in seen)
        assert s.address.startswith("https://") and s.document and s.why
        assert re.fullmatch(r"\d{4}-\d{2}", s.date)
        assert s.name not in {o.name for o in seen}
        assert s.address.split("#")[0].rstrip("/") not in addresses
    assert {r.source for r in RUNS} == set(runs_eighth.SOURCES)
    assert len(runs_eighth.SOURCES) >= 2


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_the_run_is_an_eighth_run(r):
    assert isinstance(r, runs_eighth.EighthRun) and isinstance(r, PublishedRun)
    assert r.set == runs_eighth.EIGHTH_SET
    assert r.gpu in GPUS


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_gpus_are_the_layouts(r):
    plan = r.plan
    assert r.gpus == plan.tp * plan.pp * plan.dp * plan.cp == plan.world


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_the_layout_holds_the_model(r):
    plan = r.plan
    model = r.model if plan.cp == 1 else replace(r.model, seq=r.seq)
    layout = Layout(tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, ep=plan.ep, etp=plan.etp, sp=plan.sp, model=model,
                    zero=SHARDING[r.sharding][0])
    assert layout.world == r.gpus
    plan.check(r.model, r.seq)
    if r.moe:
        assert r.model.top_k and r.model.expert_ffn
        assert plan.dispatcher in DISPATCHERS


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_model_chunks_divide_the_layers(r):
    from tests.test_runs_data import chunks_divide_the_layers
    chunks_divide_the_layers(r)


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_batch_and_registries(r):
    plan = r.plan
    assert plan.microbatches is not None and plan.microbatches >= 1
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
    assert set(r.overlap) <= known
    for name, change in r.variants.items():  # each variant still a well-formed plan
        assert name and change
        assert set(change.get("overlap", ())) <= known
        replace(plan, **{k: v for k, v in change.items() if k != "overlap"}).check(r.model, r.seq)


@pytest.mark.parametrize("r", RUNS, ids=IDS)
def test_cite(r):
    short, document, address = r.cite
    assert short.startswith(r.source) and r.where in document and address.startswith("https://")


def test_notes_name_every_run_and_source():
    text = NOTES.read_text()
    assert runs_eighth.GATHERED in text and "blind" in text and "scored once" in text
    for s in runs_eighth.SOURCES.values():
        assert s.address in text
    for r in RUNS:
        assert r.key in text
        assert f"{r.published:g}" in text.replace(",", "")

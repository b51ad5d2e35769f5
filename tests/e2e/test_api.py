"""parasim from Python as docs/api.md shows it: each call answers as its command does (the command's --json,
made by the command line's own parsing, is the reference), and shows itself in a notebook. Expected values
are the command's output or worked by hand beside the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

import parasim
from parasim.errors import UsageError

DATA = Path(__file__).resolve().parents[1] / "data" / "jobs"


def _json(*args: str) -> dict:
    r = cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_memory_answers_as_the_command():
    report = parasim.memory("27b", tp=8, sp=True, seq=8192)
    assert json.loads(json.dumps(report.to_dict())) == _json("memory", "--model", "27b", "--tp", "8", "--sp", "--seq", "8192")
    assert report.fits


def test_memory_in_a_table_and_a_picture():
    """27B at TP 8: BF16 weights are 27e9 x 2 / 8 = 6.75 GB a GPU; the table's rows add up to the total. One GPU
    holds 27e9 x 16 bytes = 432 GB of model state alone: it does not fit 120 GB."""
    report = parasim.memory("27b", tp=8, sp=True, seq=8192)
    frame = report.to_pandas()
    assert frame.loc["weights", "GB"] == pytest.approx(6.75)
    assert frame["GB"].sum() == pytest.approx(report.breakdown.total / 1e9)
    assert report.plot()._repr_png_().startswith(b"\x89PNG")
    assert "27B dense" in report._repr_html_() and "fits" in report._repr_html_()
    assert not parasim.memory("27b").fits


def test_fit_answers_as_the_command():
    found = parasim.fit("27b", tp=8, sp=True)
    assert found.fit.seq == _json("fit", "--model", "27b", "--tp", "8", "--sp")["max_seq_tokens"]
    assert found.fits and "the longest sequence" in found._repr_html_()


def test_a_config_path_and_a_model_spec_are_models():
    path = str(DATA / "hf" / "Llama-3.1-8B-Instruct_config.json")
    by_path = parasim.memory(path, tp=2)
    assert by_path.to_dict() == _json("memory", "--config", path, "--tp", "2")
    spec = parasim.api.model_of(path)
    without_file = {k: v for k, v in by_path.to_dict().items() if k != "config"}  # a spec names no file read
    assert parasim.memory(spec, tp=2).to_dict() == without_file
    with pytest.raises(UsageError, match="a model is a ModelSpec"):
        parasim.memory(27, tp=2)


def test_a_lesson_runs_with_its_knobs():
    run = parasim.lesson("tp-mlp", tp=4)
    assert run.ok and run.result.world == 4 and "tp-mlp" in run._repr_html_()
    again = parasim.api.lesson("tp-mlp", tp=4)
    assert [c.to_dict() for c in again.checks] == [c.to_dict() for c in run.checks]
    with pytest.raises(UsageError):
        parasim.lesson("no-such-lesson")


def test_a_lesson_s_table_and_picture(tmp_path):
    """cp-causal's table: 16 tokens on 4 CP ranks, causal. Contiguous blocks of 4: rank r's queries see
    4r + 1 ... 4r + 4 keys, so its share grows with r; zigzag gives each rank 25%."""
    run = parasim.lesson("cp-causal")
    frame = run.tables[0].to_pandas()
    assert list(frame["zigzag share %"]) == [25, 25, 25, 25]
    picture = run.plot()
    picture.save(str(tmp_path / "cp.png"))
    assert (tmp_path / "cp.png").read_bytes() == picture.data and picture.data.startswith(b"\x89PNG")
    with pytest.raises(UsageError, match="has no picture"):
        parasim.lesson("collectives").plot()


def test_read_job_and_its_format():
    job = parasim.read_job(str(DATA / "picotron" / "template_base_configs.json"))
    assert (job.layout["pp"], job.world) == (2, 4)
    with pytest.raises(UsageError, match="format must be one of"):
        parasim.read_job(str(DATA / "picotron" / "base_config.json"), format="yaml")


def test_html_is_escaped():
    from parasim.lesson import Table

    html = Table("a <b> & c", ["x", "y"], [("<script>", [1.5])])._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "a &lt;b&gt; &amp; c" in html


def test_usable_memory_in_gb_as_the_command_takes_it():
    """--usable 80 is 80 GB a GPU: the 27B model at TP 8 (about 67 GB at 8,192 tokens on the command's own
    figures) fits 80 GB and not 40 GB."""
    assert parasim.memory("27b", tp=8, sp=True, seq=8192, usable=80).to_dict() == _json(
        "memory", "--model", "27b", "--tp", "8", "--sp", "--seq", "8192", "--usable", "80"
    )
    assert not parasim.memory("27b", tp=8, sp=True, seq=8192, usable=40).fits

"""The Llama 3 405B presets against the Llama 3 paper (Dubey et al., 2024): about 405e9 parameters from Table 3's
shapes, Table 4's layouts on 16,384 GPUs, one layer fewer on the first and last of 16 stages (section 3.3.2); and
`parasim memory` planning the preset's layout."""
from __future__ import annotations

import json

from conftest import cli

from parasim.layout import preset
from parasim.layout.stages import stage_counts


def test_the_model_is_the_papers_405b():
    model = preset("llama3-405b").model
    assert abs(model.total_params() / 405e9 - 1) < 0.01  # the paper's name for it: 405B
    assert stage_counts(model, 16) == (7,) + (8,) * 14 + (7,)


def test_the_two_layouts_are_table_4s():
    short, long = preset("llama3-405b"), preset("llama3-405b-long")
    assert (short.tp, short.cp, short.pp, short.dp, short.world) == (8, 1, 16, 128, 16384)
    assert (long.tp, long.cp, long.pp, long.dp, long.world) == (8, 16, 16, 8, 16384)
    # the long-context stage trains on sequences of 131,072 tokens (the paper's 128K); the first stage's length is
    # the run's to name
    assert (long.model.seq, short.model.seq) == (131072, None) and long.model.name == short.model.name


def test_memory_plans_the_preset_model_on_its_layout():
    got = cli("memory", "--model", "llama3-405b", "--tp", "8", "--sp", "--pp", "16", "--dp", "128", "--seq", "8192",
              "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert data["layout"]["world"] == 16384 and data["stages"]["layers"] == [7] + [8] * 14 + [7]

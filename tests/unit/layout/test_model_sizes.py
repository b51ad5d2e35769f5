"""A model given in part (sizes left None) answers what its given sizes allow and names what it lacks for the
rest (ModelSpec.size and .k), rather than failing on None arithmetic."""
import numpy as np
import pytest

from parasim.layout import LayoutError, ModelSpec


def test_a_layers_count_needs_only_the_sizes_it_reads():
    # Q and O: hidden x (heads x head size) each; K and V: hidden x (kv heads x head size) each, by hand
    m = ModelSpec(hidden=64, heads=4)
    assert m.attention_params() == 64 * 64 * 2 + 64 * 2 * 64
    assert m.mlp_params(256) == 2 * 64 * 256


@pytest.mark.parametrize("given, lacking", [({"heads": 4}, "hidden"), ({"hidden": 64}, "heads")])
def test_a_missing_size_is_named(given, lacking):
    with pytest.raises(LayoutError, match=f"model shapes lacks {lacking}$"):
        ModelSpec(name="shapes", **given).attention_params()


def test_a_count_over_the_whole_model_names_each_size_it_reaches_first():
    m = ModelSpec(hidden=64, heads=4, vocab=100)
    with pytest.raises(LayoutError, match="lacks layers"):
        m.counted()
    with pytest.raises(LayoutError, match="lacks vocab"):
        ModelSpec(hidden=64, heads=4, layers=2).counted()


def test_an_moe_model_without_its_top_k_says_so():
    m = ModelSpec(name="moe", layers=2, hidden=8, heads=2, vocab=10, experts=4)
    with pytest.raises(LayoutError, match=r"model moe lacks top_k \(an MoE model needs its top-k: --top-k\)"):
        m.active_params()
    assert ModelSpec(layers=2, hidden=8, heads=2, vocab=10, experts=4, top_k=2).k == 2


def test_a_size_is_a_python_int():
    got = ModelSpec(layers=np.int64(3)).size("layers")
    assert got == 3 and type(got) is int

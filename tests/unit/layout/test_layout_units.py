"""layout/mesh.py's Layout made piece by piece, fast: the sizes it derives (written out), each refusal at its
boundary with its words, and the embedding groups Megatron-Core builds from the pipeline groups."""
import pytest

from parasim.layout import Layout, LayoutError, ModelSpec
from parasim.limits import LAYOUT_WORLD


def test_the_sizes_a_layout_derives_written_out():
    l = Layout(tp=2, pp=2, dp=2)  # etp follows tp; edp = 8 // (etp 2 * ep 1 * pp 2)
    assert (l.world, l.dp, l.etp, l.edp) == (8, 2, 2, 2)
    l = Layout(tp=2, pp=2, dp=3, ep=3, etp=1)  # 12 GPUs; edp = 12 // (1 * 3 * 2)
    assert (l.world, l.dp, l.etp, l.edp) == (12, 3, 1, 2)
    l = Layout(tp=2, cp=3, world=12)  # dp from the world: 12 // (2 * 3)
    assert (l.world, l.dp, l.etp, l.edp) == (12, 2, 2, 6)
    assert all(type(v) is int for v in (l.world, l.dp, l.etp, l.edp))


@pytest.mark.parametrize("kw, words", [
    ({"tp": 2.0}, "tp must be a positive integer, got 2.0"),
    ({"tp": True}, "tp must be a positive integer, got True"),
    ({"pp": 0}, "pp must be a positive integer, got 0"),
    ({"order": "tp-xx-ep-dp-pp"}, "unknown word 'xx' in order 'tp-xx-ep-dp-pp'; use tp-cp-ep-dp-pp or tp-cp-ep-pp-dp"),
    ({"dp": LAYOUT_WORLD + 1}, f"a world of {LAYOUT_WORLD + 1:,} GPUs is more than the limit of {LAYOUT_WORLD:,}"),
    ({"tp": 2, "dp": 3, "world": 8}, "dp 3 does not fit: world 8 / (tp*cp*pp = 2) is 4"),
    ({"tp": 3, "world": 8}, "world 8 is not divisible by tp*cp*pp = 3"),
    ({"tp": 2, "ep": 4, "dp": 2}, "world 4 is not divisible by etp*ep*pp = 8 (etp was not given, so it follows tp = 2, "
                                  "as Megatron's --expert-tensor-parallel-size does; give etp=1 for experts not split "
                                  "by TP)"),
    ({"tp": 2, "ep": 8, "etp": 1, "dp": 2}, "world 4 is not divisible by etp*ep*pp = 8"),
    ({"ep": 3, "dp": 2}, "world 2 is not divisible by etp*ep*pp = 3"),
    ({"tp": 2, "pp": 2, "dp": 2, "etp": 1, "order": "tp-cp-ep-pp-dp"},
     "order tp-cp-ep-pp-dp with pp > 1 needs edp == dp (Megatron-Core's rule when pp is not the last word), "
     "got edp=4, dp=2"),
    ({"sp": True}, "sequence parallelism needs tp > 1"),
    ({"ep": 2, "dp": 2, "model": ModelSpec("dense", layers=2, hidden=8, heads=2)}, "ep 2 needs a model with experts"),
])
def test_each_refusal_says_its_rule(kw, words):
    with pytest.raises(LayoutError) as err:
        Layout(**kw)
    assert str(err.value) == words


def test_what_is_just_inside_each_rule_is_a_layout():
    assert Layout(dp=LAYOUT_WORLD).world == LAYOUT_WORLD
    assert Layout(tp=2, dp=4, world=8).dp == 4
    assert Layout(tp=2, dp=2, etp=1, order="tp-cp-ep-pp-dp").edp == 4  # edp != dp is fine without pp
    assert Layout(tp=2, pp=2, dp=2, ep=2, etp=1, order="tp-cp-ep-pp-dp").edp == 2
    assert Layout(tp=2, sp=True).sp


@pytest.mark.parametrize("layout, embedding, position", [
    (Layout(pp=4, dp=2), [[0, 6], [1, 7]], [[0], [1]]),  # the first and last stage of each pipeline
    (Layout(pp=2, dp=2), [[0, 2], [1, 3]], [[0], [1]]),
    (Layout(dp=2), [[0], [1]], [[0], [1]]),               # one stage: itself alone
])
def test_the_embedding_groups_are_each_pipelines_ends(layout, embedding, position):
    g = layout.groups()
    assert (g["embedding"], g["position-embedding"]) == (embedding, position)


def test_dense_groups_are_built_from_the_dense_sizes():
    """tp 2, cp 2, dp 2 in Megatron's order tp-cp-ep-dp-pp: rank = tp + 2 cp + 4 dp, so a CP group varies cp
    alone and a TP group tp alone."""
    g = Layout(tp=2, cp=2, dp=2).groups()
    assert g["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]

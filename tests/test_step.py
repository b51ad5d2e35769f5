"""One training step of any model on any layout (examples/step.py): the layers each stage holds, and the same
step virtually and symbolically, event for event and byte for byte."""
import pytest

import parasim
from parasim.errors import LayoutError, UsageError
from parasim.examples.step import layer_shape, make_step, stage_layers
from parasim.layout import Layout, ModelSpec, preset
from tests.test_symbolic import _key

SMALL = ModelSpec(name="small", layers=5, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2, dense_layers=1,
                  seq=8, bias=False, uneven_stages=True)


def test_stages_take_the_layers_as_evenly_as_they_can():
    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    sizes = [len(stage_layers(61, 16, s)) for s in range(16)]
    assert sizes == [4] * 13 + [3] * 3 and sum(sizes) == 61
    assert stage_layers(61, 16, 15) == range(58, 61)


def test_the_leading_layers_are_dense():
    ds = preset("deepseek-v3").model
    assert [layer_shape(ds, i).experts for i in (0, 2, 3, 60)] == [0, 0, 256, 256]
    assert layer_shape(ds, 0).top_k is None and layer_shape(SMALL, 1) is SMALL


@pytest.mark.parametrize("layout", [Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=SMALL),
                                    Layout(pp=2, dp=4, ep=4, model=SMALL)], ids=["tp-cp-pp-ep", "pp-ep"])
def test_the_step_is_the_same_virtually_and_symbolically(layout):
    program = make_step(layout, m=2)
    real = parasim.run(program, layout.world)
    sym = parasim.run(program, layout.world, backend="symbolic")
    assert _key(sym.trace) == _key(real.trace)
    assert {tuple(v["layers"]) for v in real.values} == {("L0", "L1", "L2"), ("L3", "L4")}
    ops = {e.op for e in real.trace.events}
    assert {"all_to_all", "p2p", "reduce_scatter", "all_gather"} <= ops


def test_bad_steps_get_one_line():
    with pytest.raises(LayoutError, match="needs at least 2 micro-batches"):
        make_step(Layout(pp=2, dp=4, ep=4, model=SMALL), m=1)
    with pytest.raises(UsageError, match="needs a layout with a model and its sequence length"):
        make_step(Layout(tp=2))

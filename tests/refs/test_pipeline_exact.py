"""Every schedule, run for real over PP ranks (with TP inside the stages too), gives the unsplit model's
loss and gradients (torch autograd, float64)."""
import numpy as np
import pytest

pytest.importorskip("torch")

from helpers_pipeline import SHAPE, pipeline_reference, run_pipeline  # noqa: E402
from layer_check import layer_grads  # noqa: E402


CASES = [("gpipe", 2, 1, 3, None), ("1f1b", 4, 1, 4, None), ("1f1b", 2, 2, 4, None), ("zb-h1", 4, 1, 6, None),
         ("zb-h1", 2, 2, 3, None), ("interleaved", 2, 1, 4, 2), ("interleaved", 4, 1, 4, 2), ("interleaved", 2, 1, 6, 3),
         ("interleaved-zb", 2, 1, 4, 2), ("interleaved-zb", 2, 2, 4, 2), ("zbv", 2, 1, 3, 2), ("zbv", 4, 1, 8, 2),
         ("dualpipev", 2, 1, 4, 2), ("dualpipev", 2, 2, 5, 2), ("dualpipev", 4, 1, 8, 2)]


@pytest.mark.parametrize("schedule, pp, tp, m, chunks", CASES)
def test_schedule_equals_unsplit_model(schedule, pp, tp, m, chunks):
    v = chunks or 1
    layers = pp * v * (2 if pp * v < 4 else 1)
    sp = tp > 1 and schedule != "1f1b"  # SP puts collectives into the deferred weight passes
    res = run_pipeline(schedule, pp, tp, m, layers, chunks, sp=sp)
    loss, ref = pipeline_reference(m, layers)
    holders = [x for x in res.values if x["loss"] != 0]
    assert len(holders) == tp  # under SP each TP rank holds the loss of its share of the sequence
    assert abs(sum(x["loss"] for x in holders) / (1 if sp else tp) - loss) < 1e-10
    for i in range(layers):
        ranks = sorted((x for x in res.values if i in x["grads"]), key=lambda x: x["tp"])
        got = layer_grads([x["grads"][i] for x in ranks], SHAPE, tp)
        assert all(np.max(np.abs(got[k] - ref[i][k])) < 1e-10 for k in ref[i]), (schedule, i)
    sends = [e for e in res.trace.events if e.op == "p2p"]
    crossings = pp * v - 1 - (schedule in ("zbv", "dualpipev"))  # stage boundaries; a V turns on one rank
    assert len(sends) == 2 * m * crossings * tp  # each micro-batch: activations forward, gradients back

"""A small GPT (vocab-parallel embedding, a stack of layers, final norm, column-parallel output layer,
vocab-parallel cross-entropy) split by TP, with and without SP: loss and every gradient equal torch
autograd on the unsplit model in float64."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from layer_check import SharedCtx, data, layer_grads, model_weights, run_model, torch_layer, torch_weights  # noqa: E402
from parasim.layout import ModelSpec


def run_torch(shape: ModelSpec, s: int, b: int, vocab: int, layers: int):
    ctx = SharedCtx()
    w = {k: torch.tensor(v, requires_grad=True) for k, v in model_weights(ctx, shape.hidden, vocab).items()}
    Ws = [torch_weights(shape, f"L{i}") for i in range(layers)]
    ids, targets = (torch.tensor(a) for a in data(ctx, s, b, vocab))
    x = F.embedding(ids, w["emb"])
    for i, W in enumerate(Ws):
        x = torch_layer(x, W, shape, f"L{i}")
    logits = F.layer_norm(x, (shape.hidden,), w["lnf.w"], w["lnf.b"], eps=1e-5) @ w["head"]
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    return float(loss.detach()), {k: v.grad.numpy() for k, v in w.items()}, \
        [{k: v.grad.numpy() for k, v in W.items() if v is not None} for W in Ws]


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), sp=st.booleans(), kv=st.sampled_from([1, 2, 4]), s_mult=st.integers(1, 2),
       b=st.integers(1, 2), dropout=st.sampled_from([0.0, 0.2]), layers=st.integers(1, 2))
def test_model_equals_torch_autograd(tp, sp, kv, s_mult, b, dropout, layers):
    shape = ModelSpec(hidden=16, heads=4, kv_heads=kv, dropout=dropout)
    s, vocab = 4 * s_mult, 4 * tp * 3
    ranks = run_model(shape, tp, sp, s, b, vocab, layers).values
    loss, wg, lg = run_torch(shape, s, b, vocab, layers)
    assert all(abs(r["loss"] - loss) < 1e-10 for r in ranks)
    assert np.max(np.abs(np.concatenate([r["emb"] for r in ranks], axis=0) - wg["emb"])) < 1e-10
    assert np.max(np.abs(np.concatenate([r["head"] for r in ranks], axis=1) - wg["head"])) < 1e-10
    assert np.max(np.abs(ranks[0]["lnf"]["weight"] - wg["lnf.w"])) < 1e-10
    for i in range(layers):
        got = layer_grads([r["layers"][i] for r in ranks], shape, tp)
        assert all(np.max(np.abs(got[k] - lg[i][k])) < 1e-10 for k in lg[i]), i

"""A small GPT (vocab-parallel embedding, a stack of layers, final norm, column-parallel output layer,
vocab-parallel cross-entropy) split by TP, with and without SP: loss and every gradient equal torch
autograd on the unsplit model in float64."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import parasim  # noqa: E402
from layer_check import SEED, _SharedCtx, layer_grads, torch_layer, torch_weights  # noqa: E402
from parasim.nn import ColumnParallelLinear, Saved, TPContext  # noqa: E402
from parasim.nn.embedding import VocabParallelCrossEntropy, VocabParallelEmbedding  # noqa: E402
from parasim.nn.layer import LayerShape, Stack, TransformerLayer, layer_weights  # noqa: E402
from parasim.nn.norm import LayerNorm  # noqa: E402


def model_weights(ctx, h: int, vocab: int) -> dict:
    return {"emb": ctx.shared_rng("emb").normal((vocab, h)), "head": ctx.shared_rng("head").normal((h, vocab),
                                                                                                   std=h ** -0.5),
            "lnf.w": 1.0 + ctx.shared_rng("lnf.w").normal((h,), std=0.1), "lnf.b": ctx.shared_rng("lnf.b").normal((h,))}


def data(ctx, s: int, b: int, vocab: int):
    return ctx.shared_rng("ids").integers(0, vocab, (s, b)), ctx.shared_rng("targets").integers(0, vocab, (s, b))


def run_split(shape: LayerShape, tp: int, sp: bool, s: int, b: int, vocab: int, layers: int):
    def program(ctx):
        t = TPContext(ctx, ctx.new_group(range(ctx.world), "tp") if ctx.world > 1 else None, sp=sp)
        w = model_weights(ctx, shape.hidden, vocab)
        emb = VocabParallelEmbedding(t, w["emb"])
        stack = Stack([TransformerLayer(t, shape, layer_weights(ctx, shape, f"L{i}"), key=f"L{i}", name=f"L{i}")
                       for i in range(layers)])
        lnf = LayerNorm(t, w["lnf.w"], w["lnf.b"], name="lnf")
        head = ColumnParallelLinear(t, w["head"], name="head")
        loss_fn = VocabParallelCrossEntropy(t, vocab)
        ids, targets = data(ctx, s, b, vocab)
        saved = Saved()
        x, c_emb = emb.forward(ids, saved)
        x, c_stack = stack.forward(x, saved)
        z, c_lnf = lnf.forward(x, saved)
        logits, c_head = head.forward(z, saved)
        loss, c_loss = loss_fn.forward(logits, targets, saved)
        emb.backward(c_emb, stack.backward(c_stack, lnf.backward(c_lnf, head.backward(c_head,
                                                                                     loss_fn.backward(c_loss)))))
        return {"loss": float(loss), "emb": emb.grads["weight"], "head": head.grads["weight"],
                "lnf": lnf.grads, "layers": [layer.grads for layer in stack.layers]}
    return parasim.run(program, tp, seed=SEED).values


def run_torch(shape: LayerShape, s: int, b: int, vocab: int, layers: int):
    ctx = _SharedCtx()
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
    shape = LayerShape(hidden=16, heads=4, kv_heads=kv, dropout=dropout)
    s, vocab = 4 * s_mult, 4 * tp * 3
    ranks = run_split(shape, tp, sp, s, b, vocab, layers)
    loss, wg, lg = run_torch(shape, s, b, vocab, layers)
    assert all(abs(r["loss"] - loss) < 1e-10 for r in ranks)
    assert np.max(np.abs(np.concatenate([r["emb"] for r in ranks], axis=0) - wg["emb"])) < 1e-10
    assert np.max(np.abs(np.concatenate([r["head"] for r in ranks], axis=1) - wg["head"])) < 1e-10
    assert np.max(np.abs(ranks[0]["lnf"]["weight"] - wg["lnf.w"])) < 1e-10
    for i in range(layers):
        got = layer_grads([r["layers"][i] for r in ranks], shape, tp)
        assert all(np.max(np.abs(got[k] - lg[i][k])) < 1e-10 for k in lg[i]), i

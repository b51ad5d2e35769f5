"""Every collective of a small GPT's step, in order, on two TP groups side by side: the pattern Megatron's
f/g operators (and their SP forms) prescribe, written out here by hand. A wrong op, group or label in
any layer shows up as a line that differs."""
import pytest
from layer_check import run_model

from parasim.nn.core import Saved
from parasim.layout import ModelSpec

SHAPE = ModelSpec(hidden=8, heads=2, kv_heads=2, dropout=0.0)
S, B, VOCAB = 4, 1, 8
LOSS = [("all_reduce", "loss: max logit", "max"), ("all_reduce", "loss: sum of exp", "sum"),
        ("all_reduce", "loss: target logit", "sum")]  # three small all-reduces, never the whole logits


def _calls(result, group):
    """(op, label, reduce op) of each collective on `group`, in order."""
    return [(e.op, e.label, e.params.get("op")) for e in result.trace.events if e.ranks == group]


def test_tp_without_sp():
    # g (all-reduce) ends each row-parallel part forward: embedding, attention out, fc2; f (all-reduce)
    # ends each column-parallel part backward: head, fc1, qkv. The embedding's backward needs nothing.
    g, f = ("all_reduce", "g forward", "sum"), ("all_reduce", "f backward", "sum")
    expected = [g, g, g] + LOSS + [f, f, f]
    res = run_model(SHAPE, 2, False, S, B, VOCAB, 1, replicas=2)
    assert _calls(res, [0, 1]) == expected and _calls(res, [2, 3]) == expected
    assert len(res.trace.events) == 2 * len(expected)  # nothing on any other group


def test_tp_with_sp():
    def ag(name, again=False):
        return ("all_gather", f"{name}: all-gather the sequence{' again' if again else ''}", None)

    def rs(name):
        return ("reduce_scatter", f"{name}: reduce-scatter the sequence", "sum")

    def grad_sum(name, what):  # a replicated weight's grads, summed over the ranks' token slices
        return ("all_reduce", f"{name} backward: sum {what} grad (SP)", "sum")

    def column_backward(name):  # gather the saved input again for the weight grad; dx goes back scattered
        return [ag(f"{name} backward", again=True), ("reduce_scatter", f"{name} backward: reduce-scatter", "sum")]

    def row_backward(name):  # the bias is whole on every rank; dy is gathered for the weight grad and dx
        return [grad_sum(name, "bias"), ag(f"{name} backward")]

    def norm_backward(name):
        return [grad_sum(name, "weight"), grad_sum(name, "bias")]

    forward = [("reduce_scatter", "embedding: reduce-scatter", "sum"), ag("L0.attn.qkv"), rs("L0.attn.out"),
               ag("L0.mlp.fc1"), rs("L0.mlp.fc2"), ag("head")] + LOSS
    backward = (column_backward("head") + norm_backward("lnf") + row_backward("L0.mlp.fc2")
                + column_backward("L0.mlp.fc1") + norm_backward("L0.ln2") + row_backward("L0.attn.out")
                + column_backward("L0.attn.qkv") + norm_backward("L0.ln1")
                + [("all_gather", "embedding backward: all-gather", None)])
    res = run_model(SHAPE, 2, True, S, B, VOCAB, 1, replicas=2)
    assert _calls(res, [0, 1]) == forward + backward and _calls(res, [2, 3]) == forward + backward
    assert len(res.trace.events) == 2 * len(forward + backward)


def test_one_rank_sends_nothing_and_the_loss_keeps_its_softmax():
    res = run_model(SHAPE, 1, False, S, B, VOCAB, 1)
    assert res.trace.events == []
    assert res.values[0]["saved"]["loss.softmax"] == S * B * VOCAB * 2  # 2 bytes a value
    res = run_model(SHAPE, 2, True, S, B, VOCAB, 1)
    assert res.values[0]["saved"]["loss.softmax"] == S * B * VOCAB // 2 * 2  # each rank its half of the vocabulary


def test_saved_by_name_adds_up_each_layer_and_name():
    import numpy as np
    saved = Saved()
    saved.keep("a", "x", np.zeros((2, 3)))
    saved.keep("a", "x", np.zeros(4), unit=1)
    saved.keep("a", "y", np.zeros(1))
    saved.keep("b", "x", np.zeros(5))
    assert saved.by_name() == {"a.x": 12 + 4, "a.y": 2, "b.x": 10}
    assert saved.bytes() == 28 and saved.bytes("a") == 18


@pytest.mark.parametrize("sp", [False, True])
def test_the_two_replicas_get_the_same_loss(sp):
    vals = run_model(SHAPE, 2, sp, S, B, VOCAB, 1, replicas=2).values
    assert len({v["loss"] for v in vals}) == 1

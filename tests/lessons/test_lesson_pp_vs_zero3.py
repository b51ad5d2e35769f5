"""The pp-vs-zero3 lesson: its checks hold, and the bytes each technique sends, how they grow with the
batch and the model, the bubble and the exactness against one device are re-derived here by closed form
and by a reference written in this file, not read from the lesson's own output."""
import json
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from conftest import cli

import parasim
from parasim.examples.pp_vs_zero3 import Config, both, data_parallel_schedule
from parasim.train.whole import whole_layers
from parasim.layout import ModelSpec
from parasim.lesson import get_lesson, run_lesson
from parasim.nn import Saved
from parasim.nn.layer import Stack
from parasim.pipeline.timing import time_schedule

BASE = Config()
SIZES = {"base": BASE, "batch x2": replace(BASE, mb_size=4), "hidden x2": replace(BASE, hidden=16),
         "layers x2": replace(BASE, layers=8)}


def weights_per_layer(h):
    """No biases: q, k, v, out (4h^2), MLP h x 4h and 4h x h (8h^2), two LayerNorms' weight and bias (4h)."""
    return 12 * h * h + 4 * h


def pp_bytes(c):
    """m micro-batches, each an s x b x h float64 activation, forward and back, over p - 1 boundaries."""
    return c.microbatches * (c.seq * c.mb_size * c.hidden) * 8 * 2 * (c.world - 1)


def zero3_bytes(c):
    """Per layer two all-gathers and one reduce-scatter of its weights; a ring one moves (n-1)/n of the
    buffer from each of n GPUs, so (n-1) buffers in all per collective."""
    assert weights_per_layer(c.hidden) % c.world == 0  # no padding at these sizes
    return 3 * (c.world - 1) * c.layers * weights_per_layer(c.hidden) * 8


def on_the_wire(trace):
    """Bytes sent, from the trace: point-to-point transfers (PP) and collectives (ZeRO-3)."""
    p2p = sum(m.sent for e in trace.events if e.kind == "p2p" for m in e.members)
    coll = sum(m.sent for e in trace.events if e.op in ("all_gather", "reduce_scatter") for m in e.members)
    return p2p, coll


@pytest.fixture(scope="module")
def lr():
    return run_lesson(get_lesson("pp-vs-zero3"))


@pytest.fixture(scope="module")
def runs():
    return {name: parasim.run(both(c), c.world) for name, c in SIZES.items()}


def test_the_lessons_checks_hold(lr):
    assert lr.result.world == 4
    assert lr.ok, [c for c in lr.checks if not c.ok]
    assert len(lr.checks) == 13


def test_the_stepped_run_moves_what_the_closed_forms_say(lr):
    p2p, coll = on_the_wire(lr.result.trace)
    assert (p2p, coll) == (pp_bytes(BASE), zero3_bytes(BASE)) == (12288, 230400)
    events = lr.result.trace.events
    # PP: 4 micro-batches x 2 directions x 3 boundaries, each one micro-batch's [s, b, h] activation
    shapes = {t.shape for e in events if e.kind == "p2p" for m in e.members for t in (*m.ins, *m.outs)}
    assert sum(e.kind == "p2p" for e in events) == 24 and shapes == {(4, 2, 8)}
    # ZeRO-3: per layer, gather for forward, gather for backward, reduce-scatter; buffers one layer's size
    ops = [e.op for e in events if e.kind != "p2p"]
    assert ops.count("all_gather") == 8 and ops.count("reduce_scatter") == 4 and len(ops) == 12
    whole = {max(t.shape[0] for t in (*m.ins, *m.outs)) for e in events if e.kind != "p2p" for m in e.members}
    assert whole == {weights_per_layer(8)}


def test_bytes_grow_with_the_batch_for_pp_and_with_the_model_for_zero3(runs):
    got = {name: on_the_wire(r.trace) for name, r in runs.items()}
    assert got == {name: (pp_bytes(c), zero3_bytes(c)) for name, c in SIZES.items()}
    ratio = {name: tuple(Fraction(a, b) for a, b in zip(got[name], got["base"])) for name in SIZES}
    assert ratio["batch x2"] == (2, 1)  # PP doubles with the batch; ZeRO-3 does not move
    # twice the width: PP follows the activations (x2), ZeRO-3 the weights ((12*256 + 64)/(12*64 + 32))
    assert ratio["hidden x2"] == (2, Fraction(3136, 800)) and Fraction(3136, 800) != 2
    assert ratio["layers x2"] == (1, 2)  # twice the depth: same activations per boundary, twice the weights


def test_zero3_sends_one_and_a_half_times_an_all_reduce_of_the_weights(runs):
    for name, c in SIZES.items():
        weights = c.layers * weights_per_layer(c.hidden)
        all_reduce = 2 * (c.world - 1) * weights * 8  # a ring all-reduce, summed over the n GPUs
        assert on_the_wire(runs[name].trace)[1] * 2 == 3 * all_reduce, name


def test_the_bubble(lr):
    p, m = BASE.world, BASE.microbatches
    assert {v["pp"]["bubble"] for v in lr.result.values} == {Fraction(p - 1, m + p - 1)}
    assert {v["zero3"]["bubble"] for v in lr.result.values} == {0}
    assert time_schedule(data_parallel_schedule(4)).idle == [0, 0, 0, 0]


def test_the_table_rows_are_the_closed_forms(lr):
    got = {c.name.split(": ", 1)[1]: c.got for c in lr.checks if c.name.startswith("the post's table")}
    assert got == {
        "what moves": ["activations and their gradients: 24 p2p of [4, 2, 8]",
                       "weights and their gradients: 8 all_gather + 4 reduce_scatter of 800 values (one layer)"],
        "bytes sent per step, all GPUs (hidden 8, 4 layers, 8 sequences)": [str(pp_bytes(BASE)),
                                                                            str(zero3_bytes(BASE))],
        "bytes x when batch doubles": ["2", "1"],
        "bytes x when hidden doubles": ["2", str(Fraction(weights_per_layer(16), weights_per_layer(8)))],
        "bytes x when layers doubles": ["1", "2"],
        "bubble (idle share of the step)": ["3/7", "0"],
        "weights a GPU keeps between steps": [str(4 * weights_per_layer(8) // 4)] * 2,
    }


def test_the_width_row_reads_as_a_decimal_beside_nearly_four(lr):
    """Twice the width multiplies ZeRO-3's bytes by (12*16^2 + 4*16) / (12*8^2 + 4*8) = 3.92: the table prints
    it as a decimal, not the fraction 98/25, and the note sets the figure beside the words 'nearly x4'."""
    from parasim.render.walkthrough import walkthrough
    grown = Fraction(weights_per_layer(16), weights_per_layer(8))
    text = walkthrough(lr)
    (row,) = [line for line in text.splitlines() if line.strip().startswith("bytes x when hidden doubles")]
    assert row.split()[-2:] == ["2", f"{float(grown):.2f}"] == ["2", "3.92"]
    assert str(grown) not in row
    assert f"ZeRO-3's bytes by {float(grown):.2f} ({grown} exactly): nearly x4" in " ".join(text.split())


# -- exactness, element by element, against a one-device run written here --------------------------
def _adam(w, g, lr=0.01, b1=0.9, b2=0.999, eps=1e-8):
    m_hat, v_hat = (1 - b1) * g / (1 - b1), (1 - b2) * g * g / (1 - b2)
    return w - lr * m_hat / (np.sqrt(v_hat) + eps)


def _one_device(c):
    def program(ctx):
        spec = ModelSpec(hidden=c.hidden, heads=c.heads, dropout=0.0, bias=False)
        stack = Stack(whole_layers(ctx, spec, 0, c.layers))  # the layers as built; the step below is written here
        n = c.sequences
        x = np.concatenate([ctx.shared_rng(f"x{s}").normal((c.seq, 1, c.hidden)) for s in range(n)], axis=1)
        t = np.concatenate([ctx.shared_rng(f"t{s}").normal((c.seq, 1, c.hidden)) for s in range(n)], axis=1)
        y, cache = stack.forward(x, Saved())
        stack.backward(cache, t / n)
        g = stack.grads
        return float(np.sum(y * t)) / n, g, {k: _adam(w, g[k]) for k, w in stack.params().items()}
    return parasim.run(program, 1).values[0]


@pytest.mark.parametrize("name", list(SIZES))
def test_both_equal_one_device_element_by_element(name):
    c = SIZES[name]
    loss, grads, weights = _one_device(c)
    values = parasim.run(both(c, whole=True), c.world).values
    pp, z3 = [v["pp"] for v in values], [v["zero3"] for v in values]
    assert abs(next(x["loss"] for x in pp if x["has_loss"]) - loss) < 1e-12
    assert abs(sum(x["loss"] for x in z3) / c.world - loss) < 1e-12
    for field, want in (("grads", grads), ("weights", weights)):
        got = {k: a for x in pp for k, a in x[field].items()}
        assert set(got) == set(want)
        assert max(np.max(np.abs(got[k] - want[k])) for k in want) < 1e-12
    for field, want in (("grad_shards", grads), ("weight_shards", weights)):
        for key, names in z3[0]["keys"].items():  # each layer's shards end to end, in rank order
            flat = np.concatenate([x[field][key] for x in z3])
            ref = np.concatenate([want[f"{key}.{k}"].reshape(-1) for k in names])
            assert flat.shape == ref.shape and np.max(np.abs(flat - ref)) < 1e-12, (field, key)


def test_json_and_plain_from_the_cli_hold():
    out = cli("lesson", "pp-vs-zero3", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert data["lesson"] == "pp-vs-zero3" and data["world"] == 4
    assert data["checks"] and all(c["ok"] for c in data["checks"])
    plain = cli("lesson", "pp-vs-zero3", "--plain")
    assert plain.returncode == 0 and "13 of 13 checks ok." in plain.stdout
    assert "GPU 1: F1 F2 F3 F4 .  .  .  B1 .  B2 .  B3 .  B4" in plain.stdout  # 1F1B's first row, a grid

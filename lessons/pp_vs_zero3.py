"""Pipeline parallelism against ZeRO-3 on the same 4 GPUs and the same model: PP hands activations from
stage to stage, ZeRO-3 gathers weights and scatters gradients. The program runs both at one size for the
app to step through; the checks run three more sizes (twice the batch, twice the width, twice the
depth), measure the bytes each technique sent from the traces, and rebuild the post's comparison table
from those runs, every row checked against a closed form and every run against one device."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from parasim.examples.pp_vs_zero3 import PP_PHASES, TOL, Z3_PHASES, Config, both, comparison, measure, run_config
from parasim.lesson import Check, Knob, Lesson, Table, check, knob

POST = Config()  # hidden 8, 4 layers, 4 micro-batches of 2 sequences of 4 tokens, 4 GPUs
BYTES = 8  # float64


def base(m: int) -> Config:
    """The base size with m micro-batches (-m; the post's 4)."""
    return replace(POST, microbatches=m)


def variants(cfg: Config) -> dict[str, Config]:
    """Three more sizes: twice the batch, twice the width, twice the depth."""
    return {"batch x2": replace(cfg, mb_size=2 * cfg.mb_size), "hidden x2": replace(cfg, hidden=2 * cfg.hidden),
            "layers x2": replace(cfg, layers=2 * cfg.layers)}


def program(ctx):
    """Both techniques at the base size: PP 4 with 1F1B, then ZeRO-3 over the same 4 GPUs."""
    return both(base(ctx.knobs.get("m", POST.microbatches)))(ctx)


# -- closed forms, written here from the shapes and never read from the code under test --------------
def weights_in_layer(h: int) -> int:
    """A layer without biases: q, k, v and the output projection (4h^2), an MLP of width 4h (8h^2), and two
    LayerNorms with a weight and a bias each (4h)."""
    return 12 * h * h + 4 * h


def padded_layer(cfg: Config) -> int:
    """One layer's weights rounded up to a multiple of the GPU count, so every shard is the same size."""
    n = cfg.world
    return -(-weights_in_layer(cfg.hidden) // n) * n


def activation_values(cfg: Config) -> int:
    """Values crossing one stage boundary in one direction per step: every token's hidden vector."""
    return cfg.microbatches * cfg.seq * cfg.mb_size * cfg.hidden


def pp_bytes(cfg: Config) -> int:
    """m micro-batches x (s x b x h) values x 8 B, forward and back, over the p - 1 boundaries."""
    return activation_values(cfg) * BYTES * 2 * (cfg.world - 1)


def zero3_bytes(cfg: Config) -> Fraction:
    """1.5 x DP's all-reduce of the weights: a ring all-reduce sends 2(n-1)/n of the P weights' bytes per
    GPU; ZeRO-3's two all-gathers and one reduce-scatter send three halves of that, on each of n GPUs."""
    n, weights = cfg.world, cfg.layers * padded_layer(cfg)
    all_reduce_per_gpu = Fraction(2 * (n - 1), n) * weights * BYTES
    return Fraction(3, 2) * all_reduce_per_gpu * n


def study(result) -> dict:
    """The base run measured and three more sizes run: what the table and the checks read."""
    cfg = base(knob(result, "m", POST.microbatches))
    runs = {"base": measure(result, cfg), **{name: run_config(c) for name, c in variants(cfg).items()}}
    return {"runs": runs, "table": comparison(runs)}


def tables(result, found) -> list[Table]:
    """The post's PP-vs-ZeRO-3 table, every cell from the runs."""
    table = found["table"]
    moves = table["what moves"]
    wider = table["bytes x when hidden doubles"][1]  # ZeRO-3's bytes, twice the width over the base run's
    return [Table("PP 4 against ZeRO-3 over 4 GPUs, the same model and batch (from the runs)",
                  ["figure", "PP", "ZeRO-3"],
                  [(row, [_shown(row, x) for x in cells]) for row, cells in table.items() if row != "what moves"],
                  notes=[f"what moves: PP, {moves[0]}; ZeRO-3, {moves[1]}.",
                         "bytes x: how the step's bytes change when the batch, the hidden size or the number of "
                         "layers doubles (three more runs): PP moves activations, which follow the batch and the "
                         "width; ZeRO-3 moves weights, which follow the parameter count. Twice the width multiplies "
                         f"ZeRO-3's bytes by {float(wider):.2f} ({wider} exactly): nearly x4, as a layer's weights "
                         "grow with h^2 (its LayerNorms' 4h keep it under 4)."])]


def _shown(row: str, x) -> int | float | str:
    """A cell as a reader takes it in: a growth factor as a decimal (98/25 reads as 3.92), the bubble as the
    fraction the post writes, counts as they are."""
    if row.startswith("bytes x") and isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else round(float(x), 2)
    return x if isinstance(x, int) else str(x)


def checks(result, found) -> list[Check]:
    runs, table = found["runs"], found["table"]
    cfg = base(knob(result, "m", POST.microbatches))  # the run's base size
    more = variants(cfg)
    p, m, n, L = cfg.world, cfg.microbatches, cfg.world, cfg.layers
    act = {name: Fraction(activation_values(c), activation_values(cfg)) for name, c in more.items()}
    wts = {name: Fraction(c.layers * weights_in_layer(c.hidden), L * weights_in_layer(cfg.hidden))
           for name, c in more.items()}
    expected = {
        "what moves": [f"activations and their gradients: {2 * m * (p - 1)} p2p of {list(cfg.activation)}",
                       f"weights and their gradients: {2 * L} all_gather + {L} reduce_scatter of "
                       f"{padded_layer(cfg)} values (one layer)"],
        f"bytes sent per step, all GPUs ({cfg.describe()})": [pp_bytes(cfg), zero3_bytes(cfg)],
        **{f"bytes x when {name[:-3]} doubles": [act[name], wts[name]] for name in more},
        "bubble (idle share of the step)": [Fraction(p - 1, m + p - 1), 0],
        "weights a GPU keeps between steps": [L * weights_in_layer(cfg.hidden) // p, L * padded_layer(cfg) // n],
    }
    # the table's rows; a ratio row expects the activations' ratio for PP and the weights' for ZeRO-3
    out = [check(f"the post's table, [PP, ZeRO-3]: {row}", [str(x) for x in table[row]],
                 [str(x) for x in expected[row]]) for row in expected]
    configs = {"base": cfg, **more}
    pp = {name: r["pp"]["bytes"] for name, r in runs.items()}
    out += [
        check("PP bytes = m x s x b x h x 8 B x 2 directions x (p-1) boundaries, at every size",
              list(pp.values()), [pp_bytes(c) for c in configs.values()]),
        check("ZeRO-3 bytes = 1.5 x DP's all-reduce (2(n-1)/n x P x 8 B per GPU) x n GPUs, at every size",
              [r["zero3"]["bytes"] for r in runs.values()], [int(zero3_bytes(c)) for c in configs.values()]),
    ]
    for name, r in runs.items():
        e = r["errors"]
        out.append(check(f"{name}: relative difference from one device in the loss, the gradients and the "
                         "weights after Adam (sums of squares per weight, per shard), PP then ZeRO-3",
                         [*e["pp"].values(), *e["zero3"].values()], [0.0] * 6, atol=TOL))
    return out


NARRATIVE = {
    PP_PHASES[0]: """
        First the model is split by layers: GPU k holds layer k, whole, and nothing else. The batch goes
        through in micro-batches of 2 sequences under 1F1B (4 of them at the post's settings, -m sets it). The slot table each GPU notes is the
        pipeline's timing model: the dots are the bubble, slots where a stage waits for its neighbour.""",
    PP_PHASES[1]: """
        What moves is activations: a stage sends its output, one micro-batch's [s, b, h] tensor, to the
        next stage, and the gradient of that tensor comes back the same way. Each transfer is
        point-to-point between neighbours. Its size depends on the tokens and the hidden width only, so
        the weights never travel, however many there are.""",
    PP_PHASES[2]: """
        Every weight a stage owns is whole on that GPU and its gradient is complete there (summed over the
        micro-batches), so each stage takes its Adam step alone. PP's step has no collective at all.""",
    Z3_PHASES[0]: """
        Now the same 4 layers and the same sequences as ZeRO-3: every GPU runs the whole model on its own
        quarter of the batch (2 sequences at the post's settings), and keeps only a quarter of each layer's
        weights. Before a layer runs, the four
        quarters are all-gathered into the whole layer; right after, the whole copy is dropped.""",
    Z3_PHASES[1]: """
        Backward needs the weights again, so each layer is gathered a second time. Its gradients are then
        reduce-scattered: averaged over the GPUs, each GPU receiving only the quarter it owns, and at the
        step Adam updates that quarter in place. Two all-gathers and one reduce-scatter per layer, each the size
        of the layer: what moves is weights, so the bytes follow the parameter count and ignore the batch.

        The checks run three more sizes and rebuild the post's table from the traces: PP's bytes double with
        the batch and with the width (the activations), and stay put when layers are added; ZeRO-3's stay
        put with the batch and follow the parameter count (nearly x4 for twice the width, as weights grow
        with h^2, and x2 for twice the depth). PP pays a bubble of (p-1)/(m+p-1), 3/7 at the post's 4
        micro-batches; ZeRO-3 has none, since no GPU waits
        for another's compute. Both runs equal one device's step to 1e-12.""",
}

LESSON = Lesson(
    no_picture="its comparison is a table of bytes as the batch and the model grow; the app's timeline shows both runs",
    name="pp-vs-zero3", title="PP vs ZeRO-3: activations point-to-point, or weights in collectives",
                section="Pipeline parallelism: isn't this the same as ZeRO-3?",
                order=160,
                world=4, worlds=(4,), program=program, narrative=NARRATIVE, checks=checks,
                summary="the same model on 4 GPUs both ways: bytes vs batch and model size, the bubble, "
                        "the post's table from the runs", keep_values=0, study=study, tables=tables,
                knobs={"m": Knob(POST.microbatches, choices=(2, 4, 8),
                                 limits="micro-batches of 2 sequences, which ZeRO-3 spreads evenly over the 4 GPUs; "
                                        "the sizes its tables compare")})

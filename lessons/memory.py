"""Memory per GPU: where the bytes go, from the estimator, checked against what the engine measures.

The estimator gives the 27B model's model state under each ZeRO stage and the activations of one layer
at the worked example's length. Beside those figures the ranks run a small layer and a small ZeRO step:
the bytes the layer keeps for backward and the bytes ZeRO moves are measured and set next to what the
same formulas predict for that small shape.
"""
from __future__ import annotations

from parasim.dp.flat import FlatBuffer
from parasim.estimate import Plan, breakdown, get_model
from parasim.estimate.memory import layer_saved_bytes
from parasim.figures import sent_in_phase, sp_traffic_table
from parasim.estimate.traffic import dp_traffic, layer_traffic, step_flops
from parasim.lesson import Check, NOT_IN_POST, Knob, Lesson, Table, check, knob
from parasim.nn import Saved, ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec

DP = 8  # the data-parallel group of the post's ZeRO table (--dp)
SEQ = 4096  # the worked example: one sequence of this many tokens
S, B, H, HEADS = 16, 1, 16, 8  # the small layer the ranks run
RUNS = (("TP alone, scores kept", False, False), ("TP + SP, FlashAttention", True, True))


def zero_table(dp: int = DP) -> dict:
    """The 27B model's state per GPU over `dp` DP ranks, for each ZeRO stage, from the estimator."""
    model = get_model("27b")
    out = {}
    for z in range(4):
        bd = breakdown(model, Plan(dp=dp, zero=z), SEQ)
        out[f"ZeRO-{z}"] = {"bytes_per_param": bd.model_state / model.total_params(), "gb": bd.model_state / 1e9}
    return out


SHARDED = ("nothing (plain DP)", "optimizer states", "+ gradients", "+ weights")  # what each stage adds


def zero_stages_table(result) -> Table:
    """The post's ZeRO table, from the estimator: what each stage shards, bytes per parameter, GB per GPU."""
    dp = knob(result, "dp", DP)
    rows = [(name, [SHARDED[z], round(row["bytes_per_param"], 4), round(row["gb"], 2)])
            for z, (name, row) in enumerate(result.values[0]["zero_table"].items())]
    return Table(f"The 27B model's weights, gradients and Adam state per GPU over {dp} DP ranks (the estimator)",
                 ["stage", "what is sharded", "bytes per parameter", "GB per GPU"], rows,
                 notes=["bytes per parameter: 2 (bf16 weight) + 2 (bf16 gradient) + 12 (fp32 master copy and two "
                        f"Adam moments), each part divided by {dp} from the stage that shards it on; GB = 1e9 bytes."])


def worked_example() -> dict:
    """One 27B layer at the worked example's length, one GPU, no parallelism."""
    model = get_model("27b")
    kw = dict(h=model.hidden, heads=model.heads, kv=model.kv, ffn=model.ffn_size, seq=SEQ, batch=1, tp=1, sp=False)
    flash = layer_saved_bytes(**kw, flash=True)
    naive = layer_saved_bytes(**kw, flash=False)
    sbh = SEQ * model.hidden
    return {"sbh": sbh, "linear_gb": flash / 1e9, "scores_gb": (naive - flash) / 1e9,
            "scores_per_sbh": (naive - flash) / sbh, "all_layers_naive_gb": naive * model.layers / 1e9,
            "all_layers_flash_gb": flash * model.layers / 1e9, "recompute": recompute_example()}


def recompute_example() -> dict:
    """Full activation recomputation against none for the 27B model on one sequence of SEQ tokens, b = 1, one
    GPU, FlashAttention: the bytes kept (a layer, all layers, the working set of the layers redone) and the
    step's FLOPs, from the estimator; with the config's sizes and the parameter count 12*L*h^2."""
    model = get_model("27b")
    L, h = model.layers, model.hidden
    out: dict = {"layers": L, "hidden": h, "heads": model.heads, "sbh": SEQ * 1 * h,
                 "twelve_l_h2": 12 * L * h * h, "stated_params": model.total_params()}
    counted = model.counted()  # the estimator's count, weight matrix by matrix
    out["matrices"] = counted["attention"] + counted["dense mlp"]
    out["embeddings"] = counted["embeddings"]
    for rc in ("none", "full"):
        plan = Plan(dp=1, recompute=rc)
        items = breakdown(model, plan, SEQ).items
        out[rc] = {"kept_all": items["activations"], "kept_layer": items["activations"] / L,
                   "working_set": items["recompute working set"], "flops": step_flops(model, plan, SEQ)["total"]}
    return out


def recompute_table(result) -> Table:
    """What full recomputation keeps and costs for the 27B model on the worked example's sequence: the
    estimator's figures beside those without it."""
    r = result.values[0]["example"]["recompute"]
    sbh, L = r["sbh"], r["layers"]
    none, full = r["none"], r["full"]
    rows = [("kept a layer, in sbh", [round(none["kept_layer"] / sbh, 3), round(full["kept_layer"] / sbh, 3)]),
            ("kept a layer (GB)", [round(none["kept_layer"] / 1e9, 4), round(full["kept_layer"] / 1e9, 4)]),
            (f"kept, all {L} layers (GB)", [round(none["kept_all"] / 1e9, 2), round(full["kept_all"] / 1e9, 2)]),
            ("working set of layers redone (GB)", [round(none["working_set"] / 1e9, 2),
                                                   round(full["working_set"] / 1e9, 2)]),
            ("FLOPs, forward + backward (TFLOP)", [round(none["flops"] / 1e12, 1), round(full["flops"] / 1e12, 1)])]
    extra = full["flops"] / none["flops"] - 1
    return Table(
        f"Full activation recomputation: the 27B model on one {SEQ:,}-token sequence, b = 1, FlashAttention "
        "(the estimator)",
        ["figure", "no recomputation", "full recomputation"], rows,
        notes=[f"the 27B config: L = {L} layers, h = {r['hidden']}, a = {r['heads']} heads, so 12 x L x h^2 = "
               f"{r['twelve_l_h2'] / 1e9:.2f} B parameters (the estimator counts {r['matrices'] / 1e9:.2f} B in the "
               f"layers' weight matrices, 4h^2 for attention and 8h^2 for the MLP in each layer, plus "
               f"{r['embeddings'] / 1e9:.2f} B of embeddings; the preset states {r['stated_params'] / 1e9:g} B "
               f"in all); sbh = s x b x h = {SEQ} x 1 x {r['hidden']} = {sbh:,}.",
               "With full recomputation a layer keeps only its input, s x b x h values of 2 bytes each "
               f"({full['kept_layer'] / sbh:g} sbh), and runs its forward a second time when backward reaches it; "
               f"while that happens {full['working_set'] / none['kept_layer']:g} layers hold their usual "
               f"{none['kept_layer'] / sbh:g} sbh. Backward does about twice the forward's FLOPs, so a step is "
               "three forwards' worth; the repeated forward makes it four: "
               f"{extra:.1%} more compute, the estimator's FLOPs with attention's included."])


def program(ctx):
    t = ctx.world
    group = ctx.new_group(range(t), "tp")
    dp_group = ctx.new_group(range(t), "dp")
    out = {}

    ctx.phase("model state under ZeRO")
    dp = ctx.knobs.get("dp", DP)
    table = zero_table(dp)
    if ctx.rank == 0:
        for name, row in table.items():
            ctx.note(f"27B over {dp} DP ranks, {name}: {row['bytes_per_param']:g} bytes per parameter "
                     f"= {row['gb']:g} GB per GPU", run=True)
    out["zero_table"] = table
    # the same ZeRO step on a small layer's gradients, over this world as the DP group
    shape = ModelSpec(hidden=H, heads=HEADS, dropout=0.1)
    grads = {k: w for k, w in layer_weights(ctx, shape, "grads").items() if w is not None}
    buf = FlatBuffer(grads, t)  # ZeRO's own flat buffer: padded to equal shards over the t ranks
    flat = buf.flat(ctx.xp, grads)
    n = buf.padded
    estimate = {z: sum(dp_traffic(n, t, z, itemsize=8).values()) for z in (1, 3)}
    shard = n // t
    for z in (1, 3):
        if z == 3:  # weights live sharded: gathered for forward, freed, gathered again for backward
            mine = flat[ctx.rank * shard:(ctx.rank + 1) * shard]
            for why in ("for forward", "again for backward"):
                ctx.comm.all_gather(mine, group=dp_group, label=f"ZeRO-3: all-gather the weights {why}")
        # backward has made the whole gradient; each rank keeps the sum of its shard
        mine = ctx.comm.reduce_scatter(flat, group=dp_group, label=f"ZeRO-{z}: reduce-scatter the gradients")
        if z == 1:  # each rank steps its shard, then everyone gets the updated weights back
            ctx.comm.all_gather(mine, group=dp_group, label="ZeRO-1: all-gather the updated weights")
        if ctx.rank == 0:
            ctx.note(f"ZeRO-{z} on a small layer's {n} gradients, the run's {t} ranks as one DP group: each rank "
                     f"keeps {int(mine.shape[0])} of them and should send {estimate[z]:,.0f} B", run=True)
    out["zero_small"] = {"params": n, "estimate": estimate}

    ctx.phase("activations: the worked example")
    ex = worked_example()
    out["example"] = ex
    if ctx.rank == 0:
        ctx.note(f"one layer, s = {SEQ}: {ex['linear_gb']:.3g} GB outside attention's scores, "
                 f"{ex['scores_gb']:.3g} GB of scores ({ex['scores_per_sbh']:g} sbh)", run=True)
        ctx.note(f"all layers: {ex['all_layers_naive_gb']:.0f} GB keeping the scores, "
                 f"{ex['all_layers_flash_gb']:.0f} GB with FlashAttention", run=True)

    for phase, sp, flash in RUNS:
        ctx.phase(f"measured: {phase}")
        tp = ParallelContext(ctx, group, sp=sp)
        small = ModelSpec(hidden=H, heads=HEADS, dropout=0.1, flash=flash)
        layer = TransformerLayer(tp, small, layer_weights(ctx, small, "layer"), key="layer")
        x, dy = ctx.shared_rng("x").normal((S, B, H)), ctx.shared_rng("dy").normal((S, B, H))
        if sp:
            x, dy = tp.shard(x, 0), tp.shard(dy, 0)
        saved = Saved()
        _, cache = layer.forward(x, saved)
        layer.backward(cache, dy)
        est = layer_saved_bytes(H, HEADS, HEADS, 4 * H, S, B, t, sp, flash=flash)
        est_sent = sum(layer_traffic(H, HEADS, S * B, t, sp, 1, itemsize=8).values())
        ctx.note(f"kept {saved.bytes():,} B for backward; the estimator says {est:,.0f} B "
                 f"(and {est_sent:,.0f} B sent per rank)")
        out[phase] = {"saved": saved.bytes(), "estimate": est, "estimate_sent": est_sent}
    return out


def _kept_items(t: int, sp: bool) -> list[tuple[str, float]]:
    """What the small layer keeps for backward on TP rank 0 of `t` (FlashAttention, dropout masks), item by
    item, in bytes a token per unit of h at the post's 2 bytes a value (a mask's 1): its own count, run."""
    import parasim

    def one(ctx):
        group = ctx.new_group(range(t), "tp") if t > 1 else None
        par = ParallelContext(ctx, group, sp=sp)
        small = ModelSpec(hidden=H, heads=HEADS, dropout=0.1, flash=True)
        layer = TransformerLayer(par, small, layer_weights(ctx, small, "layer"), key="layer")
        x = ctx.shared_rng("x").normal((S, B, H))
        saved = Saved()
        layer.forward(par.shard(x, 0) if sp else x, saved)
        return [(f"{module.removeprefix('layer.')}: {name}", n * size) for module, name, n, size in saved.items]

    return [(name, nbytes / (S * B * H)) for name, nbytes in parasim.run(one, t).values[0]]


def kept_table(result) -> Table:
    """The 34 of 34 sbh, item by item, at t = 1, under TP alone and with SP: each run, counted by the layer."""
    t = result.world
    whole, alone, split = _kept_items(1, False), _kept_items(t, False), _kept_items(t, True)
    rows = [(name, [round(a, 3), round(b, 3), round(c, 3)]) for (name, a), (_, b), (_, c) in zip(whole, alone, split)]
    rows.append(("all of it", [round(sum(v for _, v in x), 3) for x in (whole, alone, split)]))
    total = sum(v for _, v in whole)
    block = lambda prefix: sum(v for name, v in whole if name.startswith(prefix))  # noqa: E731
    return Table(
        f"What one layer keeps for backward, item by item: bytes a token per unit of h (s b h in all), "
        f"FlashAttention, the small layer run at t = 1 and on this run's {t} TP ranks",
        ["kept", "one GPU", f"TP {t}", f"TP {t} + SP"], rows,
        notes=[f"one GPU: {total:g}, the post's number: attention {block('attn'):g} (its input, Q, K, V, the output "
               f"projection's input, 2 each, and the dropout mask, 1), the two norms' inputs {block('ln'):g}, the MLP "
               f"{block('mlp'):g} (its input 2, the 4h-wide activation's input and output 8 each, the dropout mask "
               f"1). TP {t} alone splits what "
               f"lies between the matrix products of a block (Q, K, V, the projections' inputs, the MLP's 4h): "
               f"10 + 24/t = {10 + 24 / t:g}; SP splits the rest too: 34/t = {34 / t:g}."])


def checks(result) -> list[Check]:
    t, v, dp = result.world, result.values, knob(result, "dp", DP)
    zt = v[0]["zero_table"]
    out = [check(f"{name}: bytes per parameter", zt[name]["bytes_per_param"], expected)
           for name, expected in (("ZeRO-0", 16), ("ZeRO-1", 4 + 12 / dp), ("ZeRO-2", 2 + 14 / dp),
                                  ("ZeRO-3", 16 / dp))]
    ex = v[0]["example"]
    out.append(check("scores per layer = 5as/h sbh", ex["scores_per_sbh"], 5 * 48 * SEQ / 6144))
    out.append(check("outside the scores, one layer keeps 34 sbh", ex["linear_gb"] * 1e9, 34 * ex["sbh"]))
    rc = ex["recompute"]
    out.append(check("12 L h^2 = the layers' weight matrices as the estimator counts them", rc["matrices"],
                     rc["twelve_l_h2"], rtol=1e-12))
    out.append(check("full recomputation: a layer keeps its 16-bit input alone, 2 sbh",
                     rc["full"]["kept_layer"], 2 * ex["sbh"], rtol=1e-12))
    out.append(check("full recomputation: one forward more on top of forward + backward (3 forwards): 4/3",
                     rc["full"]["flops"] / rc["none"]["flops"], 4 / 3, rtol=1e-12))
    for phase, _, _ in RUNS:
        out.append(check(f"{phase}: kept bytes, measured = estimate", sorted({x[phase]['saved'] for x in v}),
                         [v[0][phase]["estimate"]]))
    moved = {z: sent_in_phase(result, None, lambda e, z=z: (e.label or "").startswith(f"ZeRO-{z}")) for z in (1, 3)}
    for z in (1, 3):
        out.append(check(f"ZeRO-{z} on the small layer: bytes sent, measured = estimate", moved[z],
                         v[0]["zero_small"]["estimate"][z], rtol=1e-12))
    if t > 1:
        est = v[0]["zero_small"]["estimate"]
        out.append(check("ZeRO-3 / ZeRO-1 bytes: a third pass over two (measured)", moved[3] / moved[1],
                         est[3] / est[1], rtol=1e-12))
        for phase, _, _ in RUNS:
            out.append(check(f"{phase}: bytes sent per rank, measured = estimate",
                             sent_in_phase(result, f"measured: {phase}"),
                             v[0][phase]["estimate_sent"], rtol=1e-12))
    return out


def figures(result) -> dict:
    """What `parasim compare memory --dp 4,8,64` sets side by side: the 27B model's state per GPU under each
    ZeRO stage, from the estimator at the run's DP size."""
    return {f"27B model state per GPU, {name} (GB)": round(row["gb"], 2)
            for name, row in result.values[0]["zero_table"].items()}


NARRATIVE = {
    "model state under ZeRO": """
        Mixed-precision Adam keeps, for every parameter, a 16-bit weight and gradient plus a 32-bit master
        copy and two moments. ZeRO cuts the data-parallel redundancy in steps: stage 1 shards the optimizer
        states over the DP ranks, stage 2 the gradients too, stage 3 the weights as well. The notes give
        the estimator's figures for the 27B model over a DP group of --dp GPUs (the post's: 8); then the
        ranks run one ZeRO step on a small layer's gradients, the lesson's own ranks as the DP group.
        Stages 1 and 2 move what a plain all-reduce moves (a reduce-scatter and an all-gather); stage 3
        gathers the weights a second time for backward.""",
    "activations: the worked example": """
        What one layer keeps for backward, in Korthikanti et al.'s count: 16-bit values and 1-byte
        dropout masks. Outside attention that is a fixed number of bytes per token; the softmax scores grow
        with the square of the length, which is why FlashAttention, which recomputes them, matters.""",
    "measured: TP alone, scores kept": """
        The small layer split over TP, keeping the scores: what it kept is counted by the layer itself, and
        set beside the estimator's formula for the same shape.""",
    "measured: TP + SP, FlashAttention": """
        With SP and FlashAttention everything kept is split t ways. The count the engine measured and the
        estimator's agree to the byte, as they must for the big figures above to be trusted. SP sends a
        little more than TP alone (a second gather of the saved slices in backward, the norms' gradient
        sums): the table at the end counts each.""",
}

LESSON = Lesson(
    no_picture="its figures are the estimator's table beside one measured layer; parasim memory --plot FILE.png draws a job's memory, stage by stage of ZeRO",
    name="memory",
    section="Data parallelism and ZeRO: what about activations?",
    order=40,
    title="Memory per GPU: ZeRO's model state and a layer's activations, estimated and measured",
    world=4,
    worlds=(2, 4, 8),
    # the small layer's TP size (the ranks), and the DP group the 27B model's ZeRO table is spread over
    knobs={"tp": Knob(4, choices=(2, 4, 8), world=True, post=NOT_IN_POST,
                    limits="the small layer's heads split evenly over the ranks",
                    why="it is the number of ranks, which run the small layer and its ZeRO step; --dp sizes "
                        "only the 27B figures"),
           "dp": Knob(DP)},
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    figures=figures,
    summary="the 27B model's ZeRO table and activation example from the estimator, checked on a small layer",
    tables=lambda result: [zero_stages_table(result), recompute_table(result), kept_table(result),
                           sp_traffic_table(result, "measured: TP alone, scores kept", "measured: TP + SP, FlashAttention")],
    keep_values=0,
)

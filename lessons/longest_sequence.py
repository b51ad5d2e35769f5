"""The longest sequence the 27B model trains on, one node or two: the estimator's table, and what each
technique buys, with the per-layer bytes behind it measured on a small layer first.

A small layer runs three ways on the ranks (TP alone, TP + SP, TP + SP with full recomputation) and each
run's kept bytes and traffic are set beside the estimator's. Then the estimator solves the longest
sequence for each of the post's nine layouts.
"""
from __future__ import annotations

from dataclasses import replace

from parasim.estimate import Plan, breakdown, fit, get_model
from parasim.estimate.fit import LONGEST_ROWS
from parasim.figures import sent_in_phase, sp_traffic_table
from parasim.estimate.memory import layer_saved_bytes
from parasim.estimate.traffic import attention_flops, gpu_presets, layer_traffic
from parasim.lesson import Check, Knob, Lesson, Table, check
from parasim.nn import Saved, ParallelContext
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.layout import ModelSpec

S, B, H, HEADS = 16, 1, 16, 8
UTILISATION = 0.4
ROWS = LONGEST_ROWS  # the post's nine layouts: (nodes, label, plan)
RUNS = (("TP alone", False, False), ("TP + SP", True, False), ("TP + SP + full recompute", True, True))


def table() -> dict:
    """Every row from the estimator, and the side figures of the recompute row."""
    model, usable = get_model("27b"), gpu_presets()["h200"].usable
    rows = []
    for nodes, label, kw in ROWS:
        f = fit(model, Plan(**kw), usable)
        rows.append({"nodes": nodes, "label": label, "state_gb": f.at_max.model_state / 1e9, "seq": f.seq,
                     "world": f.plan.world, "tp": f.plan.tp, "pp": f.plan.pp, "m": f.plan.m,
                     "stage_layers": model.layers // f.plan.pp,
                     "act_per_token": f.at_max.items["activations"] / f.seq,
                     "held_per_token": (f.at_max.items["activations"]
                                        + f.at_max.items["in-flight micro-batches"]) / f.seq})
    rec = fit(model, Plan(tp=8, sp=True, recompute="full"), usable)
    chunked = fit(model, Plan(tp=8, sp=True, recompute="full", chunked_loss=True), usable)
    flops = attention_flops(model, rec.seq, "full")
    h200 = gpu_presets()["h200"]
    side = {"logits_gb": rec.at_max.items["logits"] / 1e9, "chunked_seq": chunked.seq, "attention_flops": flops,
            "minutes": flops / (8 * h200.peak_flops * UTILISATION) / 60, "params": model.total_params()}
    return {"rows": rows, "side": side}


def program(ctx):
    t = ctx.world
    group = ctx.new_group(range(t), "tp")
    out = {}
    for phase, sp, recompute in RUNS:
        ctx.phase(phase)
        tp = ParallelContext(ctx, group, sp=sp)
        shape = ModelSpec(hidden=H, heads=HEADS, dropout=0.1, flash=True)
        layer = TransformerLayer(tp, shape, layer_weights(ctx, shape, "layer"), key="layer")
        x, dy = ctx.shared_rng("x").normal((S, B, H)), ctx.shared_rng("dy").normal((S, B, H))
        if sp:
            x, dy = tp.shard(x, 0), tp.shard(dy, 0)
        kept = Saved()
        if recompute:
            kept.keep("layer", "input", x)  # all that stays between forward and backward
            layer.forward(x, Saved())  # forward, keeping nothing else
            ctx.compute("recompute the layer's forward")
            work = Saved()  # the working set: the same forward run again just before backward
            _, cache = layer.forward(x, work)
            layer.backward(cache, dy)
        else:
            work = kept
            _, cache = layer.forward(x, kept)
            layer.backward(cache, dy)
        ctx.note(f"kept {kept.bytes():,} B between forward and backward"
                 + (f", and {work.bytes():,} B while recomputing" if recompute else ""))
        out[phase] = {"kept": kept.bytes(), "work": work.bytes()}
    ctx.phase("the table")
    tab = table()
    if ctx.rank == 0:  # the nine rows are the table at the end; here what the table does not show
        sd = tab["side"]
        ctx.note(f"at the recompute row's length the logits take {sd['logits_gb']:.1f} GB; a chunked loss "
                 f"drops them and reaches {sd['chunked_seq']:,} tokens", run=True)
        ctx.note(f"attention there: {sd['attention_flops']:.3g} FLOPs per sequence, {sd['minutes']:.2f} minutes "
                 f"on 8 H200s at {UTILISATION:.0%} of peak", run=True)
    out["table"] = tab
    return out


def small_estimates(t: int) -> dict:
    """The estimator's bytes for the small layer on t ranks, for each run."""
    model = ModelSpec("small layer", layers=1, hidden=H, heads=HEADS, vocab=8)
    out = {}
    for phase, sp, recompute in RUNS:
        plan = Plan(tp=t, sp=sp, zero=0, recompute="full" if recompute else "none")
        bd = breakdown(model, plan, S)
        work = bd.items["recompute working set"] / plan.working_layers if recompute else bd.items["activations"]
        out[phase] = {"kept": bd.items["activations"], "work": work,
                      "sent": sum(layer_traffic(H, HEADS, S * B, t, sp, 1, itemsize=8, recompute=recompute).values())}
    out["flash"] = layer_saved_bytes(H, HEADS, HEADS, 4 * H, S, B, t, True)
    return out


def phase_flops(result, rank: int = 0) -> dict[str, int]:
    """The FLOPs `rank` computed in each phase, as its meter counted them: the work before each of its events,
    and the work after its last event in a phase."""
    out: dict[str, int] = {}
    for e in result.trace.events:
        for m in e.members:
            if m.rank == rank and m.work:
                out[e.phase] = out.get(e.phase, 0) + sum(m.work.values())
    for mk in result.trace.marks:
        if mk.rank == rank and mk.kind == "work":
            out[mk.text] = out.get(mk.text, 0) + sum(mk.data.values())
    return out


def recompute_table(result) -> list[Table]:
    """What full recomputation costs in compute: each run's FLOPs on GPU 0, against TP + SP's; none where the
    ranks counted no FLOPs (real ranks time their work, they do not meter it)."""
    f = phase_flops(result)
    if not all(f.get(p) for p, _, _ in RUNS):
        return []
    base = f[RUNS[1][0]]
    return [Table("What each run computed on GPU 0 (its layer forward and backward; FLOPs as the run counted them)",
                 ["run", "FLOPs", "x TP + SP"], [(p, [f[p], round(f[p] / base, 3)]) for p, _, _ in RUNS],
                 notes=["full recomputation runs the layer's forward twice, once to get through it and once again "
                        f"just before its backward: {f[RUNS[2][0]] / base - 1:.0%} more compute here, about a third "
                        "(a backward costs about two forwards), bought with the memory each run's lines above say it kept "
                        "between forward and backward."])]


def tables(result) -> list[Table]:
    v = result.values[0]["table"]
    row = {r["label"]: r for r in v["rows"]}
    tp8, sp = row["TP8"], row["TP8 + SP"]
    rec, cp = row["TP8 + SP + full recompute"], row["TP4 + SP + CP2"]
    pp4, pp2 = row["TP2 + SP + PP4"], row["TP8 + SP + PP2"]
    longest = Table("The longest sequence of the 27B model, by layout (the estimator, 120 GB usable per GPU)",
                    ["layout", "nodes", "GPUs", "model state GB", "longest (tokens)", "x TP8", "x TP8 + SP"],
                    [(r["label"], [r["nodes"], r["world"], round(r["state_gb"], 2), r["seq"],
                                   round(r["seq"] / tp8["seq"], 1), round(r["seq"] / sp["seq"], 1)])
                     for r in v["rows"]],
                    notes=[f"x TP8, x TP8 + SP: the length over each one-node baseline's. Full recomputation "
                           f"is added to TP8 + SP, so its gain is {rec['seq'] / sp['seq']:.1f}x ({rec['seq']:,} "
                           f"over {sp['seq']:,} tokens), the post's 'about 8x'; over TP8 alone it is "
                           f"{rec['seq'] / tp8['seq']:.1f}x, SP's own {sp['seq'] / tp8['seq']:.1f}x included.",
                           f"activations kept per token of the sequence, per GPU: TP4 + SP + CP2 "
                           f"{cp['act_per_token'] / 1e6:.2f} MB, TP8 + SP {sp['act_per_token'] / 1e6:.2f} MB (CP2 "
                           f"halves the tokens a GPU holds where TP4 doubles its share of each): the same. TP4 keeps "
                           f"twice the weights, so {cp['state_gb']:g} GB of model state against "
                           f"{sp['state_gb']:g}, and the shorter length.",
                           f"why PP buys no length: under 1F1B stage 1 of TP2 + SP + PP4 holds {pp4['m']} "
                           f"micro-batches at once, each with its own {pp4['stage_layers']} layers' activations: "
                           f"{pp4['m']} x {pp4['stage_layers']} = {pp4['m'] * pp4['stage_layers']} layers' worth, "
                           f"what TP8 + SP keeps for its whole model, but at TP 2's share (34 sbh/2, not /8). Per "
                           f"token of the sequence it holds {pp4['held_per_token'] / 1e6:.2f} MB against "
                           f"{sp['held_per_token'] / 1e6:.2f} MB ({pp4['held_per_token'] / sp['held_per_token']:.1f}x), "
                           f"for the same {pp4['state_gb']:g} GB of model state (PP 4 cuts the weights as TP 8 "
                           f"does): {pp4['seq']:,} tokens against {sp['seq']:,}. Over two nodes TP8 + SP + PP2's "
                           f"stage 1 holds {pp2['m']} x {pp2['stage_layers']} = {pp2['m'] * pp2['stage_layers']} "
                           f"layers at TP 8's share, {pp2['held_per_token'] / 1e6:.2f} MB a token as TP8 + SP: "
                           f"its {pp2['seq']:,} tokens come from the weights PP 2 halves, not from the "
                           "activations."])
    traffic = sp_traffic_table(result, "TP alone", "TP + SP")
    traffic = replace(traffic, notes=[*traffic.notes,
                                      "why here: the table above shows the length SP buys for free in memory; "
                                      "this is what it spends on the wire, counted on the small layer "
                                      "run first."])
    return [longest, traffic, *recompute_table(result)]


def checks(result) -> list[Check]:
    t, v = result.world, result.values
    est = small_estimates(t)
    out = []
    for phase, _, _ in RUNS:
        out.append(check(f"{phase}: kept bytes, measured = estimate", sorted({x[phase]["kept"] for x in v}),
                         [est[phase]["kept"]]))
        out.append(check(f"{phase}: bytes sent by rank 0, measured = estimate", sent_in_phase(result, phase),
                         est[phase]["sent"], rtol=1e-12))
    out.append(check("recomputation's working set is one whole layer (measured = estimate)",
                     sorted({x["TP + SP + full recompute"]["work"] for x in v}), [est["flash"]]))
    rows = v[0]["table"]["rows"]
    seq = {r["label"]: r["seq"] for r in rows}
    act = {r["label"]: r["act_per_token"] for r in rows}
    held = {r["label"]: r["held_per_token"] for r in rows}
    layers, h = get_model("27b").layers, get_model("27b").hidden
    p = v[0]["table"]["side"]["params"]
    for r in rows:
        out.append(check(f"{r['label']}: model state = 4P/(TP*PP) + 12P/GPUs", r["state_gb"],
                         (4 * p / (r["tp"] * r["pp"]) + 12 * p / r["world"]) / 1e9, rtol=1e-12))
    one = [r["seq"] for r in rows if r["nodes"] == 1]
    out += [
        check("SP buys length for free: TP8 + SP beats TP8", seq["TP8 + SP"] > seq["TP8"], True),
        check("PP buys none: TP2 + SP + PP4 is the shortest row", seq["TP2 + SP + PP4"] == min(seq.values()), True),
        check("... because 1F1B keeps p micro-batches in flight on the first stage, each of L/p layers: all L at TP 2's share, per token "
              "L x 34 h / 2 bytes, by hand (TP8 + SP + PP2: L x 34 h / 8, as TP8 + SP)",
              [held["TP2 + SP + PP4"], held["TP8 + SP + PP2"], held["TP8 + SP"]],
              [layers * 34 * h / 2, layers * 34 * h / 8, layers * 34 * h / 8], rtol=1e-9),
        check("recomputation is the longest one-node row", seq["TP8 + SP + full recompute"] == max(one), True),
        check("across two nodes CP2 reaches twice what DP2 does", seq["TP8 + SP + CP2"] / seq["TP8 + SP, DP2"], 2.0,
              rtol=1e-4),
        check("TP4 + SP + CP2 keeps the activations per token that TP8 + SP keeps (34/4 x 1/2 = 34/8 sbh a layer)",
              act["TP4 + SP + CP2"], act["TP8 + SP"], rtol=1e-12),
    ]
    return out


NARRATIVE = {
    "TP alone": """
        How long a sequence fits is set by the bytes kept per token. With TP alone the norms, dropouts and
        residual inputs are whole on every rank: that share of the layer never shrinks as t grows.""",
    "TP + SP": """
        SP splits that share too: now everything a layer keeps is divided by t. The all-gathers and
        reduce-scatters that take the all-reduces' place move the same bytes, but SP sends a little more in
        all: backward gathers its saved slices again, and the norms' gradients are summed over the ranks
        (the table at the end counts each). The measured count equals the estimator's formula for this
        small layer.""",
    "TP + SP + full recompute": """
        Full recomputation keeps only each layer's input and runs the forward again just before backward,
        so the forward's collectives happen twice (the trace shows them) and a whole layer's activations
        exist only while that layer is being recomputed: the working set.""",
    "the table": """
        The estimator, with those per-layer bytes, solves the longest sequence for each layout: 120 GB
        usable per GPU, FlashAttention, one sequence per micro-batch, fp32 logits split by TP on the last
        stage, the optimizer spread over every GPU. The table at the end gives each layout's length, over
        TP8 alone and over TP8 + SP; the two notes below say what the recompute row's length costs.""",
}

LESSON = Lesson(
    no_picture="its answer is the post's table; parasim fit --search --plot FILE.png draws the longest sequence against nodes for every layout",
    name="longest-sequence",
    section="Putting it together: the longest sequence that fits",
    order=210,
    title="The longest sequence: what SP, CP, PP, DP and recomputation each buy",
    world=4,
    worlds=(2, 4, 8),
    knobs={"tp": Knob(4, choices=(2, 4, 8), world=True, post=8,  # the small layer's TP size
                    limits="the small layer's heads split evenly over the TP ranks",
                    why="it sizes only the small layer run first; the table's layouts are the post's whatever it is")},
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="the nine-layout table for the 27B model from the estimator, its per-layer bytes measured first",
    tables=tables,
    keep_values=0,
)

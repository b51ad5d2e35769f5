"""Fitting is not fast: the longest sequence the 27B model takes on one node of 8 H200s (TP 8, SP, full
recomputation: the longest-sequence table's row of about 310K tokens), and how long one step on it lasts.

One layer runs at that length on symbolic ranks (shapes only, at real size), forward, its recomputed
forward and backward; the clock times it on H200s. Its products are counted as the run makes them; the
post counts attention's alone, with a causal mask halving it, at 40% of the peak. Both answers are shown,
and why they differ.
"""
from __future__ import annotations

from dataclasses import replace

from parasim.clock.costs import machine
from parasim.clock.plan import layer_forward, plan_time
from parasim.clock.timeline import simulate
from parasim.estimate import Plan, fit, get_model, gpu_presets
from parasim.estimate.hardware import GPUS
from parasim.estimate.kernels import attention_efficiency
from parasim.train.against import granule
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights

ROW = dict(tp=8, sp=True, recompute="full")  # the longest-sequence table's "TP8 + SP + full recompute"
PLAN = Plan(**ROW)
BASE = get_model("27b")
GPU, WORLD = "h200", 8
PHASE = "one layer at the longest sequence: forward, recomputed forward, backward"


def longest() -> int:
    """The estimator's longest sequence for the row on an H200 (120 GB usable), cut to a length the split
    takes: what the longest-sequence lesson shows."""
    g = granule(PLAN)
    return int(fit(BASE, PLAN, gpu_presets()[GPU].usable).seq) // g * g


SEQ = longest()
MODEL = replace(BASE, seq=SEQ, flash=True, dropout=0.0)


def program(ctx):
    tp = ctx.new_group(range(WORLD), "tp")
    ctx.phase(PHASE, seq=SEQ)
    t = ParallelContext(ctx, tp, sp=True, seq=SEQ)
    layer = TransformerLayer(t, MODEL, layer_weights(ctx, MODEL, "L0"), key="L0")
    x = ctx.shared_rng("x").normal((len(t.token_positions()), 1, MODEL.hidden))
    layer.forward(x, Saved())  # the forward whose activations full recomputation drops
    y, cache = layer.forward(x, Saved())  # the same forward again, just before backward
    layer.backward(cache, y)
    return {"tokens": len(t.token_positions())}


def study(result) -> dict:
    trace = result.trace
    tl = simulate(trace, machine(GPU))
    work = {"matmul": 0, "attention": 0}
    for e in trace.events:
        for m in e.members:
            if m.rank == 0:
                for k, v in (m.work or {}).items():
                    work[k] += v
    for mk in trace.marks:
        if mk.rank == 0 and mk.kind == "work":
            for k, v in mk.data.items():
                work[k] += v
    for k, v in (trace.meta.get("tail_work") or [{}])[0].items():
        work[k] += v
    plan = plan_time(BASE, PLAN, SEQ, GPU)
    attn_flops = layer_forward(BASE, PLAN, SEQ, machine(GPU), False)["attn_flops"]
    share = attention_efficiency(GPU, SEQ, BASE.head_dim, True, None).value  # both passes together
    return {"tl": tl, "work": work, "plan": plan, "plan_attn_flops": attn_flops, "attn_share": share}


def post_flops(seq: int) -> float:
    """The post's count: causal attention 2 s^2 h a layer forward; forward, backward (twice) and the
    recomputed forward: 4 passes; every layer."""
    return 2 * seq * seq * BASE.hidden * 4 * BASE.layers


def tables(result, s) -> list[Table]:
    peak = GPUS[GPU].peak_flops.value
    post = post_flops(SEQ)
    layer = s["tl"].step
    run_attention = s["work"]["attention"] * WORLD * BASE.layers
    # the plan's attention FLOPs: its causal-halved forward, the recomputed forward and a backward of 2.5, every
    # layer, every GPU
    plan_attention = s["plan_attn_flops"] * (1 + 1 + 2.5) * BASE.layers * WORLD
    return [Table(f"One step of one {SEQ:,}-token sequence, {BASE.name} on {WORLD} {GPUS[GPU].name}s (TP 8, SP, full "
                  "recomputation)", ["count", "attention FLOPs (all GPUs)", "how it is timed", "step (s)",
                                     "step (min)"],
                  [("the post's", [f"{post:.3g}", "40% of the peak", round(post / (WORLD * peak * 0.4), 1),
                                   round(post / (WORLD * peak * 0.4) / 60, 2)]),
                   ("the run's, one layer x 60 on the clock", [f"{run_attention:.3g}", "each of the run's "
                                                               "products and collectives at its measured cost",
                                                               round(layer * BASE.layers, 1),
                                                               round(layer * BASE.layers / 60, 2)]),
                   ("the clock's plan of the whole step", [f"{plan_attention:.3g}", "the same costs, attention "
                                                           "causal-halved, its backward 2.5x, and the logits", round(s["plan"]["step_s"], 1),
                                                           round(s["plan"]["step_s"] / 60, 2)])],
                  notes=[f"the post counts 2 s^2 h FLOPs a layer forward for causal attention and a backward of 2 "
                         f"forwards; the run's layers compute the whole s x s scores and mask half (4 s^2 h), and "
                         f"their backward makes the scores again (2.5 forwards): {run_attention / post:.2f}x the post's "
                         "FLOPs. FlashAttention skips the masked blocks, as the plan counts, and its backward is the "
                         "run's. The post's 40% of the peak stands for everything; the clock times attention at the "
                         f"share FlashAttention measures at this length ({s['attn_share']:.0%} both passes) and each "
                         "product at the share a product of its shape measures (parasim hardware), and adds the TP "
                         "collectives.",
                         f"tokens per second per GPU: {SEQ / s['plan']['step_s'] / WORLD:,.0f} at {SEQ:,} tokens; "
                         "the clock's constants: parasim hardware.",
                         f"the run itself is one layer: the clock line below times it ({layer:,.2f} s), and the "
                         f"run's row is that times the model's {BASE.layers} layers ({layer * BASE.layers:,.1f} s, "
                         f"{layer * BASE.layers / 60:,.2f} minutes)"
                         + (": with 60 layers, a layer's seconds and the model's minutes are the same number"
                            if BASE.layers == 60 else "") + "."])]


def checks(result, s) -> list[Check]:
    h, layers, peak = BASE.hidden, BASE.layers, GPUS[GPU].peak_flops.value
    # QK^T and PV over whole scores, heads split over TP; forward, recomputed forward, and a backward of 2.5
    # forwards (its four products, and the scores made again, as FlashAttention does)
    by_hand = 4 * SEQ * SEQ * h / WORLD * (1 + 1 + 2.5)
    passes = s["work"]["attention"]
    return [
        check("the run's attention FLOPs on one GPU for one layer, by hand: 4 s^2 h / 8 (whole scores) x 4.5 "
              "(forward, recomputed forward, and a backward of 2.5 forwards: it makes the scores again)",
              passes, by_hand),
        check("the post's count at this length, 8 s^2 h L, against its 2.9e17 (it used s of about 313K; within 3%)",
              post_flops(SEQ), 2.9e17, rtol=0.03),
        check("the post's time at 40% of the peak of 8 H200s: about 1.5 minutes (within 5%)",
              post_flops(SEQ) / (WORLD * peak * 0.4) / 60, 1.5, rtol=0.05),
        check("the run's attention, timed at the share FlashAttention measures at this length, takes longer than the "
              "post's 40% estimate (twice the FLOPs)", passes * layers / (peak * s["attn_share"])
              > post_flops(SEQ) / (WORLD * peak * 0.4), True),
        check("fitting is not fast: one step of this one sequence takes more than a minute on the clock's plan",
              s["plan"]["step_s"] > 60, True),
    ]


NARRATIVE = {PHASE: f"""
    The 27B model's longest sequence on one node of 8 H200s with TP 8, SP and full recomputation: {SEQ:,}
    tokens. Memory allows it. Time is another matter: attention's work grows with the square of the
    sequence, so one layer's products at this length dwarf everything else, and the step runs every layer
    three times (forward, again just before backward, and backward). The table sets the post's estimate
    beside what the run counted and the clock's times."""}

LESSON = Lesson(
    no_picture='its answer is three ways of timing one step, in one table',
    name="fit-is-not-fast", title="Fitting is not fast: one step at the longest sequence, on the clock",
    section="Putting it together: fitting is not fast (on the clock)",
    order=220,
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic",
    summary="The 27B model at its longest sequence on 8 H200s (about 310K tokens): the post's 2.9e17 attention "
            "FLOPs and 1.5 minutes, the run's count and the clock's step",
)

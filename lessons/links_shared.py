"""TP and EP on the same node's links: attention's TP collectives and the MoE's all-to-alls on the same 8 GPUs,
at real size on symbolic ranks, timed on the clock when they run at the same moment.

Megatron's rank order puts TP innermost and EP next to it, so with TP 8 and EP 8 in a node both use every GPU's
NVLink. When one micro-batch's attention gathers its sequence while another micro-batch's MoE sends its tokens
(DualPipe pairs a forward with a backward this way), the two compete for the same links: the clock gives a GPU
one communication stream, so they take turns, and the pair ends when their bytes together have crossed. On links
of their own the pair would end with the longer of the two.
"""
from __future__ import annotations

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.comm.hops import INSIDE, event_transfers, split_by_link
from parasim.estimate.hardware import GPUS
from parasim.layout import ModelSpec
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.attention import AttentionWeights, HeadCounts, ParallelAttention
from parasim.nn.layer import layer_weights
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing

# DeepSeek-V3's width and MoE layer (256 experts of width 2,048, top 8); its attention as plain multi-head
# attention of that width (parasim has no MLA), 128 heads of 56. One 4,096-token sequence a micro-batch.
S, D, HEADS = 4096, 7168, 128
E, K, F = 256, 8, 2048
WORLD, GPU = 8, "h200"  # one node: TP 8 and EP 8 on the same GPUs
ROUTING = Routing.parse("balanced")
ATTENTION = ModelSpec(hidden=D, heads=HEADS, kv_heads=HEADS)

TP_ALONE, EP_ALONE = "micro-batch 1: attention (TP alone)", "micro-batch 1: MoE (EP alone)"
BOTH = "micro-batch 2's attention beside micro-batch 1's MoE backward (TP and EP at once)"
REST = "micro-batch 2: MoE, then both backward"


def program(ctx):
    group = ctx.new_group(range(WORLD), "tp")
    ep = ctx.new_group(range(WORLD), "ep")  # the same 8 GPUs: Megatron's order, folded
    par = ParallelContext(ctx, group, sp=True, ep_group=ep, options=LayerOptions(routing=ROUTING))
    draw = ctx.shared_rng
    attn = ParallelAttention(par, AttentionWeights.of(layer_weights(ctx, ATTENTION, "attn")), HeadCounts(HEADS, HEADS),
                             key="attn")
    experts = [{"w1": draw(f"moe.{e}.w1").normal((D, F)), "w2": draw(f"moe.{e}.w2").normal((F, D))} for e in range(E)]
    moe = MoE(par, ep, draw("moe.router").normal((D, E)), experts, K, name="moe")
    share = (S // WORLD, 1, D)  # under SP each GPU holds an eighth of the sequence between the blocks
    ctx.phase(TP_ALONE)
    y1, a1 = attn.forward(draw(f"x1.{ctx.rank}").normal(share), Saved())
    ctx.phase(EP_ALONE)
    z1, m1 = moe.forward(y1, Saved())
    ctx.phase(BOTH, pair=1)  # DualPipe's pairing: one chunk's forward beside the other's backward
    y2, a2 = attn.forward(draw(f"x2.{ctx.rank}").normal(share), Saved())
    g1 = moe.backward(m1, z1)
    ctx.phase(REST)
    z2, m2 = moe.forward(y2, Saved())
    attn.backward(a1, g1)
    attn.backward(a2, moe.backward(m2, z2))


def study(result) -> dict:
    """GPU 0 on the clock, DualPipe's pairing on: each phase's compute and communication, and in the paired
    phase each axis's calls: their seconds (each as it would take alone) and the bytes every GPU sent."""
    trace = result.trace
    tl = simulate(trace, machine(GPU, WORLD), ("dualpipe",))
    seconds = {"tp": 0.0, "ep": 0.0}
    sent = {"tp": 0, "ep": 0}
    for e in trace.events:
        if e.phase != BOTH or e.kind == "compute" or e.group is None:
            continue
        if 0 in e.ranks:
            start, end = tl.events[e.seq]
            seconds[e.group.name] += end - start
        sent[e.group.name] += split_by_link(event_transfers(e), WORLD)[INSIDE]
    return {"phases": by_phase(trace, tl, 0), "seconds": seconds, "sent": sent}


def figures(result, s) -> dict:
    both = s["phases"][BOTH]
    tp, ep = s["seconds"]["tp"], s["seconds"]["ep"]
    return {"tp_ms": tp * 1e3, "ep_ms": ep * 1e3, "shared_ms": both["comm"] * 1e3, "own_ms": max(tp, ep) * 1e3,
            "compute_ms": both["compute"] * 1e3, "phase_ms": (both["end"] - both["start"]) * 1e3,
            "tp_gb": s["sent"]["tp"] / 1e9, "ep_gb": s["sent"]["ep"] / 1e9}


def tables(result, s) -> list[Table]:
    f = figures(result, s)
    g = GPUS[GPU]
    r = lambda x: round(x, 2)  # noqa: E731
    return [Table(
        f"TP 8 and EP 8 on the same {WORLD} {g.name}s at the same moment: micro-batch 2's attention (its sequence "
        f"gathered and scattered) beside micro-batch 1's MoE backward (its all-to-alls), GPU 0 on the clock",
        ["what", "NVLink bytes, all GPUs (GB)", "GPU 0 (ms)"],
        [("TP: attention's gathers and scatters, the MoE backward's router sum", [r(f["tp_gb"]), r(f["tp_ms"])]),
         ("EP's all-to-alls", [r(f["ep_gb"]), r(f["ep_ms"])]),
         ("both on the same links (the clock)", [r(f["tp_gb"] + f["ep_gb"]), r(f["shared_ms"])]),
         ("if each had links of its own", ["-", r(f["own_ms"])]),
         ("the compute they run beside", ["-", r(f["compute_ms"])]),
         ("the paired phase, all told", ["-", r(f["phase_ms"])])],
        notes=[f"each GPU's NVLink carries {g.nvlink.value / 1e9:,.0f} GB/s each way (parasim hardware). The clock "
               "gives a GPU one communication stream: two calls at the same moment take turns at its links' full "
               "rate, which ends the pair when sharing the links half and half would (their bytes together over the "
               "rate); only which one finishes first differs. Sharing costs the shorter of the two: "
               f"{f['shared_ms'] - f['own_ms']:.2f} ms here.",
               "with TP and EP in one node no layout gives them links of their own: the 'links of its own' row is "
               "what the competition takes away, not a choice. EP spread over nodes would have the network to "
               "itself, at a fraction of NVLink's rate (lesson rules-of-thumb, EP inside a node). Here the products "
               "beside them take longer still, so most of the sharing hides behind compute: what is left shows as "
               "the paired phase running past its compute."])]


def checks(result, s) -> list[Check]:
    f = figures(result, s)
    b = 2  # BF16 activations and tokens
    # by hand: under SP, a TP all-gather or reduce-scatter of the s x d activation sends 7/8 of it from each GPU;
    # attention forward makes one of each (QKV's gather, the output's scatter)
    tp_bytes = WORLD * 2 * S * D * b * (WORLD - 1) // WORLD
    # ... and the MoE backward's router gradient, a partial sum over the TP group under SP: an all-reduce of the
    # d x E weights, 2 x 7/8 of them from every GPU
    tp_bytes += WORLD * 2 * D * E * b * (WORLD - 1) // WORLD
    # balanced routing: each of a GPU's s/8 tokens picks 8 experts on 8 different GPUs, 7 of them elsewhere; the
    # dispatch sends each copy once with its gates on that GPU (K x 2 bytes), the combine the d values back
    copies = WORLD * (S // WORLD) * K * (WORLD - 1) // WORLD
    ep_bytes = copies * (D * b + (E // WORLD) * b) + copies * D * b
    return [
        check("TP's calls in the paired phase send, all GPUs: an all-gather and a reduce-scatter, each 7/8 of "
              "the s x d activation from every GPU (2 x 8 x 7/8 x s x d x 2 bytes), and the router's gradient "
              "summed over TP (8 x 2 x 7/8 x d x E x 2)", s["sent"]["tp"], tp_bytes),
        check("EP's all-to-alls there (micro-batch 1's MoE backward) send what a forward's dispatch and combine "
              "send: every token copy leaving its GPU, d values and the gates of the experts there, then d back",
              s["sent"]["ep"], ep_bytes),
        check("on the same links the two take the sum of their times (GPU 0's communication stream, ms)",
              round(f["shared_ms"], 9), round(f["tp_ms"] + f["ep_ms"], 9)),
        check("... which is longer than either alone: sharing costs the shorter of the two",
              f["shared_ms"] > f["own_ms"] > 0, True),
    ]


NARRATIVE = {
    TP_ALONE: """
        Megatron numbers GPUs with TP fastest and EP next, so in an 8-GPU node TP 8 and EP 8 land on the same
        GPUs. First, one micro-batch's attention alone: under SP each GPU holds an eighth of the sequence,
        gathers the whole of it for the attention's products and scatters the output back, over NVLink.""",
    EP_ALONE: """
        Then its MoE alone: each GPU routes its own eighth of the tokens and the all-to-alls carry them to
        their experts, on every GPU of the same node, and back. The same links, at another moment.""",
    BOTH: """
        Now the two at once, as DualPipe arranges it: the second micro-batch's attention runs beside the first
        one's MoE backward. The products overlap with the transfers, but both the gather and the all-to-alls
        need each GPU's NVLink: they compete for it. The table at the end sets the time they take together
        beside what each takes alone.""",
    REST: """
        The rest of the step, for completeness: the second micro-batch's MoE, then both attentions' backward.""",
}

LESSON = Lesson(
    name="links-shared",
    section="Where they get in each other's way: TP and EP on the same links (on the clock)",
    order=175,
    title="TP and EP compete for one node's NVLink: the same 8 GPUs, at the same moment, on the clock",
    world=WORLD,
    worlds=(WORLD,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    study=study,
    tables=tables,
    backend="symbolic",
    events_shown=6,
    summary="DeepSeek-V3's width: attention's TP collectives and the MoE's all-to-alls at the same moment on 8 "
            "H200s, their time together against each alone",
    no_picture="its figure is one row of times; the app's time view (key u) draws the two axes' calls taking "
               "turns on each GPU",
)

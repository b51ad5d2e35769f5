"""TP inside a node against TP over two nodes: the same transformer layer, forward and backward, at real
size on symbolic ranks, timed on the clock (an H200 node of 8 GPUs, the hardware table's constants).

TP 8 keeps every ring inside one node, on NVLink. TP 16 halves each GPU's products, but its ring spans
two nodes: two of its hops cross, and a ring moves in lockstep, so every step of every TP collective goes
at the network's pace. The layer's time says which wins.
"""
from __future__ import annotations

from fractions import Fraction

from dataclasses import replace

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.comm.hops import event_transfers, split_by_link
from parasim.estimate import get_model
from parasim.estimate.hardware import GPUS, LATENCY
from parasim.estimate.kernels import collective_bandwidth
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights

SEQ = 4096
MODEL = replace(get_model("27b"), seq=SEQ, flash=True, dropout=0.0)
WORLD, NODE = 16, 8
GPU = "h200"
PHASES = {8: "TP 8 inside one node", 16: "TP 16 over two nodes"}


def program(ctx):
    out = {}
    for tp, phase in PHASES.items():
        groups = [ctx.new_group(range(first, first + tp), "tp") for first in range(0, WORLD, tp)]
        ctx.phase(phase, tp=tp)
        t = ParallelContext(ctx, groups[ctx.rank // tp], sp=True, seq=SEQ)
        layer = TransformerLayer(t, MODEL, layer_weights(ctx, MODEL, f"L{tp}"), key=f"L{tp}")
        # symbolic ranks compute in the run's precision (the post's BF16): the trace's bytes are the wire's
        x = ctx.shared_rng(f"x{tp}").normal((len(t.token_positions()), 1, MODEL.hidden))
        y, cache = layer.forward(x, Saved())
        layer.backward(cache, y)
        out[phase] = {"tokens": len(t.token_positions())}
    return out


def study(result) -> dict:
    """Each phase of GPU 0 on the clock, and its events."""
    trace = result.trace
    tl = simulate(trace, machine(GPU, NODE))
    phases = by_phase(trace, tl, 0)
    events = {p: [e for e in trace.events if e.phase == p and e.kind == "collective" and 0 in e.ranks]
              for p in PHASES.values()}
    flops = {p: sum(sum((m.work or {}).values()) for e in trace.events if e.phase == p for m in e.members
                    if m.rank == 0) for p in PHASES.values()}
    # the bus bandwidth the kernel tables measure for one of each phase's all-gathers (its whole buffer)
    busbw = {}
    for tp, p in PHASES.items():
        e = next(e for e in events[p] if e.op == "all_gather")
        where = "inside" if tp <= NODE else "across"
        busbw[tp] = collective_bandwidth(GPU, "all_gather", tp * e.member(0).sent // (tp - 1), where, tp).value
    return {"tl": tl, "phases": phases, "events": events, "flops": flops, "busbw": busbw}


def _ms(x: float) -> float:
    return round(x * 1e3, 3)


def tables(result, s) -> list[Table]:
    rows = []
    for tp, p in PHASES.items():
        ph = s["phases"][p]
        total = ph["end"] - ph["start"]
        rows.append((p, [round(s["flops"][p] / 1e12, 3), _ms(ph["compute"]), len(s["events"][p]), _ms(ph["comm"]),
                         _ms(total), f"{ph['comm'] / total:.0%}"]))
    g = GPUS[GPU]
    return [Table(f"One {MODEL.name} layer ({MODEL.hidden:,} wide, {SEQ:,} tokens, SP on), forward and backward, on "
                  f"GPU 0 of {WORLD} {g.name}s in nodes of {NODE} (ms = milliseconds on the clock)",
                  ["layout", "products (TFLOP)", "products (ms)", "TP collectives", "communication (ms)",
                   "layer (ms)", "communicating"], rows,
                  notes=[f"NVLink {g.nvlink.value / 1e9:,.0f} GB/s each way inside a node, where a TP 8 all-gather "
                         f"of this layer measures {s['busbw'][8] / 1e9:,.0f} GB/s of bus bandwidth; the network "
                         f"{g.network.value / 1e9:,.0f} GB/s per GPU between nodes, of which a ring measures "
                         f"{s['busbw'][16] / 1e9:,.0f} (parasim hardware lists the sources). TP 16 does half the "
                         "products of TP 8 on each GPU, but every step of its ring waits for the two hops that cross "
                         "between the nodes."])]


def checks(result, s) -> list[Check]:
    tl = s["tl"]
    p8, p16 = PHASES[8], PHASES[16]
    crossing = {p: [split_by_link(event_transfers(e), NODE)["across"] for e in s["events"][p]] for p in PHASES.values()}
    call, across = LATENCY["call"].value, LATENCY["across"].value
    gather = next(e for e in s["events"][p16] if e.op == "all_gather")
    chunk = gather.member(0).sent / 15  # BF16 values, as sent; t - 1 = 15 steps, one chunk each
    busbw = collective_bandwidth(GPU, "all_gather", 16 * int(chunk), "across", 16).value  # the kernel table's
    start, end = tl.events[gather.seq]
    ph8, ph16 = s["phases"][p8], s["phases"][p16]
    return [
        check("each GPU's products at TP 16 are half of TP 8's (the same layer, split over twice the GPUs): "
              "TP 16's FLOPs over TP 8's", Fraction(int(s["flops"][p16]), int(s["flops"][p8])), Fraction(1, 2)),
        check("TP 8's collectives send nothing across nodes; every TP 16 collective sends bytes across",
              [sum(crossing[p8]) == 0, all(c > 0 for c in crossing[p16])], [True, True]),
        check("a TP 16 all-gather on the clock, by hand: NCCL's call latency, then 15 ring steps, each the "
              "network's step latency and one chunk at the bus bandwidth measured across nodes (its slowest hop)",
              end - start, call + 15 * (across + chunk / busbw), rtol=1e-9),
        check("the layer takes longer at TP 16 than at TP 8, although each GPU computes half as much",
              ph16["end"] - ph16["start"] > ph8["end"] - ph8["start"], True),
        check("... because TP 16 spends longer communicating than TP 8 spends on the whole layer",
              ph16["comm"] > ph8["end"] - ph8["start"], True),
    ]


NARRATIVE = {
    PHASES[8]: """
        Eight GPUs share the layer: a node of them, joined by NVLink. Under SP each holds 512 of the 4,096
        tokens between the matrix products, gathers the whole sequence before the column-parallel ones and
        reduce-scatters after the row-parallel ones. Every hop of every ring stays inside the node.""",
    PHASES[16]: """
        Sixteen GPUs share the same layer: each does half the products. But the ring now runs over two
        nodes, and two of its sixteen hops cross between them. A ring moves in lockstep, so each of its 15
        steps per all-gather waits for the slow hop: the bytes inside the node go at the network's pace too.
        The table puts the two layouts side by side on the clock.""",
}

LESSON = Lesson(
    no_picture="its answer is two rows of one table; the app's time view (press u) draws the layer on the clock",
    name="tp-across-nodes", title="TP inside a node against TP over two nodes: the same layer on the clock",
    section="Tensor parallelism: why TP stays inside a node (on the clock)",
    order=80,
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic", fold_alike=True,
    summary="One 27B layer at TP 8 in a node and TP 16 over two, timed on H200s: half the products, several "
            "times the communication, a slower layer",
)

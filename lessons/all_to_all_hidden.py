"""The all-to-all cannot wait, so DualPipe hides it: DeepSeek-V3's MoE layer at real size on symbolic
ranks, two micro-batches through it, timed on the clock with and without DualPipe's pairing.

A token's experts live on other GPUs: before the experts can work, the dispatch all-to-all must bring the
tokens; before the next layer can, the combine must bring them back. On one micro-batch nothing else can
run meanwhile, so every all-to-all sits on the critical path (as in 1F1B, where a forward and a backward
run one after the other). DualPipe pairs the forward of one micro-batch with the backward of another: one
chunk's all-to-all runs while the other chunk computes. EP 8 inside a node and EP 16 over two nodes show
how much of it each hides.
"""
from __future__ import annotations


from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.estimate.hardware import GPUS
from parasim.examples import ep_vs_zero3 as ratios
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing

T = 4096  # tokens per GPU per micro-batch
D, E, K, F = 7168, 256, 8, 2048  # DeepSeek-V3: hidden, routed experts, picks per token, an expert's width
WORLD, NODE, GPU = 16, 8, "h200"
EPS = (8, 16)
ROUTING = Routing.parse("balanced")  # every token's picks spread evenly: the routing DeepSeek-V3 steers toward


def phases(ep: int) -> tuple[str, str, str]:
    return (f"EP {ep}: micro-batch 1 forward", f"EP {ep}: micro-batch 2 forward with micro-batch 1 backward",
            f"EP {ep}: micro-batch 2 backward")


def program(ctx):
    for ep in EPS:
        groups = [ctx.new_group(range(first, first + ep), "ep") for first in range(0, WORLD, ep)]
        group = groups[ctx.rank // ep]
        tp = ParallelContext(ctx, None, ep_group=group, options=LayerOptions(routing=ROUTING))
        draw = ctx.shared_rng
        name = f"moe.ep{ep}"
        experts = [{"w1": draw(f"{name}.{e}.w1").normal((D, F)), "w2": draw(f"{name}.{e}.w2").normal((F, D))}
                   for e in range(E)]
        moe = MoE(tp, group, draw(f"{name}.router").normal((D, E)), experts, K, name=name)
        first, pair, last = phases(ep)
        ctx.phase(first, ep=ep)
        y1, c1 = moe.forward(draw(f"x1.{ctx.rank}").normal((T, D)), Saved())
        ctx.phase(pair, ep=ep, pair=ep)  # the two chunks DualPipe runs side by side
        y2, c2 = moe.forward(draw(f"x2.{ctx.rank}").normal((T, D)), Saved())
        moe.backward(c1, y1)
        ctx.phase(last, ep=ep)
        moe.backward(c2, y2)


def study(result) -> dict:
    trace, m = result.trace, machine(GPU, NODE)
    out = {}
    for name, overlap in (("1F1B", ()), ("DualPipe", ("dualpipe",))):
        tl = simulate(trace, m, overlap)
        out[name] = {"tl": tl, "phases": [by_phase(trace, tl, r) for r in range(WORLD)]}
    return out


def _span(rows: list[dict], phase: str) -> float:
    """How long a phase lasts, all GPUs together: from its first start to its last end."""
    return max(r[phase]["end"] for r in rows) - min(r[phase]["start"] for r in rows)


def _phase_table(result, s) -> list[Table]:
    rows = []
    for ep in EPS:
        for p in phases(ep):
            one, two = s["1F1B"]["phases"], s["DualPipe"]["phases"]
            rows.append((p, [round(one[0][p]["compute"] * 1e3, 2), round(one[0][p]["comm"] * 1e3, 2),
                             round(_span(one, p) * 1e3, 2), round(_span(two, p) * 1e3, 2)]))
    return [Table(f"DeepSeek-V3's MoE layer ({E} experts of width {F:,}, top {K}, d = {D:,}), {T:,} tokens per GPU "
                  f"per micro-batch, on {WORLD} {GPUS[GPU].name}s in nodes of {NODE} (ms = milliseconds on the clock; "
                  "GPU 0's compute and all-to-alls)",
                  ["phase", "compute (ms)", "all-to-alls (ms)", "one after the other (ms)", "paired (ms)"], rows,
                  notes=["one after the other: each all-to-all waits for the compute before it and the compute after "
                         "it waits for the all-to-all, as in 1F1B. paired: in the middle phase the forward of one "
                         "micro-batch and the backward of the other share the GPU, one's all-to-alls beside the "
                         "other's products (DualPipe); the phase lasts about the longer of the two streams."])]


def _sent(result, phase: str, label: str, rank: int = 0) -> int:
    """Bytes GPU `rank` sent in phase `phase`'s all-to-alls whose label holds `label`."""
    return sum(m.sent for e in result.trace.events if e.op == "all_to_all" and e.phase == phase
               and label in (e.label or "") for m in e.members if m.rank == rank)


def post_figures(result) -> dict:
    """The post's EP arithmetic for this very layer (EP 8, GPU 0), each beside what the run sent."""
    ep, first, last = 8, phases(8)[0], phases(8)[2]
    b = 2  # BF16 tokens, as the post counts them and as this run sends them
    one_way = T * K * D * b * (ep - 1) / ep  # the post: T . K . d . b . (EP - 1)/EP
    dispatch, combine = _sent(result, first, "dispatch"), _sent(result, first, "combine")
    backward = _sent(result, last, "backward")
    copies = T * K * (ep - 1) // ep  # token copies that leave the GPU (balanced routing: one pick a GPU)
    return {"one_way": one_way, "dispatch": dispatch, "combine": combine, "forward": dispatch + combine,
            "backward": backward, "extra_per_copy": (dispatch - combine) / copies,
            "tp_all_reduce": 2 * T * D * b * 2 * (ep - 1) / ep,  # the post's TP comparison at t = EP
            "experts": E * 2 * D * F * b}  # ZeRO-3's way: gather the layer's expert weights instead



def ep_vs_zero3(rows: float | None = None) -> dict:
    """This lesson's ZeRO-3-over-EP ratio in the shared formula, at EP 8: the whole layer's experts against
    `rows` rows a token (the run's; else balanced routing's, one to each other GPU of the group: K (EP - 1)/EP)."""
    ep = EPS[0]
    rows = K * (ep - 1) / ep if rows is None else rows
    return ratios.parts(share=1, experts=E, ep=ep, hidden=D, width=F, tokens=T, rows=rows)


def tables(result, s) -> list[Table]:
    out = _phase_table(result, s)
    f = post_figures(result)
    mb = lambda x: round(x / 1e6, 1)  # noqa: E731  MB, as the post writes them
    mine = ep_vs_zero3(f["forward"] / (T * (2 * D + E // 8) * 2))  # GPU 0's rows a token, out and back (BF16)
    out.append(Table("The post's EP arithmetic for this layer (EP 8, GPU 0, BF16; MB = 10^6 bytes), beside what the "
                     "run sent",
                     ["figure", "the post's formula (MB)", "the run (MB)"],
                     [("dispatch, one direction: T K d b (EP-1)/EP", [mb(f["one_way"]), mb(f["dispatch"])]),
                      ("combine, the way back", [mb(f["one_way"]), mb(f["combine"])]),
                      ("dispatch + combine, forward", [mb(2 * f["one_way"]), mb(f["forward"])]),
                      ("the same backward (it doubles the layer's)", [mb(2 * f["one_way"]), mb(f["backward"])]),
                      ("a TP 8 all-reduce of the tokens instead: 4 T d b (t-1)/t", [mb(f["tp_all_reduce"]), "-"]),
                      ("ZeRO-3's way: gather the layer's experts (E 2 d F b)", [mb(f["experts"]), "-"])],
                     notes=[f"the run's dispatch carries {f['extra_per_copy']:g} bytes more per token copy than its "
                            f"d values: the gates of the {f['extra_per_copy'] / 2:g} experts on the GPU it goes to "
                            "(BF16, zero where not picked), sent beside it; the combine is the formula to the byte. "
                            "With balanced routing a token's 8 picks sit on 8 GPUs, so "
                            "no copy is saved by two picks sharing a GPU, as the post says routing can.",
                            "EP moves tokens to the weights, ZeRO-3 would move weights to the tokens: gathering this "
                            f"layer's experts (all {f['experts'] / 1e6:,.0f} MB of them) is {f['experts'] / f['forward']:.0f} "
                            "times the all-to-alls' bytes forward; the next table sets that ratio beside "
                            "ep-split's and at-scale's."]))
    out.append(ratios.ratio_table("all-to-all-hidden", mine, "the whole layer's experts", "balanced routing, GPU 0's"))
    return out


def checks(result, s) -> list[Check]:
    one, two = s["1F1B"], s["DualPipe"]
    f = post_figures(result)
    # by hand: 4,096 tokens x 8 picks x 7,168 values x 2 bytes x 7/8 leave the GPU = 411,041,792 bytes
    out = [check("the combine sends the post's T K d b (EP-1)/EP to the byte (GPU 0, EP 8)", f["combine"],
                 4096 * 8 * 7168 * 2 * 7 // 8),
           check("backward sends what forward sent, again (dispatch and combine, EP 8)", f["backward"], f["forward"])]
    for ep in EPS:
        first, pair, last = phases(ep)
        p0 = one["phases"][0][pair]
        out.append(check(f"EP {ep}, unpaired: the middle phase lasts its compute plus its all-to-alls (GPU 0 waits "
                         "for each; within 5%: the all-to-alls also wait for the slowest GPU)",
                         _span(one["phases"], pair), p0["compute"] + p0["comm"], rtol=0.05))
        out.append(check(f"EP {ep}, paired: the middle phase is shorter", _span(two["phases"], pair)
                         < _span(one["phases"], pair), True))
        out.append(check(f"EP {ep}, paired: ... but not shorter than the longer of its two streams (compute, "
                         "all-to-alls)", _span(two["phases"], pair) >= max(p0["compute"], p0["comm"]) * (1 - 1e-9),
                         True))
        out.append(check(f"EP {ep}: the unpaired phases last the same either way (nothing to pair with; within "
                         "0.2%: after a pair the GPUs start the next phase a little apart)",
                         [_span(two["phases"], p) for p in (first, last)],
                         [_span(one["phases"], p) for p in (first, last)], rtol=2e-3))
    saved = {ep: 1 - _span(two["phases"], phases(ep)[1]) / _span(one["phases"], phases(ep)[1]) for ep in EPS}
    out.append(check("the all-to-alls over two nodes (EP 16) take longer than inside one (EP 8), so pairing hides "
                     "less of them: EP 16's all-to-alls stay longer than its compute",
                     one["phases"][0][phases(16)[1]]["comm"] > one["phases"][0][phases(16)[1]]["compute"], True))
    out.append(check("pairing saves a share of the middle phase at both sizes", all(v > 0 for v in saved.values()),
                     True))
    return out


NARRATIVE = {
    **{phases(ep)[0]: f"""
        EP {ep}: DeepSeek-V3's {E} experts over {ep} GPUs{' of one node' if ep == NODE else ', two nodes'}, {E // ep}
        on each. The first micro-batch's forward: route, dispatch the tokens to their experts' GPUs, run the
        experts, combine the outputs back. Nothing else is ready to run, so each all-to-all waits on the
        compute before it and holds up the compute after it.""" for ep in EPS},
    **{phases(ep)[1]: f"""
        The second micro-batch's forward and the first one's backward. 1F1B runs them one after the other;
        DualPipe runs them side by side, one chunk's all-to-alls during the other's products. The clock shows
        the phase both ways: {'inside a node the all-to-alls are short and most of their time hides' if ep == NODE
        else 'over two nodes the all-to-alls go at the network pace and outlast the products'}.""" for ep in EPS},
    **{phases(ep)[2]: """
        The second micro-batch's backward: the last chunk, with nothing left to pair it with.""" for ep in EPS},
}

LESSON = Lesson(
    no_picture="its answer is a table of times; the app's time view (press u) draws both schedules on the clock",
    name="all-to-all-hidden", title="The all-to-all cannot wait: DualPipe pairs a forward with a backward to hide "
                                    "it, on the clock",
    section="Expert parallelism: the all-to-all cannot wait, DualPipe hides it (on the clock)",
    order=190,
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic",
    summary="DeepSeek-V3's MoE layer at EP 8 in a node and EP 16 over two, two micro-batches: every all-to-all "
            "on the critical path one after the other, and what pairing them (DualPipe) hides",
)

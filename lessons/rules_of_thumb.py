"""The post's rules of thumb, each shown by a run that breaks it beside a run that follows it: two layers of
the 27B model (for the EP and ETP rules, DeepSeek-V3's MoE layer) on 16 H200s (two nodes of 8), at real size on
symbolic ranks, forward, backward and the optimizer step, timed on the clock.

Every pair runs on the same 16 GPUs and the same tokens. What a rule saves (or costs) is measured, never
asserted: the bytes GPU 0 sends inside its node and across nodes (from the trace), what GPU 0 keeps (its
weights, gradients and optimizer state as the optimizer holds them, and the activations its layers keep for
backward) and how long the piece takes on the clock. Following a rule is not always free: the table says
which way each pair goes.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from parasim.clock.costs import machine
from parasim.clock.timeline import by_phase, simulate
from parasim.comm.hops import ACROSS, INSIDE, event_transfers, split_by_link
from parasim.dp.sharded import ShardedAdam
from parasim.estimate import Plan, fit, get_model, gpu_presets
from parasim.estimate.fit import LONGEST_ROWS
from parasim.estimate.hardware import GPUS
from parasim.lesson import Check, Lesson, Picture, Table, check
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.render.plot_lessons import plot_broken_kept

SEQ, LONG = 4096, 32768  # tokens a sequence; the long one for the CP rule
MODEL = replace(get_model("27b"), flash=True, dropout=0.0)
WORLD, NODE, GPU = 16, 8, "h200"
LAYERS = 2  # the piece of the model every run trains: two layers (one a stage where a pipeline splits them)
ALL = tuple(range(WORLD))
# DeepSeek-V3's MoE layer (hidden 7,168; 256 experts of width 2,048, two matrices each here; top 8), 4,096
# tokens a GPU, routed uniformly (a symbolic run has no scores to route by)
MOE_T, MOE_D, MOE_E, MOE_K, MOE_F = 4096, 7168, 256, 8, 2048
# the micro-batches of the EP runs' step: each goes forward and backward through the layer (its all-to-alls each
# time), the experts' gradients summed over their copies once, at the step's end. A real step runs many more
# (DeepSeek-V3's global batch is thousands of sequences); the lesson's notes give the break-even
MOE_MICRO = 6
UNIFORM = Routing.parse("uniform")
Groups = tuple[tuple[int, ...], ...]


def blocks(size: int, ranks: tuple[int, ...] = ALL) -> Groups:
    """`ranks` cut into groups of `size` consecutive GPUs."""
    return tuple(ranks[i : i + size] for i in range(0, len(ranks), size))


def pairs_across() -> Groups:
    """GPU i of node 0 with GPU i of node 1: a group of two that crosses the nodes."""
    return tuple((i, i + NODE) for i in range(NODE))


SINGLES = blocks(1)
HALF_NODES = ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))  # half of each node: a group over both
# EP 4 under ETP 2 in each node: expert TP is the fastest axis of Megatron's expert mesh, so a GPU's EP group is
# the GPUs at its place in the other expert-TP pairs of its node
EP_UNDER_ETP2 = tuple(tuple(range(first, first + NODE, 2)) for first in (0, 1, NODE, NODE + 1))


class Setup(NamedTuple):
    """One run of the piece: its TP groups (with SP or not), its CP and data-parallel groups (each GPU's
    optimizer works over its data-parallel group; a group of one where there is none), its pipeline stages
    (the GPUs of each, in order), the ZeRO stage, the sequence and the sequences a step. (A named tuple: a
    lesson file is loaded by its path, where a dataclass cannot find its module.)"""

    label: str
    tp: Groups
    sp: bool = True
    cp: Groups | None = None
    dp: Groups = SINGLES
    stages: Groups = (ALL,)
    zero: int = 0
    seq: int = SEQ
    batch: int = 1
    ep: Groups | None = None  # an MoE piece instead: DeepSeek-V3's MoE layer, its experts over these groups
    etp: Groups | None = None  # ... each expert's two matrices split over these (expert TP; none: ETP 1)


class Rule(NamedTuple):
    """A rule of thumb in the post's list, the two runs that show it, and what each run shows (the narrative's
    words for it)."""

    name: str
    says: str
    breaks: Setup
    follows: Setup
    broken_words: str
    kept_words: str


TP8 = blocks(8)
RULES: tuple[Rule, ...] = (
    Rule("tp-inside-a-node", "TP inside a node",
         Setup("TP 16 over 2 nodes", blocks(16), batch=2),
         Setup("TP 8 a node, DP 2", TP8, dp=pairs_across()),
         "TP 16 spreads each layer over both nodes, two sequences at once. Each of its all-gathers and "
         "reduce-scatters is a ring with two hops between the nodes, and a ring moves at its slowest hop's "
         "pace: in every layer, forward and backward.",
         "TP 8 keeps every ring inside a node, on NVLink. The nodes are two DP replicas, a sequence each, and "
         "only their gradient all-reduce crosses, once a step. Each GPU holds twice the weights TP 16 left it."),
    Rule("sp-with-tp", "SP whenever TP is on",
         Setup("TP 8, no SP", TP8, sp=False, dp=pairs_across()),
         Setup("TP 8 + SP", TP8, dp=pairs_across()),
         "TP 8 without SP: each all-reduce leaves all 8 GPUs the whole activation, so the norms, the residual "
         "adds and what backward keeps of them are whole on every GPU.",
         "With SP each all-reduce becomes a reduce-scatter and an all-gather: the same bytes forward, and the "
         "activations between the products kept split 8 ways. Backward gathers the two saved input slices "
         "once more."),
    Rule("cp-for-long-sequences", "CP when sequences get long",
         Setup(f"TP 16 over 2 nodes, {LONG // 1024}K", blocks(16), seq=LONG),
         Setup(f"TP 8 + CP 2, {LONG // 1024}K", TP8, cp=pairs_across(), dp=pairs_across(), seq=LONG),
         f"At {LONG // 1024}K tokens one node is not enough. Spreading the layer with TP 16 puts its rings, "
         "now eight times the bytes of a 4K sequence, on the network in every layer.",
         "TP 8 stays in each node and CP 2 gives each node half of the sequence. Across the nodes go the K and V "
         "of the other half (a pass each way, forward, and their gradients backward) and the weights' "
         "gradient reduction."),
    Rule("pp-across-nodes", "PP across nodes",
         Setup("PP in a node, TP over 2", HALF_NODES, stages=HALF_NODES),
         Setup("PP over 2 nodes, TP 8", TP8, stages=TP8),
         "Two pipeline stages, each half of both nodes: the hand-off between the stages stays inside a node, "
         "so the TP groups of 8 must span the nodes, and their rings cross in every layer.",
         "Each node is a stage and a TP group. Only the hand-off crosses: each GPU's slice of the activation "
         "forward, and its gradient back, once a micro-batch."),
    Rule("ep-inside-a-node", "EP inside a node",
         Setup("EP 16 over 2 nodes", SINGLES, ep=blocks(16)),
         Setup("EP 8 a node, EDP 2", SINGLES, ep=TP8, dp=pairs_across()),
         "DeepSeek-V3's MoE layer with its 256 experts spread over all 16 GPUs (16 each): a token's picks land "
         "on either node, so about half of each all-to-all, forward and backward, crosses the network.",
         "EP 8 in each node: each GPU holds 32 experts, twice as many, and the all-to-alls stay on NVLink. The "
         "two nodes hold the same experts (EDP 2), so once a step their gradients are summed across the nodes."),
    Rule("etp-1", "ETP 1 for the experts",
         Setup("ETP 2 x EP 4 a node, EDP 2", SINGLES, ep=EP_UNDER_ETP2, etp=blocks(2), dp=pairs_across()),
         Setup("ETP 1 x EP 8 a node, EDP 2", SINGLES, ep=TP8, dp=pairs_across()),
         "The same MoE layer with each expert's two matrices split over a pair of GPUs (ETP 2), four pairs a "
         "node (EP 4): every GPU holds half of 64 experts. Each pair first swaps the tokens its two GPUs "
         "received, so both work on all of them, and after the experts sums its partial outputs; backward the "
         "same two again.",
         "ETP 1: each expert whole on one GPU, eight a node (EP 8), 32 experts a GPU: the very same weights a "
         "GPU as ETP 2's halves of 64, with no pair to swap tokens or sum outputs with, and each expert's "
         "products twice as wide."),
    Rule("zero-1", "ZeRO-1 over DP almost always",
         Setup("TP 8, DP 2, plain Adam", TP8, dp=pairs_across()),
         Setup("TP 8, DP 2, ZeRO-1", TP8, dp=pairs_across(), zero=1),
         "Plain DP: each replica all-reduces its gradients and keeps the whole of Adam's state for its weights.",
         "ZeRO-1: a reduce-scatter hands each replica half of the summed gradient; it updates that half and an "
         "all-gather brings the weights back. The same bytes, half of Adam's state."),
)


def phase_of(rule: Rule, role: str) -> str:
    setup = rule.breaks if role == "breaks" else rule.follows
    return f"{rule.says}: {role} it ({setup.label})"


def _mine(ctx, groups: Groups, name: str):
    """Every group made on every rank (torch's rule), this rank's returned."""
    made = [ctx.new_group(g, name) for g in groups]
    return next(g for g, ranks in zip(made, groups) if ctx.rank in ranks)


def run_moe(ctx, s: Setup, key: str) -> dict:
    """The MoE piece under `s` on this rank: the layer forward and backward over its EP group, then Adam on its
    experts over its expert-data-parallel group (the experts' gradients summed where another node holds the
    same ones). What it keeps, counted."""
    assert s.ep is not None
    etp = _mine(ctx, s.etp, "expert-tp") if s.etp else None
    ep, edp = _mine(ctx, s.ep, "ep"), _mine(ctx, s.dp, "expert-dp")
    draw = ctx.shared_rng
    experts = [{"w1": draw(f"{key}.e{e}.w1").normal((MOE_D, MOE_F)), "w2": draw(f"{key}.e{e}.w2").normal((MOE_F, MOE_D))}
               for e in range(MOE_E)]
    par = ParallelContext(ctx, None, ep_group=ep, etp_group=etp, options=LayerOptions(routing=UNIFORM))
    moe = MoE(par, ep, draw(f"{key}.router").normal((MOE_D, MOE_E)), experts, MOE_K, name=f"{key}.moe", etp=etp)
    kept = 0  # a micro-batch's activations are freed by its backward: the most one holds
    for mb in range(MOE_MICRO):
        saved = Saved()
        y, cache = moe.forward(draw(f"{key}.x{ctx.rank}.mb{mb}").normal((MOE_T, MOE_D)), saved)
        moe.backward(cache, y)  # the experts' gradients add up over the micro-batches
        kept = max(kept, saved.bytes())
    params = {f"expert{moe.first + j + 1}.{n}": w for j, e in enumerate(moe.experts) for n, w in e.items()}
    opt = ShardedAdam(ctx, edp, params, 0, name="Adam over expert-dp")
    grads = moe.grads
    opt.step({k: grads[k] for k in params})
    return {**opt.held(), "activations": kept}


def run_setup(ctx, s: Setup, key: str) -> dict:
    """The piece under `s` on this rank: its layers forward (activations handed to the next stage), backward
    (gradients handed back), then the optimizer over its data-parallel group. What it keeps, counted."""
    if s.ep is not None:
        return run_moe(ctx, s, key)
    tp, dp = _mine(ctx, s.tp, "tp"), _mine(ctx, s.dp, "dp")
    cp = _mine(ctx, s.cp, "cp") if s.cp else None
    stage = next(i for i, g in enumerate(s.stages) if ctx.rank in g)
    mine = s.stages[stage]
    model = replace(MODEL, seq=s.seq)
    par = ParallelContext(ctx, tp, sp=s.sp, cp_group=cp, seq=s.seq)
    per_stage = LAYERS // len(s.stages)
    layers = [TransformerLayer(par, model, layer_weights(ctx, model, f"{key}.L{stage * per_stage + i}"),
                               key=f"{key}.L{stage * per_stage + i}") for i in range(per_stage)]
    shape = (len(par.token_positions()), s.batch, model.hidden)  # this rank's tokens (its SP slice under SP)
    x = ctx.shared_rng(f"{key}.x").normal(shape)
    me = mine.index(ctx.rank)
    if stage > 0:  # the previous stage's activations, from the GPU in the same place of it
        x = ctx.comm.recv(s.stages[stage - 1][me], shape, x.dtype, label="PP: activations in")
    saved, caches = Saved(), []
    for layer in layers:
        x, cache = layer.forward(x, saved)
        caches.append(cache)
    if stage < len(s.stages) - 1:
        ctx.comm.send(x, s.stages[stage + 1][me], label="PP: activations out")
        x = ctx.comm.recv(s.stages[stage + 1][me], shape, x.dtype, label="PP: gradient in")
    for layer, cache in zip(reversed(layers), reversed(caches)):
        x = layer.backward(cache, x)
    if stage > 0:
        ctx.comm.send(x, s.stages[stage - 1][me], label="PP: gradient out")
    params = {f"{i}.{k}": v for i, lay in enumerate(layers) for k, v in lay.params().items()}
    grads = {f"{i}.{k}": v for i, lay in enumerate(layers) for k, v in lay.grads.items()}
    opt = ShardedAdam(ctx, dp, params, s.zero, name=("ZeRO-1" if s.zero else "DP") + " over dp")
    opt.step(grads)
    return {**opt.held(), "activations": saved.bytes()}


def program(ctx):
    out = {}
    for n, rule in enumerate(RULES):
        for role in ("breaks", "follows"):
            ctx.phase(phase_of(rule, role))
            out[phase_of(rule, role)] = run_setup(ctx, getattr(rule, role), f"r{n}{role[0]}")
    return out


def study(result) -> dict:
    """For each run: the bytes all GPUs send inside nodes and across them, GPU 0's collectives (and
    hand-offs) with a hop across nodes, and GPU 0's seconds on the clock."""
    trace = result.trace
    tl = simulate(trace, machine(GPU, NODE))
    sent: dict[str, dict[str, int]] = {}
    for e in trace.events:
        if e.kind == "compute":
            continue
        row = sent.setdefault(e.phase, {INSIDE: 0, ACROSS: 0, "crossing": 0})
        split = split_by_link(event_transfers(e), NODE)
        row[INSIDE] += split[INSIDE]
        row[ACROSS] += split[ACROSS]
        row["crossing"] += split[ACROSS] > 0 and 0 in [m.rank for m in e.members]  # GPU 0's calls
    # the experts' gradient sums over the nodes (EDP), once a step whatever the micro-batches: GPU 0's on the clock
    edp: dict[str, float] = {}
    for e in trace.events:
        if e.group is not None and e.group.name == "expert-dp" and 0 in e.ranks and e.kind == "collective":
            start, end = tl.events[e.seq]
            edp[e.phase] = edp.get(e.phase, 0.0) + (end - start) * 1e3
    return {"spans": by_phase(trace, tl, 0), "sent": sent, "edp_ms": edp}


def figures(result, s, phase: str) -> dict:
    """One run's figures: bytes inside and across nodes (all GPUs), the calls that cross, GPU 0's weights,
    gradients and optimizer state, its kept activations, and its milliseconds on the clock."""
    held = result.values[0][phase]
    span = s["spans"][phase]
    sent = s["sent"].get(phase, {INSIDE: 0, ACROSS: 0, "crossing": 0})
    return {"inside": sent[INSIDE], "across": sent[ACROSS], "crossing": sent["crossing"],
            "state": held["weights"] + held["gradients"] + held["optimizer"], "optimizer": held["optimizer"],
            "activations": held["activations"], "ms": (span["end"] - span["start"]) * 1e3,
            "edp_ms": s["edp_ms"].get(phase, 0.0)}


def _gb(n: float) -> float:
    return round(n / 1e9, 2)


def tables(result, s) -> list[Table]:
    runs, costs = [], []
    for rule in RULES:
        f = {role: figures(result, s, phase_of(rule, role)) for role in ("breaks", "follows")}
        for role in ("breaks", "follows"):
            g = f[role]
            runs.append((f"{'broken' if role == 'breaks' else 'kept'}: {getattr(rule, role).label}",
                         [_gb(g["inside"]), _gb(g["across"]), g["crossing"], _gb(g["state"]), _gb(g["activations"]),
                          round(g["ms"], 1)]))
        b, w = f["breaks"], f["follows"]
        costs.append((rule.says, [_gb(b["across"] - w["across"]),
                                  _gb(b["state"] + b["activations"] - w["state"] - w["activations"]),
                                  round(b["ms"] - w["ms"], 1) + 0.0, f"{b['ms'] / w['ms']:.2f}x"]))
    g = GPUS[GPU]
    return [
        Table(f"Each rule broken and kept: two {MODEL.name} layers (EP: DeepSeek-V3's MoE layer, a step of "
              f"{MOE_MICRO} micro-batches) on {WORLD} "
              f"{g.name}s in nodes of {NODE} (GB = 10^9 bytes, sent by all GPUs; memory and ms: GPU 0's)",
              ["run", "inside nodes (GB)", "across nodes (GB)", "GPU 0's calls across", "weights, grads, Adam (GB)",
               "activations (GB)", "time (ms)"], runs,
              notes=["inside and across nodes: the bytes every GPU sends over NVLink and over the network; GPU "
                     "0's calls across: the collectives and pipeline hand-offs it joins that have a hop between the "
                     "nodes (a ring moves in lockstep, so each goes at the network's pace); time: GPU 0's forward, "
                     "backward and optimizer step on the clock.",
                     "weights and gradients in BF16 (2 bytes each), Adam's FP32 master copy and two moments (12 "
                     "bytes a parameter) as the optimizer holds them on GPU 0; activations: what its layers keep "
                     "for backward (a pipeline stage keeps its own layer's). No dropout, FlashAttention."]),
        Table("What breaking each rule costs (broken less kept; a negative figure is what breaking it saves)",
              ["rule", "more across nodes (GB)", "more memory on GPU 0 (GB)", "slower by (ms)",
               "time, broken / kept"], costs,
              notes=[f"the clock's constants: NVLink {g.nvlink.value / 1e9:,.0f} GB/s a GPU each way inside a "
                     f"node, the network {g.network.value / 1e9:,.0f} GB/s a GPU between nodes (parasim hardware "
                     "lists the sources).",
                     _ep_words(result, s),
                     "SP's bytes: the post says SP sends the same bytes as TP's all-reduces; so it does forward, "
                     "but backward gathers the two saved input slices again (2 of TP alone's 8 ring passes a "
                     "layer: a quarter more), unless the gathered inputs are kept whole instead.",
                     _sp_words(result, s)]),
    ]


def ep_break_even(result, s) -> tuple[float, float, float]:
    """EP inside a node, per micro-batch and per step: the all-to-all time keeping the rule saves on one
    micro-batch, the experts' gradient sum over the nodes it adds once a step (GPU 0's ms on the clock), and the
    micro-batches a step from which keeping it wins."""
    rule = next(r for r in RULES if r.name == "ep-inside-a-node")
    broken, kept = (figures(result, s, phase_of(rule, role)) for role in ("breaks", "follows"))
    saved = ((broken["ms"] - broken["edp_ms"]) - (kept["ms"] - kept["edp_ms"])) / MOE_MICRO
    added = kept["edp_ms"] - broken["edp_ms"]
    return saved, added, added / saved


def _ep_words(result, s) -> str:
    saved, added, m = ep_break_even(result, s)
    return (f"EP inside a node: a micro-batch's all-to-alls take {saved:.1f} ms less at EP 8 than at EP 16, but the "
            f"two nodes then hold the same experts and sum their gradients across the network once a step "
            f"({added:.1f} ms here): keeping the rule wins from {math.floor(m) + 1} micro-batches a step (this run's "
            f"step has {MOE_MICRO}; and "
            "sooner where that sum hides behind the backward).")


def sp_at_model_size(result, s) -> dict:
    """SP's memory row at the model's size: what breaking it costs GPU 0 a layer (the run's two layers halved)
    times the 27B model's layers, at this run's 4,096 tokens; and the longest sequence one node of 8 H200s
    takes with TP 8 alone and with SP (the estimator, as lesson longest-sequence solves it)."""
    rule = next(r for r in RULES if r.name == "sp-with-tp")
    off, on = (figures(result, s, phase_of(rule, role)) for role in ("breaks", "follows"))
    per_layer = (off["activations"] - on["activations"]) / LAYERS
    base = get_model("27b")
    usable = gpu_presets()[GPU].usable
    plans = {label: kw for _, label, kw in LONGEST_ROWS}
    return {"per_layer": per_layer, "layers": base.layers, "model": per_layer * base.layers,
            "tp8": fit(base, Plan(**plans["TP8"]), usable).seq, "tp8_sp": fit(base, Plan(**plans["TP8 + SP"]), usable).seq}


def _sp_words(result, s) -> str:
    sp = sp_at_model_size(result, s)
    return (f"SP's memory: its {_gb(sp['per_layer'] * LAYERS)} GB is two layers' worth. The {MODEL.name} model has "
            f"{sp['layers']} layers: {_gb(sp['model'])} GB more a GPU at {SEQ:,} tokens (no dropout masks here), "
            "and it grows with the sequence. On one node the estimator's longest sequence is "
            f"{sp['tp8']:,} tokens with TP 8 alone against {sp['tp8_sp']:,} with SP (lesson longest-sequence): "
            f"breaking the rule gives up {1 - sp['tp8'] / sp['tp8_sp']:.0%} of the length.")


def checks(result, s) -> list[Check]:
    f = {phase_of(r, role): figures(result, s, phase_of(r, role)) for r in RULES for role in ("breaks", "follows")}
    rule = {r.name: (f[phase_of(r, "breaks")], f[phase_of(r, "follows")]) for r in RULES}
    h, ffn = MODEL.hidden, MODEL.ffn_size
    # one layer's matrices, by hand: Q, K, V (the model's KV heads) and the output, the MLP (gated or not)
    d = h // MODEL.heads
    q, kv = MODEL.heads * d, MODEL.kv * d
    mlp_in = 2 * ffn if MODEL.gated else ffn
    layer_params = h * (q + 2 * kv) + q * h + h * mlp_in + ffn * h
    tp_across, tp_inside = rule["tp-inside-a-node"]
    sp_off, sp_on = rule["sp-with-tp"]
    cp_tp, cp = rule["cp-for-long-sequences"]
    pp_in, pp_across = rule["pp-across-nodes"]
    z0, z1 = rule["zero-1"]
    ep_broken, ep_kept = rule["ep-inside-a-node"]
    etp2, etp1 = rule["etp-1"]
    # GPU 0's expert-TP collectives in the ETP 2 run (the phase the rule's broken run is traced under)
    etp_calls = sum(1 for e in result.trace.events if e.phase == phase_of(next(r for r in RULES if r.name == "etp-1"), "breaks")
                    and e.group is not None and e.group.name == "expert-tp" and 0 in e.ranks)
    t, sbh2 = 8, SEQ * h * 2  # TP 8; one sequence's activation at 2 bytes a value
    return [
        check("TP 8 in each node sends across nodes only DP's gradient all-reduce: a ring of 2 makes each GPU "
              "send its gradients' bytes once, 16 GPUs x 2 layers x (their matrices / 8) x 2 bytes (within 1%: "
              "the norms' and biases' few values)", tp_inside["across"], WORLD * LAYERS * layer_params / 8 * 2,
              rtol=0.01),
        check("GPU 0's calls that cross nodes: every TP collective of TP 16 (dozens), against DP's one gradient "
              "all-reduce at TP 8",
              tp_across["crossing"] > 10 * tp_inside["crossing"], True),
        check("... so TP 16 takes longer on the clock, though it shares the same tokens' products over 16 GPUs",
              tp_across["ms"] > tp_inside["ms"], True),
        check("SP's bytes inside the node, by hand: TP alone's 8 ring passes of s x h a layer, plus backward's 2 "
              "re-gathers: 10/8 of TP alone's (within 1%: the norms' gradients SP sums)",
              sp_on["inside"], sp_off["inside"] * 10 / 8, rtol=0.01),
        check(f"SP keeps 32sbh/t of activations a layer where TP alone keeps sbh(8 + 24/t), without dropout's "
              f"masks: {(8 + 24 / t) / (32 / t):g}x at t = 8 (by hand; the post's 'about 3x')",
              sp_off["activations"] / sp_on["activations"], (8 + 24 / t) / (32 / t), rtol=1e-9),
        check("a pipeline across nodes sends across only its hand-offs: each of the 8 GPU pairs one SP slice "
              "of the activation forward (s/8 x h x 2 bytes) and its gradient back: 2 x s x h x 2 bytes in all",
              pp_across["across"], 2 * sbh2),
        check("the pipeline inside each node leaves TP's rings to cross: far more bytes across nodes",
              pp_in["across"] > 10 * pp_across["across"], True),
        check("EP 8 in each node sends across nodes only the experts' gradient sum over EDP 2: each of the 16 "
              "GPUs its 32 experts' two d x f matrices at 2 bytes, once (a ring of 2)",
              ep_kept["across"], WORLD * (MOE_E // 8) * 2 * MOE_D * MOE_F * 2),
        check("EP 16 over both nodes holds half the experts a GPU: Adam and its weights and gradients at 16 bytes "
              "a parameter, 16 experts against 32", [ep_broken["state"], ep_kept["state"]],
              [16 * n * 2 * MOE_D * MOE_F for n in (MOE_E // 16, MOE_E // 8)]),
        check(f"... and each of its 4 all-to-alls a micro-batch (dispatch and combine, forward and backward) crosses "
              f"the nodes: 4 x {MOE_MICRO}", ep_broken["crossing"], 4 * MOE_MICRO),
        check("a micro-batch's all-to-alls take less time at EP 8 in a node than at EP 16 over two",
              ep_break_even(result, s)[0] > 0, True),
        check("ETP 2 x EP 4 holds what ETP 1 x EP 8 holds a GPU: half of 64 experts is 32, at 16 bytes a "
              "parameter (weights, gradients, Adam), two d x f matrices an expert",
              [etp2["state"], etp1["state"]], [16 * (MOE_E // 8) * 2 * MOE_D * MOE_F] * 2),
        check("... and sends the same bytes across nodes: the experts' gradient sum over EDP 2 (a ring of 2), "
              "16 GPUs x 32 experts' worth x 2 d x f x 2 bytes",
              [etp2["across"], etp1["across"]], [WORLD * (MOE_E // 8) * 2 * MOE_D * MOE_F * 2] * 2),
        check(f"ETP 2's own collectives on GPU 0, with its pair: the received tokens swapped and the partial "
              f"outputs summed, forward and backward, 4 a micro-batch x {MOE_MICRO}", etp_calls, 4 * MOE_MICRO),
        check("... which send more bytes inside each node and take longer on the clock than ETP 1",
              [etp2["inside"] > etp1["inside"], etp2["ms"] > etp1["ms"]], [True, True]),
        check("ZeRO-1 sends the bytes of plain DP's all-reduce (a reduce-scatter and an all-gather)",
              z1["across"] + z1["inside"], z0["across"] + z0["inside"]),
        check("ZeRO-1 halves Adam's 12 bytes a parameter over DP 2", z1["optimizer"], z0["optimizer"] / 2),
        check(f"at {LONG // 1024}K tokens, CP 2 across the nodes sends fewer bytes across than TP 16 over them",
              cp["across"] < cp_tp["across"], True),
        check("... and takes less time on the clock", cp["ms"] < cp_tp["ms"], True),
        check(f"SP's memory over the whole model, by hand: L x s h (8 + 24/t - 32/t) bytes, L = "
              f"{get_model('27b').layers} (no dropout masks)", sp_at_model_size(result, s)["model"],
              get_model("27b").layers * SEQ * h * (8 + 24 / t - 32 / t)),
    ]


def plot_rules(lr, path: str) -> None:
    """Each rule's two runs side by side (render/plot_lessons.plot_broken_kept), from this run's figures."""
    s = study(lr.result)
    pairs = {r.says: (figures(lr.result, s, phase_of(r, "breaks")), figures(lr.result, s, phase_of(r, "follows")))
             for r in RULES}
    plot_broken_kept(pairs, lr.lesson.title, path)


NARRATIVE = {phase_of(r, role): r.broken_words if role == "breaks" else r.kept_words
             for r in RULES for role in ("breaks", "follows")}

LESSON = Lesson(
    name="rules-of-thumb", title="The rules of thumb, each broken and kept, at real size on the clock",
    section="Putting it together: rules of thumb",
    order=205,
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic", keep_values=0, events_shown=4,  # each run's first events; its tables say the rest
    picture=Picture(plot_rules, "each rule broken and kept: bytes across nodes, memory and time"),
    summary="TP inside a node, SP with TP, CP for long sequences, PP across nodes, EP inside a node, ETP 1, ZeRO-1: each "
            "rule's run beside the run that breaks it, in bytes, memory and milliseconds",
)

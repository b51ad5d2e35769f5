"""The 16-GPU MoE example with every parallelism at once, run for one training step, following the token
"contract" (t6 of sequence A) from its GPU through attention, the experts, the pipeline and the gradient sync."""
from __future__ import annotations

from fractions import Fraction
from math import prod

import numpy as np

from parasim.engine import run
from parasim.examples.quiz import Question
from parasim.lesson import Check, Knob, Lesson, Picture, Table, check, knob
from parasim.render.plot_moves import layout_command, plot_dispatch, token_routes
from parasim.examples.moe16 import LAYOUT, MOE16, REPLICAS, SEQUENCES, SHAPE, make_program, program_on
from parasim.examples.moe16_exact import agree, fingerprint
from parasim.examples.moe16_path import token_figures
from parasim.examples.moe16_unsplit import unsplit_run
from parasim.layout import preset

WATCH = ("A", SEQUENCES["A"].index("contract"))
# The post's step-1 picture (its claim, to set beside the schedule that ran): slots 1-3 of node A and B
POST_SLOTS = {"node A": ["F1", "F2", "backward work"], "node B": [".", "F1", "F2"]}
MAX_NORM = 1.0  # gradients clipped to this global norm before Adam (well below this step's norm: it clips)


def program(ctx):
    return make_program(WATCH, max_norm=MAX_NORM, routing=ctx.knobs.get("routing", "post"), residual=True)(ctx)


def unsplit(ctx, routing: str = "post"):
    """The same step on one device: all sequences, the whole gradient clipped by its own norm."""
    return unsplit_run(ctx, SHAPE, [s for rep in REPLICAS for s in rep], routing=routing, max_norm=MAX_NORM)


def on_layout(sizes: dict) -> tuple:
    """The same step on other layout sizes (`parasim check moe16 --reference-layout tp=1,pp=2,ep=2`)."""
    return program_on(sizes, max_norm=MAX_NORM)


def expected_positions(c: dict) -> list[int]:
    """The positions a GPU should hold between matmuls, in closed form: a contiguous CP split into halves,
    each halved again by SP, cuts the sequence into cp*tp equal blocks in (CP rank, TP rank) order."""
    layout = preset(LAYOUT)
    n = len(SEQUENCES[WATCH[0]]) // (layout.cp * layout.tp)
    block = c["cp"] * layout.tp + c["tp"]
    return list(range(block * n, (block + 1) * n))


def expected_experts(rank: int) -> list[int]:
    """The experts a GPU should hold, built directly: the experts laid out in EP-size rows, one contiguous
    block per EP rank, and the GPU's EP rank its place in its EP group."""
    layout = preset(LAYOUT)
    ep = next(g for g in layout.groups()["ep"] if rank in g)
    return np.arange(MOE16.experts).reshape(len(ep), -1)[ep.index(rank)].tolist()


def expected_home() -> tuple[int, list[int], int]:
    """From the layout alone: the rank that holds the watched token on the first stage (its sequence's DP
    replica, the CP half and SP share containing it), the positions it holds, and its pipeline partner."""
    layout = preset(LAYOUT)
    dp = next(i for i, rep in enumerate(REPLICAS) if WATCH[0] in rep)
    for c in layout.coords():
        pos = expected_positions(c)
        if c["pp"] == 0 and c["dp"] == dp and WATCH[1] in pos:
            partner = next(g for g in layout.groups()["pp"] if c["rank"] in g)[-1]
            return c["rank"], pos, partner
    raise AssertionError("no rank holds the watched token")


def stage_orders(result) -> dict[int, list[str]]:
    """Each GPU's pipeline work in the order it ran it, from the phases it entered: 'F1' for a forward of
    micro-batch 1 (its layers one after another), 'B1' for its backward."""
    orders: dict[int, list[str]] = {}
    for m in result.trace.marks:
        if m.kind == "phase" and m.data and "direction" in m.data:
            work = f"{m.data['direction'][0].upper()}{m.data['micro_batch']}"
            mine = orders.setdefault(m.rank, [])
            if not mine or mine[-1] != work:
                mine.append(work)
    return orders


def place_in_slots(orders: list[list[str]]) -> list[list[str]]:
    """Stages' work (in each stage's order) in slots, each piece in the first slot after its input is ready: a
    forward needs the stage before's forward of its micro-batch, a backward the stage after's backward (the
    last stage: its own forward, done before it); one piece a slot; '.' for a stage idle in a slot."""
    last, done, queues = len(orders) - 1, {}, [list(o) for o in orders]
    rows: list[list[str]] = [[] for _ in orders]
    slot = 0
    while any(queues):
        slot += 1
        if slot > 4 * sum(map(len, orders)):
            raise RuntimeError(f"the stages' orders {orders} wait on each other: no slot table")
        ran = []
        for s, queue in enumerate(queues):
            work = queue[0] if queue else None
            need = None if work is None else (
                (s - 1, "F" + work[1:]) if work[0] == "F" and s > 0
                else (s + 1, "B" + work[1:]) if work[0] == "B" and s < last else None)
            if work is not None and (need is None or done.get(need, slot) < slot):
                ran.append((s, work))
                rows[s].append(queue.pop(0))
            else:
                rows[s].append(".")
        done.update({r: slot for r in ran})
    return rows


def run_slots(result) -> tuple[dict[str, list[str]], bool]:
    """The slot table the run worked to, node by node (node A: the first stage), from the order each node's
    GPUs ran their work (`stage_orders`, placed by `place_in_slots`); and whether every GPU of a node ran
    the same order as its first."""
    stage = {r: x["coords"]["pp"] for r, x in enumerate(result.values)}
    orders = stage_orders(result)
    firsts = {s: orders[min(r for r in orders if stage[r] == s)] for s in sorted(set(stage.values()))}
    alike = all(orders[r] == firsts[stage[r]] for r in orders)
    rows = place_in_slots([firsts[s] for s in sorted(firsts)])
    return {f"node {chr(ord('A') + s)}": row for s, row in enumerate(rows)}, alike


def sent_in_slots(result) -> list[tuple[int, str, str]]:
    """Every pipeline hand-off as the run tagged it: (slot, sending node, the work that sent it: 'F1' sends an
    activation on, 'B1' a gradient back), from each send's slot tag and the phase it was sent in."""
    fields = {m.text: m.data for m in result.trace.marks if m.kind == "phase" and m.data}
    stage = {r: x["coords"]["pp"] for r, x in enumerate(result.values)}
    out = set()
    for e in result.trace.events:
        if e.kind == "p2p" and e.group is not None and e.group.name == "pp" and e.tags and "slot" in e.tags:
            d = fields[e.phase]
            work = f"{d['direction'][0].upper()}{d['micro_batch']}"
            out.add((e.tags["slot"], f"node {chr(ord('A') + stage[e.params['src']])}", work))
    return sorted(out)


def schedule_beside_the_post(result) -> list[Check]:
    """The slot table the run worked to (1F1B over 2 stages, 2 micro-batches) set beside the post's step-1
    picture, and why they differ, worked out from the dependencies: a backward on node A needs node B's gradient;
    and the run's own slot tags on its hand-offs, against the table."""
    ran, alike = run_slots(result)
    first_back = 1 + ran["node A"].index(next(a for a in ran["node A"] if a.startswith("B")))
    # by hand: A's F1 in slot 1, B's F1 in 2 (it needs A's), B's B1 in 3 (it needs its F1), A's B1 in 4
    return [
        check("the slot table the run worked to, slots 1-6 (1F1B, 2 stages, 2 micro-batches; the tables "
              "set it beside the post's picture): every GPU of a node ran its work in one order", [ran, alike],
              [{"node A": ["F1", "F2", ".", "B1", ".", "B2"], "node B": [".", "F1", "B1", "F2", "B2", "."]}, True]),
        check(f"the post's 'backward work' on node A in slot 3 cannot run: the first gradient reaches node A "
              f"in slot {first_back} (node B's first backward ends in slot {first_back - 1}); node B's row in "
              "the post (F2 in slot 3) is GPipe's order, 1F1B runs B1 there", first_back, 4),
        check("each hand-off's slot, as the run tagged its send, is the slot the table gives the work that sent it",
              sent_in_slots(result),
              sorted((slot, node, work) for node, row in ran.items() for slot, work in enumerate(row, 1)
                     if (node, work[:1]) in (("node A", "F"), ("node B", "B")))),
    ]


def slot_table(result) -> Table:
    """The slots of step 1: the run's, node by node, beside the post's picture; why the post's third slot cannot
    be as drawn, from the run's table."""
    ran, _ = run_slots(result)
    width = max(len(row) for row in ran.values())
    gpus = {f"node {chr(ord('A') + s)}": [r for r, x in enumerate(result.values) if x["coords"]["pp"] == s]
            for s in range(len(ran))}
    rows = [(f"{node}, the run (g{gpus[node][0]}-g{gpus[node][-1]})", row) for node, row in ran.items()]
    rows += [(f"{node}, the post", [*row, *[""] * (width - len(row))]) for node, row in POST_SLOTS.items()]
    back_a = 1 + next(i for i, a in enumerate(ran["node A"]) if a.startswith("B"))
    back_b = 1 + next(i for i, a in enumerate(ran["node B"]) if a.startswith("B"))
    mb = ", ".join(f"{i + 1}: {' and '.join(rep[i] for rep in REPLICAS)}" for i in range(len(REPLICAS[0])))
    return Table("Step 1's pipeline slots: the run's (each node's work in the order its GPUs ran it) and the post's",
                 ["node", *[f"slot {i + 1}" for i in range(width)]], rows,
                 notes=[f"F1: a forward of micro-batch 1 through the node's layers, B1 its backward; '.': idle. "
                        f"Micro-batches (a sequence per DP replica) {mb}. The post draws slots 1-3.",
                        f"post / run / why: the post puts backward work on node A in slot 3, but node A's first "
                        f"backward needs node B's gradient, which node B sends at the end of slot {back_b}: the "
                        f"run's first backward on node A is in slot {back_a}. The post's node B runs "
                        f"{POST_SLOTS['node B'][2]} in slot 3 (every forward first, as GPipe does); the run's 1F1B "
                        f"runs {ran['node B'][2]} there."])


# the axes of the post's one-table summary: (what it is called there, the group the engine names, what it splits)
AXES = (("DP + ZeRO-1", "dp-cp", "the batch; Adam's state over the copies"), ("PP", "pp", "the layers"),
        ("TP + SP", "tp", "attention weights by heads; tokens between matmuls"),
        ("CP", "cp", "tokens through attention"), ("EP", "ep", "the experts"),
        ("ETP", "expert-tp", "each expert's matrices"), ("EDP", "expert-dp", "copies of the experts"))


# -- step 5: whose gradients are summed with whose, and what crosses nodes ------------------------------------
SYNC = "gradient sync"  # the step's phase where the gradients are summed (examples/moe16.py's Phases)
# The post's step-5 table (its claim, set beside the groups the run summed over): weights of stage 1 -> the
# group the post sums their gradients over, in its words, and that group's GPUs
POST_SUMS = {"attention heads 1-2": ("DP x CP", (0, 2, 4, 6)), "attention heads 3-4": ("DP x CP", (1, 3, 5, 7)),
             "experts E1 E2": ("EDP", (0, 4)), "experts E3 E4": ("EDP", (1, 5)),
             "norms and router": ("TP x CP x DP", tuple(range(8)))}


def post_group(weights: str) -> str:
    """The post's group for a weight of its step-5 table, as it writes it ('DP x CP {g0,g2,g4,g6}'); '-' where
    the post's table has no row for it."""
    if weights not in POST_SUMS:
        return "-"
    words, ranks = POST_SUMS[weights]
    return f"{words} {{{_gpus(ranks)}}}"
_OP = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter"}


def _gpus(ranks) -> str:
    """g0,g2,g4,g6; g0-g7 for three or more consecutive GPUs."""
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"g{ranks[0]}-g{ranks[-1]}"
    return ",".join(f"g{r}" for r in ranks)


def gradient_sums(result, stage: int = 0) -> list[dict]:
    """Step 5 as the run did it, for one pipeline stage: each kind of weight the stage's GPUs hold (attention by
    TP rank, experts by EP rank, the norms and router every GPU holds whole), the GPUs holding a copy, and the
    collectives of the gradient sync phase that sum its gradients (dense weights: those over dp-cp, the norms and
    router first over their TP pair; experts: those over expert-dp) with every GPU whose gradient reaches the sum:
    the union of those collectives' groups that hold a copy. Each collective's numbers in per GPU ride along."""
    v, lay, m = result.values, preset(LAYOUT), MOE16
    mine = [r for r, x in enumerate(v) if x["coords"]["pp"] == stage]
    sync = [e for e in result.trace.events if e.phase == SYNC and e.kind == "collective" and e.op in _OP]
    heads = m.heads // lay.tp

    def summed(copies: list[int], axes: tuple[str, ...]) -> dict:
        calls = [e for a in axes for e in sync if e.group.name == a and set(e.ranks) & set(copies)]
        used = list(dict.fromkeys((_OP[e.op], e.group.name) for e in calls))
        sizes = {name: sorted({prod(t.shape) for e in calls if e.group.name == name for mb in e.members
                               for t in mb.ins}) for _, name in used}
        return {"copies": copies, "how": used, "over": sorted({r for e in calls for r in e.ranks}), "sizes": sizes}

    rows = []
    for t in range(lay.tp):
        copies = [r for r in mine if v[r]["coords"]["tp"] == t]
        rows.append({"weights": f"attention heads {t * heads + 1}-{(t + 1) * heads}", **summed(copies, ("dp-cp",))})
    for experts in dict.fromkeys(tuple(v[r]["experts"][0]) for r in mine):
        copies = [r for r in mine if tuple(v[r]["experts"][0]) == experts]
        rows.append({"weights": "experts " + " ".join(f"E{e + 1}" for e in experts), **summed(copies, ("expert-dp",))})
    rows.append({"weights": "norms and router", **summed(mine, ("tp", "dp-cp"))})
    return rows


def gradient_table(result) -> Table:
    """The post's step-5 table from the run: for stage 1, each weight, the GPUs with a copy, the collectives of
    the gradient sync that sum it and the GPUs they sum over, beside the post's group."""
    rows = gradient_sums(result)
    st = result.values[rows[0]["copies"][0]]["stores"]
    body = [(r["weights"], [_gpus(r["copies"]), ", then ".join(f"{op} ({g})" for op, g in r["how"]),
                            _gpus(r["over"]), post_group(r["weights"])]) for r in rows]
    dense = next(r for r in rows if r["weights"] == "norms and router")["sizes"]
    expert = next(r for r in rows if r["weights"].startswith("experts"))["sizes"]["expert-dp"]
    b = gradient_sums(result, stage=1)
    return Table("Step 5: whose gradients are summed with whose (node A, layers 1-2), from the run's gradient sync",
                 ["weights", "copies on", "the run sums them by", "over", "the post's group"], body,
                 notes=[f"numbers each GPU puts in: the tp all-reduce {dense['tp'][0]} (norms and router: "
                        f"{st['whole copies']} whole copies), the dp-cp reduce-scatter {dense['dp-cp'][0]} ("
                        f"attention shards {st['tp shards']} + norms and router {st['whole copies']}), the "
                        f"expert-dp reduce-scatter {expert[0]} (its experts: {st['experts']}); 'the post' "
                        "lists E1-E4 only.",
                        "node B (layers 3-4) does the same over its own GPUs: "
                        + "; ".join(f"{r['weights']} over {_gpus(r['over'])}" for r in b[:1] + b[-1:]) + "."])


def crossing_table(result) -> Table:
    """Bytes the whole step sent inside a node and across nodes, per group (each byte on the hop that carried it,
    comm/hops.py), nodes of the layout's GPUs a node."""
    lay = preset(LAYOUT)
    by = result.trace.bytes_by_link(lay.gpus_per_node)
    order = [axis for _, axis, _ in AXES if axis in by] + [g for g in by if g not in {a for _, a, _ in AXES}]
    across = {g: row["across"] for g, row in by.items() if row["across"]}
    words = {**{axis: f"{name} ({axis})" for name, axis, _ in AXES}, "world": "world (the clip's norm)"}
    clip = across.get("world", 0)
    data = {g: n for g, n in across.items() if g != "world"}
    return Table(f"Bytes by link, the whole step (nodes of {lay.gpus_per_node} GPUs: node A g0-g7, node B g8-g15)",
                 ["group", "inside a node (NVLink)", "across nodes (InfiniBand)"],
                 [(words.get(g, g), [by[g]["inside"], by[g]["across"]]) for g in order],
                 notes=["only " + " and ".join(sorted(data)) + f" carries the step's data between the nodes "
                        f"({sum(data.values()):,} B, its hand-offs); every other group lies inside one node"
                        + (f", but for the gradient clip's one all-reduce over all {result.world} GPUs, whose ring "
                           f"crosses with {clip} B of squared norms" if clip else "") + "."])


def tables(result) -> list[Table]:
    """The post's one-table summary and "what g2 stores", read from the run: each axis's group around the
    GPU holding 'contract', the collectives it joined and the bytes it sent; what it keeps, as a share."""
    trace, v = result.trace, result.values
    notes = [m for m in trace.marks if m.kind == "note" and m.data and "watch" in m.data]
    g = notes[0].rank if notes else 2
    groups = preset(LAYOUT).groups()
    rows = []
    for name, axis, splits in AXES:
        mine = next(list(grp) for grp in groups[axis] if g in grp)
        joined: dict[str, int] = {}
        sent = 0
        for e in trace.events:
            if e.kind != "compute" and e.group.name == axis and g in e.ranks:
                joined[e.op] = joined.get(e.op, 0) + 1
                sent += e.member(g).sent
        ops = ", ".join(f"{op.replace('_', '-')} x{n}" for op, n in joined.items()) or "none"
        rows.append((name, [len(mine), " ".join(f"g{r}" for r in mine), ops, sent]))
    m, lay = MOE16, preset(LAYOUT)
    attention, experts = 4 * m.hidden ** 2 * m.layers, m.experts * 2 * m.hidden * m.ffn * m.layers
    st = v[g]["stores"]
    stores = [("attention weights (its TP shards)", [st["tp shards"], f"{Fraction(st['tp shards'], attention)} of all"]),
              ("norms and router (whole copies)", [st["whole copies"], f"layers of its stage ({m.layers // lay.pp} of {m.layers})"]),
              ("experts " + ", ".join(f"E{e + 1}" for e in v[g]["experts"][0]),
               [st["experts"], f"{Fraction(st['experts'], experts)} of all"]),
              ("Adam state (its ZeRO-1 share)", [st["optimizer"], f"1/{lay.dp * lay.cp} of its stage's dense, "
                                                                   f"1/{lay.edp} of its experts'"]),
              ("tokens between matmuls (SP)", [len(st["tokens between matmuls"]), _tokens(st["tokens between matmuls"])]),
              ("tokens inside attention (CP)", [len(st["tokens in attention"]), _tokens(st["tokens in attention"])])]
    return [Table(f"Every parallelism of the example, as g{g} (holding 'contract') meets it in one step",
                  ["axis", "size", f"g{g}'s group", "collectives it joined", "bytes sent"], rows,
                  notes=["what each splits: " + " | ".join(f"{name}: {splits}" for name, _, splits in AXES),
                         f"post / run / why: the post gives DP's group as its {lay.dp} replicas; the run sums dense "
                         f"gradients over dp-cp, DP {lay.dp} x CP {lay.cp} = {lay.dp * lay.cp} GPUs, because the "
                         "CP ranks hold the same weights as well (each saw other tokens of the same sequences)."]),
            Table(f"What g{g} stores", ["what", "values", "share"], stores,
                  notes=["values: numbers kept (weights in the run's float64; a training run keeps them in bf16); "
                         "share: of the whole model's attention or expert weights."]),
            _map_table(v), slot_table(result), gradient_table(result), crossing_table(result)]


def _map_table(v: list[dict]) -> Table:
    """The post's map, node by node: each GPU's coordinates on every axis as the run gave them, the sequences
    its DP replica trains on, the tokens it holds inside attention (CP's share) and between the products (SP's
    half of it), and the experts it keeps."""
    rows = []
    for r, x in enumerate(v):
        c, st = x["coords"], x["stores"]
        experts = " ".join(f"E{e + 1}" for e in x["experts"][0])
        rows.append((f"g{r}", ["A" if c["pp"] == 0 else "B", f"{c['dp']} ({' '.join(REPLICAS[c['dp']])})", c["cp"],
                               c["tp"], _span(st["tokens in attention"]), _span(st["tokens between matmuls"]),
                               c["ep"], experts]))
    return Table("The map: what every GPU holds, node A (layers 1-2) and node B (layers 3-4)",
                 ["GPU", "node", "DP replica (seqs)", "CP rank", "TP rank", "tokens in attention",
                  "between matmuls", "EP rank", "experts"], rows,
                 notes=["every cell is the run's: the GPU's coordinates, and the tokens and experts it held; tokens "
                        "are positions of its replica's sequences (t1-t4: the first half, CP rank 0's)."])


def _span(numbers: list[int]) -> str:
    """t5-t8, or t5 t7 for tokens that are not next to each other."""
    if numbers == list(range(numbers[0], numbers[0] + len(numbers))) and len(numbers) > 2:
        return f"t{numbers[0]}-t{numbers[-1]}"
    return " ".join(f"t{n}" for n in numbers)


def _tokens(numbers: list[int]) -> str:
    """'t5 (the) t6 (contract)': token numbers (from 1) with their words."""
    words = SEQUENCES[WATCH[0]]
    return " ".join(f"t{n} ({words[n - 1]})" for n in numbers)


def checks(result) -> list[Check]:
    v = result.values
    routing = knob(result, "routing", "post")
    ref = run(lambda ctx: unsplit(ctx, routing), 1).values[0]
    norms = [m.data for m in result.trace.marks if m.kind == "note" and m.data and "grad_norm" in m.data]
    grads, weights = fingerprint(v, "grad_sq", False, SHAPE), fingerprint(v, "weight_sq", True, SHAPE)
    notes = [m for m in result.trace.marks if m.kind == "note" and m.data and "watch" in m.data]
    holder = notes[0].rank if notes else None
    routed = [m for m in notes if m.data["watch"] == "route"]
    home, pos, partner = expected_home()
    layout = preset(LAYOUT)
    words, per, groups = SEQUENCES[WATCH[0]], MOE16.layers // layout.pp, layout.groups()
    return [
        check("the GPU holding 'contract' and its neighbour, against the layout's map",
              [holder, [words[p] for p in v[holder]["positions"]]], [home, [words[p] for p in pos]]),
        check("it is routed in every layer: on that GPU for stage 1's layers, on its pipeline partner after",
              [(m.rank, f"layer {m.data['layer']}") for m in routed],
              [(home if i < per else partner, f"layer {i + 1}") for i in range(MOE16.layers)]),
        check("token positions each GPU holds between matmuls: its CP half (contiguous), then its SP share of "
              "that", [x["positions"] for x in v], [expected_positions(c) for c in layout.coords()]),
        check("experts each GPU holds in each of its layers (found from their weights): contiguous blocks of "
              f"{MOE16.experts // layout.ep} in EP order", [x["experts"] for x in v],
              [[expected_experts(r)] * per for r in range(layout.world)]),
        check("the loss of all 32 tokens equals the unsplit model's", sum(x["loss"] for x in v if x["last"]),
              ref["loss"], rtol=1e-12),
        check("every weight's gradient, summed over dp-cp and expert-dp, equals the unsplit model's "
              "(sum of squares, relative 1e-9)", agree(grads, ref["grad_sq"], 1e-9),
              f"{len(ref['grad_sq'])} of {len(ref['grad_sq'])} weights"),
        check("the global gradient norm, each weight counted once (dense pieces over dp-cp, experts over "
              "expert-dp, TP copies of norms and router once), equals the unsplit model's",
              [n["grad_norm"] for n in norms], [ref["grad_norm"]], rtol=1e-12),
        check(f"clipped to norm {MAX_NORM:g}: every gradient scaled by max_norm / norm before Adam",
              [n["clip_coef"] for n in norms], [MAX_NORM / (ref["grad_norm"] + 1e-6)], rtol=1e-12),
        check("every weight after the clipped ZeRO-1 Adam step equals the unsplit model's after the same step",
              agree(weights, ref["weight_sq"], 1e-9), f"{len(ref['weight_sq'])} of {len(ref['weight_sq'])} weights"),
        check("its GPU keeps Adam state for 1/|dp-cp| of its dense weights and 1/|expert-dp| of its experts'",
              [v[home]["state"][w][0] / v[home]["state"][w][1] for w in ("dense", "expert")],
              [1 / len(groups[k][0]) for k in ("dp-cp", "expert-dp")], atol=0.01),
        check("all-to-alls: 4 per MoE layer (dispatch, combine, and both backward) per micro-batch per EP group",
              sum(1 for e in result.trace.events if e.op == "all_to_all"),
              len(groups["ep"]) * per * len(REPLICAS[0]) * 4),
        check("after each MoE layer the token's output is itself (the residual) plus the experts' gate-weighted "
              "share, summed: the largest difference from that sum, and the gates, as the run noted them",
              [[d["layer"], d["gap"], d["gates"]] for _, _, _, d in result.trace.notes("residual")],
              [[r.data["layer"], 0.0, r.data["gates"]] for r in routed]),
        *schedule_beside_the_post(result),
        *sums_and_links(result),
    ]


def sums_and_links(result) -> list[Check]:
    """Step 5 and the links: on both stages, each weight's gradients are summed over exactly the GPUs holding a
    copy of it; the bytes that cross between the nodes are all of PP's hand-offs and the clip norm's all-reduce,
    whose ring (member i sends only to member i + 1) crosses on the hops from the last GPU of a node."""
    rows = gradient_sums(result) + gradient_sums(result, stage=1)
    lay = preset(LAYOUT)
    per = lay.gpus_per_node
    by = result.trace.bytes_by_link(per)
    pp = sum(m.sent for e in result.trace.events if e.group is not None and e.group.name == "pp" for m in e.members)
    ring = [e for e in result.trace.events if e.group is not None and e.group.name == "world"]
    clip = sum(m.sent for e in ring for m in e.members if m.rank % per == per - 1)
    return [
        check("each weight's gradients (both stages: attention by TP rank, experts by EP rank, norms and router) are "
              "summed over exactly the GPUs holding a copy of it, by the gradient sync's collectives",
              [[r["weights"], r["over"]] for r in rows], [[r["weights"], r["copies"]] for r in rows]),
        check("bytes that cross between the nodes, by group: all of PP's hand-offs, and the clip norm's all-reduce "
              "over all GPUs on its two hops between the nodes",
              {g: row["across"] for g, row in by.items() if row["across"]}, {"pp": pp, "world": clip}),
    ]


def neighbours(lr) -> dict[str, list[dict]]:
    """The routes of the other tokens on the followed token's GPU (the post's "the", t5, beside "contract"), by
    their words: the same step run again watching each of them (the run is the same; only the notes differ)."""
    holds = next(d for _, _, _, d in lr.result.trace.notes("watch") if d.get("watch") == "holds")
    routing, words = knob(lr.result, "routing", "post"), SEQUENCES[WATCH[0]]
    out = {}
    for p in holds["positions"]:
        if p - 1 != WATCH[1]:
            prog = make_program((WATCH[0], p - 1), max_norm=MAX_NORM, routing=routing)
            out[words[p - 1]] = token_routes(run(prog, lr.result.world, seed=lr.lesson.seed).trace)
    return out


def picture(lr, path: str) -> None:
    """The lesson's picture: the layout the run used on top, then the token's routes (render/plot_moves.py), its
    neighbour's beside them."""
    plot_dispatch(lr, path, layout=preset(LAYOUT), others=neighbours(lr))


def figures(result) -> dict:
    """Where the followed token lives and which experts (on which GPUs) take it, per layer."""
    return token_figures(result.trace)


def quiz(result) -> list[Question]:
    """Where "contract" goes in its first MoE layer: which GPUs its two experts live on, asked before the walk
    shows the dispatch, answered by the route the run's router took (the note its GPU left)."""
    notes = result.trace.notes("watch")
    home = next(r for _, r, _, d in notes if d["watch"] == "holds")
    first = min((d for _, _, _, d in notes if d["watch"] == "route"), key=lambda d: d["layer"])
    gpus, ep = ", ".join(f"g{g}" for g in sorted(set(first["gpus"]))), preset(LAYOUT).ep
    picks = " and ".join(f"E{e} (gate {w:.2f}) on g{g}" for e, g, w in zip(first["experts"], first["gpus"],
                                                                             first["gates"]))
    return [Question(
        f"Layer {first['layer']}: 'contract' sits on g{home}, and its router picks {SHAPE.top_k} of the layer's "
        f"{SHAPE.experts} experts (EP {ep}: {SHAPE.experts // ep} experts a GPU). Which GPUs run its experts? "
        "(GPU names, e.g. g0, g3)",
        gpus, "",
        f"the router picks {picks}: each GPU holding one of them runs it on the token, once however many of "
        f"them it holds; the dispatch sends the token to each of those GPUs but its own (where it stays)")]


NARRATIVE = {
    "data": """
        Sixteen GPUs, two nodes. Layers 1-2 live on node A and 3-4 on node B (PP 2). Within a node, DP picks
        the sequences (replica 0: A and B, replica 1: C and D), CP picks the half of the sequence, and TP
        the attention heads; between matmuls SP splits each half again between the TP pair. `%s
        --plot FILE.png` draws this layout on its own; the lesson's picture (`--plot`) draws it with the GPUs
        holding the token and its hand-off, then its dispatch and combine. So the token "contract", t6 of
        sequence A, lives on exactly one GPU of node A: g2. The two micro-batches run 1F1B; the tables at the
        end set the slot table the run worked to beside the post's step-1 picture, whose third slot cannot
        be as drawn.""" % layout_command(preset(LAYOUT)),
    "forward mb1 layer 1": """
        Attention: the TP pair all-gathers its half of the sequence (g2 and g3 both see t5-t8), the CP ring
        brings K and V of t1-t4 from g0, and the row-parallel output is reduce-scattered back into SP
        shares. Then the MoE: g2's router picks two experts for each of its tokens; the dispatch all-to-all
        over the EP group g0-g3 sends each token once to every GPU owning one of its experts, the experts run
        batched, and the combine all-to-all brings the gate-weighted outputs home, where they are added to
        the token itself: the residual, so the layer's output is the token plus its experts' share (the note
        after the route gives both terms' sizes in this run). The settings line says
        who picks a token's experts: by default the post's drawing, its sentence taking the experts the
        post draws for it (every other token keeps the router's choice), and the run stays exact against
        one device doing the same; with `--routing learned` every token, "contract" too, follows this
        run's own router weights.""",
    **{f"forward mb{mb} layer {i}": "Layer %d of micro-batch %d: the same collectives as layer 1, on %s." % (
        i, mb, "node A" if i <= 2 else "node B, which received the activations from node A by point-to-point")
       for mb in (1, 2) for i in (1, 2, 3, 4) if (mb, i) != (1, 1)},
    **{f"backward mb{mb} layer {i}": """
        Backward of layer %d, micro-batch %d: the forward's path in reverse. The combine's all-to-all sends
        output gradients out to the experts and the dispatch's brings input and gate gradients home; the TP
        pair swaps all-gather and reduce-scatter; the CP ring passes K/V and their gradients.""" % (i, mb)
       for mb in (1, 2) for i in (1, 2, 3, 4)},
    "gradient sync": """
        Backward retraced the same path in reverse. Now each weight's gradient is summed over the GPUs that
        hold a copy and saw different tokens. The norms and the router are whole on both GPUs of a TP pair,
        but with SP each saw only its own tokens: one all-reduce over the pair, once for the whole step,
        then the sum over dp-cp, so all 8 GPUs of the stage take part. Attention's shards are summed over
        dp-cp (4 GPUs), each expert over expert-dp (2 GPUs). Get either group wrong and training is
        silently wrong. With ZeRO-1 the sum is a reduce-scatter: each GPU receives the summed gradient for
        its share only. Before Adam the gradients are clipped by one norm over the whole model: each GPU adds
        the squares of the pieces only it holds (a norm or router weight, whole on both GPUs of a TP pair,
        is counted on one of them), one all-reduce over all 16 GPUs adds those up, and every share is scaled
        by the same factor, as one device would. Each GPU then keeps Adam's state for its share (a quarter
        of the dense weights, half of its experts'), updates it, and an all-gather hands every copy the new
        weights. The tables at the end set the groups these collectives ran on beside the post's step-5
        table, and count each group's bytes inside a node and between the nodes.""",
}

LESSON = Lesson(name="moe16", title="One token through TP, SP, CP, EP, PP and DP on 16 GPUs", world=16, worlds=(16,),
                section="One example with everything: an MoE model on 16 GPUs",
                order=230,
                picture=Picture(picture, "the layout with the followed token's GPUs and hand-off, then its "
                                         "dispatch and combine (the residual added back)"),
                program=program, narrative=NARRATIVE, checks=checks,
                summary="the post's 16-GPU MoE layout, one training step; parasim trace follows a token",
                keep_values=0, reference=unsplit, on_layout=on_layout, fold_alike=True,
                knobs={"routing": Knob("post", choices=("post", "learned"))}, tables=tables, figures=figures,
                quiz=quiz)

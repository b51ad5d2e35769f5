"""MoE Parallel Folding: attention and the MoE layer laid out two ways over the same 8 GPUs. The 16-GPU
example's model (4 layers, 8 experts, top 2) on attention TP 2 x DP 4 and MoE ETP 1 x EP 8 x EDP 1, SP on,
one pipeline stage, the four sequences spread over the four DP replicas, one training step. Each GPU holds
half of the attention weights and one whole expert; the TP pairs' collectives run inside a pair, the MoE
all-to-all over all 8 GPUs, and the step is checked against the unsplit model."""

from __future__ import annotations

from fractions import Fraction

from parasim.examples.moe16 import MOE16, SEQUENCES, make_program, program_on, replicas
from parasim.examples.moe16_exact import exactness
from parasim.examples.moe16_unsplit import unsplit_run
from parasim.layout import Layout
from parasim.lesson import Check, Lesson, Table, check

WATCH = ("A", SEQUENCES["A"].index("contract"))
LAYOUT = Layout(tp=2, cp=1, pp=1, dp=4, ep=8, etp=1, sp=True, zigzag=False, model=MOE16)
M = 4 // LAYOUT.dp  # the example's four sequences over the four DP replicas: one micro-batch each
ROUTING = "post"  # the post's drawn experts for its sentence (contract: E3 and E8), the router's for the rest
DENSE, EXPERT = ("tp", "dp-cp"), ("ep", "expert-tp", "expert-dp")  # the groups of each layout


def program(ctx):
    return make_program(WATCH, LAYOUT, M, routing=ROUTING)(ctx)


def reference(ctx):
    """The same step on one device, for `parasim check`: every sequence, the whole model."""
    return unsplit_run(ctx, MOE16, [s for rep in replicas(LAYOUT.dp, M) for s in rep], routing=ROUTING)


def on_layout(sizes: dict) -> tuple:
    """The same step on other layout sizes (`parasim check folding --reference-layout tp=1,dp=8,ep=8`)."""
    return program_on(sizes, routing=ROUTING)


def study(result) -> dict:
    """Read from the run: each GPU's groups (the groups of the collectives it joined, by name), its coords, the
    expert it holds, what it stores; each group name's collectives and bytes; the step held to the unsplit
    model."""
    trace, v = result.trace, result.values
    member: dict[int, dict[str, tuple]] = {r: {} for r in range(result.world)}
    ops: dict[tuple[str, str], dict] = {}
    for e in trace.events:
        if e.kind == "compute" or e.group is None:
            continue
        for r in e.ranks:
            member[r].setdefault(e.group.name, tuple(e.group.ranks))
        row = ops.setdefault((e.group.name, e.op), {"sizes": set(), "groups": set(), "events": 0, "bytes": 0})
        row["sizes"].add(len(e.group.ranks))
        row["groups"].add(tuple(e.group.ranks))
        row["events"] += 1
        row["bytes"] += sum(m.sent for m in e.members)
    notes = trace.notes("watch")
    holder = next(r for _, r, _, d in notes if d["watch"] == "holds")
    route = next(d for _, _, _, d in notes if d["watch"] == "route" and d["layer"] == 1)
    return {
        "member": member,
        "ops": ops,
        "holder": holder,
        "route": route,
        "coords": [x["coords"] for x in v],
        "experts": [x["experts"] for x in v],
        "stores": [x["stores"] for x in v],
        "exact": exactness(v, LAYOUT, M, routing=ROUTING),
    }


def _g(ranks) -> str:
    return " ".join(f"g{r}" for r in ranks)


def tables(result, s) -> list[Table]:
    reps = replicas(LAYOUT.dp, M)
    gpus = []
    for r in range(result.world):
        c, mine = s["coords"][r], s["member"][r]
        gpus.append(
            (
                f"g{r}",
                [
                    _g(mine["tp"]),
                    c["tp"],
                    f"{c['dp']} ({', '.join(reps[c['dp']])})",
                    _g(mine["dp-cp"]),
                    c["ep"],
                    " ".join(sorted({f"E{e + 1}" for layer in s["experts"][r] for e in layer})),
                    _g(mine["ep"]),
                ],
            )
        )
    m = MOE16
    attention, experts = 4 * m.hidden**2 * m.layers, m.experts * 2 * m.hidden * m.ffn * m.layers
    st = s["stores"][s["holder"]]
    holds = [
        ("attention weights (its TP shard)", [st["tp shards"], attention, str(Fraction(st["tp shards"], attention))]),
        ("expert weights (its EP share, whole)", [st["experts"], experts, str(Fraction(st["experts"], experts))]),
    ]
    said = {
        "tp": "the TP pair: attention's all-gathers and reduce-scatters (SP), forward and backward; the "
        "norms' and router's gradients summed once",
        "ep": "all eight GPUs: the dispatch and combine all-to-alls of every MoE layer, forward and backward",
        "dp-cp": "the four replicas of a TP rank: dense gradients reduce-scattered (ZeRO-1), new weights all-gathered",
        "expert-dp": "one GPU each (EDP 1): the experts' gradient sum and weight gather, with nothing to send",
    }
    runs = []
    for name in ("tp", "ep", "dp-cp", "expert-dp"):
        mine = {op: row for (g, op), row in s["ops"].items() if g == name}
        sizes = sorted({n for row in mine.values() for n in row["sizes"]})
        groups = {grp for row in mine.values() for grp in row["groups"]}
        calls = ", ".join(f"{op.replace('_', '-')} x{row['events']}" for op, row in sorted(mine.items()))
        runs.append((name, [" / ".join(map(str, sizes)), len(groups), calls, sum(r["bytes"] for r in mine.values())]))
    return [
        Table(
            "Two layouts over the same 8 GPUs: attention TP 2 x DP 4, MoE ETP 1 x EP 8 x EDP 1",
            [
                "GPU",
                "TP pair",
                "TP rank",
                "DP replica (sequence)",
                "attention's gradient group",
                "EP rank",
                "expert",
                "its all-to-all group",
            ],
            gpus,
            notes=[
                "every column is read from the run: the groups of the collectives each GPU joined, its "
                "coordinates, and the expert whose weights it holds; the TP pairs are next-door GPUs "
                "(Megatron's order: TP fastest), the EP group is all eight."
            ],
        ),
        Table(
            f"What g{s['holder']} (holding 'contract') stores, against the whole model (values, 4 layers)",
            ["weights", "values on the GPU", "whole model", "share"],
            holds,
            notes=[
                "attention: q, k, v and the output projection, 4h^2 a layer, split over the TP pair; "
                "experts: 8 of them, two h x f matrices each, one whole expert on each GPU. Every GPU "
                "stores the same amounts."
            ],
        ),
        Table(
            "The groups the step's collectives ran on (bytes: all GPUs together, float64)",
            ["group", "GPUs a group", "groups", "collectives", "bytes"],
            runs,
            notes=[f"{name}: {what}" for name, what in said.items()],
        ),
    ]


def checks(result, s) -> list[Check]:
    L, world, m = LAYOUT, result.world, MOE16
    # by hand: TP fastest (Megatron's tp-cp-dp order), so pairs of neighbours; the data-parallel copies of a
    # TP rank stride by 2; the EP group spans the world (EP = world), each GPU its own expert group of one
    pairs = [tuple(range(2 * (r // 2), 2 * (r // 2) + 2)) for r in range(world)]
    copies = [tuple(range(r % 2, world, 2)) for r in range(world)]
    ops = s["ops"]
    return [
        check(
            "the folding identity, from the layout: TP x CP x DP = ETP x EP x EDP = the GPUs",
            [L.tp * L.cp * L.dp, L.etp * L.ep * L.edp],
            [world, world],
        ),
        check(
            "each GPU's TP pair, from the collectives it joined", [s["member"][r]["tp"] for r in range(world)], pairs
        ),
        check(
            "each GPU's dense-gradient group (DP 4), from the collectives it joined",
            [s["member"][r]["dp-cp"] for r in range(world)],
            copies,
        ),
        check(
            "every all-to-all runs over all 8 GPUs, across the 4 DP replicas",
            sorted(ops[("ep", "all_to_all")]["groups"]),
            [tuple(range(world))],
        ),
        check(
            "the TP pairs' all-gathers and reduce-scatters run inside a pair, never across one",
            [sorted(ops[("tp", op)]["groups"]) for op in ("all_gather", "reduce_scatter")],
            [sorted(set(pairs))] * 2,
        ),
        check(
            "the expert each GPU holds, in every layer (found from its weights): GPU r holds expert r (E1 on g0, counted from 0 here)",
            s["experts"],
            [[[r]] * m.layers for r in range(world)],
        ),
        check(
            "attention values a GPU stores: 4h^2 x layers / 2",
            [x["tp shards"] for x in s["stores"]],
            [4 * m.hidden**2 * m.layers // 2] * world,
        ),
        check(
            "expert values a GPU stores: 8 experts x 2hf x layers / 8",
            [x["experts"] for x in s["stores"]],
            [m.experts * 2 * m.hidden * m.ffn * m.layers // 8] * world,
        ),
        check(
            "expert gradients are summed over EDP 1: groups of one GPU, no byte sent",
            [
                sorted(ops[("expert-dp", op)]["sizes"]) + [ops[("expert-dp", op)]["bytes"]]
                for op in ("reduce_scatter", "all_gather")
            ],
            [[1, 0], [1, 0]],
        ),
        check(
            "'contract' (t6 of A, on g1) goes to E3 and E8: to g2 and g7, the GPUs holding them",
            [s["holder"], s["route"]["experts"], s["route"]["gpus"]],
            [1, [3, 8], [2, 7]],
        ),
        check(
            "loss, every gradient and every weight after Adam equal the unsplit model's (one device)",
            s["exact"]["exact"],
            True,
        ),
    ]


NARRATIVE = {
    "data": """
        Eight GPUs and the 16-GPU example's model (four layers, each attention then eight experts, top 2), laid
        out twice. For attention, GPUs pair up by TP: each pair splits the heads, and SP hands each GPU half
        of the pair's sequence between the matmuls; the four pairs are four DP replicas, one sequence each.
        For the MoE layers the very same GPUs form one EP group of eight, one whole expert on each, with no
        expert TP and no second copy of any expert. So 'contract' (t6 of A) sits on g1, the second GPU of
        the first pair, and its two experts live on g2 and g7, in other replicas.""",
    "forward mb1 layer 1": """
        Attention talks inside the pair only: an all-gather to rebuild the sequence, a reduce-scatter to
        split it again. Then the layout changes under the same tokens. Each GPU routes the tokens it holds,
        and the all-to-all spans all eight GPUs, crossing the DP replicas, since the expert a token picked
        may sit on any of them. Layers 2 to 4 repeat the pattern.""",
    "backward mb1 layer 4": """
        Backward walks the layers in reverse with the same two patterns: pair-local collectives for
        attention, eight-GPU all-to-alls for the experts.""",
    "gradient sync": """
        Two gradient groups. Attention's shards and the replicated norms and router were seen by four
        replicas, so they are summed over the four GPUs that share a TP rank (ZeRO-1: a reduce-scatter,
        Adam, an all-gather). Each expert exists once, so its gradient is already complete: its group is
        the GPU alone, and nothing is sent. A layout that got these two groups crossed would still run,
        and train wrongly.""",
}

LESSON = Lesson(
    no_picture="its answer is a table of groups; parasim layout ... --plot draws a layout's groups, moe16 --plot "
    "a token's dispatch",
    name="folding",
    title="MoE Parallel Folding: attention TP 2 x DP 4 and experts EP 8 on the same 8 GPUs",
    section="Expert parallelism: EP combined with TP, SP, CP and DP",
    order=168,
    world=8,
    worlds=(8,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="the post's folding example: two layouts over 8 GPUs, each GPU half the attention and one expert",
    keep_values=0,
    fold_alike=True,
    events_shown=3,
    reference=reference,
    on_layout=on_layout,
    study=study,
    tables=tables,
)

"""The 16-GPU MoE example under the post's variations, each run for one training step and set side by side:
the post's layout, CP's zigzag split, experts split by TP (ETP 2, EP 2, EDP 2), one expert per GPU (EP 8,
EDP 1), and one pipeline stage with DP 4. Every number of the table comes from the runs; every run is
checked against the unsplit model."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from parasim.engine import run
from parasim.examples.moe16 import LAYOUT, MICRO_BATCHES, MOE16, REPLICAS, SEQUENCES, make_program, program_on
from parasim.examples.moe16_exact import exactness
from parasim.examples.moe16_unsplit import unsplit_run
from parasim.layout import Layout, preset
from parasim.lesson import Check, Lesson, Table, check
from parasim.pipeline.schedules import generate
from parasim.pipeline.timing import time_schedule

WATCH = ("A", SEQUENCES["A"].index("contract"))
POST = preset(LAYOUT)
VARIANTS = {
    "the post's layout": POST,
    "zigzag CP split": replace(POST, zigzag=True),
    "ETP 2 (EP 2, EDP 2)": Layout(tp=2, cp=2, pp=2, dp=2, ep=2, etp=2, sp=True, zigzag=False, model=MOE16),
    "EP 8 (EDP 1)": Layout(tp=2, cp=2, pp=2, dp=2, ep=8, etp=1, sp=True, zigzag=False, model=MOE16),
    "PP 1, DP 4": Layout(tp=2, cp=2, pp=1, dp=4, ep=4, etp=1, sp=True, zigzag=False, model=MOE16),
}


def program(ctx):
    """The post's layout itself (the app steps through it); the checks run every variant."""
    return make_program(WATCH, routing="post")(ctx)


def reference(ctx):
    """The same step on one device, for `parasim check`: every sequence, the whole model."""
    return unsplit_run(ctx, MOE16, [s for rep in REPLICAS for s in rep], routing="post")


def measure(layout: Layout) -> dict:
    """One variant, run: where contract lives and where layer 1 sends it, what a GPU stores, the all-to-all
    group, bytes by group and link, the pipeline bubble, and the check against the unsplit model."""
    result = run(make_program(WATCH, layout, routing="post"), layout.world)
    notes = [m for m in result.trace.marks if m.kind == "note" and m.data and "watch" in m.data]
    holder = next(m.rank for m in notes if m.data["watch"] == "holds")
    route = next(m.data for m in notes if m.data["watch"] == "route" and m.data["layer"] == 1)
    stores = result.values[holder]["stores"]
    links = result.trace.bytes_by_link(layout.gpus_per_node)
    a2a = {len(e.ranks) for e in result.trace.events if e.op == "all_to_all"}
    timing = time_schedule(generate("1f1b", layout.pp, MICRO_BATCHES))
    sends: dict[str, int] = {}  # what the token's GPU sent in the step, by the group it sent in
    for e in result.trace.events:
        if e.kind != "compute" and e.group is not None:
            mine = sum(m.sent for m in e.members if m.rank == holder)
            if mine:
                sends[e.group.name] = sends.get(e.group.name, 0) + mine
    return {"holder": holder, "experts": route["experts"], "expert_gpus": route["gpus"],
            "expert_values": stores["experts"], "attention_values": stores["tp shards"],
            "a2a_gpus": sorted(a2a), "across": sorted(g for g, row in links.items() if row["across"]),
            "expert_dp_bytes": links.get("expert-dp", {"inside": 0, "across": 0}),
            "bubble": timing.bubble, "exact": exactness(result.values, layout, routing="post")["exact"], "sends": sends}


def study(result) -> dict:
    """Every variant, run once: what the table shows and the checks compare; and the post's first variant, no
    SP, which the layout refuses (as Megatron does), run on the TP pair g2, g3 alone (lesson moe-sp)."""
    return {**{name: measure(layout) for name, layout in VARIANTS.items()}, NO_SP: without_sp()}


NO_SP = "no SP"


def without_sp() -> dict:
    """Lesson moe-sp's run (the TP pair g2, g3 at the MoE layer, without SP and with it): the (token, expert)
    pairs the experts compute and the all-to-all bytes, each way."""
    from parasim.lesson import get_lesson, run_lesson

    ran = run_lesson(get_lesson("moe-sp")).result
    out = {}
    for phase in ("without SP", "with SP"):
        out[phase] = {
            "tokens": sum(v[phase]["tokens"] for v in ran.values),
            "copies": sum(v[phase]["copies"] for v in ran.values),
            "sent": sum(m.sent for e in ran.trace.events if e.op == "all_to_all" and e.phase == phase
                        for m in e.members),
        }
    return out


def tables(result, got) -> list[Table]:
    """One labelled row per variant, in two tables that fit a page: where the token goes, and what a GPU
    stores and sends."""
    where, what = [], []
    for name, v in VARIANTS.items():
        g = got[name]
        where.append((name, [f"g{g['holder']}", " ".join(f"E{e} on {_gpus(v, r)}" for e, r in zip(g["experts"], g["expert_gpus"])),
                             g["a2a_gpus"][0]]))
        what.append((name, [g["expert_values"], g["attention_values"], ", ".join(g["across"]) or "none",
                            str(g["bubble"]), g["exact"]]))
    return [Table("Where the token 'contract' (t6 of A) goes, by variant",
                  ["variant", "held by", "layer 1 sends it to", "GPUs per all-to-all"], where),
            Table("What one GPU stores and which groups send across nodes, by variant",
                  ["variant", "expert values", "attention values", "groups crossing nodes", "bubble", "exact"], what,
                  notes=["expert values per GPU: experts/EP x 2hf/ETP x layers/PP; attention values: 4h^2/TP x "
                         "layers/PP (h, f: the model's hidden and expert widths); bubble: 1F1B's idle share with "
                         "2 micro-batches; exact: loss, gradients and weights after Adam equal the unsplit "
                         "model's."]),
            _sends_table(got), _no_sp_table(got[NO_SP])]


def _no_sp_table(pair: dict) -> Table:
    """The post's first variant, which this layout refuses: the TP pair g2, g3 each way at the MoE layer."""
    rows = [(phase, [pair[phase]["tokens"], pair[phase]["copies"], pair[phase]["sent"]])
            for phase in ("without SP", "with SP")]
    return Table("No SP: refused by the layout (Megatron's rule), so run on the TP pair g2, g3 alone (lesson moe-sp)",
                 ["the pair at the MoE layer", "tokens routed", "(token, expert) pairs computed",
                  "all-to-all bytes"], rows,
                 notes=["without SP both GPUs of the pair hold the same tokens and route every one of them, so "
                        "each token is sent and computed twice; SP hands each GPU half of them first."])


def _sends_table(got: dict) -> Table:
    """What the token's GPU sends in one step, by the group it sends in (KB), one row a variant: where ETP 2's
    own collectives show, and what EP 8 or one stage moves instead."""
    groups = sorted({g for name in VARIANTS for g in got[name]["sends"]})
    rows = [(name, [round(got[name]["sends"].get(g, 0) / 1e3, 1) for g in groups]) for name in VARIANTS]
    return Table("What the token's GPU sends in one training step, by group (KB = 10^3 bytes, float64 values)",
                 ["variant", *groups], rows,
                 notes=["expert-tp: ETP 2's own collectives (the dispatched tokens handed to both halves of each "
                        "expert's pair, and the halves' partial outputs summed back), which the other variants never "
                        "make; ep: the all-to-alls, "
                        "over 2, 4 or 8 GPUs; expert-dp: the experts' gradient sums over their copies (none at "
                        "EP 8, EDP 1)."])


def _gpus(layout: Layout, owner: int) -> str:
    """'g2', or 'g0+g1' for an expert split over an expert-TP pair (ETP 2)."""
    group = next(g for g in layout.groups()["expert-tp"] if owner in g)
    return "+".join(f"g{r}" for r in group)


def checks(result, got) -> list[Check]:
    names = list(VARIANTS)
    col = lambda key: {n: got[n][key] for n in names}  # noqa: E731  (each figure named by its variant)
    each = lambda values: dict(zip(names, values))  # noqa: E731
    h, f, layers, n_exp = MOE16.hidden, MOE16.ffn, MOE16.layers, MOE16.experts
    return [
        check("no SP: the TP pair routes and computes every (token, expert) pair twice, once on each GPU",
              got[NO_SP]["without SP"]["copies"] / got[NO_SP]["with SP"]["copies"], POST.tp),
        check("every variant's loss, gradients and weights after Adam equal the unsplit model's", col("exact"),
              each([True] * len(names))),
        # contiguous: CP rank 1 holds t5-t8, SP gives TP rank 0 t5 t6 -> g2; zigzag: CP rank 1 holds t3-t6,
        # TP rank 1 gets t5 t6 -> g3 (Megatron's order: tp fastest, then cp); the other layouts keep g2
        check("the GPU holding 'contract' (t6 of A)", col("holder"), each([2, 3, 2, 2, 2])),
        # a GPU's experts: experts / ep of them, each w1 and w2 (h x f) split over etp, per layer of its stage
        check("expert values per GPU: experts/EP x 2hf/ETP x layers/PP", col("expert_values"),
              each([n_exp // v.ep * 2 * h * f // v.etp * layers // v.pp for v in VARIANTS.values()])),
        # attention: the fused qkv (h x 3h) and the output (h x h), split over TP, per layer of its stage
        check("attention values per GPU: 4h^2/TP x layers/PP", col("attention_values"),
              each([4 * h * h // v.tp * layers // v.pp for v in VARIANTS.values()])),
        check("GPUs in each all-to-all: the EP group", col("a2a_gpus"), each([[v.ep] for v in VARIANTS.values()])),
        check("groups whose traffic crosses nodes of 8: the pipeline hand-off, or without PP the "
              "data-parallel reductions", col("across"),
              each([["pp"], ["pp"], ["pp"], ["pp"], ["dp-cp", "expert-dp"]])),
        check("EP 8 leaves one copy of each expert (EDP 1): no expert-dp bytes", got["EP 8 (EDP 1)"]["expert_dp_bytes"],
              {"inside": 0, "across": 0}),
        check("1F1B bubble with 2 micro-batches: (p-1)/(m+p-1)", {n: str(b) for n, b in col("bubble").items()},
              each([str(Fraction(v.pp - 1, MICRO_BATCHES + v.pp - 1)) for v in VARIANTS.values()])),
        check("where layer 1 sends contract (the post's routing, E3 and E8): its experts' GPUs, per variant",
              {n: [f"E{e}" for e in got[n]["experts"]] + [f"g{r}" for r in got[n]["expert_gpus"]] for n in names},
              {n: [f"E{e}" for e in got[n]["experts"]] + [f"g{_owner(v, got[n]['holder'], e)}" for e in got[n]["experts"]]
               for n, v in VARIANTS.items()}),
    ]


def _owner(layout: Layout, holder: int, expert: int) -> int:
    """The GPU of `holder`'s EP group that holds `expert` (1-based): experts in contiguous blocks by EP rank."""
    group = next(g for g in layout.groups()["ep"] if holder in g)
    return group[(expert - 1) // (layout.model.experts // layout.ep)]


NARRATIVE = {
    "data": """
        The post's layout again, the one every variant below changes. The checks run each variant for one
        training step and put them side by side (the first, no SP, refused by the layout as Megatron refuses
        it, runs on the TP pair alone): where the token "contract" lives and where layer 1 sends
        it, how many expert and attention values a GPU keeps, how large the all-to-all group is, which
        traffic crosses the two nodes, and the pipeline bubble. The zigzag split moves contract from g2 to
        g3. ETP 2 halves each expert across a TP pair, so a GPU holds twice the experts at half their
        width; EP 8 puts one expert on each GPU and leaves no expert-DP group; with one pipeline stage and
        DP 4 nothing crosses nodes in the forward pass, but the gradient reductions do. Below, the phases of
        the post's layout are named once, with the notes its GPUs left (lesson moe16 walks them event by
        event); the tables at the end are every variant's.""",
}

LESSON = Lesson(
    no_picture='its answer is two tables of variants; parasim compare layout ... --plot FILE.png draws bytes per axis',
    name="moe16-variants", title="The 16-GPU MoE example, varied: no SP, zigzag, ETP 2, EP 8, PP 1 with DP 4",
                section="One example with everything: what changes with other settings",
                order=240,
                world=16, worlds=(16,), program=program, narrative=NARRATIVE, checks=checks,
                summary="the post's 'what changes with other settings', each run and checked", keep_values=0,
                fold_alike=True, events_shown=0,  # the post's layout again: moe16 walks it event by event
                reference=reference, on_layout=program_on, study=study, tables=tables)

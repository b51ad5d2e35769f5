"""Two published layouts held up to the rules of thumb: Megatron-LM's 8.3B GPT-2 on 512 V100s (TP 8 inside each
server, DP 64 across them) and DeepSeek-V3 on 2,048 H800s (no TP at all: PP 16 x EP 64, ZeRO-1 over DP, DualPipe).

One layer of the 8.3B model runs at real size on a TP group of 8 symbolic ranks (shapes and bytes, no values):
what a GPU keeps for backward and what its TP collectives send, against the estimator. Then both layouts are
read from parasim's presets: their groups axis by axis and whether each stays inside a node, the memory a GPU
needs (the estimator) against its card, and each rule of thumb kept or broken (the critic, clock/critic.py),
with what following the rule would change.
"""

from __future__ import annotations

from dataclasses import replace

from parasim.clock.critic import RULES, Case, critique
from parasim.clock.plan import plan_time
from parasim.estimate import Plan, breakdown
from parasim.estimate.hardware import GPUS
from parasim.figures import sent_in_phase
from parasim.layout.presets import PRESETS
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights

WORLD = 8  # the run: one TP group of the 8.3B model
# Megatron-LM's GPUs, as its paper gives them: Tesla V100 SXM3 32GB, 16 to a DGX-2H server (512 in 32 servers).
# parasim's hardware table has no V100 (its clock cannot time one): the lesson sizes memory only.
V100_GB, SERVER = 32, 16
MEG = PRESETS["megatron-8.3b"]
MEG_LAYOUT = replace(MEG.layout, gpus_per_node=SERVER)
MEG_SEQ = 1024  # GPT-2's context; one sequence a micro-batch (our choice: the post gives neither)
MEG_MODEL = replace(MEG.model, seq=MEG_SEQ, flash=True, dropout=0.1)  # GPT-2's dropout: its masks are kept
DSV3 = PRESETS["deepseek-v3"]
DS_SEQ, DS_GPU = 4096, "h800"  # the report's pre-training length; its H800s, 8 to a node
# DeepSeek's own choices on the clock: a token sent once to each node and GPU that needs it (DeepEP, with the
# routing's cap of 4 nodes a token), and DualPipe pairing a forward with a backward to hide the all-to-all
DS_DISPATCH, DS_OVERLAP = "deepep", ("dualpipe",)
MEG_RULES = ("tp-inside-a-node", "sp-with-tp", "pp-across-nodes", "zero-1")
DS_RULES = ("tp-inside-a-node", "pp-across-nodes", "ep-inside-a-node", "etp-1", "zero-1")
RUN = "Megatron-LM 8.3B: one layer on a TP group of 8 (real size, symbolic ranks)"
READ = "the two layouts: groups, memory a GPU, the rules of thumb"


def program(ctx):
    tp = ctx.new_group(range(WORLD), "tp")
    ctx.phase(RUN, seq=MEG_SEQ)
    par = ParallelContext(ctx, tp, seq=MEG_SEQ)
    layer = TransformerLayer(par, MEG_MODEL, layer_weights(ctx, MEG_MODEL, "L0"), key="L0")
    x = ctx.shared_rng("x").normal((MEG_SEQ, 1, MEG_MODEL.hidden))
    kept = Saved()
    y, cache = layer.forward(x, kept)
    layer.backward(cache, y)
    ctx.note(f"kept {kept.bytes():,} B between forward and backward")
    ctx.phase(READ)
    return {"kept": kept.bytes()}


def v100_usable() -> float:
    """The bytes a 32 GB V100 leaves for training, at the share parasim assumes of every card (an H100's)."""
    h100 = GPUS["h100"]
    return V100_GB * 1e9 * h100.usable.value / h100.memory.value


def plans() -> dict[str, tuple]:
    """Each memory row: (model, plan, sequence, usable bytes, card's name)."""
    meg = replace(Plan.of(MEG_LAYOUT), zero=0)  # Megatron-LM (2019) kept all of Adam's state on every GPU
    ds = Plan.of(DSV3.layout, dispatcher=DS_DISPATCH)
    v100, h800 = v100_usable(), GPUS[DS_GPU].usable.value
    return {
        "8.3B as published (ZeRO-0)": (MEG_MODEL, meg, MEG_SEQ, v100, "V100 32GB"),
        "8.3B + ZeRO-1": (MEG_MODEL, replace(meg, zero=1), MEG_SEQ, v100, "V100 32GB"),
        "8.3B + ZeRO-1 + SP": (MEG_MODEL, replace(meg, zero=1, sp=True), MEG_SEQ, v100, "V100 32GB"),
        "V3, no recompute": (DSV3.model, ds, DS_SEQ, h800, GPUS[DS_GPU].name),
        "V3, full recompute": (DSV3.model, replace(ds, recompute="full"), DS_SEQ, h800, GPUS[DS_GPU].name),
    }


def spans(groups: list[list[int]], per_node: int) -> list[int]:
    """The nodes each group's GPUs lie on."""
    return [len({r // per_node for r in g}) for g in groups]


def study(result) -> dict:
    rows = {}
    for label, (model, plan, seq, usable, card) in plans().items():
        bd = breakdown(model, plan, seq)
        rows[label] = {"bd": bd, "usable": usable, "card": card, "plan": plan, "model": model, "seq": seq}
    meg, ds = rows["8.3B as published (ZeRO-0)"], rows["V3, full recompute"]
    verdicts = {}
    for key, row, names in (("meg", meg, MEG_RULES), ("ds", ds, DS_RULES)):
        case = Case(row["model"], row["plan"], row["seq"], row["usable"])
        verdicts[key] = {r.name: r.broken(case) for r in RULES if r.name in names}
    # the critic's EP finding on DeepSeek's own choices, and on NCCL's all-to-all with no pairing
    found = {}
    for key, plan, overlap in (
        ("own", ds["plan"], DS_OVERLAP),
        ("plain", replace(ds["plan"], dispatcher="alltoall"), ()),
    ):
        (f,) = [f for f in critique(DSV3.model, plan, DS_SEQ, DS_GPU, overlap) if f.rule.name == "ep-inside-a-node"]
        found[key] = f
    timed = plan_time(DSV3.model, ds["plan"], DS_SEQ, DS_GPU, DS_OVERLAP)
    zero0 = breakdown(DSV3.model, replace(ds["plan"], zero=0), DS_SEQ)
    groups = {"meg": MEG_LAYOUT.groups(), "ds": DSV3.layout.groups()}
    tp = sent_in_phase(result, RUN)
    return {
        "rows": rows,
        "verdicts": verdicts,
        "ep": found,
        "timed": timed,
        "ds_zero0": zero0,
        "groups": groups,
        "tp_sent": tp,
        "kept": result.values[0]["kept"],
    }


# the axes each layout's table lists: (what the post calls it, parasim's group kind)
AXES = {
    "meg": (("TP", "tp"), ("DP", "dp")),
    "ds": (("PP", "pp"), ("EP", "ep"), ("expert DP", "expert-dp"), ("DP (attention)", "dp")),
}


def _gb(n: float) -> float:
    return round(n / 1e9, 2)


def group_rows(s) -> list:
    out = []
    for key, layout, name in (("meg", MEG_LAYOUT, "8.3B"), ("ds", DSV3.layout, "V3")):
        per = layout.gpus_per_node
        for axis, kind in AXES[key]:
            g = s["groups"][key][kind]
            nodes = spans(g, per)
            first = g[0] if len(g[0]) <= 3 else [g[0][0], g[0][1], "...", g[0][-1]]
            out.append(
                (
                    f"{name}: {axis}",
                    [len(g[0]), len(g), ", ".join(map(str, first)), max(nodes), "yes" if max(nodes) == 1 else "no"],
                )
            )
        if layout.tp == 1:
            out.append((f"{name}: TP", [1, layout.world, "-", 1, "no TP"]))
    return out


def tables(result, s) -> list[Table]:
    rows = s["rows"]
    memory = []
    for label, r in rows.items():
        bd = r["bd"]
        items = bd.items
        acts = bd.total - bd.model_state
        memory.append(
            (
                label,
                [
                    f"{r['card']} ({r['usable'] / 1e9:.1f})",
                    _gb(items["weights"] + items["gradients"]),
                    _gb(items["optimizer"]),
                    _gb(acts),
                    _gb(bd.total),
                    "yes" if bd.total <= r["usable"] else "no",
                ],
            )
        )
    meg, ds = rows["8.3B as published (ZeRO-0)"], rows["V3, full recompute"]
    ds_none = rows["V3, no recompute"]["bd"]
    own, plain = s["ep"]["own"], s["ep"]["plain"]
    t = s["timed"]
    ep_part = t["parts_per_microbatch_s"]["ep"]
    v = s["verdicts"]
    zero1 = rows["8.3B + ZeRO-1"]["bd"]
    sp = rows["8.3B + ZeRO-1 + SP"]["bd"]
    meg_acts = meg["bd"].total - meg["bd"].model_state

    def said(key: str, name: str) -> str:
        return "broken" if v[key][name] else "kept"

    readings = [
        (
            "8.3B",
            "TP inside a node",
            said("meg", "tp-inside-a-node"),
            f"each TP group of {MEG_LAYOUT.tp} is half of one {SERVER}-GPU server: its 4 all-reduces a layer stay on "
            "the server's own links; only DP's gradient sum crosses servers, once a step",
        ),
        (
            "8.3B",
            "SP whenever TP is on",
            said("meg", "sp-with-tp"),
            f"SP came later (Korthikanti et al., 2022); with it the activations at {MEG_SEQ:,} tokens drop from "
            f"{_gb(meg_acts)} to {_gb(sp.total - sp.model_state)} GB a GPU, for the same bytes forward",
        ),
        (
            "8.3B",
            "PP across nodes",
            said("meg", "pp-across-nodes"),
            "no PP: the model fits a TP group, and DP alone spans the servers",
        ),
        (
            "8.3B",
            "ZeRO-1 over DP",
            said("meg", "zero-1"),
            f"Adam's state whole on every GPU ({_gb(meg['bd'].items['optimizer'])} GB); sharded over DP "
            f"{MEG_LAYOUT.dp} it would be {_gb(zero1.items['optimizer'])} GB, the same bytes sent",
        ),
        (
            "V3",
            "TP inside a node",
            said("ds", "tp-inside-a-node"),
            "no TP at all (TP 1, each expert whole: ETP 1): nothing to keep inside a node",
        ),
        (
            "V3",
            "PP across nodes",
            said("ds", "pp-across-nodes"),
            f"PP {DSV3.layout.pp}'s groups cross {DSV3.layout.pp} nodes; between stages only hand-offs travel",
        ),
        (
            "V3",
            "EP inside a node if possible",
            said("ds", "ep-inside-a-node"),
            f"EP {DSV3.layout.ep} spans {DSV3.layout.ep // DSV3.layout.gpus_per_node} nodes. EP "
            f"{own.followed.ep} in a node would need {own.followed_memory / 1e9:.1f} GB and, with DeepEP's dispatch and "
            f"DualPipe, step in {own.followed_step_s:.2f} s against this layout's {own.step_s:.2f} s; with NCCL's "
            f"all-to-all and no pairing it would win ({plain.followed_step_s:.2f} s against {plain.step_s:.2f})",
        ),
        (
            "V3",
            "ETP 1 for the experts",
            said("ds", "etp-1"),
            f"each GPU holds {DSV3.model.experts // DSV3.layout.ep} of a layer's {DSV3.model.experts} experts whole",
        ),
        (
            "V3",
            "ZeRO-1 over DP",
            said("ds", "zero-1"),
            f"Adam's state {_gb(s['ds_zero0'].items['optimizer'])} GB a GPU unsharded, "
            f"{_gb(ds['bd'].items['optimizer'])} GB over DP {DSV3.layout.dp} (the experts over expert DP "
            f"{DSV3.layout.edp})",
        ),
    ]
    return [
        Table(
            "Each layout's groups by axis (parasim's presets; 8.3B: servers of 16 V100s, V3: nodes of 8 H800s)",
            ["layout: axis", "size", "groups", "the first group's GPUs", "nodes one spans", "inside a node"],
            group_rows(s),
            notes=[
                "Megatron's rank order puts TP fastest: a TP group is 8 consecutive GPUs, a DP group every "
                f"8th. DeepSeek-V3's EP group is {DSV3.layout.ep} consecutive GPUs; a pipeline's stages are "
                f"{DSV3.layout.world // DSV3.layout.pp} GPUs apart.",
                f"the megatron-8.3b preset draws nodes of {MEG.layout.gpus_per_node}; here the paper's "
                f"servers of {SERVER}. TP 8 stays inside either.",
            ],
        ),
        Table(
            "Memory a GPU needs, by the estimator (GB = 10^9 bytes; the card's usable GB in brackets)",
            ["layout", "GPU", "weights + grads", "Adam", "activations", "total", "fits"],
            memory,
            notes=[
                f"8.3B at {MEG_SEQ:,} tokens, V3 at {DS_SEQ:,}, one sequence a micro-batch. A V100's usable "
                f"{v100_usable() / 1e9:.1f} GB is {V100_GB} GB at the share parasim assumes of every card "
                "(parasim hardware). Without recomputation V3's fullest stage is stage "
                f"{ds_none.stage + 1}, which under 1F1B holds {DSV3.layout.pp - ds_none.stage} micro-batches "
                f"at once: {_gb(ds_none.items['in-flight micro-batches'])} of its {_gb(ds_none.total)} GB "
                "are the ones beyond the first.",
                "V3 here is parasim's DeepSeek-V3-like model: plain multi-head attention where the real one "
                "compresses K and V (MLA). Its two rows are the estimator's two ends, no recomputation and "
                "full; the report's own savings (recomputing its norms and MLA's up-projections, caching "
                "some activations in FP8) are not modelled. DualPipe keeps a second copy of the weights, "
                f"{_gb(ds['bd'].items['weights'])} GB more here: little, as EP {DSV3.layout.ep} leaves a GPU "
                f"only {DSV3.model.experts // DSV3.layout.ep} experts a layer.",
                f"parasim's 8.3B counts the output head apart from the input embedding: "
                f"{MEG_MODEL.total_params() / 1e9:.2f}B parameters, where GPT-2 shares the two (the paper's "
                "8.3B).",
            ],
        ),
        Table(
            "Each layout against the rules of thumb (the critic; V3 with full recomputation, on the clock on H800s)",
            ["layout", "rule", "here", "what the numbers say"],
            [(a, [b, c, d]) for a, b, c, d in readings],
            notes=[
                f"the clock's V3 step: {t['microbatches']} micro-batches (as many as stages), "
                f"{t['step_s']:.2f} s. DeepEP sends a token once to each node holding its experts, at most "
                f"{DSV3.model.groups_kept} of the {DSV3.layout.ep // DSV3.layout.gpus_per_node} in an EP "
                f"group (node-limited routing); DualPipe hides {t['ep_hidden_s'] * 1e3:.0f} ms of the "
                f"{ep_part * 1e3:.0f} ms of all-to-all a micro-batch behind another micro-batch's compute. "
                "The 8.3B's step is not timed: parasim's clock has no V100 (the line under these tables times "
                "the one-layer run on H200s, the clock's default)."
            ],
        ),
    ]


def checks(result, s) -> list[Check]:
    h, layers, vocab = MEG_MODEL.hidden, MEG_MODEL.layers, MEG_MODEL.vocab
    t, sbh = WORLD, MEG_SEQ * h
    meg = s["rows"]["8.3B as published (ZeRO-0)"]["bd"]
    ds_rows = s["rows"]
    # the 8.3B's parameters by hand: 12 h^2 a layer (attention 4, MLP 8), two norms of h, and the input embedding
    # and output head (V x h each)
    meg_p = 12 * layers * h * h + 2 * layers * h + 2 * vocab * h
    # DeepSeek-V3-like by hand: attention 4h^2 on every layer; 3 dense MLPs (gated: 3 h x 18,432); 58 MoE layers of
    # 256 routed experts and one shared (gated: 3 h x 2,048 each), a router of h x 256; two norms of h a layer;
    # the input embedding and output head
    d = DSV3.model
    moe = d.layers - d.dense_layers
    routed = moe * d.experts * 3 * d.hidden * d.expert_ffn
    ds_p = (
        d.layers * 4 * d.hidden**2
        + d.dense_layers * 3 * d.hidden * d.ffn
        + routed
        + moe * (3 * d.hidden * d.expert_ffn + d.experts * d.hidden)
        + 2 * d.layers * d.hidden
        + 2 * d.vocab * d.hidden
    )
    lay = DSV3.layout
    held = (ds_p - routed) / lay.pp + routed / (lay.ep * lay.pp)  # dense over PP; experts over EP and PP
    adam = 12 * ((ds_p - routed) / lay.pp / lay.dp + routed / (lay.ep * lay.pp) / lay.edp)
    ds_full = ds_rows["V3, full recompute"]["bd"]
    kept_input = 2 * DS_SEQ * d.hidden  # full recomputation keeps a layer's BF16 input
    stage_layers = 4  # 61 layers over 16 stages: the first 13 of 4 (PP's binding stage is one of them)
    meg_groups, ds_groups = s["groups"]["meg"], s["groups"]["ds"]
    own, plain = s["ep"]["own"], s["ep"]["plain"]
    return [
        check(
            "the run's TP collectives: 4 all-reduces a layer (2 forward, 2 backward), each a ring sending "
            "2 (t-1)/t of an s x h activation at 2 bytes, by hand",
            s["tp_sent"],
            4 * 2 * (t - 1) / t * sbh * 2,
        ),
        check(
            "what one layer keeps for backward at TP 8 without SP: s h (10 + 24/t) bytes (FlashAttention: no "
            "scores; masks 1 byte a value), by hand",
            s["kept"],
            sbh * (10 + 24 / t),
        ),
        check(
            "... the estimator's activations for the 8.3B's 72 layers are 72 of it",
            meg.items["activations"],
            layers * sbh * (10 + 24 / t),
            rtol=1e-12,
        ),
        check(
            "the 8.3B's parameters by hand (12 L h^2 + 2 L h + 2 V h), the post's 8.3B (within 3%)",
            [MEG_MODEL.total_params(), MEG_MODEL.total_params() / 8.3e9],
            [meg_p, 1.0],
            rtol=0.03,
        ),
        check(
            "the 8.3B with Adam whole on every GPU: 16 bytes a parameter, P / 8 of them",
            meg.model_state,
            16 * meg_p / 8,
            rtol=1e-12,
        ),
        check(
            "... and with ZeRO-1 over DP 64: 4 bytes a parameter held, Adam's 12 divided by 64",
            ds_rows["8.3B + ZeRO-1"]["bd"].model_state,
            (4 + 12 / 64) * meg_p / 8,
            rtol=1e-12,
        ),
        check(
            "the 8.3B fits a 32 GB V100 as published; SP would cut its activations to 34/(10 + 24/8) of them",
            [
                meg.total < v100_usable(),
                ds_rows["8.3B + ZeRO-1 + SP"]["bd"].items["activations"] / meg.items["activations"],
            ],
            [True, 34 / 8 / 13],
            rtol=1e-12,
        ),
        check(
            "the 8.3B's TP groups: 8 consecutive GPUs, inside one server; DP groups every 8th GPU",
            [meg_groups["tp"][:2], meg_groups["dp"][0][:3], max(spans(meg_groups["tp"], SERVER))],
            [[list(range(8)), list(range(8, 16))], [0, 8, 16], 1],
        ),
        check(
            "V3's parameters by hand from its shapes, the post's 671B (within 1%)",
            [d.total_params(), d.total_params() / 671e9],
            [ds_p, 1.0],
            rtol=0.01,
        ),
        check(
            "V3's GPU holds its stage's share of the dense weights and 1/(EP x PP) of the experts: weights and "
            "gradients 4 bytes a parameter",
            ds_full.items["weights"] + ds_full.items["gradients"],
            4 * held,
            rtol=1e-9,
        ),
        check(
            "... and Adam's 12 bytes sharded: the dense over DP 128, the experts over expert DP 2 (ZeRO-1)",
            ds_full.items["optimizer"],
            adam,
            rtol=1e-9,
        ),
        check(
            "V3 with full recomputation: its stage keeps each layer's input (2 s h bytes), and 1F1B holds "
            "p - 1 = 15 more micro-batches of it",
            [ds_full.items["activations"], ds_full.items["in-flight micro-batches"]],
            [stage_layers * kept_input, (lay.pp - 1) * stage_layers * kept_input],
            rtol=1e-9,
        ),
        check(
            "V3's groups: EP 64 consecutive GPUs over 8 nodes, PP 16 GPUs 128 apart over 16 nodes, expert DP "
            "pairs 64 apart",
            [
                ds_groups["ep"][0],
                ds_groups["pp"][0],
                ds_groups["expert-dp"][0],
                max(spans(ds_groups["ep"], 8)),
                max(spans(ds_groups["pp"], 8)),
            ],
            [list(range(64)), [128 * k for k in range(16)], [0, 64], 8, 16],
        ),
        check(
            "V3 does not fit an H800 without recomputation (the estimator) and does with it",
            [
                ds_rows["V3, no recompute"]["bd"].total > GPUS[DS_GPU].usable.value,
                ds_full.total < GPUS[DS_GPU].usable.value,
            ],
            [True, True],
        ),
        check(
            "the critic: Megatron breaks SP-with-TP and ZeRO-1; V3 breaks only EP-inside-a-node",
            [
                sorted(k for k, b in s["verdicts"]["meg"].items() if b),
                sorted(k for k, b in s["verdicts"]["ds"].items() if b),
            ],
            [["sp-with-tp", "zero-1"], ["ep-inside-a-node"]],
        ),
        check(
            "with DeepEP's dispatch and DualPipe, EP 64 over 8 nodes steps faster than EP 8 in a node; "
            "with NCCL's all-to-all and no pairing, slower",
            [own.step_s < own.followed_step_s, plain.step_s > plain.followed_step_s],
            [True, True],
        ),
    ]


NARRATIVE = {
    RUN: f"""
        Megatron-LM trained its 8.3B GPT-2 (72 layers, hidden 3,072) with TP 8: one layer of it runs here on 8
        GPUs at {MEG_SEQ:,} tokens. Each GPU holds an eighth of every matrix; the layer's two blocks each end in
        an all-reduce forward and begin with one backward, four a layer, every layer, in the middle of the
        compute. That is why TP stays on the fast links inside a server.""",
    READ: """
        The two published layouts, read from parasim's presets: the groups each axis makes and where they lie,
        the memory a GPU needs against its card, and each rule of thumb the critic finds kept or broken.
        Megatron-LM (2019) was published before SP and before ZeRO sharded the optimizer; DeepSeek-V3 (2024)
        runs no TP, sends its expert all-to-all across nodes, and counts on node-limited routing and DualPipe
        to pay for that.""",
}

LESSON = Lesson(
    no_picture="a layout picture draws a box a GPU, at most 256, and these have 512 and 2,048; parasim layout "
    "--layout megatron-8.3b (or deepseek-v3) prints them node by node",
    name="published-layouts",
    title="Two published layouts: Megatron-LM's 8.3B (TP 8 x DP 64) and DeepSeek-V3 (PP 16 x EP 64, no TP)",
    section="Putting it together: the longest sequence that fits (two published layouts)",
    order=225,
    world=WORLD,
    worlds=(WORLD,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    tables=tables,
    study=study,
    backend="symbolic",
    keep_values=0,
    summary="Megatron-LM's 8.3B on 512 V100s and DeepSeek-V3 on 2,048 H800s: groups by axis and node, memory a GPU "
    "against the card, and each rule of thumb kept or broken",
)

"""Silent bugs: gradient sums over the wrong group give a plausible loss and no error. `parasim check` finds
the first wrong collective by comparing every marked gradient with the unsplit model's.

The gradient sync of the 16-GPU example's attention-and-MoE split, without its pipeline: TP 2, CP 2, DP 2
for attention (8 GPUs) and EP 4 x EDP 2 for the experts (folded onto the same 8). Each GPU holds the
gradient its own tokens gave: for its shard of an attention weight (TP), for the norm it holds whole but
saw only its SP share of the tokens for, and for its expert. The right sums: attention over dp-cp, the norm
over tp and then dp-cp, each expert over expert-dp; then one norm over every gradient clips them all, and a
dropout after a row-parallel sum draws one mask for both TP ranks. Each bug below changes one of these.
"""
from __future__ import annotations

from parasim.engine import run
from parasim.engine.divergence import first_divergence
from parasim.layout import Layout
from parasim.lesson import Check, Lesson, Table, check

LAYOUT = Layout(tp=2, cp=2, dp=2, ep=4, etp=1, sp=True)
H = 4  # a small hidden size: the attention weight is H x 2H, split by columns over TP
MAX_NORM = 1.0  # the gradients' norm is far above: clipping scales them
DROP = 0.5  # dropout probability
EXPERTS = LAYOUT.ep  # one expert per EP rank
BUGS = {
    "expert-over-dp-cp": "the experts' gradients summed over dp-cp (the attention's group) instead of expert-dp",
    "dense-over-dp": "the attention's gradients summed over dp alone, leaving out the CP halves of the sequence",
    "norm-not-over-tp": "the norm's gradient not summed over tp, although each TP rank saw only its SP share",
    "clip-per-group": "the norm's squares added up over each gradient's own group (dense over dp-cp, experts over "
                      "expert-dp) instead of every rank: each TP shard and each expert gets a norm of its own",
    "dropout-per-rank": "dropout masks drawn from each rank's own seed where both TP ranks must drop the same",
}


def _attn(ctx, dp: int, cp: int):
    """The whole attention weight's gradient from the tokens of DP replica dp, CP half cp."""
    return ctx.shared_rng(f"attn.{dp}.{cp}").normal((H, 2 * H))


def _norm(ctx, dp: int, cp: int, tp: int):
    """The norm's gradient from the SP share tp of those tokens."""
    return ctx.shared_rng(f"norm.{dp}.{cp}.{tp}").normal((H,))


def _act(ctx, dp: int, cp: int, tp: int):
    """TP rank tp's partial output of a row-parallel layer, on the tokens of (dp, cp)."""
    return ctx.shared_rng(f"act.{dp}.{cp}.{tp}").normal((2, H))


def _expert(ctx, e: int, edp: int):
    """Expert e's gradient from the tokens routed to it on expert-data-parallel rank edp."""
    return ctx.shared_rng(f"expert{e}.{edp}").normal((H, H))


def sync(ctx, bug: str | None = None) -> dict:
    ctx.use_layout(LAYOUT)
    c, g = ctx.coords, ctx.groups
    ctx.phase("attention: TP shards, summed over dp-cp")
    cols = slice(c.tp * H, (c.tp + 1) * H)
    attn = ctx.comm.all_reduce(_attn(ctx, c.dp, c.cp)[:, cols], group=g["dp" if bug == "dense-over-dp" else "dp-cp"],
                               label="sum the attention shard's gradient over the ranks that saw other tokens")
    ctx.mark("attn.grad", attn, "Shard(1)", g["tp"])
    ctx.phase("norm: SP partial sums over tp, then dp-cp")
    norm = _norm(ctx, c.dp, c.cp, c.tp)
    if bug != "norm-not-over-tp":
        norm = ctx.comm.all_reduce(norm, group=g["tp"], label="sum the norm's gradient over tp (SP shares)")
    norm = ctx.comm.all_reduce(norm, group=g["dp-cp"], label="sum the norm's gradient over dp-cp")
    ctx.mark("norm.grad", norm, "Replicate()", g["tp"])
    ctx.phase("experts: summed over expert-dp")
    expert = ctx.comm.all_reduce(_expert(ctx, c.ep, c.edp), group=g["dp-cp" if bug == "expert-over-dp-cp" else "expert-dp"],
                                 label="sum the expert's gradient over the ranks holding the same expert")
    ctx.mark(f"expert{c.ep}.grad", expert, "Replicate()", g["expert-dp"])
    ctx.phase("clipping: one norm over both groups")
    # each gradient piece counted once: a sum every dp-cp (expert-dp) member holds is counted on its first
    # member, the norm (whole on both TP ranks) on TP rank 0 too; the squares are then added up over every
    # rank, or, with the bug, only over each gradient's own group
    first = {k: g[k].group_rank(ctx.rank) == 0 for k in ("dp-cp", "expert-dp", "tp")}
    dense_sq = float((attn ** 2).sum()) * first["dp-cp"] + float((norm ** 2).sum()) * first["dp-cp"] * first["tp"]
    expert_sq = float((expert ** 2).sum()) * first["expert-dp"]
    per_group = bug == "clip-per-group"
    sq = []
    for part, own, what in ((dense_sq, "dp-cp", "dense"), (expert_sq, "expert-dp", "expert")):
        total = ctx.comm.all_reduce(ctx.asarray([part]), group=g[own] if per_group else None,
                                    label=f"add up the squares of the {what} gradient pieces each rank alone holds")
        sq.append(ctx.mark(f"{what}.norm_sq", total))
    dense_norm = expert_norm = float(sq[0][0] + sq[1][0]) ** 0.5
    attn_c = attn * min(1.0, MAX_NORM / (dense_norm + 1e-6))
    expert_c = expert * min(1.0, MAX_NORM / (expert_norm + 1e-6))
    ctx.mark("attn.clipped", attn_c, "Shard(1)", g["tp"])
    ctx.mark(f"expert{c.ep}.clipped", expert_c, "Replicate()", g["expert-dp"])
    ctx.phase("dropout: one mask on both TP ranks")
    # after the row-parallel sum both TP ranks hold the same activations: dropout must drop the same ones
    act = ctx.comm.all_reduce(_act(ctx, c.dp, c.cp, c.tp), group=g["tp"], label="sum the row-parallel output over tp")
    draw = ctx.rng if bug == "dropout-per-rank" else ctx.shared_rng(f"mask.{c.dp}.{c.cp}")
    dropped = act * (draw.uniform(act.shape) >= DROP) / (1 - DROP)
    ctx.mark(f"dropout.{c.dp}.{c.cp}", dropped, "Replicate()", g["tp"])
    return {"attn": attn, "norm": norm, "expert": expert}


def program(ctx):
    return sync(ctx)


def expert_over_dp_cp(ctx):
    return sync(ctx, "expert-over-dp-cp")


def dense_over_dp(ctx):
    return sync(ctx, "dense-over-dp")


def norm_not_over_tp(ctx):
    return sync(ctx, "norm-not-over-tp")


def clip_per_group(ctx):
    return sync(ctx, "clip-per-group")


def dropout_per_rank(ctx):
    return sync(ctx, "dropout-per-rank")


def reference(ctx):
    """One device: every gradient summed over all the tokens that reach it, whole; one norm clips them all;
    one dropout mask per token."""
    dp, cp, tp, edp = LAYOUT.dp, LAYOUT.cp, LAYOUT.tp, LAYOUT.world // LAYOUT.ep
    attn = ctx.mark("attn.grad", sum(_attn(ctx, d, k) for d in range(dp) for k in range(cp)))
    norm = ctx.mark("norm.grad", sum(_norm(ctx, d, k, t) for d in range(dp) for k in range(cp) for t in range(tp)))
    experts = [ctx.mark(f"expert{e}.grad", sum(_expert(ctx, e, r) for r in range(edp))) for e in range(EXPERTS)]
    dense = ctx.mark("dense.norm_sq", ctx.asarray([float((attn ** 2).sum()) + float((norm ** 2).sum())]))
    expert = ctx.mark("expert.norm_sq", ctx.asarray([sum(float((x ** 2).sum()) for x in experts)]))
    total = float(dense[0] + expert[0]) ** 0.5
    coef = min(1.0, MAX_NORM / (total + 1e-6))
    ctx.mark("attn.clipped", attn * coef)
    for e, x in enumerate(experts):
        ctx.mark(f"expert{e}.clipped", x * coef)
    for d in range(dp):
        for k in range(cp):
            act = sum(_act(ctx, d, k, t) for t in range(tp))
            keep = ctx.shared_rng(f"mask.{d}.{k}").uniform(act.shape) >= DROP
            ctx.mark(f"dropout.{d}.{k}", act * keep / (1 - DROP))


VARIANTS = {"expert-over-dp-cp": expert_over_dp_cp, "dense-over-dp": dense_over_dp,
            "norm-not-over-tp": norm_not_over_tp, "clip-per-group": clip_per_group, "dropout-per-rank": dropout_per_rank}
# what `parasim check` should name for each bug: (the marked gradient, the wrong group, what would match).
# Here EP 4 folds expert-dp onto the same ranks as dp, so both are named.
EXPECTED = {
    "expert-over-dp-cp": ("expert", "dp-cp", "all_reduce over dp or expert-dp instead of dp-cp would match"),
    "dense-over-dp": ("attn", "dp", "all_reduce over dp-cp instead of dp would match"),
    "norm-not-over-tp": ("norm", "dp-cp", "summing these pieces over tp (they are partial sums) would match"),
    "clip-per-group": ("dense", "dp-cp", "all_reduce over world or tp-dp-cp instead of dp-cp would match"),
    "dropout-per-rank": ("dropout", "tp", "the copies on tp were equal after 'sum the row-parallel output over tp' "
                         "and differ here: what each rank did alone since then (a draw from its own random stream?) "
                         "must be the same on all of tp (one stream shared by the group) to match"),
}


def divergence(variant) -> dict | None:
    keep = 10 ** 6  # every collective's values, so another group's sum can be tried
    return first_divergence(run(variant, LAYOUT.world, keep_values=keep), run(reference, 1, keep_values=keep))


def checks(result) -> list[Check]:
    right = divergence(program)
    out = [check("the right groups: no divergence from the unsplit model", "none" if right is None else right["name"],
                 "none")]
    for bug, variant in VARIANTS.items():
        got = divergence(variant)
        found = ["none"] if got is None else [got["name"].split(".")[0].rstrip("0123456789"),
                                              got["group"].split("[")[0], got["would_match"]]
        out.append(check(f"{bug}: the first wrong tensor, the group of the collective before it, what would match",
                         found, list(EXPECTED[bug])))
    # the two norms side by side, by hand from the unsplit gradients: every rank should add up the squares
    # of the whole dense gradient; with the bug TP rank 0 (which counts the norm's copy) adds up only its
    # own shard's columns and the norm
    whole = dict(run(reference, 1).marked[0])
    right = sum(float((whole[k] ** 2).sum()) for k in ("attn.grad", "norm.grad"))
    shard0 = float((whole["attn.grad"][:, :H] ** 2).sum()) + float((whole["norm.grad"] ** 2).sum())
    got = divergence(clip_per_group)
    out.append(check("clip-per-group: rank 0's dense squares, its shard's alone, and the whole model's",
                     [got["got"][0], got["want"][0]], [shard0, right], rtol=1e-12))
    import numpy as np

    # the table's bug run, by hand: over dp-cp each GPU adds up the gradients of every expert its dp-cp group
    # holds, each counted once per expert-dp rank; the right run keeps each expert's own
    experts = [whole[f"expert{e}.grad"] for e in range(EXPERTS)]
    coords, rows = LAYOUT.coords(), side_by_side(result)
    dpcp = {r: g for g in LAYOUT.groups()["dp-cp"] for r in g}
    mixed = [sum(experts[e] for e in sorted({coords[q]["ep"] for q in dpcp[r["on"][0]]})) for r in rows[2:]]
    out.append(check(f"the table's {SHOWN} run: each expert's gradient is the sum of the experts its dp-cp group "
                     "holds; the right run's, the expert's own (largest difference from each, every expert)",
                     [float(np.max(np.abs(r["bug"] - m))) for r, m in zip(rows[2:], mixed)]
                     + [float(np.max(np.abs(r["right"] - x))) for r, x in zip(rows[2:], experts)],
                     [0.0] * (2 * EXPERTS), atol=1e-12))
    return out


SHOWN = "expert-over-dp-cp"  # the bug the tables run beside the right groups


def _gpus(ranks) -> str:
    """g0,g4; g0-g7 for three or more GPUs in a row."""
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"g{ranks[0]}-g{ranks[-1]}"
    return ",".join(f"g{r}" for r in ranks)


def side_by_side(result, bug: str = SHOWN) -> list[dict]:
    """Each gradient as one device, the right run (the lesson's) and the bug's run hold it: the attention shard
    of TP rank 0, the norm, and every expert, read on the first GPU holding it, with the GPUs that hold it."""
    whole = dict(run(reference, 1).marked[0])
    wrong = run(VARIANTS[bug], LAYOUT.world).values
    groups = LAYOUT.groups()
    holders = {"attn": next(g for g in groups["dp-cp"] if 0 in g), "norm": list(range(LAYOUT.world))}
    rows = [{"what": "attention shard (TP rank 0)", "key": "attn", "on": holders["attn"],
             "one": whole["attn.grad"][:, :H]},
            {"what": "norm", "key": "norm", "on": holders["norm"], "one": whole["norm.grad"]}]
    coords = LAYOUT.coords()
    for e in range(EXPERTS):
        on = next(list(g) for g in groups["expert-dp"] if coords[g[0]]["ep"] == e)
        rows.append({"what": f"expert E{e + 1}", "key": "expert", "on": on, "one": whole[f"expert{e}.grad"]})
    for r in rows:
        first = r["on"][0]
        r["right"], r["bug"] = result.values[first][r["key"]], wrong[first][r["key"]]
    return rows


def bug_table(result) -> Table:
    """The lesson's run (the right groups) beside the same sync with one bug, gradient by gradient: each one's
    size (its norm) on one device, in the right run and in the bug's, and each run's largest error against one
    device; and the first divergence `parasim check --bug` names for it."""
    import numpy as np  # here: README quotes the line `parasim check` names in this file (the expert sum's)

    rows = side_by_side(result)
    norm = lambda a: round(float(np.linalg.norm(a)), 3)  # noqa: E731
    err = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))))  # noqa: E731
    body = [(r["what"], [_gpus(r["on"]), norm(r["one"]), norm(r["right"]), norm(r["bug"]),
                         f"{err(r['right'], r['one']):.3g}", f"{err(r['bug'], r['one']):.3g}"]) for r in rows]
    found = divergence(VARIANTS[SHOWN])
    hit = [r for r in rows if err(r["bug"], r["one"]) > 1e-9]
    ratio = [float(np.linalg.norm(r["bug"]) / np.linalg.norm(r["one"])) for r in hit]
    return Table(f"The right groups beside one bug, {SHOWN}: {BUGS[SHOWN]} (each gradient's norm; errors: the "
                 "largest difference from one device)",
                 ["gradient", "held on", "one device", "right run", "bug's run", "right: error", "bug: error"], body,
                 notes=[f"the bug's gradients look like gradients: the wrong ones are {min(ratio):.2f}x to "
                        f"{max(ratio):.2f}x the right norms, "
                        + ("the copies of each agree, " if not found["copies_differ"] else "")
                        + "nothing fails; only a "
                        "comparison with one device shows it. Each is the sum of the experts its dp-cp group holds.",
                        f"parasim check silent-bugs --bug {SHOWN} names the first wrong tensor, '{found['name']}' "
                        f"(E{int(found['name'].split('.')[0][len('expert'):]) + 1}'s, {found['placement']} on "
                        f"{found['marked_on']}): max abs error {found['max_abs']:.3g}, max "
                        f"relative {found['max_rel']:.3g}, from event #{found['event']}, {found['op']} on "
                        f"{found['group']} at {found['site']}; {found['would_match']}."])


def tables(result) -> list[Table]:
    return [bug_table(result)]


NARRATIVE = {
    "attention: TP shards, summed over dp-cp": """
        Each GPU holds one TP shard (half the columns) of an attention weight, and its gradient comes from
        its own tokens: its DP replica's sequences, its CP half of them. Every GPU holding the same shard saw
        different tokens, so the shard's gradient is summed over dp-cp: 4 GPUs here.""",
    "norm: SP partial sums over tp, then dp-cp": """
        The norm is whole on both GPUs of a TP pair, but with SP each of them normalised only its share of
        the tokens: each holds a partial sum. It must be summed over tp first, then over dp-cp. Leave out the
        tp sum and both copies stay plausible, and different.""",
    "experts: summed over expert-dp": """
        Each GPU holds one expert (EP 4); the GPUs holding the same expert form its expert-dp group (2 GPUs)
        and saw different tokens. Summing over dp-cp instead adds up other experts' gradients: the numbers
        look like gradients, training goes on, and it is wrong. `parasim check silent-bugs --bug NAME`
        points at the collective that did it; the table at the end runs this bug beside the right groups,
        gradient by gradient.""",
    "clipping: one norm over both groups": """
        Clipping scales every gradient by one factor, from the norm of the whole model's gradient. Each GPU
        adds the squares of the pieces only it holds (a copy is counted once), and all-reduces over all 8
        add those up, dense and expert parts apart so both can be shown. Reuse each gradient's own sync
        group for this sum (dp-cp, expert-dp) and every TP shard gets the norm of its own columns: each factor
        looks reasonable, none is the one a single device uses.""",
    "dropout: one mask on both TP ranks": """
        After a row-parallel layer both GPUs of a TP pair hold the same activations, and dropout must drop
        the same positions on both: the mask comes from a stream both share. Drawn from each rank's own seed,
        the two copies stop being copies, and nothing complains.""",
}

LESSON = Lesson(
    no_picture='a bug here is a wrong group; parasim check --bug NAME names its first wrong collective',
    name="silent-bugs",
    section="Beyond the post: a wrong group found by parasim check",
    order=260,
    title="Silent bugs: a gradient summed over the wrong group, found by parasim check",
    world=LAYOUT.world,
    worlds=(LAYOUT.world,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="five silent bugs (wrong gradient groups, per-group clipping, per-rank dropout masks) and the "
            "collective `parasim check` names for each",
    keep_values=0,
    reference=reference,
    variants=VARIANTS,
    tables=tables,
)
